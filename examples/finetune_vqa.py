#!/usr/bin/env python
"""Fine-tune a single-stream or two-stream model on question answering (GQA, VQA v2): answer classification over an
answer vocabulary, optionally with attention supervision from GQA's pointers.

    accelerate launch examples/finetune_vqa.py          # offline: the synthetic scenes' GQA-format questions, MiniLM
    accelerate launch examples/finetune_vqa.py --model_family two_stream --supervision direct
    accelerate launch examples/finetune_vqa.py --dataset gqa --data_dir GQA --features STORE_DIR \
        --answer_vocab trainval_ans2label.json --scene_graphs train_sceneGraphs.json \
        --eval_scene_graphs val_sceneGraphs.json --supervision direct
    accelerate launch examples/finetune_vqa.py --dataset vqa_v2 --data_dir VQA --features STORE_DIR \
        --answer_vocab trainval_ans2label.json --image_id_template "COCO_{split}_{id:012d}"

(`hf-vlalign convert-features` makes STORE_DIR; relative `--answer_vocab`, `--scene_graphs`, `--questions_file` and
`--annotations_file` paths are read from `--data_dir`, as the builders do.)

GQA rows have one answer id (cross-entropy); VQA v2 rows have soft scores min(#annotators / 3, 1) over the answers
(binary cross-entropy). GQA's pointers ground question words to objects: with scene graphs they give
`word_region_alignment`, which `--supervision direct|semi_direct|indirect` trains the attention towards.

Metrics, every `--eval_steps` and at the end: `accuracy` (GQA: the predicted answer id is the gold one; VQA v2: the
soft score of the predicted answer), plus for GQA the official script's `gqa_binary`, `gqa_open`, `gqa_distribution`
(and `gqa_consistency` when the entailed questions are evaluated too: `--gqa_eval_subset all`, the synthetic scenes'
too: GQA's practice is training on the balanced questions and scoring consistency on the "all" evaluation file)
from `hf_vlalign.metrics.gqa_scores`, and for VQA v2 the official `vqa_accuracy` (and per answer type) from
`hf_vlalign.metrics.vqa_accuracy`. The evaluation split's
soft targets are gathered in memory: evaluate large VQA splits with --max_eval_samples (or on minival).

How long it trains: until the validation score stops improving. The default run evaluates every tenth of its
10-epoch cap (`--eval_steps 0.1`: once per epoch, at least 50 steps apart) and stops once `accuracy`
(`--metric_for_best_model`) has not improved for 2 evaluations in a row (`--early_stopping_patience 2`, transformers'
EarlyStoppingCallback; the last step's model is kept). A `--num_train_epochs` or `--max_steps` you give is trained
in full, unless you give `--early_stopping_patience N` too.

Writes to --output_dir: safetensors weights, config, tokenizer, `answer_vocab.json` (answer -> id of the head's
`num_qa_labels` outputs, the ans2label layout that --answer_vocab reads), `eval_results.json`, `learning_curve.json`
(step, epoch, training loss and evaluation metrics at every evaluation; whether and why the run stopped early),
README.md (model card), `training_args.json` and TensorBoard logs under runs/ (when tensorboard is installed).
Every transformers `TrainingArguments` flag works too (--seed, --eval_steps, --push_to_hub, --resume_from_checkpoint,
--gradient_accumulation_steps, ...), and those of `TaskTrainingArguments` (--distill_from, --ewc_weight, ...).
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
from transformers import set_seed

from hf_vlalign import SingleStreamForQuestionAnswering, TwoStreamForQuestionAnswering
from hf_vlalign.data import RegionFeatureStore, build_dataset, resolve_split
from hf_vlalign.data.builders import gqa, vqa_v2
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import QuestionAnsweringCollator
from hf_vlalign.evaluation.baselines import compare_with_baselines, question_answering_baselines
from hf_vlalign.evaluation.diagnostics import mechanism_diagnostics
from hf_vlalign.evaluation.task_metrics import answer_metrics, predicted_answer_ids
from hf_vlalign.hub.model_card import render_task_model_card
from hf_vlalign.metrics.gqa import is_balanced
from hf_vlalign.recipes import (
    DEFAULT_BASE_MODEL,
    DataArguments,
    ModelArguments,
    build_processor,
    evaluation_subset,
    final_evaluation,
    first_rows,
    image_use_results,
    load_task_model,
    load_tokenizer,
    load_user_splits,
    parse_recipe_args,
    save_model,
    synthetic_scene_config,
    take_push_to_hub,
    training_callbacks,
    training_summary,
    truncation_results,
    write_results,
)
from hf_vlalign.synthetic import load_or_generate_synthetic_vgp
from hf_vlalign.synthetic.questions import ANSWER_VOCAB_FILE
from hf_vlalign.trainers import TaskTrainer, TaskTrainingArguments
from hf_vlalign.utils.user_errors import run_command

logger = logging.getLogger(__name__)

TASK_CLASSES = {"single_stream": SingleStreamForQuestionAnswering, "two_stream": TwoStreamForQuestionAnswering}
DATASETS = ("synthetic_scenes", "gqa", "vqa_v2")
DEFAULT_SPLITS = {"synthetic_scenes": ("train", "val"), "gqa": ("train", "val"), "vqa_v2": ("train", "val")}
# the file arguments each dataset reads; one it does not read is an error rather than silently ignored
DATASET_ARGUMENTS = {
    "synthetic_scenes": (),
    "gqa": ("answer_vocab", "scene_graphs", "eval_scene_graphs", "questions_file", "eval_questions_file"),
    "vqa_v2": (
        "answer_vocab", "questions_file", "eval_questions_file", "annotations_file", "eval_annotations_file",
        "image_id_template",
    ),
}  # fmt: skip
# the dataset files that `--train_file` replaces (its answer vocabulary is that of its training answers)
USER_DATA_REPLACES = tuple(dict.fromkeys(name for names in DATASET_ARGUMENTS.values() for name in names))
USER_DATA = "user data"
ANSWER_VOCAB_NAME = "answer_vocab.json"
SPEED_METRICS = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


@dataclass
class QuestionAnsweringArguments:
    answer_vocab: str | None = field(
        default=None,
        metadata={
            "help": "ans2label JSON ({answer: id}; LXMERT's trainval_ans2label.json). Required for GQA; VQA v2 builds "
            "it from the train annotations when absent (answers of >= --min_answer_count questions)."
        },
    )
    scene_graphs: str | None = field(
        default=None, metadata={"help": "GQA: train_sceneGraphs.json (the pointers' boxes: needed for --supervision)."}
    )
    eval_scene_graphs: str | None = field(default=None, metadata={"help": "GQA: val_sceneGraphs.json."})
    gqa_subset: str = field(
        default="balanced",
        metadata={"help": "GQA and the synthetic scenes: balanced | all, the training questions (all adds the "
                  "unbalanced ones)."},
    )
    gqa_eval_subset: str | None = field(
        default=None,
        metadata={"help": "balanced | all, the evaluation questions (default: --gqa_subset). all holds the questions "
                  "the balanced ones entail, which gqa_consistency needs; gqa_accuracy scores the balanced ones."},
    )
    questions_file: str | None = field(
        default=None, metadata={"help": "GQA / VQA v2: the training questions file, replacing the official name."}
    )
    eval_questions_file: str | None = field(default=None, metadata={"help": "the evaluation questions file."})
    annotations_file: str | None = field(default=None, metadata={"help": "VQA v2: the training annotations file."})
    eval_annotations_file: str | None = field(default=None, metadata={"help": "VQA v2: the evaluation annotations."})
    min_answer_count: int = field(default=9, metadata={"help": "VQA v2 without --answer_vocab: the vocabulary rule."})
    image_id_template: str | None = field(
        default=None,
        metadata={
            "help": "VQA v2: the feature store's image ids, e.g. 'COCO_{split}_{id:012d}' (default: tries both)."
        },
    )


def parse_args(argv: list[str]) -> tuple[ModelArguments, DataArguments, QuestionAnsweringArguments, TaskTrainingArguments]:
    return parse_recipe_args(
        argv,
        (ModelArguments, DataArguments, QuestionAnsweringArguments),
        TaskTrainingArguments,
        data_source_flags=(*USER_DATA_REPLACES, "gqa_subset", "gqa_eval_subset", "min_answer_count"),
        output_dir="outputs/vqa",
        # the default run (synthetic scenes, MiniLM): ~2,400 training questions, evaluated on ~790 questions once per
        # epoch, until `accuracy` stops improving (2 evaluations without a new best) or 10 epochs: one epoch leaves a
        # simple set's validation score still rising (benchmarks/simple_vqa_ceiling.py: 600 images need ~4 epochs)
        synthetic_train_images=300,
        synthetic_eval_images=100,
        num_train_epochs=10,
        eval_steps=0.1,
        metric_for_best_model="accuracy",
        early_stopping_patience=2,
        # the copied text encoder at BERT's 5e-5, the new visual embeddings and answer head at 1e-3: with one rate of
        # 2e-4 yes/no questions stay at their prior however long it trains (benchmarks/simple_vqa_ceiling.py)
        learning_rate=5e-5,
        head_learning_rate=1e-3,
        warmup_steps=20,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=64,
        save_steps=500,
    )


@dataclass
class QuestionAnsweringData:
    """The two splits joined to their region features, the answer vocabulary and what the metrics read."""

    train: datasets.Dataset
    eval: datasets.Dataset
    store: RegionFeatureStore
    answer_vocab: dict[str, int]
    dataset: str
    # GQA: the evaluation rows' question records as published (`gqa_scores` reads their types); None for VQA v2
    eval_questions: dict[str, dict] | None
    # `--train_file`: what the data is, and the `extract_region_features` options of its features
    source: str | None = None
    region_options: dict | None = None


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def check_data_arguments(data_args: DataArguments, qa_args: QuestionAnsweringArguments) -> str:
    """The dataset name (synthetic_scenes when --dataset is not given), after checking the arguments it needs."""
    dataset = data_args.dataset or "synthetic_scenes"
    if dataset not in DATASETS:
        raise ValueError(f"`--dataset` must be one of {DATASETS[1:]} (or absent: synthetic scenes), got {dataset!r}.")
    files = dict.fromkeys(name for arguments in DATASET_ARGUMENTS.values() for name in arguments)
    given = [name for name in ("data_dir", "features") if getattr(data_args, name) is not None]
    given += [name for name in files if getattr(qa_args, name) is not None]
    unread = [name for name in given if name in files and name not in DATASET_ARGUMENTS[dataset]]
    for flag in ("gqa_subset", "gqa_eval_subset"):
        value = getattr(qa_args, flag)
        if value is not None and value not in gqa.SUBSETS:
            raise ValueError(f"`--{flag}` must be one of {list(gqa.SUBSETS)}, got {value!r}.")
    if dataset == "vqa_v2" and qa_args.gqa_eval_subset is not None:
        raise ValueError("`--gqa_eval_subset` is not read by `--dataset vqa_v2` (GQA's question files only).")
    if dataset == "synthetic_scenes" and given:
        raise ValueError(
            f"`--{given[0]}` reads a real dataset: pass `--dataset gqa` or `--dataset vqa_v2` with it (the synthetic "
            "scenes are generated into $HF_VLALIGN_CACHE)."
        )
    if unread:
        raise ValueError(
            f"`--{unread[0]}` is not read by `--dataset {dataset}` (it reads {DATASET_ARGUMENTS[dataset]})."
        )
    if dataset == "synthetic_scenes":
        return dataset
    if data_args.features is None:
        raise ValueError(
            f"`--features` is required with `--dataset {dataset}`: a RegionFeatureStore folder of its images."
        )
    if dataset == "gqa" and qa_args.answer_vocab is None:
        raise ValueError(
            "`--answer_vocab` is required with `--dataset gqa`: an ans2label JSON such as trainval_ans2label.json."
        )
    return dataset


def _resolve(data_dir: str | None, path: str) -> Path:
    """A relative path is read from `data_dir`, as the builders read their options."""
    return Path(data_dir) / path if data_dir is not None and not Path(path).is_absolute() else Path(path)


def load_user_questions(data_args: DataArguments, training_args: TaskTrainingArguments) -> QuestionAnsweringData:
    """`--train_file` / `--validation_file` of `vqa` rows, scored as VQA v2 (each answer's soft score is the credit
    `vqa_accuracy` gives it: 1 for a single answer); the vocabulary holds every answer of the training file."""
    user = load_user_splits(data_args, "vqa", training_args)
    train = first_rows(user.train, data_args.max_train_samples)
    evaluation = first_rows(user.eval, data_args.max_eval_samples)
    return QuestionAnsweringData(
        train, evaluation, user.store, user.answer_vocab, USER_DATA, None, user.source, user.region_options
    )


def load_question_data(
    data_args: DataArguments, qa_args: QuestionAnsweringArguments, training_args: TaskTrainingArguments | None = None
) -> QuestionAnsweringData:
    """Train and evaluation rows of `--train_file` (which needs `training_args`), `--dataset` or, by default, the
    synthetic scenes' GQA-format questions."""
    if data_args.train_file is not None:
        return load_user_questions(data_args, training_args)
    name = check_data_arguments(data_args, qa_args)
    train_split, eval_split = (  # "validation" names the dataset's validation split (it reads its files by name)
        resolve_split(name, data_args.train_split or DEFAULT_SPLITS[name][0]),
        resolve_split(name, data_args.eval_split or DEFAULT_SPLITS[name][1]),
    )
    if name == "synthetic_scenes":
        config = synthetic_scene_config(data_args)
        store = synthetic_region_features(config=config)
        questions_dir = load_or_generate_synthetic_vgp(config=config).gqa_dir
        vocab = vqa_v2.read_answer_vocab(questions_dir / ANSWER_VOCAB_FILE)

        def load(split: str, subset: str, **_) -> datasets.Dataset:
            # subset all: the balanced questions and those they entail (GQA's consistency needs the latter)
            return build_dataset(
                name, None, split, task="questions", config=config, region_features=store, subset=subset
            )

    else:
        store = RegionFeatureStore.load(data_args.features)
        questions_dir = data_args.data_dir
        vocab = _answer_vocab(name, data_args.data_dir, qa_args)
        def load(split: str, subset: str, **files) -> datasets.Dataset:
            files = {key: value for key, value in files.items() if value is not None}
            options = (
                {"subset": subset}
                if name == "gqa"
                else {"min_answer_count": qa_args.min_answer_count, "image_id_template": qa_args.image_id_template}
            )
            return build_dataset(name, data_args.data_dir, split, region_features=store, answer_vocab=vocab, **options, **files)

    gqa_format = name != "vqa_v2"
    train_files = {"questions_file": qa_args.questions_file}
    eval_files = {"questions_file": qa_args.eval_questions_file}
    if gqa_format:
        train_files["scene_graphs"], eval_files["scene_graphs"] = qa_args.scene_graphs, qa_args.eval_scene_graphs
    else:
        train_files["annotations_file"], eval_files["annotations_file"] = (
            qa_args.annotations_file,
            qa_args.eval_annotations_file,
        )
    eval_questions_subset = qa_args.gqa_eval_subset or qa_args.gqa_subset
    train = first_rows(
        _answered_training_rows(load(train_split, qa_args.gqa_subset, **train_files), gqa_format),
        data_args.max_train_samples,
    )
    eval_dataset = first_rows(load(eval_split, eval_questions_subset, **eval_files), data_args.max_eval_samples)
    _check_eval_answers(eval_dataset, eval_split, gqa_format)
    eval_questions = None
    if gqa_format:
        files = gqa.question_files(
            Path(questions_dir) if questions_dir is not None else None,
            eval_split,
            eval_questions_subset,
            qa_args.eval_questions_file,
        )
        records = gqa.read_questions(files)
        eval_questions = {question_id: records[question_id] for question_id in eval_dataset["question_id"]}
    return QuestionAnsweringData(train, eval_dataset, store, vocab, name, eval_questions)


