"""Does a trained model read the image? Its task loss and accuracy with each example's own image, with another image's
regions (`shuffled_rows`: each distinct image, or NLVR2 pair, replaced by the next in a seeded cycle, the columns
joined to its own regions dropped) and with its own image's region appearance (`REGION_APPEARANCE_KEYS`) moved one
step along a seeded cycle of its valid regions ([`RegionShuffleCollator`]: boxes and gold targets stay, the control
for region-selection tasks), and the gaps, signed so that > 0 means the image helps (a model answering from the text
alone: about 0). With `perturb_boxes`, the geometry check too: each image's boxes moved along the same kind of cycle
of its valid regions, and every box replaced by the whole image (no box says anything: the "zeroed" geometry), the
features kept (`BOX_KEYS`). The loss is the sum of the model's task losses (attention supervision left out), each
averaged over all its items.
"""

from __future__ import annotations

import inspect
import logging
import math
import random
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from ..metrics.grounding import region_hits
from ..utils.validation import check_callable, check_module, check_rows
from .inference import _to, inference_batches, model_device

# the image columns of a row: NLVR2's pair, else the single image (and the store row each was joined to)
PAIR_IMAGE_COLUMNS = ("left_image_id", "right_image_id")
ROW_COLUMNS = {"image_id": "feature_row", "left_image_id": "left_feature_row", "right_image_id": "right_feature_row"}
# the picture itself, in rows of pixel models (hf_vlalign.vlms): moves with a single image's `image_id`
PICTURE_COLUMNS = ("image_path", "image")
# the passes by the prefix of their results, as their progress bars, warnings and log lines name them
PASS_NAMES = {
    "own_image": "own images",
    "shuffled_image": "shuffled images",
    "shuffled_regions": "shuffled regions",
    "boxes_shuffled": "shuffled boxes",
    "boxes_zeroed": "zeroed boxes",
}
# batch entries the model does not read for its task losses (attention supervision, the probe's targets)
LEFT_OUT_INPUTS = ("word_region_alignment",)

