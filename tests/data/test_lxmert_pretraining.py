"""LXMERT's pre-training json layout (`builders/lxmert_pretraining.py`): records as LXMERT's `LXMERTTorchDataset`
flattens them, answers as its `AnswerTable` converts them, word->object pointers from Visual Genome's region
descriptions and GQA's annotations, checks with clear errors, and the collator's answer draw.

No sample of LXMERT's json files exists: the tests write records in the published layout from the real samples'
text (Visual Genome region descriptions and questions, GQA fixture questions)."""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from published_features import write_lxmert_tsv_features
from shared_samples import real_sample
from transformers import AutoTokenizer

from hf_vlalign import default_text_model_path
from hf_vlalign.data import TwoStreamPretrainingCollator, build_dataset, convert_features
from hf_vlalign.data.builders.lxmert_pretraining import convert_answer, split_files, visual_genome_id

VG = real_sample("visual_genome")
GQA = real_sample("gqa")
VQA_VOCAB = json.loads((real_sample("vqa_v2") / "trainval_ans2label.json").read_text())


def region_descriptions(image_id: int) -> list[dict]:
    return next(e["regions"] for e in json.loads((VG / "region_descriptions.json").read_text()) if e["id"] == image_id)


def vg_questions(image_id: int) -> list[dict]:
    return next(e["qas"] for e in json.loads((VG / "question_answers.json").read_text()) if e["id"] == image_id)


def write(root: Path, name: str, records: list) -> Path:
    root.mkdir(exist_ok=True)
    (root / f"{name}.json").write_text(json.dumps(records))
    return root


@pytest.fixture
def lxmert_dir(tmp_path):
    """vgnococo: VG image 1 (four region descriptions as "vg", three VG questions as "visual7w"); mscoco_minival: a
    COCO image with one caption (a VG description's text: the samples hold no COCO caption)."""
    regions, qas = region_descriptions(1)[:4], vg_questions(1)[:3]
    vg = {
        "img_id": "1",
        "sentf": {"vg": [r["phrase"] + ". " for r in regions], "visual7w": [q["question"] for q in qas]},
        "labelf": {"visual7w": [{q["answer"]: 1.0} for q in qas]},
    }
    coco = {"img_id": "COCO_val2014_000000000042", "sentf": {"mscoco": [regions[0]["phrase"]]}, "labelf": {}}
    write(tmp_path, "vgnococo", [vg])
    return write(tmp_path, "mscoco_minival", [coco])


def test_rows_sentences_answers_and_region_pointers(lxmert_dir):
    rows = build_dataset("lxmert_pretraining", lxmert_dir, "vgnococo", answer_vocab=VQA_VOCAB, visual_genome_dir=VG)
    regions, qas = region_descriptions(1)[:4], vg_questions(1)[:3]
    assert rows["sentence_id"] == [f"1_vg_{i:03d}" for i in range(4)] + [f"1_visual7w_{i:03d}" for i in range(3)]
    assert rows["source"] == ["vg"] * 4 + ["visual7w"] * 3
    # each description points as a whole to its region (x, y, w, h -> x1, y1, x2, y2), trailing ". " left out
    first = regions[0]  # "the clock is green in colour" at x 421, y 57, 82 x 139
    assert rows[0]["sentence_phrase_spans"] == [[0, len(first["phrase"])]]
    assert rows[0]["sentence_phrase_boxes"] == [[[421.0, 57.0, 503.0, 196.0]]]
    assert all(len(spans) == 1 for spans in rows["sentence_phrase_spans"][:4])
    assert rows["sentence_phrase_spans"][4:] == [[]] * 3  # questions of VG QA have no pointer
    # "Green." -> "green", "Two." -> "2" (LXMERT's convert_ans), labelled with the VQA ans2label
    assert [q["answer"] for q in qas] == ["Green.", "Two.", "Red."]
    assert rows["answer"][4:] == ["green", "2", "red"]
    assert rows["label"][4:] == [VQA_VOCAB["green"], VQA_VOCAB["2"], VQA_VOCAB["red"]]
    assert rows["answer_ids"][4:] == [[VQA_VOCAB[a]] for a in ("green", "2", "red")]
    assert rows["label"][:4] == [-1] * 4 and rows["answer_ids"][:4] == [[]] * 4  # captions: no answer
    without_vg = build_dataset("lxmert_pretraining", lxmert_dir, "vgnococo")
    assert without_vg["sentence_phrase_spans"] == [[]] * 7 and without_vg["label"] == [-1] * 7


