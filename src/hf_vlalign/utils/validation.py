"""The validation shared by the doors: models' forwards, collators, builders and readers. Every check raises a
`ValueError` naming the argument, what was expected and what came. A forward checks shapes and dtypes always and values
only where [`checks_values`] says (on the CPU in eager mode, or when asked with `validate_inputs=True`).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch


class MissingPathError(FileNotFoundError, ValueError):
    """A file or folder argument that does not exist: a `FileNotFoundError` and, as any bad argument, a `ValueError`."""


def check_existing_path(name: str, path: object, what: str, kind: str = "file") -> Path:
    """Returns `path` as a Path when it is an existing `kind` ("file", "dir" or "any"); a missing path raises
    `MissingPathError`, a path of the wrong kind (or not a path at all) a `ValueError`, both naming the argument."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"`{name}` must be a str or Path to {what}, got {type(path).__name__} {path!r}.")
    path = Path(path)
    found = {"file": path.is_file, "dir": path.is_dir, "any": path.exists}[kind]()
    if found:
        return path
    if not path.exists():
        raise MissingPathError(f"`{name}` must be an existing {what}, got {str(path)!r} which does not exist.")
    other = "a folder" if path.is_dir() else "not a regular file"
    raise ValueError(f"`{name}` must be an existing {what}, got {str(path)!r} which is {other}.")


def require(
    condition: torch.Tensor,
    expected: str,
    what_came: Callable[[], str] | None = None,
    *,
    message: Callable[[], str] | None = None,
) -> None:
    """Raises a `ValueError` unless the 0-d bool tensor `condition` holds (it is read on the host).

    `expected` says what must hold ("`input_ids` must be in [0, 99]"); `what_came`, called only when the check fails,
    describes the input that failed it ("got [-1, 5]"); `message()`, when given, is the whole sentence instead.
    """
    if bool(condition):
        return
    if message is not None:
        raise ValueError(message())
    came = what_came() if what_came is not None else ""
    raise ValueError(f"{expected}, {came}." if came else f"{expected}.")


def checks_values(config, tensor: torch.Tensor, validate_inputs: bool | None = None) -> bool:
    """Whether a forward checks the values of its inputs: as `validate_inputs` (a forward's keyword argument) says when
    given (True on an accelerator reads the values on the host); by default when `config.validate_inputs` is on and
    `tensor` is on the CPU in eager mode, where reading it costs no device synchronisation and breaks no graph."""
    if validate_inputs is not None:
        return bool(validate_inputs)
    return bool(config.validate_inputs) and tensor.device.type == "cpu" and not torch.compiler.is_compiling()


def check_rank(name: str, tensor: torch.Tensor, rank: int, layout: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"`{name}` must be a torch.Tensor of shape {layout}, got {type(tensor).__name__}.")
    if tensor.dim() != rank:
        raise ValueError(f"`{name}` must have shape {layout} ({rank} dims), got shape {tuple(tensor.shape)}.")


def check_dim(name: str, tensor: torch.Tensor, dim: int, expected: int, layout: str, why: str = "") -> None:
    if tensor.shape[dim] != expected:
        reason = f" ({why})" if why else ""
        raise ValueError(
            f"`{name}` must have shape {layout} with size {expected} at dim {dim}{reason}, got shape {tuple(tensor.shape)}."
        )


def check_shape(name: str, tensor: torch.Tensor, expected: tuple[int, ...], layout: str = "") -> None:
    """`tensor` has the shape `expected` (`layout` names its axes in the message, e.g. "(batch, num_regions)")."""
    if tuple(tensor.shape) != tuple(expected):
        shape = f"{layout} = {tuple(expected)}" if layout else str(tuple(expected))
        raise ValueError(f"`{name}` must have shape {shape}, got {tuple(tensor.shape)}.")


def check_finite(name: str, tensor: torch.Tensor) -> None:
    if not tensor.is_floating_point():
        return
    require(
        torch.isfinite(tensor).all(),
        f"`{name}` must be finite",
        lambda: f"got {int((~torch.isfinite(tensor)).sum())} NaN/inf value(s) in a tensor of shape {tuple(tensor.shape)}",
    )


