"""`hf-vlalign <verb>`: the library's one console entry point.

Every verb that reads a model takes it (a local folder, or a Hub id) as its positional argument, every output path is
`--out`, and options are spelled with underscores, as in transformers' examples. A mistake (a missing folder, a bad
file, a wrong value, an option the chosen setting does not read) prints `hf-vlalign <verb>: error: <message>` and exits
with status 2, as argparse does. `--data_file FILE` (your own images and texts, docs/own_data.md) alone means `--data
user_file`. Every result file is written atomically, replacing only a result hf_vlalign wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

from ..utils.optional import MissingDependencyError
from ..utils.typed_options import typed_options
from . import data_verbs, grounding_verbs, model_verbs
from .common import (
    USER_FILE,
    HelpFormatter,
    check_checkpoint,
    check_model_kind,
    check_options,
    check_outputs,
    one_line,
    synthetic_config,
)
from .data_verbs import FEATURE_FORMATS
from .model_verbs import TASKS, results_table

__all__ = ["FEATURE_FORMATS", "TASKS", "USER_FILE", "build_parser", "check_options", "main", "results_table", "synthetic_config", "user_error_message"]

INTERRUPTED_EXIT_STATUS = 130  # a shell's status for a program ended by Ctrl-C (128 + SIGINT)


def _fail(verb: str, message: str, status: int = 2) -> NoReturn:
    """argparse's convention for a user mistake: one line on stderr, exit status 2."""
    sys.stderr.write(f"hf-vlalign {verb}: error: {one_line(message)}\n")
    raise SystemExit(status)


def user_error_message(error: BaseException) -> str | None:
    """The one line `hf-vlalign` prints for `error`, or None when `error` is a bug (`TypeError`, `KeyError`, ...,
    raised on input that passed the checks: its traceback is shown). The library's `ValueError`s name the argument,
    file or field; a system `OSError` is said as `<reason>: <path>` (`-> <second path>` of a rename or link)."""
    if isinstance(error, MissingDependencyError):
        return str(error)
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text: the byte {error.object[error.start:error.start + 1]!r} at position {error.start} ({error.reason})"
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
    if isinstance(error, ValueError):
        return str(error) or type(error).__name__
    if isinstance(error, OSError) and (error.strerror is None or error.filename is None):
        return str(error) or type(error).__name__  # the library's own carry their message
    if isinstance(error, OSError):
        return f"{error.strerror}: {' -> '.join(str(path) for path in (error.filename, error.filename2) if path is not None)}"
    if isinstance(error, MemoryError):
        return f"out of memory ({str(error) or 'MemoryError'}): ask for fewer examples, regions or a smaller batch"
    return None


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

    for add_verb_parser in (*data_verbs.VERB_PARSERS, *grounding_verbs.VERB_PARSERS, *model_verbs.VERB_PARSERS):
        add_verb_parser(add_verb)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`hf-vlalign <verb> ...`: returns 0, or exits with status 2 and a one-line message on a user mistake
    (`user_error_message`), or with status 130 and one line when interrupted (Ctrl-C)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_options(args, typed_options(parser, argv))
        check_outputs(args)
        if args.checkpoint_argument is not None:
            # every verb but `convert` (whose `src` may ship none: `--tokenizer`) reads the checkpoint's tokenizer
            is_model = args.checkpoint_argument == "model"
            check_checkpoint(getattr(args, args.checkpoint_argument), args.checkpoint_argument, needs_tokenizer=is_model)
            if is_model:
                check_model_kind(args)
        return args.run(args)
    except KeyboardInterrupt:
        _fail(args.verb, "interrupted", status=INTERRUPTED_EXIT_STATUS)
    except Exception as error:
        message = user_error_message(error)
        if message is None:
            raise
        _fail(args.verb, message)


if __name__ == "__main__":
    sys.exit(main())
