"""`evaluate`, `fisher` and `results-table`: a saved model's task metric, its diagonal Fisher for EWC, and the table of
several training runs' results."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..utils.optional import require
from ..utils.size_limits import int_at_most
from .common import (
    NEEDS_DATA_FILE,
    SYNTHETIC_ONLY,
    USER_FILE,
    USER_FILE_OPTIONS,
    VGP_FILE_OPTIONS,
    Output,
    add_data_file_argument,
    add_max_examples_argument,
    add_model_argument,
    add_synthetic_arguments,
    add_vgp_file_arguments,
    imported_is_own,
    is_json_result,
    print_result,
    synthetic_config,
    write_json_result,
    write_result,
)

# the parser's choices, spelled out so that `--help` imports nothing heavy (tests/cli/test_cli.py checks them against
# `evaluation.tasks.TASKS`; tests/models/test_families.py checks them against the tasks of the families' `FamilySpec`s)
TASKS = ("vgp", "vqa", "gqa", "nlvr2", "refcoco", "flickr_grounding", "captioning")


def run_evaluate(args: argparse.Namespace) -> int:
    from ..evaluation.tasks import evaluate_task

    if args.task == "captioning":  # checked before the model runs
        require("pycocoevalcap", extra="caption-metrics")
    results = evaluate_task(
        args.model, args.task, data_file=args.data_file, synthetic=synthetic_config(args), batch_size=args.batch_size,
        max_text_length=args.max_text_length, max_examples=args.max_examples,
    )  # fmt: skip
    print_result(json.dumps(results, indent=2))
    if results.get("baselines"):  # for the reader, beside the JSON (stdout stays one JSON document)
        print(baseline_table(results["baselines"]), file=sys.stderr)
    if args.out is not None:
        write_json_result(args.out, results)
    return 0


def baseline_table(baselines: dict) -> str:
    """Markdown table of a `baselines` entry (`hf_vlalign.evaluation.baselines.compare_with_baselines`): each accuracy,
    its baseline and the baseline's kind, flagged when the accuracy does not beat it."""
    lines = ["| metric | value | baseline | kind | |", "|---|---|---|---|---|"]
    for key, entry in baselines.items():
        flag = "" if entry["beats"] else "⚠ does not beat its baseline"
        lines.append(f"| {key} | {entry['value']:.3f} | {entry['baseline']:.3f} | {entry['kind']} | {flag} |")
    return "\n".join(lines)


def add_evaluate(add_verb) -> None:
    parser = add_verb(
        "evaluate", "a saved model's task metric on the synthetic scenes' evaluation split", run_evaluate,
        option_settings=SYNTHETIC_ONLY | USER_FILE_OPTIONS, required_options=NEEDS_DATA_FILE,
        outputs={"out": Output("file", "an evaluation result", is_json_result("num_examples"))},
    )  # fmt: skip
    add_model_argument(parser, "an hf_vlalign checkpoint with the task's head")
    parser.add_argument(
        "--task", choices=TASKS, required=True,
        help="vgp (VisualParaphrase), vqa / gqa (QuestionAnswering; gqa: also a two-stream pre-training QA head), "
        "nlvr2 (VisualReasoning), refcoco (ReferringExpression), flickr_grounding (PhraseGrounding), captioning "
        "(the captioner)",
    )  # fmt: skip
    parser.add_argument(
        "--data", choices=("synthetic", USER_FILE), default="synthetic",
        help="the synthetic scenes' evaluation split, or your own file (--data_file)",
    )  # fmt: skip
    add_data_file_argument(
        parser, "the evaluation examples in the format of the task (vgp -> vgp, vqa / gqa -> vqa with answers named by "
        "the model folder's answer_vocab.json, nlvr2 -> nlvr2, refcoco -> refcoco, flickr_grounding and captioning -> "
        "caption)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the results to this JSON file")
    parser.add_argument(
        "--max_text_length", type=int_at_most("MAX_TEXT_LENGTH"), help="tokens per text of vqa, gqa (question-answering heads), nlvr2, refcoco "
        "and flickr_grounding (default: 48, as in the examples); the other evaluations read no cut text and refuse it",
    )  # fmt: skip
    add_max_examples_argument(
        parser, "evaluate only the first N examples (pairs, questions, statements, expressions, captions; captioning: "
        "images)", "the results' num_examples",
    )  # fmt: skip
    add_synthetic_arguments(parser)


