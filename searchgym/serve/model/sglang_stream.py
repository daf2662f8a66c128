"""SGLang's streamed `/generate` (`stream: true`): server-sent events as SGLang 0.5.23 sends them by default.

Each event is `data: {json}` holding the whole output so far, not a delta (SGLang's default, without
`--incremental-streaming-output`): cumulative `text` and `output_ids`, and `meta_info` with
`finish_reason` null until the last event, whose body is exactly the non-streamed answer. A partial's
text holds back an incomplete last character. `sampling_params.stream_interval` (tokens between events,
default 1) is honoured. The stream ends with `data: [DONE]`; a failure after the answer has begun is an
event `{"error": {message, type, code, retryable}}` before it. A streamed batch is refused: one prompt
per streamed request. The client leaving cancels the generation (streaming.Stream).
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from aiohttp import web

from searchgym.agents.engines import fields as f
from searchgym.agents.engines.fields import InvalidRequest, require
from searchgym.agents.engines.types import FinishReason, GenerateResponse
from searchgym.serve.model.core import ServedModel
from searchgym.serve.model.streaming import Partial, Stream, open_sse, send, send_done

_RUNNING = FinishReason("running")  # not SGLang's: a partial's meta_info.finish_reason is replaced by null


class NativeOutput(Protocol):
    """What this module needs of the native API: the served model, the extra log-probs an item asks for, and how
    it renders one result."""

    model: ServedModel

    async def extras(self, item: Any, response: GenerateResponse) -> Any: ...

    def output(self, item: Any, response: GenerateResponse, started: float, extras: Any = None) -> dict[str, Any]: ...


async def partial_output(api: NativeOutput, item: Any, partial: Partial, started: float) -> dict[str, Any]:
    """One intermediate event: the result so far (with the top and input log-probs of the tokens so far, where
    asked: one scoring pass per event), finish_reason null, no incomplete last character."""
    response = GenerateResponse(list(partial.output_ids), list(partial.logprobs), list(partial.versions), _RUNNING)
    out = api.output(item, response, started, await api.extras(item, response))
    out["text"] = out["text"].rstrip("\ufffd")
    out["meta_info"]["finish_reason"] = None
    return out


def stream_interval(body: dict) -> int:
    """Tokens between events: sampling_params.stream_interval, default (and at least) 1."""
    params = body.get("sampling_params")
    value = params.get("stream_interval") if isinstance(params, dict) else None
    return max(1, f.integer(f.or_default(value, 1), "stream_interval"))


async def stream_generate(
    api: NativeOutput,
    body: dict,
    items: list[Any],
    batch: bool,
    request: web.Request,
    started: float,
    *,
    keep_prefix: bool = True,
) -> web.StreamResponse:
    """Answer a validated `/generate` body with `stream: true` as server-sent events (`keep_prefix`: as
    ServedModel.run)."""
    require(not batch, "stream: true takes one prompt per request on this server; send a batch without stream")
    (item,) = items
    interval = stream_interval(body)
    async with Stream(api.model, item.request, keep_prefix=keep_prefix) as stream:
        response = await open_sse(request)
        sent = 0
        try:
            async for event in stream.events(request):
                if isinstance(event, GenerateResponse):
                    await send(response, api.output(item, event, started, await api.extras(item, event)))
                elif len(event.output_ids) - sent >= interval:
                    sent = len(event.output_ids)
                    await send(response, await partial_output(api, item, event, started))
            await send_done(response)
        except ConnectionError:  # the client left: the generation is cancelled on the way out
            pass
        except Exception as e:  # noqa: BLE001 -- the status line is gone: report in the stream, as SGLang does
            bad_request = isinstance(e, InvalidRequest)  # else the server failed: a client may retry
            with contextlib.suppress(ConnectionError):
                await send(
                    response,
                    {
                        "error": {
                            "message": f"{type(e).__name__}: {e}",
                            "type": "invalid_request_error" if bad_request else "server_error",
                            "code": 400 if bad_request else 500,
                            "retryable": not bad_request,
                        }
                    },
                )
                await send_done(response)
    return response
