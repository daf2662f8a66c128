"""The value coercions SGLang 0.5.23 applies to the bodies of its control and weight-update routes.

SGLang's `http_server.py` declares those bodies as its `io_struct` request types (`InitWeightsUpdateGroupReqInput`,
`UpdateWeightsFromDistributedReqInput`, `UpdateWeightFromDiskReqInput`, `PauseGenerationReqInput`,
`ContinueGenerationReqInput`, `AbortReq`, `UpdateWeightVersionReqInput`), which FastAPI validates with
pydantic in its lax mode. Lax mode turns an int-like string into an int, so AReaL's `"master_port": "13219"`
(it sends `str(port)`) is a 200 there; a server that wants a JSON integer answers 400 and AReaL cannot use
it. These functions accept what pydantic's lax `int` and `bool` accept, and nothing else: strings stay
strict (pydantic does not turn 5 into "5"), and a refused value is an `InvalidRequest` (a 400) naming the
field. `/generate` is not judged here: SGLang's msgspec contract for it is strict (`engines/fields.py`).
"""

from __future__ import annotations

import math
import re
from typing import Any

from searchgym.agents.engines.fields import InvalidRequest, require, show

# pydantic-core's int-from-string grammar: surrounding Unicode whitespace, a sign, digits with single
# underscores between them, and an optional fraction of zeros ("13219", " -5 ", "1_000", "7.00")
_INT_TEXT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
# Unicode White_Space, which pydantic-core (Rust's str::trim) strips; Python's str.strip() strips more
_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_I64 = 2.0**63


def lax_integer(value: Any, name: str) -> int:
    """An int as SGLang's request validation takes it: an int, a bool, an integral float, or an int-like string."""
    if isinstance(value, int):  # bool included: pydantic's lax int takes true as 1
        return int(value)
    if isinstance(value, float):
        require(
            math.isfinite(value) and value.is_integer() and -_I64 < value < _I64,
            f"{name} must be an integer, got {show(value)}",
        )
        return int(value)
    if isinstance(value, str):
        text = value.strip(_SPACE)
        require(
            len(text) <= 64 and _INT_TEXT.fullmatch(text) is not None, f"{name} must be an integer, got {show(value)}"
        )
        number = int(text.partition(".")[0])
        require(-_I64 < number < _I64, f"{name} must be an integer, got {show(value)}")
        return number
    raise InvalidRequest(f"{name} must be an integer, got {show(value)}")


def lax_boolean(value: Any, name: str) -> bool:
    """A bool as SGLang's request validation takes it: a bool, 0 or 1, or a word such as "true", "no", "on"."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise InvalidRequest(f"{name} must be true or false, got {show(value)}")


def strings(value: Any, name: str) -> list[str]:
    """A list of strings (SGLang's `List[str]`: no coercion of the items)."""
    require(
        isinstance(value, list) and all(isinstance(v, str) for v in value),
        f"{name} must be a list of strings, got {show(value)}",
    )
    return list(value)


def shapes(value: Any, name: str) -> list[list[int]]:
    """Tensor shapes (SGLang's `List[List[int]]`, each size a lax int), every size non-negative."""
    require(
        isinstance(value, list) and all(isinstance(shape, list) for shape in value),
        f"{name} must be a list of lists of integers, got {show(value)}",
    )
    out = [[lax_integer(size, name) for size in shape] for shape in value]
    require(all(size >= 0 for shape in out for size in shape), f"{name} has a negative size: {show(value)}")
    return out