def run_fisher(args: argparse.Namespace) -> int:
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer

    from ..data.builders import load_vgp_data
    from ..data.collators import VGPCollator
    from ..evaluation.tasks import load_model
    from ..trainers.regularization import anchor_weights, estimate_fisher, save_fisher

    model = load_model(args.model)
    if args.data == USER_FILE:
        from ..evaluation.user_files import load_user_file

        user_data = load_user_file(args.model, model.config, args.data_file, "vgp")
        dataset, store, source = user_data.train, user_data.store, str(args.data_file)
    else:
        data = load_vgp_data(*(getattr(args, name) for name in VGP_FILE_OPTIONS), synthetic_config=synthetic_config(args))
        dataset = data.train if args.split == "train" else data.eval
        store, source = data.region_features, f"{data.source} ({args.split})"
    collator = VGPCollator(AutoTokenizer.from_pretrained(args.model), store, vgp_task=model.config.vgp_task)
    dataloader = DataLoader(dataset, batch_size=args.batch_size, collate_fn=collator)
    fisher = estimate_fisher(model, dataloader, args.num_batches)
    write_result(args.out, lambda partial: save_fisher(partial, fisher, anchor_weights(model)))
    num_batches = min(len(dataloader), args.num_batches or len(dataloader))
    summary = {"out": str(args.out), "num_parameters": len(fisher), "num_batches": num_batches, "batch_size": args.batch_size}
    print_result(json.dumps(summary | {"data": source, "fisher_sum": float(sum(f.sum() for f in fisher.values()))}, indent=2))
    return 0


def add_fisher(add_verb) -> None:
    parser = add_verb(
        "fisher", "diagonal Fisher of a saved VGP model, for EWC (`--ewc_fisher` of the trainers' arguments)", run_fisher,
        option_settings=SYNTHETIC_ONLY
        | {name: ("data", ("vgp",)) for name in VGP_FILE_OPTIONS}
        | {"split": ("data", ("synthetic", "vgp"))}
        | USER_FILE_OPTIONS,
        required_options={("data", "vgp"): VGP_FILE_OPTIONS} | NEEDS_DATA_FILE,
        model_requirements=dict.fromkeys(("synthetic", "vgp", USER_FILE), ("architecture", "SingleStreamForVisualParaphrase")),
        outputs={"out": Output("file", "a Fisher file", imported_is_own("trainers.regularization", "is_fisher_file"))},
        data_file_task="vgp",
    )  # fmt: skip
    add_model_argument(parser, "a SingleStreamForVisualParaphrase checkpoint")
    parser.add_argument(
        "--data", choices=("synthetic", "vgp", USER_FILE), default="synthetic",
        help="synthetic scenes (offline), real VGP pairs (the four files below) or your own file (--data_file)",
    )  # fmt: skip
    add_data_file_argument(parser, "a `vgp` file (image, two captions, a phrase of each, which caption describes the image)")
    add_vgp_file_arguments(parser)
    parser.add_argument("--split", choices=("train", "eval"), default="train", help="the split the Fisher is estimated on (synthetic or vgp data)")
    parser.add_argument(
        "--out", type=Path, required=True, help="the safetensors file to write (Fisher and anchor weights)"
    )
    parser.add_argument("--num_batches", type=int_at_most("MAX_FISHER_BATCHES"), help="use only the first N batches (default: the whole split)")
    add_synthetic_arguments(parser)


