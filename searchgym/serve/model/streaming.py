"""Streaming for both APIs: one generation as a sequence of events, server-sent events, and text deltas.

A `Stream` runs a request through the served model and yields its cumulative `Partial` after each engine
step, then the final `GenerateResponse`. A client that goes away (its connection closes, or the handler is
cancelled) cancels the generation: the engine drops the row at its next step and the rid is freed, so a
disconnect never leaks a request. `TextDeltas` turns growing token ids into text pieces that never need
taking back (OpenAI's deltas concatenate to the final content): text that might still become a stop
string, or the start of a `<tool_call>` block, is held until the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from searchgym.agents.engines.types import GenerateRequest, GenerateResponse
from searchgym.serve.model.core import ServedModel
from searchgym.serve.model.wire import dumps

DISCONNECT_POLL_S = 0.5  # how often a stream with nothing to send checks that its client is still there
TOOL_CALL_OPEN = "<tool_call>"


@dataclass
class Partial:
    """The tokens of an unfinished generation so far (append-only; read it before the next await)."""

    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


def client_gone(request: web.Request) -> bool:
    """Whether the client of `request` has closed its connection."""
    transport = request.transport
    return transport is None or transport.is_closing()


def progress_callback(partial: Partial, changed: asyncio.Event) -> Callable[[list[int], list[float], list[int]], None]:
    """The engine's progress callback that appends new tokens to `partial` and sets `changed`."""

    def progress(ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        partial.output_ids += ids
        partial.logprobs += logprobs
        partial.versions += versions
        changed.set()

    return progress


class Stream:
    """A generation started for streaming: its rid is claimed at once, so a duplicate is a 400 before any byte."""

    def __init__(self, model: ServedModel, request: GenerateRequest, *, keep_prefix: bool = True) -> None:
        self.model, self.request = model, request
        self.partial, self._changed = Partial(), asyncio.Event()
        self.task = model.start(request, progress_callback(self.partial, self._changed), keep_prefix=keep_prefix)

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        """Cancel the generation if it is still running (the client left, or the handler failed)."""
        if not self.task.done():
            self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def events(self, http: web.Request) -> AsyncIterator[Partial | GenerateResponse]:
        """Partials after each step with new tokens, then the final response; stops early if the client left."""
        while True:
            waiter = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({self.task, waiter}, timeout=DISCONNECT_POLL_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
            if self.task.done():
                if self.task.cancelled():  # cancelled from elsewhere (the server stopping): an error, not an end
                    raise RuntimeError("the generation was cancelled before it finished")
                yield self.task.result()
                return
            if client_gone(http):
                return
            if self._changed.is_set():
                self._changed.clear()
                yield self.partial


# ---- server-sent events -----------------------------------------------------------------------------------------


async def open_sse(request: web.Request) -> web.StreamResponse:
    """Start a `text/event-stream` answer (status 200; headers go out now)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def send(response: web.StreamResponse, data: Any) -> None:
    """One `data: {json}` event (strict JSON: a non-finite number is null)."""
    await response.write(b"data: " + dumps(data, ensure_ascii=False).encode() + b"\n\n")


async def send_done(response: web.StreamResponse) -> None:
    """The closing `data: [DONE]` event, and the end of the body."""
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()


# ---- text deltas ------------------------------------------------------------------------------------------------


class TextDeltas:
    """Text pieces of a growing generation that concatenate to its final text, never taking anything back.

    Each push decodes the whole output (skipping special tokens, an incomplete last character held) and
    sends what is new, except a tail that could still turn into a stop string (the final text cuts it). With
    `tools`, the text from a `<tool_call>` (or what could start one) is held too, and so are leading and
    trailing whitespace, since a parsed reply's content is stripped; the rest comes with `finish`.
    """

    def __init__(self, tokenizer: Any, stops: tuple[str, ...] = (), tools: bool = False) -> None:
        self.tokenizer = tokenizer
        self.holds = tuple(stops) + ((TOOL_CALL_OPEN,) if tools else ())
        self.tools = tools
        self.sent = ""

    def push(self, ids: list[int]) -> str:
        """The new piece of text for the output so far (may be empty)."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")
        safe = len(text)
        for hold in self.holds:
            found = text.find(hold)
            if found >= 0:
                safe = min(safe, found)
            for k in range(min(len(hold) - 1, len(text)), 0, -1):
                if text.endswith(hold[:k]):
                    safe = min(safe, len(text) - k)
                    break
        if self.tools:
            if text[:1].isspace():
                safe = 0  # a parsed reply's content is stripped: decide at the end
            while safe > 0 and text[safe - 1].isspace():
                safe -= 1
        if safe <= len(self.sent) or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent) : safe], text[:safe]
        return piece

    def finish(self, final: str | None) -> str:
        """The rest of the final text (content) after what was sent."""
        final = final or ""
        if final.startswith(self.sent):
            return final[len(self.sent) :]
        common = len(self.sent)  # a decode that changed earlier text: cannot happen with byte-level BPE
        while common and not final.startswith(self.sent[:common]):
            common -= 1
        return final[common:]
