"""Helpers of the tests that launch real processes (`tests/trainers/test_multiprocess.py`, `tests/trainers/test_fsdp.py`)
or run an example's `main` end to end in the test's own process."""

from __future__ import annotations

import contextlib
import io
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from hf_vlalign import default_text_model_path


def free_port() -> int:
    """A TCP port nobody listens on, for the rendezvous of a multi-process launch."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def save_tiny_bert(folder: Path) -> Path:
    """A 2-layer BERT with 32 hidden units and seeded random weights, saved with the real MiniLM tokenizer: a text
    checkpoint on which the examples start in seconds."""
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128,
    )  # fmt: skip
    with torch.random.fork_rng():  # seeded, without touching the caller's generator
        torch.manual_seed(0)
        BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_example(main: Callable[[list[str]], dict], argv: list[str], cache: Path) -> tuple[dict, str]:
    """`main(argv)` of an example, run in this process as `accelerate launch --cpu --num_processes 1` runs it (one CPU
    process, the cores as its threads), its synthetic scenes in `cache`; returns its results and what it printed.
    An end-to-end test whose subject is not the launch itself runs this way: no interpreter start-up. The process's
    torch thread count is restored afterwards."""
    threads = torch.get_num_threads()
    printed = io.StringIO()
    try:
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
            patch.setenv("HF_VLALIGN_CACHE", str(cache))
            patch.delenv("OMP_NUM_THREADS", raising=False)  # the example's default: the cores over its processes
            results = main(argv)
    finally:
        torch.set_num_threads(threads)
    return results, printed.getvalue()
