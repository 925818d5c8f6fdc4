"""Two-stream (LXMERT style) vision-and-language model configuration."""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from ...supervision.alignment_decoder import OUTSIDE_TOP_K
from ...supervision.config import validate_supervision_fields
from ...utils.validation import check_config_numbers, check_token_id
from ..config_fields import (
    ConfigFileMixin, require_at_least, require_choice, require_family_choices, require_heads_divide,
    require_iou_threshold, value_errors
)

LOSS_WEIGHT_FIELDS = (
    "mlm_weight",
    "object_class_weight",
    "object_attr_weight",
    "region_feature_weight",
    "itm_weight",
    "qa_weight",
    "alignment_weight",
    "attention_supervision_weight",
)
# the fields only one model class reads: a saved config.json keeps those of other classes only where they differ from
# the default (see `hf_vlalign.models.config_fields`)
PRETRAINING_FIELDS = (
    "task_mask_lm",
    "task_obj_predict",
    "task_matched",
    "task_qa",
    "task_alignment",
    "visual_obj_loss",
    "visual_attr_loss",
    "visual_feat_loss",
    "num_object_labels",
    "num_attr_labels",
    "num_qa_labels",
    "alignment_top_k",
    "alignment_outside_top_k",
    *(name for name in LOSS_WEIGHT_FIELDS if name != "attention_supervision_weight"),  # every head reads that one
)
HEAD_FIELDS = {
    "TwoStreamModel": (),
    "TwoStreamForPreTraining": PRETRAINING_FIELDS,
    "TwoStreamForQuestionAnswering": ("num_qa_labels",),
    "TwoStreamForVisualReasoning": (),
    "TwoStreamForReferringExpression": ("referring_iou_threshold",),
    "TwoStreamForPhraseGrounding": (),
}


