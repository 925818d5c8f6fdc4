"""The private transformers methods hf_vlalign overrides, where no public hook does the job: each still exists with the
parameters the override reads, so an upgrade of transformers that renames or reshapes one fails here, by name, not
somewhere inside a training run. A new private override must be listed (and justified) below."""

import inspect

import pytest
import transformers
from transformers import PreTrainedModel, Trainer

import hf_vlalign
from hf_vlalign import trainers
from hf_vlalign.models.saving import SaveLoadMixin

# (transformers class, method, the parameters the override passes or reads, why no public hook does it)
PRIVATE_OVERRIDES = {
    (Trainer, "_run_epoch"): (
        ("epoch", "resume_from_checkpoint", "epochs_trained", "steps_trained_in_current_epoch"),
        "the seeded collation needs each epoch's index and the batches a resume skips before any is collated",
    ),
    (Trainer, "_save_optimizer_and_scheduler"): (
        ("output_dir",),
        "the A2 mask optimiser's state is saved beside the optimiser's, in every checkpoint",
    ),
    (Trainer, "_load_optimizer_and_scheduler"): (
        ("checkpoint",),
        "and loaded beside it on resume; a state file that fails to load is named",
    ),
    (Trainer, "_load_from_checkpoint"): (
        ("resume_from_checkpoint", "model"),
        "a damaged weights file of the checkpoint is named, not reported as a bare SafetensorError",
    ),
    (Trainer, "_load_rng_state"): (
        ("checkpoint",),
        "a damaged random-state file is named",
    ),
    (Trainer, "_finalize_training"): (
        ("trial", "num_train_samples", "start_time"),
        "`train_loss` adds this process's loss since the last log (`_tr_loss`), one process's share of the global mean: "
        "it is averaged over the processes first, as each log step does",
    ),
    (PreTrainedModel, "_finalize_model_loading"): (
        ("model", "load_config", "loading_info"),
        "a checkpoint that does not fit the config must raise naming the keys before transformers initialises them",
    ),
}


# underscore names transformers documents for model classes to define (the modeling files' contract)
DOCUMENTED_HOOKS = {"_init_weights"}


def overridden_private_methods() -> set[tuple[type, str]]:
    """(transformers base class, name) of every `_name` method an hf_vlalign Trainer or model class redefines."""
    classes = [getattr(trainers, name) for name in trainers.__all__ if isinstance(getattr(trainers, name), type)]
    classes += [getattr(hf_vlalign, name) for name in hf_vlalign.__all__ if isinstance(getattr(hf_vlalign, name), type)]
    found = set()
    for cls in classes:
        for base in (Trainer, PreTrainedModel):
            if not issubclass(cls, base):
                continue
            for klass in cls.__mro__:
                if not klass.__module__.startswith("hf_vlalign"):
                    continue
                for name, value in vars(klass).items():
                    private = name.startswith("_") and not name.startswith("__") and name not in DOCUMENTED_HOOKS
                    if private and callable(getattr(value, "__func__", value)) and hasattr(base, name):
                        found.add((base, name))
    return found


def test_every_private_override_is_listed():
    assert overridden_private_methods() == set(PRIVATE_OVERRIDES)


@pytest.mark.parametrize("override", sorted(PRIVATE_OVERRIDES, key=lambda item: item[1]), ids=lambda item: item[1])
def test_the_overridden_transformers_method_still_takes_what_the_override_reads(override):
    base, name = override
    parameters, _ = PRIVATE_OVERRIDES[override]
    method = inspect.getattr_static(base, name, None)
    assert method is not None, f"transformers {transformers.__version__} has no {base.__name__}.{name}"
    signature = inspect.signature(getattr(base, name))
    missing = [parameter for parameter in parameters if parameter not in signature.parameters]
    assert not missing, f"{base.__name__}.{name}{signature} no longer takes {missing} (transformers {transformers.__version__})"


def test_the_loading_hook_is_a_static_method_and_the_mixin_overrides_it():
    assert isinstance(inspect.getattr_static(PreTrainedModel, "_finalize_model_loading"), staticmethod)
    assert isinstance(inspect.getattr_static(SaveLoadMixin, "_finalize_model_loading"), staticmethod)


def test_the_trainer_calls_the_epoch_hook_by_keyword():
    # the override reads its arguments from **kwargs: a positional call would raise a KeyError inside training
    source = inspect.getsource(Trainer._inner_training_loop)
    assert "self._run_epoch(" in source
    call = source[source.index("self._run_epoch(") :].split(")", 1)[0]
    assert all(f"{name}=" in call for name in PRIVATE_OVERRIDES[(Trainer, "_run_epoch")][0]), call
