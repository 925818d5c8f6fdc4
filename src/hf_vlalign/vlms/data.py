"""Grounded captions for transformers patch models: examples from Flickr30k Entities files and their collator.

An example is a dict: `image` (a PIL image, or `image_path`), `caption` and `phrases`, each with `char_start`,
`char_end` and `boxes` (pixel x1, y1, x2, y2). The collator builds each family's sequence itself (ViLT: `[CLS] caption
[SEP]`; LLaVA: `[BOS] <image> x P prompt caption [EOS]`; PaliGemma: `<image> x P [BOS] prompt \\n caption [EOS]`, the
caption its suffix), so that every caption token's position is known. A batch also carries the supervision targets of
its grounded tokens only, `grounded_token_positions` (B, G) long (their sequence positions) and `word_cell_alignment`
(B, G, C: each one's uniform distribution over the cells its gold boxes cover), G the batch's largest number of
grounded tokens, padded with position 0 and an all-zero row (so the size grows with the grid cells, not with sequence
x cells); `phrase_token_index` (B, K, -1 padding) and `phrase_cell_coverage` (B, K, C) for the probe; and the LLaVA /
PaliGemma `PatchLayout` tensors.

The multi-view families (Qwen-VL, LLaVA-NeXT / OneVision, Idefics3 / SmolVLM, Gemma 3, InternVL, Mistral 3): the
family's own processor builds the prefix (its image placeholder and the prompt: it expands the image's tokens and
returns its own inputs, e.g. `image_grid_thw`, `image_sizes`, `pixel_attention_mask`, `mm_token_type_ids`), then the
caption's tokens and [EOS] follow. The "cells" C are then the example's image tokens (the batch's largest count,
padded), each with its box in the original image (`image_token_geometry`), a token's coverage the share of its box
inside a gold box. Every family's batch carries `image_cell_boxes` (B, C, 4): each cell's box in its original image,
normalised by the image's width and height (one grid: CLIP's crop, SigLIP's squash, ViLT's resize; NaN where none).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from ..alignment.patches import DEFAULT_COVERAGE_THRESHOLD, ImageGeometry, cell_coverage, covered_cells_target
from ..data.formats.flickr30k_entities import Flickr30kEntities
from .families import MultiViewFamily, PatchModelFamily, ViltFamily, patch_model_family
from .image_token_geometry import image_placeholder, image_token_map, processor_call_kwargs, single_grid_token_map

__all__ = ["PatchGroundingCollator", "grounded_caption_examples", "patch_batches"]


def grounded_caption_examples(
    flickr30k_entities_dir: str | Path, images_dir: str | Path, split: str, max_images: int | None = None
) -> tuple[list[dict], dict]:
    """Every caption of the split's images with its boxed phrases, and counts of what was left out.

    Returns:
        (examples, counts): counts of `images`, `captions`, `phrases` kept and `phrases_without_box` (scene / no-box
        phrases: nothing to ground) left out.
    """
    entities = Flickr30kEntities(flickr30k_entities_dir)
    images_dir = Path(images_dir)
    image_ids = entities.image_ids(split)[:max_images]
    examples, counts = [], {"images": 0, "captions": 0, "phrases": 0, "phrases_without_box": 0}
    for image_id in image_ids:
        candidates = [images_dir / f"{image_id}{suffix}" for suffix in (".png", ".jpg", ".jpeg")]
        path = next((candidate for candidate in candidates if candidate.is_file()), None)
        if path is None:
            raise ValueError(
                f"`images_dir` must hold an image {image_id}.png or .jpg for every listed image, got none in "
                f"{images_dir}."
            )
        annotation = entities.annotation(image_id)
        counts["images"] += 1
        for sentence in entities.sentences(image_id):
            phrases = []
            for phrase in sentence.phrases:
                boxes = annotation.boxes.get(phrase.phrase_id)
                if not boxes:
                    counts["phrases_without_box"] += 1
                    continue
                phrases.append({"char_start": phrase.char_start, "char_end": phrase.char_end, "boxes": boxes})
            counts["phrases"] += len(phrases)
            counts["captions"] += 1
            examples.append(
                {"image_id": image_id, "image_path": str(path), "caption": sentence.text, "phrases": phrases}
            )
    return examples, counts


def _image(example: dict) -> Image.Image:
    image = example.get("image")
    if image is None:
        if "image_path" not in example:
            raise ValueError(f"An example must carry `image` or `image_path`, got the keys {sorted(example)}.")
        image = Image.open(example["image_path"])
    return image.convert("RGB")


def _content_sizes(pixel_values: torch.Tensor, pixel_mask: torch.Tensor | None) -> list[tuple[int, int] | None]:
    """(width, height) of each image inside the padded `pixel_values` (from ViLT's `pixel_mask`), or None."""
    if pixel_mask is None:
        return [None] * pixel_values.shape[0]
    return [(int(mask[0].sum()), int(mask[:, 0].sum())) for mask in pixel_mask]


@dataclass
class PatchGroundingCollator:
    """Batches grounded captions for a patch model of `config` (see the module docstring for the layouts).

    Args:
        processor: the model's processor (its `tokenizer`, a fast tokenizer, and `image_processor` are used).
        config: the model's config (family, image token id, patch grid).
        prompt: text between the image and the caption (not ViLT); PaliGemma's default task prompt is used when None
            ("caption en"), none for the others.
        coverage_threshold: a cell is covered by a box when at least this share of it lies inside the box.
        max_text_length: caption tokens kept (longer captions are cut, and phrases beyond the cut are counted in
            `truncated_phrases`).
        with_labels: the decoders: add `labels` (language-model loss on the caption).
        return_details: add `details`, per example its caption's token span (`caption_start`, `caption_end`) and its
            phrases' tokens and boxes normalised to the processed image (multi-view families: to the original image),
            what the explorer draws, and (decoders) its image's `token_map` (`views.ImageTokenMap`, its tokens in the
            order of `image_positions`).
    """

    processor: object
    config: object
    prompt: str | None = None
    coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD
    max_text_length: int = 64
    with_labels: bool = True
    return_details: bool = False

    def __post_init__(self) -> None:
        self.family: PatchModelFamily = patch_model_family(self.config)
        self.tokenizer = getattr(self.processor, "tokenizer", None)
        self.image_processor = getattr(self.processor, "image_processor", None)
        if self.tokenizer is None or self.image_processor is None:
            raise ValueError(
                f"`processor` must have a `tokenizer` and an `image_processor` (the model's processor), got "
                f"{type(self.processor).__name__}."
            )
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(
                f"`processor.tokenizer` must be a fast tokenizer (character offsets), got "
                f"{type(self.tokenizer).__name__}."
            )
        if not 0.0 < self.coverage_threshold <= 1.0:
            raise ValueError(f"`coverage_threshold` must be in (0, 1], got {self.coverage_threshold!r}.")
        if self.prompt is None:
            self.prompt = "caption en" if self.family.name == "paligemma" else ""
        self.truncated_phrases = 0

    def _tokens(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(encoded["input_ids"]), [tuple(span) for span in encoded["offset_mapping"]]

    def _special(self, *names: str) -> list[int]:
        for name in names:
            token = getattr(self.tokenizer, f"{name}_token_id", None)
            if token is not None:
                return [token]
        return []

    def _sequence(self, caption_ids: list[int], num_image_tokens: int) -> tuple[list[int], list[int], int, int]:
        """(input_ids, token_type_ids, caption start, first labelled position) of one example."""
        prompt_ids = self._tokens(self.prompt)[0] if self.prompt else []
        if isinstance(self.family, ViltFamily):
            prefix = self._special("cls", "bos")
            ids = prefix + caption_ids + self._special("sep", "eos")
            return ids, [0] * len(ids), len(prefix), len(ids)
        image = [self.config.image_token_id] * num_image_tokens
        if self.family.name == "llava":
            prefix = self._special("bos") + image + prompt_ids
        else:  # PaliGemma: image, [BOS], prompt and "\n" form the prefix; the caption is the suffix
            prefix = image + self._special("bos") + prompt_ids + self._tokens("\n")[0]
        ids = prefix + caption_ids + self._special("eos", "sep")
        token_types = [0] * len(prefix) + [1] * (len(ids) - len(prefix))
        return ids, token_types, len(prefix), len(prefix)

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("`examples` must hold at least one example, got none.")
        images = [_image(example) for example in examples]
        if isinstance(self.family, MultiViewFamily):
            return self._multiview_batch(examples, images)
        pixels = self.image_processor(images, return_tensors="pt")
        pixel_values, pixel_mask = pixels["pixel_values"], pixels.get("pixel_mask")
        grid = self.family.grid(self.config, pixel_values)
        num_image_tokens = (
            0 if isinstance(self.family, ViltFamily) else self.family.num_image_tokens(self.config, pixel_values)
        )
        rows, cell_boxes = [], []
        for example, image, content in zip(examples, images, _content_sizes(pixel_values, pixel_mask)):
            processed_size = (pixel_values.shape[-1], pixel_values.shape[-2])
            geometry = ImageGeometry.from_processor(self.image_processor, image.size, processed_size, content)
            token_map = single_grid_token_map(self.image_processor, image.size, processed_size, grid, content)
            cell_boxes.append(_normalised_token_boxes(token_map))

            def locate(boxes, geometry=geometry):
                normalised = geometry.normalised_boxes(boxes)
                return cell_coverage(normalised, grid), normalised

            rows.append(self._example(example, lambda ids: self._sequence(ids, num_image_tokens), locate))
            if not isinstance(self.family, ViltFamily):  # ViLT samples its tokens in the forward: no fixed map
                leading = self.family.leading_non_cells(self.config)
                rows[-1]["details"]["token_map"] = single_grid_token_map(
                    self.image_processor, image.size, processed_size, grid, content, first=leading
                )
        batch = self._pad(rows, grid[0] * grid[1])
        batch["image_cell_boxes"] = torch.stack(cell_boxes)
        batch["pixel_values"] = pixel_values
        if pixel_mask is not None:
            batch["pixel_mask"] = pixel_mask
        if not isinstance(self.family, ViltFamily):
            layout = self.family.layout(self.config, batch["input_ids"], pixel_values)
            batch.update(
                image_positions=layout.image_positions, cell_index=layout.cell_index, patch_mask=layout.patch_mask
            )
        return batch

    def _multiview_batch(self, examples: Sequence[dict], images: list[Image.Image]) -> dict[str, torch.Tensor]:
        """The family's processor writes each prefix (image placeholder + prompt) and the image inputs; the caption's
        tokens follow; every image token is placed in its image by `image_token_map`."""
        model_type = self.family.name
        text = image_placeholder(model_type) + (f" {self.prompt}" if self.prompt else "")
        call_kwargs = processor_call_kwargs(model_type, self.image_processor)
        inputs = self.processor(
            images=[[image] for image in images], text=[text] * len(images), return_tensors="pt", padding=True,
            **call_kwargs,
        )
        input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"].bool()
        # inputs per token (`mm_token_type_ids`, Gemma 3's `token_type_ids`): extended with 0 over the caption
        token_keys = [
            key for key, value in inputs.items()
            if key not in ("input_ids", "attention_mask") and isinstance(value, torch.Tensor)
            and not value.is_floating_point() and value.shape == input_ids.shape
        ]  # fmt: skip
        rows, maps = [], []
        for index, (example, image) in enumerate(zip(examples, images)):
            prefix = input_ids[index][attention_mask[index]]
            is_image = prefix == self.config.image_token_id
            token_map = image_token_map(self.processor, self.config, image.size, inputs, index, int(is_image.sum()))
            width, height = image.size
            scale = torch.tensor([width, height, width, height], dtype=torch.float32)

            def sequence(caption_ids, prefix=prefix.tolist()):
                ids = prefix + caption_ids + self._special("eos", "sep")
                return ids, None, len(prefix), len(prefix)

            def locate(boxes, token_map=token_map, scale=scale):
                return token_map.coverage(boxes), (boxes / scale).clamp(0.0, 1.0)

            row = self._example(example, sequence, locate)
            row["details"]["token_map"] = token_map
            row["image_positions"] = is_image.nonzero()[:, 0].tolist()
            row["token_values"] = {key: inputs[key][index][attention_mask[index]].tolist() for key in token_keys}
            rows.append(row)
            maps.append(token_map)
        num_cells = max(token_map.num_tokens for token_map in maps)
        batch = self._pad(rows, num_cells)
        batch.update(_multiview_layout(rows, maps, num_cells))
        for key, value in inputs.items():
            if key not in ("input_ids", "attention_mask", *token_keys):
                batch[key] = value
        return batch

    def _example(self, example, sequence, locate) -> dict:
        """One example's row: `sequence(caption_ids)` gives (input_ids, token_type_ids or None, caption start, first
        labelled position); `locate(boxes)` a phrase's (G, 4) pixel boxes' (coverage over the cells, boxes for the
        details)."""
        caption = example.get("caption")
        if not isinstance(caption, str) or not caption.strip():
            raise ValueError(f"An example's `caption` must be a non-empty str, got {caption!r}.")
        caption_ids, offsets = self._tokens(caption)
        caption_ids, offsets = caption_ids[: self.max_text_length], offsets[: self.max_text_length]
        ids, token_types, start, first_label = sequence(caption_ids)
        targets = {}  # grounded token position -> its target over the cells (a later phrase's wins)
        last_tokens, coverages, details = [], [], []
        for phrase in example.get("phrases", []):
            tokens = [
                start + i
                for i, (a, b) in enumerate(offsets)
                if a < phrase["char_end"] and b > phrase["char_start"] and b > a
            ]
            if not tokens:
                self.truncated_phrases += 1
                continue
            coverage, boxes = locate(torch.as_tensor(phrase["boxes"], dtype=torch.float32).view(-1, 4))
            target = covered_cells_target(coverage, self.coverage_threshold)
            targets.update((token, target) for token in tokens)
            last_tokens.append(tokens[-1])
            coverages.append(coverage)
            text = example["caption"][phrase["char_start"] : phrase["char_end"]]
            details.append({"tokens": tokens, "boxes": boxes.tolist(), "text": text})
        labels = [-100] * first_label + ids[first_label:]
        return {
            "input_ids": ids,
            "token_type_ids": token_types,
            "labels": labels,
            "grounded_token_positions": sorted(targets),
            "word_cell_alignment": [targets[token] for token in sorted(targets)],
            "last_tokens": last_tokens,
            "coverages": coverages,
            "details": {"caption_start": start, "caption_end": start + len(caption_ids), "phrases": details},
        }

    def _pad(self, rows: list[dict], num_cells: int) -> dict[str, torch.Tensor]:
        length = max(len(row["input_ids"]) for row in rows)
        phrases = max(1, max(len(row["last_tokens"]) for row in rows))
        grounded = max(1, max(len(row["grounded_token_positions"]) for row in rows))
        batch_size = len(rows)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        batch = {
            "input_ids": torch.full((batch_size, length), pad_id, dtype=torch.long),
            "attention_mask": torch.zeros(batch_size, length, dtype=torch.long),
            "token_type_ids": torch.zeros(batch_size, length, dtype=torch.long),
            "labels": torch.full((batch_size, length), -100, dtype=torch.long),
            "grounded_token_positions": torch.zeros(batch_size, grounded, dtype=torch.long),
            "word_cell_alignment": torch.zeros(batch_size, grounded, num_cells),
            "phrase_token_index": torch.full((batch_size, phrases), -1, dtype=torch.long),
            "phrase_cell_coverage": torch.zeros(batch_size, phrases, num_cells),
        }
        token_keys = list(rows[0].get("token_values", {}))  # the multi-view processor's inputs per token
        for key in token_keys:
            batch[key] = torch.zeros(batch_size, length, dtype=torch.long)
        for i, row in enumerate(rows):
            size = len(row["input_ids"])
            batch["attention_mask"][i, :size] = 1
            for key in ("input_ids", "labels"):
                batch[key][i, :size] = torch.as_tensor(row[key])
            if row["token_type_ids"] is not None:
                batch["token_type_ids"][i, :size] = torch.as_tensor(row["token_type_ids"])
            for key in token_keys:
                values = row["token_values"][key]
                batch[key][i, : len(values)] = torch.as_tensor(values)
            positions = row["grounded_token_positions"]
            if positions:
                batch["grounded_token_positions"][i, : len(positions)] = torch.as_tensor(positions)
                targets = torch.stack(row["word_cell_alignment"])
                batch["word_cell_alignment"][i, : len(positions), : targets.shape[-1]] = targets
            for k, (token, coverage) in enumerate(zip(row["last_tokens"], row["coverages"])):
                batch["phrase_token_index"][i, k] = token
                batch["phrase_cell_coverage"][i, k, : coverage.shape[-1]] = coverage
        if not self.with_labels or isinstance(self.family, ViltFamily):
            del batch["labels"]
        if self.return_details:
            batch["details"] = [row["details"] for row in rows]
        # LLaVA takes none; a multi-view family only its processor's own (Gemma 3's), filled above
        if self.family.name == "llava" or (rows[0]["token_type_ids"] is None and "token_type_ids" not in token_keys):
            del batch["token_type_ids"]
        return batch


def _multiview_layout(rows: list[dict], maps: list, num_cells: int) -> dict[str, torch.Tensor]:
    """The `PatchLayout` tensors of a multi-view batch: cell c of an example is its c-th image token (padding and
    tokens without a box are no cell), its box normalised to the image."""
    batch_size = len(rows)
    positions = torch.zeros(batch_size, num_cells, dtype=torch.long)
    boxes = torch.full((batch_size, num_cells, 4), float("nan"))
    for i, (row, token_map) in enumerate(zip(rows, maps)):
        count = token_map.num_tokens
        positions[i, :count] = torch.as_tensor(row["image_positions"], dtype=torch.long)
        boxes[i, :count] = _normalised_token_boxes(token_map)
    has_area = (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])  # False for NaN
    cells = torch.arange(num_cells).expand(batch_size, -1)
    return {"image_positions": positions, "cell_index": cells, "patch_mask": has_area, "image_cell_boxes": boxes}


def _normalised_token_boxes(token_map) -> torch.Tensor:
    """(num_tokens, 4) the map's token boxes divided by its image's width and height."""
    width, height = token_map.image_size
    return token_map.token_boxes() / torch.tensor([width, height, width, height], dtype=torch.float32)


def patch_batches(collator: PatchGroundingCollator, examples: Sequence[dict], batch_size: int) -> Iterator[dict]:
    """`collator`'s batches of `examples`, in order, `batch_size` at a time (the probe's and the explorer's input)."""
    for start in range(0, len(examples), batch_size):
        yield collator(list(examples[start : start + batch_size]))
