"""`SaveLoadMixin`: atomic `save_pretrained` and loud weight loading, shared by the three model families.

A save is written into a staging sibling folder, completed with the target's other files (hard links) and swapped with
the target as a whole (`utils/atomic_folders.py`): a kill at any instant leaves the previous complete checkpoint or the
new one. Loading refuses with a [`CheckpointMismatchError`] what transformers only logs (another model type, no shared
weight name, fewer layers than the checkpoint holds, a size mismatch) and copies unaligned tensors into aligned memory,
so a reloaded model's outputs equal the saved model's bit for bit.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.utils import CONFIG_NAME

from ..utils.atomic_folders import (
    derived_stem,
    fsync_path,
    remove_stale_siblings,
    replace_folder,
    stale_siblings,
    writer_tag,
)

logger = logging.getLogger(__name__)

# the allocation alignment of PyTorch's CPU allocator (and what vectorised kernels expect)
TENSOR_ALIGNMENT = 64

# the heads trained by a supervised objective of the papers; a model whose copy of one is newly initialised says so
SUPERVISED_HEAD_PATTERN = (
    r"(^|\.)(indirect_grounding_head|alignment_decoder|id_classifier|vgp_dense|vgp_classifier|perturbation)\."
)


# the `from_pretrained` keywords that locate a checkpoint's files (passed on when reading its `config.json`)
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")


class CheckpointMismatchError(RuntimeError, ValueError):
    """A checkpoint does not fit the model class or the model built from the (possibly overridden) config: another
    `model_type`, weights of other shapes, or more layers than the config builds. A `ValueError` (bad input) and, as
    transformers' own size-mismatch error, a `RuntimeError`."""


def weight_file_pattern(variant: str | None = None) -> re.Pattern[str]:
    """Names of the safetensors weight files of a `save_pretrained` with this variant: the single file, its shards and
    the shard index (`model.safetensors`, `model-00001-of-00002.safetensors`, `model.safetensors.index.json`)."""
    stem = "model" if variant is None else f"model.{variant}"
    index = "model.safetensors.index.json" if variant is None else f"model.safetensors.index.{variant}.json"
    return re.compile(rf"{re.escape(stem)}(-\d{{5}}-of-\d{{5}})?\.safetensors|{re.escape(index)}")


def _publish_order(name: str) -> int:
    if name.endswith((".safetensors", ".bin")):
        return 0  # weights (shards) first
    if name.endswith(".index.json"):
        return 1  # then the index naming them
    if name == CONFIG_NAME:
        return 3  # the config last: an old config never points at new half-moved weights, a new one only at whole ones
    return 2


def publish_saved_folder(staging: str | os.PathLike, target: str | os.PathLike, variant: str | None = None) -> None:
    """Moves every file of a finished save in `staging` into `target` (weights, index, other files, `config.json`
    last), each with `os.replace`. Weight files of `variant` in `target` that the save did
    not write are removed before the config is moved in; no other file of `target` is touched."""
    staging, target = Path(staging), Path(target)
    files = sorted((path for path in staging.rglob("*") if path.is_file()), key=lambda p: (_publish_order(p.name), str(p)))
    written = {path.relative_to(staging) for path in files}
    for path in files:
        relative = path.relative_to(staging)
        if path.name == CONFIG_NAME and relative.parent == Path("."):
            pattern = weight_file_pattern(variant)
            for stale in target.iterdir():
                if stale.is_file() and pattern.fullmatch(stale.name) and Path(stale.name) not in written:
                    stale.unlink()
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, destination)


SAVING_MARKER = ".saving-"


def _staging_folder(target: Path) -> tuple[Path, bool]:
    """A new staging folder next to `target` (same file system, so the swap is a rename) and True; inside `target`
    and False when its parent is not writable (the files are then moved in one by one)."""
    prefix = f".{derived_stem(target.name)}{SAVING_MARKER}{writer_tag()}-"  # within NAME_MAX for any target name
    try:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent)), True
    except PermissionError:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=target)), False


