"""Trainer plumbing shared by every recipe (`ComponentLossTrainer`): each loss component logged under its own key (as
trl's trainers keep a `_metrics` dict), losses normalised by global item counts, seeded collation and exact resuming."""

from __future__ import annotations

import os
import random
from collections import defaultdict
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from safetensors import safe_open
from torch import nn
from torch.utils.data import get_worker_info
from transformers import Trainer, TrainingArguments
from transformers.trainer import OPTIMIZER_NAME, SCALER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME
from transformers.trainer_callback import TrainerState
from transformers.trainer_pt_utils import find_batch_size, nested_gather, safe_globals
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, unwrap_peft_model
from transformers.utils import logging

from ..data.feature_statistics import region_feature_statistics
from ..data.feature_store import RegionFeatureStore
from .regularization import check_fisher_matches, ewc_penalty, load_fisher, outputs_distillation_loss

logger = logging.get_logger(__name__)

# the automatic fit of the region-feature statistics reads at most this many training images (a seeded subset beyond)
FEATURE_STATISTICS_MAX_IMAGES = 10_000

# attention maps and hidden states of every model family
ATTENTION_KEYS = (
    "hidden_states",
    "attentions",
    "language_hidden_states",
    "vision_hidden_states",
    "language_attentions",
    "vision_attentions",
    "cross_encoder_attentions",
    "cross_encoder_vision_attentions",
)


@dataclass
class BatchPosition:
    """Where the training dataloader stands: its epoch and the index in that epoch of the next batch it collates."""

    epoch: int = 0
    next_batch: int = 0
    # calls of one copy of the collator (one per dataloader worker) since the epoch's iterator started
    calls: int = field(default=0, compare=False)


def collate_with_seed(collator: Callable[[list[Any]], Any], examples: list[Any], key: tuple[int, ...]) -> Any:
    """`collator(examples)` with the torch, numpy and Python random states seeded from `key` (a tuple of ints, which
    hashes the same in every process: no PYTHONHASHSEED salt), the caller's states put back afterwards."""
    seed = hash(key) % 2**32
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        try:
            return collator(examples)
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


class SeededCollator:
    """Runs `collator` with the random states seeded from (seed, epoch, batch index), the caller's put back. Why: a
    random collator (masks, swapped images) drawing from the global state could not resume exactly, since accelerate
    collates one batch ahead, skipped batches are never collated, and `Trainer` restores the random state only after the
    resumed epoch's first batches. Keyed by position, batch `i` of epoch `e` is the same in an interrupted and an
    uninterrupted run. With `W` dataloader workers, worker `w` collates batches `w, w + W, ...`."""

    def __init__(self, collator: Callable[[list[Any]], Any], seed: int, position: BatchPosition):
        self.collator = collator
        self.seed = seed
        self.position = position

    def __call__(self, examples: list[Any]) -> Any:
        worker = get_worker_info()
        worker_id, num_workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        index = self.position.next_batch + worker_id + num_workers * self.position.calls
        self.position.calls += 1
        return collate_with_seed(self.collator, examples, (self.seed, self.position.epoch, index))


def store_images_of(dataset) -> Any:
    """What `region_feature_statistics` reads a training set's images from: a `datasets.Dataset` itself, a list's
    `image_id`s; a ValueError for anything else (e.g. a stream, which is not read twice)."""
    import datasets

    if isinstance(dataset, datasets.Dataset):
        return dataset
    if isinstance(dataset, (list, tuple)) and all(isinstance(row, Mapping) and "image_id" in row for row in dataset):
        return [row["image_id"] for row in dataset]
    raise ValueError(f"a {type(dataset).__name__} training set does not list its images")


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The highest `checkpoint-N` folder of `output_dir` holding `trainer_state.json`; incomplete later ones (a save
    interrupted midway) are named in a warning and skipped."""
    folders = sorted(
        (path for path in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*") if path.is_dir() and path.name[11:].isdigit()),
        key=lambda path: int(path.name[11:]),
        reverse=True,
    )
    for folder in folders:
        if (folder / TRAINER_STATE_NAME).is_file():
            return str(folder)
        logger.warning(f"Skipping the incomplete checkpoint {folder} (no {TRAINER_STATE_NAME}: its save was interrupted).")
    return None


def checkpoint_file_problem(path: Path) -> str | None:
    """Why `Trainer` cannot read a file of a checkpoint ("ErrorType: first line of the error"), None when it can: a
    `trainer_state.json` as `TrainerState`, a safetensors file's header, a `*.pt` / `*.pth` state with
    `torch.load(weights_only=True)` and transformers' allow-list of the numpy states in `rng_state.pth`."""
    try:
        if path.suffix == ".json":
            TrainerState.load_from_json(str(path))
        elif path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt"):
                pass
        else:
            with safe_globals():
                torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any failure makes the file unusable; reported by name
        return first_line(error)
    return None


