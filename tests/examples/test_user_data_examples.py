"""Every example on the user-data format: `--train_file` / `--validation_file` of real photos (scikit-image's) run in
process to a saved model whose config reads the store's features, with `eval_results.json` naming the data (marked
`slow`: about 4 minutes together on 2 busy cores, the captioner's METEOR start-up the longest); the flag combinations
that mix the user's files with another data source are refused (fast)."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
import skimage
from launch_helpers import save_tiny_bert
from PIL import Image
from script_modules import ROOT, load_script

from hf_vlalign.recipes import DataArguments, ModelArguments, parse_recipe_args
from hf_vlalign.recipes.arguments import read_config_file

PHOTOS = Path(os.path.dirname(skimage.__file__)) / "data"
PHOTO_NAMES = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "horse.png", "camera.png")
# the pixel encoder's dimension: the store's, hence the saved model's `visual_feat_dim`
FEATURE_DIM = 256
# a few steps of tiny batches, no checkpoint, every evaluation row
SHORT_RUN = [
    "--max_steps", "2", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "4",
    "--save_strategy", "no", "--report_to", "none", "--logging_steps", "1", "--image_use_examples", "4",
]  # fmt: skip


def example(name: str):
    return load_script(name, ROOT / "examples" / f"{name}.py")


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory) -> Path:
    """A folder of six real photos (photos/) beside which the tests write their data files, and a tiny BERT."""
    folder = tmp_path_factory.mktemp("user_data")
    (folder / "photos").mkdir()
    for name in PHOTO_NAMES:
        shutil.copy(PHOTOS / name, folder / "photos" / name)
    save_tiny_bert(folder / "bert")
    return folder


@pytest.fixture(autouse=True)
def _feature_cache(user_folder, monkeypatch):
    """The region-feature stores of the photos, extracted once for the module."""
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(user_folder / "cache"))


def sizes(folder: Path) -> dict[str, tuple[int, int]]:
    """{photo: (width, height)}."""
    out = {}
    for name in PHOTO_NAMES:
        with Image.open(folder / "photos" / name) as image:
            out[name] = image.size
    return out


def whole(size: tuple[int, int]) -> list[int]:
    return [0, 0, *size]


def corner(size: tuple[int, int]) -> list[float]:
    """The top left cell of the 4 x 4 grid."""
    return [0, 0, size[0] / 4, size[1] / 4]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    """A CSV file of `rows` (a list or object cell as JSON text)."""
    columns = list(dict.fromkeys(column for row in rows for column in row))
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(columns)
        for row in rows:
            cells = [row.get(column, "") for column in columns]
            writer.writerow([json.dumps(cell) if isinstance(cell, (list, dict)) else cell for cell in cells])
    return path


def caption_rows(folder: Path) -> list[dict]:
    """Two grounded captions of each photo."""
    size = sizes(folder)
    texts = {
        "astronaut.png": ("the astronaut poses beside a flag .", "the astronaut", "a woman in a white suit smiles .", "a woman"),
        "chelsea.png": ("a cat looks to the side .", "a cat", "an orange cat sits still .", "an orange cat"),
        "coffee.png": ("a cup of coffee on a saucer .", "a cup", "coffee with foam in a red cup .", "coffee"),
        "rocket.jpg": ("a rocket stands on the launch pad .", "a rocket", "the launch tower beside a rocket .", "the launch tower"),
        "horse.png": ("a black horse in profile .", "a black horse", "the horse raises its tail .", "the horse"),
        "camera.png": ("a man with a camera on a tripod .", "a man", "the camera faces the right .", "the camera"),
    }  # fmt: skip
    rows = []
    for name, (first, first_phrase, second, second_phrase) in texts.items():
        rows.append({"image": f"photos/{name}", "caption": first,
                     "phrases": [{"text": first_phrase, "boxes": [whole(size[name])]}]})  # fmt: skip
        rows.append({"image": f"photos/{name}", "caption": second,
                     "phrases": [{"text": second_phrase, "boxes": [corner(size[name])]}]})  # fmt: skip
    return rows


def assert_finished(
    output_dir: Path, results: dict, metric_keys: tuple[str, ...], source: str, card_dir: Path | None = None
) -> dict:
    """The run wrote its results with `metric_keys`, named the data (also in the model card of `card_dir`, default
    `output_dir`), and saved a model reading the store's features."""
    written = json.loads((output_dir / "eval_results.json").read_text())
    assert written == json.loads(json.dumps(results))
    for key in metric_keys:
        assert key in written, sorted(written)
    assert written["data"].startswith("user data: ") and source in written["data"], written["data"]
    config = json.loads((output_dir / "config.json").read_text())
    assert config["visual_feat_dim"] == FEATURE_DIM
    assert "user data" in ((card_dir or output_dir) / "README.md").read_text()
    return written