def check_normalised_boxes(
    name: str, boxes: torch.Tensor, valid: torch.Tensor | None = None, mask_name: str = "visual_attention_mask"
) -> None:
    """Boxes (..., 4) as x1, y1, x2, y2 in [0, 1] with x2 > x1 and y2 > y1 (rows where `valid` is False are ignored).
    All-zero boxes are reported as padding that the mask `mask_name` (`valid`, None when not given) should hide."""
    if boxes.shape[-1] != 4:
        raise ValueError(f"`{name}` must have a last dim of 4 (x1, y1, x2, y2), got shape {tuple(boxes.shape)}.")
    check_finite(name, boxes)
    checked = torch.ones(boxes.shape[:-1], dtype=torch.bool, device=boxes.device) if valid is None else valid.bool()
    out_of_range = ((boxes < 0) | (boxes > 1)).any(-1) & checked

    def values_came() -> str:
        rows = boxes[checked]
        return (
            f"got values in [{float(rows.min()):.4g}, {float(rows.max()):.4g}]; normalise pixel boxes with "
            "hf_vlalign.alignment.normalize_boxes"
        )

    require(
        ~out_of_range.any(),
        f"`{name}` must be normalised to [0, 1] (x1, y1, x2, y2 divided by image width/height)",
        values_came,
    )
    check_padding_masked(name, boxes, valid, mask_name)
    degenerate = ((boxes[..., 2] <= boxes[..., 0]) | (boxes[..., 3] <= boxes[..., 1])) & checked
    require(
        ~degenerate.any(),
        f"`{name}` must satisfy x2 > x1 and y2 > y1",
        lambda: f"got {int(degenerate.sum())} degenerate box(es), e.g. {boxes[degenerate][0].tolist()}",
    )


def check_padding_masked(
    name: str, values: torch.Tensor, mask: torch.Tensor | None, mask_name: str = "visual_attention_mask"
) -> None:
    """Rows of `values` (..., D) that are all zeros where `mask` is not 0 (or everywhere when no mask was given) look
    like padding regions: raises a `ValueError` telling to pass (or fix) `mask_name`."""
    padding = (values == 0).all(-1)
    if mask is not None:
        padding &= mask.bool()
    if mask is None:
        fix = f"pass `{mask_name}` (1 for real regions, 0 for padding) so that they are not attended"
    else:
        fix = f"`{mask_name}` is 1 for them: set it to 0 for padding regions"
    require(
        ~padding.any(),
        f"`{name}` must have no all-zero region row where `{mask_name}` keeps the region",
        message=lambda: (
            f"`{name}` has {int(padding.sum())} all-zero region row(s) (e.g. at index {padding.nonzero()[0].tolist()}), "
            f"which look like padding: {fix}."
        ),
    )


def warn_unmasked_zero_features(
    name: str, visual_feats: torch.Tensor, mask_name: str = "visual_attention_mask"
) -> None:
    """Without a mask, regions whose features are all zeros cannot be told from real ones and are attended: warns that
    they look like padding (a constant message, shown once per call site)."""
    if bool((visual_feats == 0).all(-1).any()):
        warnings.warn(
            f"`{name}` has region(s) whose features are all zeros and no `{mask_name}` was given, so they are attended "
            f"as real regions; if they are padding, pass `{mask_name}` (1 for real regions, 0 for padding).",
            UserWarning,
            stacklevel=2,
        )


def check_mask_not_empty(name: str, mask: torch.Tensor, what: str) -> None:
    """Every row of a (B, N) mask must keep at least one position."""
    empty = mask.reshape(mask.shape[0], -1).sum(-1) == 0
    require(
        ~empty.any(),
        f"`{name}` must keep at least one {what} per example",
        lambda: f"got none for batch index(es) {empty.nonzero().flatten().tolist()}",
    )


def check_alignment(name: str, alignment: torch.Tensor, atol: float = 1e-3) -> None:
    """Each row of a word-region alignment is a distribution (sums to one) or all zeros (ungrounded token)."""
    check_finite(name, alignment)
    require(
        ~(alignment < 0).any(), f"`{name}` must be non-negative", lambda: f"got minimum {float(alignment.min()):.4g}"
    )
    sums = alignment.sum(-1)
    bad = ~(((sums - 1).abs() <= atol) | (sums.abs() <= atol))
    require(
        ~bad.any(),
        f"`{name}` rows must each sum to 1 (grounded token) or 0 (ungrounded token)",
        lambda: f"got {int(bad.sum())} row(s) with sums such as {float(sums[bad][0]):.4g}",
    )


