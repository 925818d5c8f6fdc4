"""Texts longer than `max_text_length` (issue 18: one long row must never end a run).

Real over-long texts go through every collator: the real 82-word-piece Flickr30k Entities caption at the default
`max_text_length` 64, real captions, questions-from-captions, expressions and NLVR2 statements at a short one, and real
VGP caption pairs. No collator raises; the cut phrases lose their alignment and are counted, the whole ones keep
exactly the alignment of an untruncated collation. `drop_overlong_rows` removes the rows that cannot be trained (a cut
VGP phrase pair), and the two examples whose evaluation sees over-long texts run end to end with a short
`--max_text_length`, writing the counts in `eval_results.json`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from launch_helpers import run_example, save_tiny_bert
from script_modules import load_script
from shared_samples import real_sample
from transformers import AutoTokenizer

from hf_vlalign import default_text_model_path
from hf_vlalign.data import (
    CaptioningCollator,
    GroundedCaptionCollator,
    ImagePairCollator,
    PhraseGroundingCollator,
    QuestionAnsweringCollator,
    ReferringExpressionCollator,
    RegionFeatureStore,
    SingleStreamPretrainingCollator,
    TruncationStats,
    TwoStreamPretrainingCollator,
    VGPCollator,
    build_dataset,
    build_vgp_dataset,
    drop_overlong_rows,
)
from hf_vlalign.data.formats.flickr30k_entities import Flickr30kEntities
from hf_vlalign.recipes import truncation_results

ROOT = Path(__file__).resolve().parents[2]
LONG_IMAGE = "19663663"  # its first caption is 82 word pieces long (the longest of the Flickr30k Entities sample)
SHORT = 16
UNTRUNCATED = 160


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


def gold_box_store(image_ids, directory: Path) -> RegionFeatureStore:
    """Each image's regions: its Flickr30k Entities gold boxes, widened by 3 px, and a distractor in a corner."""
    corpus = Flickr30kEntities(real_sample("flickr30k_entities"))
    records = []
    for image_id in sorted(set(image_ids)):
        annotation = corpus.annotation(image_id)
        gold = sorted({tuple(box) for boxes in annotation.boxes.values() for box in boxes})
        widened = [[x1, y1, min(x2 + 3, annotation.width), y2] for x1, y1, x2, y2 in gold] + [[0, 0, 5, 5]]
        count = len(widened)
        records.append({
            "image_id": image_id, "image_size": (annotation.height, annotation.width),
            "boxes": np.array(widened, dtype=np.float32), "object_conf": np.linspace(0.9, 0.1, count).astype(np.float32),
            "features": np.random.default_rng(count).random((count, 8), dtype=np.float32),
        })  # fmt: skip
    return RegionFeatureStore.write(records, directory)


@pytest.fixture(scope="module")
def flickr(tmp_path_factory):
    """(captions of the long-caption image, captions of 3 val images, a store of all their images)."""
    folder = real_sample("flickr30k_entities")
    split_dir = tmp_path_factory.mktemp("flickr_long")  # a split list naming the long image, beside the real files
    for name in ("Sentences", "Annotations"):
        (split_dir / name).symlink_to(folder / name)
    (split_dir / "train.txt").write_text(f"{LONG_IMAGE}\n")
    long_rows = build_dataset("flickr30k_entities", split_dir, "train")
    val_rows = build_dataset("flickr30k_entities", folder, "val", max_images=3)
    store = gold_box_store([*long_rows["image_id"], *val_rows["image_id"]], tmp_path_factory.mktemp("flickr") / "store")
    return long_rows, val_rows, store


def grounded(row: dict, column: str = "sentence") -> list[int]:
    return [p for p, boxes in enumerate(row[f"{column}_phrase_boxes"]) if boxes]


def whole_phrases(tokenizer, text: str, spans, max_text_length: int) -> set[int]:
    """The phrases whose last character lies in a word piece that fits beside [CLS] and [SEP]."""
    pieces = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    budget = max_text_length - 2
    if len(pieces) <= budget:
        return set(range(len(spans)))
    end_of_kept = pieces[budget - 1][1]
    return {p for p, (_, end) in enumerate(spans) if end <= end_of_kept}


def expected_alignment(full: dict, i: int, cut: list[int], length: int) -> torch.Tensor:
    """Row `i` of an untruncated batch's alignment, without the phrases `cut` (indices among its grounded phrases),
    over the first `length` positions."""
    alignment = full["word_region_alignment"][i].clone()
    for p in cut:
        alignment[full["phrase_masks"][i, p]] = 0.0
    return alignment[:length]


