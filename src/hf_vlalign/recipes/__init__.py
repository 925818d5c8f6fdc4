"""What the example scripts share: their common arguments, `TrainingArguments` defaults, loading the tokenizer and a
model (of either family for a task, or any class from an hf_vlalign or a text checkpoint), and finishing a run
(weights, `eval_results.json`, model card, push).

Every example parses `ModelArguments`, `DataArguments`, its own task arguments and transformers' `TrainingArguments`
with `parse_recipe_args`, so each takes the same flags: `--model_family`, `--model_name_or_path`, `--dataset`,
`--data_dir`, `--features`, `--train_file` / `--validation_file` (one's own data), `--mixed_precision`, and every
`TrainingArguments` flag (`--seed`, `--gradient_accumulation_steps`, `--eval_steps`, `--resume_from_checkpoint`,
`--push_to_hub`, `--hub_model_id`, ...). Examples with arguments of their own (VGP, two-stream pre-training,
captioning) parse them with `parse_recipe_args` too (their argument classes extend `UserDataArguments`, for
`--train_file`), so the same checks apply (`--mixed_precision`, `--dropout`) and they load and finish their runs with
the same helpers (`load_tokenizer`, `from_checkpoint_or_text`, `set_dropout`, `save_model`, `take_push_to_hub`,
`write_results`).
Every example also takes `--num_threads`: on CPU, each process uses the available cores divided by the processes of
the machine unless OMP_NUM_THREADS or `--num_threads` says otherwise (`set_cpu_threads`).

Modules: `arguments` (the argument classes, their defaults and checks, `parse_recipe_args`), `threads` (CPU threads and
the multi-process launch check), `models` (tokenizer and model loading, dropout), `subsets` (the rows a run reads),
`outputs` (final evaluation, weights, `eval_results.json`, model-card summary, push), `user_data` (`--train_file` /
`--validation_file`: one's own images and texts, and the evaluation rows without a validation file).
"""

from .arguments import (
    EVALUATIONS_PER_RUN,
    FAMILIES,
    MIXED_PRECISION,
    TRAINING_DEFAULTS,
    DataArguments,
    MixedPrecisionArguments,
    ModelArguments,
    ThreadArguments,
    UserDataArguments,
    apply_mixed_precision,
    check_dropout,
    check_model_family,
    checkpoint_family,
    default_report_to,
    parse_indices,
    parse_recipe_args,
    supervision_settings,
    synthetic_scene_config,
)
from .models import (
    DEFAULT_BASE_MODEL,
    check_visual_feat_dim,
    checkpoint_path,
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
from .threads import available_cores, check_distributed_launch, default_cpu_threads, set_cpu_threads
from .user_data import HELD_OUT_FRACTION, UserSplits, load_user_splits, rename_text_columns

__all__ = [
    "DEFAULT_BASE_MODEL",
    "EVALUATIONS_PER_RUN",
    "FAMILIES",
    "HELD_OUT_FRACTION",
    "IMAGE_USE_EXAMPLES",
    "MIXED_PRECISION",
    "SYNTHETIC_INFERENCE_GRID",
    "TRAINING_DEFAULTS",
    "DataArguments",
    "MixedPrecisionArguments",
    "ModelArguments",
    "ThreadArguments",
    "UserDataArguments",
    "UserSplits",
    "apply_mixed_precision",
    "available_cores",
    "build_processor",
    "check_distributed_launch",
    "check_dropout",
    "check_model_family",
    "check_visual_feat_dim",
    "checkpoint_family",
    "checkpoint_path",
    "default_cpu_threads",
    "default_region_options",
    "default_report_to",
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
    "set_cpu_threads",
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
