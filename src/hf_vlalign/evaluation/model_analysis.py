"""`hf-vlalign analyze`: Li et al.'s grounding probe and its per-dependency-relation variant (Table 2, with spaCy),
attention entropy per block (Ilinykh, Analysis III), attention against box distance (Analysis II), attention within
object clusters (Analysis I) and the plots, for a saved model of any family, on the synthetic scenes (offline
default, read as its family reads them), Flickr30k Entities single captions (Li et al.'s setting) or a user's
`caption` file.
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image
from transformers import AutoTokenizer

from ..analysis.adapters import attention_blocks
from ..analysis.attention_plots import format_region_labels, plot_top_regions_on_image, plot_word_region_heatmaps
from ..analysis.entropy import AttentionEntropy, plot_entropy
from ..analysis.explorer import GoldPhrase
from ..analysis.geometry import (
    CLUSTER_SOURCES,
    DEFAULT_NUM_SPATIAL_CLUSTERS,
    AttentionDistance,
    WithinClusterAttention,
    plot_attention_vs_distance,
    plot_within_cluster,
    region_clusters,
)
from ..analysis.grounding_probe import BEST_AMONG_ALL, GroundingProbe, best_active_head
from ..analysis.probe_plots import plot_head_accuracy, plot_layer_accuracy_scatter
from ..analysis.syntactic_grounding import SyntacticGroundingProbe
from ..data.collators import span_token_mask
from ..models.family import family_spec
from ..models.single_stream.family import SINGLE_STREAM
from ..synthetic import SHAPE_NAMES, SyntheticSceneConfig, load_or_generate_synthetic_vgp
from ..utils.output_paths import refuse_foreign_folder, refuse_output_overlapping_inputs
from ..utils.size_limits import MAX_ANALYSIS_EXAMPLES, MAX_BATCH_SIZE, MAX_SPATIAL_CLUSTERS, check_size
from .inference import first_examples, inference_batches
from .syntactic_analysis import SyntacticGroundingAnalysis
from .tasks import load_model
from .user_files import user_file_images

ANALYSIS_FILE = "analysis.json"


@dataclass
class AnalysisData:
    """What `analyze_model` runs on: the examples, the collator returning probe targets, the key of the text mask and,
    optionally, the images (`image_paths`, else `<image_dir>/<image_id>.png`) and the detector's class names (indexed
    by the store's `object_ids`). `encoder_only`: run `model.base_model`, for data without its task head's inputs."""

    dataset: object
    collator: object
    text_mask_key: str
    description: str
    image_dir: Path | None = None
    class_names: tuple[str, ...] | None = None
    encoder_only: bool = False
    image_paths: dict[str, Path] | None = None

    def image_path(self, image_id: str) -> Path | None:
        """The image file of `image_id`: from `image_paths`, else `<image_dir>/<image_id>.png`; None without either."""
        if self.image_paths is not None:
            return self.image_paths.get(image_id)
        return self.image_dir / f"{image_id}.png" if self.image_dir is not None else None


def vgp_analysis_data(tokenizer, flickr30k_entities_dir, vgp_train_csv, vgp_eval_csv, features) -> AnalysisData:
    """Real VGP caption pairs (Flickr30k Entities boxes, a `RegionFeatureStore`) for a single-stream model."""
    from ..data import VGPCollator
    from ..data.builders import load_vgp_data

    files = {"flickr30k_entities_dir": flickr30k_entities_dir, "vgp_train_csv": vgp_train_csv, "vgp_eval_csv": vgp_eval_csv, "features": features}
    missing = [name for name, value in files.items() if value is None]
    if missing:
        raise ValueError(f"real VGP data needs {sorted(files)}; missing: {missing}.")
    data = load_vgp_data(flickr30k_entities_dir, vgp_train_csv, vgp_eval_csv, region_features=features)
    collator = VGPCollator(tokenizer, data.region_features, return_probe_targets=True)
    return AnalysisData(data.eval, collator, SINGLE_STREAM.text_mask_key, f"VGP caption pairs ({vgp_eval_csv})")


def flickr30k_entities_analysis_data(
    tokenizer,
    flickr30k_entities_dir: str | Path,
    features: str | Path,
    split: str = "val",
    max_images: int | None = None,
    max_text_length: int = 64,
) -> AnalysisData:
    """Li et al.'s setting for a single-stream model: Flickr30k Entities captions of `split` (of its first
    `max_images` images), each alone with its image's regions (the `RegionFeatureStore` at `features`) and its
    phrases' gold boxes."""
    from ..data import GroundedCaptionCollator, RegionFeatureStore
    from ..data.builders import build_dataset

    for name, value in (("flickr30k_entities_dir", flickr30k_entities_dir), ("features", features)):
        if value is None:
            raise ValueError(f"Flickr30k Entities single captions need `{name}`, got None.")
    store = RegionFeatureStore.load(features)
    options = {} if max_images is None else {"max_images": max_images}
    captions = build_dataset("flickr30k_entities", flickr30k_entities_dir, split, region_features=store, **options)
    collator = GroundedCaptionCollator(
        tokenizer, store, text_columns=("sentence",), max_text_length=max_text_length, return_probe_targets=True
    )
    description = f"Flickr30k Entities {split}, single captions ({len(captions)} captions)"
    return AnalysisData(captions, collator, SINGLE_STREAM.text_mask_key, description, encoder_only=True)