# ----------------------------------------------------------------------------------------------------------------
# Every example on the user format
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.slow  # a whole run of the example
def test_flickr_grounding_on_user_captions(user_folder, tmp_path):
    rows = caption_rows(user_folder)
    train = write_jsonl(user_folder / "captions_train.jsonl", rows[:8])
    validation = write_jsonl(user_folder / "captions_val.jsonl", rows[8:])
    output_dir = tmp_path / "out"
    results = example("finetune_flickr_grounding").main([
        "--train_file", str(train), "--validation_file", str(validation), "--output_dir", str(output_dir),
        "--model_name_or_path", str(user_folder / "bert"), *SHORT_RUN,
    ])  # fmt: skip
    written = assert_finished(
        output_dir, results, ("recall@1_merged_boxes", "recall@1_any_box", "eval_loss"), "captions_train.jsonl (8 rows)"
    )
    assert "captions_val.jsonl (4 rows)" in written["data"]
    assert written["eval_captions"] == 4


def test_flickr_grounding_refuses_captions_without_phrases(user_folder, tmp_path):
    rows = [{"image": row["image"], "caption": row["caption"]} for row in caption_rows(user_folder)]
    train = write_jsonl(user_folder / "plain_captions.jsonl", rows)
    with pytest.raises(ValueError, match="phrase grounding learns from grounded phrases.*add `phrases`"):
        example("finetune_flickr_grounding").main(
            ["--train_file", str(train), "--output_dir", str(tmp_path / "out"), *SHORT_RUN]
        )


def vqa_rows(folder: Path) -> list[dict]:
    """Two questions on each photo, one of them grounded."""
    size = sizes(folder)
    subjects = {"astronaut.png": "person", "chelsea.png": "cat", "coffee.png": "cup", "rocket.jpg": "rocket",
                "horse.png": "horse", "camera.png": "person"}  # fmt: skip
    rows = []
    for name, subject in subjects.items():
        rows.append({"image": f"photos/{name}", "question": "what is in the picture ?", "answer": subject,
                     "phrases": [{"text": "the picture", "boxes": [whole(size[name])]}]})  # fmt: skip
        rows.append({"image": f"photos/{name}", "question": "is it a photo ?", "answers": ["yes", "yes", "no"]})
    return rows


@pytest.mark.slow  # a whole run of the example
def test_vqa_on_user_questions_from_csv(user_folder, tmp_path):
    train = write_csv(user_folder / "questions.csv", vqa_rows(user_folder))
    output_dir = tmp_path / "out"
    results = example("finetune_vqa").main([
        "--train_file", str(train), "--output_dir", str(output_dir), "--model_name_or_path", str(user_folder / "bert"),
        "--supervision", "direct", *SHORT_RUN,
    ])  # fmt: skip
    written = assert_finished(
        output_dir, results, ("accuracy", "vqa_accuracy", "majority_baseline_accuracy"), "questions.csv (12 rows"
    )
    # no validation file: the rows of 2 of the 6 images (10%, at least 2) are held out
    assert "held out for evaluation" in written["data"] and written["eval_examples"] == 4
    # fewer than ten answers: the training score of the predicted answer is its VQA accuracy (a right single answer 1)
    assert written["vqa_accuracy"] == pytest.approx(written["accuracy"], abs=1e-6)
    vocab = json.loads((output_dir / "answer_vocab.json").read_text())
    assert set(vocab) == {"person", "cat", "cup", "rocket", "horse", "yes", "no"}
    assert written["num_answers"] == len(vocab)


