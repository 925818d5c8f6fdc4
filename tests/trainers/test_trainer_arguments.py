"""Every trainer's own settings are fields of its `TrainingArguments` subclass: parsed from a command line by
`HfArgumentParser`, listed by `--help`, saved with the run, checked when the arguments are made; the trainers take
them from `args` only, converting a plain `TrainingArguments`."""

import json
from dataclasses import fields

import pytest
import torch
from torch import nn
from transformers import HfArgumentParser, TrainingArguments
from transformers.modeling_outputs import SequenceClassifierOutput

from hf_vlalign.recipes import save_model
from hf_vlalign.trainers import (
    TwoStreamPretrainingTrainer,
    TwoStreamPretrainingTrainingArguments,
    CaptioningTrainer,
    CaptioningTrainingArguments,
    ComponentLossTrainer,
    ComponentLossTrainingArguments,
    PhraseGroundingTrainer,
    PhraseGroundingTrainingArguments,
    ReferringExpressionTrainer,
    SingleStreamPretrainingTrainer,
    SingleStreamPretrainingTrainingArguments,
    TaskTrainer,
    TaskTrainingArguments,
    VGPTrainer,
    VGPTrainingArguments,
)

# each trainer, its arguments' class, and a command line of their own settings with the values it parses to
COMMON = {"distill_from": ("teacher", "teacher"), "distill_temperature": ("3", 3.0), "distill_weight": ("0.5", 0.5),
          "ewc_weight": ("2", 2.0), "ewc_fisher": ("fisher.safetensors", "fisher.safetensors")}  # fmt: skip
TRAINERS = {
    ComponentLossTrainer: (ComponentLossTrainingArguments, COMMON),
    VGPTrainer: (VGPTrainingArguments, COMMON | {"head_learning_rate": ("0.002", 2e-3)}),
    TaskTrainer: (TaskTrainingArguments, COMMON | {"head_learning_rate": ("0.002", 2e-3)}),
    ReferringExpressionTrainer: (TaskTrainingArguments, COMMON | {"head_learning_rate": ("0.002", 2e-3)}),
    PhraseGroundingTrainer: (PhraseGroundingTrainingArguments, COMMON | {"head_learning_rate": ("0.001", 1e-3)}),
    SingleStreamPretrainingTrainer: (SingleStreamPretrainingTrainingArguments, COMMON),
    TwoStreamPretrainingTrainer: (TwoStreamPretrainingTrainingArguments, COMMON | {"qa_start_epoch": ("2.5", 2.5)}),
    CaptioningTrainer: (
        CaptioningTrainingArguments,
        COMMON | {"mask_update_every": ("2", 2), "mask_learning_rate": ("0.01", 0.01), "scst_start_epoch": ("1", 1.0),
                  "scst_max_new_tokens": ("7", 7), "encoder_learning_rate": ("0.0002", 2e-4)},
    ),  # fmt: skip
}
# the keyword arguments the trainers took before their settings became fields of `args`
OLD_KEYWORDS = {
    ComponentLossTrainer: ("distill_from", "distill_temperature", "distill_weight", "ewc_lambda", "ewc_fisher"),
    TaskTrainer: ("label_names", "head_learning_rate"),
    PhraseGroundingTrainer: ("head_learning_rate", "label_names"),
    TwoStreamPretrainingTrainer: ("vqa_start_epoch",),
    CaptioningTrainer: ("mask_update_every", "mask_learning_rate", "scst_start_epoch", "scst_max_new_tokens",
                        "encoder_learning_rate", "tokenizer"),  # fmt: skip
}


class TinyRegression(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x, target):
        prediction = self.linear(x).squeeze(-1)
        return SequenceClassifierOutput(loss=((prediction - target) ** 2).mean(), logits=prediction)


def command_line(settings: dict) -> list[str]:
    return [item for name, (flag, _) in settings.items() for item in (f"--{name}", flag)]


@pytest.mark.parametrize("trainer_class", list(TRAINERS), ids=lambda cls: cls.__name__)
def test_arguments_round_trip_through_the_parser(trainer_class, tmp_path):
    args_class, settings = TRAINERS[trainer_class]
    assert trainer_class.args_class is args_class and issubclass(args_class, ComponentLossTrainingArguments)
    parser = HfArgumentParser(args_class)
    (args,) = parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--seed", "3", *command_line(settings)])
    assert type(args) is args_class and args.seed == 3
    assert {name: getattr(args, name) for name in settings} == {name: value for name, (_, value) in settings.items()}
    help_text = parser.format_help()
    assert all(f"--{name}" in help_text for name in settings)
    saved = json.loads(args.to_json_string())  # what the examples write as training_args.json
    assert {name: saved[name] for name in settings} == {name: value for name, (_, value) in settings.items()}
    # and every setting has its help line, like transformers' own fields
    own = [field for field in fields(args_class) if field.name not in {f.name for f in fields(TrainingArguments)}]
    assert own and all(field.metadata.get("help") for field in own)


