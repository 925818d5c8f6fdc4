"""`hf-vlalign evaluate`: a saved model's task metric on a dataset (offline default: the synthetic scenes), computed
by the task examples' own evaluation code (`evaluation/task_metrics.py`) beside its baselines (`evaluation/baselines.py`):
`vgp` (identification and VGP accuracy), `vqa` / `gqa` (accuracy and the GQA script's metrics; a two-stream
pre-training QA head: the script's metrics of its answers), `nlvr2` (accuracy and consistency), `refcoco` (accuracy at
IoU >= 0.5), `flickr_grounding` (recall@1/5/10, MERGED-BOXES) and `captioning` (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer

from ..models.family import FAMILIES as FAMILY_SPECS
from ..synthetic import SyntheticSceneConfig
from ..utils.size_limits import MAX_ANALYSIS_EXAMPLES, check_size
from .baselines import (
    Baseline,
    compare_with_baselines,
    gqa_baselines,
    majority_label,
    question_answering_baselines,
    vgp_baselines,
    visual_reasoning_baselines,
)
from .inference import first_examples, inference_batches

# from the families' specs: their model types, their heads' tasks and the model classes each task evaluates
FAMILIES = tuple(spec.model_type for spec in FAMILY_SPECS.values())
TASKS = tuple(dict.fromkeys(task for spec in FAMILY_SPECS.values() for task in spec.tasks))
TASK_ARCHITECTURES = {
    task: tuple(model.class_name for spec in FAMILY_SPECS.values() for model in spec.models.values() if task in model.tasks)
    for task in TASKS
}
ANSWER_VOCAB_NAME = "answer_vocab.json"  # the answers of a question-answering head, saved by examples/finetune_vqa.py
# texts are cut at this many tokens, as in the task examples, unless `max_text_length` says otherwise
DEFAULT_MAX_TEXT_LENGTH = 48
# the evaluations that read `max_text_length` (the others read texts as their training collators cut them, or none)
TEXT_LENGTH_TASKS = ("vqa", "gqa", "nlvr2", "refcoco", "flickr_grounding")
# `Trainer.evaluate`'s timings, left out of the results
SPEED_METRICS = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "eval_model_preparation_time")


def load_model(model_dir: str | Path) -> torch.nn.Module:
    """The model class named in the checkpoint's config (`architectures`), loaded with `from_pretrained`."""
    import hf_vlalign

    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type not in FAMILIES:
        raise ValueError(f"`model_dir` must hold an hf_vlalign model ({', '.join(FAMILIES)}), got model_type {config.model_type!r}.")
    architecture = (config.architectures or [None])[0]
    model_class = getattr(hf_vlalign, architecture or "", None)
    if model_class is None:
        raise ValueError(f"`model_dir` config names architecture {architecture!r}, which hf_vlalign does not define.")
    return model_class.from_pretrained(model_dir).eval()


@torch.no_grad()
def score_vgp(model, tokenizer, rows, store, batch_size: int, progress: bool, train_rows=None) -> dict:
    """Identification and VGP accuracy of a `SingleStreamForVisualParaphrase` on VGP rows joined to `store`, beside
    the majority class of `train_rows` (None: of the evaluated rows themselves)."""
    from ..data import VGPCollator
    from ..metrics.vgp import vgp_accuracy

    # the model's VGP task (eq. 4): semantic types (pairs without one are -100, left out) or paraphrase vs not
    collator = VGPCollator(tokenizer, store, vgp_task=model.config.vgp_task)
    id_correct, vgp_predicted, vgp_labels = 0, [], []
    for batch in inference_batches(model, rows, collator, batch_size, description="vgp", progress=progress):
        outputs = model(**batch.inputs)
        id_correct += int((outputs.id_logits.argmax(-1) == batch.inputs["id_labels"]).sum())
        vgp_predicted.append(outputs.vgp_logits.argmax(-1).cpu())
        vgp_labels.append(batch.inputs["vgp_labels"].cpu())
    per_class_key = "vgp_type" if model.config.vgp_task == "type" else "vgp_class"
    vgp = vgp_accuracy(
        torch.cat(vgp_predicted).numpy(), torch.cat(vgp_labels).numpy(), model.config.vgp_class_names(), per_class_key
    )
    results = {"image_description_accuracy": id_correct / len(rows), **vgp, "num_examples": len(rows)}
    baselines = vgp_baselines(rows if train_rows is None else train_rows, rows, model.config.vgp_task)
    return results | {"baselines": compare_with_baselines(results, _of_training(baselines, train_rows))}


