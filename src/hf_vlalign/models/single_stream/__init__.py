from .configuration_single_stream import SingleStreamConfig
from .modeling_single_stream import (
    SingleStreamForVisualParaphrase,
    SingleStreamModel,
    SingleStreamModelOutput,
    SingleStreamPreTrainedModel,
    VisualParaphraseOutput,
    default_text_model_path,
)

__all__ = [
    "SingleStreamConfig",
    "SingleStreamForVisualParaphrase",
    "SingleStreamModel",
    "SingleStreamModelOutput",
    "SingleStreamPreTrainedModel",
    "VisualParaphraseOutput",
    "default_text_model_path",
]
