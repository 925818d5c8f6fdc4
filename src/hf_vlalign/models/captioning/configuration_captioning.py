"""Region captioner (geometry-aware encoder-decoder over detected objects) configuration."""

import re

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from ...utils.validation import check_config_numbers, check_index_list, check_token_id
from ..config_fields import (
    ConfigFileMixin, require_at_least, require_choice, require_family_choices, require_heads_divide, value_errors
)

ALIGNMENT_FUSIONS = ("none", "max", "moving_average", "exp_decay", "gate")
# A2's readings (`hf_vlalign.supervision.perturbation`): the mask network's input (eq. 2) and the moving average (eq. 7)
ALIGNMENT_MASK_INPUTS = ("query", "query_and_regions")
ALIGNMENT_MOVING_AVERAGES = ("additive", "convex")
# unknown fields named like the encoder families' attention supervision: the captioner has none (its cross-attention is
# aligned by `attention_alignment`), so such a field would be stored and silently ignored
SUPERVISION_LIKE_FIELD = re.compile(r"supervis|att(ention|n)_(loss|target|label)")


def check_no_supervision_fields(kwargs: dict) -> None:
    """Refuses unknown config fields that look like attention supervision (a silently ignored setting)."""
    names = sorted(name for name in kwargs if SUPERVISION_LIKE_FIELD.search(name))
    if names:
        raise ValueError(
            f"`RegionCaptionerConfig` has no attention supervision, got the unknown field(s) {names}; align the "
            f"cross-attention with `attention_alignment` ({ALIGNMENT_FUSIONS}) and `mask_weight` instead."
        )