def check_truncated_batch(tokenizer, rows, column, short: dict, full: dict, stats: TruncationStats, max_text_length):
    """The truncated batch keeps the whole phrases' alignment exactly, drops the cut ones', and counts them."""
    truncated = phrases_cut = 0
    length = short["word_region_alignment"].shape[1]
    for i, row in enumerate(rows):
        boxed = grounded(row, column)
        whole = whole_phrases(tokenizer, row[column], row[f"{column}_phrase_spans"], max_text_length)
        cut = [q for q, p in enumerate(boxed) if p not in whole]
        pieces = len(tokenizer(row[column], add_special_tokens=False)["input_ids"])
        truncated += pieces > max_text_length - 2
        phrases_cut += len(cut)
        assert int(short["phrase_masks"][i].any(-1).sum()) == len(boxed) - len(cut)
        assert int(full["phrase_masks"][i].any(-1).sum()) == len(boxed)  # nothing cut at UNTRUNCATED
        torch.testing.assert_close(short["word_region_alignment"][i], expected_alignment(full, i, cut, length), rtol=0, atol=0)
    assert stats == TruncationStats(rows=len(rows), rows_truncated=truncated, phrases_cut=phrases_cut)
    return truncated, phrases_cut


# ----------------------------------------------------------------------------------------------------------------
# Every collator, on real over-long texts
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("collator_class", [GroundedCaptionCollator, PhraseGroundingCollator])
def test_the_real_82_word_piece_caption_at_the_default_max_text_length(tokenizer, flickr, collator_class):
    long_rows, _, store = flickr
    rows = list(long_rows)
    assert len(tokenizer(rows[0]["sentence"])["input_ids"]) == 82 and len(grounded(rows[0])) >= 10
    collator = collator_class(tokenizer, store)  # max_text_length 64: the library's default
    short, full = collator(rows), collator_class(tokenizer, store, max_text_length=UNTRUNCATED)(rows)
    assert short["input_ids"].shape[1] == collator.max_text_length == 64
    truncated, phrases_cut = check_truncated_batch(tokenizer, rows, "sentence", short, full, collator.truncation_stats, 64)
    assert (truncated, phrases_cut) == (1, 2)  # the long caption and its last two grounded phrases; 4 captions whole
    if collator_class is PhraseGroundingCollator:
        kept = int(short["phrase_masks"][0].any(-1).sum())  # the cut phrases are the caption's last ones
        torch.testing.assert_close(short["phrase_labels"][0, :kept], full["phrase_labels"][0, :kept], rtol=0, atol=0)
        assert not bool(short["phrase_labels"][0, kept:].any()) and bool(full["phrase_labels"][0, kept:].any())


def _as_questions(row: dict) -> dict:
    return {"image_id": row["image_id"], "question": row["sentence"], "label": 1,
            "question_phrase_spans": row["sentence_phrase_spans"], "question_phrase_boxes": row["sentence_phrase_boxes"]}  # fmt: skip


def _as_expression(row: dict) -> dict:
    boxed = grounded(row)
    return {"image_id": row["image_id"], "expression": row["sentence"],
            "expression_phrase_spans": [row["sentence_phrase_spans"][p] for p in boxed],
            "expression_phrase_boxes": [row["sentence_phrase_boxes"][p] for p in boxed]}  # fmt: skip


