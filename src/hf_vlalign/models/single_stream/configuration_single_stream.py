"""Single-stream (VL-BERT / VisualBERT style) vision-and-language model configuration."""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from ...supervision.config import validate_supervision_fields
from ...utils.validation import check_config_numbers, check_token_id
from ..config_fields import (
    ConfigFileMixin, require_at_least, require_choice, require_family_choices, require_heads_divide,
    require_iou_threshold, value_errors
)

LOSS_WEIGHT_FIELDS = (
    "id_weight",
    "vgp_weight",
    "mlm_weight",
    "sentence_image_weight",
    "region_feature_weight",
    "region_class_weight",
)
# the VGP tasks of `SingleStreamConfig.vgp_task`
VGP_TASKS = ("type", "binary")
# the semantic types of a visually grounded paraphrase (Chu et al., CVIU 2022), in the order of the published
# `type_label` column: the 5-way phrase-pair classifier of Samaran et al.'s code (jules-samaran/VL-BERT, `phrasal_cls`)
VGP_TYPE_NAMES = ("Alternation", "Entailment1", "Entailment2", "Equivalence", "Independence")
# the classes of `vgp_task="binary"`
VGP_BINARY_NAMES = ("not_paraphrase", "paraphrase")

# the fields only one model class reads: a saved config.json keeps those of other classes only where they differ from
# the default (see `hf_vlalign.models.config_fields`)
HEAD_FIELDS = {
    "SingleStreamModel": (),
    "SingleStreamForVisualParaphrase": (
        "num_id_labels",
        "vgp_task",
        "num_vgp_labels",
        "vgp_label_names",
        "id_weight",
        "vgp_weight",
    ),
    "SingleStreamForQuestionAnswering": ("num_qa_labels",),
    "SingleStreamForVisualReasoning": (),
    "SingleStreamForReferringExpression": ("referring_iou_threshold",),
    "SingleStreamForPhraseGrounding": (),
    "SingleStreamForPreTraining": (
        "num_object_labels",
        "mlm_weight",
        "sentence_image_weight",
        "region_feature_weight",
        "region_class_weight",
    ),
}


