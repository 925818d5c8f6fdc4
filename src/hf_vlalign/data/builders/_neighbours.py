"""Exact nearest neighbours of TF-IDF documents by cosine, in blocks of rows (memory O(block_size x N), never O(N^2)):
the hard negatives of the VGP builder. The order is a dense `argsort(-similarity, kind="stable")`'s with the diagonal
at -inf; frequent words go through a small dense BLAS product, the others through an inverted index.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

DECIMALS = 12  # cosines in [0, 1] are compared at this precision: sums in another order differ by ~1e-16
# words in more documents than this fraction are multiplied densely (BLAS); the rest through postings, whose pairs
# cost more each: 1/32 was the faster of 1/16, 1/32 and 1/64 on 30,000 Flickr30k-like caption sets
DENSE_WORD_FRACTION = 1 / 32


@dataclass(frozen=True)
class SparseRows:
    """Rows of a sparse float64 matrix in CSR layout (columns increasing within a row)."""

    indptr: np.ndarray  # (N + 1,) int64
    indices: np.ndarray  # (nnz,) int64
    values: np.ndarray  # (nnz,) float64
    num_columns: int

    @property
    def num_rows(self) -> int:
        return len(self.indptr) - 1

    def to_dense(self) -> np.ndarray:
        """The (N, num_columns) dense matrix (for small inputs and tests)."""
        dense = np.zeros((self.num_rows, self.num_columns), dtype=np.float64)
        dense[self.row_of_entries(), self.indices] = self.values
        return dense

    def row_of_entries(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_rows), np.diff(self.indptr))


def tfidf_rows(documents: Iterable[str]) -> SparseRows:
    """L2-normalised TF-IDF rows of white-space tokenised documents, columns in sorted word order: TF is the word's
    count in the document, IDF `log((1 + N) / (1 + df)) + 1` (scikit-learn's smooth IDF)."""
    first_seen: dict[str, int] = {}  # word -> id in order of first use; remapped to sorted order below
    token_ids = []
    for document in documents:
        ids = [first_seen.setdefault(word, len(first_seen)) for word in document.split()]
        token_ids.append(np.array(ids, dtype=np.int64))
    words = list(first_seen)
    column_of = np.empty(len(words), dtype=np.int64)
    column_of[sorted(range(len(words)), key=words.__getitem__)] = np.arange(len(words))
    columns, counts = [], []
    for ids in token_ids:
        document_columns, document_counts = np.unique(column_of[ids], return_counts=True)
        columns.append(document_columns)
        counts.append(document_counts)
    indptr = np.concatenate([[0], np.cumsum([len(c) for c in columns], dtype=np.int64)])
    indices = np.concatenate(columns) if columns else np.zeros(0, dtype=np.int64)
    values = np.concatenate(counts).astype(np.float64) if counts else np.zeros(0)
    num_rows = len(token_ids)
    document_frequency = np.bincount(indices, minlength=len(words))
    values *= (np.log((1 + num_rows) / (1 + document_frequency)) + 1.0)[indices]
    rows = SparseRows(indptr, indices, values, len(words))
    norms = np.sqrt(np.bincount(rows.row_of_entries(), weights=values**2, minlength=num_rows))
    values /= np.repeat(norms.clip(min=1e-12), np.diff(indptr))
    return rows


def nearest_neighbours(
    rows: SparseRows, num_neighbours: int, block_size: int = 256, dense_word_fraction: float = DENSE_WORD_FRACTION
) -> np.ndarray:
    """The `num_neighbours` rows of highest dot product with each row (itself left out), best first, ties by lower
    index: an (N, min(num_neighbours, N - 1)) int64 array. `dense_word_fraction` only moves work between the dense
    product and the postings (0: every word dense, 1: none)."""
    num_rows = rows.num_rows
    k = min(num_neighbours, num_rows - 1)
    neighbours = np.empty((num_rows, max(k, 0)), dtype=np.int64)
    if k <= 0:
        return neighbours
    frequent, rare = _split_by_frequency(rows, dense_word_fraction)
    for start in range(0, num_rows, block_size):
        stop = min(start + block_size, num_rows)
        similarity = frequent[start:stop] @ frequent.T + _rare_products(rare, rows, start, stop)
        similarity[np.arange(stop - start), np.arange(start, stop)] = -np.inf  # never one's own neighbour
        neighbours[start:stop] = _top_k(similarity, k)
    return neighbours


def _split_by_frequency(rows: SparseRows, dense_word_fraction: float) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The frequent words' columns as a dense (N, M) matrix, and the other words' entries as postings by word:
    (start of each word's postings, their rows, their values)."""
    document_frequency = np.bincount(rows.indices, minlength=rows.num_columns)
    dense_column = np.full(rows.num_columns, -1, dtype=np.int64)
    frequent_words = np.flatnonzero(document_frequency > dense_word_fraction * rows.num_rows)
    dense_column[frequent_words] = np.arange(len(frequent_words))
    entry_rows = rows.row_of_entries()
    is_frequent = dense_column[rows.indices] >= 0
    frequent = np.zeros((rows.num_rows, len(frequent_words)), dtype=np.float64)
    frequent[entry_rows[is_frequent], dense_column[rows.indices[is_frequent]]] = rows.values[is_frequent]
    rare_words = rows.indices[~is_frequent]
    by_word = np.argsort(rare_words, kind="stable")
    starts = np.searchsorted(rare_words[by_word], np.arange(rows.num_columns + 1))
    return frequent, (starts, entry_rows[~is_frequent][by_word], rows.values[~is_frequent][by_word])


def _rare_products(rare: tuple, rows: SparseRows, start: int, stop: int) -> np.ndarray:
    """(stop - start, N): the dot products of rows start..stop with every row over the rare words only, through the
    postings of the words the query rows hold."""
    starts, posting_rows, posting_values = rare
    num_rows = rows.num_rows
    words = rows.indices[rows.indptr[start] : rows.indptr[stop]]
    values = rows.values[rows.indptr[start] : rows.indptr[stop]]
    queries = np.repeat(np.arange(stop - start), np.diff(rows.indptr[start : stop + 1]))
    lengths = starts[words + 1] - starts[words]  # 0 for a frequent word: it has no postings here
    total = int(lengths.sum())
    offsets = np.repeat(starts[words] - np.cumsum(lengths) + lengths, lengths) + np.arange(total)
    flat = np.repeat(queries, lengths) * num_rows + posting_rows[offsets]
    products = np.repeat(values, lengths) * posting_values[offsets]
    return np.bincount(flat, weights=products, minlength=(stop - start) * num_rows).reshape(stop - start, num_rows)


def _top_k(similarity: np.ndarray, k: int) -> np.ndarray:
    """Per row, the columns of the k highest values rounded to `DECIMALS`, best first, ties by lower column."""
    kth = np.partition(similarity, -k, axis=1)[:, -k]
    top = np.empty((len(similarity), k), dtype=np.int64)
    for row, values in enumerate(similarity):
        # every value that rounds to at least the rounded k-th value; rounding moves a value by < 10**-DECIMALS
        candidates = np.flatnonzero(values >= kth[row] - 10.0**-DECIMALS)
        rounded = np.round(values[candidates], DECIMALS)
        top[row] = candidates[np.lexsort((candidates, -rounded))[:k]]
    return top