def check_index_list(name: str, indices: Sequence[int] | None, upper: int, what: str) -> list[int]:
    """Validates a config list of layer/head indices; None means all of them."""
    if indices is None:
        return list(range(upper))
    values = list(indices)
    if not values:
        raise ValueError(f"`{name}` must name at least one {what} (or be None for all), got an empty list.")
    bad = [i for i in values if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < upper]
    if bad:
        raise ValueError(f"`{name}` must hold {what} indices in [0, {upper - 1}], got {bad}.")
    return sorted(set(values))


def check_config_numbers(
    config,
    positive: Sequence[str] = (),
    non_negative: Sequence[str] = (),
    dropouts: Sequence[str] = (),
    activations: Sequence[str] = (),
) -> None:
    """Validates a config's numeric fields at construction: sizes and epsilons finite and > 0, weights and
    initialisation scales finite and >= 0, dropout probabilities in [0, 1) (or None), activations known to
    transformers' `ACT2FN`."""
    for name in positive:
        value = getattr(config, name)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}.")
    for name in non_negative:
        value = getattr(config, name)
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")
    for name in dropouts:
        value = getattr(config, name)
        if value is not None and not 0 <= value < 1:
            raise ValueError(f"`{name}` must be a dropout probability in [0, 1), got {value!r}.")
    if activations:
        from transformers.activations import ACT2FN

        for name in activations:
            value = getattr(config, name)
            if value not in ACT2FN:
                raise ValueError(f"`{name}` must be one of transformers' activations {sorted(ACT2FN)}, got {value!r}.")


def check_token_id(name: str, token_id: int | None, vocab_size: int) -> None:
    """A config's token id (None allowed) must index the vocabulary."""
    if token_id is not None and not 0 <= token_id < vocab_size:
        raise ValueError(f"`{name}` must be None or a token id in [0, {vocab_size - 1}] (`vocab_size`), got {token_id}.")


def check_region_shapes(
    config,
    visual_feats: torch.Tensor,
    visual_boxes: torch.Tensor | None,
    visual_attention_mask: torch.Tensor | None,
    batch: int | None = None,
) -> int:
    """Shapes and dtypes of `visual_feats` (B, R, Dv), `visual_boxes` (B, R, 4) and `visual_attention_mask` (B, R),
    with B = `batch` when given; returns R."""
    layout = "(batch, num_regions, visual_feat_dim)"
    check_rank("visual_feats", visual_feats, 3, layout)
    check_floating("visual_feats", visual_feats)
    batch = visual_feats.shape[0] if batch is None else batch
    num_regions = visual_feats.shape[1]
    check_dim("visual_feats", visual_feats, 0, batch, layout, "batch of `input_ids`")
    check_dim("visual_feats", visual_feats, 2, config.visual_feat_dim, layout, "config.visual_feat_dim")
    if num_regions == 0:
        raise ValueError("`visual_feats` must hold at least one region, got an empty region set (num_regions = 0).")
    if visual_boxes is None and getattr(config, "use_box_embeddings", True):
        raise ValueError(
            f"`visual_boxes` (batch, num_regions, 4) is required by a {type(config).__name__} with box embeddings, "
            "got None; only a model built with `use_box_embeddings=False` (e.g. a converted VisualBERT) runs without "
            "boxes."
        )
    if visual_boxes is not None:
        check_rank("visual_boxes", visual_boxes, 3, "(batch, num_regions, 4)")
        check_floating("visual_boxes", visual_boxes)
        check_shape("visual_boxes", visual_boxes, (batch, num_regions, 4), "(batch, num_regions, 4) of `visual_feats`")
    if visual_attention_mask is not None:
        check_rank("visual_attention_mask", visual_attention_mask, 2, "(batch, num_regions)")
        check_shape("visual_attention_mask", visual_attention_mask, (batch, num_regions), "(batch, num_regions)")
    return num_regions