@value_errors
@strict(accept_kwargs=True)
class SingleStreamConfig(ConfigFileMixin, PreTrainedConfig):
    r"""
    Configuration of [`SingleStreamModel`]: a BERT encoder over `[CLS] c1 [SEP] c2 [SEP] regions [END]` (Samaran et al.
    2021, sec. 3). The text fields are BERT's, so a BERT-family checkpoint initialises the text side
    (see [`SingleStreamModel.from_text_pretrained`]).

    Args:
        visual_feat_dim (`int`): dimension of `visual_feats` (2048 for bottom-up-attention features).
        use_box_embeddings (`bool`): add the projected box geometry (x1, y1, x2, y2, area) to each region embedding;
            when False there is no `box_projection` and `visual_boxes` is optional in `forward` (VisualBERT's
            embeddings, see [`hf_vlalign.hub.convert_visualbert`]).
        use_end_token (`bool`): append the learned [END] token after the regions; when False the sequence is
            `[text] [regions]` (VisualBERT's layout).
        visual_feature_normalization (`str`): "standardize" (default: `visual_feats` standardised per dimension with
            statistics stored in the weights) or "none"; see `hf_vlalign.models.visual_features`.
        attention_supervision (`str`): "none", "direct", "semi_direct" or "indirect".
        supervised_layers (`list[int]`, *optional*): layers whose attention is supervised (default: all).
        supervised_heads (`list[int]`, *optional*): heads supervised in each of those layers (default: all).
        attention_supervision_weight (`float`): weight of the attention loss in the total loss (eq. 9).
        num_id_labels (`int`): classes of image-description identification (c1 only, c2 only, both; eq. 1). The
            task fields below are read by one model class each; a saved `config.json` holds those of the other
            classes only where they differ from the default (`HEAD_FIELDS`).
        vgp_task (`str`): what the VGP phrase-pair classifier (eq. 4) predicts: "type" (the paper's), the semantic type
            of the pair (`VGP_TYPE_NAMES`, Chu et al. 2022; pairs that are not VGPs have none and are left out of the
            loss), or "binary", paraphrase or not (the identification task of Otani et al. 2020).
        num_vgp_labels (`int`): classes of the VGP phrase-pair classifier (eq. 4): 5 types, or 2 for "binary".
        vgp_label_names (`list[str]`, *optional*): the name of each VGP class, in label order (default:
            `vgp_class_names`).
        id_weight / vgp_weight (`float`): weights of those losses in eq. 9.
        num_qa_labels (`int`): the answer vocabulary of [`SingleStreamForQuestionAnswering`] (3129: VQA v2's usual
            answers seen at least 9 times).
        referring_iou_threshold (`float`): regions with at least this IoU with the referred box are the positives of
            [`SingleStreamForReferringExpression`]'s loss.
        num_object_labels (`int`): detector classes predicted for masked regions by [`SingleStreamForPreTraining`]
            (0: masked regions only regress their features).
        mlm_weight / sentence_image_weight / region_feature_weight / region_class_weight (`float`): weights of the
            pre-training losses.
        validate_inputs (`bool`): check the values of the input tensors in `forward`, not only their shapes.
        dropout_implementation (`str`): "auto" (a cheaper dropout mask on CPU; see `hf_vlalign.models.dropout`) or
            "torch" (`torch.nn.functional.dropout` everywhere).

    Example:
    ```python
    >>> from hf_vlalign import SingleStreamConfig, SingleStreamModel
    >>> config = SingleStreamConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, attention_supervision="direct")
    >>> model = SingleStreamModel(config)
    ```"""

    model_type = "vlalign_single_stream"
    _head_fields = HEAD_FIELDS

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
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
    classifier_dropout: float | int | None = None
    visual_feat_dim: int = 2048
    use_box_embeddings: bool = True
    use_end_token: bool = True
    visual_feature_normalization: str = "standardize"
    attention_supervision: str = "none"
    supervised_layers: list[int] | None = None
    supervised_heads: list[int] | None = None
    attention_supervision_weight: float | int = 1.0
    num_id_labels: int = 3
    vgp_task: str = "type"
    num_vgp_labels: int = 5
    vgp_label_names: list[str] | None = None
    id_weight: float | int = 1.0
    vgp_weight: float | int = 1.0
    num_qa_labels: int = 3129
    referring_iou_threshold: float | int = 0.5
    num_object_labels: int = 0
    mlm_weight: float | int = 1.0
    sentence_image_weight: float | int = 1.0
    region_feature_weight: float | int = 1.0
    region_class_weight: float | int = 1.0
    tie_word_embeddings: bool = True
    validate_inputs: bool = True
    dropout_implementation: str = "auto"

    def validate_fields(self) -> None:
        """Class validator (`@strict`): sizes and supervision settings the modules cannot use are refused."""
        check_config_numbers(
            self,
            positive=(
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "intermediate_size",
                "max_position_embeddings",
                "type_vocab_size",
                "layer_norm_eps",
                "num_id_labels",
                "num_vgp_labels",
            ),
            non_negative=("initializer_range", "attention_supervision_weight", *LOSS_WEIGHT_FIELDS),
            dropouts=("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"),
            activations=("hidden_act",),
        )
        check_token_id("pad_token_id", self.pad_token_id, self.vocab_size)
        require_heads_divide(self, "hidden_size", "num_attention_heads")
        require_at_least(self, 1, "visual_feat_dim", "num_qa_labels")
        require_at_least(self, 0, "num_object_labels")
        require_iou_threshold(self)
        require_choice(self, "vgp_task", VGP_TASKS)
        if self.vgp_task == "binary" and self.num_vgp_labels != 2:
            raise ValueError(
                f"`num_vgp_labels` must be 2 (not a paraphrase, paraphrase) for vgp_task='binary', got "
                f"{self.num_vgp_labels}."
            )
        names = self.vgp_label_names
        if names is not None and (not all(names) or len(names) != self.num_vgp_labels or len(set(names)) != len(names)):
            raise ValueError(
                f"`vgp_label_names` must be None or a list of {self.num_vgp_labels} (`num_vgp_labels`) different "
                f"non-empty names, got {names!r}."
            )
        validate_supervision_fields(self, self.num_hidden_layers, self.num_attention_heads)
        require_family_choices(self)

    def vgp_class_names(self) -> list[str]:
        """The name of each VGP class in label order: `vgp_label_names`, or the default of `vgp_task`."""
        if self.vgp_label_names is not None:
            return list(self.vgp_label_names)
        if self.vgp_task == "binary":
            return list(VGP_BINARY_NAMES)
        if self.num_vgp_labels == len(VGP_TYPE_NAMES):
            return list(VGP_TYPE_NAMES)
        return [f"type_{label}" for label in range(self.num_vgp_labels)]


__all__ = ["VGP_BINARY_NAMES", "VGP_TASKS", "VGP_TYPE_NAMES", "SingleStreamConfig"]
