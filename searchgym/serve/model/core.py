"""The served model: a TorchEngine and the state both APIs share.

Requests wait at a pause gate (and, while memory is released, at the memory gate), then hold one of
`max_running_requests` slots. Request ids in flight are unique (SGLang refuses a duplicate `rid`). Only
requests whose rid the client chose keep their keys and values in the engine's prefix cache for a next
turn (`keep_prefix`): a rid the server makes up names no later turn, so its entry could only evict a
real conversation. `Limits` bound what one request may ask for, and CPU-heavy request work (tokenizing,
big bodies and answers) runs in `offload`'s threads, off the event loop. Weight versions are SGLang's
string labels ("v2-step7" is as valid as "3") over the engine's integer versions: a numeric label
becomes that integer (so in-process observers and our own clients read versions as numbers), any other
label the next free one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from aiohttp import web

from searchgym.agents.chat import EngineChat, context_overflow
from searchgym.agents.engines.fields import require, show
from searchgym.agents.engines.torch_engine import Progress, TorchEngine
from searchgym.agents.engines.types import GenerateRequest, GenerateResponse, SamplingParams
from searchgym.serve.http import parse_json, read_body
from searchgym.serve.limits import PROMPT_CHARS_PER_TOKEN
from searchgym.serve.model.memory import MemoryOccupation, memory_tags
from searchgym.serve.model.wire import OFFLOAD_BYTES

logger = logging.getLogger(__name__)
T = TypeVar("T")

PAUSE_MODES = ("abort", "retract", "in_place")
REQUEST_THREADS = 4  # threads for request work too big for the event loop (tokenizers release the GIL)


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server; each is a 400 naming the field when exceeded.

    `max_prompt_chars`: characters of one text prompt (`text`, `prompt`, or chat `messages` and `tools`),
    refused before any tokenizing. Token prompts must be shorter than `context_length`, and the prompt plus
    the reply's `max_new_tokens` (`max_tokens`) must fit in it too; `max_reply_tokens` caps a reply further.
    """

    context_length: int
    max_prompt_chars: int
    max_reply_tokens: int

    @staticmethod
    def check(context_length: Any = None, max_prompt_chars: Any = None, max_reply_tokens: Any = None) -> None:
        """Check the settings given (None: unset), each error a ValueError naming its key and flag."""
        for value, name, least in (
            (context_length, "context_length (--context-length)", 2),
            (max_prompt_chars, "max_prompt_chars (--max-prompt-chars)", 1),
            (max_reply_tokens, "max_reply_tokens (--max-reply-tokens)", 1),
        ):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")

    @classmethod
    def of(
        cls, context_length: int, max_prompt_chars: int | None = None, max_reply_tokens: int | None = None
    ) -> Limits:
        """The limits for these settings (None: the default), checked."""
        cls.check(context_length, max_prompt_chars, max_reply_tokens)
        return cls(
            context_length,
            PROMPT_CHARS_PER_TOKEN * context_length if max_prompt_chars is None else max_prompt_chars,
            context_length - 1 if max_reply_tokens is None else max_reply_tokens,
        )


_NUMERIC = re.compile(r"-?[0-9]{1,18}")  # longer digit strings are plain labels (int() refuses > 4300 digits)


class WeightLabels:
    """SGLang's string weight_version labels for the engine's integer versions."""

    def __init__(self, version: int, label: str) -> None:
        self._labels = {version: label}

    def label(self, version: int) -> str:
        """The label of an engine version (its number, if it was never labelled)."""
        return self._labels.get(version, str(version))

    def version_for(self, label: str) -> int:
        """The engine version a new label gets: the label's own number if free, else the next unused one."""
        if _NUMERIC.fullmatch(label) and self._labels.get(int(label), label) == label:
            return int(label)
        for version, known in self._labels.items():
            if known == label:
                return version
        return max(self._labels) + 1

    def assign(self, version: int, label: str) -> None:
        """Record that `version` is called `label`."""
        self._labels[version] = label

    def spans(self, versions: list[int], current: int) -> list[dict[str, Any]]:
        """SGLang's meta_info.weight_versions: [{version, start, end}] runs over the generated tokens."""
        if not versions:
            return [{"version": self.label(current), "start": 0, "end": 0}]
        spans: list[dict[str, Any]] = []
        for i, version in enumerate(versions):
            label = self.label(version)
            if spans and spans[-1]["version"] == label:
                spans[-1]["end"] = i + 1
            else:
                spans.append({"version": label, "start": i, "end": i + 1})
        return spans


