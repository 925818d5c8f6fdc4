"""What the example scripts share, so that every example takes the same flags and finishes its run the same way.

Modules: `arguments` (the argument classes, their `TrainingArguments` defaults and checks, `parse_recipe_args`),
`threads` (CPU threads per process, the multi-process launch check), `models` (tokenizer and model loading, dropout),
`subsets` (the rows a run reads), `outputs` (final evaluation, weights, `eval_results.json`, model-card summary, push),
`user_data` (`--train_file` / `--validation_file`: one's own images and texts).
"""

from .arguments import (
    EVALUATIONS_PER_RUN,
    FAMILIES,
    DataArguments,
    MixedPrecisionArguments,
    ModelArguments,
    ThreadArguments,
    UserDataArguments,
    parse_indices,
    parse_recipe_args,
    supervision_settings,
    synthetic_scene_config,
)
from .models import (
    DEFAULT_BASE_MODEL,
    check_visual_feat_dim,
    from_checkpoint_or_text,
    load_task_model,
    load_tokenizer,
    set_dropout,
)
from .outputs import (
    IMAGE_USE_EXAMPLES,
    SYNTHETIC_INFERENCE_GRID,
    build_processor,
    default_region_options,
    final_evaluation,
    image_use_results,
    save_model,
    take_push_to_hub,
    trained_amount,
    training_summary,
    truncation_results,
    write_json,
    write_results,
)
from .subsets import evaluation_subset, first_rows
from .threads import available_cores, check_distributed_launch, default_cpu_threads
from .user_data import load_user_splits, rename_text_columns

__all__ = [
    "DEFAULT_BASE_MODEL",
    "EVALUATIONS_PER_RUN",
    "FAMILIES",
    "IMAGE_USE_EXAMPLES",
    "SYNTHETIC_INFERENCE_GRID",
    "DataArguments",
    "MixedPrecisionArguments",
    "ModelArguments",
    "ThreadArguments",
    "UserDataArguments",
    "available_cores",
    "build_processor",
    "check_distributed_launch",
    "check_visual_feat_dim",
    "default_cpu_threads",
    "default_region_options",
    "evaluation_subset",
    "final_evaluation",
    "first_rows",
    "from_checkpoint_or_text",
    "image_use_results",
    "load_task_model",
    "load_tokenizer",
    "load_user_splits",
    "parse_indices",
    "parse_recipe_args",
    "rename_text_columns",
    "save_model",
    "set_dropout",
    "supervision_settings",
    "synthetic_scene_config",
    "take_push_to_hub",
    "trained_amount",
    "training_summary",
    "truncation_results",
    "write_json",
    "write_results",
]
