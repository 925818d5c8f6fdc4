"""Bad input gets a clear error: a matrix of malformed inputs to the three models' forward, their configs, the collators
and the file readers. Each case names the exception type it must raise (ValueError, or FileNotFoundError for a
missing file) and a pattern the message must contain: the offending argument, field or line."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from hf_vlalign import (
    SingleStreamConfig,
    SingleStreamForVisualParaphrase,
    SingleStreamModel,
    TwoStreamConfig,
    TwoStreamForPreTraining,
    default_text_model_path,
)
from hf_vlalign.data import (
    GroundedCaptionCollator,
    QuestionAnsweringCollator,
    TwoStreamPretrainingCollator,
    VGPCollator,
    build_dataset,
)
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.formats import iter_lxmert_tsv_records, read_annotation, read_sentences, read_split, read_vgp_csv
from hf_vlalign.data.formats.butd_tsv import iter_butd_tsv_records
from hf_vlalign.data.formats.npz_dir import iter_npz_dir_records
from hf_vlalign.data.formats.vlbert_json import iter_vlbert_json_records
from hf_vlalign.models.captioning import RegionCaptionerConfig, RegionCaptionerForConditionalGeneration
from hf_vlalign.synthetic import SyntheticSceneConfig

B, T, R, DV, V = 2, 6, 4, 12, 60


# ----------------------------------------------------------------------------------------------------------------
# Tiny models and valid inputs
# ----------------------------------------------------------------------------------------------------------------

SINGLE = dict(vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
              max_position_embeddings=16, visual_feat_dim=DV, attention_supervision="direct")  # fmt: skip
TWO = dict(vocab_size=V, hidden_size=16, num_attention_heads=4, intermediate_size=32, max_position_embeddings=16,
           l_layers=1, r_layers=1, x_layers=2, visual_feat_dim=DV, num_object_labels=5, num_attr_labels=4,
           num_qa_labels=3, task_alignment=True, alignment_top_k=2, attention_supervision="direct")  # fmt: skip
CAPTIONER = dict(vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, visual_feat_dim=DV,
                 max_position_embeddings=10, geometry_dim=8, attention_alignment="max", pad_token_id=0,
                 bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)  # fmt: skip


@functools.cache
def single_stream() -> SingleStreamModel:
    torch.manual_seed(0)
    return SingleStreamModel(SingleStreamConfig(**SINGLE)).eval()


@functools.cache
def visual_paraphrase() -> SingleStreamForVisualParaphrase:
    torch.manual_seed(0)
    return SingleStreamForVisualParaphrase(SingleStreamConfig(**SINGLE)).eval()


@functools.cache
def two_stream(**overrides) -> TwoStreamForPreTraining:
    torch.manual_seed(0)
    return TwoStreamForPreTraining(TwoStreamConfig(**{**TWO, **overrides})).eval()


@functools.cache
def captioner() -> RegionCaptionerForConditionalGeneration:
    torch.manual_seed(0)
    return RegionCaptionerForConditionalGeneration(RegionCaptionerConfig(**CAPTIONER)).eval()


def regions(num_regions: int = R) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    corners = torch.rand(B, num_regions, 2, generator=generator) * 0.5
    sizes = 0.1 + torch.rand(B, num_regions, 2, generator=generator) * 0.4
    return {
        "visual_feats": torch.randn(B, num_regions, DV, generator=generator),
        "visual_boxes": torch.cat([corners, corners + sizes], dim=-1),
        "visual_attention_mask": torch.ones(B, num_regions, dtype=torch.long),
    }


def inputs(**changes) -> dict[str, torch.Tensor]:
    """A valid single/two-stream batch with `changes` applied (a callable change receives the original value)."""
    alignment = torch.zeros(B, T, R)
    alignment[0, 1, 2] = 1.0
    alignment[1, 2, [0, 3]] = 0.5
    batch = {
        "input_ids": torch.randint(3, V, (B, T), generator=torch.Generator().manual_seed(1)),
        "attention_mask": torch.ones(B, T, dtype=torch.long),
        "token_type_ids": torch.zeros(B, T, dtype=torch.long),
        **regions(),
        "word_region_alignment": alignment,
    }
    for name, change in changes.items():
        batch[name] = change(batch[name].clone()) if callable(change) else change
    return batch


def set_(index, value) -> Callable[[torch.Tensor], torch.Tensor]:
    def change(tensor: torch.Tensor) -> torch.Tensor:
        tensor[index] = value
        return tensor

    return change


def run_single(**changes):
    return single_stream()(**inputs(**changes))


def run_two(labels: dict | None = None, config: dict | None = None, **changes):
    return two_stream(**(config or {}))(**inputs(**changes), **(labels or {}))


def run_captioner(labels: torch.Tensor | None = None, **changes):
    batch = regions()
    for name, change in changes.items():
        batch[name] = change(batch[name].clone()) if callable(change) else change
    labels = torch.tensor([[5, 6, 7, 2], [8, 9, 2, -100]]) if labels is None else labels
    return captioner()(**batch, labels=labels)


def degenerate_box(tensor: torch.Tensor) -> torch.Tensor:
    tensor[0, 1, 2] = tensor[0, 1, 0]  # x2 == x1
    return tensor


def flipped_box(tensor: torch.Tensor) -> torch.Tensor:
    tensor[1, 0] = torch.tensor([0.6, 0.6, 0.5, 0.7])  # x2 < x1
    return tensor


# ----------------------------------------------------------------------------------------------------------------
# Collators (real MiniLM tokenizer, synthetic scenes and their region-feature store)
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class CollatorContext:
    tokenizer: object
    store: object
    rows: list[dict]


@pytest.fixture(scope="module")
def collator_context(tmp_path_factory) -> CollatorContext:
    root = tmp_path_factory.mktemp("scenes")
    config = SyntheticSceneConfig(num_train_images=3, num_val_images=1, feature_dim=8, seed=0)
    store = synthetic_region_features(root, config)
    rows = build_dataset("synthetic_scenes", root, "train", store, task="captions", config=config)
    return CollatorContext(AutoTokenizer.from_pretrained(default_text_model_path()), store, [rows[0], rows[1]])


def row_with(context: CollatorContext, **changes) -> list[dict]:
    return [{**context.rows[0], **changes}, context.rows[1]]


# ----------------------------------------------------------------------------------------------------------------
# Readers (small malformed files)
# ----------------------------------------------------------------------------------------------------------------

LXMERT_HEADER = ["img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id", "attrs_conf", "num_boxes",
                 "boxes", "features"]  # fmt: skip


def lxmert_line(**changes) -> str:
    import base64

    import numpy as np

    def b64(array) -> str:
        return base64.b64encode(np.asarray(array).tobytes()).decode()

    fields = {
        "img_id": "img1", "img_h": "100", "img_w": "80", "objects_id": b64(np.array([1, 2], "<i8")),
        "objects_conf": b64(np.array([0.9, 0.8], "<f4")), "attrs_id": b64(np.array([0, 1], "<i8")),
        "attrs_conf": b64(np.array([0.5, 0.4], "<f4")), "num_boxes": "2",
        "boxes": b64(np.array([[0, 0, 10, 10], [5, 5, 40, 60]], "<f4")), "features": b64(np.ones((2, 3), "<f4")),
    }  # fmt: skip
    fields.update(changes)
    return "\t".join(fields[name] for name in LXMERT_HEADER) + "\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def read_lxmert(path: Path) -> list:
    return list(iter_lxmert_tsv_records(path))


VGP_HEADER = "image,phrase1,phrase2,original_phrase1,original_phrase2,ytrue,roi1,roi2,preprocessed_phrase1,preprocessed_phrase2,original_label,type_label\n"


# ----------------------------------------------------------------------------------------------------------------
# The matrix: (id, call(context, tmp_path), exception type, message pattern)
# ----------------------------------------------------------------------------------------------------------------

CASES = [
    # --- single-stream forward -------------------------------------------------------------------------------
    ("ss_boxes_disagree_on_R", lambda c, p: run_single(visual_boxes=torch.rand(B, R + 1, 4)), ValueError, r"`visual_boxes`.*\(batch, num_regions, 4\)"),
    ("ss_region_mask_disagrees_on_R", lambda c, p: run_single(visual_attention_mask=torch.ones(B, R - 1)), ValueError, r"`visual_attention_mask`.*\(2, 4\)"),
    ("ss_attention_mask_disagrees_on_T", lambda c, p: run_single(attention_mask=torch.ones(B, T + 1)), ValueError, r"`attention_mask`.*shape of `input_ids`"),
    ("ss_token_type_ids_disagree_on_T", lambda c, p: run_single(token_type_ids=torch.zeros(B, T - 1, dtype=torch.long)), ValueError, r"`token_type_ids`.*shape of `input_ids`"),
    ("ss_alignment_not_BTR", lambda c, p: run_single(word_region_alignment=torch.zeros(B, T, R + 2)), ValueError, r"`word_region_alignment`.*\(batch, text_length, num_regions\)"),
    ("ss_alignment_wrong_rank", lambda c, p: run_single(word_region_alignment=torch.zeros(B, T)), ValueError, r"`word_region_alignment`.*3 dims"),
    ("ss_feature_dim_not_config", lambda c, p: run_single(visual_feats=torch.randn(B, R, DV + 1)), ValueError, r"`visual_feats`.*visual_feat_dim"),
    ("ss_feats_batch_disagrees", lambda c, p: run_single(visual_feats=torch.randn(B + 1, R, DV)), ValueError, r"`visual_feats`.*batch"),
    ("ss_boxes_above_one", lambda c, p: run_single(visual_boxes=lambda b: b * 4), ValueError, r"`visual_boxes`.*\[0, 1\]"),
    ("ss_boxes_negative", lambda c, p: run_single(visual_boxes=lambda b: b - 0.7), ValueError, r"`visual_boxes`.*\[0, 1\]"),
    ("ss_boxes_x2_equals_x1", lambda c, p: run_single(visual_boxes=degenerate_box), ValueError, r"`visual_boxes`.*x2 > x1"),
    ("ss_boxes_x2_below_x1", lambda c, p: run_single(visual_boxes=flipped_box), ValueError, r"`visual_boxes`.*x2 > x1 and y2 > y1"),
    ("ss_boxes_nan", lambda c, p: run_single(visual_boxes=set_((0, 0, 0), float("nan"))), ValueError, r"`visual_boxes`.*finite"),
    ("ss_feats_nan", lambda c, p: run_single(visual_feats=set_((1, 2, 3), float("nan"))), ValueError, r"`visual_feats`.*finite"),
    ("ss_feats_inf", lambda c, p: run_single(visual_feats=set_((0, 0, 0), float("inf"))), ValueError, r"`visual_feats`.*finite"),
    ("ss_alignment_negative", lambda c, p: run_single(word_region_alignment=set_((0, 3, 1), -0.5)), ValueError, r"`word_region_alignment`.*non-negative"),
    ("ss_alignment_row_sums_to_half", lambda c, p: run_single(word_region_alignment=set_((0, 1, 2), 0.5)), ValueError, r"`word_region_alignment`.*sum to 1"),
    ("ss_alignment_nan", lambda c, p: run_single(word_region_alignment=set_((1, 0, 0), float("nan"))), ValueError, r"`word_region_alignment`.*finite"),
    ("ss_alignment_on_padded_region", lambda c, p: run_single(visual_attention_mask=set_((0, 2), 0)), ValueError, r"`word_region_alignment`.*`visual_attention_mask`"),
    ("ss_all_regions_masked", lambda c, p: run_single(visual_attention_mask=set_(1, 0)), ValueError, r"`visual_attention_mask`.*at least one region"),
    ("ss_all_tokens_masked", lambda c, p: run_single(attention_mask=set_(1, 0), word_region_alignment=torch.zeros(B, T, R)), ValueError, r"`attention_mask`.*at least one token"),
    ("ss_text_longer_than_positions", lambda c, p: run_single(input_ids=torch.ones(B, 20, dtype=torch.long), attention_mask=torch.ones(B, 20), token_type_ids=torch.zeros(B, 20, dtype=torch.long), word_region_alignment=torch.zeros(B, 20, R)), ValueError, r"`input_ids`.*`max_position_embeddings` \(16\)"),
    ("ss_input_ids_out_of_vocab", lambda c, p: run_single(input_ids=set_((0, 0), V)), ValueError, r"`input_ids`.*vocab_size"),
    ("ss_token_type_out_of_range", lambda c, p: run_single(token_type_ids=set_((0, 0), 2)), ValueError, r"`token_type_ids`.*type_vocab_size"),
    ("ss_input_ids_float", lambda c, p: run_single(input_ids=torch.ones(B, T)), ValueError, r"`input_ids`.*integer"),
    ("ss_empty_region_set", lambda c, p: single_stream()(**{**inputs(), **regions(0), "word_region_alignment": None}), ValueError, r"`visual_feats`.*at least one region"),
    ("ss_vgp_labels_out_of_range", lambda c, p: visual_paraphrase()(**inputs(), phrase1_mask=torch.ones(B, T, dtype=torch.bool), phrase2_mask=torch.ones(B, T, dtype=torch.bool), vgp_labels=torch.tensor([0, 5])), ValueError, r"`vgp_labels`"),
    ("ss_id_labels_out_of_range", lambda c, p: visual_paraphrase()(**inputs(), phrase1_mask=torch.ones(B, T, dtype=torch.bool), phrase2_mask=torch.ones(B, T, dtype=torch.bool), id_labels=torch.tensor([-1, 0])), ValueError, r"`id_labels`"),
    # --- two-stream forward ----------------------------------------------------------------------------------
    ("ts_boxes_disagree_on_R", lambda c, p: run_two(visual_boxes=torch.rand(B, R - 1, 4)), ValueError, r"`visual_boxes`"),
    ("ts_alignment_not_BTR", lambda c, p: run_two(word_region_alignment=torch.zeros(B, T + 1, R)), ValueError, r"`word_region_alignment`"),
    ("ts_top_k_larger_than_R", lambda c, p: run_two(config={"alignment_top_k": R + 1}), ValueError, r"`alignment_top_k`.*\[1, 4\]"),
    ("ts_mlm_labels_out_of_vocab", lambda c, p: run_two({"labels": torch.full((B, T), V)}), ValueError, r"`labels`"),
    ("ts_object_labels_out_of_range", lambda c, p: run_two({"object_labels": torch.full((B, R), 5), "masked_regions": torch.ones(B, R)}), ValueError, r"`object_labels`"),
    ("ts_matched_labels_out_of_range", lambda c, p: run_two({"matched_labels": torch.tensor([1, 2])}), ValueError, r"`matched_labels`"),
    ("ts_answer_labels_out_of_range", lambda c, p: run_two({"answer_labels": torch.tensor([0, 3])}), ValueError, r"`answer_labels`"),
    ("ts_feature_labels_wrong_shape", lambda c, p: run_two({"feature_labels": torch.zeros(B, R, DV + 1), "masked_regions": torch.ones(B, R)}), ValueError, r"`feature_labels`"),
    ("ts_input_ids_wrong_rank", lambda c, p: run_two(input_ids=torch.ones(B, T, 2, dtype=torch.long)), ValueError, r"`input_ids`.*\(batch, text_length\)"),
    # --- captioner forward and generate ----------------------------------------------------------------------
    ("cap_max_new_tokens_zero", lambda c, p: captioner().generate(**regions(), max_new_tokens=0), ValueError, r"`max_new_tokens`"),
    ("cap_feature_dim_not_config", lambda c, p: run_captioner(visual_feats=torch.randn(B, R, DV - 1)), ValueError, r"`visual_feats`.*visual_feat_dim"),
    ("cap_region_mask_disagrees_on_R", lambda c, p: run_captioner(visual_attention_mask=torch.ones(B, R + 1)), ValueError, r"`visual_attention_mask`"),
    ("cap_all_regions_masked", lambda c, p: run_captioner(visual_attention_mask=set_(0, 0)), ValueError, r"`visual_attention_mask`.*at least one region"),
    ("cap_boxes_outside_unit_square", lambda c, p: run_captioner(visual_boxes=lambda b: b * 100), ValueError, r"`visual_boxes`.*\[0, 1\]"),
    ("cap_boxes_y2_below_y1", lambda c, p: run_captioner(visual_boxes=set_((0, 1, 3), 0.0)), ValueError, r"`visual_boxes`.*y2 > y1"),
    ("cap_feats_inf", lambda c, p: run_captioner(visual_feats=set_((0, 0, 0), float("-inf"))), ValueError, r"`visual_feats`.*finite"),
    ("cap_empty_region_set", lambda c, p: captioner()(**regions(0), labels=torch.tensor([[5, 2], [6, 2]])), ValueError, r"`visual_feats`.*at least one region"),
    ("cap_labels_out_of_vocab", lambda c, p: run_captioner(labels=torch.tensor([[5, V + 3, 2, -100], [5, 2, -100, -100]])), ValueError, r"`labels`.*vocab_size"),
    ("cap_caption_longer_than_positions", lambda c, p: run_captioner(labels=torch.full((B, 12), 5)), ValueError, r"`decoder_input_ids`.*`max_position_embeddings` \(10\)"),
    ("cap_unknown_alignment_mode", lambda c, p: captioner()(**regions(), labels=torch.tensor([[5, 2], [6, 2]]), alignment_mode="sideways"), ValueError, r"`alignment_mode`"),
    # --- configs ---------------------------------------------------------------------------------------------
    ("cfg_ss_heads_do_not_divide_hidden", lambda c, p: SingleStreamConfig(**{**SINGLE, "hidden_size": 18}), ValueError, r"`hidden_size` \(18\).*`num_attention_heads` \(4\)"),
    ("cfg_ss_zero_heads", lambda c, p: SingleStreamConfig(**{**SINGLE, "num_attention_heads": 0}), ValueError, r"`num_attention_heads`"),
    ("cfg_ts_heads_do_not_divide_hidden", lambda c, p: TwoStreamConfig(**{**TWO, "num_attention_heads": 3}), ValueError, r"`hidden_size`.*`num_attention_heads` \(3\)"),
    ("cfg_cap_heads_do_not_divide_d_model", lambda c, p: RegionCaptionerConfig(**{**CAPTIONER, "decoder_attention_heads": 5}), ValueError, r"`d_model`.*`decoder_attention_heads` \(5\)"),
    ("cfg_supervised_layer_out_of_range", lambda c, p: SingleStreamConfig(**SINGLE, supervised_layers=[0, 2]), ValueError, r"`supervised_layers`.*\[0, 1\].*\[2\]"),
    ("cfg_supervised_head_out_of_range", lambda c, p: TwoStreamConfig(**TWO, supervised_heads=[-1]), ValueError, r"`supervised_heads`.*\[-1\]"),
    ("cfg_ts_supervised_layer_beyond_x_layers", lambda c, p: TwoStreamConfig(**TWO, supervised_layers=[5]), ValueError, r"`supervised_layers`"),
    ("cfg_unknown_supervision", lambda c, p: SingleStreamConfig(**{**SINGLE, "attention_supervision": "diret"}), ValueError, r"`attention_supervision`.*'diret'"),
    ("cfg_unknown_fusion", lambda c, p: RegionCaptionerConfig(**{**CAPTIONER, "attention_alignment": "mean"}), ValueError, r"`attention_alignment`.*'mean'"),
    ("cfg_aligned_layer_out_of_range", lambda c, p: RegionCaptionerConfig(**CAPTIONER, aligned_layers=[2]), ValueError, r"`aligned_layers`"),
    ("cfg_top_k_zero", lambda c, p: TwoStreamConfig(**{**TWO, "alignment_top_k": 0}), ValueError, r"`alignment_top_k`"),
    ("cfg_negative_supervision_weight", lambda c, p: SingleStreamConfig(**SINGLE, attention_supervision_weight=-1.0), ValueError, r"`attention_supervision_weight`"),
    ("cfg_zero_visual_feat_dim", lambda c, p: SingleStreamConfig(**{**SINGLE, "visual_feat_dim": 0}), ValueError, r"`visual_feat_dim`"),
    # --- collators -------------------------------------------------------------------------------------------
    ("col_unknown_image_id", lambda c, p: GroundedCaptionCollator(c.tokenizer, c.store)(row_with(c, image_id="no-such-image")), ValueError, r"`image_id` 'no-such-image'"),
    ("col_empty_batch", lambda c, p: GroundedCaptionCollator(c.tokenizer, c.store)([]), ValueError, r"`examples`"),
    ("col_missing_text_column", lambda c, p: GroundedCaptionCollator(c.tokenizer, c.store, text_columns=("caption",))(c.rows), ValueError, r"\['caption'\]"),
    ("col_three_text_columns", lambda c, p: GroundedCaptionCollator(c.tokenizer, c.store, text_columns=("a", "b", "c")), ValueError, r"`text_columns`"),
    ("col_phrase_regions_longer_than_image", lambda c, p: GroundedCaptionCollator(c.tokenizer, c.store)(row_with(c, sentence_phrase_regions=[[0.0] * 40 + [1.0]] * 2)), ValueError, r"`sentence_phrase_regions`"),
    ("col_phrase_regions_not_a_distribution", lambda c, p: GroundedCaptionCollator(c.tokenizer, c.store)(row_with(c, sentence_phrase_regions=[[0.5, 0.9], [1.0]])), ValueError, r"`sentence_phrase_regions`.*sum"),
    ("col_phrase_span_outside_text", lambda c, p: GroundedCaptionCollator(c.tokenizer, c.store)(row_with(c, sentence_phrase_spans=[[200, 210], [0, 3]])), ValueError, r"`sentence_phrase_spans`"),
    ("col_vgp_missing_span_column", lambda c, p: VGPCollator(c.tokenizer, c.store)([{"image_id": c.rows[0]["image_id"], "caption1": "a cat", "caption2": "a dog"}]), ValueError, r"`phrase1_span`"),
    ("col_qa_label_out_of_vocabulary", lambda c, p: QuestionAnsweringCollator(c.tokenizer, c.store, text_columns=("sentence",), num_answers=3)([{**c.rows[0], "label": 7}]), ValueError, r"answer label 7 .*`num_answers`=3.*`label`"),
    ("col_qa_no_answer_vocabulary", lambda c, p: QuestionAnsweringCollator(c.tokenizer, c.store, num_answers=0), ValueError, r"`num_answers`"),
    ("col_pretraining_bad_probability", lambda c, p: TwoStreamPretrainingCollator(c.tokenizer, c.store, mlm_probability=1.5), ValueError, r"`mlm_probability`"),
    # --- readers ---------------------------------------------------------------------------------------------
    ("rd_lxmert_missing_file", lambda c, p: read_lxmert(p / "absent.tsv"), FileNotFoundError, r"`path`.*absent\.tsv"),
    ("rd_lxmert_truncated_line", lambda c, p: read_lxmert(write(p / "f.tsv", lxmert_line()[:60] + "\n")), ValueError, r"f\.tsv, line 1.*10 tab-separated fields"),
    ("rd_lxmert_num_boxes_not_int", lambda c, p: read_lxmert(write(p / "f.tsv", lxmert_line() + lxmert_line(num_boxes="two"))), ValueError, r"line 2, field 'num_boxes'"),
    ("rd_lxmert_features_wrong_size", lambda c, p: read_lxmert(write(p / "f.tsv", lxmert_line(features="AAAA"))), ValueError, r"line 1, field 'features'"),
    ("rd_lxmert_box_outside_image", lambda c, p: read_lxmert(write(p / "f.tsv", lxmert_line(img_w="20"))), ValueError, r"line 1, field 'boxes'"),
    ("rd_butd_wrong_column_count", lambda c, p: list(iter_butd_tsv_records(write(p / "b.tsv", "1\t2\t3\n"))), ValueError, r"b\.tsv, line 1.*fields"),
    ("rd_vgp_missing_file", lambda c, p: read_vgp_csv(p / "absent.csv"), FileNotFoundError, r"`path`.*absent\.csv"),
    ("rd_vgp_wrong_column_count", lambda c, p: read_vgp_csv(write(p / "v.csv", VGP_HEADER + "1,a,b\n")), ValueError, r"v\.csv, line 2: expected \d+ columns"),
    ("rd_vgp_bad_ytrue", lambda c, p: read_vgp_csv(write(p / "v.csv", VGP_HEADER + "1,a cat,the cat,a cat,the cat,maybe,0,1,a cat,the cat,,\n")), ValueError, r"column 'ytrue'"),
    ("rd_vgp_unknown_header", lambda c, p: read_vgp_csv(write(p / "v.csv", "x,y\n1,2\n")), ValueError, r"line 1: unknown VGP CSV header"),
    ("rd_flickr_sentences_unclosed_phrase", lambda c, p: read_sentences(write(p / "s.txt", "[/EN#1/people A man runs\n")), ValueError, r"s\.txt, line 1: malformed markup"),
    ("rd_flickr_annotation_bad_xml", lambda c, p: read_annotation(write(p / "a.xml", "<annotation><size>\n")), ValueError, r"a\.xml, line \d+: malformed XML"),
    ("rd_flickr_annotation_flipped_box", lambda c, p: read_annotation(write(p / "a.xml", "<annotation><size><width>10</width><height>10</height><depth>3</depth></size><object><name>1</name><bndbox><xmin>8</xmin><ymin>0</ymin><xmax>2</xmax><ymax>5</ymax></bndbox></object></annotation>")), ValueError, r"<bndbox>.*xmin <= xmax"),
    ("rd_flickr_split_not_numeric", lambda c, p: read_split(write(p / "val.txt", "123\nabc\n")), ValueError, r"val\.txt, line 2"),
    ("rd_flickr_missing_file", lambda c, p: read_sentences(p / "absent.txt"), FileNotFoundError, r"`path`.*absent\.txt"),
    ("rd_npz_missing_folder", lambda c, p: list(iter_npz_dir_records(p / "absent")), FileNotFoundError, r"`path`.*absent"),
    ("rd_npz_given_a_file", lambda c, p: list(iter_npz_dir_records(write(p / "file.npz", "x"))), ValueError, r"`path`.*not a regular|`path`.*folder"),
    ("rd_vlbert_missing_key", lambda c, p: list(iter_vlbert_json_records(write(p / "1.json", '{"image_id": 1}').parent)), ValueError, r"1\.json.*expected the keys"),
]


@pytest.mark.parametrize(("call", "error", "pattern"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_malformed_input_gets_a_clear_error(call, error, pattern, collator_context, tmp_path):
    with pytest.raises(error, match=pattern):
        call(collator_context, tmp_path)


def test_the_matrix_is_large_and_its_ids_unique():
    ids = [case[0] for case in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 35


def test_a_missing_file_is_also_a_value_error(tmp_path):
    with pytest.raises(ValueError, match=r"`path`.*does not exist"):
        read_vgp_csv(tmp_path / "absent.csv")


def test_the_valid_inputs_of_the_matrix_run(collator_context):
    """The matrix's base inputs are valid, so each case fails for the one thing it changes."""
    assert torch.isfinite(run_single().loss_attention_supervision)
    assert torch.isfinite(run_two({"matched_labels": torch.tensor([1, 0])}).loss)
    assert torch.isfinite(run_captioner().loss)
    batch = GroundedCaptionCollator(collator_context.tokenizer, collator_context.store)(collator_context.rows)
    assert batch["word_region_alignment"].sum() > 0