def _answer_vocab(name: str, data_dir: str | None, qa_args: QuestionAnsweringArguments) -> dict[str, int]:
    if qa_args.answer_vocab is not None:
        return vqa_v2.read_answer_vocab(_resolve(data_dir, qa_args.answer_vocab))
    # VQA v2 without a vocabulary: the `compute_softscore` rule over the train annotations, as the builder would
    annotations = qa_args.annotations_file or vqa_v2.ANNOTATIONS_FILE["train"]
    if data_dir is None and qa_args.annotations_file is None:
        raise ValueError("`--answer_vocab` is None and so is `--data_dir`: pass one of them (or `--annotations_file`).")
    return vqa_v2.build_answer_vocab(_resolve(data_dir, annotations), min_count=qa_args.min_answer_count)


def _answered_training_rows(dataset: datasets.Dataset, gqa_format: bool) -> datasets.Dataset:
    """GQA training rows whose answer is in the vocabulary (the others carry no loss: LXMERT drops them too)."""
    if not gqa_format:
        return dataset
    kept = [index for index, label in enumerate(dataset["label"]) if label >= 0]
    if len(kept) < len(dataset):
        logger.warning(
            "%d of %d training questions dropped: no answer in the vocabulary.", len(dataset) - len(kept), len(dataset)
        )
    if not kept:
        raise ValueError(
            "no training question has its answer in `--answer_vocab`; is it the vocabulary of this dataset?"
        )
    return dataset.select(kept)