def first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"


def damaged_checkpoint_error(checkpoint: str | os.PathLike, files: str, problem: str) -> ValueError:
    return ValueError(
        f"`resume_from_checkpoint` {checkpoint}: cannot load {files} ({problem}); the file is truncated, damaged or "
        "of another run: resume from another checkpoint."
    )


@contextmanager
def naming_checkpoint_files(checkpoint: str | os.PathLike | None, patterns: tuple[str, ...]):
    """Re-raises a failure of the body, which loads the files of `checkpoint` matching `patterns`, as a ValueError
    naming the file that cannot be read (`checkpoint_file_problem`), or all of them when each reads but does not fit
    the run (e.g. a scheduler state of more parameter groups). The files are read again only after a failure."""
    try:
        yield
    except Exception as error:
        files = sorted({file for pattern in patterns for file in Path(checkpoint or ".").glob(pattern) if file.is_file()})
        if checkpoint is None or not files:
            raise
        for file in files:
            problem = checkpoint_file_problem(file)
            if problem is not None:
                raise damaged_checkpoint_error(checkpoint, str(file), problem) from error
        raise damaged_checkpoint_error(checkpoint, " / ".join(map(str, files)), first_line(error)) from error


@dataclass
class ComponentLossTrainingArguments(TrainingArguments):
    r"""
    [`TrainingArguments`] of [`ComponentLossTrainer`], and the base of every other trainer's arguments: knowledge
    distillation from a frozen teacher that sees the student's batch, and EWC (Kirkpatrick et al.'s lambda is twice
    `ewc_weight`), each added to the model's loss and logged under its own key (`loss_distill`, `loss_ewc`,
    unweighted; a weight of 0 logs it only). Trainable parameters the Fisher file does not cover are left free.
    """

    distill_from: str | None = field(
        default=None,
        metadata={
            "help": "Local folder of the teacher model of knowledge distillation (loaded with the student's class); "
            "adds distill_weight * loss_distill to the loss."
        },
    )
    distill_temperature: float = field(
        default=2.0, metadata={"help": "Softmax temperature (> 0) of the student's and the teacher's distributions."}
    )
    distill_weight: float = field(default=1.0, metadata={"help": "Weight (>= 0) of loss_distill (0: logged only)."})
    ewc_weight: float = field(
        default=0.0,
        metadata={
            "help": "Weight (>= 0) of the EWC penalty loss_ewc = sum F (theta - theta*)^2, half the lambda of "
            "Kirkpatrick et al.; needs --ewc_fisher."
        },
    )
    ewc_fisher: str | None = field(
        default=None,
        metadata={"help": "Fisher file of `hf-vlalign fisher` (Fisher and anchor weights) for the EWC penalty."},
    )

    def __post_init__(self):
        super().__post_init__()
        for name in ("distill_from", "ewc_fisher"):  # saved with the run as text
            if isinstance(getattr(self, name), os.PathLike):
                setattr(self, name, os.fspath(getattr(self, name)))
        check_bounds(self, distill_temperature=(">", 0), distill_weight=(">=", 0), ewc_weight=(">=", 0))
        if self.ewc_weight > 0 and self.ewc_fisher is None:
            raise ValueError(
                f"`ewc_weight={self.ewc_weight}` needs `ewc_fisher`: a Fisher file of `hf-vlalign fisher` (or `save_fisher`)."
            )


