"""Pre-training collators: two-stream (LXMERT; Kervadec et al.) and single-stream (VisualBERT, VL-BERT)."""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import datasets
import torch

from ...alignment.soft_targets import SoftAlignmentTargets
from .base import RegionTextCollator
from .masking import mask_regions, mask_words, word_masker
from .rows import _checked_answer, answer_labels, kind_of


@dataclass
class TwoStreamPretrainingCollator(RegionTextCollator):
    """Two-stream pre-training batches (LXMERT; Kervadec et al. 2020, sec. 4): one text per row with its image, then

    - image-sentence matching: with probability `mismatch_probability` the image is another of the store
      (`matched_labels` 0; a mismatched row keeps no alignment and no answer);
    - masked words: BERT's masking (transformers' `DataCollatorForLanguageModeling`), targets in `labels`;
    - masked objects (`object_mask_probability`; LXMERT's 80 % zeroed, 10 % replaced, 10 % kept): `object_labels` /
      `attribute_labels` (-100 elsewhere or where the store has none), `feature_labels`, `masked_regions`;
    - answers, when `num_answers` > 0: `answer_labels` (B,) from `label` (-100 when absent or mismatched) or (B, A)
      soft scores from VQA's `labels` / `scores`; with `sample_answers`, an id drawn from `answer_ids` in proportion
      to `answer_scores` at each collation, as LXMERT does;
    - `word_region_alignment`: the soft targets A* of eqs. 15-18 with `soft_targets` (the store must have detector
      class ids), else the IoU targets.

    Set the three probabilities to 0 for evaluation batches.
    """

    text_columns: tuple[str, ...] = ("question",)
    mlm_probability: float = 0.15
    object_mask_probability: float = 0.15
    mismatch_probability: float = 0.5
    num_answers: int = 0
    soft_targets: SoftAlignmentTargets | None = None
    sample_answers: bool = False

    def __post_init__(self):
        super().__post_init__()
        for name in ("mlm_probability", "object_mask_probability", "mismatch_probability"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"`{name}` must be a probability in [0, 1], got {value!r}.")
        if not isinstance(self.num_answers, int) or self.num_answers < 0:
            raise ValueError(f"`num_answers` must be the answer vocabulary size (0 for no answers), got {self.num_answers!r}.")
        if self.mismatch_probability > 0 and len(self.region_features) < 2:
            raise ValueError("`mismatch_probability` > 0 needs a region-feature store of at least two images.")
        self._masker = word_masker(self.tokenizer, self.mlm_probability)
        self._image_ids = self.region_features.image_ids  # the candidates of a mismatched image, listed once

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        self.check_rows(examples)
        mismatched = (torch.rand(len(examples)) < self.mismatch_probability).tolist()
        return self.collate([self._with_image(example, swap) for example, swap in zip(examples, mismatched)])

    def _with_image(self, example: dict, swap: bool) -> dict:
        """The row itself (matched), or the row with another image and none of its grounding (mismatched)."""
        if not swap:
            return {**example, "_matched": True}
        other = self._image_ids[int(torch.randint(len(self._image_ids) - 1, ()))]
        other = other if other != example["image_id"] else self._image_ids[-1]
        ungrounded = {key: [] for key in example if key.endswith(("_phrase_spans", "_phrase_boxes", "_phrase_regions"))}
        return {**example, **ungrounded, "image_id": other, "_matched": False}

    def task_tensors(self, examples, encoding, batch):
        matched = torch.tensor([example["_matched"] for example in examples])
        tensors = self.grounding_tensors(examples, encoding, batch)
        tensors["matched_labels"] = matched.long()
        tensors.update(mask_words(self._masker, batch["input_ids"], self.mlm_probability))
        tensors.update(mask_regions(batch, self.object_mask_probability))  # LXMERT's 80 % zeroed, 10 % replaced
        if self.num_answers:
            tensors["answer_labels"] = self._answer_labels(examples, matched)
        return tensors

    def phrase_target(self, i, phrase, gold, regions, batch, gold_iou):
        if self.soft_targets is None or not len(gold):
            return super().phrase_target(i, phrase, gold, regions, batch, gold_iou)
        region_mask = batch["visual_attention_mask"][i].bool()
        object_ids = batch["region_object_ids"][i][region_mask]
        if bool((object_ids < 0).any()):
            raise ValueError(
                f"soft alignment targets need the detector's class ids, but the region-feature store "
                f"{self.region_features.directory} has none for the image of batch row {i}."
            )
        attr_ids = batch["region_attr_ids"][i][region_mask]
        target = torch.zeros(len(region_mask))
        target[region_mask] = self.soft_targets(
            phrase,
            gold,
            batch["region_boxes_pixels"][i][region_mask],
            object_ids,
            attr_ids if self.soft_targets.attribute_vectors is not None and bool((attr_ids >= 0).all()) else None,
        )
        return target if float(target.sum()) > 0 else None

    def _answer_labels(self, examples: list[dict], matched: torch.Tensor) -> torch.Tensor:
        if "scores" not in examples[0] and "label" not in examples[0]:
            raise ValueError(f"rows must have a `label` (or VQA `labels`/`scores`) column when `num_answers` > 0; got {sorted(examples[0])}.")
        sample = self._sampled_answer if self.sample_answers and "answer_ids" in examples[0] else None
        return answer_labels(examples, self.num_answers, type(self).__name__, matched.tolist(), sample)

    def _sampled_answer(self, index: int, example: dict) -> int:
        """One of the row's `answer_ids`, drawn in proportion to its `answer_scores` (LXMERT's
        `np.random.multinomial(1, scores / sum)`); -100 for a row without answers (a caption)."""
        ids, scores = list(example["answer_ids"]), list(example["answer_scores"])
        if len(ids) != len(scores) or any(not 0 <= score for score in scores):
            raise ValueError(
                f"batch row {index}: `answer_ids` and `answer_scores` must be lists of the same length with scores "
                f">= 0, got {ids!r} and {scores!r}."
            )
        if not ids or sum(scores) <= 0:
            return -100
        choice = int(torch.multinomial(torch.tensor(scores, dtype=torch.float64), 1)) if len(ids) > 1 else 0
        return _checked_answer(ids[choice], self.num_answers)


