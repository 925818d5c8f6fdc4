"""Visually grounded paraphrases (VGP): the two published CSV layouts.

- "typology" (VGP-Typology, Chu et al. 2022): every row is a VGP with its semantic type.
- "identification" (VGP identification CSV extended with types): adds `ytrue`, the region ids `roi1`/`roi2` and
  `preprocessed_phrase1`/`preprocessed_phrase2`.

`VGPPair.phrase1`/`phrase2` hold the preprocessed phrase, words joined by spaces. Cells are read as published:
`original_phrase*` may carry markup (`has_markup`) or escaped quotes (`unescape_phrase`); `roi1`/`roi2` index the
detected region (of 200 per image, -1 for none) each phrase was localised to (`builders.vgp.entities_of_rois`).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...utils.validation import check_existing_path
from .text_files import FileFormatError, iter_csv_rows, read_text

TYPOLOGY_LABELS: dict[int, str] = {
    0: "Alternation",
    1: "Entailment1",
    2: "Entailment2",
    3: "Equivalence",
    4: "Independence",
}

LAYOUTS: dict[str, list[str]] = {
    "typology": [
        "image", "phrase1", "phrase2", "original_phrase1", "original_phrase2", "original_label", "type_label",
    ],
    "identification": [
        "image", "phrase1", "phrase2", "original_phrase1", "original_phrase2", "ytrue", "roi1", "roi2",
        "preprocessed_phrase1", "preprocessed_phrase2", "original_label", "type_label",
    ],
}  # fmt: skip

_BOOLEANS = {"True": True, "False": False}


@dataclass(slots=True)  # one per csv row
class VGPPair:
    """A phrase pair grounded in one image, with its paraphrase flag and semantic type (-1 when untyped)."""

    image_id: str
    phrase1: str
    phrase2: str
    original_phrase1: str
    original_phrase2: str
    is_paraphrase: bool
    type_label: int
    original_label: str
    roi1: int | None = None
    roi2: int | None = None
    line: int | None = field(default=None, compare=False)  # the row's line in the CSV it was read from


_MARKUP = re.compile(r"</?[A-Za-z][^<>]*>|\[/EN#")  # an HTML tag (`<font color="red">`) or Flickr30k markup
_ESCAPED_QUOTE = re.compile(r"\\(['\"])")


def has_markup(cell: str) -> bool:
    """Whether a phrase cell carries markup instead of a phrase: an HTML tag left by the annotation interface (the
    published VGP-Typology val file has `his daughter</font> in <font color="red">his daughter`) or Flickr30k
    Entities markup (`[/EN#...`)."""
    return _MARKUP.search(cell) is not None


def unescape_phrase(cell: str) -> str:
    """A phrase cell as the captions write it: backslash-escaped quotes restored (`man \\'s lap` -> `man 's lap`, as
    in the published VGP-Typology train file), white space collapsed."""
    return " ".join(_ESCAPED_QUOTE.sub(r"\1", cell).split())


def read_vgp_csv(path: str | Path) -> list[VGPPair]:
    """Reads a VGP CSV in either published layout, detected from its header."""
    path = check_existing_path("path", path, "VGP CSV file")
    records = iter_csv_rows(path, read_text(path, encoding="utf-8-sig"))
    layout = _detect_layout(path, next(records, (1, None))[1])
    columns = LAYOUTS[layout]
    pairs = []
    for line, row in records:
        try:
            if len(row) != len(columns):
                raise ValueError(f"expected {len(columns)} columns ({layout} layout), got {len(row)}.")
            pair = _parse_row(dict(zip(columns, row)), layout)
        except ValueError as error:
            raise FileFormatError(f"{path}, line {line}: {error}") from None
        pair.line = line
        pairs.append(pair)
    return pairs


def _detect_layout(path: Path, header: list[str] | None) -> str:
    for layout, columns in LAYOUTS.items():
        if header == columns:
            return layout
    expected = "; ".join(f"{layout}: {','.join(columns)}" for layout, columns in LAYOUTS.items())
    raise ValueError(f"{path}, line 1: unknown VGP CSV header {header}; expected one of the layouts {expected}.")


def _parse_row(row: dict[str, str], layout: str) -> VGPPair:
    if not row["image"]:
        raise ValueError("column 'image' must hold an image id, got an empty cell.")
    type_label, original_label = _parse_labels(row["type_label"], row["original_label"])
    identification = layout == "identification"
    return VGPPair(
        image_id=row["image"],
        phrase1=row["preprocessed_phrase1" if identification else "phrase1"],
        phrase2=row["preprocessed_phrase2" if identification else "phrase2"],
        original_phrase1=row["original_phrase1"],
        original_phrase2=row["original_phrase2"],
        is_paraphrase=_parse_ytrue(row["ytrue"]) if identification else True,
        type_label=type_label,
        original_label=original_label,
        roi1=_parse_roi("roi1", row["roi1"]) if identification else None,
        roi2=_parse_roi("roi2", row["roi2"]) if identification else None,
    )


def _parse_labels(type_cell: str, original_label: str) -> tuple[int, str]:
    if type_cell == "":
        type_label = -1
    elif type_cell.isdigit() and int(type_cell) in TYPOLOGY_LABELS:
        type_label = int(type_cell)
    else:
        raise ValueError(f"column 'type_label' must be one of {sorted(TYPOLOGY_LABELS)} or empty, got {type_cell!r}.")
    if original_label and original_label not in TYPOLOGY_LABELS.values():
        raise ValueError(
            f"column 'original_label' must be one of {list(TYPOLOGY_LABELS.values())} or empty, "
            f"got {original_label!r}."
        )
    if type_label >= 0 and original_label and original_label != TYPOLOGY_LABELS[type_label]:
        raise ValueError(
            f"column 'original_label' must name type_label {type_label} ({TYPOLOGY_LABELS[type_label]}), "
            f"got {original_label!r}."
        )
    return type_label, original_label


def _parse_ytrue(cell: str) -> bool:
    if cell not in _BOOLEANS:
        raise ValueError(f"column 'ytrue' must be 'True' or 'False', got {cell!r}.")
    return _BOOLEANS[cell]


def _parse_roi(column: str, cell: str) -> int | None:
    if cell == "":
        return None
    try:
        return int(cell)
    except ValueError:
        raise ValueError(f"column '{column}' must be an integer region index (or empty), got {cell!r}.") from None


def write_vgp_csv(path: str | Path, pairs: list[VGPPair], layout: str = "identification") -> None:
    """Writes pairs in a published layout ("identification" or "typology"); `read_vgp_csv` reads them back equal.

    The typology layout has no `ytrue`/`roi` columns: it takes paraphrases only, and their rois are not written.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"`layout` must be one of {list(LAYOUTS)}, got {layout!r}.")
    rows = [_format_row(pair, index, layout) for index, pair in enumerate(pairs)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(LAYOUTS[layout])
        writer.writerows(rows)


def _format_row(pair: VGPPair, index: int, layout: str) -> list[str]:
    if layout == "typology" and not pair.is_paraphrase:
        raise ValueError(f"`pairs[{index}]`.is_paraphrase must be True for the typology layout (VGPs only), got False.")
    cells = {
        "image": pair.image_id,
        "phrase1": pair.phrase1,
        "phrase2": pair.phrase2,
        "original_phrase1": pair.original_phrase1,
        "original_phrase2": pair.original_phrase2,
        "original_label": pair.original_label,
        "type_label": "" if pair.type_label == -1 else str(pair.type_label),
    }
    if layout == "identification":
        cells.update(
            phrase1=pair.phrase1.replace(" ", "+"),
            phrase2=pair.phrase2.replace(" ", "+"),
            preprocessed_phrase1=pair.phrase1,
            preprocessed_phrase2=pair.phrase2,
            ytrue=str(bool(pair.is_paraphrase)),
            roi1="" if pair.roi1 is None else str(pair.roi1),
            roi2="" if pair.roi2 is None else str(pair.roi2),
        )
    return [cells[column] for column in LAYOUTS[layout]]