def user_analysis_data(
    model_dir: str | Path,
    model,
    tokenizer,
    data_file: str | Path,
    max_text_length: int = 64,
    require_phrases: bool = True,
) -> AnalysisData:
    """A user's `caption` file (`data.builders.user_data`), each caption alone with its image's regions (made as the
    model's processor makes them), read as the model's family reads captions: a single-stream encoder, a two-stream
    model's pre-training inputs, a captioner's teacher-forced captions. `require_phrases`: refuse a file without any
    grounded phrase."""
    from ..data import CaptioningCollator, GroundedCaptionCollator, TwoStreamPretrainingCollator
    from .user_files import check_grounded_phrases, load_user_file

    data = load_user_file(model_dir, model.config, data_file, "caption")
    if require_phrases:
        check_grounded_phrases(data, data_file, "the grounding probe")
    spec, store = family_spec(model), data.store
    options = {"text_columns": ("caption",), "max_text_length": max_text_length, "return_probe_targets": True}
    description = f"{data_file}, single captions ({len(data.train)} captions)"
    files = {"image_paths": data.image_paths}
    if spec.name == "single_stream":
        return AnalysisData(data.train, GroundedCaptionCollator(tokenizer, store, **options), spec.text_mask_key,
                            description, encoder_only=True, **files)  # fmt: skip
    if spec.name == "two_stream":
        collator = TwoStreamPretrainingCollator(  # captions carry no answers: nothing masked, every image matched
            tokenizer, store, mlm_probability=0, object_mask_probability=0, mismatch_probability=0, num_answers=0, **options
        )
        return AnalysisData(data.train, collator, spec.text_mask_key, description, **files)
    collator = CaptioningCollator(tokenizer, store, **options)
    return AnalysisData(data.train, collator, spec.text_mask_key, f"{description}, teacher-forced", **files)


def synthetic_analysis_data(model, tokenizer, synthetic: SyntheticSceneConfig) -> AnalysisData:
    """The synthetic scenes' evaluation split, read as the model's family reads it, with the probe's targets."""
    from ..data import CaptioningCollator, TwoStreamPretrainingCollator, VGPCollator, build_dataset
    from ..data.builders import load_vgp_data
    from ..data.builders.synthetic_scenes import synthetic_region_features

    spec = family_spec(model)
    scenes = {"image_dir": load_or_generate_synthetic_vgp(config=synthetic).images, "class_names": SHAPE_NAMES}
    if spec.name == "single_stream":
        data = load_vgp_data(synthetic_config=synthetic)
        collator = VGPCollator(tokenizer, data.region_features, return_probe_targets=True)
        return AnalysisData(data.eval, collator, spec.text_mask_key, "synthetic scenes, VGP caption pairs (val)", **scenes)
    store = synthetic_region_features(config=synthetic)
    if spec.name == "two_stream":
        questions = build_dataset("synthetic_scenes", None, "val", task="questions", config=synthetic, region_features=store)
        collator = TwoStreamPretrainingCollator(
            tokenizer, store, mlm_probability=0, object_mask_probability=0, mismatch_probability=0,
            num_answers=model.config.num_qa_labels if model.config.task_qa else 0, return_probe_targets=True,
        )  # fmt: skip
        return AnalysisData(questions, collator, spec.text_mask_key, "synthetic scenes, GQA-format questions (val)", **scenes)
    captions = build_dataset("synthetic_scenes", None, "val", task="captions", config=synthetic)
    collator = CaptioningCollator(tokenizer, store, text_columns=("sentence",), return_probe_targets=True)
    description = "synthetic scenes, captions (test, teacher-forced)"
    return AnalysisData(captions, collator, spec.text_mask_key, description, **scenes)