def test_splits_are_lxmert_file_names(lxmert_dir):
    assert split_files("mscoco_train,mscoco_nominival,vgnococo") == ["mscoco_train", "mscoco_nominival", "vgnococo"]
    assert split_files("val") == ["mscoco_minival"]
    both = build_dataset("lxmert_pretraining", lxmert_dir, "vgnococo,mscoco_minival")
    assert both["source"] == ["vg"] * 4 + ["visual7w"] * 3 + ["mscoco"]
    validation = build_dataset("lxmert_pretraining", lxmert_dir, "validation")
    assert validation["sentence_id"] == ["COCO_val2014_000000000042_mscoco_000"]
    with pytest.raises(ValueError, match=r"`split` of LXMERT pre-training must be one of .* got 'vg_train'"):
        build_dataset("lxmert_pretraining", lxmert_dir, "vgnococo,vg_train")
    with pytest.raises(ValueError, match=r"`data_dir` .*mscoco_train.json"):
        build_dataset("lxmert_pretraining", lxmert_dir, "mscoco_train")


def test_answer_conversion_is_lxmerts():
    assert [convert_answer(a) for a in ("Two.", "the man", "A Dog", "an apple.", "grey", "", "t-shirt")] == [
        "2", "man", "dog", "apple", "gray", "", "t-shirt"
    ]  # fmt: skip


def test_top_answer_and_answers_outside_the_vocabulary(tmp_path):
    record = {
        "img_id": "COCO_train2014_000000458752",
        "sentf": {"vqa": ["What is this photo taken looking through?", "What?"]},
        "labelf": {"vqa": [{"net": 1.0, "netting": 0.3, "mesh": 0.3, "not-an-answer-xyz": 0.9}, {"zzz-unknown": 1}]},
    }
    root = write(tmp_path, "mscoco_train", [record])
    rows = build_dataset("lxmert_pretraining", root, "mscoco_train", answer_vocab=VQA_VOCAB)
    kept = [a for a in ("net", "netting", "mesh") if a in VQA_VOCAB]
    assert rows[0]["answer"] == "net" and rows[0]["answer_ids"] == [VQA_VOCAB[a] for a in kept]
    assert rows[1]["label"] == -1 and rows[1]["answer_ids"] == []


def test_lxmerts_joint_answer_table_is_read_in_list_order(tmp_path):
    """data/lxmert/all_ans.json: [{"ans": answer, "dsets": [...]}], an answer's id its position (LXMERT's AnswerTable)."""
    table = [{"ans": "net", "dsets": ["vqa"]}, {"ans": "2", "dsets": ["vqa", "gqa", "visual7w"]}]
    (tmp_path / "all_ans.json").write_text(json.dumps(table))
    record = {"img_id": "1", "sentf": {"visual7w": ["How many people are there?"]}, "labelf": {"visual7w": [{"Two.": 1.0}]}}
    root = write(tmp_path / "lxmert", "vgnococo", [record])
    rows = build_dataset("lxmert_pretraining", root, "vgnococo", answer_vocab=tmp_path / "all_ans.json")
    assert (rows[0]["answer"], rows[0]["label"], rows[0]["answer_ids"]) == ("2", 1, [1])
    (tmp_path / "bad.json").write_text(json.dumps([{"answer": "net"}]))
    with pytest.raises(ValueError, match="a list must be LXMERT's all_ans.json"):
        build_dataset("lxmert_pretraining", root, "vgnococo", answer_vocab=tmp_path / "bad.json")


def test_coco_images_are_found_in_visual_genome_through_coco_id():
    assert visual_genome_id("COCO_train2014_000000318556", {"318556": "2417890"}) == "2417890"
    assert visual_genome_id("COCO_val2014_000000000042", {}) is None and visual_genome_id("107", {}) == "107"
    assert visual_genome_id("n578564", {"578564": "1"}) is None  # GQA's own images are not in Visual Genome


