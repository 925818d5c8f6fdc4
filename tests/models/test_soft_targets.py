"""Soft alignment targets of Kervadec et al. (2020), eqs. 15-18, and the word vectors / vocabularies they read."""

import logging
import math

import pytest
import torch

from hf_vlalign.alignment.soft_targets import (
    SoftAlignmentTargets,
    combine_criteria,
    normalise_over_objects,
    positional_criterion,
    semantic_criterion,
)
from hf_vlalign.alignment.word_vectors import (
    GloveWordVectors,
    SentenceEmbeddingWordVectors,
    read_vocabulary,
)
from tests.shared_samples import real_sample

# Hand-made 2-D vectors: cos(dog, dog) = 1, cos(dog, cat) = 3/5, cos(dog, brown) = 0, cos(dog, black) = 4/5.
GLOVE_LINES = ["dog 1 0", "cat 3 4", "brown 0 1", "black 4 3"]

# Gold box and two detected boxes in pixels: IoU 1 for the first, 2 / (4 + 4 - 2) = 1/3 for the second.
GOLD = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
REGIONS = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0]])


@pytest.fixture
def glove(tmp_path):
    path = tmp_path / "glove.2d.txt"
    path.write_text("\n".join(GLOVE_LINES) + "\n", encoding="utf-8")
    return GloveWordVectors(path)


@pytest.fixture
def targets(glove):
    return SoftAlignmentTargets(glove, ["dog", "cat"], ["brown", "black"])


def assert_row(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=1e-6, rtol=0)


# --- the full target (eqs. 15-18) ---------------------------------------------------------------------------------


def test_soft_target_by_hand(targets):
    # positional: IoU [1, 1/3] -> normalised [3/4, 1/4] = [21/28, 7/28]
    # semantic:   region 0 = dog/brown: 3/4 * 1 + 1/4 * 0 = 3/4; region 1 = cat/black: 3/4 * 3/5 + 1/4 * 4/5 = 13/20
    #             -> normalised over 3/4 + 13/20 = 7/5: [15/28, 13/28]
    # A* = mean = [36/56, 20/56] = [9/14, 5/14]
    row = targets("the dog", GOLD, REGIONS, torch.tensor([0, 1]), torch.tensor([0, 1]))
    assert_row(row, [9 / 14, 5 / 14])


def test_soft_target_ignores_padded_regions(targets):
    regions = torch.cat([REGIONS, GOLD])  # the padded region would score best on both criteria
    row = targets("dog", GOLD, regions, torch.tensor([0, 1, 0]), torch.tensor([0, 1, 0]), torch.tensor([1, 1, 0]))
    assert_row(row, [9 / 14, 5 / 14, 0.0])


def test_soft_target_without_attributes_uses_the_class_term_alone(glove):
    # semantic: [1, 3/5] -> [5/8, 3/8]; positional [3/4, 1/4]; mean [11/16, 5/16]
    targets = SoftAlignmentTargets(glove, ["dog", "cat"])
    assert_row(targets("dog", GOLD, REGIONS, torch.tensor([0, 1])), [11 / 16, 5 / 16])


def test_soft_target_with_no_box_overlap_uses_the_semantic_criterion(targets):
    far_gold = torch.tensor([[10.0, 10.0, 12.0, 12.0]])
    row = targets("dog", far_gold, REGIONS, torch.tensor([0, 1]), torch.tensor([0, 1]))
    assert_row(row, [15 / 28, 13 / 28])


def test_soft_target_with_unknown_phrase_uses_the_positional_criterion(targets, caplog):
    with caplog.at_level(logging.WARNING):
        row = targets("zebra", GOLD, REGIONS, torch.tensor([0, 1]), torch.tensor([0, 1]))
    assert_row(row, [3 / 4, 1 / 4])
    assert "1 of 1 text(s)" in caplog.text


def test_soft_target_with_neither_criterion_is_ungrounded(targets, caplog):
    far_gold = torch.tensor([[10.0, 10.0, 12.0, 12.0]])
    with caplog.at_level(logging.WARNING):
        row = targets("zebra", far_gold, REGIONS, torch.tensor([0, 1]), torch.tensor([0, 1]))
    assert_row(row, [0.0, 0.0])