@value_errors
@strict(accept_kwargs=True)
class TwoStreamConfig(ConfigFileMixin, PreTrainedConfig):
    r"""
    Configuration of [`TwoStreamModel`]: a language self-attention stack (`l_layers`), an object self-attention stack
    (`r_layers`) and cross-modality layers (`x_layers`), as in LXMERT and Kervadec et al. 2020 (sec. 3). Field names
    are transformers' `LxmertConfig` names; the text fields are BERT's, so a BERT-family checkpoint initialises the
    word embeddings and the language stack (see [`TwoStreamModel.from_text_pretrained`]).

    Args:
        l_layers / r_layers / x_layers (`int`): language, object and cross-modality layers (paper: 9 / 5 / 5).
        visual_feat_dim (`int`): dimension of `visual_feats`; visual_pos_dim (`int`): of `visual_boxes` (4).
        visual_feature_normalization (`str`): "standardize" (default: `visual_feats` standardised per dimension with
            statistics stored in the weights) or "none"; see `hf_vlalign.models.visual_features`.
        share_cross_attention (`bool`): one cross-attention module serves both directions (LXMERT) or each
            direction has its own.
        attention_supervision (`str`): "none", "direct", "semi_direct" or "indirect", applied to the cross layers.
        supervised_layers / supervised_heads (`list[int]`, *optional*): cross layers / heads supervised (default: all).
        task_mask_lm, task_obj_predict, task_matched, task_qa, task_alignment (`bool`): the pre-training heads of
            [`TwoStreamForPreTraining`] (masked words, masked objects, image-sentence matching, question answering,
            alignment decoder of Kervadec et al. sec. 5).
        visual_obj_loss / visual_attr_loss / visual_feat_loss (`bool`): the parts of masked object prediction.
        num_object_labels / num_attr_labels (`int`): the detector's class and attribute vocabularies.
        num_qa_labels (`int`): the answer vocabulary (pre-training QA head and [`TwoStreamForQuestionAnswering`]).
        referring_iou_threshold (`float`): regions with at least this IoU with the referred box are the positives of
            [`TwoStreamForReferringExpression`]'s loss (0.5, as RefCOCO+'s accuracy).
        alignment_top_k (`int`): objects kept per word by the alignment decoder (eq. 13, paper: 3): the prediction is
            a softmax over each word's k best-scoring objects only.
        alignment_outside_top_k (`str`): what eq. (14)'s KL does with target mass outside the top-k: one of
            `hf_vlalign.supervision.OUTSIDE_TOP_K`, see `hf_vlalign.supervision.alignment_kl_loss`.
        `<name>_weight` (`float`): weight of the loss `loss_<name>` in the total. These task fields are read by one
            model class each (`HEAD_FIELDS`); a saved `config.json` holds those of the other classes only where they
            differ from the default.
        validate_inputs (`bool`): check the values of the input tensors in `forward`, not only their shapes.
        dropout_implementation (`str`): "auto" (a cheaper dropout mask on CPU; see `hf_vlalign.models.dropout`) or
            "torch" (`torch.nn.functional.dropout` everywhere).

    Example:
    ```python
    >>> from hf_vlalign import TwoStreamConfig, TwoStreamModel
    >>> config = TwoStreamConfig(hidden_size=384, num_attention_heads=12, l_layers=2, r_layers=1, x_layers=2)
    >>> model = TwoStreamModel(config)
    ```"""

    model_type = "vlalign_two_stream"
    _head_fields = HEAD_FIELDS
    # the cross-modality layers answer `num_hidden_layers`: attention supervision and the grounding probe read them
    attribute_map = {"num_hidden_layers": "x_layers"}

    vocab_size: int = 30522
    hidden_size: int = 768
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    l_layers: int = 9
    r_layers: int = 5
    x_layers: int = 5
    visual_feat_dim: int = 2048
    visual_pos_dim: int = 4
    visual_feature_normalization: str = "standardize"
    share_cross_attention: bool = True
    attention_supervision: str = "none"
    supervised_layers: list[int] | None = None
    supervised_heads: list[int] | None = None
    attention_supervision_weight: float | int = 1.0
    task_mask_lm: bool = True
    task_obj_predict: bool = True
    task_matched: bool = True
    task_qa: bool = True
    task_alignment: bool = False
    visual_obj_loss: bool = True
    visual_attr_loss: bool = True
    visual_feat_loss: bool = True
    num_object_labels: int = 1600
    num_attr_labels: int = 400
    num_qa_labels: int = 9500
    alignment_top_k: int = 3
    alignment_outside_top_k: str = "renormalise_target"
    mlm_weight: float | int = 1.0
    object_class_weight: float | int = 1.0
    object_attr_weight: float | int = 1.0
    region_feature_weight: float | int = 1.0
    itm_weight: float | int = 1.0
    qa_weight: float | int = 1.0
    alignment_weight: float | int = 1.0
    referring_iou_threshold: float | int = 0.5
    classifier_dropout: float | int | None = None
    validate_inputs: bool = True
    dropout_implementation: str = "auto"
    tie_word_embeddings: bool = True

    def validate_fields(self) -> None:
        """Class validator (`@strict`): sizes and settings the modules cannot use are refused."""
        check_config_numbers(
            self,
            positive=(
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "max_position_embeddings",
                "type_vocab_size",
                "layer_norm_eps",
            ),
            non_negative=("initializer_range", *LOSS_WEIGHT_FIELDS),
            dropouts=("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"),
            activations=("hidden_act",),
        )
        check_token_id("pad_token_id", self.pad_token_id, self.vocab_size)
        require_heads_divide(self, "hidden_size", "num_attention_heads")
        require_at_least(self, 0, "l_layers", "r_layers")
        require_at_least(self, 1, "x_layers", "visual_feat_dim", "visual_pos_dim", "num_object_labels", "num_attr_labels")
        if self.num_qa_labels < 1:
            raise ValueError(
                f"`num_qa_labels` (the answer vocabulary) must be >= 1, got an empty vocabulary ({self.num_qa_labels})."
            )
        require_iou_threshold(self)
        require_at_least(self, 1, "alignment_top_k")
        require_choice(self, "alignment_outside_top_k", OUTSIDE_TOP_K)
        validate_supervision_fields(self, self.x_layers, self.num_attention_heads)
        require_family_choices(self)


__all__ = ["TwoStreamConfig"]
