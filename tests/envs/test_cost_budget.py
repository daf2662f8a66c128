"""A `cost_budget` is checked when given: a unit no backend charges (which would never end an episode) or a limit
that is not a finite number > 0 is refused naming the key and the allowed values; every unit a built-in backend
charges is one a budget may name."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import given
from hypothesis import strategies as st

import searchgym
from searchgym.envs.tools.costs import COST_UNITS, check_cost_budget, register_cost_unit
from tests.conftest import SMALL


@pytest.mark.parametrize("budget", [{"model_call": 1}, {"": 1}, {"API_CALLS": 3}, {1: 2}])
def test_an_unknown_unit_is_refused_naming_the_key_and_the_units(small_bundle, budget):
    with pytest.raises(ValueError, match=r"cost_budget: unknown cost unit .*; the units are api_calls, bytes_fetched"):
        gym.make("searchgym/SyntheticQA-v0", **SMALL, cost_budget=budget)


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.text(max_size=3), st.none()))
def test_a_limit_is_a_finite_number_above_zero(limit):
    ok = isinstance(limit, float) and math.isfinite(limit) and limit > 0
    if ok:
        assert check_cost_budget({"api_calls": limit}) == {"api_calls": limit}
    else:
        with pytest.raises(ValueError, match=r"cost_budget\.api_calls must be a finite number > 0"):
            check_cost_budget({"api_calls": limit})


def test_a_custom_backends_unit_is_registered_and_every_built_in_charge_names_a_known_unit():
    with pytest.raises(ValueError, match="unknown cost unit 'gpu_seconds'"):
        check_cost_budget({"gpu_seconds": 5})
    register_cost_unit("gpu_seconds")
    try:
        assert check_cost_budget({"gpu_seconds": 5}) == {"gpu_seconds": 5}
    finally:
        COST_UNITS.discard("gpu_seconds")
    charged = set()
    for path in Path(searchgym.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "charge":
                charged |= {kw.arg for kw in node.keywords if kw.arg}
    assert charged and charged <= COST_UNITS, charged - COST_UNITS
