"""Hub helpers: model cards rendered from the templates in `model_cards/`, conversion of published checkpoints."""

from .convert_lxmert import convert_lxmert, rename_lxmert_key, two_stream_config_from_lxmert
from .model_card import MODEL_CARD_FAMILIES, render_model_card

__all__ = ["MODEL_CARD_FAMILIES", "convert_lxmert", "render_model_card", "rename_lxmert_key", "two_stream_config_from_lxmert"]