def test_attribute_ids_need_an_attribute_vocabulary(glove):
    with pytest.raises(ValueError, match="attribute_names"):
        SoftAlignmentTargets(glove, ["dog", "cat"])("dog", GOLD, REGIONS, torch.tensor([0, 1]), torch.tensor([0, 1]))


def test_soft_targets_validate_construction(glove):
    with pytest.raises(ValueError, match="class_names"):
        SoftAlignmentTargets(glove, [])
    with pytest.raises(ValueError, match="class_weight"):
        SoftAlignmentTargets(glove, ["dog"], class_weight=1.5)
    with pytest.raises(ValueError, match="word_vectors"):
        SoftAlignmentTargets("glove.txt", ["dog"])


# --- the criteria -------------------------------------------------------------------------------------------------


def test_positional_criterion_takes_the_best_gold_box():
    gold = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0]])
    assert_row(positional_criterion(gold, REGIONS), [1.0, 1.0])
    assert_row(positional_criterion(GOLD, REGIONS), [1.0, 1 / 3])
    assert_row(positional_criterion(GOLD / 4, REGIONS / 4), [1.0, 1 / 3])  # normalised coordinates


def test_positional_criterion_refuses_mixed_box_conventions():
    with pytest.raises(ValueError, match="same coordinates"):
        positional_criterion(GOLD / 4, REGIONS)


def test_semantic_criterion_weights_and_clamps():
    word = torch.tensor([1.0, 0.0])
    classes = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [3.0, 4.0]])
    attributes = torch.tensor([[0.0, 1.0], [1.0, 0.0], [4.0, 3.0]])
    # class cos [1, -1 -> 0, 3/5], attribute cos [0, 1, 4/5]
    assert_row(semantic_criterion(word, classes), [1.0, 0.0, 0.6])
    assert_row(semantic_criterion(word, classes, attributes), [0.75, 0.25, 0.65])
    assert_row(semantic_criterion(word, classes, attributes, class_weight=0.5), [0.5, 0.5, 0.7])
    assert_row(semantic_criterion(word, torch.zeros(1, 2)), [0.0])  # a zero vector gives a zero cosine


def test_normalise_over_objects():
    assert_row(normalise_over_objects(torch.tensor([1.0, 3.0, 4.0])), [0.125, 0.375, 0.5])
    assert_row(normalise_over_objects(torch.tensor([1.0, 3.0, 4.0]), torch.tensor([1, 1, 0])), [0.25, 0.75, 0.0])
    assert_row(normalise_over_objects(torch.zeros(3)), [0.0, 0.0, 0.0])


def test_combine_criteria_rules():
    positional, semantic = torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0.0, 1.0, 3.0])
    # [1/2, 1/2, 0] and [0, 1/4, 3/4] -> mean [1/4, 3/8, 3/8]
    assert_row(combine_criteria(positional, semantic), [0.25, 0.375, 0.375])
    assert_row(combine_criteria(positional, torch.zeros(3)), [0.5, 0.5, 0.0])
    assert_row(combine_criteria(torch.zeros(3), semantic), [0.0, 0.25, 0.75])
    assert_row(combine_criteria(torch.zeros(3), torch.zeros(3)), [0.0, 0.0, 0.0])
    # the semantic criterion is zero on the only real region: the positional one alone is used
    assert_row(combine_criteria(positional, semantic, torch.tensor([1, 0, 0])), [1.0, 0.0, 0.0])


# --- GloVe vectors ------------------------------------------------------------------------------------------------


def test_glove_reads_vectors_and_averages_words(glove):
    assert glove.dim == 2 and len(glove) == 4
    vectors = glove(["Dog, cat!", "the dog", "BLACK"])
    assert_row(vectors, [[2.0, 2.0], [1.0, 0.0], [4.0, 3.0]])


