"""Every command's settings: typed dataclasses loaded by one function, checked where they are declared.

`load_settings(TrainConfig, "configs/train-cpu.yaml", ["learner.lr=1e-6"])` layers the dataclass defaults,
a YAML (or JSON) file, explicit values (e.g. a command's flags) and dotted `key=value` overrides. Unknown
keys and wrong types are refused naming the key and its source; then each field's declared checks
(`setting(4, at_least=1)`, `setting("async", choices=("async", "sync"))`) and each dataclass's `check()`
run over the nested dataclasses, and a refusal names the dotted key (`rl.mode` inside a quickstart config).
Only the standard library and OmegaConf (with its PyYAML): any floor may use it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")

_CHECKS = ("at_least", "above", "at_most", "below", "choices")


def setting(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    choices: tuple[Any, ...] | None = None,
    help: str | None = None,
    metavar: str | None = None,
) -> Any:
    """A dataclass field with its checks declared once (a None value skips the range checks: null means off).

    `help` and `metavar` are what its generated command-line flag shows (core/settings_flags.py).
    """
    metadata = {
        name: value
        for name, value in (
            ("at_least", at_least),
            ("above", above),
            ("at_most", at_most),
            ("below", below),
            ("choices", choices),
            ("help", help),
            ("metavar", metavar),
        )
        if value is not None
    }
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def problems(settings: Any, prefix: str = "") -> Iterator[str]:
    """Every check a settings object fails, as messages that open with the dotted key; nested dataclasses too."""
    for f in dataclasses.fields(settings):
        key, value = f"{prefix}{f.name}", getattr(settings, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from problems(value, key + ".")
            continue
        yield from _field_problems(key, value, f.metadata)
    check = getattr(settings, "check", None)
    if callable(check):
        for relative, message in check() or ():
            yield f"{prefix}{relative} {message}"


def _field_problems(key: str, value: Any, rules: Mapping[str, Any]) -> Iterator[str]:
    choices = rules.get("choices")
    if choices is not None and value not in choices:
        yield f"{key} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}"
    if value is None or not any(name in rules for name in ("at_least", "above", "at_most", "below")):
        return
    if isinstance(value, float) and math.isnan(value):
        yield f"{key} must be a number, got nan"
        return
    if "at_least" in rules and value < rules["at_least"]:
        yield f"{key} must be at least {rules['at_least']}, got {value}"
    if "above" in rules and not value > rules["above"]:
        yield f"{key} must be > {rules['above']}, got {value}"
    if "at_most" in rules and value > rules["at_most"]:
        yield f"{key} must be at most {rules['at_most']}, got {value}"
    if "below" in rules and not value < rules["below"]:
        yield f"{key} must be < {rules['below']}, got {value}"


def check_settings(settings: Any, prefix: str = "") -> None:
    """ValueError naming the first failed check's dotted key; settings built in Python are checked the same way."""
    for problem in problems(settings, prefix):
        raise ValueError(problem)


def load_settings(
    cls: type[T],
    path: str | os.PathLike | None = None,
    overrides: Iterable[str] = (),
    values: Mapping[str, Any] | None = None,
    *,
    base: T | None = None,
    values_source: str = "the command's flags",
) -> T:
    """Defaults (`base`, else `cls()`), then the file at `path`, then `values`, then dotted overrides; checked.

    Unknown keys and wrong types name the key and where it came from (the file, the flags, the override);
    range and choice checks name the dotted key. Returns a `cls` instance (ValueError for anything refused).
    """
    merged = OmegaConf.structured(base if base is not None else cls)
    if path is not None:
        merged = _merge(merged, functools.partial(_read_file, os.fspath(path)), os.fspath(path))
    if values:
        merged = _merge(merged, lambda: OmegaConf.create(dict(values)), values_source)
    for override in overrides:
        if "=" not in override:
            raise ValueError(f"{override}: an override is key=value, e.g. steps=10 (from override {override!r})")
        merged = _merge(
            merged,
            functools.partial(OmegaConf.from_dotlist, [override]),
            f"override {override!r}",
            key=override.partition("=")[0].strip(),
        )
    try:
        settings: T = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:  # e.g. a required value never given
        raise ValueError(f"{e.full_key or 'config'}: {(e.msg or str(e)).splitlines()[0]}") from None
    check_settings(settings)
    return settings


def _read_file(path: str) -> Any:
    """The file's settings: `.json` read as JSON (a run's own config.json holds its task ids, past YAML's node
    limit), anything else as YAML; ValueError unless it holds a mapping."""
    if path.lower().endswith(".json"):
        try:
            with open(path, encoding="utf-8") as f:
                data: Any = json.load(f)
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text: {e}") from None
        if not isinstance(data, dict):  # OmegaConf.create would parse a JSON string as YAML
            raise ValueError(f"{path}: a config file holds a mapping of settings, got {_kind(data)}")
        return OmegaConf.create(data)
    try:
        loaded = OmegaConf.load(path)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text: {e}") from None
    except OSError as e:  # OmegaConf's word for a YAML scalar ("Invalid loaded object type"); a missing file passes
        if isinstance(e, FileNotFoundError) or "Invalid loaded object type" not in str(e):
            raise
        raise ValueError(f"{path}: a config file holds a mapping of settings, got a single value") from None
    if not isinstance(loaded, DictConfig):
        raise ValueError(f"{path}: a config file holds a mapping of settings, got a list")
    return loaded


def _kind(data: Any) -> str:
    """A JSON value's kind in words."""
    return {list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(type(data), "a number")


def _merge(base: Any, load: Callable[[], Any], source: str, key: str | None = None) -> Any:
    """`base` merged with what `load` reads; OmegaConf's errors become one ValueError naming the key and the source."""
    try:
        return OmegaConf.merge(base, load())
    except OmegaConfBaseException as e:
        message = (e.msg or str(e)).splitlines()[0]
        raise ValueError(f"{e.full_key or key or e.key or 'config'}: {message} (from {source})") from None
    except yaml.YAMLError as e:  # a file (or override) that is not YAML
        raise ValueError(f"{source} is not valid YAML: {' '.join(str(e).split())}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{source} is not valid JSON: {e}") from None


def settings_dict(settings: Any) -> dict[str, Any]:
    """The settings as plain JSON-ready data, which `load_settings` of the same class reads back to an equal object."""
    return OmegaConf.to_container(OmegaConf.structured(settings))  # type: ignore[return-value]