@torch.no_grad()
def evaluate_gqa(model, tokenizer, synthetic: SyntheticSceneConfig, batch_size: int, progress: bool, max_examples: int | None = None) -> dict:
    from ..data import TwoStreamPretrainingCollator, build_dataset
    from ..data.builders.synthetic_scenes import synthetic_region_features
    from ..metrics.gqa import gqa_scores
    from ..synthetic import load_or_generate_synthetic_vgp
    from ..synthetic.questions import ANSWER_LIST_FILE, questions_file

    if not getattr(model.config, "task_qa", True):
        raise ValueError("`model_dir` holds a two-stream model without a question-answering head (`task_qa=False`).")
    store = synthetic_region_features(config=synthetic)
    gqa_dir = load_or_generate_synthetic_vgp(config=synthetic).gqa_dir
    questions = build_dataset(
        "synthetic_scenes", None, "val", task="questions", config=synthetic, region_features=store
    )
    questions = first_examples(questions, max_examples, "the synthetic questions (val)")
    answers = json.loads((gqa_dir / ANSWER_LIST_FILE).read_text())
    collator = TwoStreamPretrainingCollator(
        tokenizer, store, mlm_probability=0, object_mask_probability=0, mismatch_probability=0
    )
    predictions = {}
    batches = inference_batches(
        model, questions, collator, batch_size, exclude=("labels", "answer_labels"), description="gqa", progress=progress
    )
    for batch in batches:
        labels = model(**batch.inputs).question_answering_score.argmax(-1).tolist()
        ids = [row["question_id"] for row in batch.rows]
        predictions.update({question_id: answers[label] for question_id, label in zip(ids, labels)})
    records = json.loads((gqa_dir / questions_file("val")).read_text())
    evaluated = {qid: records[qid] for qid in predictions}
    results = gqa_scores(predictions, evaluated) | {"num_examples": len(questions)}
    # the baseline: the scenes' training split's most frequent answer (of the head's answers) to every question
    train_answers = [record["answer"] for record in json.loads((gqa_dir / questions_file("train")).read_text()).values()]
    known = set(answers)
    majority = majority_label([answer for answer in train_answers if answer in known], None)
    return results | {"baselines": compare_with_baselines(results, gqa_baselines(majority, evaluated, prefix=""))}


@torch.no_grad()
def generate_captions(
    model, tokenizer, store, image_ids: list[str], batch_size: int, max_new_tokens: int, num_beams: int = 1,
    progress: bool = False,
) -> list[str]:
    """A captioner's greedy (or beam) caption of each image of `store` named in `image_ids`, in order."""
    from ..data import CaptioningCollator

    model.eval()
    images = [{"image_id": image_id, "caption": ""} for image_id in image_ids]
    collator = CaptioningCollator(tokenizer, store, text_columns=("caption",))
    captions = []
    for batch in inference_batches(model, images, collator, batch_size, description="captioning", progress=progress):
        regions = {k: v for k, v in batch.inputs.items() if k.startswith("visual_")}
        generated = model.generate(**regions, max_new_tokens=max_new_tokens, num_beams=num_beams, do_sample=False)
        captions += tokenizer.batch_decode(generated, skip_special_tokens=True)
    return captions