@value_errors
@strict(accept_kwargs=True)
class RegionCaptionerConfig(ConfigFileMixin, PreTrainedConfig):
    r"""
    Configuration of [`RegionCaptionerModel`]: a transformer encoder over detected regions whose self-attention is
    geometry-aware (Ilinykh; Herdade et al.'s Object Relation Transformer) and a caption decoder whose cross-attention
    can be aligned by learnable mask perturbation (Fei, A2). Field names are BART's.

    Args:
        d_model (`int`): hidden size of encoder and decoder (a BERT-family checkpoint's hidden size when its word
            embeddings are copied, see [`RegionCaptionerForConditionalGeneration.from_text_pretrained`]).
        encoder_layers / decoder_layers (`int`): N (paper: 6); encoder/decoder_attention_heads: h (paper: 8).
        visual_feat_dim (`int`): dimension of `visual_feats`.
        visual_feature_normalization (`str`): "standardize" (default: `visual_feats` standardised per dimension with
            statistics stored in the weights) or "none"; see `hf_vlalign.models.visual_features`.
        use_geometry (`bool`): geometry-aware encoder attention; False is the ablation (plain self-attention).
        geometry_dim (`int`): size of the sinusoidal embedding of the 4 relative-geometry values (multiple of 8).
        geometry_floor (`float`): floor applied to |dx| / w and |dy| / h before the log (1e-3, as the Object Relation
            Transformer's code), so that boxes with identical centres stay finite.
        max_regions (`int`): the most regions an image may have (default 1024, far above a detector's 10-100); more
            are refused before the encoder builds its (batch, R, R, geometry_dim) relative geometry.
        attention_alignment (`str`): "none" or the A2 fusion of the aligned cross-attention: "max", "moving_average",
            "exp_decay" or "gate".
        aligned_layers (`list[int]`, *optional*): decoder layers whose cross-attention is aligned (default: all).
        alignment_eta (`float`): eta of the moving average (eq. 7): >= 0 for "additive", in [0, 1] for "convex".
        alignment_temperature (`float`): T_P of the exponential decay (eq. 8), in training steps. 1000 is the library's
            value: the paper's text (to its section 4.3) and the meshed-memory transformer's code give none, and the
            A2 authors' code was not found.
        alignment_moving_average (`str`): the form of eq. 7: "additive" (default, the printed a + eta a_m, then
            re-normalised over the regions) or "convex" ((1 - eta) a + eta a_m, eta the aligned attention's share).
        alignment_mask_input (`str`): the mask network of eq. 2: "query" (default, the printed
            m_t = sigmoid(W_m h_t + b_m), one value per head and region slot) or "query_and_regions"
            (sigmoid(W_m h_t + U_m v_j + b_m), a region-content term that scores each region by what it shows).
        alignment_mask_regions (`int`): N, the region slots the "query" mask network scores (W_m: d_model -> heads * N);
            an image may have at most N regions (100 covers the bottom-up-attention features' 10-100 regions).
        mask_weight (`float`): lambda of the mask objective (eq. 4).
        normalize_before (`bool`): pre-norm layers (LayerNorm before each sub-layer, a final LayerNorm after the stack)
            instead of the original transformer's post-norm.
        validate_inputs (`bool`): check the values of the input tensors in `forward`, not only their shapes.
        dropout_implementation (`str`): "auto" (a cheaper dropout mask on CPU; see `hf_vlalign.models.dropout`) or
            "torch" (`torch.nn.functional.dropout` everywhere).
    """

    model_type = "vlalign_captioner"
    # the decoder's sizes answer the generic names (the cache and the grounding probe read them)
    attribute_map = {
        "num_hidden_layers": "decoder_layers",
        "num_attention_heads": "decoder_attention_heads",
        "hidden_size": "d_model",
    }

    vocab_size: int = 30522
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "relu"
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.1
    max_position_embeddings: int = 64
    init_std: float = 0.02
    layer_norm_eps: float = 1e-5
    normalize_before: bool = False
    visual_feat_dim: int = 2048
    visual_feature_normalization: str = "standardize"
    use_geometry: bool = True
    geometry_dim: int = 64
    geometry_floor: float = 1e-3
    max_regions: int = 1024
    attention_alignment: str = "none"
    aligned_layers: list[int] | None = None
    alignment_eta: float | int = 0.5
    alignment_temperature: float | int = 1000.0
    alignment_moving_average: str = "additive"
    alignment_mask_input: str = "query"
    alignment_mask_regions: int = 100
    mask_weight: float | int = 0.1
    pad_token_id: int | None = 0
    bos_token_id: int | None = 101
    eos_token_id: int | None = 102
    decoder_start_token_id: int | None = 101
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = True
    validate_inputs: bool = True
    dropout_implementation: str = "auto"

    def __post_init__(self, **kwargs):
        check_no_supervision_fields(kwargs)
        super().__post_init__(**kwargs)

    def validate_fields(self) -> None:
        """Class validator (`@strict`): sizes and settings the modules cannot use are refused."""
        check_config_numbers(
            self,
            positive=("vocab_size", "d_model", "max_regions", "encoder_ffn_dim", "decoder_ffn_dim", "layer_norm_eps"),
            non_negative=("init_std", "mask_weight"),
            dropouts=("dropout", "attention_dropout"),
            activations=("activation_function",),
        )
        check_token_id("pad_token_id", self.pad_token_id, self.vocab_size)
        require_heads_divide(self, "d_model", "encoder_attention_heads", "decoder_attention_heads")
        require_at_least(self, 1, "encoder_layers", "decoder_layers", "visual_feat_dim", "max_position_embeddings")
        if self.geometry_dim < 8 or self.geometry_dim % 8 != 0:
            raise ValueError(f"`geometry_dim` must be a positive multiple of 8, got {self.geometry_dim}.")
        if not 0 < self.geometry_floor < 1:
            raise ValueError(f"`geometry_floor` must be in (0, 1), got {self.geometry_floor}.")
        require_choice(self, "attention_alignment", ALIGNMENT_FUSIONS)
        check_index_list("aligned_layers", self.aligned_layers, self.decoder_layers, "decoder layer")
        require_choice(self, "alignment_moving_average", ALIGNMENT_MOVING_AVERAGES)
        if self.alignment_moving_average == "convex" and not 0 <= self.alignment_eta <= 1:
            raise ValueError(f"`alignment_eta` must be in [0, 1] for the convex moving average, got {self.alignment_eta}.")
        if not 0 <= self.alignment_eta < float("inf"):
            raise ValueError(f"`alignment_eta` must be a finite number >= 0, got {self.alignment_eta}.")
        require_choice(self, "alignment_mask_input", ALIGNMENT_MASK_INPUTS)
        require_at_least(self, 1, "alignment_mask_regions")
        if not self.alignment_temperature > 0:
            raise ValueError(f"`alignment_temperature` must be > 0, got {self.alignment_temperature}.")
        require_family_choices(self)


__all__ = ["ALIGNMENT_FUSIONS", "ALIGNMENT_MASK_INPUTS", "ALIGNMENT_MOVING_AVERAGES", "RegionCaptionerConfig"]
