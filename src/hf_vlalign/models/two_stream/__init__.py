from .configuration_two_stream import TwoStreamConfig
from .modeling_two_stream import (
    TwoStreamClassificationOutput,
    TwoStreamForPreTraining,
    TwoStreamForPreTrainingOutput,
    TwoStreamForQuestionAnswering,
    TwoStreamForVisualReasoning,
    TwoStreamModel,
    TwoStreamModelOutput,
    TwoStreamPreTrainedModel,
)

__all__ = [
    "TwoStreamClassificationOutput",
    "TwoStreamConfig",
    "TwoStreamForPreTraining",
    "TwoStreamForPreTrainingOutput",
    "TwoStreamForQuestionAnswering",
    "TwoStreamForVisualReasoning",
    "TwoStreamModel",
    "TwoStreamModelOutput",
    "TwoStreamPreTrainedModel",
]
