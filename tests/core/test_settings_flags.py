"""Flags generated from a settings dataclass: every field a flag, only typed flags as values, checks by key."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchgym.core.settings_flags import add_settings_flags, settings_values
from searchgym.eval.eval_settings import EvalSettings
from searchgym.settings import load_settings, setting


@dataclass
class Inner:
    depth: int = 1


@dataclass
class Example:
    name: str = setting("a", help="a name")
    count: int = setting(3, at_least=1, help="how many")
    rate: float | None = None
    mode: str = setting("fast", choices=("fast", "slow"))
    verbose: bool = False
    sizes: list[int] = field(default_factory=lambda: [1, 2])
    kwargs: dict = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)  # nested: dotted overrides only


def parse(argv: list[str]) -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="x", exit_on_error=False)
    add_settings_flags(parser, Example)
    return parser, settings_values(parser.parse_args(argv), Example)


def test_every_carried_field_is_a_flag_and_nested_ones_are_not():
    parser = argparse.ArgumentParser()
    added = add_settings_flags(parser, Example)
    assert added == ["name", "count", "rate", "mode", "verbose", "sizes", "kwargs"]
    text = parser.format_help()
    assert "--count COUNT" in text and "how many (default: 3)" in text and "--inner" not in text
    assert "--verbose, --no-verbose" in text


def test_only_typed_flags_become_values_so_a_config_file_is_not_overridden_by_defaults():
    assert parse([])[1] == {}
    _, values = parse(["--count", "5", "--sizes", "4,5", "--kwargs", '{"a": 1}', "--verbose", "--rate", "0.5"])
    assert values == {"count": 5, "sizes": [4, 5], "kwargs": {"a": 1}, "verbose": True, "rate": 0.5}
    settings = load_settings(Example, values=values, overrides=["inner.depth=2"])
    assert settings.count == 5 and settings.inner.depth == 2 and settings.sizes == [4, 5]


def test_a_range_check_names_the_key_and_a_bad_value_names_the_flag():
    _, values = parse(["--count", "0"])
    with pytest.raises(ValueError, match="count must be at least 1"):
        load_settings(Example, values=values)
    with pytest.raises(argparse.ArgumentError, match="--count"):
        parse(["--count", "many"])
    with pytest.raises(argparse.ArgumentError, match="--kwargs"):
        parse(["--kwargs", "[1]"])
    with pytest.raises(argparse.ArgumentError, match="--mode"):
        parse(["--mode", "medium"])


def test_the_eval_command_has_a_flag_for_every_eval_setting():
    parser = argparse.ArgumentParser()
    added = add_settings_flags(parser, EvalSettings)
    assert set(added) == {f for f in EvalSettings.__dataclass_fields__}


@given(count=st.integers(1, 10**9), name=st.text(min_size=1).filter(lambda t: not t.startswith("-")))
def test_any_typed_value_comes_back_as_given(count, name):
    _, values = parse(["--count", str(count), "--name", name])
    assert load_settings(Example, values=values).count == count
    assert values["name"] == name