COLLATORS = {  # collator, its text column, the rows as it reads them (real captions, renamed)
    "caption": (lambda tok, store, length: GroundedCaptionCollator(tok, store, max_text_length=length), "sentence", dict),
    "phrase_grounding": (lambda tok, store, length: PhraseGroundingCollator(tok, store, max_text_length=length), "sentence", dict),
    "question_answering": (
        lambda tok, store, length: QuestionAnsweringCollator(tok, store, num_answers=2, max_text_length=length),
        "question", _as_questions,
    ),
    "referring_expression": (
        lambda tok, store, length: ReferringExpressionCollator(tok, store, max_text_length=length), "expression", _as_expression
    ),
    "captioning": (
        lambda tok, store, length: CaptioningCollator(tok, store, text_columns=("sentence",), max_text_length=length),
        "sentence", dict,
    ),
    "two_stream_pretraining": (
        lambda tok, store, length: TwoStreamPretrainingCollator(
            tok, store, text_columns=("sentence",), mlm_probability=0, object_mask_probability=0,
            mismatch_probability=0, max_text_length=length,
        ),
        "sentence", dict,
    ),
    "sentence_image_pretraining": (
        lambda tok, store, length: SingleStreamPretrainingCollator(
            tok, store, paired=False, mlm_probability=0, max_text_length=length
        ),
        "sentence", dict,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(COLLATORS))
def test_every_collator_truncates_real_captions_and_drops_only_the_cut_phrases(tokenizer, flickr, name):
    _, val_rows, store = flickr
    make, column, as_rows = COLLATORS[name]
    rows = [as_rows(row) for row in val_rows if grounded(row)]
    collator = make(tokenizer, store, SHORT)
    short, full = collator(rows), make(tokenizer, store, UNTRUNCATED)(rows)
    truncated, phrases_cut = check_truncated_batch(tokenizer, rows, column, short, full, collator.truncation_stats, SHORT)
    assert truncated > len(rows) // 2 and phrases_cut > 0  # most real captions are longer than 14 word pieces
    assert 0 < int(short["word_region_alignment"].sum()) < int(full["word_region_alignment"].sum())
    if name == "referring_expression":  # the referred region does not depend on the text
        assert torch.equal(short["labels"], full["labels"])
        assert torch.equal(short["target_region_iou"], full["target_region_iou"])
    if name == "captioning":  # the targets are the truncated caption, ending with [SEP]
        lengths = short["decoder_attention_mask"].sum(-1)
        assert int(lengths.max()) == SHORT - 1
        assert all(int(short["labels"][i, int(n) - 1]) == tokenizer.sep_token_id for i, n in enumerate(lengths))
    # the same dataset counted without collating: the same numbers
    dataset = datasets.Dataset.from_list(rows)
    kept, counted = collator.drop_overlong_rows(dataset)
    assert kept is dataset and counted == TruncationStats(rows=len(rows), rows_truncated=truncated, phrases_cut=phrases_cut)


def test_paired_captions_are_truncated_longest_first_and_never_refused(tokenizer, flickr):
    long_rows, val_rows, store = flickr
    rows = [*long_rows, *val_rows]
    pool = {}
    for row in rows:
        pool.setdefault(row["image_id"], []).append(row["sentence"])
    collator = SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=pool, max_text_length=SHORT, seed=3)
    batch = collator(rows)
    assert batch["input_ids"].shape == (len(rows), SHORT)
    assert collator.truncation_stats.rows == collator.truncation_stats.rows_truncated == len(rows)  # every pair is long
    assert collator.truncation_stats.phrases_cut > 0
    sums = batch["word_region_alignment"].sum(-1)
    torch.testing.assert_close(sums[sums > 0], torch.ones(int((sums > 0).sum())))
    assert not bool((sums > 0)[batch["token_type_ids"] == 1].any())  # the first caption's phrases only
    # counted on the first caption alone (the second is drawn at collation)
    _, counted = collator.drop_overlong_rows(datasets.Dataset.from_list(rows))
    single = SingleStreamPretrainingCollator(tokenizer, store, paired=False, max_text_length=SHORT)
    single(rows)
    assert counted == single.truncation_stats


def test_nlvr2_statements_are_truncated_and_counted(tokenizer, tmp_path):
    rows = build_dataset("nlvr2", real_sample("nlvr2"), "dev").select(range(40))
    image_ids = sorted({row[c] for row in rows for c in ("left_image_id", "right_image_id")})
    store = RegionFeatureStore.write(
        [{"image_id": i, "image_size": (100, 100), "boxes": np.array([[0, 0, 50, 50]], np.float32),
          "features": np.ones((1, 8), np.float32)} for i in image_ids],
        tmp_path / "store",
    )  # fmt: skip
    collator = ImagePairCollator(tokenizer, store, max_text_length=12)
    batch = collator(list(rows))
    long = sum(len(tokenizer(sentence, add_special_tokens=False)["input_ids"]) > 10 for sentence in rows["sentence"])
    assert batch["input_ids"].shape == (40, 12) and batch["labels"].tolist() == rows["label"]
    assert collator.truncation_stats == TruncationStats(rows=40, rows_truncated=long)
    assert 0 < long < 40
    assert collator.drop_overlong_rows(rows)[1] == collator.truncation_stats


