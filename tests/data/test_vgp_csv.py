"""VGP CSV reader and writer, on both published layouts and on hand-made cases."""

from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path

import pytest

from hf_vlalign.data.formats import TYPOLOGY_LABELS, VGPPair, read_vgp_csv, write_vgp_csv


DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
TYPOLOGY_FILES = ["VGP-Typology/train_data.csv", "VGP-Typology/val_data.csv"]
IDENTIFICATION_FILES = ["RA_Files/full_data_type_phrase_pair_train.csv", "RA_Files/full_data_type_phrase_pair_val.csv"]
TYPOLOGY_HEADER = "image,phrase1,phrase2,original_phrase1,original_phrase2,original_label,type_label\n"


def real_file(name: str) -> Path:
    path = DATA / "vgp" / name
    if not path.is_file():
        pytest.fail(f"Real VGP sample missing: expected {path} (the folder shared/ beside the repository root).")
    return path


def raw_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


# ----------------------------------------------------------------------------------------------------------------
# Real files
# ----------------------------------------------------------------------------------------------------------------


def test_read_typology_layout():
    pairs = read_vgp_csv(real_file("VGP-Typology/train_data.csv"))

    assert len(pairs) == 323
    assert pairs[0] == VGPPair(
        image_id="36979",
        phrase1="group friends",
        phrase2="six white males",
        original_phrase1="A group of friends",
        original_phrase2="Six white males",
        is_paraphrase=True,
        type_label=4,
        original_label="Independence",
    )


def test_read_identification_layout():
    pairs = read_vgp_csv(real_file("RA_Files/full_data_type_phrase_pair_train.csv"))

    assert len(pairs) == 305
    assert pairs[0] == VGPPair(
        image_id="3359636318",
        phrase1="group people",
        phrase2="people",
        original_phrase1="A group of people",
        original_phrase2="People",
        is_paraphrase=True,
        type_label=1,
        original_label="Entailment1",
        roi1=45,
        roi2=45,
    )
    assert any(pair.roi1 == -1 for pair in pairs)
    assert all(pair.is_paraphrase for pair in pairs)


@pytest.mark.parametrize("name", TYPOLOGY_FILES + IDENTIFICATION_FILES)
def test_typology_label_mapping_matches_the_data(name):
    rows = raw_rows(real_file(name))
    assert {(int(row["type_label"]), row["original_label"]) for row in rows} == set(TYPOLOGY_LABELS.items())
    assert Counter(pair.type_label for pair in read_vgp_csv(real_file(name))) == Counter(
        int(row["type_label"]) for row in rows
    )


def test_both_layouts_agree_on_shared_pairs():
    typology = {
        (p.image_id, p.original_phrase1, p.original_phrase2): p for p in read_vgp_csv(real_file(TYPOLOGY_FILES[1]))
    }
    shared = 0
    for pair in read_vgp_csv(real_file(IDENTIFICATION_FILES[1])):
        other = typology.get((pair.image_id, pair.original_phrase1, pair.original_phrase2))
        if other is not None:
            shared += 1
            assert (pair.phrase1, pair.phrase2, pair.type_label) == (other.phrase1, other.phrase2, other.type_label)
    assert shared > 400


@pytest.mark.parametrize("name", TYPOLOGY_FILES)
def test_typology_file_round_trips_byte_for_byte(tmp_path, name):
    path = real_file(name)
    write_vgp_csv(tmp_path / "out.csv", read_vgp_csv(path), layout="typology")
    assert (tmp_path / "out.csv").read_bytes() == path.read_bytes()


@pytest.mark.parametrize("name", IDENTIFICATION_FILES)
def test_identification_file_round_trips(tmp_path, name):
    path = real_file(name)
    pairs = read_vgp_csv(path)
    write_vgp_csv(tmp_path / "out.csv", pairs, layout="identification")

    assert read_vgp_csv(tmp_path / "out.csv") == pairs
    for written, published in zip(raw_rows(tmp_path / "out.csv"), raw_rows(path), strict=True):
        # the '+'-joined `phrase` columns are rebuilt from the preprocessed phrase; every other cell is kept
        assert {k: v for k, v in written.items() if k not in ("phrase1", "phrase2")} == {
            k: v for k, v in published.items() if k not in ("phrase1", "phrase2")
        }


