"""Li et al. 2020 analyses on hand-built attention: entity grounding (perfect vs uniform head), actively attending
heads, syntactic grounding per dependency relation, CoNLL-U reading, spaCy's error and the Figure 3 scatter."""

import importlib.util
import json

import numpy as np
import pytest
import torch

from hf_vlalign.analysis.grounding_probe import GroundingProbe
from hf_vlalign.analysis.probe_plots import plot_layer_accuracy_scatter, plot_relation_accuracy_scatter
from hf_vlalign.analysis.syntactic_grounding import (
    SyntacticGroundingProbe,
    dependency_pairs,
    parse_with_spacy,
    read_conllu,
    word_token_index,
)

# ---------------------------------------------------------------------------------------------------------------------
# Entity grounding: a perfect head and a uniform head (two-stream style (L, B, H, T, R) maps)

R = 4


def perfect_and_uniform_batch():
    """One example, 4 phrases whose last sub-words are tokens 0..3; phrase p's gold box is region p (IoU 1 there,
    0.3 elsewhere: below the threshold). Head 0 puts 0.7 on the gold region, head 1 is uniform."""
    rows = torch.full((1, 1, 2, R, R), 1.0 / R)
    rows[0, 0, 0] = 0.1 + 0.6 * torch.eye(R)
    iou = torch.full((1, R, R), 0.3) + 0.7 * torch.eye(R)[None]
    return dict(
        text_to_region=rows,
        phrase_token_index=torch.arange(R)[None],
        phrase_region_iou=iou,
        visual_attention_mask=torch.ones(1, R, dtype=torch.long),
        region_confidence=torch.tensor([[0.1, 0.2, 0.3, 0.9]]),  # baseline always predicts region 3
    )


def test_perfect_head_scores_one_and_uniform_head_scores_chance():
    probe = GroundingProbe(num_layers=1, num_heads=2)
    probe.update_from_text_to_region(**perfect_and_uniform_batch())
    result = probe.compute()
    # the uniform head ties everywhere; argmax takes the first real region (0), the gold region of 1 phrase in R
    np.testing.assert_allclose(result.accuracy, [[1.0, 1 / R]])
    assert result.baseline_accuracy == pytest.approx(1 / R)
    # cross-attention rows are distributions over the regions: all their mass is on regions (Li et al. sec. 3)
    np.testing.assert_allclose(result.active_share, [[1.0, 1.0]])
    assert result.active_heads == [(0, 0), (0, 1)]


def test_rows_that_are_not_probabilities_leave_the_share_undefined():
    batch = perfect_and_uniform_batch()
    batch["text_to_region"] = batch["text_to_region"].sum(dim=2, keepdim=True)  # heads summed: rows sum to 2
    probe = GroundingProbe(num_layers=1, num_heads=1)
    probe.update_from_text_to_region(**batch)
    result = probe.compute()
    assert result.active_share is None and result.active_heads == []
    assert result.to_rows() == [{"layer": 0, "head": 0, "accuracy": 1.0, "active_share": None, "active": None}]


# ---------------------------------------------------------------------------------------------------------------------
# Actively attending heads on single-stream joint maps (Li et al. sec. 3: > 20 % of the attention on regions)

T_JOINT, R_JOINT = 2, 2
N_JOINT = T_JOINT + R_JOINT + 1  # text, regions, [END]

# (head, token) -> attention on regions 0 and 1; the rest of the row goes to the first text token
JOINT_REGION_ROWS = {
    (0, 0): [0.3, 0.0], (0, 1): [0.3, 0.0],  # 30 % on the real region for both phrases
    (1, 0): [0.1, 0.0], (1, 1): [0.2, 0.0],  # 10 % and 20 %: mean 15 %
    (2, 0): [0.15, 0.6], (2, 1): [0.15, 0.6],  # 15 % on the real region, 60 % on the padded region 1
}


def joint_batch():
    attention = torch.zeros(1, 3, N_JOINT, N_JOINT)
    attention[..., 0] = 1.0
    for (head, token), weights in JOINT_REGION_ROWS.items():
        attention[0, head, token, T_JOINT:T_JOINT + R_JOINT] = torch.tensor(weights)
        attention[0, head, token, 0] = 1.0 - sum(weights)
    return dict(
        attentions=(attention,),
        text_length=T_JOINT,
        phrase_token_index=torch.tensor([[0, 1]]),
        phrase_region_iou=torch.tensor([[[0.9, 0.0], [0.9, 0.0]]]),
        visual_attention_mask=torch.tensor([[1, 0]]),
        region_confidence=torch.tensor([[0.5, 0.9]]),
    )


def test_active_share_of_single_stream_heads():
    probe = GroundingProbe(1, 3)
    probe.update(**joint_batch())
    result = probe.compute()
    # mean over the two phrases of each row's mass on the real region columns; padded region 1 does not count
    np.testing.assert_allclose(result.active_share, [[0.3, 0.15, 0.15]], rtol=1e-6)
    assert result.active_threshold == 0.2
    assert result.active_heads == [(0, 0)]
    np.testing.assert_array_equal(result.active, [[True, False, False]])

    strict = GroundingProbe(1, 3, active_threshold=0.5)
    strict.update(**joint_batch())
    assert strict.compute().active_heads == []


