"""How far a task can be solved from its text alone: the text-only ceiling of generated scenes' files.

A benchmark whose labels follow from the text measures nothing about the image. `text_only_ceilings` reads the
published files `synthetic.generate_synthetic_scenes` writes (VGP, GQA, RefCOCO+ and NLVR2) and reports, per task, three
accuracies on the evaluation split:

- `text_only`: the best predictor here that sees only the text. Each example's text is read at several levels, from
  the exact text down to what its template reveals (`TEXT_VIEWS`); the predictor answers with the majority training
  label of the finest level whose text was seen in training (`baselines.majority_label`; the overall majority when
  none was). It is fit on the training split and scored on the evaluation split: on the split it was fit on, every
  unique text would score 1.0 trivially.
- `majority`: the majority-class baseline (`baselines.majority_class_accuracy`), blind to the text too. For GQA also
  `question_type_prior`, the majority answer per question type (GQA's `types.detailed`, read off the question's
  template): the answer space a question names is no image leak, so a QA task's text-only ceiling is judged against it.
- `image_oracle`: what a perfect reader of the image gets. The labels are computed from the scene graph, so it is 1.0
  for VGP, GQA and NLVR2; for RefCOCO+ it is the share of expressions whose object some detected region hits
  (IoU >= 0.5), since the model answers with a region.

The texts: VGP, the ordered pair of phrases as the captions write them; GQA, the question; NLVR2, the sentence;
RefCOCO+, the expression, answered with a fixed region index (regions in file order): the best index for the text.
The module lives in `evaluation/` beside `baselines.py`: both say what a model gets that ignores the image, with the
same majority rules; its coarser text levels read the synthetic vocabularies (`synthetic.tasks.canonical_words`).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from pathlib import Path

import torch

from ..alignment.boxes import box_iou
from ..data.builders.refcoco import read_refs
from ..data.formats.lxmert_tsv import iter_lxmert_tsv_records
from ..data.formats.vgp import read_vgp_csv
from ..synthetic.tasks import attribute_agreement, canonical_words
from .baselines import majority_class_accuracy, majority_label

__all__ = ["TEXT_ONLY_TASKS", "TEXT_VIEWS", "text_only_accuracy", "text_only_ceilings"]

TEXT_ONLY_TASKS = ("vgp_identification", "vgp_type", "gqa", "refcoco", "nlvr2")
TEXT_VIEWS = {
    "vgp_identification": ("exact phrase pair", "phrases without determiners, synonyms merged", "attribute agreement"),
    "vgp_type": ("exact phrase pair", "phrases without determiners, synonyms merged", "attribute agreement"),
    "gqa": ("exact question", "question without determiners, synonyms merged", "question type"),
    "refcoco": ("exact expression", "expression without determiners, synonyms merged"),
    "nlvr2": ("exact sentence", "sentence without determiners, synonyms merged"),
}
Example = tuple[tuple[Hashable, ...], Hashable]  # (the text at each level, finest first; label)
REGION_HIT_IOU = 0.5  # RefCOCO+'s rule: a region answers the expression when its IoU with the object is >= 0.5
def text_only_accuracy(train: Sequence[Example], evaluation: Sequence[Example]) -> float:
    """Accuracy on `evaluation` of a predictor fit on `train` that sees only the text: an example is (levels, label),
    `levels` its text read from the finest level to the coarsest; the prediction is the majority training label of
    the finest level whose text training saw (the overall training majority when it saw none)."""
    if not train or not evaluation:
        raise ValueError(f"`train` and `evaluation` must hold examples, got {len(train)} and {len(evaluation)}.")
    by_text: dict[tuple[int, Hashable], list[Hashable]] = defaultdict(list)
    for levels, label in train:
        for level, text in enumerate(levels):
            by_text[level, text].append(label)
    fallback = majority_label([label for _, label in train], ignore_index=None)
    prediction = {key: majority_label(labels, ignore_index=None) for key, labels in by_text.items()}

    def predict(levels: tuple[Hashable, ...]) -> Hashable:
        seen = (prediction[level, text] for level, text in enumerate(levels) if (level, text) in prediction)
        return next(seen, fallback)

    return sum(predict(levels) == label for levels, label in evaluation) / len(evaluation)


def _scores(train: Sequence[Example], evaluation: Sequence[Example], image_oracle: float = 1.0) -> dict[str, float]:
    return {
        "text_only": text_only_accuracy(train, evaluation),
        "majority": majority_class_accuracy([label for _, label in train], [label for _, label in evaluation], None),
        "image_oracle": image_oracle,
        "num_train": len(train),
        "num_eval": len(evaluation),
    }


def _vgp_examples(path: Path, typed: bool) -> list[Example]:
    """(phrase pair levels, label): `is_paraphrase`, or with `typed` the type of the paraphrases."""
    examples = []
    for pair in read_vgp_csv(path):
        if typed and pair.type_label < 0:
            continue
        first, second = pair.original_phrase1.lower(), pair.original_phrase2.lower()
        canonical = (canonical_words(first), canonical_words(second))
        levels = ((first, second), canonical, attribute_agreement(first, second))
        examples.append((levels, pair.type_label if typed else pair.is_paraphrase))
    return examples


def _gqa_examples(path: Path) -> list[Example]:
    questions = json.loads(path.read_text(encoding="utf-8")).values()
    levels = ((q["question"], canonical_words(q["question"]), q["types"]["detailed"]) for q in questions)
    return [(level, question["answer"]) for level, question in zip(levels, questions, strict=True)]


def _nlvr2_examples(path: Path) -> list[Example]:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [((record["sentence"], canonical_words(record["sentence"])), record["label"]) for record in records]


def _region_hits(root: Path) -> dict[str, dict[int, list[int]]]:
    """split -> {sent_id: indices of the regions (file order) that hit the ref's object}, and the refs' expressions."""
    instances = json.loads((root / "refcoco+" / "instances.json").read_text(encoding="utf-8"))
    object_boxes = {}
    for annotation in instances["annotations"]:
        x, y, width, height = annotation["bbox"]
        object_boxes[annotation["id"]] = [x, y, x + width, y + height]
    region_boxes = {
        record["image_id"]: torch.tensor(record["boxes"], dtype=torch.float64)
        for record in iter_lxmert_tsv_records(root / "features" / "features.tsv")
    }
    hits: dict[str, dict[int, list[int]]] = defaultdict(dict)
    for ref in read_refs(root / "refcoco+" / "refs(unc).p"):
        target = torch.as_tensor([object_boxes[ref["ann_id"]]], dtype=torch.float64)
        iou = box_iou(target, region_boxes[str(ref["image_id"])])[0]
        for sentence in ref["sentences"]:
            hits[ref["split"]][sentence["sent_id"]] = (iou >= REGION_HIT_IOU).nonzero().flatten().tolist()
    return hits


def _best_index(counts: Counter) -> int:
    """The region index that hits most often (the smallest among ties)."""
    return min(counts, key=lambda index: (-counts[index], index))


def _refcoco_scores(root: Path, train_split: str, eval_split: str) -> dict[str, float]:
    """The best fixed region index per expression (fit on train, with the canonical expression as the coarser level)
    and over all expressions (`majority`)."""
    refs = read_refs(root / "refcoco+" / "refs(unc).p")
    texts = {sentence["sent_id"]: sentence["sent"] for ref in refs for sentence in ref["sentences"]}
    hits = _region_hits(root)
    by_text: dict[tuple[int, Hashable], Counter] = defaultdict(Counter)
    overall: Counter = Counter()
    for sent_id, indices in hits[train_split].items():
        for level, text in enumerate((texts[sent_id], canonical_words(texts[sent_id]))):
            by_text[level, text].update(indices)
        overall.update(indices)
    fallback = _best_index(overall)

    def predict(text: str) -> int:
        levels = ((0, text), (1, canonical_words(text)))
        return next((_best_index(by_text[key]) for key in levels if by_text.get(key)), fallback)

    evaluation = hits[eval_split]
    count = len(evaluation)
    return {
        "text_only": sum(predict(texts[sent_id]) in indices for sent_id, indices in evaluation.items()) / count,
        "majority": sum(fallback in indices for indices in evaluation.values()) / count,
        "image_oracle": sum(bool(indices) for indices in evaluation.values()) / count,
        "num_train": len(hits[train_split]),
        "num_eval": count,
    }


def text_only_ceilings(root: str | Path, tasks: Sequence[str] = TEXT_ONLY_TASKS) -> dict[str, dict[str, float]]:
    """Per task of the generated scenes under `root`: the text-only ceiling, the majority-class baseline and the image
    oracle on the val split, fit on the train split (see the module docstring), and `num_train` / `num_eval`, the
    examples counted; GQA adds `question_type_prior`.

    Args:
        root: what `generate_synthetic_scenes` wrote (`SyntheticVGPPaths.root`): `vgp/{train,val}.csv`,
            `gqa/{train,val}_balanced_questions.json`, `nlvr2/{train,dev}.json`, `refcoco+/` and
            `features/features.tsv`, as far as `tasks` need them.
        tasks: some of `TEXT_ONLY_TASKS`.
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"`root` must be a folder of generated scenes, got {str(root)!r}, which is not a folder.")
    if isinstance(tasks, str) or any(task not in TEXT_ONLY_TASKS for task in tasks):
        raise ValueError(f"`tasks` must be a list of some of {TEXT_ONLY_TASKS}, got {tasks!r}.")
    needed = {
        "vgp_identification": ["vgp/train.csv", "vgp/val.csv"],
        "vgp_type": ["vgp/train.csv", "vgp/val.csv"],
        "gqa": ["gqa/train_balanced_questions.json", "gqa/val_balanced_questions.json"],
        "refcoco": ["refcoco+/refs(unc).p", "refcoco+/instances.json", "features/features.tsv"],
        "nlvr2": ["nlvr2/train.json", "nlvr2/dev.json"],
    }
    missing = sorted({name for task in tasks for name in needed[task] if not (root / name).is_file()})
    if missing:
        raise ValueError(f"`root` must hold the generated files of {list(tasks)}; {root} lacks {missing}.")
    readers = {
        "vgp_identification": lambda split: _vgp_examples(root / "vgp" / f"{split}.csv", typed=False),
        "vgp_type": lambda split: _vgp_examples(root / "vgp" / f"{split}.csv", typed=True),
        "gqa": lambda split: _gqa_examples(root / "gqa" / f"{split}_balanced_questions.json"),
        "nlvr2": lambda split: _nlvr2_examples(root / "nlvr2" / f"{'dev' if split == 'val' else split}.json"),
    }
    results = {}
    for task in tasks:
        if task == "refcoco":
            results[task] = _refcoco_scores(root, "train", "val")
            continue
        train, evaluation = readers[task]("train"), readers[task]("val")
        results[task] = _scores(train, evaluation)
        if task == "gqa":  # the question type alone: the coarsest level
            coarsest = [((levels[-1],), label) for levels, label in train], [((l[-1],), y) for l, y in evaluation]
            results[task]["question_type_prior"] = text_only_accuracy(*coarsest)
    return results