def score_captioning(
    model, tokenizer, captions, column: str, store, batch_size: int, progress: bool, num_beams: int = 1,
    max_new_tokens: int = 20, max_examples: int | None = None,
) -> dict:
    """Caption metrics of a captioner's captions of the first `max_examples` images of `captions` (the rows of one
    image, their texts in `column`, are its references)."""
    from ..metrics.captioning import caption_scores

    references: dict[str, list[str]] = {}
    for image_id, sentence in zip(captions["image_id"], captions[column]):
        references.setdefault(image_id, []).append(sentence)
    image_ids = first_examples(list(references), max_examples, "the captions' images")
    generated = generate_captions(model, tokenizer, store, image_ids, batch_size, max_new_tokens, num_beams, progress=progress)
    scores = caption_scores(generated, [references[image_id] for image_id in image_ids])
    return scores | {"num_images": len(image_ids), "num_examples": len(image_ids)}


def _trainer_evaluate(model, collator, rows, batch_size: int, progress: bool, compute_metrics, preprocess_logits) -> dict:
    """`TaskTrainer.evaluate` of `rows` with an example's `compute_metrics`, as the example's final evaluation runs it;
    the metrics without their `eval_` prefix (but `eval_loss`), speed metrics left out."""
    from transformers import PrinterCallback

    from ..trainers.task import TaskTrainer, TaskTrainingArguments

    with tempfile.TemporaryDirectory() as output_dir:
        args = TaskTrainingArguments(
            output_dir, per_device_eval_batch_size=batch_size, report_to="none", disable_tqdm=not progress,
            remove_unused_columns=False, dataloader_num_workers=0, dataloader_pin_memory=False, label_names=["labels"],
        )  # fmt: skip
        trainer = TaskTrainer(
            model=model, args=args, data_collator=collator, compute_metrics=compute_metrics,
            preprocess_logits_for_metrics=preprocess_logits,
        )  # fmt: skip
        trainer.remove_callback(PrinterCallback)  # the results are returned, not printed
        metrics = trainer.evaluate(rows)
    kept = {key: value for key, value in metrics.items() if key.startswith("eval_") and key not in SPEED_METRICS}
    return {key if key == "eval_loss" else key.removeprefix("eval_"): value for key, value in kept.items()}


def model_answer_vocab(model, model_dir, default: Path | None = None) -> dict[str, int]:
    """{answer: id} of a question-answering head: `answer_vocab.json` of `model_dir` (else the `default` file), of
    the head's size."""
    from transformers.utils import cached_file

    from ..data.builders import vqa_v2

    vocab_file = cached_file(str(model_dir), ANSWER_VOCAB_NAME, _raise_exceptions_for_missing_entries=False)
    if vocab_file is None and default is None:
        raise FileNotFoundError(
            f"`model_dir` {model_dir} has no {ANSWER_VOCAB_NAME} (the answers of its head, saved by "
            "examples/finetune_vqa.py): the predicted answer ids cannot be named."
        )
    vocab = vqa_v2.read_answer_vocab(vocab_file or default)
    if len(vocab) != model.config.num_qa_labels:
        raise ValueError(
            f"`model_dir` answers over {model.config.num_qa_labels} answers, but the answer vocabulary "
            f"({vocab_file or 'of the synthetic scenes'}) has {len(vocab)}: evaluate the model on the questions it was "
            "trained on (its folder's answer_vocab.json)."
        )
    return vocab


def score_question_answering(
    model, tokenizer, vocab, rows, store, records, batch_size: int, progress: bool, max_text_length: int,
    max_examples: int | None = None, train_rows=None,
) -> dict:
    """`accuracy` of a `*ForQuestionAnswering` on the first `max_examples` question rows with answers in `vocab`'s
    ids (`label`, or VQA's `labels` / `scores`), and the GQA script's metrics with GQA question `records` (None: VQA's
    metrics), beside the majority answer of `train_rows` (None: of the evaluated rows themselves)."""
    from ..data import QuestionAnsweringCollator
    from .task_metrics import answer_metrics, predicted_answer_ids

    collator = QuestionAnsweringCollator(tokenizer, store, num_answers=len(vocab), max_text_length=max_text_length)
    rows, _ = collator.drop_overlong_rows(rows, "questions eval")
    rows = first_examples(rows, max_examples, "the questions")
    questions = None if records is None else {qid: records[qid] for qid in rows["question_id"]}
    metrics = answer_metrics(vocab, questions, rows)
    results = _trainer_evaluate(model, collator, rows, batch_size, progress, metrics, predicted_answer_ids)
    results |= {"num_questions": len(rows), "num_answers": len(vocab), "num_examples": len(rows)}
    baselines = question_answering_baselines(vocab, rows if train_rows is None else train_rows, rows, questions)
    return results | {"baselines": compare_with_baselines(results, _of_training(baselines, train_rows))}


