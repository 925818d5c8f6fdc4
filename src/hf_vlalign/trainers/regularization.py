"""Keeping what pre-training learned while fine-tuning (Samaran et al. attribute their attention-supervised VGP model's
drop to catastrophic forgetting): knowledge distillation from a frozen teacher (Hinton et al. 2015) and elastic weight
consolidation (Kirkpatrick et al. 2017) with a diagonal empirical Fisher estimate, which `hf-vlalign fisher` writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm
from transformers.utils import logging

from ..utils.output_paths import refuse_foreign_file

logger = logging.get_logger(__name__)

FISHER_PREFIX = "fisher."
ANCHOR_PREFIX = "anchor."
# the metadata "content" of a Fisher file, by which `save_fisher` recognises a file it may replace
FISHER_FILE_CONTENT = "hf_vlalign EWC fisher and anchor"
# the two-stream heads name their classification logits LXMERT's way (`cross_relationship_score`, ...)
DISTILLED_SUFFIXES = ("logits", "_score")


# Knowledge distillation


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) * T^2 over the last (class) dimension, averaged over the
    positions (examples, or tokens) that `mask` (`logits.shape[:-1]`, e.g. `labels != -100`) keeps ("batchmean"); a
    mask keeping none gives a zero loss still attached to the graph. The T^2 factor keeps the gradient scale
    independent of T (Hinton et al., sec. 2).
    """
    # Hinton et al. 2015, sec. 2: L = T^2 * KL(p_teacher^T || p_student^T), p^T = softmax(z / T)
    student_log_probs = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    per_position = (teacher_log_probs.exp() * (teacher_log_probs - student_log_probs)).sum(-1)
    if mask is None:
        return per_position.mean() * temperature**2
    mask = mask.to(per_position.device, torch.bool)
    return (per_position * mask).sum() / mask.sum().clamp(min=1) * temperature**2


def _as_class_logits(logits: torch.Tensor) -> torch.Tensor:
    """A `(batch,)` score (the two-stream NLVR2 head) is a binary logit s: the two-class logits (0, s)."""
    return torch.stack([torch.zeros_like(logits), logits], dim=-1) if logits.dim() == 1 else logits


def distilled_fields(student_outputs: Mapping, teacher_outputs: Mapping) -> list[str]:
    """The output fields distilled: every `*logits` (and two-stream `*_score`) field present (not None) in both
    outputs with equal shapes. Fields present in both with different shapes are named in a warning and skipped;
    no field at all raises a `ValueError` naming what each side has."""
    def logit_fields(outputs: Mapping) -> dict[str, torch.Tensor]:
        return {
            key: value for key, value in outputs.items()
            if key.endswith(DISTILLED_SUFFIXES) and isinstance(value, torch.Tensor)
        }  # fmt: skip

    student, teacher = logit_fields(student_outputs), logit_fields(teacher_outputs)
    shared = [key for key in student if key in teacher]
    fields = [key for key in shared if student[key].shape == teacher[key].shape]
    mismatched = {key: (tuple(student[key].shape), tuple(teacher[key].shape)) for key in shared if key not in fields}
    if mismatched:
        logger.warning_once(f"Distillation skips the output fields whose student and teacher shapes differ: {mismatched}.")
    if not fields:
        shapes = {key: tuple(value.shape) for key, value in student.items()}
        raise ValueError(
            f"Distillation found no logits field in both the student's and the teacher's outputs with equal shapes: "
            f"student has {shapes}, teacher has {({key: tuple(value.shape) for key, value in teacher.items()})}"
            + (f" (mismatched: {mismatched})." if mismatched else ".")
        )
    return fields


