"""Downstream heads of both families (question answering, visual reasoning, referring expressions, phrase grounding)
and single-stream pre-training: losses against hand computations, masking of padding, exact save/load through their
Auto classes, encoder reuse across heads, LoRA on the new heads and clear errors for bad labels."""

from __future__ import annotations

import pytest
import torch
from peft import get_peft_model
from test_single_stream import tiny_config as single_stream_config
from test_two_stream import tiny_config as two_stream_config
from transformers import AutoModel, AutoModelForPreTraining, AutoModelForVisualQuestionAnswering

import hf_vlalign
from hf_vlalign import (
    AutoModelForPhraseGrounding,
    AutoModelForReferringExpression,
    AutoModelForVisualReasoning,
    SingleStreamForPreTraining,
    SingleStreamForQuestionAnswering,
)
from hf_vlalign.lora import lora_config
from hf_vlalign.models.task_heads import mean_pool_phrases, phrase_grounding_loss, referring_expression_loss

B, T, R, DV, ANSWERS = 3, 8, 5, 12, 7
FAMILIES = ("SingleStream", "TwoStream")
TASKS = {
    "ForQuestionAnswering": AutoModelForVisualQuestionAnswering,
    "ForVisualReasoning": AutoModelForVisualReasoning,
    "ForReferringExpression": AutoModelForReferringExpression,
    "ForPhraseGrounding": AutoModelForPhraseGrounding,
}


def config(family: str, **overrides):
    settings = {"num_qa_labels": ANSWERS, "visual_feat_dim": DV, **overrides}
    return single_stream_config(**settings) if family == "SingleStream" else two_stream_config(**settings)


def model_of(family: str, task: str, **overrides):
    torch.manual_seed(0)
    return getattr(hf_vlalign, family + task)(config(family, **overrides))


def regions(seed: int = 0, pair: bool = False) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (B, 2, R) if pair else (B, R)
    corners = torch.rand(*shape, 2, generator=generator) * 0.5
    mask = torch.ones(shape, dtype=torch.long)
    mask[(2, 1, -1) if pair else (2, -1)] = 0
    return {
        "visual_feats": torch.randn(*shape, DV, generator=generator),
        "visual_boxes": torch.cat([corners, corners + 0.3], dim=-1),
        "visual_attention_mask": mask,
    }


def text(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, -2:] = 0
    return {"input_ids": torch.randint(1, 120, (B, T), generator=generator), "attention_mask": attention_mask}


def grounding() -> dict[str, torch.Tensor]:
    """Two phrases in rows 0 and 1, one in row 2 (the second is padding), with their targets and alignment."""
    phrase_masks = torch.zeros(B, 2, T, dtype=torch.bool)
    phrase_masks[:, 0, 1:3] = True
    phrase_masks[:2, 1, 4] = True
    phrase_labels = torch.zeros(B, 2, R)
    phrase_labels[:, 0, 0] = 1.0
    phrase_labels[:2, 1, 2:4] = 0.5
    alignment = torch.zeros(B, T, R)
    for i in range(B):
        for p in range(2):
            alignment[i, phrase_masks[i, p]] = phrase_labels[i, p]
    return {"phrase_masks": phrase_masks, "phrase_labels": phrase_labels, "word_region_alignment": alignment}


