"""Which options a user typed, told apart from argparse's defaults: what the checks of options a setting does not read
(`hf-vlalign` verbs, the examples' flags) act on. Standard library only, so the CLI parser stays light."""

from __future__ import annotations

import argparse


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and, recursively, the parsers of its sub-commands."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_parsers(sub))
    return found


def typed_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The `dest` of every option typed in `argv` (argparse's abbreviations and `--option=value` spellings included):
    `argv` is parsed again with every default suppressed, then the defaults are restored. Positionals are left out,
    and so is a help request: the real parse prints the help, with the defaults."""
    argv = [argument for argument in argv if argument not in ("-h", "--help")]
    parsers = _parsers(parser)
    saved = [(one, dict(one._defaults), {action: action.default for action in one._actions}) for one in parsers]
    try:
        for one in parsers:
            one._defaults.clear()
            for action in one._actions:
                if action.option_strings:
                    action.default = argparse.SUPPRESS
        namespace, _ = parser.parse_known_args(argv)
    finally:
        for one, defaults, action_defaults in saved:
            one._defaults.update(defaults)
            for action, default in action_defaults.items():
                action.default = default
    positionals = {action.dest for one in parsers for action in one._actions if not action.option_strings}
    return set(vars(namespace)) - positionals