def outputs_distillation_loss(
    student_outputs: Mapping,
    teacher_outputs: Mapping,
    temperature: float,
    labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sum over the `distilled_fields` of `distillation_loss` (one term per head, as the task losses are summed).
    Token-level logits `(batch, T, vocab)` count only the positions where `labels` `(batch, T)` is not -100, when
    `labels` has that shape."""
    total = None
    for key in distilled_fields(student_outputs, teacher_outputs):
        student, teacher = _as_class_logits(student_outputs[key]), _as_class_logits(teacher_outputs[key])
        mask = None
        if student.dim() >= 3 and isinstance(labels, torch.Tensor) and labels.shape == student.shape[:-1]:
            mask = labels != -100
        loss = distillation_loss(student, teacher, temperature, mask)
        total = loss if total is None else total + loss
    return total


# Elastic weight consolidation


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters with `requires_grad`, by name (shared parameters once, under their first name)."""
    return {name: parameter for name, parameter in model.named_parameters() if parameter.requires_grad}


def anchor_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """theta*: detached CPU copies of the model's trainable parameters, the weights EWC keeps the model close to."""
    return {name: parameter.detach().to("cpu", copy=True) for name, parameter in trainable_parameters(model).items()}


def estimate_fisher(
    model: nn.Module,
    dataloader: Iterable[Mapping[str, torch.Tensor]],
    num_batches: int | None = None,
    *,
    non_model_keys: Iterable[str] = (),
    progress: bool = True,
) -> dict[str, torch.Tensor]:
    """Diagonal empirical Fisher of `model` on `dataloader`: for each trainable parameter, the mean over batches of
    the squared gradient of the model's batch-mean loss (`outputs.loss`), as in the common EWC code (e.g. Avalanche's
    `EWCPlugin`; a batch size of 1 gives the per-example Fisher). The model runs in eval mode, its mode restored.
    `dataloader` yields dicts of model inputs with labels (`non_model_keys` dropped), the first `num_batches` read
    (None: all). Returns `{name: F}` on CPU, float32, per trainable parameter (zeros where the loss does not reach).
    """
    parameters = trainable_parameters(model)
    if not parameters:
        raise ValueError("`model` has no trainable parameter (requires_grad=True) to estimate a Fisher for.")
    device = next(iter(parameters.values())).device
    skip = set(non_model_keys)
    fisher = {name: torch.zeros_like(parameter, dtype=torch.float32, device="cpu") for name, parameter in parameters.items()}
    was_training = model.training
    model.eval()
    seen = 0
    try:
        for batch in tqdm(dataloader, desc="fisher", total=num_batches, disable=not progress):
            if num_batches is not None and seen == num_batches:
                break
            inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items() if k not in skip}
            loss = model(**inputs).loss
            gradients = torch.autograd.grad(loss, list(parameters.values()), allow_unused=True)
            # Kirkpatrick et al. 2017, eq. 3 uses F_i = E[(d log p / d theta_i)^2], estimated here from the loss's gradient
            for (name, _), gradient in zip(parameters.items(), gradients):
                if gradient is not None:
                    fisher[name] += gradient.detach().float().pow(2).cpu()
            seen += 1
    finally:
        model.train(was_training)
    if seen == 0:
        raise ValueError("`dataloader` yielded no batch: the Fisher needs at least one.")
    if num_batches is not None and seen < num_batches:
        logger.warning(f"`dataloader` yielded {seen} batches, fewer than `num_batches={num_batches}`; the Fisher averages {seen}.")
    return {name: value / seen for name, value in fisher.items()}


def _check_fisher_and_anchor(fisher: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor]) -> None:
    if not fisher:
        raise ValueError("`fisher` is empty: expected {parameter name: tensor}.")
    if set(fisher) != set(anchor):
        raise ValueError(
            f"`fisher` and `anchor` must name the same parameters; only in `fisher`: {sorted(set(fisher) - set(anchor))}, "
            f"only in `anchor`: {sorted(set(anchor) - set(fisher))}."
        )
    for name, value in fisher.items():
        if value.shape != anchor[name].shape:
            raise ValueError(f"`fisher[{name!r}]` has shape {tuple(value.shape)} but `anchor[{name!r}]` {tuple(anchor[name].shape)}.")
        if not torch.isfinite(value).all() or (value < 0).any():
            raise ValueError(f"`fisher[{name!r}]` must hold finite values >= 0 (a squared gradient).")


def is_fisher_file(path: Path) -> bool:
    """Whether `path` is a file `save_fisher` wrote (a safetensors file whose metadata says so)."""
    try:
        with safe_open(str(path), framework="pt") as file:
            return (file.metadata() or {}).get("content") == FISHER_FILE_CONTENT
    except (OSError, SafetensorError):  # not a safetensors file
        return False