def gold_phrases(row: dict, data: AnalysisData, captioner: bool) -> list[GoldPhrase]:
    """The row's grounded phrases: word positions (the collator's tokenisation; the captioner's labels drop [CLS]) and
    gold boxes normalised by the row's image size (height, width)."""
    collator = data.collator
    texts = [row[column] for column in collator.text_columns]
    encoding = collator.tokenizer(
        *texts, truncation=True, max_length=collator.max_text_length, return_offsets_mapping=True, return_tensors="pt"
    )
    offsets = encoding["offset_mapping"][0]
    sequence_ids = torch.tensor([-1 if sid is None else sid for sid in encoding.sequence_ids(0)])
    height, width = row["image_size"]
    phrases = []
    for sequence, column in enumerate(collator.text_columns):
        spans = row.get(f"{column}_phrase_spans") or []
        for span, boxes in zip(spans, row.get(f"{column}_phrase_boxes") or [None] * len(spans)):
            tokens = span_token_mask(offsets, sequence_ids == sequence, span).nonzero().flatten() - int(captioner)
            if boxes and len(tokens):
                scaled = [[x1 / width, y1 / height, x2 / width, y2 / height] for x1, y1, x2, y2 in boxes]
                phrases.append(GoldPhrase(tokens.tolist(), scaled, row[column][span[0] : span[1]]))
    return phrases


# the targets of attention supervision and of the alignment decoder: the analyses read attention maps only, and
# without these the model computes no attention loss (the same maps; 12 % of a direct-supervised VGP model's forward)
ATTENTION_TARGET_KEYS = ("word_region_alignment", "phrase_masks")


@dataclass
class _Accumulators:
    """The analyses fed batch by batch."""

    probe: GroundingProbe
    entropy: AttentionEntropy
    distance: AttentionDistance
    clusters: WithinClusterAttention
    cluster_ids: object  # (examples, batch) -> ((B, R) cluster ids, source used)
    syntax: SyntacticGroundingAnalysis | None = None
    distance_seen: bool = False
    cluster_sources: set = field(default_factory=set)
    first_batch: tuple | None = None

    def update(self, examples: list[dict], batch: dict, blocks) -> None:
        rows = torch.stack(blocks.word_to_region)  # (L, B, H, T, R)
        self.probe.update_from_text_to_region(
            rows, batch["phrase_token_index"], batch["phrase_region_iou"], batch["visual_attention_mask"], batch["region_confidence"]
        )
        if self.syntax is not None:
            self.syntax.update(examples, batch, rows)
        self.entropy.update(blocks)
        if blocks.region_to_region is not None:
            self.distance.update(blocks, batch["visual_boxes"])
            self.distance_seen = True
            clusters, source = self.cluster_ids(examples, batch)
            self.clusters.update(blocks, clusters)
            self.cluster_sources.add(source)
        if self.first_batch is None:
            self.first_batch = (examples, batch, blocks)


def _region_object_ids(data: AnalysisData, row: dict) -> torch.Tensor | None:
    """The detector class of each region of the row's image (the store's `object_ids`), or None where it has none."""
    object_ids = data.collator.region_features[data.collator.store_image_id(row)]["object_ids"]
    if object_ids is None:
        return None
    return torch.as_tensor(object_ids).reshape(len(object_ids), -1)[:, 0]