def task_batch(task: str) -> dict[str, torch.Tensor]:
    if task == "ForQuestionAnswering":
        return {**text(), **regions(), "word_region_alignment": grounding()["word_region_alignment"],
                "labels": torch.tensor([1, 6, -100])}  # fmt: skip
    if task == "ForVisualReasoning":
        return {**text(), **regions(pair=True), "labels": torch.tensor([0, 1, 1])}
    if task == "ForReferringExpression":
        iou = torch.tensor([[0.9, 0.1, 0.5, 0.0, 0.2], [0.0, 0.3, 0.2, 0.7, 0.1], [0.1, 0.6, 0.0, 0.0, 0.0]])
        alignment = torch.zeros(B, T, R)
        alignment[torch.arange(B), 1, iou.argmax(-1)] = 1.0  # the expression's first word on the referred region
        return {**text(), **regions(), "labels": iou.argmax(-1), "target_region_iou": iou,
                "word_region_alignment": alignment}  # fmt: skip
    return {**text(), **regions(), **grounding()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("task", list(TASKS))
def test_every_head_trains_and_reloads_exactly_through_its_auto_class(family, task, tmp_path):
    model = model_of(family, task, attention_supervision="direct")
    batch = task_batch(task)
    output = model(**batch)
    assert torch.isfinite(output.loss) and torch.isfinite(output.loss_task)
    if task != "ForVisualReasoning":  # the pair head has no alignment to supervise
        assert output.loss_attention_supervision is not None
        assert torch.allclose(output.loss, output.loss_task + output.loss_attention_supervision)
    output.loss.backward()
    head = {"ForQuestionAnswering": "answer_head", "ForVisualReasoning": "reasoning_head",
            "ForReferringExpression": "region_head", "ForPhraseGrounding": "grounding_head"}[task]  # fmt: skip
    assert all(p.grad is not None for p in getattr(model, head).parameters())
    assert model.base_model.embeddings.word_embeddings.weight.grad.abs().sum() > 0

    model.save_pretrained(tmp_path)
    reloaded = TASKS[task].from_pretrained(tmp_path)
    assert type(reloaded) is type(model)
    model.eval(), reloaded.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, reloaded(**batch).logits)
    assert type(AutoModel.from_pretrained(tmp_path)).__name__ == f"{family}Model"  # the bare encoder, head left out


@pytest.mark.parametrize("family", FAMILIES)
def test_question_answering_takes_gqa_ids_and_vqa_soft_scores(family):
    model = model_of(family, "ForQuestionAnswering").eval()
    batch = {**text(), **regions()}
    with torch.no_grad():
        logits = model(**batch).logits
        ids = torch.tensor([1, 6, -100])
        assert torch.allclose(model(**batch, labels=ids).loss, torch.nn.functional.cross_entropy(logits[:2], ids[:2]))
        scores = torch.zeros(B, ANSWERS)
        scores[0, 1], scores[1, [2, 3]] = 1.0, 0.3
        expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, scores, reduction="sum") / B
        assert torch.allclose(model(**batch, labels=scores).loss, expected, atol=1e-6)
    with pytest.raises(ValueError, match="labels"):
        model(**batch, labels=torch.tensor([0, ANSWERS, 1]))
    with pytest.raises(ValueError, match=r"soft `labels`"):
        model(**batch, labels=torch.full((B, ANSWERS), 2.0))


@pytest.mark.parametrize("family", FAMILIES)
def test_visual_reasoning_encodes_the_sentence_with_each_image(family):
    model = model_of(family, "ForVisualReasoning").eval()
    batch = {**text(), **regions(pair=True)}
    with torch.no_grad():
        logits = model(**batch).logits
        pooled = []
        for image in range(2):
            single = {k: v[:, image] for k, v in regions(pair=True).items()}
            out = model.base_model(**text(), **single)
            pooled.append(out.pooler_output)
        assert torch.allclose(logits, model.reasoning_head(torch.cat(pooled, dim=-1)).squeeze(-1), atol=1e-5)
    with pytest.raises(ValueError, match=r"\(batch, 2, R, visual_feat_dim\)"):
        model(**text(), **regions())