def check_region_values(
    visual_feats: torch.Tensor, visual_boxes: torch.Tensor | None, visual_attention_mask: torch.Tensor | None
) -> None:
    """Values of the region inputs (shapes checked before): finite features, a 0/1 region mask keeping a region per
    example, normalised boxes, and (without a mask) a warning for all-zero regions that look like padding."""
    check_finite("visual_feats", visual_feats)
    if visual_attention_mask is not None:
        check_binary_mask("visual_attention_mask", visual_attention_mask)
        check_mask_not_empty("visual_attention_mask", visual_attention_mask, "region")
    if visual_boxes is not None:
        check_normalised_boxes("visual_boxes", visual_boxes, visual_attention_mask)
    if visual_attention_mask is None:
        warn_unmasked_zero_features("visual_feats", visual_feats)


def check_in_range(
    name: str, ids: torch.Tensor, size: int, why: str = "", ignore_index: int | None = None, what: str = ""
) -> None:
    """Integer `ids` (`what` they are, e.g. "token ids") in [0, size) (entries equal to `ignore_index`, when given, are
    left out)."""
    if ids.numel() == 0:
        return
    counted = torch.ones_like(ids, dtype=torch.bool) if ignore_index is None else ids != ignore_index
    outside = ((ids < 0) | (ids >= size)) & counted
    ignored = f" or {ignore_index} (ignored)" if ignore_index is not None else ""
    allowed = f"[0, {size - 1}]" + (f" {why}" if why else "") + ignored

    def values_came() -> str:
        used = ids[counted]
        return f"got {'values in ' if ignored else ''}[{int(used.min())}, {int(used.max())}]"

    require(~outside.any(), f"`{name}` must be {what + ' ' if what else ''}in {allowed}", values_came)


def check_integer(name: str, tensor: torch.Tensor) -> None:
    """Ids and labels must be an integer tensor (an embedding lookup with floats fails deep inside torch)."""
    if tensor.is_floating_point() or tensor.is_complex():
        raise ValueError(f"`{name}` must be an integer tensor (torch.long), got dtype {tensor.dtype}.")


def check_no_mass_on_padding(name: str, target: torch.Tensor, mask: torch.Tensor, mask_name: str) -> None:
    """A target may not put mass where `mask` (broadcast to `target`) is 0: those positions can never be attended."""
    on_padding = (target > 0) & ~mask.bool()
    require(
        ~on_padding.any(),
        f"`{name}` must put no mass on positions where `{mask_name}` is 0 (padding)",
        lambda: f"got {int(on_padding.sum())} such value(s), e.g. at index {on_padding.nonzero()[0].tolist()}",
    )


def check_phrase_masks(
    name: str, phrase_masks: torch.Tensor, batch: int, text_length: int, allow_empty_rows: bool, values: bool
) -> None:
    """A (B, T) mask (one phrase per example) or (B, P, T) masks; with `values`, 0/1 and (unless `allow_empty_rows`,
    padding phrases) each keeping a token."""
    if not isinstance(phrase_masks, torch.Tensor) or phrase_masks.dim() not in (2, 3):
        got = f"shape {tuple(phrase_masks.shape)}" if isinstance(phrase_masks, torch.Tensor) else type(phrase_masks).__name__
        raise ValueError(f"`{name}` must have shape (batch, text_length) or (batch, num_phrases, text_length), got {got}.")
    if phrase_masks.shape[0] != batch or phrase_masks.shape[-1] != text_length:
        raise ValueError(
            f"`{name}` must have shape (batch, [num_phrases,] text_length) with batch={batch}, text_length={text_length}, "
            f"got {tuple(phrase_masks.shape)}."
        )
    if not values:
        return
    check_binary_mask(name, phrase_masks)
    if not allow_empty_rows:
        check_mask_not_empty(name, phrase_masks, "token in the phrase")


