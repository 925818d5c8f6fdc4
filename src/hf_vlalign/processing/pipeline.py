"""`WordRegionAttentionPipeline`, the "word-region-attention" task of transformers' `pipeline()` (docs/own_data.md):
per example the whole words of the text and each word's word -> region attention of one layer, each head's row
renormalised over the real regions, then averaged over heads (and over the pieces of a word). On one of transformers'
patch models (docs/vlms.md) the regions are its image tokens and its own processor makes the input
(`patch_pipeline.PatchAttentionReader`).
"""

from __future__ import annotations

import inspect
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import AutoModel, Pipeline

from ..analysis.adapters import attention_blocks
from ..analysis.explorer import explorer_examples, write_attention_explorer
from ..models.family import family_spec
from ..utils.size_limits import MAX_BATCH_SIZE, check_size
from .feature_extraction import load_images
from .processor import VLAlignProcessor

__all__ = ["WORD_REGION_ATTENTION_TASK", "WordRegionAttentionPipeline"]

WORD_REGION_ATTENTION_TASK = "word-region-attention"
_EXPLORER_KEY = "_explorer_example"


class WordRegionAttentionPipeline(Pipeline):
    """Image(s) and text in; per example the words, each word's attention weights over the regions (mean over heads
    of one layer) and its `top_k` boxes in pixels; optionally the explorer page.

    Call arguments:
        images: an image (path or PIL.Image), a list of them, or dicts {"image", "text", "text_pair", "boxes"}.
        text: the sentence of each image (a str or a list, one per image).
        text_pair: optional second sentence of each example (VGP's second caption).
        boxes: optional regions of each image, pixel boxes [[x1, y1, x2, y2], ...] (else the processor's detector or
            grid).
        layer: the word -> region layer to read (default -1, the last).
        top_k: boxes listed per word, most attended first (default 3).
        explorer: True (each result's "explorer" holds the HTML of its page) or a path (one page of all examples
            written there; "explorer" holds the path).

    On a transformers patch model (`hf_vlalign.vlms`, e.g. `pipeline("word-region-attention", model=LLAVA_FOLDER)`)
    the model's own processor makes the input, the regions are its image tokens (their boxes in the image's pixels),
    `layer` counts its language model's layers, and `text_pair` / `boxes` do not apply; examples run one at a time.
    """

    _load_processor = True
    _load_tokenizer = True
    _load_image_processor = False
    _load_feature_extractor = False
    _load_video_processor = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from ..vlms.word_attention import PatchAttentionReader, is_patch_model_instance

        self.patch_reader = None
        if is_patch_model_instance(self.model):  # its own processor, its image tokens as the regions
            self.patch_reader = PatchAttentionReader(self.model, self.processor)
            self.family = self.patch_reader.family.name
            self._check_patch_batch_size(self._batch_size)
            return
        if not isinstance(self.processor, VLAlignProcessor):
            raise ValueError(
                "The word-region-attention pipeline needs the model's VLAlignProcessor, got "
                f"{type(self.processor).__name__}: pass `processor=VLAlignProcessor(RegionFeatureExtractor(...), "
                "tokenizer)` or a model folder saved by hf_vlalign.recipes.save_model (with its processor_config.json)."
            )
        self.family = family_spec(self.model, argument="model").name
        if self.family == "captioner":
            raise ValueError(
                "The word-region-attention pipeline reads the words of a given text; a captioner generates its words "
                "(its cross-attention per generated word is in `hf-vlalign explore` and docs/analysis.md). Use a "
                "single-stream or two-stream model."
            )
        self.processor.check_model(self.model)
        if self._batch_size is not None:
            check_size("batch_size", self._batch_size, MAX_BATCH_SIZE, limit_name="MAX_BATCH_SIZE")
        self._forward_names = set(inspect.signature(self.model.forward).parameters)

    @staticmethod
    def _check_patch_batch_size(batch_size: int | None) -> None:
        """A patch model's examples run one at a time (each has its own image tokens and caption positions)."""
        if batch_size not in (None, 1):
            raise ValueError(
                f"`batch_size` of the pipeline on a transformers patch model must be 1 (each example runs alone), got "
                f"{batch_size!r}."
            )

    def _sanitize_parameters(
        self,
        text_pair: Any = None,
        boxes: Any = None,
        layer: int | None = None,
        top_k: int | None = None,
        explorer: bool | str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> tuple[dict, dict, dict]:
        if kwargs:
            raise TypeError(f"WordRegionAttentionPipeline got unexpected argument(s) {sorted(kwargs)}.")
        forward, post = {}, {}
        if layer is not None:
            if isinstance(layer, bool) or not isinstance(layer, int):
                raise ValueError(f"`layer` must be an int (negative counts from the last), got {layer!r}.")
            forward["layer"] = layer
        if explorer is not None:
            if not isinstance(explorer, (bool, str, os.PathLike)):
                raise ValueError(f"`explorer` must be True, False or the path of the page to write, got {explorer!r}.")
            forward["explorer"] = bool(explorer)
        if top_k is not None:
            if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
                raise ValueError(f"`top_k` must be an int >= 1, got {top_k!r}.")
            post["top_k"] = top_k
        return {}, forward, post

    def __call__(
        self,
        images: Any,
        text: str | Sequence[str] | None = None,
        text_pair: str | Sequence[str] | None = None,
        boxes: Sequence | None = None,
        **kwargs: Any,
    ) -> dict | list[dict]:
        explorer = kwargs.get("explorer")
        if kwargs.get("batch_size") is not None:
            check_size("batch_size", kwargs["batch_size"], MAX_BATCH_SIZE, limit_name="MAX_BATCH_SIZE")
        if self.patch_reader is not None:
            self._check_patch_batch_size(kwargs.get("batch_size"))
        single, inputs = _examples(images, text, text_pair, boxes)
        results = super().__call__(inputs, **kwargs)
        results = [results] if isinstance(results, dict) else list(results)
        pages = [result.pop(_EXPLORER_KEY, None) for result in results]
        if explorer:
            if isinstance(explorer, (str, os.PathLike)):
                path = self._write_page(pages, explorer)
                for result in results:
                    result["explorer"] = path
            else:
                for result, page in zip(results, pages):
                    with tempfile.TemporaryDirectory() as folder:
                        result["explorer"] = self._write_page([page], Path(folder) / "explorer.html").read_text(encoding="utf-8")
        return results[0] if single else results

    def preprocess(self, example: dict) -> dict:
        image = load_images([example["image"]])[0]
        if self.patch_reader is not None:
            inputs = self.patch_reader.preprocess(example, image)
            # the caption's tokens: the text's, without special tokens, as many as the collator kept
            encoding = self.patch_reader.collator.tokenizer([example["text"]], add_special_tokens=False)
            kept = inputs.pop("caption_length")
            inputs["words"] = [word for word in _word_pieces(encoding, [example["text"]]) if word["tokens"][-1] < kept]
            return inputs
        boxes = None if example.get("boxes") is None else [example["boxes"]]
        pair = None if example.get("text_pair") is None else [example["text_pair"]]
        inputs = self.processor(images=[image], text=[example["text"]], text_pair=pair, boxes=boxes, return_region_boxes=True)
        encoding = self.processor.tokenizer([example["text"]], pair, truncation=True)
        inputs["words"] = _word_pieces(encoding, [example["text"]] + ([] if pair is None else pair))
        inputs["tokens"] = self.processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
        inputs["image"], inputs["title"] = image, " / ".join([example["text"]] + ([] if pair is None else pair))
        return inputs

    def _forward(self, inputs: dict, layer: int = -1, explorer: bool = False) -> dict:
        if self.patch_reader is not None:
            result = self.patch_reader.forward(self.model, inputs, layer)
            if explorer:
                result[_EXPLORER_KEY] = self.patch_reader.explorer_example(self.model, inputs)
            return result
        extras = {name: inputs.pop(name) for name in ("region_boxes", "words", "tokens", "image", "title")}
        model_inputs = {name: value for name, value in inputs.items() if name in self._forward_names}
        outputs = self.model(**model_inputs, output_attentions=True)
        end_token = getattr(self.model.config, "use_end_token", None) if self.family == "single_stream" else None
        masks = {"text_mask": inputs["attention_mask"], "region_mask": inputs["visual_attention_mask"]}
        blocks = attention_blocks(outputs, **masks, end_token=end_token)
        rows = blocks.row_normalised("word_to_region")
        if not -len(rows) <= layer < len(rows):
            raise ValueError(f"`layer` must be in [-{len(rows)}, {len(rows) - 1}] (word -> region layers), got {layer}.")
        result = {
            "attention": rows[layer][0].mean(dim=0).float().cpu(),  # (T, R): mean over heads
            "layer": layer % len(rows),
            "region_boxes": extras["region_boxes"][0].cpu(),
            "num_regions": int(inputs["visual_attention_mask"][0].sum()),
            "words": extras["words"],
        }
        if explorer:
            text_mask = inputs["attention_mask"]
            result[_EXPLORER_KEY] = explorer_examples(
                outputs, words=[extras["tokens"][: int(text_mask[0].sum())]], region_boxes=inputs["visual_boxes"],
                text_mask=text_mask, region_mask=inputs["visual_attention_mask"], images=[extras["image"]],
                titles=[extras["title"]], end_token=end_token,
            )[0]  # fmt: skip
        return result

    def postprocess(self, outputs: dict, top_k: int = 3) -> dict:
        attention, num_regions = outputs["attention"][:, : outputs["num_regions"]], outputs["num_regions"]
        boxes = outputs["region_boxes"][:num_regions]
        words = []
        for word in outputs["words"]:
            weights = attention[word["tokens"]].mean(dim=0)  # a word of several pieces: the mean of their rows
            order = torch.argsort(weights, descending=True, stable=True)[: min(top_k, num_regions)]
            words.append(
                {
                    **word,
                    "weights": weights.tolist(),
                    "top_boxes": [{"region": int(i), "box": boxes[i].tolist(), "weight": float(weights[i])} for i in order],
                }
            )
        result = {"words": words, "region_boxes": boxes.tolist(), "layer": outputs["layer"]}
        if _EXPLORER_KEY in outputs:
            result[_EXPLORER_KEY] = outputs[_EXPLORER_KEY]
        return result

    def _subtitle(self) -> str:
        if self.patch_reader is not None:
            return self.patch_reader.subtitle(self.model)
        options = self.processor.image_processor.region_options
        regions = ", ".join(f"{name}={value!r}" for name, value in options.items() if value is not None)
        return (
            f"{self.model.config.model_type}; regions and features: {regions}; each word's weights renormalised over "
            "the regions; layers and heads counted from 0"
        )

    def _write_page(self, examples: list, path: str | os.PathLike) -> Path:
        return write_attention_explorer(
            examples, path, title="Word-region attention", subtitle=self._subtitle(), source=self.family
        )


def _examples(images: Any, text: Any, text_pair: Any, boxes: Any) -> tuple[bool, list[dict]]:
    """(whether one example was given, the examples as dicts {"image", "text", "text_pair", "boxes"})."""
    if isinstance(images, dict):
        return True, [_checked_example(images, 0)]
    if isinstance(images, (str, os.PathLike, Image.Image)):
        if text is not None and not isinstance(text, str):
            raise ValueError(f"`text` must be one str for one image, got {text!r}.")
        return True, [_checked_example({"image": images, "text": text, "text_pair": text_pair, "boxes": boxes}, 0)]
    if not isinstance(images, Sequence) or isinstance(images, (str, bytes)) or not images:
        raise ValueError(f"`images` must be an image (path or PIL.Image), a non-empty list of them or of dicts, got {images!r}.")
    if all(isinstance(item, dict) for item in images):
        return False, [_checked_example(item, index) for index, item in enumerate(images)]
    texts = [text] if isinstance(text, str) else text
    if not isinstance(texts, Sequence) or len(texts) != len(images):
        got = len(texts) if isinstance(texts, Sequence) else texts
        raise ValueError(f"`images` and `text` must have one sentence per image, got {len(images)} images and {got!r}.")
    pairs = [None] * len(images) if text_pair is None else ([text_pair] if isinstance(text_pair, str) else text_pair)
    if len(pairs) != len(images):
        raise ValueError(f"`text_pair` must have one sentence per image ({len(images)}), got {len(pairs)}.")
    all_boxes = [None] * len(images) if boxes is None else boxes
    if len(all_boxes) != len(images):
        raise ValueError(f"`boxes` must have one entry (None or pixel boxes) per image ({len(images)}), got {len(all_boxes)}.")
    return False, [
        _checked_example({"image": image, "text": sentence, "text_pair": pair, "boxes": image_boxes}, index)
        for index, (image, sentence, pair, image_boxes) in enumerate(zip(images, texts, pairs, all_boxes))
    ]


def _checked_example(example: dict, index: int) -> dict:
    unknown = set(example) - {"image", "text", "text_pair", "boxes"}
    if unknown:
        raise ValueError(f"example {index} has unknown key(s) {sorted(unknown)}; expected image, text, text_pair, boxes.")
    if "image" not in example or example["image"] is None:
        raise ValueError(f"example {index} has no image.")
    if not isinstance(example.get("text"), str) or not example["text"].strip():
        raise ValueError(f"`text` of example {index} must be a non-empty str, got {example.get('text')!r}.")
    return {"text_pair": None, "boxes": None, **example}


def _word_pieces(encoding, sentences: list[str]) -> list[dict]:
    """The whole words of example 0: {"word", "sentence", "tokens"} (the positions of its pieces), in order."""
    words: dict[tuple[int, int], dict] = {}
    for position, (word, sentence) in enumerate(zip(encoding.word_ids(0), encoding.sequence_ids(0))):
        if word is None:
            continue  # special tokens
        if (sentence, word) not in words:
            start, end = encoding.word_to_chars(0, word, sequence_index=sentence)
            words[(sentence, word)] = {"word": sentences[sentence][start:end], "sentence": sentence, "tokens": []}
        words[(sentence, word)]["tokens"].append(position)
    return list(words.values())


def register_pipeline() -> None:
    """Registers the "word-region-attention" task with transformers' pipeline registry (idempotent)."""
    from transformers.pipelines import PIPELINE_REGISTRY

    if WORD_REGION_ATTENTION_TASK not in PIPELINE_REGISTRY.supported_tasks:
        PIPELINE_REGISTRY.register_pipeline(
            WORD_REGION_ATTENTION_TASK, pipeline_class=WordRegionAttentionPipeline, pt_model=AutoModel, type="multimodal"
        )