def score_visual_reasoning(model, tokenizer, rows, store, batch_size: int, progress: bool, max_text_length: int, max_examples: int | None = None, train_labels=None) -> dict:
    """NLVR2's accuracy and consistency of a `*ForVisualReasoning` on image-pair rows with NLVR2 identifiers, beside
    the majority truth value of `train_labels` (None: of the evaluated rows themselves)."""
    from ..data import ImagePairCollator
    from .task_metrics import predicted_truth, reasoning_metrics

    collator = ImagePairCollator(tokenizer, store, max_text_length=max_text_length)
    rows, _ = collator.drop_overlong_rows(rows, "nlvr2 eval")
    rows = first_examples(rows, max_examples, "the NLVR2 statements")
    results = _trainer_evaluate(model, collator, rows, batch_size, progress, reasoning_metrics(rows), predicted_truth)
    baselines = visual_reasoning_baselines(
        rows["label"] if train_labels is None else train_labels, rows["label"], rows["identifier"]
    )
    baselines = compare_with_baselines(results, _of_training(baselines, train_labels))
    return results | {"num_examples": len(rows), "baselines": baselines}


def score_referring_expression(model, tokenizer, rows, store, batch_size: int, max_text_length: int, max_examples: int | None = None) -> dict:
    """Accuracy (IoU >= 0.5) of a `*ForReferringExpression` on referring-expression rows joined to `store`."""
    from ..data import ReferringExpressionCollator
    from .task_metrics import IOU_THRESHOLD, chosen_regions, referring_results

    collator = ReferringExpressionCollator(tokenizer, store, max_text_length=max_text_length, iou_threshold=IOU_THRESHOLD)
    rows, _ = collator.drop_overlong_rows(rows, "referring eval")
    rows = first_examples(rows, max_examples, "the referring expressions")
    return referring_results(rows, store, chosen_regions(model, rows, collator, batch_size)) | {"num_examples": len(rows)}


def score_phrase_grounding(model, tokenizer, rows, store, batch_size: int, max_text_length: int, max_examples: int | None = None) -> dict:
    """Recall@1/5/10 (MERGED-BOXES) of a `*ForPhraseGrounding` on caption rows (`sentence` and its phrase columns)."""
    from ..data import PhraseGroundingCollator
    from .task_metrics import IOU_THRESHOLD, grounded_phrases_only, phrase_region_scores, recall_results

    rows, counts = grounded_phrases_only(rows, tokenizer, max_text_length)
    rows = first_examples(rows, max_examples, "the captions")
    collator = PhraseGroundingCollator(tokenizer, store, max_text_length=max_text_length, iou_threshold=IOU_THRESHOLD)
    results = recall_results(rows, store, phrase_region_scores(model, rows, collator, batch_size))
    left_out = {f"{name}_left_out": counts[name] for name in ("phrases_without_box", "phrases_truncated")}
    return results | {"eval_captions": len(rows), **left_out, "num_examples": len(rows)}


def _of_training(baselines: dict[str, Baseline], training) -> dict[str, Baseline]:
    """`baselines` as they are when made from training labels; made from the evaluated rows themselves (`training`
    None: a user's file has no training split at hand), their kind says so."""
    if training is not None:
        return baselines
    return {key: Baseline(baseline.value, "majority_class_eval") for key, baseline in baselines.items()}