def test_gqa_questions_point_to_their_annotated_objects(tmp_path):
    record = json.loads((GQA / "allennlp_fixture" / "question_dir" / "questions1.json").read_text())["20240871"]
    graphs = {
        "n166008": {
            "width": 500, "height": 333,
            "objects": {
                "11": {"name": "table", "x": 10, "y": 200, "w": 300, "h": 100},
                "4": {"name": "water", "x": 0, "y": 0, "w": 500, "h": 150},
            },
        }
    }  # fmt: skip  (the samples hold no scene graph: the two objects the question points to, boxes ours)
    (tmp_path / "graphs.json").write_text(json.dumps(graphs))
    lxmert = write(tmp_path / "lxmert", "vgnococo", [
        {"img_id": "n166008", "sentf": {"gqa": [record["question"], "Is it sunny?"]},
         "labelf": {"gqa": [{record["answer"]: 1.0}, {"no": 1.0}]}},
    ])  # fmt: skip
    rows = build_dataset(
        "lxmert_pretraining", lxmert, "vgnococo", gqa_questions=GQA / "allennlp_fixture" / "question_dir",
        gqa_scene_graphs=tmp_path / "graphs.json",
    )  # fmt: skip
    question = rows[0]["sentence"]  # "Does the table below the water look wooden and round?": "2" -> 11, "5" -> 4
    assert [question[s:e] for s, e in rows[0]["sentence_phrase_spans"]] == ["table", "water"]
    assert rows[0]["sentence_phrase_boxes"] == [[[10.0, 200.0, 310.0, 300.0]], [[0.0, 0.0, 500.0, 150.0]]]
    assert rows[1]["sentence_phrase_spans"] == []  # not a GQA question of the files
    several = build_dataset(  # train and val files, e.g.: the pointers of all of them
        "lxmert_pretraining", lxmert, "vgnococo", gqa_scene_graphs=[tmp_path / "graphs.json"],
        gqa_questions=[GQA / "allennlp_fixture" / "questions.json", GQA / "allennlp_fixture" / "question_dir"],
    )  # fmt: skip
    assert several["sentence_phrase_boxes"] == rows["sentence_phrase_boxes"]
    with pytest.raises(ValueError, match="`gqa_questions` and `gqa_scene_graphs` go together"):
        build_dataset("lxmert_pretraining", lxmert, "vgnococo", gqa_scene_graphs=tmp_path / "graphs.json")


@pytest.mark.parametrize(
    "record, message",
    [
        ([], r"record #0: expected a JSON object with img_id, sentf and labelf, got list"),
        ({"img_id": "1", "sentf": {}}, r"record #0: the record lacks \['labelf'\]"),
        ({"img_id": 1, "sentf": {}, "labelf": {}}, r"`img_id` must be a non-empty string .* got 1"),
        ({"img_id": "1", "sentf": {"vg": "a cat"}, "labelf": {}}, r"`sentf\['vg'\]` must be a list of sentences"),
        ({"img_id": "1", "sentf": {"vqa": ["q?"]}, "labelf": {"gqa": [{}]}}, r"`labelf\['gqa'\]` has no sentences"),
        ({"img_id": "1", "sentf": {"vqa": ["q?", "r?"]}, "labelf": {"vqa": [{"a": 1}]}}, r"one answer dict per sentence \(2\)"),
        ({"img_id": "1", "sentf": {"vqa": ["q?"]}, "labelf": {"vqa": [{"a": -1}]}}, r"`labelf\['vqa'\]\[0\]` must map answers to non-negative"),
    ],
)
def test_malformed_records_are_named(tmp_path, record, message):
    root = write(tmp_path, "vgnococo", [record])
    with pytest.raises(ValueError, match=message):
        build_dataset("lxmert_pretraining", root, "vgnococo")


def test_unknown_source_is_refused(lxmert_dir):
    with pytest.raises(ValueError, match=r"`sources` must be a non-empty subset of .* got \['coco'\]"):
        build_dataset("lxmert_pretraining", lxmert_dir, "vgnococo", sources=["coco"])
    assert set(build_dataset("lxmert_pretraining", lxmert_dir, "vgnococo", sources=["vg"])["source"]) == {"vg"}


def test_the_collator_draws_answers_in_proportion_to_their_scores(tmp_path):
    """LXMERT's pre-training draws one answer per question in proportion to the scores at each use."""
    write_lxmert_tsv_features(tmp_path / "obj36.tsv", ["1", "2"])
    store = convert_features(tmp_path / "obj36.tsv", "lxmert_tsv", tmp_path / "store")
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    row = {"image_id": "1", "sentence": "what color is it?", "label": 7, "answer_ids": [7, 9], "answer_scores": [0.3, 0.9]}
    caption = {**row, "label": -1, "answer_ids": [], "answer_scores": []}
    options = {"num_answers": 10, "mismatch_probability": 0.0, "text_columns": ("sentence",)}
    sampling = TwoStreamPretrainingCollator(tokenizer, store, sample_answers=True, **options)
    torch.manual_seed(0)
    drawn = Counter(sampling([row] * 2000 + [caption])["answer_labels"].tolist())
    assert drawn[-100] == 1 and set(drawn) == {7, 9, -100}
    assert drawn[9] / 2000 == pytest.approx(0.75, abs=0.04)
    fixed = TwoStreamPretrainingCollator(tokenizer, store, **options)  # the default: the row's `label`
    assert fixed([row, caption])["answer_labels"].tolist() == [7, -100]