def nlvr2_rows() -> list[dict]:
    """Each sentence judged against two image pairs, once true and once false."""
    pairs = [("chelsea.png", "horse.png"), ("coffee.png", "rocket.jpg"), ("astronaut.png", "chelsea.png"),
             ("camera.png", "coffee.png"), ("horse.png", "rocket.jpg"), ("astronaut.png", "camera.png")]  # fmt: skip
    sentences = ["one image shows an animal .", "one image shows an animal .", "a person is in the left image .",
                 "a person is in the left image .", "the right image shows a rocket .", "the right image shows a rocket ."]  # fmt: skip
    labels = [True, False, True, True, True, False]
    return [
        {"left_image": f"photos/{left}", "right_image": f"photos/{right}", "sentence": sentence, "label": label}
        for (left, right), sentence, label in zip(pairs, sentences, labels)
    ]


@pytest.mark.slow  # a whole run of the example
def test_nlvr2_on_user_pairs(user_folder, tmp_path):
    rows = nlvr2_rows()
    train = write_jsonl(user_folder / "pairs_train.jsonl", rows)
    validation = write_jsonl(user_folder / "pairs_val.jsonl", rows[:4])
    output_dir = tmp_path / "out"
    results = example("finetune_nlvr2").main([
        "--train_file", str(train), "--validation_file", str(validation), "--output_dir", str(output_dir),
        "--model_name_or_path", str(user_folder / "bert"), *SHORT_RUN,
    ])  # fmt: skip
    written = assert_finished(
        output_dir, results, ("accuracy", "consistency", "majority_baseline_accuracy"), "pairs_train.jsonl (6 rows)"
    )
    assert written["eval_sentences"] == 2  # two sentences, each judged against two pairs


def refcoco_rows(folder: Path) -> list[dict]:
    """The whole photo and its top left corner referred to, for each photo."""
    size = sizes(folder)
    rows = []
    for name in PHOTO_NAMES:
        rows.append({"image": f"photos/{name}", "expression": "the whole picture", "box": whole(size[name])})
        rows.append({"image": f"photos/{name}", "expression": "the top left corner", "box": corner(size[name])})
    return rows


@pytest.mark.slow  # a whole run of the example
def test_refcoco_on_user_expressions(user_folder, tmp_path):
    rows = refcoco_rows(user_folder)
    train = write_jsonl(user_folder / "expressions_train.jsonl", rows[:8])
    validation = write_jsonl(user_folder / "expressions_val.jsonl", rows[8:])
    output_dir = tmp_path / "out"
    results = example("finetune_refcoco").main([
        "--train_file", str(train), "--validation_file", str(validation), "--output_dir", str(output_dir),
        "--model_name_or_path", str(user_folder / "bert"), "--supervision", "direct", *SHORT_RUN,
    ])  # fmt: skip
    assert_finished(output_dir, results, ("accuracy", "chance_accuracy", "eval_loss"), "expressions_val.jsonl (4 rows)")