def test_settings_are_saved_with_the_run(tmp_path):
    rows = [{"x": torch.randn(2), "target": torch.randn(())} for _ in range(4)]
    args = TaskTrainingArguments(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, report_to="none", use_cpu=True,
        remove_unused_columns=False, save_strategy="no", distill_weight=0.25, label_names=["target"],
    )  # fmt: skip
    trainer = TaskTrainer(model=TinyRegression(), args=args, train_dataset=rows)
    trainer.train()
    save_model(trainer, tmp_path / "model")
    saved = json.loads((tmp_path / "model" / "training_args.json").read_text())
    assert saved["distill_weight"] == 0.25 and saved["ewc_weight"] == 0.0 and saved["label_names"] == ["target"]
    assert trainer.label_names == ["target"]  # `label_names` of the arguments is what the trainer reads


@pytest.mark.parametrize("trainer_class", list(OLD_KEYWORDS), ids=lambda cls: cls.__name__)
def test_trainers_take_their_settings_from_args_only(trainer_class, tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    for keyword in OLD_KEYWORDS[trainer_class]:
        with pytest.raises(TypeError, match=keyword):
            trainer_class(model=TinyRegression(), args=args, **{keyword: None})


def test_plain_training_arguments_are_converted(tmp_path):
    plain = TrainingArguments(
        output_dir=str(tmp_path), learning_rate=3e-3, report_to="none", use_cpu=True, hub_token="secret",
        lr_scheduler_type="cosine", label_names=["target"],
    )  # fmt: skip
    trainer = PhraseGroundingTrainer(model=TinyRegression(), args=plain)
    assert type(trainer.args) is PhraseGroundingTrainingArguments
    converted = trainer.args.to_dict()
    assert {name: converted[name] for name in plain.to_dict()} == plain.to_dict()
    assert trainer.args.hub_token == "secret" and trainer.args.head_learning_rate is None
    # the parents' arguments too (they hold a subset of the settings); an instance of the class is kept as it is
    parent = ComponentLossTrainingArguments(output_dir=str(tmp_path), distill_weight=0.5, report_to="none", use_cpu=True)
    assert PhraseGroundingTrainer(model=TinyRegression(), args=parent).args.distill_weight == 0.5
    own = PhraseGroundingTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    assert PhraseGroundingTrainer(model=TinyRegression(), args=own).args is own
    assert type(TaskTrainer(model=TinyRegression()).args) is TaskTrainingArguments  # None, as Trainer: `tmp_trainer`


def test_arguments_of_another_trainer_or_no_arguments_are_refused(tmp_path):
    other = CaptioningTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    message = r"`args` must be VGPTrainingArguments or a TrainingArguments to convert into it, got CaptioningTrainingArguments"
    with pytest.raises(ValueError, match=message):
        VGPTrainer(model=TinyRegression(), args=other)
    with pytest.raises(ValueError, match=r"`args` must be TaskTrainingArguments .*, got dict"):
        TaskTrainer(model=TinyRegression(), args={"output_dir": str(tmp_path)})


def test_bad_values_name_their_field(tmp_path):
    bad = [
        (ComponentLossTrainingArguments, {"distill_temperature": -1.0}, "`distill_temperature` must be > 0, got -1.0"),
        (ComponentLossTrainingArguments, {"distill_weight": float("nan")}, "`distill_weight` must be >= 0, got nan"),
        (VGPTrainingArguments, {"ewc_weight": 1.0}, "`ewc_weight=1.0` needs `ewc_fisher`"),
        (TaskTrainingArguments, {"head_learning_rate": 0.0}, "`head_learning_rate` must be > 0, got 0.0"),
        (CaptioningTrainingArguments, {"mask_update_every": 0}, "`mask_update_every` must be >= 1, got 0"),
    ]
    for args_class, settings, message in bad:
        with pytest.raises(ValueError, match=message):
            args_class(output_dir=str(tmp_path), report_to="none", **settings)
    # on the command line too, before anything is built
    parser = HfArgumentParser(TwoStreamPretrainingTrainingArguments)
    with pytest.raises(ValueError, match="`qa_start_epoch` must be >= 0"):
        parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--qa_start_epoch", "-1"])


def test_single_stream_pretraining_takes_its_evaluation_collator_as_an_object(tmp_path):
    def collate(rows):
        return rows

    args = SingleStreamPretrainingTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = SingleStreamPretrainingTrainer(model=TinyRegression(), args=args, eval_data_collator=collate)
    assert trainer.eval_data_collator is collate