def default_and_check_inputs(
    config,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    visual_feats: torch.Tensor,
    visual_boxes: torch.Tensor | None,
    visual_attention_mask: torch.Tensor | None,
    word_region_alignment: torch.Tensor | None,
    phrase_masks: torch.Tensor | None,
    validate_inputs: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Checks the DESIGN.md input tensors against each other and against `config` (shapes and dtypes always, values
    as [`checks_values`] says) and fills the optional masks (all ones, token type 0); returns (attention_mask,
    token_type_ids, visual_attention_mask). `visual_boxes` may be None only without box embeddings."""
    values = checks_values(config, input_ids, validate_inputs)
    # checked before the region mask is defaulted: without one, all-zero regions are reported as unmasked padding
    check_rank("input_ids", input_ids, 2, "(batch, text_length)")
    check_integer("input_ids", input_ids)
    batch, text_length = input_ids.shape
    if text_length == 0:
        raise ValueError("`input_ids` must hold at least one token, got shape (batch, 0).")
    if text_length > config.max_position_embeddings:
        raise ValueError(
            f"`input_ids` has {text_length} tokens, more than `max_position_embeddings` ({config.max_position_embeddings})."
        )
    for name, tensor in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if tensor is not None:
            check_rank(name, tensor, 2, "(batch, text_length)")
            check_shape(name, tensor, (batch, text_length), "(batch, text_length) of `input_ids`")
    if token_type_ids is not None:
        check_integer("token_type_ids", token_type_ids)
    num_regions = check_region_shapes(config, visual_feats, visual_boxes, visual_attention_mask, batch)
    if word_region_alignment is not None:
        check_rank("word_region_alignment", word_region_alignment, 3, "(batch, text_length, num_regions)")
        check_floating("word_region_alignment", word_region_alignment)
        expected = (batch, text_length, num_regions)
        check_shape("word_region_alignment", word_region_alignment, expected, "(batch, text_length, num_regions)")
    if values:
        check_in_range("input_ids", input_ids, config.vocab_size, "(vocab_size)")
        if attention_mask is not None:
            check_binary_mask("attention_mask", attention_mask)
            check_mask_not_empty("attention_mask", attention_mask, "token")
        if token_type_ids is not None:
            check_in_range("token_type_ids", token_type_ids, config.type_vocab_size, "(type_vocab_size)")
        check_region_values(visual_feats, visual_boxes, visual_attention_mask)
        if word_region_alignment is not None:
            check_alignment("word_region_alignment", word_region_alignment)
            if visual_attention_mask is not None:
                check_no_mass_on_padding(
                    "word_region_alignment", word_region_alignment, visual_attention_mask[:, None, :], "visual_attention_mask"
                )
            if attention_mask is not None:
                check_no_mass_on_padding("word_region_alignment", word_region_alignment, attention_mask[:, :, None], "attention_mask")
    if phrase_masks is not None:
        check_phrase_masks("phrase_masks", phrase_masks, *input_ids.shape, allow_empty_rows=True, values=values)
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    token_type_ids = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
    if visual_attention_mask is None:
        visual_attention_mask = attention_mask.new_ones(visual_feats.shape[:2])
    return attention_mask, token_type_ids, visual_attention_mask


def check_floating(name: str, tensor: torch.Tensor) -> None:
    """Features, boxes and soft targets must be a floating-point tensor (integer ones fail deep inside torch)."""
    if not tensor.is_floating_point():
        raise ValueError(f"`{name}` must be a floating-point tensor (e.g. torch.float32), got dtype {tensor.dtype}.")


def regions_in_dtype(
    dtype: torch.dtype, visual_feats: torch.Tensor, visual_boxes: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The documented cast of the region inputs: floating `visual_feats` / `visual_boxes` of another precision
    (float16 or float64 on a float32 model) are cast to the model's `dtype`; integer, bool or complex ones are refused
    with a `ValueError` naming the tensor. Non-tensors pass through (the shape checks name them)."""
    cast = []
    for name, tensor in (("visual_feats", visual_feats), ("visual_boxes", visual_boxes)):
        if isinstance(tensor, torch.Tensor) and tensor.dtype != dtype:
            check_floating(name, tensor)
            tensor = tensor.to(dtype)
        cast.append(tensor)
    return cast[0], cast[1]


def check_binary_mask(name: str, mask: torch.Tensor) -> None:
    """A mask holds 0 (padding) and 1 (kept) only, in any dtype: an inverted integer mask (`~mask` gives -1 and -2),
    a 1-for-padding convention with other values, or fractional weights are refused."""
    if mask.dtype == torch.bool:
        return
    other = (mask != 0) & (mask != 1)
    require(
        ~other.any(),
        f"`{name}` must hold only 1 (kept) and 0 (padding)",
        lambda: (
            f"got {int(other.sum())} other value(s) such as {mask[other][0].item()!r} (dtype {mask.dtype}); an "
            "inverted mask (`~mask` of an integer tensor) gives -1/-2"
        ),
    )


def check_no_target_on_padding(
    name: str, labels: torch.Tensor, mask: torch.Tensor, mask_name: str, ignore_index: int = -100
) -> None:
    """Integer targets (`ignore_index`: none) may not sit where `mask` (broadcast to `labels`) is 0 (padding)."""
    on_padding = (labels != ignore_index) & ~mask.bool()
    require(
        ~on_padding.any(),
        f"`{name}` must be {ignore_index} (no target) where `{mask_name}` is 0 (padding)",
        lambda: f"got {int(on_padding.sum())} target(s) on padding, e.g. at index {on_padding.nonzero()[0].tolist()}",
    )


# Python objects of the wrong kind (a name for a tokenizer or model, a dict for a dataset), refused at the doors


class ArgumentKindError(ValueError, TypeError):
    """An argument that is the wrong kind of Python object: a `ValueError` like every bad argument of the library, and
    the `TypeError` Python code expects for a wrong type."""


def describe_object(value: object) -> str:
    """The type of `value` as a user would look it up (`numpy.ndarray`, `list`), with a short repr of small values."""
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__.split('.')[0]}.{kind.__name__}"
    if value is None:
        return "None"
    if isinstance(value, (str, int, float, bool)):
        shown = repr(value)
        return f"{name} {shown if len(shown) <= 60 else shown[:57] + '...'}"
    if hasattr(value, "shape"):
        return f"{name} of shape {tuple(value.shape)}"
    return name