def vgp_rows(folder: Path) -> list[dict]:
    """A paraphrase pair on each photo (grounded phrases in both captions), one caption of it describing the photo."""
    size = sizes(folder)
    types = ["Equivalence", "Entailment1", "Alternation", "Independence", "Entailment2", None]
    labels = ["both", "c1", "c2", "both", "c1", "c2"]
    rows = []
    for (name, kind, label), caption in zip(zip(PHOTO_NAMES, types, labels), caption_rows(folder)[::2]):
        phrase = caption["phrases"][0]["text"]
        other = f"there is {phrase} here ."
        rows.append({
            "image": f"photos/{name}", "caption1": caption["caption"], "caption2": other, "phrase1": phrase,
            "phrase2": phrase, "label": label, "type": kind,
            "phrases1": [{"text": phrase, "boxes": [whole(size[name])]}],
            "phrases2": [{"text": phrase, "boxes": [whole(size[name])]}],
        })  # fmt: skip
    return rows


@pytest.mark.slow  # a whole run of the example
def test_vgp_on_user_paraphrases(user_folder, tmp_path):
    rows = vgp_rows(user_folder)
    train = write_jsonl(user_folder / "paraphrases_train.jsonl", rows)
    validation = write_jsonl(user_folder / "paraphrases_val.jsonl", rows[2:4])
    output_dir = tmp_path / "out"
    results = example("finetune_vgp").main([
        "--train_file", str(train), "--validation_file", str(validation), "--output_dir", str(output_dir),
        "--model_name_or_path", str(user_folder / "bert"), *SHORT_RUN,
    ])  # fmt: skip
    assert_finished(
        output_dir, results, ("image_description_accuracy", "vgp_accuracy", "grounding_accuracy_best_head"),
        "paraphrases_train.jsonl (6 rows), paraphrases_val.jsonl (2 rows)",
    )  # fmt: skip


@pytest.mark.slow  # a whole run of the example
def test_pretrain_single_stream_on_user_captions(user_folder, tmp_path):
    train = write_jsonl(user_folder / "captions_all.jsonl", caption_rows(user_folder))
    output_dir = tmp_path / "out"
    results = example("pretrain_single_stream").main([
        "--train_file", str(train), "--output_dir", str(output_dir), "--model_name_or_path", str(user_folder / "bert"),
        "--supervision", "direct", "--region_mask_probability", "0.15", *SHORT_RUN,
    ])  # fmt: skip
    written = assert_finished(
        output_dir, results, ("mlm_accuracy", "sentence_image_accuracy"), "captions_all.jsonl (12 rows"
    )
    assert written["eval_examples"] == 4  # two held-out photos, two captions each


@pytest.mark.slow  # a whole run of the example
def test_pretrain_two_stream_on_user_captions(user_folder, tmp_path):
    rows = caption_rows(user_folder)
    train = write_jsonl(user_folder / "captions_train.jsonl", rows[:8])
    validation = write_jsonl(user_folder / "captions_val.jsonl", rows[8:])
    output_dir = tmp_path / "out"
    summary = example("pretrain_two_stream").main([
        "--train_file", str(train), "--validation_file", str(validation), "--output_dir", str(output_dir),
        "--model_name_or_path", str(user_folder / "bert"), "--l_layers", "1", "--r_layers", "1", "--x_layers", "2",
        "--alignment_loss", "with", *SHORT_RUN,
    ])  # fmt: skip
    results = summary["with_alignment"]
    keys = ("cross_attention_grounding_accuracy", "alignment_decoder_grounding_accuracy", "alignment_loss")
    assert_finished(output_dir / "with_alignment", results, keys, "captions_val.jsonl (4 rows)", card_dir=output_dir)
    assert results["alignment_loss"] is not None  # the decoder trained towards the phrases' IoU targets