def _check_eval_answers(dataset: datasets.Dataset, split: str, gqa_format: bool) -> None:
    unanswered = (
        sum(answer is None for answer in dataset["answer"]) if gqa_format else sum(not a for a in dataset["answers"])
    )
    if unanswered:
        raise ValueError(
            f"`--eval_split` {split!r}: {unanswered} of {len(dataset)} questions have no published answer; evaluate on "
            "a split with answers (GQA: val or testdev; VQA v2: val)."
        )


def count_grounded_questions(dataset: datasets.Dataset) -> int:
    """Questions with at least one pointer joined to the image's regions (what attention supervision learns from)."""
    if "question_phrase_regions" not in dataset.column_names:
        return 0
    return sum(any(sum(row) > 0 for row in regions) for regions in dataset["question_phrase_regions"])


# ----------------------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------------------


def balanced_questions(data: QuestionAnsweringData) -> datasets.Dataset:
    """The evaluation rows GQA's accuracy scores: the balanced questions, without the entailed ones that
    `--gqa_eval_subset all` adds for consistency (mostly "Is there a X?" of a shape the question names: "yes")."""
    if data.eval_questions is None:
        return data.eval
    balanced = [is_balanced(data.eval_questions[qid]) for qid in data.eval["question_id"]]
    return data.eval.select([index for index, keep in enumerate(balanced) if keep])


