"""Hub helpers: model cards rendered from the templates in `model_cards/`, conversion of published checkpoints."""

from .convert_lxmert import convert_lxmert, rename_lxmert_key, two_stream_config_from_lxmert
from .convert_visualbert import (
    convert_visualbert,
    convert_visualbert_state_dict,
    rename_visualbert_key,
    single_stream_config_from_visualbert,
)
from .model_card import MODEL_CARD_FAMILIES, render_model_card
from .push import HubPushError, push_folder_to_hub

__all__ = [
    "HubPushError",
    "MODEL_CARD_FAMILIES",
    "convert_lxmert",
    "convert_visualbert",
    "convert_visualbert_state_dict",
    "push_folder_to_hub",
    "render_model_card",
    "rename_lxmert_key",
    "rename_visualbert_key",
    "single_stream_config_from_visualbert",
    "two_stream_config_from_lxmert",
]
