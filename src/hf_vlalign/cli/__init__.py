"""`hf-vlalign <verb>`: the library's one console entry point.

Every verb that reads a model takes it (a local folder, or a Hub id) as its positional argument, every output path is
`--out`, and options are spelled with underscores, as in transformers' examples. Building the parser imports neither
torch nor transformers, so `hf-vlalign --help` is instant; each verb imports what it runs. A user mistake (a missing
folder, a bad file, a wrong value) prints `hf-vlalign <verb>: error: <message>` and exits with status 2, as argparse
does; a bug still shows its traceback. `user_error_message` is the one mapping from exception types to that line.
An option the chosen setting (`--format`, `--data`, `--task`, ...) does not read is refused, never silently ignored;
`--data_file FILE` (a file of one's own images and texts, docs/own_data.md) alone means `--data user_file`; an output
path is checked before anything runs, and every result file is written atomically, replacing only a result the
library wrote (`common.check_outputs`, `common.write_result`). Each verb's options live beside it: `data_verbs`,
`grounding_verbs`, `model_verbs`.
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
    synthetic_config,
)
from .data_verbs import FEATURE_FORMATS
from .model_verbs import TASKS, results_table

__all__ = ["FEATURE_FORMATS", "TASKS", "USER_FILE", "build_parser", "check_options", "main", "results_table", "synthetic_config", "user_error_message"]

INTERRUPTED_EXIT_STATUS = 130  # a shell's status for a program ended by Ctrl-C (128 + SIGINT)


def _one_line(message: str) -> str:
    """`message` on one line: its lines joined (a dependency's message may span several)."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def _fail(verb: str, message: str, status: int = 2) -> NoReturn:
    """argparse's convention for a user mistake: one line on stderr, exit status 2."""
    sys.stderr.write(f"hf-vlalign {verb}: error: {_one_line(message)}\n")
    raise SystemExit(status)


def _os_error_message(error: OSError) -> str:
    """An OSError with the path it concerns: the library's own carry their message; the system's (`[Errno 21] Is a
    directory: 'x'`) are said as `<reason>: <path>` (and `-> <second path>` of a rename or link)."""
    if error.strerror is None or error.filename is None:
        return str(error) or type(error).__name__
    paths = " -> ".join(str(path) for path in (error.filename, error.filename2) if path is not None)
    return f"{error.strerror}: {paths}"


def user_error_message(error: BaseException) -> str | None:
    """The one line `hf-vlalign` prints for `error`, or None when `error` is a bug (its traceback is shown).

    A missing optional dependency gives its pip command; a file that is not UTF-8 or not JSON, where the byte or the
    line and column are; any other `ValueError` its message (the library's errors name the argument, file or field);
    an `OSError` its reason and path; a `MemoryError` "out of memory". Everything else (`TypeError`, `KeyError`,
    `RuntimeError`, ...) raised on input that passed the checks is a bug of hf_vlalign and keeps its traceback.
    """
    if isinstance(error, MissingDependencyError):
        return str(error)
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text: the byte {error.object[error.start:error.start + 1]!r} at position {error.start} ({error.reason})"
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
    if isinstance(error, ValueError):
        return str(error) or type(error).__name__
    if isinstance(error, OSError):
        return _os_error_message(error)
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