def test_to_rows_and_to_dict():
    probe = GroundingProbe(1, 3)
    probe.update(**joint_batch())
    result = probe.compute()
    rows = result.to_rows()
    assert [(row["layer"], row["head"]) for row in rows] == [(0, 0), (0, 1), (0, 2)]
    assert set(rows[0]) == {"layer", "head", "accuracy", "active_share", "active"}
    assert [row["accuracy"] for row in rows] == [1.0, 1.0, 1.0]  # region 1 is padding: every head predicts region 0
    assert [row["active"] for row in rows] == [True, False, False]
    assert rows[0]["active_share"] == pytest.approx(0.3)

    payload = json.loads(json.dumps(result.to_dict()))
    assert payload["active_heads"] == [[0, 0]]
    np.testing.assert_allclose(payload["active_share"], [[0.3, 0.15, 0.15]], rtol=1e-6)
    assert payload["active_threshold"] == 0.2


# ---------------------------------------------------------------------------------------------------------------------
# CoNLL-U and spaCy


CONLLU = """# sent_id = 1
# text = a man rides a horse
1\ta\ta\tDET\tDT\t_\t2\tdet\t_\t_
2\tman\tman\tNOUN\tNN\t_\t3\tnsubj\t_\t_
3\trides\tride\tVERB\tVBZ\t_\t0\troot\t_\t_
4\ta\ta\tDET\tDT\t_\t5\tdet\t_\t_
5\thorse\thorse\tNOUN\tNN\t_\t3\tobj\t_\t_

# text = du pain
1-2\tdu\t_\t_\t_\t_\t_\t_\t_\t_
1\tde\tde\tADP\t_\t_\t2\tcase\t_\t_
2\tle\tle\tDET\t_\t_\t3\tdet\t_\t_
2.1\tvide\t_\t_\t_\t_\t_\t_\t_\t_
3\tpain\tpain\tNOUN\t_\t_\t0\troot\t_\t_"""


def test_read_conllu_skips_comments_ranges_and_empty_nodes(tmp_path):
    path = tmp_path / "parse.conllu"
    path.write_text(CONLLU, encoding="utf-8")
    sentences = read_conllu(path)
    assert len(sentences) == 2
    assert [w["form"] for w in sentences[0]] == ["a", "man", "rides", "a", "horse"]
    assert sentences[0][1] == {"id": 2, "form": "man", "head": 3, "deprel": "nsubj"}
    assert [(w["id"], w["form"], w["head"], w["deprel"]) for w in sentences[1]] == [
        (1, "de", 2, "case"), (2, "le", 3, "det"), (3, "pain", 0, "root")
    ]


def test_read_conllu_bad_line_raises(tmp_path):
    path = tmp_path / "bad.conllu"
    path.write_text("1\tman\tman\tNOUN\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1"):
        read_conllu(path)


def test_parse_with_spacy_names_what_is_missing():
    if importlib.util.find_spec("spacy") is None:
        with pytest.raises(ImportError, match="`spacy` package"):
            parse_with_spacy(["a man rides a horse"])
    else:  # spaCy present: a model that cannot exist is named in the error
        with pytest.raises(ImportError, match="hf_vlalign_no_such_model"):
            parse_with_spacy(["a man rides a horse"], model_name="hf_vlalign_no_such_model")


def test_word_token_index_reads_the_last_sub_token():
    # [CLS] a man rid ##es a horse [SEP]
    assert word_token_index([None, 0, 1, 2, 2, 3, 4, None]) == [1, 2, 4, 5, 6]
    assert word_token_index([None, 0, 1, None], num_words=3) == [1, 2, -1]  # word 2 truncated


# ---------------------------------------------------------------------------------------------------------------------
# Syntactic grounding on "a man rides a horse" (Li et al. sec. 4)

PARSE = [
    {"id": 1, "form": "a", "head": 2, "deprel": "det"},
    {"id": 2, "form": "man", "head": 3, "deprel": "nsubj"},
    {"id": 3, "form": "rides", "head": 0, "deprel": "root"},
    {"id": 4, "form": "a", "head": 5, "deprel": "det"},
    {"id": 5, "form": "horse", "head": 3, "deprel": "obj"},
]
TOKENS = [1, 2, 4, 5, 6]  # last sub-token of each word in [CLS] a man rid ##es a horse [SEP]
T_SYN, R_SYN = 8, 3
MAN_IOU, HORSE_IOU = [1.0, 0.0, 0.2], [0.0, 0.8, 0.3]  # gold boxes: man = region 0, horse = region 1


