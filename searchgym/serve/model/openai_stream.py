"""OpenAI's streamed `/v1/chat/completions` and `/v1/completions` (`stream: true`) as server-sent events.

Chat sends `chat.completion.chunk`s: the first delta holds the role (and empty content), then content
pieces as tokens arrive (streaming.TextDeltas: they concatenate to the non-streamed content), then, when
the reply holds Hermes `<tool_call>` blocks that parse into tool calls (the same parser as the
non-streamed route), one `tool_calls` delta with each call's index, id, type, name and arguments, and a
last chunk with an empty delta and the finish reason. Completions send `text_completion` chunks with
`text` pieces the same way. `stream_options.include_usage` adds `"usage": null` to every chunk and a
final chunk with no choices and the usage; SGLang's `continuous_usage_stats` gives every chunk the usage
so far. Then `data: [DONE]`. A generation aborted by a pause (a 503 when not streamed) or a failure
after the answer has begun is an `{"error": {...}}` event, which the `openai` client raises.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from searchgym.agents.chat import ChatResult
from searchgym.agents.engines import fields as f
from searchgym.agents.engines.detokenize import output_text
from searchgym.agents.engines.fields import require, show
from searchgym.agents.engines.types import GenerateRequest, GenerateResponse
from searchgym.serve.model.core import ServedModel
from searchgym.serve.model.streaming import Partial, Stream, TextDeltas, open_sse, send, send_done

STREAM_OPTIONS = ("include_usage", "continuous_usage_stats", "include_obfuscation")


@dataclass(frozen=True)
class StreamSettings:
    """What a request asked of its stream."""

    include_usage: bool = False
    continuous_usage: bool = False


def stream_settings(body: Mapping[str, Any]) -> StreamSettings | None:
    """`stream` and `stream_options` checked; None when the request is not streamed."""
    stream = f.boolean(f.or_default(body.get("stream"), False), "stream")
    options = body.get("stream_options")
    if options is None:
        return StreamSettings() if stream else None
    require(stream, "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
    require(isinstance(options, dict), f"stream_options must be an object, got {show(options)}")
    unknown = sorted(set(options) - set(STREAM_OPTIONS))
    require(not unknown, f"stream_options: unrecognized field(s) {unknown}; supported: {list(STREAM_OPTIONS)}")
    f.neutral(options, "include_obfuscation", (False,), " (this server pads no chunks)")
    return StreamSettings(
        include_usage=f.boolean(f.or_default(options.get("include_usage"), False), "stream_options.include_usage"),
        continuous_usage=f.boolean(
            f.or_default(options.get("continuous_usage_stats"), False), "stream_options.continuous_usage_stats"
        ),
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Chunks:
    """Writes one streamed completion's chunks (id, object, created and model fixed; usage as asked)."""

    def __init__(
        self,
        response: web.StreamResponse,
        rid: str,
        kind: str,
        model_name: str,
        prompt_tokens: int,
        settings: StreamSettings,
    ) -> None:
        self.response, self.settings, self.prompt_tokens = response, settings, prompt_tokens
        self.head = {
            "id": rid,
            "object": kind,
            "created": int(time.time()),
            "model": model_name,
            "system_fingerprint": None,
        }

    async def choice(self, fields: dict[str, Any], completion_tokens: int) -> None:
        """A chunk with one choice (index 0) made of `fields` and finish_reason null unless given."""
        choice = {"index": 0, **fields, "logprobs": None}
        choice.setdefault("finish_reason", None)
        chunk: dict[str, Any] = {**self.head, "choices": [choice]}
        if self.settings.continuous_usage:
            chunk["usage"] = usage(self.prompt_tokens, completion_tokens)
        elif self.settings.include_usage:
            chunk["usage"] = None
        await send(self.response, chunk)

    async def usage(self, completion_tokens: int) -> None:
        """The last chunk of an `include_usage` stream: no choices, the usage."""
        if self.settings.include_usage:
            await send(
                self.response, {**self.head, "choices": [], "usage": usage(self.prompt_tokens, completion_tokens)}
            )

    async def error(self, status: int, message: str) -> None:
        kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
        await send(self.response, {"error": {"message": message, "type": kind, "param": None, "code": status}})