def evaluate_task(
    model_dir: str | Path,
    task: str,
    *,
    data_file: str | Path | None = None,
    synthetic: SyntheticSceneConfig | None = None,
    batch_size: int = 32,
    progress: bool = True,
    max_text_length: int | None = None,
    max_examples: int | None = None,
) -> dict:
    """The metric of `task` for the model saved in `model_dir`, on the synthetic scenes' evaluation split or on a
    user-format `data_file` of the task's format (`USER_FILE_TASKS`, its images' region features made as the model's
    processor makes them), reading the first `max_examples` examples (None, or more than the data holds: all); the
    results' `num_examples` is the count evaluated, their `baselines` each accuracy beside its baseline.

    `max_text_length` cuts the texts of the tasks in `TEXT_LENGTH_TASKS` (None: `DEFAULT_MAX_TEXT_LENGTH`); the other
    evaluations do not read it and refuse a value rather than ignore it."""
    if task not in TASKS:
        raise ValueError(f"`task` must be one of {TASKS}, got {task!r}.")
    for name, value in (("batch_size", batch_size), ("max_text_length", max_text_length)):
        if value is None and name == "max_text_length":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {value!r}.")
    if max_examples is not None:
        check_size("max_examples", max_examples, MAX_ANALYSIS_EXAMPLES, limit_name="MAX_ANALYSIS_EXAMPLES")
    config = AutoConfig.from_pretrained(model_dir)
    architecture = (config.architectures or [None])[0]
    if architecture not in TASK_ARCHITECTURES[task]:
        raise ValueError(
            f"task {task!r} needs a {' or '.join(TASK_ARCHITECTURES[task])} model, but `model_dir` holds a "
            f"{architecture} ({config.model_type})."
        )
    pretraining = architecture == FAMILY_SPECS["two_stream"].model("pretraining").class_name
    if max_text_length is not None and (task not in TEXT_LENGTH_TASKS or pretraining):
        evaluation = f"a {architecture}'s {task!r} evaluation" if pretraining else f"task {task!r}"
        raise ValueError(
            f"`max_text_length` applies only to the tasks {TEXT_LENGTH_TASKS} of heads that cut texts; {evaluation} does "
            "not read it: drop it."
        )
    if data_file is not None and pretraining:
        raise ValueError(
            f"a {architecture}'s pre-training answers are those of the synthetic scenes; a `data_file` of questions is "
            "evaluated by a *ForQuestionAnswering model (examples/finetune_vqa.py)."
        )
    max_text_length = max_text_length or DEFAULT_MAX_TEXT_LENGTH
    model = load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if data_file is not None:
        results = evaluate_user_file(
            model, tokenizer, model_dir, task, data_file, batch_size, progress, max_text_length, max_examples
        )
        return {"task": task, "model_dir": str(model_dir), "model": architecture, "data_file": str(data_file)} | results
    results = evaluate_synthetic(
        model, tokenizer, model_dir, task, synthetic or SyntheticSceneConfig(), batch_size, progress, max_text_length,
        max_examples, pretraining,
    )  # fmt: skip
    return {"task": task, "model_dir": str(model_dir), "model": architecture} | results