def syntactic_batch():
    """Head 0 attends from: a(1) -> r0, man -> r0, rides -> r0, a(4) -> r1, horse -> r2; head 1 is uniform."""
    rows = torch.full((1, 2, T_SYN, R_SYN), 1.0 / R_SYN)
    for token, region in ((1, 0), (2, 0), (4, 0), (5, 1), (6, 2)):
        rows[0, 0, token] = torch.tensor([0.8 if r == region else 0.1 for r in range(R_SYN)])
    word_iou = torch.tensor([[MAN_IOU, MAN_IOU, [0.0] * 3, HORSE_IOU, HORSE_IOU]])
    return dict(
        text_to_region=[rows],
        parses=[PARSE],
        word_token_index=torch.tensor([TOKENS]),
        word_region_iou=word_iou,
        word_grounded=torch.tensor([[True, True, False, True, True]]),  # phrases "a man" and "a horse"
        visual_attention_mask=torch.ones(1, R_SYN),
        region_confidence=torch.tensor([[0.1, 0.9, 0.5]]),  # baseline always predicts region 1
    )


def test_dependency_pairs_take_both_directions():
    pairs = dependency_pairs(PARSE, [True, True, False, True, True])
    # (w1 entity word, w2, relation): det arcs link two entity words, so both directions count
    assert sorted(pairs) == sorted([
        (1, 0, "det"), (0, 1, "det"), (1, 2, "nsubj"), (4, 3, "det"), (3, 4, "det"), (4, 2, "obj")
    ])


def test_syntactic_grounding_hand_example():
    probe = SyntacticGroundingProbe(num_layers=1, num_heads=2)
    probe.update(**syntactic_batch())
    result = probe.compute()
    assert result.counts == {"det": 4, "nsubj": 1, "obj": 1}
    # det, head 0: a->r0 for man yes, man->r0 for "a man" yes, a->r1 for horse yes, horse->r2 (IoU 0.3) no
    # head 1 (uniform, argmax = region 0): yes, yes, no, no; nsubj (rides -> man) and obj (rides -> horse) likewise
    np.testing.assert_allclose(result.accuracy["det"], [[3 / 4, 2 / 4]])
    np.testing.assert_allclose(result.accuracy["nsubj"], [[1.0, 1.0]])
    np.testing.assert_allclose(result.accuracy["obj"], [[0.0, 0.0]])
    # baseline region 1 is right for horse only
    assert result.baseline_accuracy == {"det": 0.5, "nsubj": 0.0, "obj": 1.0}

    top = result.top_relations(k=2)
    assert [row["relation"] for row in top] == ["det", "nsubj"]  # by count, ties by name
    assert top[0] == {
        "relation": "det", "count": 4, "layer": 0, "head": 0, "accuracy": 0.75, "active_share": 1.0,
        "best_among": "active heads", "baseline_accuracy": 0.5,
    }  # fmt: skip
    assert len(result.to_rows()) == 3 * 2
    json.dumps(result.to_dict())


def test_syntactic_grounding_split_directions_and_stacked_input():
    batch = syntactic_batch()
    batch["text_to_region"] = torch.stack(batch["text_to_region"])  # (L, B, H, T, R) works too
    probe = SyntacticGroundingProbe(1, 2, split_directions=True)
    probe.update(**batch)
    result = probe.compute()
    np.testing.assert_allclose(result.accuracy["det (w2 dependent)"], [[1.0, 0.5]])  # the articles attend
    np.testing.assert_allclose(result.accuracy["det (w2 governor)"], [[0.5, 0.5]])  # the nouns attend
    assert result.counts["nsubj (w2 governor)"] == 1 and "nsubj (w2 dependent)" not in result.counts


def test_syntactic_grounding_skips_words_without_tokens_and_accumulates():
    batch = syntactic_batch()
    batch["word_token_index"] = torch.tensor([[1, 2, -1, 5, 6]])  # "rides" truncated: nsubj and obj arcs dropped
    probe = SyntacticGroundingProbe(1, 2)
    probe.update(**batch)
    assert probe.compute().counts == {"det": 4}
    probe.update(**syntactic_batch())
    assert probe.num_pairs == 4 + 6
    with pytest.raises(ValueError, match="at least one dependency arc"):
        SyntacticGroundingProbe(1, 2).compute()


# ---------------------------------------------------------------------------------------------------------------------
# Figure 3 scatter


def _png_size(path):
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return imread(path).shape


def test_layer_accuracy_scatter_png(tmp_path):
    accuracy = np.array([[0.1, 0.5, 0.9], [0.2, 0.3, 0.4]])
    path = plot_layer_accuracy_scatter(accuracy, tmp_path / "figures" / "scatter.png", baseline=0.25, title="entities")
    height, width, _ = _png_size(path)
    assert height > 50 and width > 50


def test_relation_accuracy_scatter_png(tmp_path):
    probe = SyntacticGroundingProbe(1, 2)
    probe.update(**syntactic_batch())
    result = probe.compute()
    path = plot_relation_accuracy_scatter(result.accuracy, tmp_path / "relations.png", result.baseline_accuracy,
                                          relations=result.relations, columns=2)
    height, width, _ = _png_size(path)
    assert width > height  # two panels side by side, two rows