def carry_over_files(target: Path, staging: Path, variant: str | None = None) -> None:
    """Hard-links (copies where linking fails) into `staging` every file, link and folder of `target` that the save in
    `staging` did not write, except the weight files of `variant` it supersedes and staging folders."""
    weights = weight_file_pattern(variant)
    for folder, subfolders, files in os.walk(target):
        folder = Path(folder)
        relative_folder = folder.relative_to(target)
        subfolders[:] = [name for name in subfolders if not name.startswith(f".{derived_stem(target.name)}{SAVING_MARKER}")]
        for name in subfolders + files:
            source, relative = folder / name, relative_folder / name
            destination = staging / relative
            if relative_folder == Path(".") and name in files and weights.fullmatch(name):
                continue  # the new save's weights (or none of this variant) replace every old weight file
            if source.is_symlink():
                if not os.path.lexists(destination):
                    os.symlink(os.readlink(source), destination)
                subfolders[:] = [sub for sub in subfolders if sub != name]  # do not descend into a linked folder
            elif source.is_dir():
                destination.mkdir(exist_ok=True)
                shutil.copystat(source, destination)
            elif not destination.exists():
                try:
                    os.link(source, destination)
                except OSError:
                    shutil.copy2(source, destination)


def publish_into_new_folder(staging: Path, target: Path, variant: str | None = None) -> None:
    """Completes the finished save in `staging` with `target`'s other files and swaps it with `target` atomically."""
    for path in staging.rglob("*"):
        if path.is_file():
            fsync_path(path)
    carry_over_files(target, staging, variant)
    os.chmod(staging, stat.S_IMODE(target.stat().st_mode))  # mkdtemp made it 0700: keep the target's permissions
    cwd = os.getcwd()
    replace_folder(staging, target)
    if Path(cwd).is_relative_to(target):  # this process's working folder was the old one: move into the new one
        os.chdir(cwd)


def recover_interrupted_save(save_directory: str | os.PathLike) -> None:
    """Restores a folder left missing by a save killed between the two renames of the fallback swap, and removes the
    staging folders of killed saves (see `utils/atomic_folders.py`)."""
    target = Path(save_directory).resolve()
    remove_stale_siblings(target, SAVING_MARKER)
    if target.is_dir():
        for stale in stale_siblings(target / target.name, SAVING_MARKER):  # staging inside it (read-only parent)
            shutil.rmtree(stale, ignore_errors=True)


