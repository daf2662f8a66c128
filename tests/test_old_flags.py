"""Every flag spelling users may have in scripts works or names its new spelling (issue 42's done-when).

Each (command, flag) of the last hand-written parser and of the second front ends the generated CLI replaced
(tests/fixtures/old_cli_flags.json, recorded from those commits by tests/cli_options.py) parses today exactly as
spelt (not as a prefix of another flag), or argparse exits 2 with a message naming its new spelling (cli.OLD_FLAGS).
A moved front end (`python -m searchgym.agents.server`) exits 2 naming the command that took its flags."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import runpy
from pathlib import Path

import pytest

import searchgym.cli as cli
from searchgym.cli import build_parser, main
from searchgym.core.commands import OldFlag, subparser
from searchgym.core.settings_flags import FLAG_DEST
from tests.cli_options import option_pairs

FIXTURE = Path(__file__).parent / "fixtures" / "old_cli_flags.json"
FRONT_ENDS = json.loads(FIXTURE.read_text())["front_ends"]
MOVED = [end["old"] for end in FRONT_ENDS if end["old"] != "searchgym"]
CASES = [(end["old"], command, option, takes) for end in FRONT_ENDS for command, option, takes in end["flags"]]


def moved_to(front_end: str) -> str:
    """The command an old `python -m MODULE` front end's flags went to, as that module says."""
    return importlib.import_module(front_end.removeprefix("python -m ")).MOVED_TO


def words_now(front_end: str, command: str) -> list[str]:
    """Today's `searchgym` command words for an old front end's command."""
    if front_end == "searchgym":
        return command.split()
    return moved_to(front_end).removeprefix("searchgym ").split()


def values(action: argparse.Action | None, takes_value: bool) -> list[str]:
    """Values that parse for `action` (or, for an old flag with no action now, one if it took one)."""
    if action is None:
        return ["1"] if takes_value else []
    if action.nargs == 0 or (action.nargs in ("?", "*") and not takes_value):
        return []
    if action.choices:
        value = str(next(iter(action.choices)))
    else:
        value = "{}" if getattr(action.type, "__name__", "") == "_json_mapping" else "1"
    return [value] * (action.nargs if isinstance(action.nargs, int) else 1)


def required_args(sub: argparse.ArgumentParser, tested: argparse.Action | None) -> list[str]:
    """The positionals and required flags `sub` needs besides the tested flag, with values that parse."""
    positionals = [a for a in sub._actions if a.required and not a.option_strings]
    flags = [a for a in sub._actions if a.required and a.option_strings and a is not tested]
    return [
        *(v for a in positionals for v in values(a, True)),
        *(v for a in flags for v in [a.option_strings[0], *values(a, True)]),
    ]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


@pytest.mark.parametrize(("front_end", "command", "option", "takes_value"), CASES, ids=lambda v: str(v))
def test_old_flag_parses_or_names_its_new_spelling(parser, capsys, front_end, command, option, takes_value):
    words = words_now(front_end, command)
    sub = subparser(parser, words)
    action = sub._option_string_actions.get(option)
    renamed = [old for old in cli.OLD_FLAGS if old.command.split() == words and old.old == option]
    argv = [*words, *required_args(sub, action), option, *values(action, takes_value)]
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        err = capsys.readouterr().err
        assert renamed, f"{front_end} {command} {option}: neither parses nor is in cli.OLD_FLAGS: {err}"
        assert e.code == 2 and renamed[0].new in err, err
        return
    assert action is not None, f"{option} parsed only as a prefix of another flag of `searchgym {' '.join(words)}`"
    assert action.dest == argparse.SUPPRESS or hasattr(args, action.dest), f"{argv} did not reach {action.dest}"
    assert not renamed or renamed[0].alias, f"{option} is refused in cli.OLD_FLAGS but parsed"


def test_the_fixture_is_every_option_of_the_old_parsers():
    """Rows are unique, and the old `searchgym` parser's commands are all today's (none renamed)."""
    for end in FRONT_ENDS:
        rows = [tuple(row) for row in end["flags"]]
        assert len(rows) == len(set(rows)), end["old"]
    today = {command for command, _, _ in option_pairs(build_parser())}
    old = {command for command, _, _ in FRONT_ENDS[0]["flags"]}
    assert FRONT_ENDS[0]["old"] == "searchgym" and old <= today, f"old commands gone: {old - today}"


@pytest.mark.parametrize("front_end", MOVED)
def test_a_moved_front_end_exits_2_naming_its_command(capsys, front_end):
    module = front_end.removeprefix("python -m ")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin
    with pytest.raises(SystemExit) as e:
        runpy.run_path(spec.origin, run_name="__main__")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert moved_to(front_end) in err and front_end in err, err


ALIAS = OldFlag("bench env", "--old-out", "--out", alias=True)
REFUSED = OldFlag("bench env", "--old-size", "--size", why="it counts pages now")


@pytest.mark.parametrize("argv_given", [False, True], ids=["whole parser", "one command's"])
def test_an_alias_reaches_its_new_flags_setting(monkeypatch, argv_given):
    monkeypatch.setattr(cli, "OLD_FLAGS", (ALIAS, REFUSED))
    argv = ["bench", "env", "--old-out", "x.json"]
    args = build_parser(argv if argv_given else None).parse_args(argv)
    assert getattr(args, FLAG_DEST + "out") == "x.json"


def test_a_refused_flag_exits_2_naming_the_new_spelling(monkeypatch, capsys):
    monkeypatch.setattr(cli, "OLD_FLAGS", (ALIAS, REFUSED))
    with pytest.raises(SystemExit) as e:
        main(["bench", "env", "--old-size", "5"])
    assert e.value.code == 2
    assert "--old-size is now --size; it counts pages now" in capsys.readouterr().err


def test_an_alias_of_a_flag_the_command_lacks_is_a_mistake_in_the_table(monkeypatch):
    monkeypatch.setattr(cli, "OLD_FLAGS", (OldFlag("bench env", "--old", "--no-such-flag", alias=True),))
    with pytest.raises(ValueError, match="--no-such-flag"):
        build_parser()
