"""Hub helpers: model cards rendered from the templates in `model_cards/`, conversion of published checkpoints, pushing
an output folder (`push_folder_to_hub`)."""

from ..utils.hub_push import HubPushError, push_folder_to_hub
from .convert_lxmert import convert_lxmert, rename_lxmert_key, two_stream_config_from_lxmert
from .convert_visualbert import (
    convert_visualbert,
    convert_visualbert_state_dict,
    rename_visualbert_key,
    single_stream_config_from_visualbert,
)
from .model_card import (
    MODEL_CARD_FAMILIES,
    TASK_CARD_TASKS,
    is_task_metric,
    metrics_from_eval_results,
    render_model_card,
    render_task_model_card,
)
from .remote_code import REMOTE_CODE_FAMILIES, save_with_remote_code

__all__ = [
    "HubPushError",
    "MODEL_CARD_FAMILIES",
    "REMOTE_CODE_FAMILIES",
    "TASK_CARD_TASKS",
    "convert_lxmert",
    "convert_visualbert",
    "convert_visualbert_state_dict",
    "is_task_metric",
    "metrics_from_eval_results",
    "push_folder_to_hub",
    "render_model_card",
    "render_task_model_card",
    "rename_lxmert_key",
    "rename_visualbert_key",
    "save_with_remote_code",
    "single_stream_config_from_visualbert",
    "two_stream_config_from_lxmert",
]