class SaveLoadMixin:
    """Mixed into each family's `XPreTrainedModel` (before `PreTrainedModel`): atomic `save_pretrained`, and loading
    errors / warnings that name the weights concerned (see the module docstring)."""

    _supervised_head_pattern: str = SUPERVISED_HEAD_PATTERN
    # the config field giving the length of each layer list (its path inside the base model), named by loading errors
    _layer_count_fields: dict[str, str] = {}

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike | None, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, refusing with [`CheckpointMismatchError`] a checkpoint whose `config.json`
        has another `model_type` than this class's config (instead of a model with every weight newly initialised),
        and a config building fewer layers than the checkpoint holds (instead of dropping the extra layers)."""
        config = kwargs.get("config")
        if pretrained_model_name_or_path is not None and not Path(pretrained_model_name_or_path).exists():
            recover_interrupted_save(pretrained_model_name_or_path)  # a save killed mid-swap (non-Linux fallback)
        if pretrained_model_name_or_path is not None and not isinstance(config, PreTrainedConfig):
            check_checkpoint_model_type(cls, config if config is not None else pretrained_model_name_or_path, kwargs)
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        except SafetensorError as error:
            files = _unreadable_weight_files(pretrained_model_name_or_path, kwargs.get("variant")) or ["its weights"]
            raise ValueError(
                f"Cannot load the checkpoint {pretrained_model_name_or_path}: {', '.join(map(str, files))} is not a "
                f"complete safetensors file ({error}); it is truncated or damaged, save or download it again."
            ) from None

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        is_main_process: bool = True,
        push_to_hub: bool = False,
        distributed_checkpoint: bool = False,
        **kwargs,
    ) -> None:
        """`PreTrainedModel.save_pretrained`, made atomic: an interrupted save leaves `save_directory` with its previous
        complete checkpoint (or none), never a partial one. With `push_to_hub=True` the folder is uploaded after it is
        complete locally (`repo_id`, `commit_message`, `private`, `token` as in transformers); a failed upload raises
        [`~hf_vlalign.hub.HubPushError`], the local folder staying complete."""
        if distributed_checkpoint or not self.should_save_on_this_rank(is_main_process):
            # other ranks write nothing but may take part in gathering the weights; DCP checkpoints keep their format
            return super().save_pretrained(
                save_directory,
                is_main_process=is_main_process,
                push_to_hub=push_to_hub,
                distributed_checkpoint=distributed_checkpoint,
                **kwargs,
            )
        hub_kwargs = {key: kwargs.pop(key) for key in ("repo_id", "commit_message", "private", "create_pr") if key in kwargs}
        target = Path(save_directory).resolve()
        if target.is_file():
            raise NotADirectoryError(f"`save_directory` must be a folder, got the file {target}.")
        recover_interrupted_save(target)
        target.mkdir(parents=True, exist_ok=True)
        staging, beside = _staging_folder(target)
        try:
            super().save_pretrained(staging, is_main_process=is_main_process, push_to_hub=False, **kwargs)
            if beside:
                publish_into_new_folder(staging, target, variant=kwargs.get("variant"))
            else:
                publish_saved_folder(staging, target, variant=kwargs.get("variant"))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        logger.info("Model saved in %s", target)
        if push_to_hub:
            from ..utils.hub_push import push_folder_to_hub

            push_folder_to_hub(
                target,
                repo_id=hub_kwargs.get("repo_id"),
                token=kwargs.get("token"),
                private=hub_kwargs.get("private"),
                commit_message=hub_kwargs.get("commit_message") or "Upload model",
                create_pr=hub_kwargs.get("create_pr", False),
            )

    @staticmethod
    def _finalize_model_loading(model, load_config, loading_info):
        """transformers' finalisation (initialise missing weights, tie, log the report), plus: checkpoint layers beyond
        the config's layer count, or a size mismatch, raise [`CheckpointMismatchError`] naming the layer counts or every
        key and both shapes; weights get aligned memory of their own (outputs equal the saved model's bit for bit);
        newly initialised supervised heads are named in a WARNING of this library's logger."""
        source = load_config.pretrained_model_name_or_path
        _check_weights_fit(model, source, loading_info)
        try:
            loading_info = PreTrainedModel._finalize_model_loading(model, load_config, loading_info)
        except RuntimeError as error:
            if loading_info.mismatched_keys and not load_config.ignore_mismatched_sizes:
                raise CheckpointMismatchError(_mismatch_message(model, source, loading_info.mismatched_keys)) from error
            raise
        _own_misaligned_tensors(model)
        reinitialised = set(loading_info.missing_keys) | {key for key, *_ in loading_info.mismatched_keys}
        pattern = re.compile(model._supervised_head_pattern)
        supervised = sorted(key for key in reinitialised if pattern.search(key))
        if supervised:
            logger.warning(
                "%s loaded from %s: the supervised head weights %s are newly initialised (not in the checkpoint, or of "
                "another shape); train them before using their predictions.",
                type(model).__name__,
                source,
                ", ".join(supervised),
            )
        return loading_info


def _unreadable_weight_files(folder: str | os.PathLike | None, variant: str | None) -> list[Path]:
    """The safetensors weight files of a local checkpoint folder that `safetensors` cannot open."""
    if folder is None or not Path(folder).is_dir():
        return []
    pattern, unreadable = weight_file_pattern(variant), []
    for file in sorted(Path(folder).iterdir()):
        if file.suffix == ".safetensors" and pattern.fullmatch(file.name):
            try:
                safe_open(file, framework="pt").keys()
            except (SafetensorError, OSError):
                unreadable.append(file)
    return unreadable


def check_checkpoint_model_type(model_class: type[PreTrainedModel], config_path: str | os.PathLike, kwargs) -> None:
    """Raises [`CheckpointMismatchError`] when the `config.json` at `config_path` has another `model_type` than
    `model_class`'s config. A folder without a readable config is left to `from_pretrained`'s own error."""
    hub_kwargs = {key: kwargs[key] for key in HUB_KWARGS if key in kwargs}
    try:
        config_dict, _ = model_class.config_class.get_config_dict(config_path, **hub_kwargs)
    except (OSError, ValueError):
        return
    found, expected = config_dict.get("model_type"), model_class.config_class.model_type
    if found is None or found == expected:
        return
    hints = []
    if saved_by := config_dict.get("architectures"):
        hints.append(f"Load it with the class it was saved from ({', '.join(saved_by)}) or an Auto class.")
    if hasattr(model_class, "from_text_pretrained"):
        hints.append(f"`{model_class.__name__}.from_text_pretrained` initialises the text side from a text checkpoint.")
    raise CheckpointMismatchError(
        f"{model_class.__name__} expects a checkpoint of model_type {expected!r}, but the config.json of {config_path} "
        f"has model_type {found!r}: its weights would not be loaded (the model would be random). " + " ".join(hints)
    )


def _check_weights_fit(model: PreTrainedModel, source, loading_info) -> None:
    """Raises [`CheckpointMismatchError`] when no weight of the checkpoint is one of `model` (a checkpoint of another
    model with an explicit `config`), or when the checkpoint holds layers beyond the length of a layer list of `model`
    (a `config.json` whose layer count is lower than the weights'), naming both counts and the config field."""
    unexpected = sorted(loading_info.unexpected_keys)
    if unexpected and not set(model.state_dict()) - set(loading_info.missing_keys):
        raise CheckpointMismatchError(
            f"Cannot load the checkpoint {source} into {type(model).__name__}: none of its {len(unexpected)} weight(s) "
            f"(e.g. {unexpected[0]}) is a weight of the model, every weight would be newly initialised. It is the "
            "checkpoint of another model: see the model_type in its config.json."
        )
    prefix = f"{model.base_model_prefix}."
    # a checkpoint of the base model lacks the prefix of a head model's keys, a head checkpoint loaded as base has it
    keys = {variant for key in unexpected for variant in (key, key.removeprefix(prefix), prefix + key)}
    lines = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList):
            continue
        pattern = re.compile(rf"{re.escape(name)}\.(\d+)\.")
        saved = max((int(match[1]) + 1 for key in keys if (match := pattern.match(key))), default=0)
        if saved > len(module):
            fields = model._layer_count_fields
            field = next((fields[path] for path in fields if name == path or name.endswith(f".{path}")), None)
            named = f" (`{field}`={len(module)})" if field else ""
            lines.append(f"  {name}: the config builds {len(module)} layer(s){named}, the checkpoint holds {saved}")
    if lines:
        raise CheckpointMismatchError(
            f"Cannot load the checkpoint {source} into {type(model).__name__}: its config builds fewer layers than its "
            "weights hold, so layers would be silently dropped:\n" + "\n".join(lines) + "\nSet the layer count of "
            "config.json (or of the override) to the checkpoint's."
        )