ScoreFunction = Callable[[Any, Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]

logger = logging.getLogger(__name__)


# Shuffling


def image_columns(column_names: Sequence[str]) -> tuple[str, ...]:
    """The columns naming a row's image(s): NLVR2's `left_image_id` / `right_image_id`, else `image_id`."""
    if all(column in column_names for column in PAIR_IMAGE_COLUMNS):
        return PAIR_IMAGE_COLUMNS
    if "image_id" in column_names:
        return ("image_id",)
    raise ValueError(
        f"`dataset` rows must name their image in `image_id` (or an NLVR2 pair in {PAIR_IMAGE_COLUMNS}), got the "
        f"columns {sorted(column_names)}."
    )


def image_derangement(image_keys: Sequence, seed: int = 0) -> dict:
    """Maps each distinct key of `image_keys` to another one: the keys in a seeded random order, each replaced by the
    next (a single cycle, so no key maps to itself). Needs at least two distinct keys."""
    keys = sorted(set(image_keys), key=repr)
    if len(keys) < 2:
        raise ValueError(
            f"`dataset` must show at least 2 distinct images to shuffle them, got {len(keys)}; evaluate on more rows."
        )
    random.Random(seed).shuffle(keys)
    return dict(zip(keys, keys[1:] + keys[:1]))


def _image_key(row: Mapping, columns: tuple[str, ...]) -> tuple:
    return tuple(str(row[column]) for column in columns)


def shuffled_rows(rows: Sequence[Mapping], seed: int = 0) -> list[dict]:
    """`rows` with every row's image replaced by another image of `rows` (see the module docstring)."""
    columns = image_columns(list(rows[0]))
    keys = [_image_key(row, columns) for row in rows]
    mapping = image_derangement(keys, seed)
    donors = {}  # each image's first row: where its image columns are copied from
    for key, row in zip(keys, rows):
        donors.setdefault(key, row)
    shuffled = []
    for key, row in zip(keys, rows):
        donor = donors[mapping[key]]
        new = {name: value for name, value in row.items() if not name.endswith("_phrase_regions")}
        # an NLVR2 row's `image_id` (the library-wide join column, = its left image) moves with the pair
        for column in columns + (("image_id",) if columns == PAIR_IMAGE_COLUMNS and "image_id" in row else ()):
            new[column] = donor[column]
            if ROW_COLUMNS[column] in row:
                new[ROW_COLUMNS[column]] = donor.get(ROW_COLUMNS[column])
        if columns == ("image_id",):
            new.update({column: donor[column] for column in PICTURE_COLUMNS if column in row})
        shuffled.append(new)
    return shuffled


# per-region tensors that describe a region's appearance: they move with its features (see the module docstring);
# everything else (boxes, masks, gold targets) stays where it is
REGION_APPEARANCE_KEYS = (
    "visual_feats",  # the features the model reads
    "feature_labels",  # pre-training: the unmasked features, the masked regions' regression target
    "masked_regions",  # pre-training: the slots whose features were masked in `visual_feats`
    "object_labels",  # pre-training: the detector's class of each masked region
    "attribute_labels",  # pre-training: the detector's attribute of each masked region
    "region_confidence",  # probe targets: the detector's confidence in each region
    "region_object_ids",  # the detector's class and attribute of each region (collators drop them, custom ones may not)
    "region_attr_ids",
)
# per-region tensors that describe a region's place: what the geometry check moves or zeroes, the features kept
BOX_KEYS = ("visual_boxes",)
WHOLE_IMAGE_BOX = (0.0, 0.0, 1.0, 1.0)  # x1, y1, x2, y2 normalised
# keeps the permutation's random stream apart from the collator's (seeded from (seed, batch index) too)
REGION_SHUFFLE_STREAM = 1


def region_derangement(visual_attention_mask: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """The index (same shape as the (..., R) `visual_attention_mask`) of the region whose features each region takes:
    each image's valid regions in a random order, each taking the features of the next (one cycle, so none keeps its
    own when the image has >= 2 valid regions). Padded regions, and images with fewer than 2 valid regions, keep
    their own. Computed on the host, all images of the batch at once."""
    shape = visual_attention_mask.shape
    valid = visual_attention_mask.detach().cpu().reshape(-1, shape[-1]).bool()
    images, num_regions = valid.shape
    keys = torch.rand(images, num_regions, generator=generator).masked_fill(~valid, 2.0)  # padding sorts last
    order = keys.argsort(dim=1)  # each image's valid regions first, in random order
    counts = valid.sum(dim=1, keepdim=True)
    slots = torch.arange(num_regions).expand(images, num_regions)
    following = torch.where(slots < counts, (slots + 1) % counts.clamp(min=1), slots)  # padding slots: themselves
    index = torch.empty_like(order).scatter_(1, order, order.gather(1, following))
    return index.reshape(shape)


def _take_regions(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`tensor` (..., R, *) with region r of each image replaced by region `index[..., r]` of the same image."""
    region_axis = index.dim() - 1
    index = index.to(tensor.device).reshape(*index.shape, *[1] * (tensor.dim() - index.dim())).expand_as(tensor)
    return tensor.gather(region_axis, index)


def shuffled_region_batch(
    batch: Mapping[str, Any], generator: torch.Generator | None = None, keys: Sequence[str] = REGION_APPEARANCE_KEYS
) -> tuple[dict[str, Any], int]:
    """A collated batch with the `keys` of each image's valid regions (default: their appearance,
    `REGION_APPEARANCE_KEYS`; `BOX_KEYS` for the geometry check) permuted by [`region_derangement`], the other
    per-region tensors kept; and the number of rows with an image left as it was (fewer than 2 valid regions; for
    NLVR2, a row counts when either image of its pair is)."""
    mask = batch["visual_attention_mask"]
    index = region_derangement(mask, generator)
    shuffled = dict(batch)
    for key in keys:
        if key in batch:
            shuffled[key] = _take_regions(batch[key], index)
    valid_per_image = mask.detach().cpu().bool().reshape(mask.shape[0], -1, mask.shape[-1]).sum(-1)
    return shuffled, int((valid_per_image < 2).any(dim=1).sum())


class RegionShuffleCollator:
    """`collator`'s batches with each image's region features (or other `keys`, e.g. `BOX_KEYS`) shuffled among its
    own valid regions ([`shuffled_region_batch`]). Its i-th call (batch i of a pass) is shuffled with a
    `torch.Generator` seeded from (`seed`, i), so make one per pass; `rows_unshuffled` counts the rows left as they
    were so far."""

    def __init__(
        self,
        collator: Callable[[list[dict]], dict[str, torch.Tensor]],
        seed: int = 0,
        keys: Sequence[str] = REGION_APPEARANCE_KEYS,
    ) -> None:
        self.collator = collator
        self.seed = seed
        self.keys = tuple(keys)
        self.batches = 0
        self.rows_unshuffled = 0

    def __call__(self, examples: list[dict]) -> dict[str, Any]:
        batch = self.collator(examples)
        # a tuple of ints hashes the same in every process (no PYTHONHASHSEED salt)
        generator = torch.Generator().manual_seed(hash((self.seed, self.batches, REGION_SHUFFLE_STREAM)) % 2**63)
        self.batches += 1
        shuffled, unshuffled = shuffled_region_batch(batch, generator, self.keys)
        self.rows_unshuffled += unshuffled
        return shuffled


class BlankBoxesCollator:
    """`collator`'s batches with every box (`BOX_KEYS`) replaced by the whole image, (0, 0, 1, 1), the features kept:
    the geometry check's strongest perturbation, where no box says anything ("zeroed" geometry; all-zero boxes would
    have no width, which the captioner's relative geometry divides by)."""

    def __init__(self, collator: Callable[[list[dict]], dict[str, torch.Tensor]]) -> None:
        self.collator = collator

    def __call__(self, examples: list[dict]) -> dict[str, Any]:
        batch = dict(self.collator(examples))
        for key in BOX_KEYS:
            if key in batch:
                batch[key] = batch[key].new_tensor(WHOLE_IMAGE_BOX).expand_as(batch[key]).clone()
        return batch


# Scores


def task_scores(outputs: Any, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-item scores in [0, 1] of a task head's outputs, keyed by metric name: `accuracy` (one value per row for
    answers, NLVR2 and referring expressions; per grounded phrase for phrase grounding), or VGP's `id_accuracy` and
    `vgp_accuracy`. Empty for outputs without a classification (e.g. the captioner: loss only)."""
    scores = {}
    for name, logits_name, labels_name in (
        ("id_accuracy", "id_logits", "id_labels"),
        ("vgp_accuracy", "vgp_logits", "vgp_labels"),
    ):
        logits, labels = getattr(outputs, logits_name, None), batch.get(labels_name)
        if logits is not None and labels is not None:
            keep = labels != -100
            scores[name] = (logits.argmax(-1) == labels)[keep].float()
    if scores:
        return scores
    logits, labels = getattr(outputs, "logits", None), batch.get("labels")
    if logits is None:
        return {}
    if "target_region_iou" in batch:  # referring expressions: the chosen region overlaps the referred box
        return {"accuracy": region_hits(logits, batch["target_region_iou"]).float()}
    if "phrase_labels" in batch and logits.dim() == 3:  # phrase grounding: each phrase's best region is a target
        targets = batch["phrase_labels"]
        # every phrase the collator kept, as recall@1 counts them: one whose gold box overlaps no region (no target,
        # e.g. with another image's regions) is a miss, so every pass scores the same phrases
        phrases = batch["phrase_masks"].any(-1) if "phrase_masks" in batch else targets.sum(-1) > 0
        best = logits.argmax(-1, keepdim=True)
        return {"accuracy": (targets.gather(2, best).squeeze(2) > 0)[phrases].float()}
    if labels is None:
        return {}
    if labels.is_floating_point() and labels.dim() == 2 and logits.dim() == 2:  # VQA's soft scores
        return {"accuracy": labels.gather(1, logits.argmax(-1, keepdim=True)).squeeze(1).float()}
    if logits.dim() == 1 or (logits.dim() == 2 and logits.shape[-1] == 1 and labels.dim() == 1):  # NLVR2's score
        return {"accuracy": ((logits.reshape(-1) > 0).long() == labels.reshape(-1).long()).float()}
    if logits.dim() == 2 and labels.dim() == 1 and not labels.is_floating_point():  # one answer id (GQA)
        keep = labels != -100
        return {"accuracy": (logits.argmax(-1) == labels)[keep].float()}
    return {}


# The gap


class _Totals:
    """Sums of each loss component (weighted by its item count) and of each metric's per-item scores."""

    def __init__(self) -> None:
        self.loss = defaultdict(lambda: [0.0, 0])
        self.scores = defaultdict(lambda: [0.0, 0])
        self.unmatched_phrases: int | None = None  # phrases whose gold box overlapped no region (library collators)

    def add_loss(self, name: str, mean: float, count: int) -> None:
        if count > 0:
            if not math.isfinite(mean):
                raise ValueError(f"the model's `{name}` is {mean} on an evaluation batch; cannot measure image use.")
            self.loss[name][0] += mean * count
            self.loss[name][1] += count

    def add_scores(self, name: str, values: torch.Tensor) -> None:
        self.scores[name][0] += float(values.sum())
        self.scores[name][1] += int(values.numel())

    def mean_loss(self) -> float | None:
        if not self.loss:
            return None
        return sum(total / count for total, count in self.loss.values())

    def mean_scores(self) -> dict[str, float]:
        return {name: total / count for name, (total, count) in self.scores.items() if count}

    def item_counts(self) -> dict[str, int]:
        return {name: count for name, (_, count) in self.scores.items() if count}


def _group_name(value: object) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", str(value)).strip("_") or "none"


@torch.no_grad()
def _evaluate(
    model,
    rows: list[dict],
    collator,
    batch_size: int,
    score_fn: ScoreFunction,
    groups: list | None,
    seed: int,
    desc: str,
    progress: bool,
    other_images: bool = False,
) -> tuple[_Totals, dict[str, _Totals]]:
    """The totals of one pass named `desc`; a library collator's warnings name the pass, and with `other_images` it
    counts (not warns about) the gold boxes that overlap no region of the image put in their place."""
    device = model_device(model)
    totals, by_group = _Totals(), defaultdict(_Totals)
    # whether the forward takes `return_dict` (named, or through transformers' `**kwargs`)
    parameters = inspect.signature(model.forward).parameters.values()
    return_dict = any(p.name == "return_dict" or p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)
    # seeded by batch: a random collator (pre-training masks) masks the same positions in both passes
    batches = inference_batches(
        model, rows, collator, batch_size, exclude=LEFT_OUT_INPUTS, forward_arguments_only=True, seed=seed,
        description=desc, progress=progress,
    )  # fmt: skip
    inner = collator.collator if isinstance(collator, (RegionShuffleCollator, BlankBoxesCollator)) else collator
    named_pass = getattr(inner, "evaluation_pass", None)
    unmatched_before = getattr(inner, "unmatched_phrases", None)
    with named_pass(f"image-use check, {desc}", other_images=other_images) if named_pass else nullcontext():
        _evaluate_batches(model, rows, batches, batch_size, score_fn, groups, return_dict, device, totals, by_group)
    if unmatched_before is not None:
        totals.unmatched_phrases = inner.unmatched_phrases - unmatched_before
    if not totals.loss and not totals.scores:
        raise ValueError(
            f"{type(model).__name__} returned no task loss and `score_fn` no score on these batches: do the rows carry "
            "labels for the collator?"
        )
    return totals, by_group


def _evaluate_batches(
    model, rows, batches, batch_size, score_fn, groups, return_dict, device, totals: _Totals, by_group
) -> None:
    for one in batches:
        start, batch, inputs = one.index * batch_size, one.batch, one.inputs
        outputs = model(**inputs, return_dict=True) if return_dict else model(**inputs)
        counts = model.loss_item_counts(inputs) if hasattr(model, "loss_item_counts") else {"": len(one.rows)}
        for key, count in counts.items():
            loss = getattr(outputs, f"loss_{key}" if key else "loss", None)
            if loss is not None:
                totals.add_loss(key or "loss", float(loss), int(count))
        scores = score_fn(outputs, {key: _to(value, device) for key, value in batch.items()})
        for name, values in scores.items():
            values = values.detach().float().cpu().reshape(-1)
            totals.add_scores(name, values)
            if groups is not None:
                size = len(rows[start : start + batch_size])
                if values.numel() != size:
                    raise ValueError(
                        f"`group_column` needs one `{name}` score per row, but the task scores {values.numel()} items "
                        f"for {size} rows (e.g. phrases); leave `group_column` None for this task."
                    )
                for value, group in zip(values, groups[start : start + size]):
                    by_group[group].add_scores(name, value.reshape(1))


def _compared(
    own: _Totals,
    other: _Totals,
    own_groups: dict[str, _Totals],
    other_groups: dict[str, _Totals],
    shuffled: str,
    gap: str,
    with_own: bool,
) -> dict[str, float | str]:
    """The shuffled pass's loss and scores (`<shuffled>_<metric>`) against the own pass's, and their gaps
    (`<gap>_<metric>_gap`; `<gap>_gap` the first metric's, else the loss's), per group too; the items each pass
    scored (`<shuffled>_<metric>_items`) and the phrases whose gold box overlapped no region
    (`<shuffled>_unmatched_phrases`, library collators); `own_image_*` with `with_own`."""
    results: dict[str, float | str] = {}
    own_loss, other_loss = own.mean_loss(), other.mean_loss()
    if own_loss is not None and other_loss is not None:
        results.update({"own_image_loss": own_loss} if with_own else {})
        results.update({f"{shuffled}_loss": other_loss, f"{gap}_loss_gap": other_loss - own_loss})
    passes = [("", own, other)] + [(f"_{group}", own_groups[group], other_groups[group]) for group in sorted(own_groups)]
    for suffix, own_totals, other_totals in passes:
        other_scores = other_totals.mean_scores()
        for name, value in own_totals.mean_scores().items():
            results.update({f"own_image_{name}{suffix}": value} if with_own else {})
            results[f"{shuffled}_{name}{suffix}"] = other_scores[name]
            results[f"{gap}_{name}_gap{suffix}"] = value - other_scores[name]
    for prefix, totals in ((("own_image", own),) if with_own else ()) + ((shuffled, other),):
        results.update({f"{prefix}_{name}_items": count for name, count in totals.item_counts().items()})
        if totals.unmatched_phrases is not None:
            results[f"{prefix}_unmatched_phrases"] = totals.unmatched_phrases
    if other.item_counts() != own.item_counts():  # a custom `score_fn` may score items that depend on the image
        logger.warning(
            "image-use check, %s pass: scored %s items where the own images pass scored %s; its scores are over other "
            "items.", PASS_NAMES[shuffled], other.item_counts(), own.item_counts(),
        )  # fmt: skip
    primary = next(iter(own.mean_scores()), None)
    if primary is not None:
        results[f"{gap}_gap"] = results[f"{gap}_{primary}_gap"]
    elif f"{gap}_loss_gap" in results:
        results[f"{gap}_gap"] = results[f"{gap}_loss_gap"]
    return results


def image_use_gap(
    model: torch.nn.Module,
    dataset,
    collator: Callable[[list[dict]], dict[str, torch.Tensor]],
    batch_size: int = 64,
    *,
    seed: int = 0,
    group_column: str | None = None,
    score_fn: ScoreFunction | None = None,
    max_examples: int | None = None,
    shuffle_regions: bool = True,
    perturb_boxes: bool = False,
    progress: bool = True,
) -> dict[str, float | int | str]:
    """How much `model` reads the image on `dataset` (see the module docstring): its task loss and accuracy with each
    row's own image, with another image's regions and with its own regions' features shuffled, and the gaps.

    Args:
        model: any hf_vlalign task model (or captioner); run in eval mode without gradients, its mode put back.
        dataset: rows with labels, as `collator` (the task's collator) reads them, showing at least two images.
        batch_size: rows per forward pass (the same batches in every pass).
        seed: seed of the derangement of the images, and of the region permutation of each batch.
        group_column: a column (e.g. VQA's `answer_type`) whose values get their own scores (one score per row).
        score_fn: `(outputs, batch) -> {metric: per-item scores}` replacing [`task_scores`].
        max_examples: evaluate the first N rows only (None: all).
        shuffle_regions: also run the shuffled-regions pass ([`RegionShuffleCollator`]).
        perturb_boxes: also run the geometry check's passes: boxes shuffled among each image's valid regions, and
            every box the whole image ([`BlankBoxesCollator`]), the features kept (for models that read boxes, e.g.
            the geometry-aware captioner).

    Returns a flat dict for `eval_results.json`: `own_image_loss`, `shuffled_image_loss`, `image_use_loss_gap`
    (shuffled - own) and, for each metric and group, `own_image_<metric>[_<group>]`, `shuffled_image_<metric>[_<group>]`,
    `image_use_<metric>_gap[_<group>]` (own - shuffled); `image_use_gap` (the first metric's gap, else the loss gap,
    named by `image_use_gap_metric`), `image_use_examples`, `image_use_images`, `image_use_seed`; the items each pass
    scored, `own_image_<metric>_items` and `shuffled_image_<metric>_items` (the same: a phrase whose gold box overlaps
    no region of the image put in its place scores a miss), and with the library's collators `own_image_unmatched_phrases`
    and `shuffled_image_unmatched_phrases` (their warnings name the pass; the shuffled pass's count is no warning). With
    `shuffle_regions`, the same with `shuffled_regions_*` and `region_shuffle_*`, and `region_shuffle_rows_unshuffled`
    (rows with an image of fewer than 2 valid regions, left as they were). With `perturb_boxes`, the same with
    `boxes_shuffled_*` / `box_shuffle_*` and `boxes_zeroed_*` / `box_zero_*` (e.g. `box_shuffle_loss_gap`: the loss
    with shuffled boxes minus the loss with the true ones).
    """
    check_module("model", model)
    check_rows("dataset", dataset)
    check_callable("collator", collator, "a collator (called with a list of rows, returning a batch dict)")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"`batch_size` must be an int >= 1, got {batch_size!r}.")
    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 2):
        raise ValueError(f"`max_examples` must be None or an int >= 2, got {max_examples!r}.")
    for name, value in (("shuffle_regions", shuffle_regions), ("perturb_boxes", perturb_boxes)):
        if not isinstance(value, bool):
            raise ValueError(f"`{name}` must be True or False, got {value!r}.")
    count = len(dataset) if max_examples is None else min(max_examples, len(dataset))
    rows = [dict(dataset[i]) for i in range(count)]
    if not rows:
        raise ValueError("`dataset` is empty; the image-use gap needs evaluation rows with labels.")
    if group_column is not None and group_column not in rows[0]:
        raise ValueError(f"`group_column` {group_column!r} is not a column of `dataset` (columns: {sorted(rows[0])}).")
    groups = [_group_name(row[group_column]) for row in rows] if group_column is not None else None
    shuffled = shuffled_rows(rows, seed)
    num_images = len({_image_key(row, image_columns(list(rows[0]))) for row in rows})
    score_fn = score_fn or task_scores
    region_collator = RegionShuffleCollator(collator, seed) if shuffle_regions else None
    # the geometry check's passes, by the prefixes of their results: (pass, gap name, collator)
    box_passes = (
        [
            ("boxes_shuffled", "box_shuffle", RegionShuffleCollator(collator, seed, keys=BOX_KEYS)),
            ("boxes_zeroed", "box_zero", BlankBoxesCollator(collator)),
        ]
        if perturb_boxes
        else []
    )
    box_results = []
    was_training = model.training
    model.eval()
    try:
        own, own_groups = _evaluate(model, rows, collator, batch_size, score_fn, groups, seed, PASS_NAMES["own_image"], progress)
        other, other_groups = _evaluate(
            model, shuffled, collator, batch_size, score_fn, groups, seed, PASS_NAMES["shuffled_image"], progress, other_images=True
        )
        if region_collator is not None:
            regions, region_groups = _evaluate(
                model, rows, region_collator, batch_size, score_fn, groups, seed, PASS_NAMES["shuffled_regions"], progress
            )
        for name, gap, box_collator in box_passes:
            passed = _evaluate(model, rows, box_collator, batch_size, score_fn, groups, seed, PASS_NAMES[name], progress)
            box_results.append((name, gap, *passed))
    finally:
        model.train(was_training)
    results: dict[str, float | int | str] = _compared(
        own, other, own_groups, other_groups, "shuffled_image", "image_use", with_own=True
    )
    if "image_use_gap" in results:
        results["image_use_gap_metric"] = next(iter(own.mean_scores()), "loss")
    results.update(image_use_examples=len(rows), image_use_images=num_images, image_use_seed=seed)
    if other.unmatched_phrases:
        logger.info(
            "image-use check, shuffled images pass: %d gold box(es) overlap no region of the image put in their place; "
            "those phrases (or expressions) score as misses, as a model reading that image must miss them.",
            other.unmatched_phrases,
        )
    if region_collator is not None:
        results.update(
            _compared(own, regions, own_groups, region_groups, "shuffled_regions", "region_shuffle", with_own=False)
        )
        results["region_shuffle_rows_unshuffled"] = region_collator.rows_unshuffled
    for name, gap, totals, totals_groups in box_results:
        results.update(_compared(own, totals, own_groups, totals_groups, name, gap, with_own=False))
    return results


__all__ = [
    "BOX_KEYS",
    "REGION_APPEARANCE_KEYS",
    "RegionShuffleCollator",
    "BlankBoxesCollator",
    "image_columns",
    "image_derangement",
    "image_use_gap",
    "region_derangement",
    "shuffled_region_batch",
    "shuffled_rows",
    "task_scores",
]