def check_bounds(args: TrainingArguments, **bounds: tuple[str, float]) -> None:
    """Refuses a setting of `args` outside its bound, given as `name=(">", 0)` or `name=(">=", 1)`; an unset (None)
    setting passes, a NaN does not."""
    for name, (relation, bound) in bounds.items():
        value = getattr(args, name)
        if value is not None and not (value > bound if relation == ">" else value >= bound):
            raise ValueError(f"`{name}` must be {relation} {bound}, got {value!r}.")


ArgumentsT = TypeVar("ArgumentsT", bound=TrainingArguments)


def as_training_arguments(args: TrainingArguments | None, args_class: type[ArgumentsT]) -> ArgumentsT:
    """`args` as an `args_class`: kept when it is one, rebuilt from its fields (`to_dict`, as trl's trainers convert a
    plain `TrainingArguments` into their config) when its class is `TrainingArguments` or a parent of `args_class`,
    `args_class(output_dir="tmp_trainer")` for None (as `Trainer`). Arguments of another trainer raise a ValueError
    naming the settings `args_class` lacks."""
    if args is None:
        return args_class(output_dir="tmp_trainer")
    if isinstance(args, args_class):
        return args
    expected = f"`args` must be {args_class.__name__} or a TrainingArguments to convert into it"
    if not isinstance(args, TrainingArguments):
        raise ValueError(f"{expected}, got {type(args).__name__}.")
    known = {item.name for item in fields(args_class) if item.init}
    foreign = sorted(item.name for item in fields(args) if item.init and item.name not in known)
    if foreign:
        raise ValueError(f"{expected}, got {type(args).__name__}, whose settings {foreign} it does not have.")
    values = args.to_dict()
    for name in values:
        if name.endswith("_token"):
            values[name] = getattr(args, name)  # `to_dict` hides the tokens
    return args_class(**values)


