"""Word vectors for the semantic criterion of the soft alignment targets (Kervadec et al. 2020, eq. 16), and the
bottom-up-attention vocabularies that name the detector's object classes and attributes.

Two interchangeable embedders map a list of strings to a (N, D) tensor:
- `GloveWordVectors`: the paper's choice, GloVe vectors read from a local text file (mean over a text's words);
- `SentenceEmbeddingWordVectors`: the embedded default, the packaged MiniLM sentence-embedding model (offline).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import torch

from ..utils.text_model import default_text_model_path

logger = logging.getLogger(__name__)

_WORD = re.compile(r"[^\W_]+")  # runs of letters/digits: splits on whitespace, punctuation and underscores


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise ValueError(  # noqa: TRY004 (DESIGN.md: ValueError)
            f"`texts` must be a sequence of strings (e.g. a list), got {type(texts).__name__}."
        )
    bad = [type(text).__name__ for text in texts if not isinstance(text, str)]
    if bad:
        raise ValueError(f"`texts` must hold only strings, got {len(bad)} non-string item(s) of type {bad[0]}.")
    return list(texts)


def tokenize_words(text: str) -> list[str]:
    """Lower-cased words of `text`, split on whitespace and punctuation."""
    return _WORD.findall(text.lower())


def _is_word2vec_header(parts: list[str]) -> bool:
    return len(parts) == 2 and all(part.isdigit() for part in parts)


class GloveWordVectors:
    """GloVe vectors from a local text file (`word v1 ... vD` per line, space separated; a word2vec "N D" header
    line is skipped). Words are stored lower-cased (first occurrence wins), to match the lower-cased lookup.

    `__call__(texts)` gives each text the mean of its known words' vectors; a text with no known word gets a zero
    vector (a zero cosine in eq. 16), and the number of such texts is logged as a warning.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"`path` must be an existing GloVe text file, got {str(path)!r}.")
        self._index: dict[str, int] = {}
        rows: list[list[float]] = []
        dim: int | None = None
        with self.path.open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                parts = line.split()
                if not parts:
                    continue
                if line_number == 1 and _is_word2vec_header(parts):
                    dim = int(parts[1])
                    continue
                dim = len(parts) - 1 if dim is None else dim
                values = self._parse_row(parts, dim, line_number)
                word = parts[0].lower()
                if word not in self._index:
                    self._index[word] = len(rows)
                    rows.append(values)
        if not rows:
            raise ValueError(f"`path` must hold at least one word vector, got none in {self.path}.")
        self.vectors = torch.tensor(rows, dtype=torch.float32)

    def _parse_row(self, parts: list[str], dim: int, line_number: int) -> list[float]:
        if dim < 1 or len(parts) - 1 != dim:
            raise ValueError(
                f"GloVe file {self.path} line {line_number}: expected a word and {dim} values, got {len(parts) - 1} "
                f"value(s) for {parts[0]!r}."
            )
        try:
            return [float(value) for value in parts[1:]]
        except ValueError as error:
            raise ValueError(
                f"GloVe file {self.path} line {line_number}: non-numeric value for {parts[0]!r}."
            ) from error

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, word: str) -> bool:
        return word.lower() in self._index

    def _embed(self, text: str) -> torch.Tensor | None:
        indices = [self._index[word] for word in tokenize_words(text) if word in self._index]
        if not indices:
            return None
        return self.vectors[indices].mean(dim=0)

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        """(N,) strings -> (N, dim) mean word vectors; zero rows (counted, logged) for texts with no known word."""
        texts = _check_texts(texts)
        output = torch.zeros(len(texts), self.dim)
        unknown = []
        for row, text in enumerate(texts):
            vector = self._embed(text)
            if vector is None:
                unknown.append(text)
            else:
                output[row] = vector
        if unknown:
            logger.warning(
                "%d of %d text(s) have no word in the GloVe vocabulary of %s and get a zero vector, e.g. %r.",
                len(unknown),
                len(texts),
                self.path.name,
                unknown[0],
            )
        return output


class SentenceEmbeddingWordVectors:
    """Mean-pooled, L2-normalised last hidden states of a BERT-family sentence-embedding model (the packaged MiniLM
    all-MiniLM-L6-v2 by default, loaded offline). Each distinct string is embedded once and cached (on the CPU)."""

    def __init__(
        self, name_or_path: str | Path | None = None, batch_size: int = 64, device: str | torch.device = "cpu"
    ):
        from transformers import AutoModel, AutoTokenizer

        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"`batch_size` must be a positive int, got {batch_size!r}.")
        name_or_path = default_text_model_path() if name_or_path is None else str(name_or_path)
        self.name_or_path = name_or_path
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        self.model = AutoModel.from_pretrained(name_or_path).to(self.device).eval()
        self.cache: dict[str, torch.Tensor] = {}

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size

    @torch.no_grad()
    def _embed_batch(self, texts: list[str]) -> torch.Tensor:
        encoded = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(self.device)
        hidden = self.model(**encoded).last_hidden_state
        weights = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).float().cpu()

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        """(N,) strings -> (N, dim) unit-norm embeddings (CPU, float32)."""
        texts = _check_texts(texts)
        missing = list(dict.fromkeys(text for text in texts if text not in self.cache))
        for start in range(0, len(missing), self.batch_size):
            chunk = missing[start : start + self.batch_size]
            for text, vector in zip(chunk, self._embed_batch(chunk)):
                self.cache[text] = vector
        if not texts:
            return torch.zeros(0, self.dim)
        return torch.stack([self.cache[text] for text in texts])


def read_vocabulary(path: str | Path) -> list[str]:
    """Class names of a bottom-up-attention vocabulary file (objects_vocab.txt, attributes_vocab.txt): one class
    per line, synonyms comma-separated (the first is kept); trailing blank lines are ignored, inner ones are errors."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"`path` must be an existing vocabulary file, got {str(path)!r}.")
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    names = []
    for line_number, line in enumerate(lines, start=1):
        name = line.split(",")[0].strip()
        if not name:
            raise ValueError(f"Vocabulary file {path} line {line_number}: expected a class name, got {line!r}.")
        names.append(name)
    if not names:
        raise ValueError(f"`path` must hold at least one class name, got an empty file {path}.")
    return names
