"""`hf-vlalign <verb>`: the library's one console entry point.

Every verb that reads a model takes it (a local folder, or a Hub id) as its positional argument, every output path is
`--out`, and options are spelled with underscores, as in transformers' examples. A mistake (a missing folder, a bad
file, a wrong value, an option the chosen setting does not read) prints `hf-vlalign <verb>: error: <message>` and exits
with status 2, as argparse does. stdout holds the verb's result (its JSON summary or table) alone: whatever else is
printed meanwhile, by the library or a dependency, goes to stderr. `--data_file FILE` (your own images and texts,
docs/own_data.md) alone means `--data user_file`. Every result file is written atomically, replacing only a result hf_vlalign wrote.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from ..utils.typed_options import typed_options
from ..utils.user_errors import run_command, user_error_message
from . import data_verbs, grounding_verbs, localization_verbs, model_verbs
from .common import (
    RESULT_STREAM,
    USER_FILE,
    HelpFormatter,
    check_checkpoint,
    check_model_kind,
    check_options,
    check_outputs,
    reads_patch_model,
    synthetic_config,
)
from .data_verbs import FEATURE_FORMATS
from .model_verbs import TASKS, results_table

__all__ = ["FEATURE_FORMATS", "TASKS", "USER_FILE", "build_parser", "check_options", "main", "results_table", "synthetic_config", "user_error_message"]


def build_parser() -> argparse.ArgumentParser:
    """The `hf-vlalign` parser; building it imports nothing beyond the standard library."""
    parser = argparse.ArgumentParser(prog="hf-vlalign", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(title="verbs", dest="verb", required=True, metavar="VERB")

    def add_verb(name: str, help: str, run, **tables) -> argparse.ArgumentParser:
        """A verb's parser; `tables` are what the door checks read (`common`), beside the verb's options."""
        verb = verbs.add_parser(name, help=help, description=help, formatter_class=HelpFormatter)
        verb.set_defaults(
            run=run, checkpoint_argument=None, option_settings={}, required_options={}, model_requirements={},
            outputs={}, patch_model_data=(), data_file_task=None,
        )  # fmt: skip
        verb.set_defaults(**tables)
        return verb

    for add_verb_parser in (*data_verbs.VERB_PARSERS, *grounding_verbs.VERB_PARSERS, *localization_verbs.VERB_PARSERS, *model_verbs.VERB_PARSERS):
        add_verb_parser(add_verb)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`hf-vlalign <verb> ...`: returns 0, or exits with status 2 and a one-line message on a user mistake
    (`user_error_message`), or with status 130 and one line when interrupted (Ctrl-C)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    def run() -> int:
        check_options(args, typed_options(parser, argv))
        check_outputs(args)
        if args.checkpoint_argument is not None:
            # every verb but `convert` (whose `src` may ship none: `--tokenizer`) reads the checkpoint's tokenizer
            is_model = args.checkpoint_argument == "model"
            check_checkpoint(getattr(args, args.checkpoint_argument), args.checkpoint_argument, needs_tokenizer=False)
            if is_model:  # the model's kind first: a model no verb reads is named as such, not by a missing file
                check_model_kind(args)
                if not reads_patch_model(args):  # a transformers VLM's processor loads its own tokenizer
                    check_checkpoint(args.model, "model", needs_tokenizer=True)
        return args.run(args)

    # stdout holds the verb's result alone (`print_result`); anything else printed meanwhile goes to stderr
    stream = RESULT_STREAM.set(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return run_command(f"hf-vlalign {args.verb}", run)
    finally:
        RESULT_STREAM.reset(stream)


if __name__ == "__main__":
    sys.exit(main())