def image_use_questions(data: QuestionAnsweringData) -> datasets.Dataset:
    """The rows of the image-use check: the balanced questions, or every evaluated question when the balanced ones
    show a single image (another image's regions need a second image)."""
    balanced = balanced_questions(data)
    return balanced if len(set(balanced["image_id"])) >= 2 else data.eval


def majority_baseline(data: QuestionAnsweringData) -> tuple[str, float]:
    """The most frequent training answer (VQA v2: by summed soft score) and its `accuracy` on the evaluation split."""
    answers = sorted(data.answer_vocab, key=data.answer_vocab.get)
    if "label" in data.train.column_names:
        majority = Counter(data.train["label"]).most_common(1)[0][0]
        return answers[majority], float(np.mean([label == majority for label in data.eval["label"]]))
    totals = Counter()
    for labels, scores in zip(data.train["labels"], data.train["scores"]):
        totals.update(dict(zip(labels, scores)))
    majority = totals.most_common(1)[0][0]
    eval_scores = [
        dict(zip(labels, scores)).get(majority, 0.0) for labels, scores in zip(data.eval["labels"], data.eval["scores"])
    ]
    return answers[majority], float(np.mean(eval_scores))


# ----------------------------------------------------------------------------------------------------------------
# Run
# ----------------------------------------------------------------------------------------------------------------


