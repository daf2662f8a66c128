"""JSON request values -> Python values, each failure a clear `InvalidRequest` naming the field.

Both wire dialects the model server speaks (SGLang's native API and OpenAI's) and the in-process chat
adapter read sampling options through these, so a bad value gets the same message everywhere: a 400
from a server, a `ValueError` in Python. JSON null means "the default", as SGLang and OpenAI treat it.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from typing import Any

from searchgym.core.http_session import BadRequest

show = reprlib.repr  # short reprs of client values for error messages


class InvalidRequest(BadRequest, ValueError):
    """A request field with a bad value: servers answer it with a 400, Python callers catch a ValueError."""


def require(condition: bool, message: str) -> None:
    """Raise InvalidRequest(message) unless condition holds."""
    if not condition:
        raise InvalidRequest(message)


def or_default(value: Any, default: Any) -> Any:
    """The value, with None (JSON null or a missing key) meaning the default."""
    return default if value is None else value


def integer(value: Any, name: str) -> int:
    """A JSON integer (booleans are not integers here)."""
    require(isinstance(value, int) and not isinstance(value, bool), f"{name} must be an integer, got {show(value)}")
    return value


def number(value: Any, name: str) -> float:
    """A finite JSON number."""
    require(
        isinstance(value, (int, float)) and not isinstance(value, bool), f"{name} must be a number, got {show(value)}"
    )
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    require(math.isfinite(result), f"{name} must be finite, got {show(value)}")
    return result


def boolean(value: Any, name: str) -> bool:
    """A JSON boolean."""
    require(isinstance(value, bool), f"{name} must be true or false, got {show(value)}")
    return value


def string(value: Any, name: str) -> str:
    """A JSON string."""
    require(isinstance(value, str), f"{name} must be a string, got {show(value)}")
    return value


def stop_strings(value: Any, name: str = "stop") -> tuple[str, ...]:
    """Stop strings: null, one non-empty string, or a list of them."""
    if value is None:
        return ()
    strings = [value] if isinstance(value, str) else value
    require(
        isinstance(strings, list) and all(isinstance(s, str) and s for s in strings),
        f"{name} must be a non-empty string or a list of them, got {show(value)}",
    )
    return tuple(strings)


def token_ids(value: Any, name: str, vocab_size: int) -> tuple[int, ...]:
    """Null or a list of token ids inside the vocabulary."""
    ids = or_default(value, [])
    require(isinstance(ids, list), f"{name} must be a list of token ids, got {show(value)}")
    for token in ids:
        require(
            isinstance(token, int) and not isinstance(token, bool) and 0 <= token < vocab_size,
            f"{name} must hold token ids in [0, {vocab_size}), got {show(token)}",
        )
    return tuple(ids)


def logit_bias(value: Any, name: str, vocab_size: int, limit: float = math.inf) -> tuple[tuple[int, float], ...]:
    """Null or {"token id": bias}: the (id, bias) pairs, ids inside the vocabulary, |bias| <= limit."""
    raw = or_default(value, {})
    require(isinstance(raw, Mapping), f"{name} must map token ids (as strings) to numbers, got {show(value)}")
    pairs = []
    for key, bias in raw.items():
        token: Any = int(key) if isinstance(key, str) and key.strip().lstrip("-").isdigit() else None
        require(
            token is not None and 0 <= token < vocab_size,
            f"{name} keys must be token ids in [0, {vocab_size}), got {show(key)}",
        )
        value = number(bias, f"{name}[{key}]")
        require(abs(value) <= limit, f"{name}[{key}] must be in [-{limit:g}, {limit:g}], got {value:g}")
        pairs.append((token, value))
    return tuple(pairs)


def neutral(body: Mapping[str, Any], name: str, neutrals: tuple[Any, ...], why: str = "") -> None:
    """Accept body[name] only at a value that changes nothing (null, false, empty, ...), else refuse naming it."""
    value = body.get(name)
    ok = any(
        value == n and type(value) is type(n) or (isinstance(n, float) and _same_number(value, n)) for n in neutrals
    )
    shown = ", ".join(["null", *(repr(n) for n in neutrals)])
    require(value is None or ok, f"{name}={show(value)} is not supported by this server (only {shown}){why}")


def _same_number(value: Any, target: float) -> bool:
    """value is a JSON number equal to target (1 and 1.0 alike)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == target