RESULT_COLUMNS = (
    ("supervision", "supervision"),
    ("image_description_accuracy", "identification acc."),
    ("vgp_accuracy", "VGP acc."),
    ("grounding_accuracy_best_head", "grounding, best head"),
    ("grounding_accuracy_mean_head", "grounding, mean head"),
    ("grounding_baseline_accuracy", "grounding baseline"),
)
# the accuracies whose baseline the table shows beside them: the majority class of the training labels (the run's
# `baselines` entry, `hf_vlalign.evaluation.baselines`); the grounding accuracies' is the grounding baseline column,
# named by how the probe made it (its `kind`: detection confidence, store order, ...)
MAJORITY_COLUMNS = ("image_description_accuracy", "vgp_accuracy")
GROUNDING_COLUMNS = ("grounding_accuracy_best_head", "grounding_accuracy_mean_head")
# a run of a transformers patch model (examples/finetune_patch_vlm.py: its eval_results.json names the `model_family`)
# learns captions: it has no identification or VGP accuracy, shown "n/a"
PATCH_RUN_KEY = "model_family"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def read_eval_results(output_dir: str | Path) -> dict:
    """The `eval_results.json` of a run's `output_dir`: a JSON object holding every result of `RESULT_COLUMNS` (the
    supervision a string, the accuracies numbers; a patch model's run, `PATCH_RUN_KEY`, may lack the identification
    and VGP accuracies) and, when it has one, a `baselines` object whose entries hold a number `baseline`; else a
    ValueError naming the file and the key."""
    from ..data.formats.text_files import read_json_file

    path = Path(output_dir) / "eval_results.json"
    if not path.is_file():
        raise ValueError(f"`output_dirs` entry {output_dir} has no eval_results.json (run examples/finetune_vgp.py first).")
    results = read_json_file(path)
    if not isinstance(results, dict):
        raise ValueError(f"{path} must hold a JSON object of results, got {json.dumps(results)[:40]}.")
    for key, _ in RESULT_COLUMNS:
        if key in MAJORITY_COLUMNS and PATCH_RUN_KEY in results and key not in results:
            continue
        value = results.get(key)
        if not (isinstance(value, str) if key == "supervision" else _is_number(value)):
            kind = "a string" if key == "supervision" else "a number"
            raise ValueError(f"{path}: `{key}` must be {kind}, got {json.dumps(value)}.")
    baselines = results.get("baselines", {})
    for key, entry in baselines.items() if isinstance(baselines, dict) else [("", baselines)]:
        if not isinstance(entry, dict) or not _is_number(entry.get("baseline")):
            raise ValueError(f"{path}: `baselines.{key}` must be an object with a number `baseline`, got {json.dumps(entry)}.")
    return results


def results_table(output_dirs: list[Path]) -> str:
    """Markdown table of the `eval_results.json` of several runs (one row each): each accuracy beside its baseline
    (identification and VGP: the majority class of the training labels, "n/a" for a run that recorded none; grounding:
    the probe's baseline, its kind in brackets where the run recorded it: "0.200 (store order)"), and a last column
    naming the accuracies that do not beat their baseline."""
    titles = dict(RESULT_COLUMNS)
    header = ["supervision"]
    for key in MAJORITY_COLUMNS:
        header += [titles[key], "majority class"]
    header += [titles[key] for key in (*GROUNDING_COLUMNS, "grounding_baseline_accuracy")] + ["⚠ not above baseline"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for output_dir in output_dirs:
        results = read_eval_results(output_dir)
        baselines = {key: entry["baseline"] for key, entry in results.get("baselines", {}).items()}
        baselines |= dict.fromkeys(GROUNDING_COLUMNS, results["grounding_baseline_accuracy"])
        cells = [results["supervision"]]
        for key in MAJORITY_COLUMNS:
            cells += [f"{results[key]:.3f}" if key in results else "n/a", f"{baselines[key]:.3f}" if key in baselines else "n/a"]
        cells += [f"{results[key]:.3f}" for key in GROUNDING_COLUMNS]
        cells.append(f"{results['grounding_baseline_accuracy']:.3f}{_grounding_baseline_kind(results)}")
        below = [titles[key] for key in (*MAJORITY_COLUMNS, *GROUNDING_COLUMNS) if key in baselines and key in results and results[key] <= baselines[key]]
        cells.append("⚠ " + ", ".join(below) if below else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _grounding_baseline_kind(results: dict) -> str:
    """" (store order)": the kind of the run's grounding baseline in brackets, "" when the run recorded none."""
    entry = results.get("baselines", {}).get(GROUNDING_COLUMNS[0])
    return f" ({entry['kind'].replace('_', ' ')})" if isinstance(entry, dict) and isinstance(entry.get("kind"), str) else ""


def run_results_table(args: argparse.Namespace) -> int:
    print_result(results_table(args.output_dirs))
    return 0


def add_results_table(add_verb) -> None:
    parser = add_verb("results-table", "markdown table of several runs' eval_results.json", run_results_table)
    parser.add_argument(
        "output_dirs", nargs="+", type=Path, help="the --output_dir of each examples/finetune_vgp.py or "
        "examples/finetune_patch_vlm.py run (a VLM's caption run has no identification or VGP accuracy: n/a)",
    )  # fmt: skip


VERB_PARSERS = (add_evaluate, add_fisher, add_results_table)