def _aborted(response: GenerateResponse) -> str:
    return f"generation was aborted ({response.finish_reason.message}); retry"


def _tool_call_deltas(result: ChatResult) -> list[dict[str, Any]]:
    """OpenAI's streamed `delta.tool_calls`: each call whole, with its index."""
    return [{"index": i, **call.to_openai()} for i, call in enumerate(result.tool_calls)]


async def stream_chat(
    model: ServedModel,
    http: web.Request,
    request: GenerateRequest,
    *,
    model_name: str,
    tools: list[dict[str, Any]] | None,
    parallel_tool_calls: bool,
    settings: StreamSettings,
) -> web.StreamResponse:
    """A validated chat completion, streamed."""
    prompt = list(request.input_ids)
    async with Stream(model, request, keep_prefix=False) as stream:  # no rid to continue
        response = await open_sse(http)
        chunks = Chunks(response, request.rid, "chat.completion.chunk", model_name, len(prompt), settings)
        deltas = TextDeltas(model.tokenizer, request.sampling.stop, tools=bool(tools))
        try:
            await chunks.choice({"delta": {"role": "assistant", "content": ""}}, 0)
            async for event in stream.events(http):
                if isinstance(event, Partial):
                    if piece := deltas.push(event.output_ids):
                        await chunks.choice({"delta": {"content": piece}}, len(event.output_ids))
                    continue
                n = len(event.output_ids)
                if event.finish_reason.type == "abort":
                    await chunks.error(503, _aborted(event))
                    break
                result = model.chat.result(prompt, event, tools, parallel_tool_calls=parallel_tool_calls)
                if rest := deltas.finish(result.content):
                    await chunks.choice({"delta": {"content": rest}}, n)
                if result.tool_calls:
                    await chunks.choice({"delta": {"tool_calls": _tool_call_deltas(result)}}, n)
                await chunks.choice({"delta": {}, "finish_reason": result.finish_reason}, n)
                await chunks.usage(n)
            await send_done(response)
        except ConnectionError:  # the client left: the generation is cancelled on the way out
            pass
        except Exception as e:  # noqa: BLE001 -- the status line is gone: report in the stream
            await _report(chunks, response, e)
    return response


async def stream_completion(
    model: ServedModel,
    http: web.Request,
    request: GenerateRequest,
    *,
    model_name: str,
    echo: bool,
    settings: StreamSettings,
) -> web.StreamResponse:
    """A validated text completion, streamed."""
    prompt = list(request.input_ids)
    async with Stream(model, request, keep_prefix=False) as stream:  # no rid to continue
        response = await open_sse(http)
        chunks = Chunks(response, request.rid, "text_completion", model_name, len(prompt), settings)
        deltas = TextDeltas(model.tokenizer, request.sampling.stop)
        try:
            if echo:
                await chunks.choice({"text": model.tokenizer.decode(prompt, skip_special_tokens=True)}, 0)
            async for event in stream.events(http):
                if isinstance(event, Partial):
                    if piece := deltas.push(event.output_ids):
                        await chunks.choice({"text": piece}, len(event.output_ids))
                    continue
                n = len(event.output_ids)
                if event.finish_reason.type == "abort":
                    await chunks.error(503, _aborted(event))
                    break
                text = output_text(model.tokenizer, list(event.output_ids), event.finish_reason)
                await chunks.choice({"text": deltas.finish(text), "finish_reason": event.finish_reason.type}, n)
                await chunks.usage(n)
            await send_done(response)
        except ConnectionError:
            pass
        except Exception as e:  # noqa: BLE001
            await _report(chunks, response, e)
    return response


async def _report(chunks: Chunks, response: web.StreamResponse, error: Exception) -> None:
    """An error event and the end of the stream (unless the client is gone too)."""
    with contextlib.suppress(ConnectionError):
        await chunks.error(500, f"internal error: {type(error).__name__}: {error}")
        await send_done(response)
