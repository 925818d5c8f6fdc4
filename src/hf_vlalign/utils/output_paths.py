"""Checks every writing entry point runs before it writes: the output never destroys an input, and an existing output is
replaced only when the library recognises it as its own. Paths are compared resolved (`~`, `..`, symbolic links), and
a hard link of an input file is that file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

# entries of a foreign folder an error lists (the rest are counted)
LISTED_ENTRIES = 5
# the inputs read by scanning, by argument name (without `--` or an `[index]`): every file of the folder is read
# (extract-features' `images`, the npz_dir / vlbert_json folder `src` of convert-features and its `box_dir`, a region
# store's folder `features`), so no output may be written inside them
SCANNED_INPUTS = frozenset({"images", "src", "box_dir", "features"})


class OutputPathError(ValueError):
    """An output path that would destroy an input or something the library did not write."""


def resolved_path(path: str | os.PathLike) -> Path:
    """`path` absolute, with `~`, `..` and every symbolic link of its existing part resolved."""
    return Path(os.path.expanduser(os.fspath(path))).resolve()


def is_run_folder(folder: Path) -> bool:
    """Whether `folder` holds what a training run writes: its final arguments or a Trainer checkpoint."""
    return (folder / "training_args.json").is_file() or any(folder.glob("checkpoint-*/trainer_state.json"))


def _relation(output: Path, given: Path) -> str | None:
    """How the resolved `output` meets the resolved input `given`: "is", "is inside", "contains" or None."""
    if output == given or (output.exists() and given.exists() and os.path.samefile(output, given)):
        return "is"
    if output.is_relative_to(given):
        return "is inside"
    if given.is_relative_to(output):
        return "contains"
    return None


def _why_not_inside(scanned: bool, given: Path) -> str | None:
    """Why an existing output may not be inside the input `given`, or None when it may."""
    if not given.is_dir():
        return "that input is a file"
    if scanned:
        return "that input is read by scanning its folder, so the output would become part of it"
    return "it already exists there, and nothing inside an input is replaced"


def refuse_output_overlapping_inputs(
    output: str | os.PathLike,
    inputs: Mapping[str, str | os.PathLike | None],
    *,
    output_argument: str = "--out",
    inputs_may_be_inside_output: Collection[str] = (),
) -> None:
    """Raises [`OutputPathError`] when `output` is one of `inputs` (argument name -> path; None and paths that do not
    exist, e.g. Hub ids, are skipped), holds one, or lies inside one that is a file, is read by scanning
    (`SCANNED_INPUTS`), or where the output already exists and is not a training run's folder. The inputs named by
    `inputs_may_be_inside_output` may live inside the output (a `resume_from_checkpoint` under the run's `output_dir`),
    which is then the same run's folder."""
    output_path = resolved_path(output)
    existing = {
        name: (given, resolved_path(given))
        for name, given in inputs.items()
        if isinstance(given, (str, os.PathLike)) and os.path.lexists(os.path.expanduser(given))
    }
    relations = {name: _relation(output_path, given_path) for name, (_, given_path) in existing.items()}
    own_run = is_run_folder(output_path) or any(
        relations[name] == "contains" for name in inputs_may_be_inside_output if name in relations
    )
    for name, (given, given_path) in existing.items():
        relation = relations[name]
        scanned = name.removeprefix("--").partition("[")[0] in SCANNED_INPUTS
        if relation == "is inside" and given_path.is_dir() and not scanned and (own_run or not os.path.lexists(output_path)):
            continue  # a new output, or the run's own folder, in a folder read by known names destroys nothing
        if relation is None or (relation == "contains" and name in inputs_may_be_inside_output):
            continue
        consequence = {
            "is": "writing it would replace that input",
            "is inside": _why_not_inside(scanned, given_path),
            "contains": "replacing it would delete that input",
        }[relation]
        raise OutputPathError(
            f"`{output_argument}` {os.fspath(output)} ({output_path}) {relation} the input `{name}` "
            f"{os.fspath(given)} ({given_path}): {consequence}. Choose a new output path outside that input."
        )


def _listing(entries: list[str]) -> str:
    shown = ", ".join(entries[:LISTED_ENTRIES])
    return shown + (f" and {len(entries) - LISTED_ENTRIES} more" if len(entries) > LISTED_ENTRIES else "")


def _existing(path: str | os.PathLike) -> Path | None:
    path = Path(os.path.expanduser(os.fspath(path)))
    return path if os.path.lexists(path) else None


def refuse_foreign_folder(
    folder: str | os.PathLike, argument: str, *, description: str, is_own: Callable[[Path], bool]
) -> None:
    """Raises [`OutputPathError`] when `folder` exists and is not a folder, or is a non-empty folder that `is_own` does
    not recognise as `description` (what the writer makes, e.g. "a region-feature store")."""
    path = _existing(folder)
    if path is None:
        return
    if not path.is_dir():
        raise OutputPathError(
            f"`{argument}` {os.fspath(folder)} is a file, not {description}; it is left alone: choose a new folder."
        )
    entries = sorted(entry.name for entry in path.iterdir())
    if entries and not is_own(path):
        raise OutputPathError(
            f"`{argument}` {os.fspath(folder)} is not {description} hf_vlalign wrote: it holds {len(entries)} other "
            f"entr{'y' if len(entries) == 1 else 'ies'} ({_listing(entries)}), left alone. Choose a new or empty folder."
        )


def refuse_foreign_file(
    file: str | os.PathLike, argument: str, *, description: str, is_own: Callable[[Path], bool]
) -> None:
    """Raises [`OutputPathError`] when `file` exists and is a folder, or a file that `is_own` does not recognise as
    `description` (e.g. "a Fisher file")."""
    path = _existing(file)
    if path is None:
        return
    if path.is_dir():
        entries = sorted(entry.name for entry in path.iterdir())
        held = f"holding {_listing(entries)}" if entries else "empty"
        raise OutputPathError(f"`{argument}` {os.fspath(file)} is a folder ({held}), not {description}: give a file path.")
    if not is_own(path):
        raise OutputPathError(
            f"`{argument}` {os.fspath(file)} exists and is not {description} hf_vlalign wrote ({path.stat().st_size} "
            "bytes of something else); it is left alone: choose another file name."
        )
