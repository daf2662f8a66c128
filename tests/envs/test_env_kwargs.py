"""Env kwargs are checked by name and plain type before anything is built, for gym.make, make_unwrapped and
the integrations that store kwargs for later (TRL's environment_factory)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401  (registers the ids)
from searchgym.envs.env_kwargs import _accepted, check_env_kwargs
from searchgym.envs.factory import make_unwrapped

SYNTHETIC = "searchgym/SyntheticQA-v0"
ACCEPTED = sorted(_accepted(gym.spec(SYNTHETIC).entry_point))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=20).filter(lambda k: k not in ACCEPTED))
def test_an_unknown_kwarg_is_refused_naming_it(key):
    with pytest.raises(ValueError, match=f"unknown env kwarg '{key}'"):
        check_env_kwargs(SYNTHETIC, {key: 1})


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["size", "n_tasks", "max_turns", "top_k", "doc_chars"]),
    st.one_of(
        st.text(max_size=5),
        st.floats(allow_nan=False).filter(lambda x: x != int(x) if abs(x) < 1e15 else True),
        st.booleans(),
        st.lists(st.integers(), max_size=2),
    ),
)
def test_a_wrongly_typed_kwarg_is_refused_naming_it(key, value):
    with pytest.raises(ValueError, match=f"env kwarg '{key}' must be int"):
        check_env_kwargs(SYNTHETIC, {key: value})


def test_a_typo_gets_the_closest_name_and_valid_kwargs_pass():
    with pytest.raises(ValueError, match=r"'sise' \(did you mean 'size'\?\)"):
        check_env_kwargs(SYNTHETIC, {"sise": 300})
    check_env_kwargs(
        SYNTHETIC,
        {
            "size": 300,
            "n_tasks": 40,
            "max_turns": 4,
            "split": None,
            "max_obs_tokens": None,
            "judge": "em",
            "tool_format": "hermes",
        },
    )
    check_env_kwargs("searchgym/HotpotQA-v0", {"index": "somewhere", "max_turns": 3, "data_root": "x"})
    with pytest.raises(ValueError, match="unknown env id"):
        check_env_kwargs("nope/Nothing-v0", {})


def test_a_misspelt_kwarg_fails_before_a_world_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("SEARCHGYM_CACHE", str(tmp_path))
    for make in (lambda: gym.make(SYNTHETIC, size=300, sise=300), lambda: make_unwrapped(SYNTHETIC, sise=300)):
        with pytest.raises(ValueError, match="sise"):
            make()
    assert not any(tmp_path.iterdir()), "a world was built before the kwarg was refused"


def test_trl_configured_refuses_a_typo_at_once(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from searchgym.integrations.trl import SearchGymEnv

    monkeypatch.setenv("SEARCHGYM_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="'sise'"):
        SearchGymEnv.configured(sise=300)
    assert not any(tmp_path.iterdir())


def test_a_tools_unknown_option_is_refused_naming_the_env_kwarg_and_the_option(tmp_path):
    from searchgym.envs.env_kwargs import options_from
    from searchgym.envs.tools.remote_search import RemoteOptions
    from searchgym.envs.tools.web_fetch import FetchOptions

    assert options_from(FetchOptions, {"total_timeout": 5}, "fetch_options") == FetchOptions(total_timeout=5)
    assert options_from(RemoteOptions, None, "server_options") == RemoteOptions()
    with pytest.raises(ValueError, match="'fetch_options': unknown option 'total_timout' .*'total_timeout'"):
        options_from(FetchOptions, {"total_timout": 5}, "fetch_options")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "q1", "question": "q?", "answers": ["a"]}\n')
    with pytest.raises(ValueError, match="'server_options': unknown option 'retry'"):
        make_unwrapped(
            "searchgym/LocalQA-v0", tasks=str(tasks), servers="http://127.0.0.1:9", server_options={"retry": 0}
        )
