"""CPU threads of each process of a run, and the check of a multi-process launch."""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from transformers import TrainingArguments


def check_distributed_launch(training_args: TrainingArguments) -> None:
    """Refuses a multi-process launch that accelerate turned into independent processes: on a machine without GPUs,
    `accelerate launch --multi_gpu` (or a GPU config) starts N processes that each train alone and overwrite one
    another's output folder, unless CPU processes are asked for."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and training_args.world_size == 1:
        raise ValueError(
            f"{launched} processes were launched (WORLD_SIZE={launched}) but no distributed backend was set up, so each "
            "would train alone and write the same output folder. On a machine without GPUs, launch CPU processes: "
            "`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N ...` (gloo)."
        )


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, e.g. under `taskset` or a container's cpuset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_cpu_threads(environ: Mapping[str, str], cores: int, local_processes: int) -> int:
    """The threads per process when `--num_threads` is not given: the user's OMP_NUM_THREADS, else the cores divided
    by the processes of this machine. `accelerate launch` sets OMP_NUM_THREADS=1 when the user chose none, which
    would leave every core but one idle: a launcher's 1 is read as "not chosen" (`--num_threads 1` means it).
    """
    chosen = environ.get("OMP_NUM_THREADS", "")
    launcher_default = chosen == "1" and "ACCELERATE_DYNAMO_BACKEND" in environ  # set by accelerate's launchers
    if not chosen or launcher_default:
        return max(1, cores // local_processes)
    first = chosen.split(",")[0].strip()  # OpenMP also takes a list, one count per nesting level
    if not first.isdigit() or int(first) < 1:
        raise ValueError(f"`OMP_NUM_THREADS` must be a positive integer (or unset), got {chosen!r}.")
    return int(first)


def set_cpu_threads(training_args: TrainingArguments, num_threads: int | None = None) -> int:
    """Sets torch's intra-op threads of a CPU run (`--num_threads`, else `default_cpu_threads`), prints the count
    once (main process) and returns it. Runs on an accelerator keep torch's setting."""
    cores = available_cores()
    if training_args.device.type == "cpu":
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", training_args.world_size))
        torch.set_num_threads(num_threads or default_cpu_threads(os.environ, cores, local_processes))
    threads = torch.get_num_threads()
    if training_args.process_index == 0:
        print(
            f"hf_vlalign: {threads} CPU thread(s) per process, {training_args.world_size} process(es), {cores} cores "
            f"available (--num_threads sets another count)"
        )
    return threads
