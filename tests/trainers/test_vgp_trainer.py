"""`VGPTrainer` logs every loss component, in training and in evaluation, on real synthetic-scene batches."""

import numpy as np
import pytest
from transformers import AutoTokenizer, EvalPrediction

from hf_vlalign import SingleStreamConfig, SingleStreamForVisualParaphrase, default_text_model_path
from hf_vlalign.data.collators import VGPCollator
from hf_vlalign.metrics import vgp_accuracy
from hf_vlalign.trainers import VGPTrainer, VGPTrainingArguments, vgp_classification_metrics

TYPES = ["Alternation", "Entailment1", "Entailment2", "Equivalence", "Independence"]


@pytest.mark.parametrize("supervision", ["direct", "indirect"])
def test_trainer_logs_each_loss_component_in_train_and_eval(vgp_data, tmp_path, supervision):
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    config = SingleStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, visual_feat_dim=32, attention_supervision=supervision,
    )
    args = VGPTrainingArguments(
        output_dir=str(tmp_path), max_steps=3, logging_steps=1, per_device_train_batch_size=8,
        per_device_eval_batch_size=16, report_to="none", remove_unused_columns=False, save_strategy="no",
        use_cpu=True, seed=0,
    )
    trainer = VGPTrainer(
        model=SingleStreamForVisualParaphrase(config), args=args, train_dataset=vgp_data.train,
        eval_dataset=vgp_data.eval, data_collator=VGPCollator(tokenizer, vgp_data.region_features),
    )
    trainer.train()
    metrics = trainer.evaluate()
    train_logs = [log for log in trainer.state.log_history if "loss" in log]
    assert len(train_logs) == 3
    for log in train_logs:
        assert {"loss_id", "loss_vgp", "loss_attention_supervision"} <= set(log)
        # the logged total is eq. (9) of the logged components (all weights 1), up to averaging within the step
        assert log["loss"] == pytest.approx(log["loss_id"] + log["loss_vgp"] + log["loss_attention_supervision"], rel=1e-3)
    for key in ("eval_loss_id", "eval_loss_vgp", "eval_loss_attention_supervision", "eval_image_description_accuracy", "eval_vgp_accuracy"):
        assert key in metrics, key
    assert 0.0 <= metrics["eval_vgp_accuracy"] <= 1.0
    # the type task (the default): accuracy per semantic type over the typed evaluation pairs
    counts = {name: metrics[f"eval_vgp_type_count/{name}"] for name in TYPES}
    assert sum(counts.values()) == metrics["eval_vgp_labelled_pairs"] > 0
    assert metrics["eval_vgp_unlabelled_pairs"] == sum(label == -1 for label in vgp_data.eval["type_label"])
    for name, count in counts.items():
        assert (f"eval_vgp_type_accuracy/{name}" in metrics) == (count > 0)
    assert metrics["eval_loss"] == pytest.approx(metrics["eval_loss_id"] + metrics["eval_loss_vgp"] + metrics["eval_loss_attention_supervision"], rel=1e-2)


def test_vgp_metrics_by_hand_per_type_and_binary():
    logits = np.eye(5)[[0, 1, 1, 3, 4, 4, 2]]  # predicted: 0 1 1 3 4 4 2
    labels = np.array([0, 1, 2, 3, 3, -100, -100])
    results = vgp_accuracy(logits, labels, TYPES)
    assert results["vgp_accuracy"] == pytest.approx(3 / 5)  # the 5 typed pairs
    assert (results["vgp_labelled_pairs"], results["vgp_unlabelled_pairs"]) == (5, 2)
    assert results["vgp_type_accuracy/Alternation"] == 1.0 and results["vgp_type_accuracy/Entailment1"] == 1.0
    assert results["vgp_type_accuracy/Entailment2"] == 0.0 and results["vgp_type_accuracy/Equivalence"] == 0.5
    assert "vgp_type_accuracy/Independence" not in results and results["vgp_type_count/Independence"] == 0
    prediction = EvalPrediction(
        predictions=(np.eye(3)[[2, 2]], np.array([[0.2, 0.8], [0.9, 0.1]])), label_ids=(np.array([2, 0]), np.array([1, 1]))
    )
    binary = vgp_classification_metrics(prediction, class_names=["not_paraphrase", "paraphrase"], vgp_task="binary")
    assert binary["image_description_accuracy"] == 0.5 and binary["vgp_accuracy"] == 0.5
    assert binary["vgp_class_accuracy/paraphrase"] == 0.5 and binary["vgp_class_count/not_paraphrase"] == 0
    with pytest.raises(ValueError, match="hold no labelled pair"):
        vgp_accuracy(logits[:2], np.array([-100, -100]), TYPES)
    with pytest.raises(ValueError, match=r"`labels` must be in \[0, 4\] or -100"):
        vgp_accuracy(logits[:1], np.array([-1]), TYPES)