def check_supervision(model_args: ModelArguments, data: QuestionAnsweringData) -> None:
    """Attention supervision needs grounded question words: GQA's pointers with scene graphs."""
    if model_args.supervision == "none":
        return
    grounded = count_grounded_questions(data.train)
    if grounded == 0:
        remedy = (
            "give `phrases` with boxes in the rows of `--train_file`"
            if data.dataset == USER_DATA
            else "use GQA with `--scene_graphs` (VQA v2 has no pointers)"
        )
        raise ValueError(
            f"`--supervision {model_args.supervision}` needs questions whose words point to regions, but no training "
            f"question of {data.dataset} has one; {remedy}."
        )
    logger.info("%d of %d training questions have grounded words (attention supervision).", grounded, len(data.train))


def write_report(
    trainer, metrics, data, model_args, data_args, training_args, baseline, push_to_hub, truncation, image_use
) -> dict:
    """`answer_vocab.json`, `eval_results.json` and the model card in --output_dir, then the push (main process)."""
    output_dir = Path(training_args.output_dir)
    (output_dir / ANSWER_VOCAB_NAME).write_text(json.dumps(data.answer_vocab, indent=1) + "\n")
    majority_answer, majority_accuracy = baseline
    results = {
        **{key.removeprefix("eval_"): value for key, value in metrics.items() if _is_metric(key)},
        "eval_loss": metrics["eval_loss"],
        "majority_baseline_accuracy": majority_accuracy,
        "majority_answer": majority_answer,
        "dataset": data.dataset,
        "data": data_source(data, data_args),
        "model_family": model_args.model_family,
        "supervision": model_args.supervision,
        "num_answers": len(data.answer_vocab),
        "eval_examples": len(data.eval),
        "truncation": truncation,
        "image_use": image_use,
        "diagnostics": mechanism_diagnostics(
            image_use, {"gqa" if data.dataset == "gqa" else "vqa": "accuracy"}, trainer.state.log_history,
            attention_loss_key="loss_attention_supervision",
        ),  # fmt: skip
    }
    baselines = question_answering_baselines(data.answer_vocab, data.train, data.eval, data.eval_questions)
    results["baselines"] = compare_with_baselines(results, baselines)
    training = {
        **training_summary(trainer, data_source(data, data_args), len(data.eval)),
        "answer_vocabulary": f"{len(data.answer_vocab)} answers ({ANSWER_VOCAB_NAME})",
        "supervision": model_args.supervision,
    }
    card = render_task_model_card(
        "question_answering",
        model_family=model_args.model_family,
        model_id=training_args.hub_model_id,
        base_model=model_args.model_name_or_path or DEFAULT_BASE_MODEL,
        results={key: value for key, value in results.items() if isinstance(value, float)},
        baselines=results["baselines"],
        training=training,
        config=trainer.model.config,
        synthetic_data=data.dataset == "synthetic_scenes",
        dataset_name=None if data.dataset == "synthetic_scenes" else data.dataset,
    )
    write_results(
        output_dir,
        results,
        card,
        push_to_hub=push_to_hub,
        training_args=training_args,
        commit_message=f"hf_vlalign {data.dataset} question answering ({model_args.model_family})",
    )
    return results


