"""A recording proxy: OpenAI's `/v1/chat/completions` in front of a token-level engine, for agent programs.

An agent written against the `openai` client is pointed at `base_url(key)` (`http://127.0.0.1:PORT/ep/KEY/v1`),
one key per episode. Each request goes through `serve model`'s own OpenAI handler (the same validation, chat
template rendering with `tools`, `<tool_call>` parsing and `stream: true`), over the caller's engine (TorchEngine
in process, or SGLang), and the engine's answer is recorded token for token: prompt ids, output ids, behaviour
log-probs and weight versions. `EpisodeRecord.link` turns an episode's calls into a Trajectory (docs/agents.md,
"Agent programs"): a call whose prompt extends the sequence so far continues it (the tokens between are the
environment's, loss mask 0), any other starts a new segment; calls that cannot be trained on are kept with the
reason and never linked.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import inspect
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from searchgym.agents.engines.types import GenerateRequest, GenerateResponse, InferenceEngine
from searchgym.agents.trajectory import Trajectory
from searchgym.core.http_session import BadRequest
from searchgym.serve.http import error_middleware, serve_app
from searchgym.serve.model.core import ServedModel
from searchgym.serve.model.openai_api import OpenAIAPI, error_body
from searchgym.serve.model.wire import json_response

DEFAULT_MODEL_NAME = "policy"
REWRITE = "history rewritten"  # a segment's end when the next prompt does not extend it
# a call's token record, not in its summary
TOKEN_ARRAYS = ("prompt_base", "prompt_tail", "output_ids", "logprobs", "versions")


@dataclass
class ProxyCall:
    """One chat request of an episode: what the engine was given and produced, and whether it may be trained on."""

    index: int
    # the prompt is kept as the tokens after an earlier call's prompt + output when it starts with them (an agent's
    # usual next turn), else whole: an episode's calls then hold its tokens about once, not once per turn
    prompt_base: ProxyCall | None = field(default=None, repr=False)
    prompt_tail: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = ""
    status: int = 0  # the HTTP status answered (0: the client left before an answer)
    untrainable: str = ""  # why the call is not trained on ("" when it is)
    streamed: bool = False
    turn: int = 0  # env turns taken when the call was made: the turn whose advantage its tokens get
    seconds: float = 0.0

    @property
    def trainable(self) -> bool:
        return not self.untrainable and bool(self.output_ids)

    @property
    def prompt_ids(self) -> list[int]:
        """The whole prompt the engine was given (rebuilt from the chain of earlier calls it extends)."""
        chain = [self]
        while chain[-1].prompt_base is not None:
            chain.append(chain[-1].prompt_base)
        ids: list[int] = []
        for call in reversed(chain[1:]):
            ids += call.prompt_tail
            ids += call.output_ids
        return ids + self.prompt_tail

    def summary(self) -> dict[str, Any]:
        """The call without its token arrays, for the trajectory's log (`Trajectory.proxy_calls`)."""
        # fields read one by one: asdict() would deep-copy the token arrays first (quadratic over a long episode)
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in TOKEN_ARRAYS}
        return {**row, "output_tokens": len(self.output_ids)}