class ServedModel:
    """The engine behind the server, gated by pause and bounded slots; `chat` is in-process chat through the gate."""

    def __init__(
        self,
        engine: TorchEngine,
        *,
        model_path: str,
        served_model_name: str | None = None,
        context_length: int | None = None,
        max_running_requests: int = 256,
        weight_version: str | None = None,
        max_prompt_chars: int | None = None,
        max_reply_tokens: int | None = None,
    ) -> None:
        if (
            not isinstance(max_running_requests, int)
            or isinstance(max_running_requests, bool)
            or max_running_requests < 1
        ):
            raise ValueError(
                f"max_running_requests (--max-running-requests) must be an integer >= 1, got {max_running_requests!r}"
            )
        self.limits = Limits.of(
            engine.max_context if context_length is None else context_length, max_prompt_chars, max_reply_tokens
        )
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_path = model_path
        self.served_model_name = served_model_name or model_path
        self.vocab_size = engine.vocab_size
        self.context_length = self.limits.context_length
        self.max_context = self.context_length  # what EngineChat reads off an engine
        self.max_running_requests = max_running_requests
        self.labels = WeightLabels(engine.version, weight_version or str(engine.version))
        self.slots = asyncio.Semaphore(max_running_requests)
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.pause_mode: str | None = None
        self.in_flight: set[str] = set()
        self.running = 0
        self.waiting = 0
        self.memory = MemoryOccupation(engine)
        self.ready = False
        self.warmup_error: str | None = None
        self.created = int(time.time())
        self.chat = EngineChat(self, self.tokenizer, context_length=self.context_length)  # type: ignore[arg-type]  # it only calls agenerate
        self.tokenizer.encode("settle")  # a tokenizer.json with padding/truncation is reset on the first call, which
        # needs exclusive access: done here, before request threads share the tokenizer ("Already borrowed" else)
        self._threads = ThreadPoolExecutor(max_workers=REQUEST_THREADS, thread_name_prefix="model-server-request")

    @property
    def version(self) -> int:
        return self.engine.version

    # ---- generation ----------------------------------------------------------------------------------

    async def agenerate(self, request: GenerateRequest, *, keep_prefix: bool = True) -> GenerateResponse:
        """One request through the gate (its rid must not be in flight)."""
        return (await self.run([request], keep_prefix=keep_prefix))[0]

    def start(
        self, request: GenerateRequest, progress: Progress | None = None, *, keep_prefix: bool = True
    ) -> asyncio.Task:
        """Claim the request's rid now (a duplicate is a 400 before anything starts) and generate it in a task.

        `progress` gets the new tokens after each engine step (streaming). Cancelling the task drops the
        request from the engine's batch and frees its rid.
        """
        self.claim([request.rid])

        async def run() -> GenerateResponse:
            try:
                return await self._generate(request, progress, keep_prefix)
            finally:
                self.in_flight.discard(request.rid)

        return asyncio.ensure_future(run())

    async def run(self, requests: list[GenerateRequest], *, keep_prefix: bool = True) -> list[GenerateResponse]:
        """Generate all `requests` concurrently; a rid already in flight, or twice in the batch, is a 400.

        `keep_prefix=False` (a rid the server made up): the engine keeps no prefix of them for a next turn.
        """
        self.claim([r.rid for r in requests])
        try:
            return list(await asyncio.gather(*(self._generate(r, keep_prefix=keep_prefix) for r in requests)))
        finally:
            self.in_flight.difference_update(r.rid for r in requests)

    def claim(self, rids: Iterable[str]) -> None:
        """Register request ids as in flight, refusing duplicates as SGLang does ('' is anonymous)."""
        named = [rid for rid in rids if rid]
        seen: set[str] = set()
        for rid in named:
            require(rid not in self.in_flight and rid not in seen, f"Duplicate request ID detected: {rid}")
            seen.add(rid)
        self.in_flight.update(named)

    async def _generate(
        self, request: GenerateRequest, progress: Progress | None = None, keep_prefix: bool = True
    ) -> GenerateResponse:
        """Wait while paused or released, then hold one of the bounded slots while the engine generates."""
        self.waiting += 1
        try:
            while not (self.resumed.is_set() and self.memory.resumed.is_set()):
                await self.resumed.wait()
                await self.memory.resumed.wait()
            await self.slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            return await self.engine.agenerate(request, progress=progress, keep_prefix=keep_prefix)
        finally:
            self.running -= 1
            self.slots.release()

    async def model_pass(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(model, device, *args)` on the engine's own worker thread between its steps (its lock held, so no
        step or weight update runs meanwhile), counted as a running request so memory is not released under it."""
        while not self.memory.resumed.is_set():
            await self.memory.resumed.wait()
        self.running += 1
        try:
            engine = self.engine
            engine._ensure_started()
            async with engine._lock:  # the engine's step lock: the weights stay as they are for the pass
                result = await engine._in_worker(fn, engine.model, engine.device, *args)
            return cast(T, result)
        finally:
            self.running -= 1

    def prompt_ids(self, ids: Any, field: str = "input_ids") -> list[int]:
        """Validate one prompt of token ids against the context length (first: it is cheap) and the vocabulary."""
        require(
            isinstance(ids, list) and len(ids) > 0,
            f"{field}: a prompt must be a non-empty list of token ids, got {show(ids)}",
        )
        require(
            len(ids) < self.context_length,
            f"{field}: The input ({len(ids)} tokens) is longer than the model's "
            f"context length ({self.context_length} tokens).",
        )
        for token in ids:
            require(
                isinstance(token, int) and not isinstance(token, bool) and 0 <= token < self.vocab_size,
                f"{field}: token ids must be integers in [0, {self.vocab_size}), got {show(token)}",
            )
        return ids

    def check_chars(self, chars: int, field: str) -> None:
        """Refuse a text prompt of more characters than --max-prompt-chars, before tokenizing it."""
        limit = self.limits.max_prompt_chars
        require(
            chars <= limit,
            f"{field}: the prompt holds {chars} characters; this server takes at most {limit} "
            f"per prompt (--max-prompt-chars)",
        )

    def encode(self, text: str, field: str) -> list[int]:
        """A text prompt's token ids, as SGLang tokenizes it, within the character and context limits.

        `tokenizer.encode` goes through the fast tokenizer's batch path, which releases the GIL while it works
        (the Rust backend's own `encode` holds it throughout), so a request thread tokenizing leaves the event
        loop free; it is called with one fixed setting (no truncation or padding), so calls from several
        threads never contend for the Rust tokenizer ("Already borrowed").
        """
        self.check_chars(len(text), field)
        return self.prompt_ids(list(self.tokenizer.encode(text)), field)

    def fit_reply(self, prompt_len: int, max_new_tokens: int, field: str, *, explicit: bool = True) -> int:
        """The reply's token budget. One the client set (`explicit`) above --max-reply-tokens, or overflowing the
        context with the prompt, is refused as SGLang refuses it; a default one is cut to what fits, as SGLang's
        scheduler does when max_new_tokens is unset."""
        if not explicit:
            return max(0, min(max_new_tokens, self.limits.max_reply_tokens, self.context_length - 1 - prompt_len))
        require(
            prompt_len + max_new_tokens < self.context_length,
            context_overflow(self.context_length, prompt_len, max_new_tokens) + f" (field: {field})",
        )
        limit = self.limits.max_reply_tokens
        require(
            max_new_tokens <= limit,
            f"{field}={max_new_tokens} is above this server's limit of {limit} tokens per reply (--max-reply-tokens)",
        )
        return max_new_tokens

    async def offload(self, fn: Callable[..., T], *args: Any, heavy: bool = True) -> T:
        """`fn(*args)` in a request thread when `heavy` (so the event loop keeps answering), else right here."""
        if not heavy:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def json_body(self, request: web.Request, *, empty_ok: bool = False) -> tuple[dict, bool]:
        """The request's JSON object, parsed in a request thread when the body is big, and whether it was."""
        raw = await read_body(request)  # a 408 past the server's body timeout: a stalled body holds nothing forever
        heavy = len(raw) > OFFLOAD_BYTES
        return await self.offload(functools.partial(parse_json, raw, empty_ok=empty_ok), heavy=heavy), heavy

    def close(self) -> None:
        """Stop the request threads (work already handed to them finishes)."""
        self._threads.shutdown(wait=False)

    # ---- control ---------------------------------------------------------------------------------------

    async def pause(self, mode: str) -> None:
        """Hold new requests; 'abort' ends those in flight with their partial tokens, the others keep them."""
        require(mode in PAUSE_MODES, f"Invalid mode: {show(mode)}. Expected one of {list(PAUSE_MODES)}.")
        self.resumed.clear()
        self.pause_mode = mode
        await self.engine.pause()
        if mode == "abort":
            await self.engine.abort(None)

    async def resume(self) -> None:
        """Paused requests go on, waiting ones are admitted."""
        await self.engine.resume()
        self.pause_mode = None
        self.resumed.set()

    def can_flush(self) -> bool:
        """SGLang flushes only with nothing running, or after a 'retract' pause (running requests were retracted)."""
        return self.running == 0 or self.pause_mode == "retract"

    async def update_weights(self, path: str | dict[str, Any], label: str | None) -> None:
        """Load a checkpoint dir (or a state dict); with a label, later tokens carry it. On failure nothing changes."""
        version = self.engine.version if label is None else self.labels.version_for(label)
        await self.engine.update_weights(path, version)
        if label is not None:
            self.labels.assign(version, label)

    async def set_label(self, label: str) -> None:
        """Relabel the current weights (SGLang's /update_weight_version): later tokens carry `label`."""
        version = self.labels.version_for(label)
        if version != self.engine.version:  # the engine counts versions: give it the same weights under the new one
            await self.engine.update_weights(self.engine.model.state_dict(), version)
        self.labels.assign(version, label)

    def weight_version(self, response: GenerateResponse | None = None) -> str:
        """The label of the version that produced the last token, else the current one."""
        if response is not None and response.versions:
            return self.labels.label(response.versions[-1])
        return self.labels.label(self.engine.version)

    def weight_versions(self, response: GenerateResponse) -> list[dict[str, Any]]:
        """meta_info.weight_versions of a response."""
        return self.labels.spans(list(response.versions), self.engine.version)

    def stats(self) -> dict[str, Any]:
        """Load and settings for /server_info."""
        return {
            "paused": not self.resumed.is_set(),
            "pause_mode": self.pause_mode,
            "running_requests": self.running,
            "waiting_requests": self.waiting,
            "released_memory": self.memory.released_tags(),
            "internal_states": [self.engine.stats()],
        }

    # ---- memory occupation ------------------------------------------------------------------------------

    async def release_memory(self, tags: list[str] | None) -> None:
        """SGLang's /release_memory_occupation: only when idle (requests held by a pause may wait); new ones wait."""
        tags = memory_tags(tags)
        require(
            self.running == 0 and (self.waiting == 0 or not self.resumed.is_set()),
            f"release_memory_occupation should be called only when server is idle "
            f"({self.running} running, {self.waiting} waiting requests)",
        )
        await self.memory.release(tags)

    async def resume_memory(self, tags: list[str] | None) -> None:
        """SGLang's /resume_memory_occupation: restore what was released; held requests go on once all is back."""
        await self.memory.resume(tags)

    # ---- lifecycle --------------------------------------------------------------------------------------

    async def warm_up(self) -> None:
        """Check the weights are finite and generate one token, so /health_generate and /ready turn 200 only when
        generation really works."""
        bad = await self.offload(self.engine.nonfinite_weights)
        if bad:
            self.warmup_error = f"the weights hold non-finite values (NaN or Infinity): {bad[:5]}\n"
            logger.error("warm-up refused: %s", self.warmup_error.strip())
            return
        try:
            await self.agenerate(
                GenerateRequest([0], SamplingParams(max_new_tokens=1, temperature=0.0), f"HEALTH_CHECK_{time.time()}"),
                keep_prefix=False,
            )
        except Exception as e:  # reported by /health_generate, which stays 503
            logger.exception("warm-up generation failed")
            self.warmup_error = f"warm-up generation failed: {type(e).__name__}: {e}\n"
            return
        self.ready = True