# ----------------------------------------------------------------------------------------------------------------
# Hand-made round trips
# ----------------------------------------------------------------------------------------------------------------


def test_non_paraphrases_and_missing_values_round_trip(tmp_path):
    pairs = [
        VGPPair("1", "red car", "a, b", "a red car", 'the "b"', False, -1, "", roi1=None, roi2=3),
        VGPPair("2", "dog", "puppy", "a dog", "the puppy", True, 2, "Entailment2", roi1=0, roi2=-1),
    ]
    write_vgp_csv(tmp_path / "pairs.csv", pairs)
    assert read_vgp_csv(tmp_path / "pairs.csv") == pairs

    write_vgp_csv(tmp_path / "typed.csv", pairs[1:], layout="typology")
    typed = VGPPair("2", "dog", "puppy", "a dog", "the puppy", True, 2, "Entailment2")  # rois are not in this layout
    assert read_vgp_csv(tmp_path / "typed.csv") == [typed]


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------


def test_unknown_header(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("image,phrase_a,phrase_b\n1,a,b\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}, line 1: unknown VGP CSV header \['image', 'phr"):
        read_vgp_csv(path)
    path.write_text("")
    with pytest.raises(ValueError, match=r"line 1: unknown VGP CSV header None"):
        read_vgp_csv(path)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("1,a,b,A,B,Entailment1,7", r"column 'type_label' must be one of \[0, 1, 2, 3, 4\] or empty, got '7'"),
        ("1,a,b,A,B,Entailment1,one", r"column 'type_label' must be one of .* got 'one'"),
        ("1,a,b,A,B,Entailment3,", r"column 'original_label' must be one of .* got 'Entailment3'"),
        ("1,a,b,A,B,Alternation,3", r"column 'original_label' must name type_label 3 \(Equivalence\), got 'Altern"),
        ("1,a,b,A,B,Alternation", r"expected 7 columns \(typology layout\), got 6"),
        (",a,b,A,B,Alternation,0", r"column 'image' must hold an image id, got an empty cell"),
    ],
)
def test_bad_typology_rows(tmp_path, row, problem):
    path = tmp_path / "bad.csv"
    path.write_text(TYPOLOGY_HEADER + "1,a,b,A,B,Alternation,0\n" + row + "\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}, line 3: {problem}"):
        read_vgp_csv(path)


@pytest.mark.parametrize(
    ("cells", "problem"),
    [
        ("yes,1,1", r"column 'ytrue' must be 'True' or 'False', got 'yes'"),
        ("True,x,1", r"column 'roi1' must be an integer region index \(or empty\), got 'x'"),
    ],
)
def test_bad_identification_rows(tmp_path, cells, problem):
    path = tmp_path / "bad.csv"
    header = real_file(IDENTIFICATION_FILES[0]).read_text(encoding="utf-8").splitlines()[0]
    path.write_text(f"{header}\n1,a,b,A,B,{cells},a,b,Alternation,0\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}, line 2: {problem}"):
        read_vgp_csv(path)


def test_writer_rejects_what_it_cannot_read_back(tmp_path):
    with pytest.raises(ValueError, match=r"`layout` must be one of \['typology', 'identification'\], got 'nli'"):
        write_vgp_csv(tmp_path / "x.csv", [], layout="nli")
    negative = VGPPair("1", "a", "b", "A", "B", False, -1, "")
    with pytest.raises(ValueError, match=r"`pairs\[0\]`.is_paraphrase must be True for the typology layout"):
        write_vgp_csv(tmp_path / "x.csv", [negative], layout="typology")
