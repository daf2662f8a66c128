"""JSON in and out of the model server: bodies parsed off the event loop when big, numbers always valid JSON.

A big body (a long prompt, a batch of token ids) costs real CPU to parse and to validate; the server does
that work in its request threads (`ServedModel.offload`), so one client's megabytes never hold up another
client's `/health`. Answers are written with `allow_nan=False`: a non-finite float (a NaN logprob from broken
weights, an infinite one from a token of probability 0) is written as `null`, as SGLang's orjson writes it,
never as the bare `NaN` or `Infinity` that strict JSON parsers reject.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

from aiohttp import web

OFFLOAD_BYTES = 16 * 1024  # bodies above this are parsed, validated and tokenized in a request thread


def finite(value: Any) -> Any:
    """`value` with every non-finite float (NaN, +-Infinity) replaced by None, containers copied."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """Strict JSON text of `value`: non-finite floats become null (only the rare answer holding one pays the walk)."""
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError:
        return json.dumps(finite(value), allow_nan=False, **kwargs)


json_response = functools.partial(web.json_response, dumps=dumps)


def encode(value: Any) -> bytes:
    """The strict JSON bytes of an answer (what a request thread computes for a big one)."""
    return dumps(value).encode()


def raw_json_response(body: bytes, status: int = 200) -> web.Response:
    """A JSON answer from bytes already encoded by `encode`."""
    return web.Response(body=body, status=status, content_type="application/json")


def text_chars(value: Any) -> int:
    """Characters in all the strings of a JSON value (keys included): what tokenizing or templating it reads."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total