def test_glove_skips_a_word2vec_header(tmp_path):
    path = tmp_path / "w2v.txt"
    path.write_text("2 3\nred 1 2 3\nblue 4 5 6\n", encoding="utf-8")
    vectors = GloveWordVectors(path)
    assert vectors.dim == 3 and len(vectors) == 2
    assert_row(vectors(["blue"]), [[4.0, 5.0, 6.0]])


def test_glove_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "broken.txt"
    path.write_text("dog 1 0\ncat 3 4\nbrown 0 1 7\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.txt line 3.*2 values.*got 3"):
        GloveWordVectors(path)
    path.write_text("dog 1 0\ncat 3 x\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.txt line 2.*non-numeric"):
        GloveWordVectors(path)
    with pytest.raises(ValueError, match="path"):
        GloveWordVectors(tmp_path / "missing.txt")


def test_glove_counts_unknown_texts(glove, caplog):
    with caplog.at_level(logging.WARNING, logger="hf_vlalign.alignment.word_vectors"):
        vectors = glove(["dog", "zebra", "", "qq, zz!"])
    assert_row(vectors[1:], [[0.0, 0.0]] * 3)
    assert "3 of 4 text(s)" in caplog.text
    with pytest.raises(ValueError, match="texts"):
        glove("dog")
    with pytest.raises(ValueError, match="texts"):
        glove(["dog", 3])


# --- vocabularies -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, size", [("objects_vocab.txt", 1600), ("attributes_vocab.txt", 400)])
def test_read_vocabulary_on_the_real_files(name, size):
    path = real_sample("bottom_up_attention", name)
    names = read_vocabulary(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(names) == size
    assert names[0] == lines[0].split(",")[0]
    assert names[-1] == lines[-1].split(",")[0]
    assert all("," not in item and item == item.strip() for item in names)


def test_read_vocabulary_keeps_the_first_synonym():
    names = read_vocabulary(real_sample("bottom_up_attention", "attributes_vocab.txt"))
    assert names[:3] == ["gray", "multi colored", "double decker"]  # "gray,grey", "multi colored,multi-colored,..."


def test_read_vocabulary_trailing_and_inner_blank_lines(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("dog,puppy\ncat\n\n", encoding="utf-8")
    assert read_vocabulary(path) == ["dog", "cat"]
    path.write_text("dog\n\ncat", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2"):
        read_vocabulary(path)


# --- sentence-embedding vectors (the packaged MiniLM) -------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    return SentenceEmbeddingWordVectors()


def test_sentence_embeddings_are_normalised_and_semantic(minilm):
    vectors = minilm(["red", "crimson", "circle"])
    assert vectors.shape == (3, minilm.dim) == (3, 384)
    torch.testing.assert_close(vectors.norm(dim=-1), torch.ones(3))
    red, crimson, circle = vectors
    assert float(red @ crimson) > float(red @ circle)


def test_sentence_embeddings_cache_and_padding(minilm):
    calls = []
    handle = minilm.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        first = minilm(["a small brown dog"])
        cached = minilm.cache["a small brown dog"]
        second = minilm(["a small brown dog", "a small brown dog"])
    finally:
        handle.remove()
    assert len(calls) == 1  # embedded once, then read from the cache
    assert minilm.cache["a small brown dog"] is cached
    assert torch.equal(first[0], second[0]) and torch.equal(second[0], second[1])
    alone = SentenceEmbeddingWordVectors(batch_size=1)
    torch.testing.assert_close(
        alone(["dog"])[0], minilm(["dog", "a much longer phrase about dogs"])[0], atol=1e-5, rtol=0
    )


def test_soft_target_with_minilm_and_real_vocabulary(minilm):
    objects = read_vocabulary(real_sample("bottom_up_attention", "objects_vocab.txt"))
    assert {"dog", "car"} <= set(objects)
    targets = SoftAlignmentTargets(minilm, ["dog", "car"])
    same_boxes = torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0]])
    gold = torch.tensor([[0.0, 0.0, 1.0, 1.0]])  # IoU 1/4 with both: the semantic criterion decides
    row = targets("a puppy", gold, same_boxes, torch.tensor([0, 1]))
    assert row.sum().item() == pytest.approx(1.0)
    assert row[0] > row[1]
    assert math.isfinite(row.max().item())


