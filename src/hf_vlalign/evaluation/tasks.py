"""`hf-vlalign evaluate`: a saved model's task metric on a dataset (offline default: the synthetic scenes).

- `vgp`: identification and VGP accuracy of a `SingleStreamForVisualParaphrase` (Samaran et al.);
- `vqa`: the `accuracy` and GQA script metrics of a `*ForQuestionAnswering` (either family) on the scenes' GQA-format
  questions, as `examples/finetune_vqa.py` reports them; its answers are the model folder's `answer_vocab.json`;
- `gqa`: the same for a `*ForQuestionAnswering`; for a `TwoStreamForPreTraining` with a QA head, the GQA evaluation
  script's metrics (`metrics.gqa.gqa_scores`) of its pre-training answers;
- `nlvr2`: NLVR2's accuracy and consistency of a `*ForVisualReasoning`, as `examples/finetune_nlvr2.py`;
- `refcoco`: referring-expression accuracy (IoU >= 0.5) of a `*ForReferringExpression` with the confidence baseline
  and upper bound, as `examples/finetune_refcoco.py`;
- `flickr_grounding`: recall@1/5/10 (MERGED-BOXES) of a `*ForPhraseGrounding` with the confidence baseline and upper
  bound, as `examples/finetune_flickr_grounding.py`;
- `captioning`: BLEU-1..4, METEOR, ROUGE-L and CIDEr-D of a `RegionCaptionerForConditionalGeneration`'s greedy
  (or beam) captions.

The task examples' own evaluation code (`evaluation/task_metrics.py`) computes the metrics. Every accuracy stands
beside its baseline under `baselines` ({metric: {"value", "baseline", "kind", "beats"}}, `evaluation/baselines.py`):
the most frequent label of the scenes' *training* split (generated with the evaluation split from the same seed) for
`vgp`, `vqa` / `gqa` and `nlvr2`; the image's largest region for `refcoco` and `flickr_grounding`; none for the caption
metrics.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer

from ..models.family import FAMILIES as FAMILY_SPECS
from ..synthetic import SyntheticSceneConfig
from .baselines import (
    compare_with_baselines,
    gqa_baselines,
    majority_label,
    question_answering_baselines,
    vgp_baselines,
    visual_reasoning_baselines,
)
from .inference import inference_batches

# read from the families' specs (`hf_vlalign.models.family`): their model types, the tasks their heads evaluate and the
# model classes (a checkpoint's `architectures`) that each task evaluates
FAMILIES = tuple(spec.model_type for spec in FAMILY_SPECS.values())
TASKS = tuple(dict.fromkeys(task for spec in FAMILY_SPECS.values() for task in spec.tasks))
TASK_ARCHITECTURES = {
    task: tuple(model.class_name for spec in FAMILY_SPECS.values() for model in spec.models.values() if task in model.tasks)
    for task in TASKS
}
ANSWER_VOCAB_NAME = "answer_vocab.json"  # the answers of a question-answering head, saved by examples/finetune_vqa.py
# texts are cut at this many tokens, as in the task examples, unless `max_text_length` says otherwise
DEFAULT_MAX_TEXT_LENGTH = 48
# the evaluations that read `max_text_length`: the VGP pairs and the two-stream pre-training QA head read their texts
# as their collators cut them in training, the captioner reads no text
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
def evaluate_vgp(model, tokenizer, synthetic: SyntheticSceneConfig, batch_size: int, progress: bool) -> dict:
    from ..data import VGPCollator
    from ..data.builders import load_vgp_data
    from ..metrics.vgp import vgp_accuracy

    data = load_vgp_data(synthetic_config=synthetic)
    # the model's VGP task (eq. 4): semantic types (pairs without one are -100, left out) or paraphrase vs not
    collator = VGPCollator(tokenizer, data.region_features, vgp_task=model.config.vgp_task)
    id_correct, vgp_predicted, vgp_labels = 0, [], []
    for batch in inference_batches(model, data.eval, collator, batch_size, description="vgp", progress=progress):
        outputs = model(**batch.inputs)
        id_correct += int((outputs.id_logits.argmax(-1) == batch.inputs["id_labels"]).sum())
        vgp_predicted.append(outputs.vgp_logits.argmax(-1).cpu())
        vgp_labels.append(batch.inputs["vgp_labels"].cpu())
    per_class_key = "vgp_type" if model.config.vgp_task == "type" else "vgp_class"
    vgp = vgp_accuracy(
        torch.cat(vgp_predicted).numpy(), torch.cat(vgp_labels).numpy(), model.config.vgp_class_names(), per_class_key
    )
    results = {"image_description_accuracy": id_correct / len(data.eval), **vgp, "num_examples": len(data.eval)}
    baselines = vgp_baselines(data.train, data.eval, model.config.vgp_task)
    return results | {"baselines": compare_with_baselines(results, baselines)}


@torch.no_grad()
def evaluate_gqa(model, tokenizer, synthetic: SyntheticSceneConfig, batch_size: int, progress: bool) -> dict:
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
    results = gqa_scores(predictions, evaluated)
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


@torch.no_grad()
def evaluate_captioning(model, tokenizer, synthetic: SyntheticSceneConfig, batch_size: int, progress: bool, num_beams: int = 1, max_new_tokens: int = 20) -> dict:
    from ..data import build_dataset
    from ..data.builders.synthetic_scenes import synthetic_region_features
    from ..metrics.captioning import caption_scores

    store = synthetic_region_features(config=synthetic)
    captions = build_dataset("synthetic_scenes", None, "val", task="captions", config=synthetic)
    references: dict[str, list[str]] = {}
    for image_id, sentence in zip(captions["image_id"], captions["sentence"]):
        references.setdefault(image_id, []).append(sentence)
    generated = generate_captions(
        model, tokenizer, store, list(references), batch_size, max_new_tokens, num_beams, progress=progress
    )
    return caption_scores(generated, list(references.values())) | {"num_images": len(references)}


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


def evaluate_question_answering(model, tokenizer, model_dir, synthetic: SyntheticSceneConfig, batch_size: int, progress: bool, max_text_length: int) -> dict:
    """`accuracy` and the GQA script's metrics of a `*ForQuestionAnswering` on the scenes' GQA-format questions, as
    examples/finetune_vqa.py evaluates: its answers are `answer_vocab.json` of `model_dir` (the scenes' vocabulary
    when the folder has none)."""
    from transformers.utils import cached_file

    from ..data import QuestionAnsweringCollator, build_dataset
    from ..data.builders import gqa, vqa_v2
    from ..data.builders.synthetic_scenes import synthetic_region_features
    from ..synthetic import load_or_generate_synthetic_vgp
    from ..synthetic.questions import ANSWER_VOCAB_FILE
    from .task_metrics import answer_metrics, predicted_answer_ids

    store = synthetic_region_features(config=synthetic)
    questions_dir = load_or_generate_synthetic_vgp(config=synthetic).gqa_dir
    vocab_file = cached_file(str(model_dir), ANSWER_VOCAB_NAME, _raise_exceptions_for_missing_entries=False)
    vocab = vqa_v2.read_answer_vocab(vocab_file or questions_dir / ANSWER_VOCAB_FILE)
    if len(vocab) != model.config.num_qa_labels:
        raise ValueError(
            f"`model_dir` answers over {model.config.num_qa_labels} answers, but the answer vocabulary "
            f"({vocab_file or 'of the synthetic scenes'}) has {len(vocab)}: evaluate the model on the questions it was "
            "trained on (its folder's answer_vocab.json)."
        )
    rows = build_dataset("synthetic_scenes", None, "val", task="questions", config=synthetic, region_features=store)
    collator = QuestionAnsweringCollator(tokenizer, store, num_answers=len(vocab), max_text_length=max_text_length)
    rows, _ = collator.drop_overlong_rows(rows, "synthetic questions eval")
    records = gqa.read_questions(gqa.question_files(questions_dir, "val", "balanced", None))
    evaluated = {qid: records[qid] for qid in rows["question_id"]}
    metrics = answer_metrics(vocab, evaluated, rows)
    results = _trainer_evaluate(model, collator, rows, batch_size, progress, metrics, predicted_answer_ids)
    # the baselines: the most frequent answer of the scenes' training split (generated with the evaluation split)
    train_rows = build_dataset("synthetic_scenes", None, "train", task="questions", config=synthetic)
    baselines = question_answering_baselines(vocab, train_rows, rows, evaluated)
    return results | {
        "num_questions": len(rows), "num_answers": len(vocab), "baselines": compare_with_baselines(results, baselines)
    }


def evaluate_visual_reasoning(model, tokenizer, synthetic: SyntheticSceneConfig, batch_size: int, progress: bool, max_text_length: int) -> dict:
    """NLVR2's accuracy and consistency of a `*ForVisualReasoning` on the scenes' NLVR2 statements, as
    examples/finetune_nlvr2.py evaluates."""
    from ..data import ImagePairCollator, build_dataset
    from ..data.builders.synthetic_scenes import synthetic_region_features
    from .task_metrics import predicted_truth, reasoning_metrics

    store = synthetic_region_features(config=synthetic, task="nlvr2")
    rows = build_dataset("synthetic_scenes", None, "val", task="nlvr2", config=synthetic, region_features=store)
    collator = ImagePairCollator(tokenizer, store, max_text_length=max_text_length)
    rows, _ = collator.drop_overlong_rows(rows, "synthetic nlvr2 eval")
    results = _trainer_evaluate(model, collator, rows, batch_size, progress, reasoning_metrics(rows), predicted_truth)
    # the baselines: the most frequent truth value of the scenes' training split (generated with the evaluation split)
    train_labels = build_dataset("synthetic_scenes", None, "train", task="nlvr2", config=synthetic)["label"]
    baselines = visual_reasoning_baselines(train_labels, rows["label"], rows["identifier"])
    return results | {"num_examples": len(rows), "baselines": compare_with_baselines(results, baselines)}


def evaluate_referring_expression(model, tokenizer, synthetic: SyntheticSceneConfig, batch_size: int, max_text_length: int) -> dict:
    """Accuracy (IoU >= 0.5) of a `*ForReferringExpression`'s chosen regions on the scenes' referring expressions, with
    the confidence baseline, the upper bound and chance, as examples/finetune_refcoco.py evaluates."""
    from ..data import ReferringExpressionCollator, build_dataset
    from ..data.builders.synthetic_scenes import synthetic_region_features
    from .task_metrics import IOU_THRESHOLD, chosen_regions, referring_results

    store = synthetic_region_features(config=synthetic)
    rows = build_dataset("synthetic_scenes", None, "val", task="refcoco", config=synthetic, region_features=store)
    collator = ReferringExpressionCollator(tokenizer, store, max_text_length=max_text_length, iou_threshold=IOU_THRESHOLD)
    rows, _ = collator.drop_overlong_rows(rows, "synthetic referring eval")
    return referring_results(rows, store, chosen_regions(model, rows, collator, batch_size))


def evaluate_phrase_grounding(model, tokenizer, synthetic: SyntheticSceneConfig, batch_size: int, max_text_length: int) -> dict:
    """Recall@1/5/10 (MERGED-BOXES) of a `*ForPhraseGrounding` on the scenes' captions (Flickr30k Entities format), with
    the confidence baseline and the upper bound, as examples/finetune_flickr_grounding.py evaluates."""
    from ..data import PhraseGroundingCollator, build_dataset
    from ..data.builders.synthetic_scenes import synthetic_region_features
    from .task_metrics import IOU_THRESHOLD, grounded_phrases_only, phrase_region_scores, recall_results

    store = synthetic_region_features(config=synthetic)
    rows = build_dataset("synthetic_scenes", None, "val", task="captions", config=synthetic, region_features=store)
    rows, counts = grounded_phrases_only(rows, tokenizer, max_text_length)
    collator = PhraseGroundingCollator(tokenizer, store, max_text_length=max_text_length, iou_threshold=IOU_THRESHOLD)
    results = recall_results(rows, store, phrase_region_scores(model, rows, collator, batch_size))
    left_out = {f"{name}_left_out": counts[name] for name in ("phrases_without_box", "phrases_truncated")}
    return results | {"eval_captions": len(rows), **left_out}


def evaluate_task(
    model_dir: str | Path,
    task: str,
    *,
    synthetic: SyntheticSceneConfig | None = None,
    batch_size: int = 32,
    progress: bool = True,
    max_text_length: int | None = None,
) -> dict:
    """The metric of `task` for the model saved in `model_dir`, on the synthetic scenes' evaluation split.

    `max_text_length` cuts the texts of the tasks in `TEXT_LENGTH_TASKS` (None: `DEFAULT_MAX_TEXT_LENGTH`, as the
    examples do); the other evaluations (`vgp`, a two-stream pre-training QA head, `captioning`) do not read it and
    refuse a value rather than ignore it."""
    if task not in TASKS:
        raise ValueError(f"`task` must be one of {TASKS}, got {task!r}.")
    for name, value in (("batch_size", batch_size), ("max_text_length", max_text_length)):
        if value is None and name == "max_text_length":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {value!r}.")
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
    max_text_length = max_text_length or DEFAULT_MAX_TEXT_LENGTH
    model = load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    synthetic = synthetic or SyntheticSceneConfig()
    if task == "vgp":
        results = evaluate_vgp(model, tokenizer, synthetic, batch_size, progress)
    elif pretraining:
        results = evaluate_gqa(model, tokenizer, synthetic, batch_size, progress)
    elif task in ("vqa", "gqa"):
        results = evaluate_question_answering(model, tokenizer, model_dir, synthetic, batch_size, progress, max_text_length)
    elif task == "nlvr2":
        results = evaluate_visual_reasoning(model, tokenizer, synthetic, batch_size, progress, max_text_length)
    elif task == "refcoco":
        results = evaluate_referring_expression(model, tokenizer, synthetic, batch_size, max_text_length)
    elif task == "flickr_grounding":
        results = evaluate_phrase_grounding(model, tokenizer, synthetic, batch_size, max_text_length)
    else:
        results = evaluate_captioning(model, tokenizer, synthetic, batch_size, progress)
    return {"task": task, "model_dir": str(model_dir), "model": architecture} | results


__all__ = ["TASKS", "evaluate_task", "load_model"]