@dataclass
class EpisodeRecord:
    """The calls one episode made through the proxy, in arrival order."""

    key: str
    calls: list[ProxyCall] = field(default_factory=list)
    turn: int = 0  # set by the workflow as the env takes turns
    generating: int = 0  # engine requests of this episode in flight
    last: ProxyCall | None = field(default=None, repr=False)  # the call answered last, and its prompt + output:
    last_ids: list[int] = field(default_factory=list, repr=False)  # the one whole sequence an episode keeps

    def keep_prompt(self, call: ProxyCall, prompt: list[int]) -> None:
        """Record `call`'s prompt (its output already set) as a tail after the last answered call's sequence when
        it starts with it, else whole."""
        full = self.last_ids
        if self.last is not None and len(prompt) >= len(full) and prompt[: len(full)] == full:
            call.prompt_base, call.prompt_tail = self.last, list(prompt[len(full) :])
        else:
            call.prompt_base, call.prompt_tail = None, list(prompt)
        call.prompt_tokens = len(prompt)
        self.last, self.last_ids = call, [*prompt, *call.output_ids]

    def engine_rid(self, call: ProxyCall) -> str:
        """The rid the engine sees: the episode's own while it has one call generating (the engine keeps its prefix
        for the next call, and SGLang keeps it on one server), a call's own when the agent runs calls in parallel."""
        return self.key if self.generating == 0 else f"{self.key}-{call.index}"

    def new_call(self) -> ProxyCall:
        call = ProxyCall(len(self.calls), turn=self.turn)
        self.calls.append(call)
        return call

    def link(self, traj: Trajectory) -> None:
        """Write the trainable calls' tokens into `traj`: a prompt extending the live segment continues it (the new
        tokens in between masked out), any other prompt starts a new segment; every call is logged in
        `traj.proxy_calls` with the segment it went to (None: not trained, and why in `untrainable`)."""
        for call in self.calls:
            row = call.summary()
            if not call.trainable:
                if not call.untrainable:
                    row["untrainable"] = "no output tokens"
                traj.proxy_calls.append({**row, "segment": None})
                continue
            prompt, live = call.prompt_ids, traj.input_ids
            if not live and not traj.segments:
                traj.extend(prompt, generated=False)
                traj.prompt_length = len(prompt)
            elif len(prompt) >= len(live) and prompt[: len(live)] == live:
                traj.extend(prompt[len(live) :], generated=False)
            else:
                traj.context_events.append(
                    {
                        "segment": traj.num_segments,
                        "turn": call.turn,
                        "policy": "agent",
                        "reason": REWRITE,
                        "call": call.index,
                    }
                )
                traj.start_segment(prompt, REWRITE)
            traj.extend(call.output_ids, generated=True, logprobs=call.logprobs, versions=call.versions)
            traj.run_turns.append(call.turn)
            traj.proxy_calls.append({**row, "segment": traj.num_segments - 1})


# the episode and call a handler is serving, for the engine wrapper below (context variables keep episodes apart)
_CALL: contextvars.ContextVar[tuple[EpisodeRecord, ProxyCall] | None] = contextvars.ContextVar(
    "searchgym_proxy_call", default=None
)


class RecordingEngine:
    """The served model's engine: delegates to the caller's engine and records each response into the call
    being handled (a context variable set by the proxy's handler, so concurrent episodes never mix)."""

    def __init__(self, engine: InferenceEngine, tokenizer: Any, context_length: int, reuse_prefix: bool = True) -> None:
        self.engine, self.tokenizer, self.reuse_prefix = engine, tokenizer, reuse_prefix
        self.max_context = context_length
        self.vocab_size = getattr(engine, "vocab_size", None) or len(tokenizer)
        # TorchEngine reports progress (streamed tokens as they come); other engines answer whole, in one last chunk
        self.streams = "progress" in inspect.signature(engine.agenerate).parameters

    @property
    def version(self) -> int:
        return self.engine.version

    async def agenerate(
        self, request: GenerateRequest, *, progress: Any = None, keep_prefix: bool = True
    ) -> GenerateResponse:
        """Generate under the episode's rid (the server's made-up one names no next call) and record the answer."""
        current = _CALL.get()
        if current is None:
            return await self._generate(request, progress, keep_prefix)
        record, call = current
        request = dataclasses.replace(request, rid=record.engine_rid(call))
        record.generating += 1
        try:
            response = await self._generate(request, progress, self.reuse_prefix)
        finally:
            record.generating -= 1
        call.output_ids = list(response.output_ids)
        record.keep_prompt(call, list(request.input_ids))
        call.logprobs, call.versions = list(response.logprobs), list(response.versions)
        call.finish_reason = response.finish_reason.type
        if response.finish_reason.type == "abort" and not call.untrainable:
            call.untrainable = "aborted by a pause (the client retries the request)"
        return response

    async def _generate(self, request: GenerateRequest, progress: Any, keep_prefix: bool) -> GenerateResponse:
        if self.streams:
            return await self.engine.agenerate(request, progress=progress, keep_prefix=keep_prefix)  # type: ignore[call-arg]
        return await self.engine.agenerate(request)

    async def pause(self) -> None:
        await self.engine.pause()

    async def resume(self) -> None:
        await self.engine.resume()

    async def abort(self, rid: str | None = None) -> int:
        abort = getattr(self.engine, "abort", None)
        return int(await abort(rid)) if abort is not None else 0

    async def update_weights(self, source: Any, version: int) -> None:
        await self.engine.update_weights(source, version)