def test_referring_expression_loss_is_binary_cross_entropy_over_real_regions():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 1.0, 3.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    iou = torch.tensor([[0.8, 0.2, 0.5], [0.1, 0.6, 0.0]])
    # positives at IoU >= 0.5: (0, 0), (0, 2), (1, 1); region (1, 2) is padding and left out
    terms = [
        -torch.log(torch.sigmoid(torch.tensor(2.0))),
        -torch.log(1 - torch.sigmoid(torch.tensor(-1.0))),
        -torch.log(torch.sigmoid(torch.tensor(0.5))),
        -torch.log(1 - torch.sigmoid(torch.tensor(0.0))),
        -torch.log(torch.sigmoid(torch.tensor(1.0))),
    ]
    expected = torch.stack(terms).mean()
    assert torch.allclose(referring_expression_loss(logits, mask, iou, None, 0.5), expected)
    one_hot = referring_expression_loss(logits, mask, None, torch.tensor([0, 1]), 0.5)
    assert torch.allclose(one_hot, torch.stack([terms[0], terms[1], -torch.log(1 - torch.sigmoid(torch.tensor(0.5))), terms[3], terms[4]]).mean())


@pytest.mark.parametrize("family", FAMILIES)
def test_referring_expression_scores_padding_regions_out(family):
    model = model_of(family, "ForReferringExpression").eval()
    batch = task_batch("ForReferringExpression")
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits[2, -1] == torch.finfo(logits.dtype).min
    assert int(logits.argmax(-1)[2]) != R - 1
    with pytest.raises(ValueError, match="target_region_iou"):
        model(**{**batch, "target_region_iou": torch.full((B, R), 1.5)})
    with pytest.raises(ValueError, match="labels"):
        model(**{**batch, "labels": torch.tensor([0, R, 1])})


def test_phrase_grounding_loss_is_kl_to_the_gold_distribution_over_grounded_phrases():
    logits = torch.tensor([[[1.0, 0.0, -1.0], [0.0, 0.0, 0.0]], [[2.0, 1.0, 0.0], [5.0, 5.0, 5.0]]])
    labels = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]], [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]])
    log_p = torch.log_softmax(logits, dim=-1)
    kl_first = -log_p[0, 0, 0]
    kl_second = 0.5 * (torch.log(torch.tensor(0.5)) - log_p[0, 1, 1]) + 0.5 * (torch.log(torch.tensor(0.5)) - log_p[0, 1, 2])
    kl_third = -log_p[1, 0, 2]
    expected = (kl_first + kl_second + kl_third) / 3  # the padding phrase (all-zero target) is not counted
    assert torch.allclose(phrase_grounding_loss(logits, labels), expected)
    no_target = phrase_grounding_loss(logits.requires_grad_(), torch.zeros_like(labels))
    assert no_target == 0 and no_target.requires_grad  # no grounded phrase: a zero in the graph


def test_mean_pool_phrases():
    states = torch.arange(12.0).reshape(1, 4, 3)
    masks = torch.tensor([[[True, True, False, False], [False, False, False, False]]])
    pooled = mean_pool_phrases(states, masks)
    assert torch.equal(pooled[0, 0], states[0, :2].mean(0)) and torch.equal(pooled[0, 1], torch.zeros(3))


@pytest.mark.parametrize("family", FAMILIES)
def test_phrase_grounding_checks_its_targets(family):
    model = model_of(family, "ForPhraseGrounding")
    batch = task_batch("ForPhraseGrounding")
    logits = model(**batch).logits
    assert logits.shape == (B, 2, R) and bool((logits[2, :, -1] == torch.finfo(logits.dtype).min).all())
    with pytest.raises(ValueError, match="phrase_masks"):
        model(**{k: v for k, v in batch.items() if k != "phrase_masks"})
    bad = batch["phrase_labels"].clone()
    bad[0, 0, 1] = 0.5  # the row sums to 1.5
    with pytest.raises(ValueError, match="sum to 1"):
        model(**{**batch, "phrase_labels": bad})
    orphan = batch["phrase_labels"].clone()
    orphan[2, 1, 0] = 1.0  # a target for the padding phrase
    with pytest.raises(ValueError, match="no token"):
        model(**{**batch, "phrase_labels": orphan})


