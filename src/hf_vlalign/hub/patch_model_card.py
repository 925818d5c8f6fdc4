"""The Hub model card of a transformers patch model fine-tuned by `examples/finetune_patch_vlm.py`
(`model_cards/patch_vlm.md`), rendered as the region models' cards are (`hf_vlalign.hub.model_card`)."""

from __future__ import annotations

from collections.abc import Mapping

from huggingface_hub import ModelCard
from transformers.trainer_utils import unwrap_peft_model

from .model_card import _SYNTHETIC_DATASET, _render, _Run, _slug, _supervision_tags

__all__ = ["render_patch_model_card"]


def render_patch_model_card(
    model,
    *,
    model_id: str | None,
    base_model: str | None,
    supervision: str | None,
    results: dict[str, float],
    training: dict[str, object],
    baselines: Mapping[str, Mapping] | None = None,
    dataset_name: str | None = None,
    subfolder: str | None = None,
    license: str = "apache-2.0",
) -> ModelCard:
    """Renders the card of a fine-tuned patch model (its class and `model_type` read from `model`, which may be
    wrapped by peft: the card then says the folder holds an adapter).

    Args:
        model: the trained model.
        model_id, base_model, results, training, baselines, subfolder, license: as in `render_model_card`.
        supervision: `direct`, `semi_direct` or None (no attention supervision).
        dataset_name: the training data's name (e.g. "user data: train.jsonl"); None: the synthetic scenes.
    """
    plain = unwrap_peft_model(model)
    supervision = supervision or "none"
    synthetic_data = dataset_name is None
    run = _Run(model_id, base_model, results, baselines, training, None, None, synthetic_data, subfolder, license)
    model_type = plain.config.model_type
    default_name = f"{model_type.replace('_', '-')}-grounded-captions"
    if supervision != "none":
        default_name += f"-{supervision.replace('_', '-')}"
    dataset_type, dataset = _SYNTHETIC_DATASET if synthetic_data else (_slug(dataset_name), dataset_name)
    return _render(
        "patch_vlm",
        run,
        model_name=model_id.split("/")[-1] if model_id else default_name,
        tags=["vision-language", "image-text-to-text", model_type, "hf_vlalign", *_supervision_tags(supervision)],
        index={"task_type": "image-text-to-text", "task_name": "Grounded captioning", "dataset_type": dataset_type,
               "dataset_name": dataset},
        pipeline_tag="image-text-to-text",
        supervision_key=supervision,
        model_class=type(plain).__name__,
        model_type=model_type,
        adapter=plain is not model,
    )  # fmt: skip
