"""Every (command, option) pair an argparse parser accepts, walked through its subcommands: how
tests/fixtures/old_cli_flags.json was recorded from old commits, and how tests/test_old_flags.py reads today's parser.

Recording a front end's flags from an old commit (its own checkout first on the path):

    git worktree add /tmp/oldcli 3ccfd87
    PYTHONPATH=/tmp/oldcli python tests/cli_options.py searchgym.cli:build_parser
    PYTHONPATH=/tmp/oldcli python tests/cli_options.py searchgym.agents.server.app:parse_args

prints `[command, option, takes_value]` rows as JSON. `module:function` either returns the parser or builds one and
calls its `parse_args` on (a `main`): called with no arguments, the parser is caught there before anything runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys


def option_pairs(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[tuple[str, str, bool]]:
    """(command words, option string, whether it takes a value) for every option of every subcommand."""
    pairs = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                pairs += option_pairs(sub, (*words, name))
        elif not isinstance(action, argparse._HelpAction):
            pairs += [(" ".join(words), option, action.nargs != 0) for option in action.option_strings]
    return pairs


class _Caught(Exception):
    pass


def built_parser(target: str) -> argparse.ArgumentParser:
    """The parser `module:function` returns, or the one it calls `parse_args` on (without running anything)."""
    module, _, name = target.partition(":")
    caught: list[argparse.ArgumentParser] = []

    def catch(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        caught.append(self)
        raise _Caught

    real = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = catch  # type: ignore[method-assign,assignment]
    try:
        result = getattr(importlib.import_module(module), name)()
    except _Caught:
        result = caught[0]
    finally:
        argparse.ArgumentParser.parse_args = real  # type: ignore[method-assign]
    return result


if __name__ == "__main__":
    parser = built_parser(sys.argv[1])
    json.dump(option_pairs(parser), sys.stdout)
    print()