def pretraining_batch() -> dict[str, torch.Tensor]:
    batch = {**text(), **regions()}
    labels = torch.full((B, T), -100)
    labels[:, 2] = batch["input_ids"][:, 2]
    labels[0, 5] = batch["input_ids"][0, 5]
    masked = torch.zeros(B, R, dtype=torch.long)
    masked[:, 1] = 1
    return {
        **batch,
        "labels": labels,
        "sentence_image_labels": torch.tensor([0, 1, 0]),
        "masked_regions": masked,
        "feature_labels": batch["visual_feats"].clone(),
        "object_labels": torch.where(masked.bool(), 3, -100),
    }


def test_single_stream_pretraining_losses_match_their_definitions(tmp_path):
    torch.manual_seed(0)
    model = SingleStreamForPreTraining(single_stream_config(visual_feat_dim=DV, num_object_labels=4))
    assert model.cls.predictions.decoder.weight is model.single_stream.embeddings.word_embeddings.weight
    batch = pretraining_batch()
    train_loss = model(**batch).loss_mlm  # training: only the masked positions are projected
    model.eval()
    with torch.no_grad():
        output = model(**batch)
        assert output.prediction_logits.shape == (B, T, 120)
        masked = batch["labels"] != -100
        expected_mlm = torch.nn.functional.cross_entropy(output.prediction_logits[masked], batch["labels"][masked])
        assert torch.allclose(output.loss_mlm, expected_mlm)
        expected_sip = torch.nn.functional.cross_entropy(output.seq_relationship_logits, batch["sentence_image_labels"])
        assert torch.allclose(output.loss_sentence_image, expected_sip)
        parts = output.loss_mlm + output.loss_sentence_image + output.loss_region_feature + output.loss_region_class
        assert torch.allclose(output.loss, parts)
    assert torch.isfinite(train_loss)

    model.save_pretrained(tmp_path)
    reloaded = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert reloaded.cls.predictions.decoder.weight is reloaded.single_stream.embeddings.word_embeddings.weight
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).prediction_logits, output.prediction_logits)
    # the pre-trained encoder starts a downstream head: every encoder tensor carried over
    downstream = SingleStreamForQuestionAnswering.from_pretrained(tmp_path, num_qa_labels=ANSWERS)
    for name, tensor in model.single_stream.state_dict().items():
        assert torch.equal(downstream.single_stream.state_dict()[name], tensor), name


def test_single_stream_pretraining_rejects_bad_labels():
    model = SingleStreamForPreTraining(single_stream_config(visual_feat_dim=DV))
    batch = pretraining_batch()
    with pytest.raises(ValueError, match="num_object_labels"):
        model(**batch)
    without_classes = {k: v for k, v in batch.items() if k != "object_labels"}
    with pytest.raises(ValueError, match="sentence_image_labels"):
        model(**{**without_classes, "sentence_image_labels": torch.tensor([0, 2, 1])})
    with pytest.raises(ValueError, match="masked_regions"):
        model(**{k: v for k, v in without_classes.items() if k != "feature_labels"})
    assert torch.isfinite(model(**without_classes).loss)


@pytest.mark.parametrize("task", list(TASKS))
def test_lora_trains_the_new_heads_in_full(task):
    model = model_of("SingleStream", task, attention_supervision="direct")
    config = lora_config(model, r=4)
    head = {"ForQuestionAnswering": "answer_head", "ForVisualReasoning": "reasoning_head",
            "ForReferringExpression": "region_head", "ForPhraseGrounding": "grounding_head"}[task]  # fmt: skip
    assert config.modules_to_save == [head]
    peft_model = get_peft_model(model, config)
    trainable = [name for name, p in peft_model.named_parameters() if p.requires_grad]
    assert any("lora_A" in name for name in trainable)
    assert any(f"{head}.modules_to_save" in name for name in trainable)
    assert not any(f"{head}." in name and "lora_" in name for name in trainable)  # the head gets no LoRA matrices
    peft_model(**task_batch(task)).loss.backward()