def evaluate_synthetic(
    model, tokenizer, model_dir, task: str, synthetic: SyntheticSceneConfig, batch_size: int, progress: bool,
    max_text_length: int, max_examples: int | None, pretraining: bool,
) -> dict:
    """`task`'s metric on the synthetic scenes' evaluation split, as the task's example evaluates it; the baselines
    of NLVR2 and question answering are the majority of the scenes' training split (generated with it)."""
    from ..data import build_dataset
    from ..data.builders import gqa, load_vgp_data
    from ..data.builders.synthetic_scenes import synthetic_region_features
    from ..synthetic import load_or_generate_synthetic_vgp
    from ..synthetic.questions import ANSWER_VOCAB_FILE

    if task == "vgp":
        data = load_vgp_data(synthetic_config=synthetic)
        pairs = first_examples(data.eval, max_examples, f"{data.source} (eval)")
        return score_vgp(model, tokenizer, pairs, data.region_features, batch_size, progress, train_rows=data.train)
    if pretraining:
        return evaluate_gqa(model, tokenizer, synthetic, batch_size, progress, max_examples=max_examples)
    if task == "nlvr2":
        store = synthetic_region_features(config=synthetic, task="nlvr2")
        rows = build_dataset("synthetic_scenes", None, "val", task="nlvr2", config=synthetic, region_features=store)
        train_labels = build_dataset("synthetic_scenes", None, "train", task="nlvr2", config=synthetic)["label"]
        return score_visual_reasoning(
            model, tokenizer, rows, store, batch_size, progress, max_text_length, max_examples, train_labels
        )
    store = synthetic_region_features(config=synthetic)
    if task in ("vqa", "gqa"):  # the head's answers: `answer_vocab.json` of `model_dir`, else the scenes' vocabulary
        questions_dir = load_or_generate_synthetic_vgp(config=synthetic).gqa_dir
        vocab = model_answer_vocab(model, model_dir, questions_dir / ANSWER_VOCAB_FILE)
        rows = build_dataset("synthetic_scenes", None, "val", task="questions", config=synthetic, region_features=store)
        # the labels in the head's answer ids (-1: an answer it lacks, counted wrong), not the scenes' own ids
        rows = rows.map(lambda row: {"label": vocab.get(row["answer"], -1)}, desc="answer ids of the model")
        records = gqa.read_questions(gqa.question_files(questions_dir, "val", "balanced", None))
        train_rows = build_dataset("synthetic_scenes", None, "train", task="questions", config=synthetic)
        return score_question_answering(
            model, tokenizer, vocab, rows, store, records, batch_size, progress, max_text_length, max_examples, train_rows
        )
    if task == "captioning":
        captions = build_dataset("synthetic_scenes", None, "val", task="captions", config=synthetic)
        return score_captioning(model, tokenizer, captions, "sentence", store, batch_size, progress, max_examples=max_examples)
    data_task = "refcoco" if task == "refcoco" else "captions"
    rows = build_dataset("synthetic_scenes", None, "val", task=data_task, config=synthetic, region_features=store)
    score = score_referring_expression if task == "refcoco" else score_phrase_grounding
    return score(model, tokenizer, rows, store, batch_size, max_text_length, max_examples)


# the user-data format (`data.builders.user_data.USER_TASKS`) each task's evaluation reads
USER_FILE_TASKS = {
    "vgp": "vgp", "vqa": "vqa", "gqa": "vqa", "nlvr2": "nlvr2", "refcoco": "refcoco", "flickr_grounding": "caption",
    "captioning": "caption",
}  # fmt: skip


def evaluate_user_file(
    model, tokenizer, model_dir, task: str, data_file, batch_size: int, progress: bool, max_text_length: int,
    max_examples: int | None = None,
) -> dict:
    """`task`'s metric on the first `max_examples` rows of a user-format `data_file` (format `USER_FILE_TASKS[task]`)."""
    from ..data.builders.user_data import with_soft_scores
    from .user_files import load_user_file

    data = load_user_file(model_dir, model.config, data_file, USER_FILE_TASKS[task])
    rows, store = data.train, data.store
    if task == "vgp":
        return score_vgp(model, tokenizer, first_examples(rows, max_examples, str(data_file)), store, batch_size, progress)
    if task in ("vqa", "gqa"):
        vocab = model_answer_vocab(model, model_dir)  # the model's answers, not those of the file
        rows = with_soft_scores(rows, vocab)
        return score_question_answering(
            model, tokenizer, vocab, rows, store, None, batch_size, progress, max_text_length, max_examples
        )
    if task == "nlvr2":
        return score_visual_reasoning(model, tokenizer, rows, store, batch_size, progress, max_text_length, max_examples)
    if task == "refcoco":
        return score_referring_expression(model, tokenizer, rows, store, batch_size, max_text_length, max_examples)
    if task == "flickr_grounding":  # the phrase-grounding rows' text column is `sentence`
        rows = rows.rename_columns({name: "sentence" + name[len("caption"):] for name in rows.column_names if name.startswith("caption")})
        return score_phrase_grounding(model, tokenizer, rows, store, batch_size, max_text_length, max_examples)
    return score_captioning(model, tokenizer, rows, "caption", store, batch_size, progress, max_examples=max_examples)


__all__ = ["TASKS", "USER_FILE_TASKS", "evaluate_task", "evaluate_user_file", "load_model"]
