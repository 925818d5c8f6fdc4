"""A tiny randomly initialised BERT text checkpoint for the miniature studies: `layers` layers of width `hidden_size`,
and a vocabulary of the synthetic world's words only (their MiniLM word pieces, single letters and digits as word
pieces for anything else), so that the masked-word head costs little. The studies' models start from it
(`--model_name_or_path <folder>`) and learn everything on the synthetic scenes.

    python benchmarks/studies/tiny_text_model.py outputs/studies/tiny_text_model --hidden_size 128 --layers 4
"""

from __future__ import annotations

import argparse
import re
import string
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertModel, BertTokenizer

from hf_vlalign.synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp
from hf_vlalign.utils.text_model import default_text_model_path

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TEXT_SUFFIXES = (".json", ".jsonl", ".txt", ".csv", ".xml")


def synthetic_words() -> list[str]:
    """Every lower-case word of the synthetic scenes' files (captions, questions, answers, statements, expressions,
    and the files' own keys): the world's vocabulary is fixed, so a small set of scenes holds all of it."""
    root = load_or_generate_synthetic_vgp(config=SyntheticSceneConfig(num_train_images=60, num_val_images=20)).root
    words = set()
    for path in Path(root).rglob("*"):
        if path.is_file() and path.suffix in TEXT_SUFFIXES:
            words.update(re.findall(r"[a-z]+", path.read_text().lower()))
    return sorted(words)


def tiny_vocabulary() -> list[str]:
    """The special tokens, MiniLM's word pieces of the synthetic words, then letters, digits and punctuation (alone
    and as `##` continuations), so that no text maps to [UNK]."""
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    pieces = {piece for word in synthetic_words() for piece in tokenizer.tokenize(word)}
    characters = string.ascii_lowercase + string.digits
    pieces |= set(characters) | {f"##{c}" for c in characters} | set(string.punctuation)
    return [*SPECIAL_TOKENS, *sorted(pieces - set(SPECIAL_TOKENS))]


def write_tiny_text_model(
    folder: str | Path, hidden_size: int = 128, layers: int = 4, heads: int = 4, max_positions: int = 128, seed: int = 0
) -> Path:
    """Writes (once: a folder holding a model is kept as it is) a `BertModel` of `layers` layers and `heads` heads
    of width `hidden_size`, feed-forward 4x, initialised with `seed`, with the tiny vocabulary's tokenizer."""
    folder = Path(folder)
    if (folder / "model.safetensors").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    vocabulary = tiny_vocabulary()
    (folder / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    BertTokenizer(vocab=str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    config = BertConfig(
        vocab_size=len(vocabulary),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden_size,
        max_position_embeddings=max_positions,
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--hidden_size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_tiny_text_model(args.folder, args.hidden_size, args.layers, args.heads, seed=args.seed))


if __name__ == "__main__":
    main()
