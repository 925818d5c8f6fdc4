"""Knowledge distillation and EWC (`trainers/regularization.py`): hand examples, the Fisher file, the trainer options
and the `hf-vlalign fisher` verb, on real components."""

import json
import math

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoTokenizer, HfArgumentParser
from transformers.modeling_outputs import SequenceClassifierOutput

from hf_vlalign import SingleStreamConfig, SingleStreamForVisualParaphrase, default_text_model_path
from hf_vlalign.cli import main
from hf_vlalign.data.builders import load_vgp_data
from hf_vlalign.data.collators import VGPCollator
from hf_vlalign.synthetic import SyntheticSceneConfig
from hf_vlalign.trainers import VGPTrainer, VGPTrainingArguments
from hf_vlalign.trainers.regularization import (
    anchor_weights,
    distillation_loss,
    distilled_fields,
    estimate_fisher,
    ewc_penalty,
    load_fisher,
    outputs_distillation_loss,
    save_fisher,
)

SCENES = SyntheticSceneConfig(num_train_images=4, num_val_images=4, seed=3)
SYNTHETIC_FLAGS = ["--synthetic_train_images", "4", "--synthetic_eval_images", "4", "--synthetic_seed", "3"]


class TinyRegression(nn.Module):
    """y = w . x + b with the mean squared error: gradients that are easy to compute by hand."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)
        with torch.no_grad():
            self.linear.weight.copy_(torch.tensor([[1.0, -1.0]]))
            self.linear.bias.fill_(0.5)

    def forward(self, x, target):
        prediction = self.linear(x).squeeze(-1)
        return SequenceClassifierOutput(loss=((prediction - target) ** 2).mean(), logits=prediction)


# ----------------------------------------------------------------------------------------------------------------
# distillation


def test_distillation_loss_is_zero_against_itself():
    logits = torch.randn(5, 7)
    assert distillation_loss(logits, logits.clone(), temperature=2.0).item() == 0.0
    tokens = torch.randn(2, 4, 9)
    assert distillation_loss(tokens, tokens.clone(), 3.0, mask=torch.rand(2, 4) > 0.5).item() == 0.0


def test_distillation_loss_equals_the_hand_value_on_two_classes():
    # T = 2: teacher logits (2 ln 3, 0) / T -> p = (3/4, 1/4); student logits (0, 0) -> q = (1/2, 1/2)
    teacher, student = torch.tensor([[2 * math.log(3.0), 0.0]]), torch.zeros(1, 2)
    kl = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert distillation_loss(student, teacher, 2.0).item() == pytest.approx(kl * 4, rel=1e-6)
    # batchmean: a second, identical example leaves the mean; a masked-out third one is not counted
    batch_t = torch.cat([teacher, teacher, torch.tensor([[0.0, 9.0]])])
    mask = torch.tensor([True, True, False])
    assert distillation_loss(torch.zeros(3, 2), batch_t, 2.0, mask=mask).item() == pytest.approx(kl * 4, rel=1e-6)


def test_distillation_reads_every_logits_field_of_both_outputs():
    a, b = torch.randn(3, 2), torch.randn(3, 4)
    student = SequenceClassifierOutput(logits=a)
    assert distilled_fields({"id_logits": a, "vgp_logits": b}, {"id_logits": a + 1, "vgp_logits": b, "loss": a}) == ["id_logits", "vgp_logits"]
    # one term per head, summed
    expected = distillation_loss(a, a + 1, 2.0) + distillation_loss(b, b, 2.0)
    assert outputs_distillation_loss({"id_logits": a, "vgp_logits": b}, {"id_logits": a + 1, "vgp_logits": b}, 2.0) == pytest.approx(expected.item())
    # token-level logits count only the positions whose label is not -100
    tokens, labels = torch.randn(1, 3, 5), torch.tensor([[4, -100, -100]])
    teacher_tokens = tokens.clone()
    teacher_tokens[0, 1:] += torch.randn(2, 5)
    assert outputs_distillation_loss({"logits": tokens}, {"logits": teacher_tokens}, 1.0, labels=labels).item() == 0.0
    with pytest.raises(ValueError, match="no logits field.*vgp_logits"):
        distilled_fields({"vgp_logits": b}, student)


# ----------------------------------------------------------------------------------------------------------------
# EWC


def test_ewc_penalty_is_zero_at_the_anchor_and_the_hand_value_after_a_move():
    model = TinyRegression()
    anchor = anchor_weights(model)
    fisher = {"linear.weight": torch.tensor([[2.0, 3.0]]), "linear.bias": torch.tensor([5.0])}
    assert ewc_penalty(model, fisher, anchor).item() == 0.0
    with torch.no_grad():
        model.linear.weight[0, 1] += 0.5
    assert ewc_penalty(model, fisher, anchor).item() == pytest.approx(3.0 * 0.5**2)


def test_fisher_of_a_linear_model_is_the_mean_squared_gradient():
    model = TinyRegression()
    # loss = mean((w.x + b - t)^2) over 2 examples; residuals r = w.x + b - t
    x, t = torch.tensor([[1.0, 2.0], [3.0, 0.0]]), torch.tensor([0.0, 1.0])
    r = torch.tensor([1.0 - 2.0 + 0.5 - 0.0, 3.0 + 0.5 - 1.0])  # (-0.5, 2.5)
    grad_w = (2 * r[:, None] * x).mean(0)  # dL/dw = mean(2 r x) = (7, 1)
    grad_b = (2 * r).mean()  # = 2
    batch = {"x": x, "target": t}
    fisher = estimate_fisher(model, [batch], progress=False)
    assert torch.allclose(fisher["linear.weight"], grad_w.pow(2)[None])
    assert torch.allclose(fisher["linear.bias"], grad_b.pow(2).reshape(1))
    # the mean over batches: the same batch twice gives the same Fisher; num_batches stops early
    twice = estimate_fisher(model, [batch, batch, {"x": x, "target": t + 100}], num_batches=2, progress=False)
    assert torch.allclose(twice["linear.weight"], fisher["linear.weight"])
    with pytest.raises(ValueError, match="yielded no batch"):
        estimate_fisher(model, [], progress=False)


def test_fisher_file_round_trip(tmp_path):
    model = TinyRegression()
    fisher = {"linear.weight": torch.tensor([[0.25, 4.0]]), "linear.bias": torch.tensor([1.5])}
    path = save_fisher(tmp_path / "fisher.safetensors", fisher, anchor_weights(model))
    loaded_fisher, loaded_anchor = load_fisher(path)
    assert set(loaded_fisher) == set(loaded_anchor) == {"linear.weight", "linear.bias"}
    assert torch.equal(loaded_fisher["linear.weight"], fisher["linear.weight"])
    assert torch.equal(loaded_anchor["linear.bias"], model.linear.bias.detach())
    save_file({"fisher.linear.weight": torch.ones(1, 2)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match="same parameters"):
        load_fisher(tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match="no such file"):
        load_fisher(tmp_path / "missing.safetensors")


# ----------------------------------------------------------------------------------------------------------------
# the trainer options and the CLI verb


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_VLALIGN_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield load_vgp_data(synthetic_config=SCENES)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


def _tiny_vgp_model(tokenizer):
    torch.manual_seed(0)
    config = SingleStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, visual_feat_dim=SCENES.feature_dim, attention_supervision="direct",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return SingleStreamForVisualParaphrase(config)


def _args(tmp_path, **overrides):
    options = dict(
        output_dir=str(tmp_path), max_steps=2, logging_steps=1, per_device_train_batch_size=8, learning_rate=1e-3,
        report_to="none", remove_unused_columns=False, save_strategy="no", use_cpu=True, seed=0,
    )  # fmt: skip
    return VGPTrainingArguments(**(options | overrides))


def test_trainer_logs_distillation_and_ewc_components(data, tokenizer, tmp_path):
    model = _tiny_vgp_model(tokenizer)
    collator = VGPCollator(tokenizer, data.region_features)
    batches = torch.utils.data.DataLoader(data.train, batch_size=8, collate_fn=collator)
    fisher_path = save_fisher(tmp_path / "fisher.safetensors", estimate_fisher(model, batches, 1, progress=False), anchor_weights(model))
    model.save_pretrained(tmp_path / "teacher")
    args = _args(
        tmp_path, distill_from=str(tmp_path / "teacher"), distill_temperature=2.0, distill_weight=0.5, ewc_weight=10.0,
        ewc_fisher=str(fisher_path),
    )  # fmt: skip
    trainer = VGPTrainer(model=model, args=args, train_dataset=data.train, data_collator=collator)
    trainer.train()
    logs = [log for log in trainer.state.log_history if "loss" in log]
    assert len(logs) == 2
    for log in logs:
        assert {"loss_distill", "loss_ewc", "loss_id", "loss_vgp", "loss_attention_supervision"} <= set(log)
        task = log["loss_id"] + log["loss_vgp"] + log["loss_attention_supervision"]
        assert log["loss"] == pytest.approx(task + 0.5 * log["loss_distill"] + 10.0 * log["loss_ewc"], rel=1e-3)
    # the first step runs at the anchor, with the teacher's own weights (no dropout): both terms are zero
    assert logs[0]["loss_distill"] == pytest.approx(0.0, abs=1e-6) and logs[0]["loss_ewc"] == 0.0
    assert logs[1]["loss_distill"] > 0 and logs[1]["loss_ewc"] > 0
    assert all(not parameter.requires_grad for parameter in trainer.distill_teacher.parameters())
    metrics = trainer.evaluate(data.eval)
    assert "eval_loss_distill" in metrics and "eval_loss_ewc" in metrics


def test_trainer_names_bad_regularization_files(tokenizer, tmp_path):
    model = _tiny_vgp_model(tokenizer)
    with pytest.raises(ValueError, match="`distill_from` must be a local folder of a saved model"):
        VGPTrainer(model=model, args=_args(tmp_path, distill_from=str(tmp_path / "nowhere")))
    fisher = save_fisher(tmp_path / "other.safetensors", {"head.weight": torch.ones(2)}, {"head.weight": torch.ones(2)})
    with pytest.raises(ValueError, match="not trainable parameters"):
        VGPTrainer(model=model, args=_args(tmp_path, ewc_weight=1.0, ewc_fisher=str(fisher)))


def test_regularization_settings_are_arguments_only(tokenizer, tmp_path):
    """The settings are fields of the arguments: parsed from a command line, listed by `--help`, saved with the run;
    the trainer takes no keyword of its own."""
    parser = HfArgumentParser(VGPTrainingArguments)
    flags = ["--distill_from", "teacher", "--distill_temperature", "3", "--distill_weight", "0.25"]
    (args,) = parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), *flags, "--ewc_weight", "2", "--ewc_fisher", "f"])
    assert (args.distill_from, args.distill_temperature, args.distill_weight) == ("teacher", 3.0, 0.25)
    assert (args.ewc_weight, args.ewc_fisher) == (2.0, "f")
    help_text = parser.format_help()
    assert all(f"--{name}" in help_text for name in ("distill_from", "distill_temperature", "distill_weight", "ewc_weight", "ewc_fisher"))
    saved = json.loads(args.to_json_string())
    assert saved["distill_weight"] == 0.25 and saved["ewc_fisher"] == "f" and saved["ewc_weight"] == 2.0
    model = _tiny_vgp_model(tokenizer)
    with pytest.raises(TypeError, match="distill_weight"):
        VGPTrainer(model=model, args=_args(tmp_path), distill_weight=0.5)
    with pytest.raises(TypeError, match="ewc_lambda"):
        VGPTrainer(model=model, args=_args(tmp_path), ewc_lambda=1.0)


def test_fisher_verb_writes_a_file_that_load_fisher_reads(data, tokenizer, tmp_path, capsys):
    model = _tiny_vgp_model(tokenizer)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    output = tmp_path / "fisher.safetensors"
    argv = ["fisher", str(tmp_path / "model"), "--out", str(output), "--num_batches", "2", "--batch_size", "4"]
    assert main([*argv, *SYNTHETIC_FLAGS]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_batches"] == 2 and summary["fisher_sum"] > 0
    fisher, anchor = load_fisher(output)
    parameters = dict(model.named_parameters())
    assert set(fisher) == set(parameters)
    assert all(torch.equal(anchor[name], parameter.detach()) for name, parameter in parameters.items())
    assert ewc_penalty(model, fisher, anchor).item() == 0.0
    with pytest.raises(SystemExit, match="2"):  # a user mistake: one line on stderr, exit status 2
        main([*argv, "--data", "vgp", *SYNTHETIC_FLAGS])
    assert "`--data vgp` needs" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main([*argv[:-4], "--num_batches", "0", *SYNTHETIC_FLAGS])
    assert "`--num_batches` must be >= 1, got 0" in capsys.readouterr().err

    # a saved folder as the teacher (loaded with the student's class) and the verb's file, anchored at the model
    args = _args(tmp_path / "run", distill_from=tmp_path / "model", ewc_weight=1.0, ewc_fisher=output)
    assert (args.distill_from, args.ewc_fisher) == (str(tmp_path / "model"), str(output))  # paths saved as text
    trainer = VGPTrainer(model=model, args=args)
    assert type(trainer.distill_teacher) is SingleStreamForVisualParaphrase and not trainer.distill_teacher.training
    batch = VGPCollator(tokenizer, data.region_features)([data.train[i] for i in range(4)])
    loss, outputs = trainer.compute_loss(trainer.model, batch, return_outputs=True)
    assert loss.item() == pytest.approx(outputs.loss.item(), abs=1e-6)  # same weights, no dropout, at the anchor
    assert trainer._metrics["train"]["loss_ewc"] == [0.0]