class ProxyModel(ServedModel):
    """`serve model`'s served model with the run's sampling as the default of what a request leaves unset."""

    defaults: dict[str, Any] = {}

    async def json_body(self, request: web.Request, *, empty_ok: bool = False) -> tuple[dict, bool]:
        body, heavy = await super().json_body(request, empty_ok=empty_ok)
        if isinstance(body, dict):
            for key, value in self.defaults.items():
                if body.get(key) is None:
                    body[key] = value
        return body, heavy


def untrainable_reason(body: dict[str, Any], served: str, temperature: float | None = None) -> str:
    """Why a request, though answerable, must not be trained on ("" when it may)."""
    model = body.get("model")
    if isinstance(model, str) and model != served:
        return f"model {model!r} is not the policy served here ({served!r})"
    asked = body.get("temperature")
    if temperature is not None and isinstance(asked, (int, float)) and float(asked) != temperature:
        return (
            f"temperature={asked!r}: its behaviour log-probs are not the trained policy's "
            f"(the run samples and trains at temperature {temperature})"
        )
    if body.get("n") not in (None, 1):
        return f"n={body.get('n')!r}: several choices per call"
    if body.get("chat_template_kwargs"):
        return "chat_template_kwargs: a client-side template edit (the policy is trained on its own template)"
    return ""