def _store_object_ids(data: AnalysisData, examples: list[dict], num_regions: int) -> torch.Tensor | None:
    """(B, R) detector class of each example's regions (-1 on padding), or None when one image has no classes."""
    ids = torch.full((len(examples), num_regions), -1, dtype=torch.long)
    for i, row in enumerate(examples):
        column = _region_object_ids(data, row)
        if column is None:
            return None
        ids[i, : len(column)] = column
    return ids


def _cluster_ids(data: AnalysisData, source: str, num_spatial_clusters: int):
    """The (examples, batch) -> (cluster ids, source) function of the within-cluster analysis."""

    def cluster_ids(examples: list[dict], batch: dict) -> tuple[torch.Tensor, str]:
        mask = batch["visual_attention_mask"]
        object_ids = None if source == "spatial" else _store_object_ids(data, examples, mask.shape[1])
        return region_clusters(batch["visual_boxes"], mask, object_ids, source, num_spatial_clusters)

    return cluster_ids


@torch.no_grad()
def analyze_model(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    data: AnalysisData | None = None,
    data_file: str | Path | None = None,
    max_text_length: int = 64,
    synthetic: SyntheticSceneConfig | None = None,
    batch_size: int = 32,
    max_examples: int | None = None,
    progress: bool = True,
    syntactic_grounding: bool = True,
    spacy_model: str | None = None,
    active_heads_only: bool = True,
    cluster_source: str = "auto",
    num_spatial_clusters: int = DEFAULT_NUM_SPATIAL_CLUSTERS,
) -> dict:
    """Runs the grounding probe, the entropy, distance and within-cluster analyses and their plots of the model saved
    in `model_dir` over `data` (default: the synthetic scenes' evaluation split) or a user's `caption` file
    `data_file` with grounded phrases (`user_analysis_data`, texts cut at `max_text_length` word pieces); writes
    `analysis.json` and PNGs into `out_dir` and returns the JSON content.

    The PNGs (the probe per head and per layer, entropy, distance, within-cluster attention with clusters from
    `cluster_source`, the first grounded example's heatmaps and top boxes on its image, and with spaCy's `spacy_model`
    Li et al.'s Table 2) and what is skipped are listed in analysis.json. Best heads are the best of the actively
    attending heads (> 20 % of attention on the regions; `active_heads_only=False`: of all heads). `out_dir` must be
    new, empty or an earlier analysis, and none of the inputs, nor inside or around one (checked before the model runs).
    """
    check_size("batch_size", batch_size, MAX_BATCH_SIZE, limit_name="MAX_BATCH_SIZE")
    if max_examples is not None:
        check_size("max_examples", max_examples, MAX_ANALYSIS_EXAMPLES, limit_name="MAX_ANALYSIS_EXAMPLES")
    if cluster_source not in CLUSTER_SOURCES:
        raise ValueError(f"`cluster_source` must be one of {CLUSTER_SOURCES}, got {cluster_source!r}.")
    check_size("num_spatial_clusters", num_spatial_clusters, MAX_SPATIAL_CLUSTERS, limit_name="MAX_SPATIAL_CLUSTERS")
    if data is not None and data_file is not None:
        raise ValueError("pass `data` or `data_file`, not both.")
    inputs = {"model_dir": model_dir, "data.image_dir": getattr(data, "image_dir", None), "data_file": data_file}
    check_analysis_output(out_dir, inputs | user_file_images(data_file, "caption"))
    model = load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if data_file is not None:
        data = user_analysis_data(model_dir, model, tokenizer, data_file, max_text_length)
    if data is not None and data.text_mask_key == "attention_mask" and family_spec(model).name == "captioner":
        raise ValueError("`data` holds text pairs for an encoder model, but `model_dir` holds a captioner.")
    data = data or synthetic_analysis_data(model, tokenizer, synthetic or SyntheticSceneConfig())
    if data.encoder_only:
        if family_spec(model).name != SINGLE_STREAM.name:
            raise ValueError(
                f"`data` ({data.description}) is read by a single-stream model, but `model_dir` holds a "
                f"{model.config.model_type}."
            )
        model = model.base_model
    dataset = first_examples(data.dataset, max_examples, data.description)  # analysis.json's num_examples: the count used
    source = family_spec(model).name
    end_token = getattr(model.config, "use_end_token", None)  # single-stream: with or without VL-BERT's [END]
    syntax, skipped = None, "`syntactic_grounding=False`."
    if syntactic_grounding:
        try:  # without spaCy or its English pipeline, analysis.json says why it is skipped
            syntax = SyntacticGroundingAnalysis(
                SyntacticGroundingProbe(*family_spec(model).probe_shape(model), active_heads_only=active_heads_only),
                tokenizer, tuple(data.collator.text_columns), data.collator.max_text_length,
                token_shift=-1 if data.text_mask_key == "decoder_attention_mask" else 0, spacy_model=spacy_model,
            )  # fmt: skip
        except ImportError as error:
            skipped = str(error)
    analyses = _Accumulators(
        GroundingProbe(*family_spec(model).probe_shape(model), active_heads_only=active_heads_only), AttentionEntropy(),
        AttentionDistance(), WithinClusterAttention(), _cluster_ids(data, cluster_source, num_spatial_clusters), syntax,
    )  # fmt: skip
    batches = inference_batches(
        model, dataset, data.collator, batch_size, exclude=ATTENTION_TARGET_KEYS, forward_arguments_only=True,
        description="analysis", progress=progress,
    )  # fmt: skip
    for batch in batches:
        outputs = model(**batch.inputs, output_attentions=True)
        masks = {"text_mask": batch.batch[data.text_mask_key], "region_mask": batch.batch["visual_attention_mask"]}
        analyses.update(batch.rows, batch.batch, attention_blocks(outputs, **masks, source=source, end_token=end_token))
    result = analyses.probe.compute()
    entropy_rows = analyses.entropy.compute()
    distance_rows = analyses.distance.compute() if analyses.distance_seen else []
    cluster_rows = analyses.clusters.compute() if analyses.distance_seen else []
    report = {
        "model_dir": str(model_dir),
        "model_type": model.config.model_type,
        "data": data.description,
        "num_examples": len(dataset),
        "grounding_probe": result.to_dict(),
        "grounding_probe_rows": result.to_rows(),
        "attention_entropy": entropy_rows,
        "attention_vs_distance": distance_rows,
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = Path(model_dir).name
    title = f"syntactic grounding, best head per relation: {name}"
    # the same images as the entity probe: the same kind of baseline
    syntactic = {"skipped": skipped} if syntax is None else syntax.report(out_dir, title, baseline_name=result.baseline_name)
    report["syntactic_grounding"] = syntactic if "skipped" in syntactic else {**syntactic, "baseline_kind": result.baseline_kind}
    _plot_probe(result, out_dir, name)
    plot_entropy(entropy_rows, out_dir / "attention_entropy.png", title=name)
    if distance_rows:
        plot_attention_vs_distance(distance_rows, out_dir / "attention_vs_distance.png", title=name)
    report["within_cluster_attention"] = _within_cluster_report(
        cluster_rows, analyses.cluster_sources, num_spatial_clusters, out_dir, name
    )
    example = _first_example(analyses.first_batch, tokenizer, data, analyses.probe.iou_threshold)
    _plot_word_region_heatmaps(example, analyses.first_batch[2], result, out_dir / "word_region_heatmaps.png", name)
    report["top_regions_on_image"] = _plot_top_regions(example, analyses.first_batch[2], result, data, out_dir, name)
    (out_dir / ANALYSIS_FILE).write_text(json.dumps(_json_ready(report), indent=2) + "\n")
    return _json_ready(report)


def is_analysis_folder(folder: Path) -> bool:
    """Whether `folder` holds an earlier `analyze_model` output: its `analysis.json` with the grounding probe."""
    try:
        report = json.loads((folder / ANALYSIS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and {"grounding_probe", "data"} <= set(report)


def check_analysis_output(
    out_dir: str | Path, inputs: dict[str, str | Path | None], output_argument: str = "out_dir"
) -> None:
    """Before the model runs: `out_dir` is none of `inputs` (the model folder, the data's files), nor inside or around
    one, and is new, empty or an earlier analysis (its files are replaced; a folder of other files is left alone)."""
    refuse_output_overlapping_inputs(out_dir, inputs, output_argument=output_argument)
    refuse_foreign_folder(out_dir, output_argument, description="an analysis folder", is_own=is_analysis_folder)


def _within_cluster_report(rows: list[dict], sources: set, num_spatial_clusters: int, out_dir: Path, name: str) -> dict:
    """analysis.json's "within_cluster_attention" (Ilinykh, Analysis I) and its plot, or why it is skipped."""
    if not rows:
        return {"skipped": "the model's outputs have no region->region attention."}
    source = " + ".join(sorted(sources))
    title = f"{name}: region attention within clusters ({source})"
    path = plot_within_cluster(rows, out_dir / "within_cluster_attention.png", title=title)
    return {
        "cluster_source": source,
        "num_spatial_clusters": num_spatial_clusters if "spatial" in sources else None,
        "min_cluster_size": 2,
        "per_layer": rows,
        "plot": path.name,
    }


def _json_ready(value):
    """NaN (an empty bin, an undefined share) becomes null, so analysis.json stays valid JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    return value


def _plot_probe(result, out_dir: Path, name: str) -> None:
    """The probe's layer x head heatmap and per-layer scatter, both with the probe's baseline, named by its kind."""
    baseline, count = result.baseline_accuracy, result.num_phrases
    plot_head_accuracy(
        result.accuracy, out_dir / "grounding_accuracy_per_head.png", title=f"grounding accuracy per head: {name}",
        baseline=baseline, num_phrases=count, active_share=result.active_share, active_threshold=result.active_threshold,
        baseline_name=result.baseline_name, active_heads_only=result.best_among != BEST_AMONG_ALL,
    )  # fmt: skip
    plot_layer_accuracy_scatter(
        result.accuracy, out_dir / "grounding_accuracy_per_layer.png", baseline=baseline,
        title=f"grounding accuracy per layer: {name}", num_phrases=count, baseline_label=result.baseline_name,
    )  # fmt: skip


@dataclass
class _Example:
    """The first grounded example of the first batch, as the figures draw it."""

    row: dict
    index: int  # its row in the batch
    tokens: torch.Tensor  # positions of its grounded words (each phrase's last sub-word, the probe's query)
    words: list[str]
    regions: torch.Tensor  # its real regions
    boxes: torch.Tensor  # (R, 4) their boxes, normalised
    region_labels: list[str]  # "r<i> <class> (x1,y1)-(x2,y2)", normalised coordinates
    gold_regions: list[list[int]]  # per grounded word, its phrase's regions with IoU >= the probe's threshold
    iou_threshold: float
    text: str


def _region_classes(data: AnalysisData, row: dict) -> list[str] | None:
    """The detector class name of each region, or None where the store has no classes."""
    ids = _region_object_ids(data, row)
    if ids is None:
        return None
    names = data.class_names or ()
    return [names[i] if 0 <= i < len(names) else f"class {i}" for i in ids.tolist()]


def _first_example(first_batch, tokenizer, data: AnalysisData, iou_threshold: float) -> _Example:
    examples, batch, _ = first_batch
    grounded = batch["phrase_token_index"] >= 0  # (B, P)
    index = int(grounded.any(-1).long().argmax())
    tokens = batch["phrase_token_index"][index][grounded[index]].unique()
    regions = batch["visual_attention_mask"][index].nonzero().flatten()
    ids = batch["labels"][index] if data.text_mask_key == "decoder_attention_mask" else batch["input_ids"][index]
    words = [f"{word} ({token})" for word, token in zip(tokenizer.convert_ids_to_tokens(ids[tokens].tolist()), tokens.tolist())]
    row = examples[index]
    boxes = batch["visual_boxes"][index][regions]
    labels = format_region_labels(boxes.numpy(), _region_classes(data, row))
    iou = batch["phrase_region_iou"][index][:, regions]  # (P, R)
    phrase_tokens = batch["phrase_token_index"][index]
    gold = [sorted({int(r) for p in (phrase_tokens == token).nonzero().flatten() for r in (iou[p] >= iou_threshold).nonzero().flatten()})
            for token in tokens]  # fmt: skip
    text = " / ".join(str(row[column]) for column in data.collator.text_columns)
    return _Example(row, index, tokens, words, regions, boxes, labels, gold, iou_threshold, text)


def _rows(blocks, example: _Example, layer: int, head: int) -> torch.Tensor:
    """(W, R) attention of the example's grounded words over its real regions, renormalised over those regions."""
    rows = blocks.word_to_region[layer][example.index, head][example.tokens][:, example.regions].double()
    return rows / rows.sum(-1, keepdim=True).clamp(min=1e-12)


def _plot_word_region_heatmaps(example: _Example, blocks, result, path: Path, name: str) -> None:
    """Word x region heatmaps of the first grounded example: the best head of the first, middle and last layers, on one
    colour scale, each word's gold regions outlined."""
    panels = []
    num_layers = len(blocks.word_to_region)
    for layer in sorted({0, num_layers // 2, num_layers - 1}):
        share = None if result.active_share is None else result.active_share[layer : layer + 1]
        _, head, among = best_active_head(
            result.accuracy[layer : layer + 1], share, result.active_threshold, result.best_among != BEST_AMONG_ALL
        )
        active = "" if share is None else f", active share {share[0, head]:.2f}"
        title = (
            f"layer {layer}, head {head}: best of its layer's {among}\n"
            f"(probe accuracy {result.accuracy[layer, head]:.3f}{active})"
        )
        panels.append((_rows(blocks, example, layer, head).numpy(), title))
    title = textwrap.fill(f"{name}: word -> region attention, image {example.row['image_id']}: \"{example.text}\"", 110)
    plot_word_region_heatmaps(
        panels, example.words, example.region_labels, path, gold_regions=example.gold_regions, title=title,
        gold_label=f"gold region: IoU >= {example.iou_threshold:g} with the phrase's gold box (what the probe counts as right)",
        regions_as_rows=True,
        axis_labels=("grounded word (token position)", "region: detector class, box (normalised x1,y1)-(x2,y2)"),
    )  # fmt: skip


def _plot_top_regions(example: _Example, blocks, result, data: AnalysisData, out_dir: Path, name: str) -> dict:
    """The image with each grounded word's top-3 boxes on the probe's best head and its phrase's gold box, when the
    image is at hand; returns {"png": file name} or {"skipped": why}."""
    image_id = example.row["image_id"]
    image = data.image_path(image_id)
    if image is None or not image.is_file():
        return {"skipped": f"no image: the data has no image folder, or {image} is missing."}
    with Image.open(image) as opened:
        width, height = opened.size
    scale = torch.tensor([width, height, width, height], dtype=torch.float64)
    captioner = data.text_mask_key == "decoder_attention_mask"
    phrases = gold_phrases(example.row, data, captioner)
    gold = [[box for phrase in phrases if max(phrase.tokens) == token for box in phrase.boxes] for token in example.tokens.tolist()]
    gold = [(torch.tensor(boxes, dtype=torch.float64) * scale).numpy() if boxes else None for boxes in gold]
    layer, head = result.best_layer, result.best_head
    words = [f"'{word}': layer {layer}, head {head}" for word in example.words]
    title = textwrap.fill(
        f"{name}: top-3 attended boxes of each grounded word on the probe's best head of {result.best_among} (accuracy "
        f"{result.best_head_accuracy:.3f}); gold box dashed red; image {image_id}: \"{example.text}\"", 110
    )  # fmt: skip
    path = out_dir / "top_regions_on_image.png"
    plot_top_regions_on_image(
        image, (example.boxes.double() * scale).numpy(), words, _rows(blocks, example, layer, head).numpy(), path,
        top_k=3, title=title, gold_boxes=gold, region_labels=example.region_labels,
    )  # fmt: skip
    return {"png": path.name, "image": str(image), "layer": int(layer), "head": int(head)}


__all__ = [
    "AnalysisData",
    "analyze_model",
    "flickr30k_entities_analysis_data",
    "synthetic_analysis_data",
    "user_analysis_data",
    "vgp_analysis_data",
]
