"""`head_learning_rate` (`TaskTrainingArguments`, `VGPTrainingArguments`): the parts of a task model a text checkpoint
lacks (the visual embeddings and the task heads) train at a rate of their own, the copied text encoder at `learning_rate`; Trainer's
weight-decay groups are kept. Two processes (DDP) train as one with it: `tests/trainers/test_multiprocess.py`."""

import pytest
import torch

from hf_vlalign import (
    SingleStreamConfig,
    SingleStreamForQuestionAnswering,
    SingleStreamForReferringExpression,
    SingleStreamForVisualParaphrase,
    SingleStreamForVisualReasoning,
    TwoStreamConfig,
    TwoStreamForQuestionAnswering,
    TwoStreamForReferringExpression,
    TwoStreamForVisualReasoning,
)
from hf_vlalign.trainers import (
    ReferringExpressionTrainer,
    TaskTrainer,
    TaskTrainingArguments,
    VGPTrainer,
    VGPTrainingArguments,
)

TASKS = {
    "question_answering": ({"single_stream": SingleStreamForQuestionAnswering, "two_stream": TwoStreamForQuestionAnswering}, "answer_head"),
    "visual_reasoning": ({"single_stream": SingleStreamForVisualReasoning, "two_stream": TwoStreamForVisualReasoning}, "reasoning_head"),
    "referring_expression": (
        {"single_stream": SingleStreamForReferringExpression, "two_stream": TwoStreamForReferringExpression}, "region_head"
    ),
}  # fmt: skip


def tiny_model(family: str, task: str) -> torch.nn.Module:
    config_class = {"single_stream": SingleStreamConfig, "two_stream": TwoStreamConfig}[family]
    sizes = {"l_layers": 1, "r_layers": 1, "x_layers": 1} if family == "two_stream" else {"num_hidden_layers": 1}
    config = config_class(vocab_size=50, hidden_size=16, num_attention_heads=2, intermediate_size=32, visual_feat_dim=8,
                          num_qa_labels=5, **sizes)  # fmt: skip
    return TASKS[task][0][family](config)


def learning_rates(trainer: TaskTrainer) -> dict[str, float]:
    optimizer = trainer.create_optimizer()
    rate_of = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    names = dict(trainer.model.named_parameters())
    assert len(rate_of) == len(names)  # every parameter in exactly one group
    return {name: rate_of[id(parameter)] for name, parameter in names.items()}


@pytest.mark.parametrize("family", ["single_stream", "two_stream"])
@pytest.mark.parametrize("task", list(TASKS))
def test_visual_embeddings_and_task_head_get_the_head_learning_rate(family, task, tmp_path):
    model = tiny_model(family, task)
    args = TaskTrainingArguments(
        output_dir=str(tmp_path), learning_rate=1e-4, weight_decay=0.01, head_learning_rate=2e-3, report_to="none"
    )
    trainer_class = ReferringExpressionTrainer if task == "referring_expression" else TaskTrainer
    trainer = trainer_class(model=model, args=args)
    rates = learning_rates(trainer)
    head = TASKS[task][1]
    new = {name for name in rates if name.split(".")[0] == head or ".visual_embeddings." in name}
    assert any(name.startswith(f"{head}.") for name in new) and any(".visual_embeddings." in name for name in new)
    assert {name for name, rate in rates.items() if rate == 2e-3} == new
    assert {rate for name, rate in rates.items() if name not in new} == {1e-4}  # the text encoder, embeddings included
    assert {group["weight_decay"] for group in trainer.optimizer.param_groups} == {0.0, 0.01}


def test_without_head_learning_rate_every_parameter_trains_at_learning_rate(tmp_path):
    args = TaskTrainingArguments(output_dir=str(tmp_path), learning_rate=3e-4, report_to="none")
    assert args.head_learning_rate is None
    assert set(learning_rates(TaskTrainer(model=tiny_model("single_stream", "question_answering"), args=args)).values()) == {3e-4}


def test_the_scheduler_scales_the_head_group_alike(tmp_path):
    # linear warmup: after 1 of 4 warmup steps every group is at a quarter of its own rate
    args = TaskTrainingArguments(
        output_dir=str(tmp_path), learning_rate=1e-4, head_learning_rate=1e-3, warmup_steps=4, report_to="none"
    )
    trainer = TaskTrainer(model=tiny_model("single_stream", "question_answering"), args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    assert sorted({round(group["lr"], 12) for group in trainer.optimizer.param_groups}) == [2.5e-5, 2.5e-4]


def test_the_vgp_trainer_trains_the_visual_embeddings_and_both_heads_at_the_head_learning_rate(tmp_path):
    config = SingleStreamConfig(vocab_size=50, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                                visual_feat_dim=8, num_hidden_layers=1, attention_supervision="indirect")  # fmt: skip
    args = VGPTrainingArguments(output_dir=str(tmp_path), learning_rate=1e-4, head_learning_rate=2e-3, report_to="none")
    rates = learning_rates(VGPTrainer(model=SingleStreamForVisualParaphrase(config), args=args))
    heads = ("visual_embeddings", "id_classifier", "vgp_dense", "vgp_classifier", "indirect_grounding_head")
    new = {name for name in rates if any(part in heads for part in name.split(".")[:-1])}
    assert {next(part for part in name.split(".") if part in heads) for name in new} == set(heads)
    assert {name for name, rate in rates.items() if rate == 2e-3} == new
    assert {rate for name, rate in rates.items() if name not in new} == {1e-4}  # the encoder, the pooler included