def _is_metric(key: str) -> bool:
    """The task metrics and loss components of `trainer.evaluate()`'s dict (`eval_loss` is kept under its name)."""
    return key.startswith("eval_") and key not in ("eval_loss", *SPEED_METRICS)


def data_source(data: QuestionAnsweringData, data_args: DataArguments) -> str:
    if data.source is not None:
        return data.source
    if data.dataset == "synthetic_scenes":
        return (
            f"synthetic scenes' GQA-format questions ({data_args.synthetic_train_images} train / "
            f"{data_args.synthetic_eval_images} eval images, seed {data_args.synthetic_seed})"
        )
    return f"{data.dataset} ({data_args.data_dir})"


def main(argv: list[str] | None = None) -> dict:
    model_args, data_args, qa_args, training_args = parse_args(sys.argv[1:] if argv is None else argv)
    set_seed(training_args.seed)
    with training_args.main_process_first(desc="loading the data"):  # the synthetic scenes are generated once
        data = load_question_data(data_args, qa_args, training_args)
    check_supervision(model_args, data)
    model = load_task_model(TASK_CLASSES, model_args, data.store.feature_dim, num_qa_labels=len(data.answer_vocab))
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    collator = QuestionAnsweringCollator(
        tokenizer=tokenizer,
        region_features=data.store,
        num_answers=len(data.answer_vocab),
        max_text_length=data_args.max_text_length,
    )
    # questions longer than max_text_length are truncated (their cut pointers lose their alignment): counted
    data.train, train_truncation = collator.drop_overlong_rows(data.train, f"{data.dataset} train")
    data.eval, eval_truncation = collator.drop_overlong_rows(data.eval, f"{data.dataset} eval")
    push_to_hub = take_push_to_hub(training_args)
    eval_subset = evaluation_subset(data.eval, data_args.eval_subset_size, training_args.seed)
    training_args.label_names = ["labels"]  # what compute_metrics reads
    trainer = TaskTrainer(
        model=model,
        args=training_args,
        train_dataset=data.train,
        eval_dataset=eval_subset,
        data_collator=collator,
        # the processor is saved with the model and in every checkpoint-N
        processing_class=build_processor(tokenizer, model, data.store, data.region_options),
        compute_metrics=answer_metrics(data.answer_vocab, data.eval_questions, eval_subset),
        preprocess_logits_for_metrics=predicted_answer_ids,
        # bounded evaluations, early stopping on `accuracy`, learning_curve.json
        callbacks=training_callbacks(training_args, len(eval_subset), data_args.early_stopping_patience),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    save_model(trainer, training_args.output_dir)
    metrics = final_evaluation(
        trainer, data.eval, lambda rows: answer_metrics(data.answer_vocab, data.eval_questions, rows)
    )
    # own image vs another image's regions: ~0 means the answers come from the question alone
    image_use = image_use_results(
        trainer.model, image_use_questions(data), collator, training_args.per_device_eval_batch_size,
        training_args.seed, data_args.image_use_examples, group_column="answer_type",
    )  # fmt: skip
    results = {}
    if trainer.is_world_process_zero():
        baseline = majority_baseline(data)
        truncation = truncation_results(
            data_args.max_text_length, {"train": train_truncation, "eval": eval_truncation}, [collator]
        )
        results = write_report(
            trainer, metrics, data, model_args, data_args, training_args, baseline, push_to_hub, truncation, image_use
        )
        print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    run_command("finetune_vqa.py", main)
