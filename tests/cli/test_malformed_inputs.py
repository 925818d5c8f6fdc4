"""Bad input gets a clear error: one representative malformed input per kind at each door (the models' forward, their
configs, the collators and the file readers). Each case names the exception type it must raise (ValueError, or FileNotFoundError for a
missing file) and a pattern the message must contain: the offending argument, field or line."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from hf_vlalign import (
    SingleStreamConfig,
    SingleStreamModel,
    TwoStreamConfig,
    TwoStreamForPreTraining,
    default_text_model_path,
)
from hf_vlalign.data import (
    GroundedCaptionCollator,
    QuestionAnsweringCollator,
    build_dataset,
)
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.formats import iter_lxmert_tsv_records, read_annotation, read_sentences, read_vgp_csv
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
    ("ss_feature_dim_not_config", lambda c, p: run_single(visual_feats=torch.randn(B, R, DV + 1)), ValueError, r"`visual_feats`.*visual_feat_dim"),
    ("ss_input_ids_float", lambda c, p: run_single(input_ids=torch.ones(B, T)), ValueError, r"`input_ids`.*integer"),
    # --- two-stream forward ----------------------------------------------------------------------------------
    ("ts_alignment_not_BTR", lambda c, p: run_two(word_region_alignment=torch.zeros(B, T + 1, R)), ValueError, r"`word_region_alignment`"),
    # --- captioner forward and generate ----------------------------------------------------------------------
    ("cap_max_new_tokens_zero", lambda c, p: captioner().generate(**regions(), max_new_tokens=0), ValueError, r"`max_new_tokens`"),
    ("cap_feature_dim_not_config", lambda c, p: run_captioner(visual_feats=torch.randn(B, R, DV - 1)), ValueError, r"`visual_feats`.*visual_feat_dim"),
    # --- configs ---------------------------------------------------------------------------------------------
    ("cfg_ss_heads_do_not_divide_hidden", lambda c, p: SingleStreamConfig(**{**SINGLE, "hidden_size": 18}), ValueError, r"`hidden_size` \(18\).*`num_attention_heads` \(4\)"),
    ("cfg_supervised_layer_out_of_range", lambda c, p: SingleStreamConfig(**SINGLE, supervised_layers=[0, 2]), ValueError, r"`supervised_layers`.*\[0, 1\].*\[2\]"),
    ("cfg_unknown_supervision", lambda c, p: SingleStreamConfig(**{**SINGLE, "attention_supervision": "diret"}), ValueError, r"`attention_supervision`.*'diret'"),
    # --- collators -------------------------------------------------------------------------------------------
    ("col_unknown_image_id", lambda c, p: GroundedCaptionCollator(c.tokenizer, c.store)(row_with(c, image_id="no-such-image")), ValueError, r"`image_id` 'no-such-image'"),
    ("col_missing_text_column", lambda c, p: GroundedCaptionCollator(c.tokenizer, c.store, text_columns=("caption",))(c.rows), ValueError, r"\['caption'\]"),
    ("col_phrase_regions_not_a_distribution", lambda c, p: GroundedCaptionCollator(c.tokenizer, c.store)(row_with(c, sentence_phrase_regions=[[0.5, 0.9], [1.0]])), ValueError, r"`sentence_phrase_regions`.*sum"),
    ("col_qa_label_out_of_vocabulary", lambda c, p: QuestionAnsweringCollator(c.tokenizer, c.store, text_columns=("sentence",), num_answers=3)([{**c.rows[0], "label": 7}]), ValueError, r"answer label 7 .*`num_answers`=3.*`label`"),
    # --- readers ---------------------------------------------------------------------------------------------
    ("rd_lxmert_truncated_line", lambda c, p: read_lxmert(write(p / "f.tsv", lxmert_line()[:60] + "\n")), ValueError, r"f\.tsv, line 1.*10 tab-separated fields"),
    ("rd_butd_wrong_column_count", lambda c, p: list(iter_butd_tsv_records(write(p / "b.tsv", "1\t2\t3\n"))), ValueError, r"b\.tsv, line 1.*fields"),
    ("rd_vgp_wrong_column_count", lambda c, p: read_vgp_csv(write(p / "v.csv", VGP_HEADER + "1,a,b\n")), ValueError, r"v\.csv, line 2: expected \d+ columns"),
    ("rd_flickr_sentences_unclosed_phrase", lambda c, p: read_sentences(write(p / "s.txt", "[/EN#1/people A man runs\n")), ValueError, r"s\.txt, line 1: malformed markup"),
    ("rd_flickr_annotation_bad_xml", lambda c, p: read_annotation(write(p / "a.xml", "<annotation><size>\n")), ValueError, r"a\.xml, line \d+: malformed XML"),
    ("rd_npz_missing_folder", lambda c, p: list(iter_npz_dir_records(p / "absent")), FileNotFoundError, r"`path`.*absent"),
    ("rd_vlbert_missing_key", lambda c, p: list(iter_vlbert_json_records(write(p / "1.json", '{"image_id": 1}').parent)), ValueError, r"1\.json.*expected the keys"),
]


@pytest.mark.parametrize(("call", "error", "pattern"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_malformed_input_gets_a_clear_error(call, error, pattern, collator_context, tmp_path):
    with pytest.raises(error, match=pattern):
        call(collator_context, tmp_path)


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