# ----------------------------------------------------------------------------------------------------------------
# VGP: the phrase pair is required
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vgp(tmp_path_factory):
    rows = build_vgp_dataset(
        real_sample("flickr30k_entities"), real_sample("vgp", "VGP-Typology", "val_data.csv"),
        replace_caption_prob=0.0, max_examples=60,
    )  # fmt: skip
    return rows, gold_box_store(rows["image_id"], tmp_path_factory.mktemp("vgp") / "store")


def _phrase_text(tokenizer, batch, i: int, name: str) -> str:
    return tokenizer.decode(batch["input_ids"][i][batch[name][i]])


def test_vgp_pairs_whose_phrase_is_cut_are_collated_counted_and_dropped_beforehand(tokenizer, vgp, caplog):
    rows, store = vgp
    max_text_length = 24
    collator = VGPCollator(tokenizer, store, max_text_length=max_text_length)
    with caplog.at_level(logging.WARNING, logger="hf_vlalign.data.collators"):
        short = collator(list(rows))  # never refused
    full = VGPCollator(tokenizer, store, max_text_length=UNTRUNCATED)(list(rows))
    assert short["input_ids"].shape == (len(rows), max_text_length)
    assert bool(short["phrase1_mask"].any(-1).all() and short["phrase2_mask"].any(-1).all())  # the model needs both
    phrase_cut = [
        any(_phrase_text(tokenizer, short, i, name) != _phrase_text(tokenizer, full, i, name) for name in ("phrase1_mask", "phrase2_mask"))
        for i in range(len(rows))
    ]  # fmt: skip
    stats = collator.truncation_stats
    assert stats.required_spans_cut == sum(phrase_cut) > 0 and stats.rows_truncated > stats.required_spans_cut
    assert "lost part of a required span (phrase1_span, phrase2_span)" in caplog.text

    kept, counted = collator.drop_overlong_rows(rows, where="VGP val")
    assert counted.rows_dropped == counted.required_spans_cut == sum(phrase_cut)
    assert (counted.rows, counted.rows_truncated, counted.phrases_cut) == (stats.rows, stats.rows_truncated, stats.phrases_cut)
    assert kept["caption1"] == [row["caption1"] for row, cut in zip(rows, phrase_cut) if not cut]
    assert f"{sum(phrase_cut)} row(s) whose required span (phrase1_span, phrase2_span) is cut are dropped" in caplog.text
    again = VGPCollator(tokenizer, store, max_text_length=max_text_length)
    batch = again(list(kept))
    assert again.truncation_stats.required_spans_cut == 0
    whole = [i for i, cut in enumerate(phrase_cut) if not cut]
    for j, i in enumerate(whole):  # the kept rows' phrases are whole: as in the untruncated batch
        for name in ("phrase1_mask", "phrase2_mask"):
            assert _phrase_text(tokenizer, batch, j, name) == _phrase_text(tokenizer, full, i, name)


