from .alignment_decoder import (
    OUTSIDE_TOP_K,
    AlignmentDecoder,
    alignment_kl_loss,
    grounded_word_count,
    top_k_log_softmax,
    top_k_mask,
)
from .config import SUPERVISION_METHODS, validate_supervision_fields
from .direct import direct_supervision_loss, masked_log_softmax, soft_cross_entropy, supervised_row_counts
from .indirect import IndirectGroundingHead, indirect_supervision_loss, max_pool_phrases
from .mixin import AttentionSupervisionMixin
from .perturbation import (
    FUSIONS,
    MASK_INPUTS,
    MOVING_AVERAGES,
    AttentionPerturbation,
    fuse_attention,
    mask_objective,
    perturbed_attention,
)
from .rollout import attention_rollout, cross_modal_rollout, semi_direct_supervision_loss

__all__ = [
    "FUSIONS",
    "MASK_INPUTS",
    "MOVING_AVERAGES",
    "OUTSIDE_TOP_K",
    "AttentionPerturbation",
    "AlignmentDecoder",
    "SUPERVISION_METHODS",
    "AttentionSupervisionMixin",
    "IndirectGroundingHead",
    "alignment_kl_loss",
    "attention_rollout",
    "cross_modal_rollout",
    "direct_supervision_loss",
    "fuse_attention",
    "grounded_word_count",
    "mask_objective",
    "indirect_supervision_loss",
    "masked_log_softmax",
    "perturbed_attention",
    "max_pool_phrases",
    "semi_direct_supervision_loss",
    "soft_cross_entropy",
    "supervised_row_counts",
    "top_k_log_softmax",
    "top_k_mask",
    "validate_supervision_fields",
]