@pytest.mark.slow  # a whole run of the example
def test_train_captioning_on_user_captions(user_folder, tmp_path):
    rows = caption_rows(user_folder)
    train = write_jsonl(user_folder / "captions_train.jsonl", rows[:8])
    validation = write_jsonl(user_folder / "captions_val.jsonl", rows[8:])
    output_dir = tmp_path / "out"
    results = example("train_captioning").main([
        "--train_file", str(train), "--validation_file", str(validation), "--output_dir", str(output_dir),
        "--d_model", "32", "--ffn_dim", "64", "--attention_heads", "4", "--encoder_layers", "1", "--decoder_layers", "1",
        "--max_new_tokens", "6", "--analysis_examples", "4", "--spice", "false", *SHORT_RUN,
    ])  # fmt: skip
    written = assert_finished(output_dir, results, ("bleu_4", "cider", "alignment"), "captions_val.jsonl (4 rows)")
    assert written["num_test_images"] == 2  # the two validation photos, their two rows each the references
    samples = json.loads((output_dir / "samples.json").read_text())
    assert all(len(sample["references"]) == 2 for sample in samples)


@pytest.mark.slow  # a whole run of the example
def test_samaran_table1_on_user_data(user_folder, tmp_path):
    vgp = write_jsonl(user_folder / "t1_vgp.jsonl", vgp_rows(user_folder))
    vqa = write_jsonl(user_folder / "t1_vqa.jsonl", vqa_rows(user_folder))
    refcoco = write_jsonl(user_folder / "t1_refcoco.jsonl", refcoco_rows(user_folder))
    refcoco_val = write_jsonl(user_folder / "t1_refcoco_val.jsonl", refcoco_rows(user_folder)[:4])
    common = [flag if not flag.startswith("--") else f"--common.{flag[2:]}" for flag in SHORT_RUN]
    output_dir = tmp_path / "out"
    table = example("samaran_table1").main([
        "--train_file", str(vgp), "--vqa_train_file", str(vqa), "--refcoco_train_file", str(refcoco),
        "--refcoco_validation_file", str(refcoco_val), "--supervisions", "direct", "--output_dir", str(output_dir),
        "--vgp.model_name_or_path", str(user_folder / "bert"), *common,
    ])  # fmt: skip
    assert table["columns"] == ["VQA (user data)", "referring expressions (user data)"]
    metrics = table["settings"]["direct"]["metrics"]
    assert set(metrics) == {*table["columns"], *table["vgp_columns"]}
    for stage, source in (("vgp", "t1_vgp.jsonl"), ("vqa", "t1_vqa.jsonl"), ("refcoco", "t1_refcoco_val.jsonl")):
        folder = output_dir / "direct" / "seed42" / stage
        assert source in json.loads((folder / "eval_results.json").read_text())["data"]
        assert json.loads((folder / "config.json").read_text())["visual_feat_dim"] == FEATURE_DIM


# ----------------------------------------------------------------------------------------------------------------
# Refused combinations
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "flags", "message"),
    [
        # a flag of the shared data arguments, and one of an example's own data flags (`data_source_flags`)
        ("finetune_vqa", ["--dataset", "gqa"], "`--dataset` names another data source than `--train_file`"),
        ("finetune_vgp", ["--vgp_train_csv", "x.csv"], "`--vgp_train_csv` names another"),
        # a paper's config gives way to your file, a flag typed beside it does not
        ("finetune_vgp", ["--config", str(ROOT / "examples" / "configs" / "samaran_vgp.yaml"), "--negatives", "hard"],
         "`--negatives` names another"),
    ],
)
def test_train_file_refuses_the_flags_of_other_data(name, flags, message, tmp_path):
    train = tmp_path / "data" / "train.jsonl"
    with pytest.raises(ValueError, match=message):
        example(name).parse_args(["--train_file", str(train), *flags, "--output_dir", str(tmp_path / "out")])


def test_user_data_flags_need_a_train_file(tmp_path):
    with pytest.raises(ValueError, match="`--grid_size` applies only to your own data: pass `--train_file`"):
        example("finetune_vgp").parse_args(["--grid_size", "3", "--output_dir", str(tmp_path / "out")])


