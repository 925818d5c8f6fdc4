"""Validation of the supervision fields shared by every model family's configuration."""

from ..utils.validation import check_index_list

SUPERVISION_METHODS = ("none", "direct", "semi_direct", "indirect")


def validate_supervision_fields(config, num_layers: int, num_heads: int) -> None:
    """Checks `attention_supervision`, `supervised_layers`, `supervised_heads` and `attention_supervision_weight`."""
    if config.attention_supervision not in SUPERVISION_METHODS:
        raise ValueError(
            f"`attention_supervision` must be one of {SUPERVISION_METHODS}, got {config.attention_supervision!r}."
        )
    check_index_list("supervised_layers", config.supervised_layers, num_layers, "layer")
    check_index_list("supervised_heads", config.supervised_heads, num_heads, "head")
    if not config.attention_supervision_weight >= 0:
        raise ValueError(
            f"`attention_supervision_weight` must be >= 0, got {config.attention_supervision_weight}."
        )