def _own_misaligned_tensors(model: PreTrainedModel, alignment: int = TENSOR_ALIGNMENT) -> None:
    """Copies every parameter and buffer whose memory is not `alignment`-byte aligned into its own allocation.

    Loaded from safetensors, the tensors are views at arbitrary offsets into the memory-mapped file; CPU kernels take
    another (vectorised) path on unaligned memory and round differently in the last bit, so without this a reloaded
    model's outputs differ from the saved model's. Tied weights stay tied: a shared `Parameter` gets its new data once.
    """
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.data_ptr() % alignment:
                parameter.data = parameter.data.clone()
        for module in model.modules():
            for name, buffer in module._buffers.items():
                if buffer is not None and buffer.data_ptr() % alignment:
                    module._buffers[name] = buffer.clone()


def _mismatch_message(model, source, mismatched_keys, shown: int = 40) -> str:
    lines = [
        f"  {key}: checkpoint {tuple(shape_checkpoint)} vs model {tuple(shape_model)}"
        for key, shape_checkpoint, shape_model in sorted(mismatched_keys)
    ]
    if len(lines) > shown:
        lines = lines[:shown] + [f"  ... and {len(lines) - shown} more"]
    return (
        f"Cannot load the checkpoint {source} into {type(model).__name__}: {len(mismatched_keys)} weight(s) have another "
        "shape than in the model built from the config:\n" + "\n".join(lines) + "\nCheck the config and its overrides "
        "(e.g. `hidden_size`, the number of labels), or pass `ignore_mismatched_sizes=True` to re-initialise these "
        "weights."
    )