class ComponentLossTrainer(Trainer):
    """A `Trainer` whose model output carries loss components (`loss_component_keys`), each logged separately.

    Before each optimizer step the model's `loss_item_counts` are summed over the step's micro-batches and processes
    and passed to the forward as `global_item_counts`, so the gradient equals that of one process over the global
    batch (as transformers' `Trainer` counts label tokens, for every loss); a model without them keeps per-batch means.
    Training batches are collated by `SeededCollator`. The settings are an `args_class` (a plain `TrainingArguments`
    is converted into it).

    Every reported loss is the same under N processes and gradient accumulation as in one process with the same
    global batch: `train_loss` and each logged component are means over the optimizer steps, over every process;
    `eval_loss` and each evaluation component are means over the evaluation set's examples (each batch's loss, a mean
    over its global counts, weighted by its examples; the examples accelerate repeats to complete the last batch of a
    multi-process evaluation left out), so `eval_loss` is the weighted sum of its components. A loss that is a mean
    over examples (a task loss) is then the evaluation set's mean whatever the batch size.
    """

    # the class of the trainer's `args`, which holds its own settings
    args_class: type[ComponentLossTrainingArguments] = ComponentLossTrainingArguments
    # the loss components: each is logged under the name of the model-output field it is read from
    loss_component_keys: tuple[str, ...] = ()
    # batch entries used by evaluation tools but not taken by the model's forward
    non_model_keys: tuple[str, ...] = ()
    # model outputs that are not predictions (large per-token tensors); never gathered at evaluation
    non_prediction_keys: tuple[str, ...] = ()
    # model outputs logged as they are (per-batch statistics, not losses normalised by `global_item_counts`)
    metric_keys: tuple[str, ...] = ()

    def __init__(self, model: nn.Module | None = None, args: TrainingArguments | None = None, *trainer_args, **kwargs):
        super().__init__(model, as_training_arguments(args, self.args_class), *trainer_args, **kwargs)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        # each recorded value's weight in its window's mean (`_record`)
        self._metric_weights = {"train": defaultdict(list), "eval": defaultdict(list)}
        # (real examples of this process's evaluation batch, of the global batch), set by `prediction_step`
        self._eval_batch_rows: tuple[int, int] | None = None
        self._batch_position = BatchPosition()
        # each loss's item count over the current optimizer step's micro-batches and processes (`get_batch_samples`)
        self._step_item_counts: dict[str, torch.Tensor] | None = None
        self.distill_teacher = self.ewc_fisher = self.ewc_anchor = None
        if self.args.distill_from is not None:  # loaded with the student's class, frozen, in eval mode
            if not Path(self.args.distill_from).is_dir():
                raise ValueError(f"`distill_from` must be a local folder of a saved model, got {self.args.distill_from!r} (no such folder).")
            teacher = type(self.model).from_pretrained(self.args.distill_from).requires_grad_(False)
            self.distill_teacher = teacher.eval().to(self.args.device)
        if self.args.ewc_fisher is not None:
            self.ewc_fisher, self.ewc_anchor = load_fisher(self.args.ewc_fisher)
            uncovered = check_fisher_matches(self.model, self.ewc_fisher, self.ewc_anchor)
            if uncovered:
                logger.warning(f"`ewc_fisher` covers no Fisher for {len(uncovered)} trainable parameters (EWC leaves them free): {uncovered[:5]}")

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """`Trainer.train`; `resume_from_checkpoint=True` resumes from the last *complete* checkpoint of
        `args.output_dir` (one whose `trainer_state.json`, the last file a checkpoint save writes, is there), so a run
        killed while saving resumes from the checkpoint before instead of failing on the half-written one."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"`resume_from_checkpoint=True` found no complete checkpoint in {self.args.output_dir}.")
        if isinstance(resume_from_checkpoint, (str, os.PathLike)):
            state_file = Path(resume_from_checkpoint, TRAINER_STATE_NAME)
            problem = checkpoint_file_problem(state_file) if state_file.is_file() else None
            if problem is not None:
                raise damaged_checkpoint_error(resume_from_checkpoint, str(state_file), problem)
        self.fit_visual_feature_statistics()
        return super().train(resume_from_checkpoint, *args, **kwargs)

    # resuming: a file that fails to load is named (`naming_checkpoint_files`)
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        with naming_checkpoint_files(resume_from_checkpoint, ("*.safetensors",)):
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        with naming_checkpoint_files(checkpoint, (OPTIMIZER_NAME, SCHEDULER_NAME, SCALER_NAME)):
            super()._load_optimizer_and_scheduler(checkpoint)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        with naming_checkpoint_files(checkpoint, ("rng_state*.pth",)):
            super()._load_rng_state(checkpoint)

    def fit_visual_feature_statistics(self) -> None:
        """Before training: a model that standardises its region features and has no statistics yet gets those of the
        training images in the collator's store (`region_feature_statistics`: the same on every process; at most
        `FEATURE_STATISTICS_MAX_IMAGES` images). Statistics already set are kept; a resumed run loads the checkpoint's.
        """
        model = unwrap_peft_model(self.accelerator.unwrap_model(self.model))
        statistics = model.visual_feature_statistics() if hasattr(model, "visual_feature_statistics") else None
        if statistics is None or statistics["num_regions"] > 0:
            return
        store = getattr(self.data_collator, "region_features", None)
        if not isinstance(store, RegionFeatureStore) or self.train_dataset is None:
            logger.warning(
                "The model standardises its region features but has no statistics, and the data collator has no "
                "region-feature store (`region_features`) to compute them from: features are read as they are. Call "
                "`model.set_visual_feature_statistics(*region_feature_statistics(store, train_rows))` before training."
            )
            return
        try:
            images = store_images_of(self.train_dataset)
            mean, std, count = region_feature_statistics(store, images, max_images=FEATURE_STATISTICS_MAX_IMAGES)
        except ValueError as error:
            logger.warning(f"Region-feature statistics from every image of the store: the training rows name no store image ({error}).")
            mean, std, count = region_feature_statistics(store, max_images=FEATURE_STATISTICS_MAX_IMAGES)
        model.set_visual_feature_statistics(mean, std, count)
        logger.info(f"Region-feature statistics set from {count} regions of the training images (feature standardisation).")

    def get_train_dataloader(self):
        collator = self.data_collator
        self.data_collator = SeededCollator(collator, self.args.seed, self._batch_position)
        try:
            return super().get_train_dataloader()
        finally:
            self.data_collator = collator

    def _run_epoch(self, *args, **kwargs):
        # `Trainer._inner_training_loop` passes every argument by keyword; on resume, the first epoch skips batches
        # that are never collated, so the batch index starts after them
        epoch = kwargs["epoch"]
        resumed = kwargs["resume_from_checkpoint"] is not None and epoch == kwargs["epochs_trained"]
        skipped = kwargs["steps_trained_in_current_epoch"] if resumed and not self.args.ignore_data_skip else 0
        self._batch_position.epoch, self._batch_position.next_batch, self._batch_position.calls = epoch, skipped, 0
        return super()._run_epoch(*args, **kwargs)

    def model_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The entries of a batch that the model's forward takes (`non_model_keys` left out)."""
        return {key: value for key, value in inputs.items() if key not in self.non_model_keys}

    def batch_item_counts(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor] | None:
        """The items each loss averages over in one batch: the model's `loss_item_counts` (None without it)."""
        model = unwrap_peft_model(self.accelerator.unwrap_model(self.model))
        if not hasattr(model, "loss_item_counts"):
            return None
        return model.loss_item_counts(self.model_inputs(inputs))

    def global_item_counts(self, batches: list[Mapping[str, Any]], counted: bool = True) -> dict[str, torch.Tensor] | None:
        """`batch_item_counts` summed over `batches` (an optimizer step's micro-batches) and over processes (a
        collective: every process calls it at the same point); `counted=False`: this process's batches count nothing.
        The keys are the same in every process (they depend on the model's config only)."""
        per_batch = [self.batch_item_counts(batch) for batch in batches]
        if not per_batch or per_batch[0] is None or not per_batch[0]:
            return None
        keys = sorted(per_batch[0])
        # a count on the CPU is copied without waiting: a blocking copy would synchronise at every optimizer step
        device = self.args.device
        local = torch.stack([
            sum(torch.as_tensor(counts[key]).to(device, non_blocking=True).reshape(()).long() for counts in per_batch)
            for key in keys
        ])  # fmt: skip
        if not counted:
            local = torch.zeros_like(local)
        totals = self.accelerator.reduce(local, reduction="sum") if self.accelerator.num_processes > 1 else local
        return dict(zip(keys, totals))

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._step_item_counts = self.global_item_counts(batches)  # read by the step's `compute_loss` calls
        return batches, num_items_in_batch

    def evaluation_item_counts(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor] | None:
        """`global_item_counts` of one evaluation batch over every process; a process whose rows are all repeats
        (`_eval_batch_rows`) counts nothing."""
        return self.global_item_counts([inputs], counted=self._eval_batch_rows is None or self._eval_batch_rows[0] > 0)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        model_inputs = self.model_inputs(inputs)
        # training: the step's counts; evaluation: this batch over every process
        counts = self._step_item_counts if model.training else self.evaluation_item_counts(model_inputs)
        if counts is not None:
            model_inputs["global_item_counts"] = counts
        outputs = model(**model_inputs)
        mode = "train" if model.training else "eval"
        loss = self._scale_to_global(mode, outputs.loss, outputs, counts is not None)
        regularization = self._regularization(mode, model, model_inputs, outputs, counts is not None)
        if mode == "eval":
            self._record_evaluation_loss(loss, counts is not None, regularization)
        return (loss + regularization, outputs) if return_outputs else loss + regularization

    def _scale_to_global(self, mode: str, loss: torch.Tensor, outputs: Mapping, global_counts: bool) -> torch.Tensor:
        """With global counts, each process's loss is its share of the global mean: DDP (like FSDP and DeepSpeed)
        averages gradients over processes, so the share is multiplied by their number, and the shares of a step's
        micro-batches add up (the Trainer must not divide by the accumulation steps again). Logs each component as the
        mean over the global batch."""
        self.loss_is_scaled_for_ga = global_counts
        processes = self.accelerator.num_processes if global_counts else 1
        # a micro-batch's share times the micro-batches of its step: the logging window's mean is the steps' mean
        micro_batches = self.current_gradient_accumulation_steps if global_counts and mode == "train" else 1
        for key in self.loss_component_keys:
            value = outputs.get(key)
            if value is not None:
                self._record_loss(mode, key, value * processes * micro_batches, global_counts)
        for key in self.metric_keys:
            value = outputs.get(key)
            if value is not None:
                self._record_loss(mode, key, value, False)
        return loss * processes

    def _regularization(self, mode: str, model, model_inputs: dict, outputs, global_counts: bool) -> torch.Tensor | float:
        """The distillation and EWC terms, weighted. They are per-batch quantities: with global counts, where the
        Trainer does not divide by the accumulation steps, each micro-batch carries its share."""
        micro_batches = self.current_gradient_accumulation_steps if global_counts and mode == "train" else 1
        model_inputs = {key: value for key, value in model_inputs.items() if key != "global_item_counts"}
        total = 0.0
        if self.distill_teacher is not None:
            loss_distill = self._distillation_loss(model, model_inputs, outputs)
            self._record_loss(mode, "loss_distill", loss_distill, False)
            total = total + self.args.distill_weight * loss_distill / micro_batches
        if self.ewc_fisher is not None:
            loss_ewc = self._ewc_penalty(model)
            self._record_loss(mode, "loss_ewc", loss_ewc, False)
            total = total + self.args.ewc_weight * loss_ewc / micro_batches
        return total

    def _record(self, mode: str, key: str, value: torch.Tensor | float, weight: float = 1.0) -> None:
        """Appends a loss component (or a number), already multiplied by its `weight` in the window's mean, and the
        weight to the logging window. It stays on the device: the window is summed over processes and read on the host
        once, when it is logged, so a step reads nothing."""
        if isinstance(value, torch.Tensor):
            value = value.detach().reshape(()).float()
        self._metrics[mode][key].append(value)
        self._metric_weights[mode][key].append(weight)

    def _evaluation_share(self, value: torch.Tensor | float, global_counts: bool) -> tuple[torch.Tensor | float, int]:
        """(an evaluation batch's `value` times the batch's weight, the weight): `value` is this process's share of the
        global batch's mean times the processes (as `_scale_to_global` makes it) with `global_counts`, else a mean
        over this process's rows; the weight is the process's real rows (`_eval_batch_rows`). Summed over processes
        and batches and divided by the summed weights, this is the mean over the evaluation set's examples of each
        batch's loss."""
        local_rows, global_rows = self._eval_batch_rows
        if local_rows == 0:  # every row repeats one of another process
            return value * 0, 0
        return (value * global_rows / self.accelerator.num_processes if global_counts else value * local_rows), local_rows

    def _record_loss(self, mode: str, key: str, value: torch.Tensor | float, global_counts: bool) -> None:
        """Records a loss of one batch: in training as it is (the logging window's mean is the steps' mean), in
        evaluation weighted by the batch's examples (`_evaluation_share`)."""
        if mode == "train" or self._eval_batch_rows is None:
            self._record(mode, key, value)
        else:
            self._record(mode, key, *self._evaluation_share(value, global_counts))

    def _record_evaluation_loss(self, loss: torch.Tensor, global_counts: bool, regularization: torch.Tensor | float = 0.0) -> None:
        """Records an evaluation batch's total loss under `loss` (read as `eval_loss` by `evaluation_loop`): `loss`
        as `_scale_to_global` returns it plus the per-batch `regularization` terms, weighted as its components."""
        if self._eval_batch_rows is None:
            self._record("eval", "loss", loss + regularization)
            return
        value, weight = self._evaluation_share(loss, global_counts)
        self._record("eval", "loss", value + self._evaluation_share(regularization, False)[0], weight)

    def _clear_window(self, mode: str) -> None:
        self._metrics[mode].clear()
        self._metric_weights[mode].clear()

    def _window_means(self, mode: str) -> dict[str, float]:
        """Each logged key's weighted mean over the window's values of every process (one collective for all keys)."""
        windows = {key: values for key, values in sorted(self._metrics[mode].items()) if values}
        if not windows:
            return {}
        device = self.args.device
        sums = [torch.stack([torch.as_tensor(value, dtype=torch.float32, device=device) for value in values]).sum() for values in windows.values()]
        weights = [float(sum(self._metric_weights[mode][key])) for key in windows]
        totals = torch.stack([torch.stack(sums), torch.tensor(weights, device=device)])
        if self.accelerator.num_processes > 1:
            totals = self.accelerator.reduce(totals, reduction="sum")
        return dict(zip(windows, (totals[0] / totals[1].clamp(min=1)).tolist()))

    def _distillation_loss(self, model, model_inputs: dict, outputs) -> torch.Tensor:
        device = next(model.parameters()).device
        if next(self.distill_teacher.parameters()).device != device:
            self.distill_teacher.to(device)
        with torch.no_grad():
            teacher_outputs = self.distill_teacher(**model_inputs)
        return outputs_distillation_loss(outputs, teacher_outputs, self.args.distill_temperature, labels=model_inputs.get("labels"))

    def _ewc_penalty(self, model) -> torch.Tensor:
        student = self.accelerator.unwrap_model(model)
        device = next(student.parameters()).device
        if next(iter(self.ewc_fisher.values())).device != device:  # moved once, not every step
            self.ewc_fisher = {name: value.to(device) for name, value in self.ewc_fisher.items()}
            self.ewc_anchor = {name: value.to(device) for name, value in self.ewc_anchor.items()}
        return ewc_penalty(student, self.ewc_fisher, self.ewc_anchor)

    def evaluation_real_rows(self, inputs: Mapping[str, Any]) -> tuple[int, int]:
        """(the real examples of this process's evaluation batch, of the global batch). Accelerate completes the last
        batch of a multi-process evaluation with repeats of the first examples (all processes' batches the same size);
        `gather_for_metrics` keeps the global batch's first `remainder` rows, in process order."""
        size = find_batch_size(inputs)
        processes = self.accelerator.num_processes
        state = self.accelerator.gradient_state
        if processes == 1 or not state.end_of_dataloader or state.remainder <= 0:
            return size, size * processes
        return min(size, max(state.remainder - self.accelerator.process_index * size, 0)), state.remainder

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        # predictions are the task logits only: loss components and attention maps are not gathered
        ignore_keys = list(ignore_keys or []) + [*self.loss_component_keys, *self.non_prediction_keys, *ATTENTION_KEYS]
        real_rows, global_rows = self.evaluation_real_rows(inputs)
        size = find_batch_size(inputs)
        try:
            if real_rows == size:
                self._eval_batch_rows = (real_rows, global_rows)
                return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
            # repeated rows: the predictions of every row (`gather_for_metrics` drops the repeats), the loss and its
            # components of the real rows only (a process with none runs one row, weighted 0, for the collectives)
            logits = labels = None
            if not prediction_loss_only:
                self._eval_batch_rows = (0, global_rows)
                _, logits, labels = super().prediction_step(model, inputs, False, ignore_keys=ignore_keys)
            self._eval_batch_rows = (real_rows, global_rows)
            loss, _, _ = super().prediction_step(model, first_rows(inputs, max(real_rows, 1), size), True, ignore_keys)
            return loss, logits, labels
        finally:
            self._eval_batch_rows = None

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"):
        """`Trainer.evaluation_loop` whose `{metric_key_prefix}_loss` and loss components are means over the
        evaluation set's examples (`prediction_step`, `_evaluation_share`): the same for any number of processes.
        (`Trainer`'s own weights each process's loss, only its share of the batch's, by the batch size, and the
        repeats of the last batch enter the counts.)"""
        self._clear_window("eval")
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        for key, mean in self._window_means("eval").items():
            output.metrics[f"{metric_key_prefix}_{key}"] = mean
        self._clear_window("eval")
        return output

    def _finalize_training(self, *args, **kwargs):
        # the loss since the last log, averaged over processes as `_maybe_log_save_evaluate` does: `Trainer` adds this
        # process's own to `train_loss`, which is one process's share of the global mean
        self._tr_loss = nested_gather(self._tr_loss, self.args.parallel_mode).mean()
        return super()._finalize_training(*args, **kwargs)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if "loss" in logs or not any(key.startswith("eval_") for key in logs) else "eval"
        prefix = "eval_" if mode == "eval" else ""
        for key, mean in self._window_means(mode).items():
            logs[f"{prefix}{key}"] = mean
        self._clear_window(mode)
        super().log(logs, start_time)


def first_rows(batch: Mapping[str, Any], count: int, size: int) -> dict[str, Any]:
    """The first `count` rows of a batch of `size` rows: every tensor and list whose first dimension is the batch's."""
    return {key: value[:count] if batch_major(value, size) else value for key, value in batch.items()}


def batch_major(value: Any, size: int) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() > 0 and value.shape[0] == size
    return isinstance(value, (list, tuple)) and len(value) == size