def save_fisher(path: str | Path, fisher: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor]) -> Path:
    """Writes the Fisher and the anchor weights into one safetensors file, named `fisher.<parameter>` and
    `anchor.<parameter>`; returns the path. An existing `path` is replaced only when it is a Fisher file."""
    refuse_foreign_file(path, "path", description="a Fisher file", is_own=is_fisher_file)
    tensors = {f"{FISHER_PREFIX}{name}": value.detach().float().cpu().contiguous() for name, value in fisher.items()}
    tensors |= {f"{ANCHOR_PREFIX}{name}": value.detach().cpu().contiguous() for name, value in anchor.items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"format": "pt", "content": FISHER_FILE_CONTENT})
    return path


def load_fisher(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(fisher, anchor) from a file written by `save_fisher` (or `hf-vlalign fisher`)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"`path` must be a Fisher file written by `save_fisher` / `hf-vlalign fisher`, got {path} (no such file).")
    try:
        state = load_file(str(path))
    except SafetensorError as error:
        raise ValueError(f"`path` {path} is not a Fisher file written by `save_fisher` / `hf-vlalign fisher` ({error}).") from None
    other = sorted(key for key in state if not key.startswith((FISHER_PREFIX, ANCHOR_PREFIX)))
    if other:
        raise ValueError(f"Fisher state names must start with {FISHER_PREFIX!r} or {ANCHOR_PREFIX!r}; got {other[:5]}.")
    fisher = {key.removeprefix(FISHER_PREFIX): value for key, value in state.items() if key.startswith(FISHER_PREFIX)}
    anchor = {key.removeprefix(ANCHOR_PREFIX): value for key, value in state.items() if key.startswith(ANCHOR_PREFIX)}
    _check_fisher_and_anchor(fisher, anchor)
    return fisher, anchor


def check_fisher_matches(model: nn.Module, fisher: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor]) -> list[str]:
    """Raises a `ValueError` naming the Fisher entries that are not trainable parameters of `model` or whose shapes
    differ; returns the names of the trainable parameters the Fisher does not cover (EWC leaves them free)."""
    parameters = trainable_parameters(model)
    unknown = sorted(set(fisher) - set(parameters))
    if unknown:
        raise ValueError(
            f"`fisher` names {len(unknown)} parameters that are not trainable parameters of the {type(model).__name__}: "
            f"{unknown[:5]}{' ...' if len(unknown) > 5 else ''} (was it estimated for another model?)."
        )
    for name, value in fisher.items():
        if value.shape != parameters[name].shape:
            raise ValueError(f"`fisher[{name!r}]` has shape {tuple(value.shape)}, but the model's parameter has {tuple(parameters[name].shape)}.")
    return sorted(set(parameters) - set(fisher))


def ewc_penalty(
    model: nn.Module,
    fisher: Mapping[str, torch.Tensor],
    anchor: Mapping[str, torch.Tensor],
) -> torch.Tensor:
    """sum_i F_i (theta_i - theta*_i)^2 over the parameters named in `fisher`. Kirkpatrick et al. 2017, eq. 3 writes the
    penalty (lambda / 2) sum_i F_i (theta_i - theta*_i)^2; like the common EWC code (Avalanche's `EWCPlugin`,
    moskomule/ewc.pytorch) the 1/2 is left to the weight: the trainers' `ewc_weight` is the paper's lambda / 2. `fisher`
    and `anchor` are moved to each parameter's device (free when already there)."""
    parameters = trainable_parameters(model)
    penalty = None
    for name, importance in fisher.items():
        parameter = parameters[name]
        importance = importance.to(parameter.device)
        target = anchor[name].to(parameter.device, parameter.dtype)
        term = (importance * (parameter - target).float().pow(2)).sum()
        penalty = term if penalty is None else penalty + term
    return penalty


__all__ = [
    "anchor_weights",
    "check_fisher_matches",
    "distillation_loss",
    "distilled_fields",
    "estimate_fisher",
    "ewc_penalty",
    "load_fisher",
    "outputs_distillation_loss",
    "save_fisher",
]