def check_kind(name: str, value: object, kinds: type | tuple[type, ...], what: str, *, hint: str = "") -> None:
    """Raises `ArgumentKindError` unless `value` is an instance of `kinds`."""
    if not isinstance(value, kinds):
        raise ArgumentKindError(f"`{name}` must be {what}, got {describe_object(value)}{hint}.")


def check_tokenizer(name: str, value: object) -> None:
    """`value` is a transformers tokenizer (a name or path is refused with how to load it)."""
    from transformers import PreTrainedTokenizerBase

    is_name = isinstance(value, (str, os.PathLike))
    hint = " (load it with AutoTokenizer.from_pretrained(name_or_path))" if is_name else ""
    check_kind(name, value, PreTrainedTokenizerBase, "a transformers tokenizer (PreTrainedTokenizerBase)", hint=hint)


def check_module(name: str, value: object, what: str = "a model (torch.nn.Module, e.g. SingleStreamModel)") -> None:
    """`value` is a `torch.nn.Module` (a checkpoint name or path is refused with how to load it)."""
    is_name = isinstance(value, (str, os.PathLike))
    hint = " (load it first, e.g. with <ModelClass>.from_pretrained(name_or_path))" if is_name else ""
    check_kind(name, value, torch.nn.Module, what, hint=hint)


def check_rows(name: str, value: object) -> None:
    """`value` is a `datasets.Dataset` or another sized sequence of rows (a list of dicts): a dict of columns, a
    `DatasetDict` of splits, a string or an iterator is refused (a dict would be read as its column names)."""
    if isinstance(value, dict) and type(value).__name__.endswith("DatasetDict"):
        raise ArgumentKindError(
            f"`{name}` must be a datasets.Dataset or a list of rows, got a {type(value).__name__} of the splits "
            f"{list(value)} (pick one, e.g. {name}[{next(iter(value), 'validation')!r}])."
        )
    if isinstance(value, (str, bytes, Mapping)) or not (hasattr(value, "__len__") and hasattr(value, "__getitem__")):
        hint = " (a dict of columns becomes a Dataset with datasets.Dataset.from_dict)" if isinstance(value, Mapping) else ""
        raise ArgumentKindError(
            f"`{name}` must be a datasets.Dataset or a list of rows (dicts), got {describe_object(value)}{hint}."
        )


def check_callable(name: str, value: object, what: str) -> None:
    """`value` can be called (a collator, a score function); `what` says what it is called with."""
    if not callable(value):
        raise ArgumentKindError(f"`{name}` must be {what}, got {describe_object(value)}.")