# --- the top-k of eq. (13) on targets built here -------------------------------------------------------------------

# 3-D vectors with positive coordinates: every cosine is positive, as the semantic criterion is on real vocabularies
TOPK_GLOVE_LINES = [
    "dog 1 0.1 0.1", "cat 0.8 0.6 0.1", "horse 0.6 0.6 0.5", "ball 0.3 0.3 0.9", "tree 0.2 0.9 0.4",
    "car 0.1 0.5 0.8", "brown 0.5 0.5 0.7", "black 0.7 0.2 0.6",
]  # fmt: skip
TOPK_CLASSES = ["dog", "cat", "horse", "ball", "tree", "car"]
TOPK_REGIONS = torch.tensor(
    [[0, 0, 4, 4], [1, 0, 5, 4], [6, 6, 9, 9], [0, 5, 3, 9], [5, 0, 9, 3], [2, 2, 7, 7]], dtype=torch.float32
)


def library_targets(tmp_path):
    """(1, 3, 6) soft targets A* of three phrases over six detected objects, built by `SoftAlignmentTargets`."""
    path = tmp_path / "glove.3d.txt"
    path.write_text("\n".join(TOPK_GLOVE_LINES) + "\n", encoding="utf-8")
    builder = SoftAlignmentTargets(GloveWordVectors(path), TOPK_CLASSES, ["brown", "black"])
    object_ids, attribute_ids = torch.arange(6), torch.tensor([0, 1, 0, 1, 0, 1])
    rows = [
        builder(phrase, torch.tensor(gold, dtype=torch.float32), TOPK_REGIONS, object_ids, attribute_ids)
        for phrase, gold in (("the dog", [[0, 0, 4, 4]]), ("a ball", [[0, 5, 3, 9]]), ("the tree", [[5, 0, 9, 3]]))
    ]
    return torch.stack(rows)[None]


def test_top_k_changes_the_loss_and_its_gradient_on_library_targets(tmp_path):
    from hf_vlalign.supervision.alignment_decoder import alignment_kl_loss

    target = library_targets(tmp_path)
    # the semantic criterion is positive on every object, so each target row covers all six regions
    assert bool((target > 0).all())
    torch.testing.assert_close(target.sum(-1), torch.ones(1, 3))
    scores = torch.tensor([[[2.0, 1.5, -1.0, 0.5, 0.0, 1.0], [0.0, 0.3, 1.2, 2.0, -0.5, 0.8],
                            [1.0, -1.0, 0.5, 0.0, 2.5, 1.5]]])  # fmt: skip
    losses, gradients = {}, {}
    for k in range(2, 7):
        leaf = scores.clone().requires_grad_()
        loss = alignment_kl_loss(leaf, target, k=k)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(leaf.grad).all()
        # only each word's k best scores are trained
        assert int((leaf.grad != 0).sum(-1).max()) <= k
        losses[k], gradients[k] = loss.item(), leaf.grad
    assert len({round(value, 6) for value in losses.values()}) == len(losses)
    for k in range(2, 6):
        assert not torch.allclose(gradients[k], gradients[k + 1])
    # k = R is the full-softmax KL(A* || softmax(scores))
    full = (target * (target.log() - torch.log_softmax(scores, -1))).sum(-1).mean()
    assert losses[6] == pytest.approx(full.item(), rel=1e-5)
    # the "target_support" reading keeps every region with target mass: here all of them, whatever k
    for k in range(2, 6):
        kept_all = alignment_kl_loss(scores, target, k=k, outside_top_k="target_support")
        assert kept_all.item() == pytest.approx(losses[6], rel=1e-5)
    # "floor" is finite and depends on k too
    floors = [alignment_kl_loss(scores, target, k=k, outside_top_k="floor").item() for k in range(2, 7)]
    assert all(math.isfinite(value) for value in floors) and len(set(floors)) == len(floors)