def group_captions_by_image(
    rows: datasets.Dataset | Sequence[Mapping], text_column: str = "sentence"
) -> dict[str, list[str]]:
    """{image id: its captions, in row order} from caption rows (a dataset or a list of rows with `image_id` and
    `text_column`): the pool from which `SingleStreamPretrainingCollator` draws second captions."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, (datasets.Dataset, Sequence)):
        raise ValueError(f"`rows` must be a datasets.Dataset or a list of rows, got {kind_of(rows)}.")
    if isinstance(rows, datasets.Dataset):
        missing = [name for name in ("image_id", text_column) if name not in rows.column_names]
        if missing:
            raise ValueError(f"caption rows must have the columns {missing}; got {rows.column_names}.")
        rows = ({"image_id": image_id, text_column: text} for image_id, text in zip(rows["image_id"], rows[text_column]))
    grouped: dict[str, list[str]] = {}
    for index, row in enumerate(rows):
        if "image_id" not in row or text_column not in row:
            raise ValueError(
                f"caption row {index} must have the columns `image_id` and `{text_column}`; got {sorted(row)}."
            )
        grouped.setdefault(str(row["image_id"]), []).append(row[text_column])
    return grouped


@dataclass
class SingleStreamPretrainingCollator(RegionTextCollator):
    """VisualBERT's pre-training batches (Li et al. 2019, sec. 3.3) for `SingleStreamForPreTraining`, from caption
    rows (with `image_id` and `text_column`):

    - sentence-image prediction (`paired=True`): `[CLS] c1 [SEP] c2 [SEP]`, c2 with probability
      `random_caption_probability` a caption of another image (`sentence_image_labels` 1), else another caption of
      the row's image (0, transformers' VisualBERT convention), drawn from `captions_by_image` ({image id: captions}
      or the caption dataset); `paired=False`: the row's text alone, masked words only;
    - masked words (BERT's, through `DataCollatorForLanguageModeling`; `labels`, -100 elsewhere); a batch in which no
      word was drawn gets one, so every batch has a masked-word loss;
    - masked regions with `region_mask_probability` > 0 (VL-BERT's masked RoI modelling): features zeroed,
      `masked_regions`, `feature_labels` and, with `return_object_labels`, `object_labels`;
    - c1's grounded phrases give `word_region_alignment` and `phrase_masks`.

    Draws come from torch's RNG; with `seed`, each batch's RNG is seeded from `seed` and its rows, so an evaluation
    batch is masked and paired the same way every time.
    """

    # derived from `text_column` and `paired`: the row's text, then the drawn second caption
    text_columns: tuple[str, ...] = field(default=("sentence",), init=False)
    text_column: str = "sentence"
    captions_by_image: Mapping[str, Sequence[str]] | datasets.Dataset | None = None
    paired: bool = True
    random_caption_probability: float = 0.5
    mlm_probability: float = 0.15
    region_mask_probability: float = 0.0
    return_object_labels: bool = True
    seed: int | None = None

    second_text_column: ClassVar[str] = "_second_caption"

    @property
    def dataset_text_columns(self) -> tuple[str, ...]:
        """The row's caption (the second caption is drawn at collation, so `drop_overlong_rows` counts the first
        alone; the pairs' truncation is counted in `truncation_stats`)."""
        return (self.text_column,)

    def __post_init__(self):
        if not isinstance(self.text_column, str) or not self.text_column:
            raise ValueError(
                f"`text_column` must name the rows' caption column (e.g. 'sentence'), got {self.text_column!r}."
            )
        self.text_columns = (self.text_column, self.second_text_column) if self.paired else (self.text_column,)
        super().__post_init__()
        for name in ("random_caption_probability", "mlm_probability", "region_mask_probability"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
                raise ValueError(f"`{name}` must be a probability in [0, 1], got {value!r}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"`seed` must be an int (or None to use torch's current RNG), got {self.seed!r}.")
        self._masker = word_masker(self.tokenizer, self.mlm_probability)
        self._captions = self._caption_pool() if self.paired else {}
        self._pool_ids = list(self._captions)
        self._pool_index = {image_id: index for index, image_id in enumerate(self._pool_ids)}

    def _caption_pool(self) -> dict[str, list[str]]:
        pool = self.captions_by_image
        if pool is None:
            raise ValueError(
                "`captions_by_image` is required with `paired=True` (the second captions are drawn from it): pass "
                "{image id: captions} or the caption dataset; or `paired=False` for masked words alone."
            )
        if isinstance(pool, datasets.Dataset):
            pool = group_captions_by_image(pool, self.text_column)
        if not isinstance(pool, Mapping):
            raise ValueError(
                f"`captions_by_image` must be a mapping {{image id: captions}} or a dataset, got {type(pool).__name__}."
            )
        grouped = {}
        for image_id, captions in pool.items():
            if isinstance(captions, str) or not all(isinstance(caption, str) for caption in captions):
                raise ValueError(
                    f"`captions_by_image[{image_id!r}]` must be a list of caption strings, got {captions!r}."
                )
            grouped[str(image_id)] = list(captions)
        if self.random_caption_probability > 0 and len(grouped) < 2:
            raise ValueError(
                f"`captions_by_image` must hold at least two images to draw random captions "
                f"(`random_caption_probability`={self.random_caption_probability}), got {len(grouped)}."
            )
        if self.random_caption_probability < 1:
            single = [image_id for image_id, captions in grouped.items() if len(set(captions)) < 2]
            if single:
                raise ValueError(
                    f"every image of `captions_by_image` must have at least two different captions (a same-image pair "
                    f"needs another caption), but {len(single)} of {len(grouped)} have fewer, e.g. {single[:3]}; leave "
                    "those images out, or set `random_caption_probability`=1."
                )
        return grouped

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if self.seed is None:
            return self._collate(examples)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._batch_seed(examples))
            return self._collate(examples)

    def _collate(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if self.paired:
            examples = [self._with_second_caption(index, example) for index, example in enumerate(examples)]
        return super().__call__(examples)

    def _batch_seed(self, examples: list[dict]) -> int:
        """A seed from `seed` and the batch's rows, the same in every process (unlike Python's salted `hash`)."""
        key = "\x1f".join([str(self.seed), *(f"{e.get('image_id')}\x1e{e.get(self.text_column)}" for e in examples)])
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") % 2**63

    def _with_second_caption(self, index: int, example: dict) -> dict:
        """The row with a second caption (`second_text_column`) and whether it is a random one (`_random_caption`)."""
        missing = [name for name in ("image_id", self.text_column) if name not in example]
        if missing:
            raise ValueError(f"batch row {index} must have the columns {missing}; got {sorted(example)}.")
        image_id, caption = str(example["image_id"]), example[self.text_column]
        own = self._pool_index.get(image_id)
        if own is None:
            raise ValueError(
                f"the image {image_id!r} of batch row {index} is not in `captions_by_image` ({len(self._pool_ids)} "
                "images); build it from the same caption rows (e.g. `group_captions_by_image(dataset)`)."
            )
        random_caption = bool(torch.rand(()) < self.random_caption_probability)
        if random_caption:
            other = int(torch.randint(len(self._pool_ids) - 1, ()))
            candidates = self._captions[self._pool_ids[other + (other >= own)]]
        else:  # `_caption_pool` made sure every image has two different captions
            candidates = [other for other in self._captions[image_id] if other != caption]
        second = candidates[int(torch.randint(len(candidates), ()))]
        return {**example, self.second_text_column: second, "_random_caption": random_caption}

    def task_tensors(self, examples, encoding, batch):
        tensors = self.grounding_tensors(examples, encoding, batch)
        if self.paired:
            tensors["sentence_image_labels"] = torch.tensor([int(example["_random_caption"]) for example in examples])
        tensors.update(self._masked_words(batch["input_ids"], batch["attention_mask"]))
        if self.region_mask_probability > 0:
            regions = mask_regions(batch, self.region_mask_probability, zero_fraction=1.0, replace_fraction=0.0)
            regions.pop("attribute_labels")
            if not self.return_object_labels:
                regions.pop("object_labels")
            tensors.update(regions)
        return tensors

    def _masked_words(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        words = mask_words(self._masker, input_ids, self.mlm_probability)
        if self.mlm_probability == 0 or bool((words["labels"] != -100).any()):
            return words
        special = torch.tensor(self.tokenizer.all_special_ids)
        maskable = (attention_mask.bool() & ~torch.isin(input_ids, special)).nonzero()
        if len(maskable):  # none drawn: mask one word, so that the batch has a masked-word loss
            row, position = maskable[int(torch.randint(len(maskable), ()))].tolist()
            words["labels"][row, position] = input_ids[row, position]
            words["input_ids"][row, position] = self.tokenizer.mask_token_id
        return words
