"""Env kwargs checked against what an env id's constructor takes, before anything is built.

`gym.make(id, sise=300)` would otherwise fail only where the kwarg finally lands (after a world was built), or,
where an integration stores kwargs for later (TRL's `environment_factory`, OpenEnv's server), at the first
rollout. `check_env_kwargs` names the unknown key (with the closest accepted one) or the wrongly typed one.
A constructor that passes `**env_kwargs` on says where with `forwards_kwargs_to`: "module:function" strings on
its floor or below (tests/test_import_direction.py counts them as imports), or the registered gym id of a factory
on a higher floor; without it, they go to `SearchEnv`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

DEFAULT_FORWARD = ("searchgym.envs.search_env:SearchEnv",)
SIMPLE = (bool, int, float, str)
Options = TypeVar("Options")


def check_env_kwargs(env_id: str, kwargs: dict[str, Any]) -> None:
    """Refuse kwargs `env_id`'s constructor (and whatever it forwards them to) does not take, or of a plain type
    (bool, int, float, str, or None where allowed) other than its annotation says, naming the key."""
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as e:
        raise ValueError(f"unknown env id {env_id!r}: {e}") from None
    if not isinstance(spec.entry_point, str):
        return  # a creator registered as an object: nothing to resolve by name
    accepted = _accepted(spec.entry_point)
    for key, value in kwargs.items():
        if key not in accepted:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{env_id}: unknown env kwarg {key!r}{hint}; it takes {', '.join(sorted(accepted))}")
        expected = accepted[key]
        if expected is not None and not _matches(value, expected):
            names = " or ".join("None" if t is type(None) else t.__name__ for t in expected)
            raise ValueError(f"{env_id}: env kwarg {key!r} must be {names}, got {value!r}")


def options_from(cls: type[Options], values: Mapping[str, Any] | None, key: str) -> Options:
    """A tool's options dataclass from the dict an env kwarg holds (`fetch_options={...}`, ...): an unknown option is
    a ValueError naming the env kwarg and the option (with the closest accepted one)."""
    values = dict(values or {})
    accepted = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    for name in values:
        if name not in accepted:
            close = difflib.get_close_matches(name, accepted, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"env kwarg {key!r}: unknown option {name!r}{hint}; it takes {', '.join(accepted)}")
    return cls(**values)


def accepted_kwargs(env_id: str) -> set[str] | None:
    """The kwargs `env_id`'s constructor takes (with what it forwards them to), or None for an id not registered
    by name here (nothing to check against)."""
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        return None
    return set(_accepted(spec.entry_point)) if isinstance(spec.entry_point, str) else None


@functools.cache
def _accepted(entry_point: str) -> dict[str, tuple[type, ...] | None]:
    """Every keyword the creator takes, with its plain types where its annotation is plain (else None)."""
    accepted: dict[str, tuple[type, ...] | None] = {}
    pending, seen = [entry_point], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in gym.registry:  # a gym id (a forward to a factory on a higher floor): its entry point
            target = gym.spec(name).entry_point
            pending.extend([target] if isinstance(target, str) else [])
            continue
        creator = load_env_creator(name)
        params = inspect.signature(creator).parameters
        hints = _hints(creator.__init__ if inspect.isclass(creator) else creator)
        for param in params.values():
            if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY) and param.name != "self":
                accepted.setdefault(param.name, _plain(hints.get(param.name)))
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            pending.extend(getattr(creator, "forwards_kwargs_to", DEFAULT_FORWARD))
    return accepted


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve here: no type checks, names still checked
        return {}


def _plain(hint: Any) -> tuple[type, ...] | None:
    """The hint as a tuple of plain types (None allowed as NoneType), or None when any part is not plain."""
    if hint is None:
        return None
    parts = (
        typing.get_args(hint)
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        else (hint,)
    )
    if all(p in SIMPLE or p is type(None) for p in parts):
        return tuple(parts)
    return None


def _matches(value: Any, expected: tuple[type, ...]) -> bool:
    for kind in expected:
        if kind is type(None) and value is None:
            return True
        if kind is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
            return True
        if kind is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return True
        if kind in (bool, str) and isinstance(value, kind):
            return True
    return False
