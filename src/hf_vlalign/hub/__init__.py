"""Hub helpers: model cards rendered from the templates in `model_cards/`."""

from .model_card import MODEL_CARD_FAMILIES, render_model_card

__all__ = ["MODEL_CARD_FAMILIES", "render_model_card"]