class RecordingProxy:
    """OpenAI-compatible chat over `engine` on 127.0.0.1 (a free port), recording every call per episode key.

    Use `async with RecordingProxy(engine, tokenizer) as proxy:`, then `proxy.open_episode(key)`,
    `proxy.base_url(key)` for the agent's client, and `proxy.close_episode(key)` for its record. `temperature` is
    the run's: the default of a request that sets none, and a call sampled at another one is not trained on;
    `max_reply_tokens` the reply length of a request that sets none, and the most one may ask for.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        *,
        served_model_name: str = DEFAULT_MODEL_NAME,
        context_length: int | None = None,
        max_reply_tokens: int | None = None,
        temperature: float | None = None,
        reuse_prefix: bool = True,
    ) -> None:
        context = context_length or getattr(engine, "max_context", None) or 32_768
        self.engine = RecordingEngine(engine, tokenizer, context, reuse_prefix)
        self.served_model_name = served_model_name
        self.temperature = temperature
        self.model = ProxyModel(
            self.engine,  # type: ignore[arg-type]  # a RecordingEngine stands in for the engine
            model_path=served_model_name,
            served_model_name=served_model_name,
            context_length=context,
            max_reply_tokens=None if max_reply_tokens is None else min(max_reply_tokens, context - 1),
        )
        self.model.ready = True
        self.model.defaults = {} if temperature is None else {"temperature": temperature}
        self.api = OpenAIAPI(self.model)
        self.episodes: dict[str, EpisodeRecord] = {}
        self.host, self.port = "127.0.0.1", 0  # loopback only, on a free port: agent programs run on this machine
        self.url: str | None = None
        self._serving: contextlib.AbstractAsyncContextManager[str] | None = None

    # ---- lifecycle -------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        """The aiohttp app: the chat and model routes under /ep/{episode}/v1."""
        app = web.Application(client_max_size=64 * 2**20, middlewares=[error_middleware(_error)])
        app.router.add_post("/ep/{episode}/v1/chat/completions", self.chat)
        app.router.add_get("/ep/{episode}/v1/models", self.models)
        return app

    async def __aenter__(self) -> RecordingProxy:
        self._serving = serve_app(self.app(), self.host, self.port, shutdown_timeout=5.0)
        self.url = await self._serving.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._serving is not None:
            await self._serving.__aexit__(*exc)
            self._serving, self.url = None, None
        self.model.close()

    # ---- episodes --------------------------------------------------------------------------------------

    def open_episode(self, key: str | None = None) -> EpisodeRecord:
        """Start recording an episode under `key` (default: a fresh one); a key in use is refused."""
        key = key or uuid.uuid4().hex
        if key in self.episodes:
            raise ValueError(f"episode key {key!r} is already recording")
        if not key.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"episode key {key!r}: use letters, digits, '-' and '_' only (it is a URL path part)")
        self.episodes[key] = record = EpisodeRecord(key)
        return record

    def close_episode(self, key: str) -> EpisodeRecord:
        """Stop recording `key` (later calls under it are 404s) and return its record."""
        return self.episodes.pop(key)

    def base_url(self, key: str) -> str:
        """The `base_url` an `openai` client of episode `key` uses."""
        if self.url is None:
            raise RuntimeError("the proxy is not serving: use `async with RecordingProxy(...)`")
        return f"{self.url}/ep/{key}/v1"

    # ---- routes ----------------------------------------------------------------------------------------

    def _episode(self, request: web.Request) -> EpisodeRecord:
        key = request.match_info["episode"]
        record = self.episodes.get(key)
        if record is None:
            raise web.HTTPNotFound(text=f"no episode {key!r} is recording at this proxy (it ended, or never began)")
        return record

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """POST /ep/{episode}/v1/chat/completions: `serve model`'s handler, every call recorded in the episode."""
        record = self._episode(request)
        call = record.new_call()
        t0 = time.perf_counter()
        try:
            body, _ = await self.model.json_body(request)  # aiohttp keeps the bytes: the handler reads them again
            call.streamed = body.get("stream") is True
            call.untrainable = untrainable_reason(body, self.served_model_name, self.temperature)
            token = _CALL.set((record, call))
            try:
                response = await self.api.chat(request)
            finally:
                _CALL.reset(token)
        except web.HTTPException as e:
            call.status, call.untrainable = e.status, f"refused ({e.status}): {e.text or e.reason}"
            raise
        except asyncio.CancelledError:
            call.untrainable = call.untrainable or "the client left before the answer"
            raise
        except Exception as e:  # InvalidRequest and BadRequest become 400s in the middleware
            status = 400 if isinstance(e, BadRequest) else 500
            call.status, call.untrainable = status, f"refused ({status}): {e}"
            raise
        finally:
            call.seconds = time.perf_counter() - t0
        call.status = response.status
        if response.status >= 400 and not call.untrainable:
            call.untrainable = f"answered with status {response.status}"
        return response

    async def models(self, request: web.Request) -> web.Response:
        """GET /ep/{episode}/v1/models: the one served model."""
        self._episode(request)
        return await self.api.models(request)


def _error(request: web.Request, status: int, message: str) -> web.Response:
    return json_response(error_body(status, message), status=status)


@contextlib.asynccontextmanager
async def recording_proxy(engine: InferenceEngine, tokenizer: Any, **kwargs: Any) -> AsyncIterator[RecordingProxy]:
    """`RecordingProxy(engine, tokenizer, **kwargs)` serving for the block."""
    async with RecordingProxy(engine, tokenizer, **kwargs) as proxy:
        yield proxy
