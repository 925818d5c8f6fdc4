"""`CaptioningTrainer`: the region captioner trained with cross-entropy on the aligned attention, the A2 mask networks
trained on their own objective (Fei, eq. 4) in alternation, and optional self-critical sequence training (Rennie et
al. 2017: CIDEr-D reward, greedy baseline) after cross-entropy."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from transformers.utils import logging

from ..data.collators import PROBE_KEYS
from ..metrics.captioning import cider_d_per_caption
from ..utils.item_counts import mean_over_items
from .base import ComponentLossTrainer, ComponentLossTrainingArguments, check_bounds, naming_checkpoint_files
from .head_learning_rate import separate_parameter_groups

# besides the probe targets and references: the captions' word-region alignment, read by the decoder-grounding probe
# (`evaluate_decoder_grounding`), never by the captioner, whose forward refuses keys it does not use
CAPTION_NON_MODEL_KEYS = (*PROBE_KEYS, "references", "word_region_alignment", "phrase_masks")
# the A2 mask networks' Adam state, saved in every checkpoint folder next to the captioner's `optimizer.pt`
MASK_OPTIMIZER_NAME = "mask_optimizer.pt"

logger = logging.get_logger(__name__)


@dataclass
class CaptioningTrainingArguments(ComponentLossTrainingArguments):
    r"""
    [`ComponentLossTrainingArguments`] of [`CaptioningTrainer`]: the A2 mask step, self-critical training (needs the
    trainer's `processing_class` and a collator returning `references`; `scst_learning_rate`, e.g. 5e-6 as the A2
    paper's SCST stage, replaces the scheduler's value) and the region encoder's learning rate: on the synthetic scenes
    an encoder at the decoder's 5e-4 collapses its outputs to one vector within 100 steps and the captioner ignores the
    image; at a third of it the image is used (`examples/train_captioning.py` sets 1.5e-4).
    """

    mask_update_every: int = field(default=1, metadata={"help": "Captioner steps per A2 mask step (1: every step)."})
    mask_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the A2 mask networks (default: --learning_rate)."}
    )
    scst_start_epoch: float | None = field(
        default=None,
        metadata={"help": "Epoch from which training is self-critical (CIDEr-D reward, greedy baseline); default: never."},
    )
    scst_learning_rate: float | None = field(
        default=None,
        metadata={"help": "Fixed learning rate during self-critical training (default: the scheduler's, continued)."},
    )
    scst_max_new_tokens: int = field(
        default=20, metadata={"help": "Length of the sampled and greedy captions of self-critical training."}
    )
    encoder_learning_rate: float | None = field(
        default=None,
        metadata={"help": "Peak learning rate of the region encoder (default: --learning_rate)."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_bounds(
            self, mask_update_every=(">=", 1), mask_learning_rate=(">", 0), scst_start_epoch=(">=", 0),
            scst_learning_rate=(">", 0), scst_max_new_tokens=(">=", 1), encoder_learning_rate=(">", 0),
        )  # fmt: skip


class CaptioningTrainer(ComponentLossTrainer):
    """Trainer for `RegionCaptionerForConditionalGeneration`; logs `loss_caption`, `loss_mask`, `mask_mean` and, with
    self-critical training, `loss_scst` and `reward`. Its settings are [`CaptioningTrainingArguments`].

    With `attention_alignment` in the model's config, every `args.mask_update_every` captioner steps one mask step runs
    first over the step's micro-batches: the mask objective (eq. 4), normalised by the step's global caption-token
    count, is differentiated with respect to the mask networks only, summed over micro-batches and processes and
    stepped by their own Adam optimiser (the captioner's never holds them), so N processes update the masks as one
    process over the global batch does. The training step count is the `s` of the fusion (eq. 8). Resuming is exact:
    the masks' Adam state is saved in each checkpoint (`mask_optimizer.pt`), the rest read from the `TrainerState`.
    """

    args_class = CaptioningTrainingArguments
    loss_component_keys = ("loss_caption", "loss_mask", "loss_scst")
    metric_keys = ("mask_mean",)
    non_model_keys = CAPTION_NON_MODEL_KEYS
    non_prediction_keys = (
        "cache", "encoder_last_hidden_state", "encoder_hidden_states", "decoder_hidden_states", "aligned_cross_attentions",
        "encoder_attentions", "decoder_attentions",
    )  # fmt: skip

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.args.scst_start_epoch is not None and self.processing_class is None:
            raise ValueError("`scst_start_epoch` needs the trainer's `processing_class`: the tokenizer that decodes the sampled captions.")
        self.label_names = ["labels"]
        # a PEFT-wrapped captioner: the mask networks' trainable copies (peft's `modules_to_save`), not the originals
        self._captioner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        self._mask_parameters = [p for p in self._captioner.mask_parameters() if p.requires_grad]
        self.mask_optimizer = None
        self._pending_mask_step = None
        if self._mask_parameters:
            learning_rate = self.args.mask_learning_rate or self.args.learning_rate
            self.mask_optimizer = torch.optim.Adam(self._mask_parameters, lr=learning_rate)

    def create_optimizer(self, model=None):
        # the captioner's optimiser leaves the mask networks to the mask objective
        for parameter in self._mask_parameters:
            parameter.requires_grad_(False)
        try:
            optimizer = super().create_optimizer(model) if model is not None else super().create_optimizer()
        finally:
            for parameter in self._mask_parameters:
                parameter.requires_grad_(True)
        if self.args.encoder_learning_rate is not None:
            encoder = self.accelerator.unwrap_model(model if model is not None else self.model).get_encoder()
            separate_parameter_groups(optimizer, list(encoder.parameters()), self.args.encoder_learning_rate)
        return optimizer

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        if self.mask_optimizer is not None and self.args.should_save:
            torch.save(self.mask_optimizer.state_dict(), os.path.join(output_dir, MASK_OPTIMIZER_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or self.mask_optimizer is None:
            return
        path = os.path.join(checkpoint, MASK_OPTIMIZER_NAME)
        if not os.path.isfile(path):
            logger.warning(f"{checkpoint} holds no {MASK_OPTIMIZER_NAME}: the A2 mask optimiser restarts from scratch.")
            return
        # every process loads the same state (the mask networks are replicated); Adam moves it to the parameters' device
        with naming_checkpoint_files(checkpoint, (MASK_OPTIMIZER_NAME,)):
            self.mask_optimizer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))

    def batch_item_counts(self, inputs):
        counts = super().batch_item_counts(inputs)
        # self-critical training averages over the captions (one per image of the batch)
        visual_feats = inputs["visual_feats"]
        return {**counts, "captions": torch.full((), visual_feats.shape[0], device=visual_feats.device)}

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        if batches and self.mask_optimizer is not None and self.state.global_step % self.args.mask_update_every == 0:
            # run by the step's first `training_step`: a resumed Trainer restores the random state in between
            self._pending_mask_step = (batches, self._step_item_counts)
        return batches, num_items_in_batch

    def training_step(self, model, inputs, num_items_in_batch=None):
        self._captioner.model.alignment_step.fill_(self.state.global_step)  # s of eq. (8)
        if self._pending_mask_step is not None:
            batches, counts = self._pending_mask_step
            self._pending_mask_step = None
            self._mask_step(batches, counts)
        if self.args.scst_learning_rate is not None and self.scst_enabled and self.optimizer is not None:
            # set before every optimizer step: the scheduler's step after it writes its own value back
            for group in self.optimizer.param_groups:
                group["lr"] = self.args.scst_learning_rate
        return super().training_step(model, inputs, num_items_in_batch)

    def _mask_step(self, batches: list[dict], counts: dict[str, torch.Tensor]) -> None:
        """One update of the mask networks on eq. (4) over an optimizer step's micro-batches; the captioner's
        parameters receive no gradient from it. Each micro-batch's objective is its share of the global one (divided
        by the step's global caption-token count), so the shares' gradients are summed over micro-batches and
        processes."""
        gradients, loss_mask = self._mask_gradients(batches, counts)
        processes = self.accelerator.num_processes
        for parameter, gradient in zip(self._mask_parameters, gradients):
            parameter.grad = self.accelerator.reduce(gradient, reduction="sum") if processes > 1 else gradient
        self.mask_optimizer.step()
        self.mask_optimizer.zero_grad(set_to_none=True)
        self._record("train", "loss_mask", loss_mask * processes)  # logged as the sum over processes

    def _mask_gradients(self, batches: list[dict], counts: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The gradients of eq. (4) with respect to the mask networks, summed over the micro-batches, and the summed
        objective."""
        captioner = self.accelerator.unwrap_model(self.model_wrapped).train()
        gradients = [torch.zeros_like(parameter) for parameter in self._mask_parameters]
        loss_mask = torch.zeros((), device=self.args.device)
        for batch in batches:
            model_inputs = self.model_inputs(self._prepare_inputs(batch))
            outputs = captioner(**model_inputs, alignment_mode="perturb", global_item_counts=counts)
            for total, gradient in zip(gradients, torch.autograd.grad(outputs.loss_mask, self._mask_parameters)):
                total += gradient
            loss_mask += outputs.loss_mask.detach()
        return gradients, loss_mask

    @property
    def scst_enabled(self) -> bool:
        return self.args.scst_start_epoch is not None and (self.state.epoch or 0.0) >= self.args.scst_start_epoch

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and self.scst_enabled:
            counts = self._step_item_counts
            loss, outputs = self._self_critical_loss(model, inputs, counts)
            loss = self._scale_to_global("train", loss, {"loss_scst": loss}, counts is not None)
            return (loss, outputs) if return_outputs else loss
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _self_critical_loss(self, model, inputs, counts):
        """-(CIDEr-D(sample) - CIDEr-D(greedy)) * log p(sample), averaged over the captions (Rennie et al. 2017, eq. 9)
        of the batch, or of the global batch with `counts`. Returns (loss, outputs)."""
        references = inputs["references"]
        captioner = self.accelerator.unwrap_model(model)
        regions = {k: inputs[k] for k in ("visual_feats", "visual_boxes", "visual_attention_mask")}
        generate = {"max_new_tokens": self.args.scst_max_new_tokens, "use_cache": True}
        with torch.no_grad():
            captioner.eval()
            greedy = captioner.generate(**regions, do_sample=False, **generate)
            captioner.train()
            sampled = captioner.generate(**regions, do_sample=True, top_k=0, **generate)
        decode = self.processing_class.batch_decode
        reward = torch.tensor(cider_d_per_caption(decode(sampled, skip_special_tokens=True), references))
        baseline = torch.tensor(cider_d_per_caption(decode(greedy, skip_special_tokens=True), references))
        advantage = (reward - baseline).to(inputs["visual_feats"].device)
        labels = sampled_labels(sampled, captioner.config.eos_token_id, captioner.config.pad_token_id)
        outputs = model(**regions, labels=labels)
        token_log_probs = torch.log_softmax(outputs.logits, dim=-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        sequence_log_probs = (token_log_probs * (labels != -100)).sum(-1)
        captions = counts["captions"] if counts is not None else labels.shape[0]
        loss = mean_over_items(-(advantage * sequence_log_probs).sum(), captions)
        self._record("train", "reward", reward.mean().to(advantage.device))
        return loss, outputs


def sampled_labels(sequences: torch.Tensor, eos_token_id: int, pad_token_id: int) -> torch.Tensor:
    """Generated sequences ([start] w1 ... [end] pad ...) -> labels (w1 ... [end], -100 after the first [end])."""
    labels = sequences[:, 1:].clone()
    ended_before = (labels == eos_token_id).long().cumsum(-1) - (labels == eos_token_id).long() > 0
    return labels.masked_fill(ended_before | (labels == pad_token_id), -100)