def test_output_dir_may_not_hold_the_train_file(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("")
    with pytest.raises(ValueError, match="--train_file"):
        parse_recipe_args(["--train_file", str(train), "--output_dir", str(tmp_path)], (ModelArguments, DataArguments))


def test_without_validation_file_the_rows_of_held_out_images_evaluate(user_folder, tmp_path):
    import datasets

    from hf_vlalign.recipes.user_data import held_out_split

    rows = datasets.Dataset.from_dict({"image_id": [f"img{i // 2}" for i in range(40)], "row": list(range(40))})
    train, evaluation = held_out_split(rows, seed=0, file="train.jsonl")
    assert len(set(evaluation["image_id"])) == 2 and len(evaluation) == 4  # 10% of 20 images, all their rows
    assert not set(train["image_id"]) & set(evaluation["image_id"])
    assert held_out_split(rows, seed=0, file="train.jsonl")[1]["row"] == evaluation["row"]  # seeded
    with pytest.raises(ValueError, match="needs at least 3 images; pass `--validation_file`"):
        held_out_split(rows.select(range(4)), seed=0, file="train.jsonl")


def test_a_validation_file_of_one_image_is_refused(user_folder, tmp_path):
    rows = caption_rows(user_folder)
    train = write_jsonl(user_folder / "one_image_train.jsonl", rows[:8])
    validation = write_jsonl(user_folder / "one_image_val.jsonl", rows[8:10])
    with pytest.raises(ValueError, match="shows 1 image: the evaluation needs rows of at least 2 images"):
        example("finetune_flickr_grounding").main([
            "--train_file", str(train), "--validation_file", str(validation), "--output_dir", str(tmp_path / "out"),
            *SHORT_RUN,
        ])  # fmt: skip


def test_a_checkpoint_of_another_feature_dimension_is_refused(user_folder, tmp_path):
    from transformers import AutoTokenizer

    from hf_vlalign import SingleStreamConfig, SingleStreamForPhraseGrounding

    tokenizer = AutoTokenizer.from_pretrained(user_folder / "bert")
    config = SingleStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, visual_feat_dim=64,
    )  # fmt: skip
    checkpoint = tmp_path / "checkpoint"
    SingleStreamForPhraseGrounding(config).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    rows = caption_rows(user_folder)
    train = write_jsonl(user_folder / "captions_train.jsonl", rows[:8])
    validation = write_jsonl(user_folder / "captions_val.jsonl", rows[8:])
    with pytest.raises(ValueError, match="reads 64-dimensional region features but the features of the data have 256"):
        example("finetune_flickr_grounding").main([
            "--train_file", str(train), "--validation_file", str(validation), "--output_dir", str(tmp_path / "out"),
            "--model_name_or_path", str(checkpoint), *SHORT_RUN,
        ])  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--train_file", "{vgp}", "--vgp_train_csv", "x.csv"], "`--vgp_train_csv` reads published data"),
        (["--train_file", "{vgp}", "--vqa_train_file", "{vgp}", "--vqa_eval_split", "test"], "`--vqa_eval_split` reads published"),
        (["--train_file", "{vgp}", "--vqa_validation_file", "{vgp}"], "`--vqa_validation_file` is the evaluation rows of `--vqa_train_file`"),
        (["--train_file", "{vgp}", "--refcoco_train_file", "{vgp}"], "the vqa stage reads `--vqa_train_file`.*missing: \\['vqa_dir'\\]"),
    ],
)
def test_samaran_table1_refuses_mixed_data_sources(flags, message, tmp_path):
    vgp = str(tmp_path / "vgp.jsonl")
    argv = [flag.format(vgp=vgp) for flag in flags]
    with pytest.raises(ValueError, match=message):
        example("samaran_table1").parse_args([*argv, "--output_dir", str(tmp_path / "out")])


def test_pretrain_two_stream_refuses_captions_without_phrases(user_folder, tmp_path):
    rows = [{"image": row["image"], "caption": row["caption"]} for row in caption_rows(user_folder)]
    train = write_jsonl(user_folder / "plain_captions.jsonl", rows)
    with pytest.raises(ValueError, match="the alignment loss and the cross-attention grounding evaluation read grounded"):
        example("pretrain_two_stream").main(["--train_file", str(train), "--output_dir", str(tmp_path / "out")])