def test_a_wholly_cut_phrase_stands_on_its_captions_visible_tokens(tokenizer, vgp):
    rows, store = vgp
    row = next(row for row in rows if row["phrase2_span"][0] > len(row["caption2"]) // 2)
    batch = VGPCollator(tokenizer, store, max_text_length=5)([row])  # [CLS] c1 [SEP] c2 [SEP]: one word piece each
    assert batch["phrase2_mask"][0].tolist() == [False, False, False, True, False]


def test_warned_once_and_counted_on(tokenizer, flickr, caplog):
    _, val_rows, store = flickr
    collator = GroundedCaptionCollator(tokenizer, store, max_text_length=SHORT)
    with caplog.at_level(logging.WARNING, logger="hf_vlalign.data.collators"):
        collator([val_rows[i] for i in range(5)])
        collator([val_rows[i] for i in range(5, 10)])
    assert caplog.text.count("are truncated") == 1
    assert "GroundedCaptionCollator: texts longer than max_text_length=16 word pieces are truncated" in caplog.text
    assert collator.truncation_stats.rows == 10


def test_drop_overlong_rows_refuses_bad_arguments_and_an_empty_result(tokenizer, vgp):
    rows, _ = vgp
    pair = {"text_columns": ("caption1", "caption2"), "required_spans": {"phrase1_span": "caption1", "phrase2_span": "caption2"}}
    with pytest.raises(ValueError, match=r"`max_text_length` must be an int >= 5 .*got 4"):
        drop_overlong_rows(rows, tokenizer, 4, **pair)
    with pytest.raises(ValueError, match=r"`dataset` lacks the column\(s\) \['sentence'\]"):
        drop_overlong_rows(rows, tokenizer, 64)
    with pytest.raises(ValueError, match=r"`required_spans` must map span columns to one of `text_columns`"):
        drop_overlong_rows(rows, tokenizer, 64, text_columns=("caption1",), required_spans={"phrase2_span": "caption2"})
    with pytest.raises(ValueError, match=r"`dataset` must be a datasets.Dataset, got list"):
        drop_overlong_rows(list(rows), tokenizer, 64, **pair)
    with pytest.raises(ValueError, match=r"`batch_size` must be a positive int"):
        drop_overlong_rows(rows, tokenizer, 64, **pair, batch_size=0)
    late = rows.filter(lambda row: row["phrase2_span"][0] > 20)
    with pytest.raises(ValueError, match=r"VGP late: every one of the \d+ rows loses a required span .* max_text_length=5"):
        drop_overlong_rows(late, tokenizer, 5, **pair, where="VGP late")
    with pytest.raises(ValueError, match=r"`splits\['train'\]` must be a TruncationStats"):
        truncation_results(64, {"train": {"rows": 1}})


def test_truncation_results_sum_the_collators(tokenizer, flickr):
    _, val_rows, store = flickr
    first, second = GroundedCaptionCollator(tokenizer, store, max_text_length=SHORT), GroundedCaptionCollator(tokenizer, store)
    first([val_rows[i] for i in range(4)])
    second([val_rows[i] for i in range(4)])
    report = truncation_results(SHORT, {"train": TruncationStats(rows=3, rows_truncated=1)}, [first, second])
    assert report["max_text_length"] == SHORT and report["train"]["rows_truncated"] == 1
    assert report["collated"] == (first.truncation_stats + second.truncation_stats).to_dict()
    assert report["collated"]["rows"] == 8


# ----------------------------------------------------------------------------------------------------------------
# The examples end to end with over-long texts
# ----------------------------------------------------------------------------------------------------------------


def _run(script: str, output_dir: Path, *arguments: str) -> dict:
    """`examples/<script>.py` on a tiny BERT for 2 steps, in this process as `accelerate launch --cpu` runs it."""
    bert = save_tiny_bert(output_dir / "tiny_bert")
    argv = [
        "--output_dir", str(output_dir / "model"), "--model_name_or_path", str(bert),
        "--synthetic_train_images", "12", "--synthetic_eval_images", "6", "--max_steps", "2",
        "--per_device_train_batch_size", "8", "--report_to", "none", *arguments,
    ]  # fmt: skip
    run_example(load_script(script, ROOT / "examples" / f"{script}.py").main, argv, output_dir / "cache")
    return json.loads((output_dir / "model" / "eval_results.json").read_text())


@pytest.mark.slow
def test_finetune_vgp_runs_with_a_short_max_text_length(tmp_path):
    results = _run("finetune_vgp", tmp_path, "--max_text_length", "16", "--eval_strategy", "steps", "--eval_steps", "1")
    truncation = results["truncation"]
    assert truncation["max_text_length"] == 16
    for split in ("train", "eval"):
        counts = truncation[split]
        assert counts["rows_truncated"] > 0 and counts["phrases_cut"] > 0
        assert 0 < counts["rows_dropped"] == counts["required_spans_cut"] < counts["rows"]
    collated = truncation["collated"]  # training, evaluations and the probe: truncated, nothing required cut
    assert collated["rows_truncated"] > 0 and collated["phrases_cut"] > 0 and collated["required_spans_cut"] == 0
    assert 0.0 <= results["vgp_accuracy"] <= 1.0 and results["num_grounded_phrases"] > 0


@pytest.mark.slow
def test_pretrain_single_stream_runs_with_a_short_max_text_length(tmp_path):
    results = _run("pretrain_single_stream", tmp_path, "--max_text_length", "12", "--eval_steps", "1")
    truncation = results["truncation"]
    assert truncation["max_text_length"] == 12
    assert truncation["eval"]["rows"] == results["eval_examples"] and truncation["eval"]["rows_dropped"] == 0
    assert truncation["train"]["rows_truncated"] > 0 and truncation["train"]["phrases_cut"] > 0
    collated = truncation["collated"]  # caption pairs: every one longer than 12 word pieces
    assert collated["rows"] == collated["rows_truncated"] > 0 and collated["phrases_cut"] > 0
    assert 0.0 <= results["sentence_image_accuracy"] <= 1.0 and results["num_masked_words"] > 0