# ----------------------------------------------------------------------------------------------------------------
# Each paper's recipe (examples/configs/) on the user format: the commands of docs/own_data.md
# ----------------------------------------------------------------------------------------------------------------

CONFIGS = ROOT / "examples" / "configs"


def recipe_commands() -> list[str]:
    """The commands of docs/own_data.md's section "Each paper's recipe on your data", continuation lines joined."""
    text = (ROOT / "docs" / "own_data.md").read_text()
    start = text.index("## Each paper's recipe on your data")
    section = text[start : text.index("\n## ", start)]
    shell = "".join(re.findall(r"```bash\n(.*?)```", section, re.S)).replace("\\\n", " ")
    return [line for line in shell.splitlines() if line.strip() and not line.startswith("#")]


def recipe_argv(config: str, tmp_path: Path) -> tuple[str, list[str]]:
    """(the example, its flags) of the docs' command running `config`, the output under `tmp_path`."""
    command = next((line for line in recipe_commands() if f"examples/configs/{config}" in line), None)
    assert command is not None, f"docs/own_data.md's recipe section has no command for examples/configs/{config}"
    tokens = shlex.split(command)
    script = next(token for token in tokens if re.fullmatch(r"examples/\w+\.py", token))
    flags = tokens[tokens.index(script) + 1 :]
    argv = [str(ROOT / token) if token.startswith("examples/configs/") else token for token in flags]
    argv[argv.index("--output_dir") + 1] = str(tmp_path / "out")
    return Path(script).stem, argv


@pytest.mark.parametrize("config", sorted(path.name for path in CONFIGS.glob("*.yaml")))
def test_each_papers_config_runs_on_user_files_as_the_docs_say(config, tmp_path):
    """The docs' command of every paper's config parses with user files: the config's published-data settings are left
    out, its training settings kept; Table 1's three sub-runs take their flags as the driver passes them."""
    name, argv = recipe_argv(config, tmp_path)
    values = read_config_file(CONFIGS / config)
    if name != "samaran_table1":
        *parsed, training_args = example(name).parse_args(argv)
        assert parsed[0].train_file.endswith(".jsonl")
        assert training_args.learning_rate == pytest.approx(values["learning_rate"])  # the paper's
        return
    table = example(name)
    args, stage_flags = table.parse_args(argv)
    assert all(args.user_data(stage) for stage in table.STAGES) and args.seed_list == [12345]
    examples = table.stage_examples()
    for stage in table.STAGES:
        config_file = tmp_path / f"{stage}.json"
        config_file.write_text(json.dumps(stage_flags[stage]))
        flags = table.driver_flags(stage, args, "direct", 12345, tmp_path / "out" / "direct" / "seed12345")
        sub_argv = ["--config", str(config_file)]
        sub_argv += [item for key, value in flags.items() for item in (f"--{key}", str(value))]
        training_args = examples[stage].parse_args(sub_argv)[-1]
        assert training_args.learning_rate == pytest.approx(values[stage]["learning_rate"]), stage


def test_a_papers_config_names_the_published_data_settings_it_leaves_out(tmp_path):
    from transformers.testing_utils import CaptureLogger

    from hf_vlalign.recipes import arguments

    argv = ["--config", str(CONFIGS / "fei_a2.yaml"), "--train_file", "c.jsonl", "--output_dir", str(tmp_path / "out")]
    with CaptureLogger(arguments.logger) as captured:
        args, _ = example("train_captioning").parse_args(argv)
    assert "fei_a2.yaml: eval_split, restval_in_train set the published data, which `--train_file` replaces" in (
        captured.out
    )
    assert args.a2_fusions == "none,max,moving_average,exp_decay,gate"  # the paper's settings stay
