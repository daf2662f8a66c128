"""`searchgym serve model`: a TorchEngine behind SGLang's native HTTP API (0.5.x) and OpenAI chat completions.

Every client path written for SGLang (SGLangEngine, RL frameworks, curl scripts) runs for real on a
CPU machine and in CI against this server. Field names, response shapes and status codes follow
SGLang's `http_server.py`; what SGLang supports and this server does not (streaming, n > 1, top
logprobs, input logprobs, penalties) is refused with a 400 that says so, never silently ignored.
Bad input is always a 400 with a message, never a 500.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import re
import reprlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import GenerateRequest, GenerateResponse, SamplingParams
from searchgym.envs.tools.http_session import BadRequest, check, error_middleware, json_body, serve_app, wait_for_signal

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 2**20
DEFAULT_MAX_RUNNING_REQUESTS = 256
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # what SGLang uses when a request leaves max_new_tokens unset
_GENERATE_FIELDS = frozenset({"text", "input_ids", "sampling_params", "rid", "return_logprob", "logprob_start_len",
                              "top_logprobs_num", "return_text_in_logprobs", "stream"})
_SAMPLING_FIELDS = frozenset({"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
                              "ignore_eos", "skip_special_tokens", "no_stop_trim", "frequency_penalty",
                              "presence_penalty", "repetition_penalty", "min_new_tokens", "n"})
# SGLang sampling fields the engine cannot honour: accepted only at the value that changes nothing.
_NEUTRAL_ONLY = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0,
                 "n": 1}
_PAUSE_MODES = ("abort", "retract", "in_place")
_LOAD_FORMATS = (None, "auto", "safetensors", "pt")  # what from_pretrained detects by itself
_show = reprlib.repr  # short reprs of client values for error messages


@dataclass(frozen=True)
class _Item:
    """One prompt of a /generate call, validated, with how to render its output."""

    request: GenerateRequest
    return_logprob: bool
    text_in_logprobs: bool
    skip_special_tokens: bool
    no_stop_trim: bool


def _int(value: Any, name: str) -> int:
    """A JSON integer (booleans are not integers here)."""
    check(isinstance(value, int) and not isinstance(value, bool), f"{name} must be an integer, got {_show(value)}")
    return value


def _number(value: Any, name: str) -> float:
    """A finite JSON number."""
    check(isinstance(value, (int, float)) and not isinstance(value, bool),
           f"{name} must be a number, got {_show(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    check(math.isfinite(number), f"{name} must be finite, got {_show(value)}")
    return number


def _bool(value: Any, name: str) -> bool:
    """A JSON boolean."""
    check(isinstance(value, bool), f"{name} must be true or false, got {_show(value)}")
    return value


def _or(value: Any, default: Any) -> Any:
    """The value, with null (or a missing key) meaning the default, as SGLang treats null."""
    return default if value is None else value


def _stop_strings(value: Any, name: str = "stop") -> tuple[str, ...]:
    """Stop strings: one string or a list of non-empty strings."""
    strings = [value] if isinstance(value, str) else value
    check(isinstance(strings, list) and all(isinstance(s, str) and s for s in strings),
           f"{name} must be a non-empty string or a list of them, got {_show(value)}")
    return tuple(strings)


def _error_response(request: web.Request, status: int, message: str) -> web.Response:
    """An error body in the caller's dialect: OpenAI's envelope under /v1, SGLang's ErrorResponse elsewhere."""
    if request.path.startswith("/v1/"):
        kind = "invalid_request_error" if status == 400 else "server_error"
        body: dict[str, Any] = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    else:
        body = {"object": "error", "message": message, "type": HTTPStatus(status).phrase, "param": None, "code": status}
    return web.json_response(body, status=status)


class _ModelServer:
    """The handlers and the state they share: the engine, the pause gate and request accounting."""

    def __init__(self, engine: TorchEngine, *, model_path: str, served_model_name: str | None,
                 context_length: int | None, max_running_requests: int) -> None:
        self.engine = engine
        self.model_path = model_path
        self.served_model_name = served_model_name or model_path
        self.vocab_size = engine.vocab_size
        self.context_length = context_length or engine.max_context
        self.max_running_requests = max_running_requests
        self.slots = asyncio.Semaphore(max_running_requests)
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.running = 0
        self.waiting = 0
        self.ready = False
        self.warmup_error: str | None = None
        self.created = int(time.time())

    # ---- generation core -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        """Run one request on the engine: wait while paused, then hold one of the bounded slots."""
        self.waiting += 1
        try:
            await self.resumed.wait()
            await self.slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            return await self.engine.agenerate(request)
        finally:
            self.running -= 1
            self.slots.release()

    def weight_version(self, response: GenerateResponse | None = None) -> str:
        """SGLang's weight_version label: the version that produced the last token, else the current one."""
        return str(response.versions[-1] if response and response.versions else self.engine.version)

    def prompt_ids(self, ids: Any) -> list[int]:
        """Validate one prompt of token ids against the vocabulary and the context length."""
        check(isinstance(ids, list) and len(ids) > 0,
               f"a prompt must be a non-empty list of token ids, got {_show(ids)}")
        for token in ids:
            check(isinstance(token, int) and not isinstance(token, bool) and 0 <= token < self.vocab_size,
                   f"token ids must be integers in [0, {self.vocab_size}), got {_show(token)}")
        check(len(ids) < self.context_length, f"The input ({len(ids)} tokens) is longer than the model's context "
                                               f"length ({self.context_length} tokens).")
        return ids

    def check_budget(self, prompt_len: int, max_new_tokens: int) -> None:
        """Refuse prompt + max_new_tokens beyond the context window, as SGLang does (no silent truncation)."""
        total = prompt_len + max_new_tokens
        check(total < self.context_length,
               f"Requested token count exceeds the model's maximum context length of {self.context_length} tokens. "
               f"You requested a total of {total} tokens: {prompt_len} tokens from the input messages and "
               f"{max_new_tokens} tokens for the completion.")

    def render_text(self, ids: list[int], response: GenerateResponse, skip_special_tokens: bool,
                    no_stop_trim: bool) -> str:
        """Output text as SGLang renders it: a matched stop token or stop string is trimmed unless no_stop_trim."""
        finish = response.finish_reason
        matched = finish.matched if finish.type == "stop" else None
        if isinstance(matched, int) and not no_stop_trim and ids:
            ids = ids[:-1]
        text = self.engine.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        if isinstance(matched, str) and (pos := text.find(matched)) >= 0:
            text = text[: pos + len(matched)] if no_stop_trim else text[:pos]
        return text

    # ---- /generate -----------------------------------------------------------------------------------

    def sampling(self, raw: Any) -> tuple[SamplingParams, bool, bool]:
        """SGLang sampling_params -> (SamplingParams, skip_special_tokens, no_stop_trim); unknown fields are a 400."""
        raw = {} if raw is None else raw
        check(isinstance(raw, dict), f"sampling_params must be an object, got {_show(raw)}")
        unknown = sorted(set(raw) - _SAMPLING_FIELDS)
        check(not unknown, f"unknown sampling_params field(s) {unknown}; supported: {sorted(_SAMPLING_FIELDS)}")
        for key, neutral in _NEUTRAL_ONLY.items():
            value = _number(_or(raw.get(key), neutral), key)
            check(value == neutral, f"{key}={value:g} is not supported by this server (only {neutral})")
        temperature = _number(_or(raw.get("temperature"), 1.0), "temperature")
        top_p = _number(_or(raw.get("top_p"), 1.0), "top_p")
        min_p = _number(_or(raw.get("min_p"), 0.0), "min_p")
        top_k = _int(_or(raw.get("top_k"), -1), "top_k")
        max_new_tokens = _int(_or(raw.get("max_new_tokens"), SGLANG_DEFAULT_MAX_NEW_TOKENS), "max_new_tokens")
        check(temperature >= 0, f"temperature must be a non-negative finite number, got {temperature}.")
        check(0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p}.")
        check(0 <= min_p <= 1, f"min_p must be in [0, 1], got {min_p}.")
        check(top_k == -1 or top_k >= 1, f"top_k must be -1 (disable) or at least 1, got {top_k}.")
        check(max_new_tokens >= 0, f"max_new_tokens must be at least 0, got {max_new_tokens}.")
        stop_ids = _or(raw.get("stop_token_ids"), [])
        check(isinstance(stop_ids, list), f"stop_token_ids must be a list of token ids, got {_show(stop_ids)}")
        params = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
            top_k=top_k, min_p=min_p,
            stop=_stop_strings(raw["stop"]) if raw.get("stop") is not None else (),
            stop_token_ids=tuple(_int(t, "stop_token_ids[]") for t in stop_ids),
            ignore_eos=_bool(_or(raw.get("ignore_eos"), False), "ignore_eos"))
        return (params, _bool(_or(raw.get("skip_special_tokens"), True), "skip_special_tokens"),
                _bool(_or(raw.get("no_stop_trim"), False), "no_stop_trim"))

    def prompts(self, body: dict) -> tuple[list[list[int]], bool]:
        """The prompts of a /generate body and whether it is a batch; text is tokenized like SGLang does."""
        has_ids, has_text = body.get("input_ids") is not None, body.get("text") is not None
        check(has_ids != has_text, "give exactly one of input_ids or text")
        if has_text:
            text = body["text"]
            if isinstance(text, str):
                return [self.prompt_ids(self.engine.tokenizer.encode(text))], False
            check(isinstance(text, list) and len(text) > 0 and all(isinstance(t, str) for t in text),
                   f"text must be a string or a non-empty list of strings, got {_show(text)}")
            return [self.prompt_ids(self.engine.tokenizer.encode(t)) for t in text], True
        ids = body["input_ids"]
        if isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids):
            return [self.prompt_ids(x) for x in ids], True
        return [self.prompt_ids(ids)], False

    def items(self, body: dict) -> tuple[list[_Item], bool]:
        """Validate a /generate body into one item per prompt (scalars broadcast over a batch, lists per prompt)."""
        unknown = sorted(set(body) - _GENERATE_FIELDS)
        check(not unknown, f"unknown /generate field(s) {unknown}; supported: {sorted(_GENERATE_FIELDS)}")
        check(not _or(body.get("stream"), False), "streaming not supported by this server; send stream: false")
        prompts, batch = self.prompts(body)
        n = len(prompts)
        per_item = {key: _per_item(body, key, n, batch) for key in
                    ("sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
                     "return_text_in_logprobs")}
        items = []
        for i, (ids, rid) in enumerate(zip(prompts, _rids(body.get("rid"), n, batch))):
            sampling, skip_special, no_trim = self.sampling(per_item["sampling_params"][i])
            self.check_budget(len(ids), sampling.max_new_tokens)
            return_logprob = _bool(_or(per_item["return_logprob"][i], False), "return_logprob")
            start = _int(_or(per_item["logprob_start_len"][i], -1), "logprob_start_len")
            check(not return_logprob or start == -1 or start >= len(ids),
                   "input token logprobs are not supported by this server: send logprob_start_len -1 (output only)")
            top = _int(_or(per_item["top_logprobs_num"][i], 0), "top_logprobs_num")
            check(top == 0, "top_logprobs_num > 0 is not supported by this server: the engine returns only the "
                             "sampled token's logprob")
            items.append(_Item(GenerateRequest(ids, sampling, rid), return_logprob,
                               _bool(_or(per_item["return_text_in_logprobs"][i], False),
                                     "return_text_in_logprobs"), skip_special, no_trim))
        return items, batch

    def output(self, item: _Item, response: GenerateResponse) -> dict:
        """One SGLang /generate result: text, output_ids and meta_info."""
        ids = list(response.output_ids)
        meta: dict[str, Any] = {
            "id": item.request.rid, "finish_reason": response.finish_reason.to_sglang(),
            "prompt_tokens": len(item.request.input_ids), "completion_tokens": len(ids), "cached_tokens": 0,
            "weight_version": self.weight_version(response)}
        if item.return_logprob:
            texts = (self.engine.tokenizer.batch_decode([[t] for t in ids]) if item.text_in_logprobs
                     else [None] * len(ids))
            meta["output_token_logprobs"] = [[lp, t, s] for lp, t, s in zip(response.logprobs, ids, texts)]
        text = self.render_text(ids, response, item.skip_special_tokens, item.no_stop_trim)
        return {"text": text, "output_ids": ids, "meta_info": meta}

    async def handle_generate(self, request: web.Request) -> web.Response:
        """POST /generate: one prompt or a batch, answered once generation ends (or is aborted)."""
        items, batch = self.items(await json_body(request))
        responses = await asyncio.gather(*(self.generate(item.request) for item in items))
        outputs = [self.output(item, response) for item, response in zip(items, responses)]
        return web.json_response(outputs if batch else outputs[0])

    # ---- control endpoints -----------------------------------------------------------------------------

    async def handle_abort_request(self, request: web.Request) -> web.Response:
        """POST /abort_request {rid, abort_all}: in-flight requests return with finish_reason abort."""
        body = await json_body(request)
        abort_all = _bool(_or(body.get("abort_all"), False), "abort_all")
        rid = _or(body.get("rid"), "")
        check(isinstance(rid, str), f"rid must be a string, got {_show(rid)}")
        check(abort_all or rid != "", "give a rid or abort_all: true")
        await self.engine.abort(None if abort_all else rid)
        return web.Response(status=200)

    async def handle_pause(self, request: web.Request) -> web.Response:
        """POST /pause_generation {mode}: abort returns in-flight requests; retract and in_place keep them."""
        mode = _or((await json_body(request, empty_ok=True)).get("mode"), "abort")
        check(mode in _PAUSE_MODES, f"Invalid mode: {_show(mode)}. Expected one of {list(_PAUSE_MODES)}.")
        self.resumed.clear()
        await self.engine.pause()
        if mode == "abort":
            await self.engine.abort(None)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def handle_continue(self, request: web.Request) -> web.Response:
        """POST /continue_generation: paused requests go on, waiting ones are admitted."""
        await self.engine.resume()
        self.resumed.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def handle_update_weights(self, request: web.Request) -> web.Response:
        """POST /update_weights_from_disk: load a checkpoint dir; on failure the old weights keep serving."""
        body = await json_body(request)
        path = body.get("model_path")
        check(isinstance(path, str) and path != "", f"model_path must be a non-empty string, got {_show(path)}")
        check(body.get("load_format") in _LOAD_FORMATS,
               f"load_format must be one of {list(_LOAD_FORMATS)}, got {_show(body.get('load_format'))}")
        abort_all = _bool(_or(body.get("abort_all_requests"), False), "abort_all_requests")
        _bool(_or(body.get("flush_cache"), True), "flush_cache")  # validated only: there is no prefix cache to flush
        version = _version_label(body.get("weight_version"))
        aborted = await self.engine.abort(None) if abort_all else 0
        try:
            await self.engine.update_weights(path, self.engine.version if version is None else version)
        except Exception as e:  # a bad checkpoint of any kind is the caller's problem, reported, not a crash
            message = (f"Failed to update weights: {type(e).__name__}: {e}. "
                       f"The server keeps serving weight version {self.weight_version()}.")
            return web.json_response({"success": False, "message": message, "num_paused_requests": aborted},
                                     status=400)
        message = "Succeeded to update model weights."
        if version is not None:
            message += f" Weight version updated to {version}."
        return web.json_response({"success": True, "message": message, "num_paused_requests": aborted})

    async def handle_flush_cache(self, request: web.Request) -> web.Response:
        """/flush_cache: 400 while requests are running, like SGLang (the engine keeps no cache across requests)."""
        if self.running:
            return web.Response(status=400, text=f"Cache not flushed: {self.running} requests are running.\n")
        return web.Response(text="Cache flushed.\n")

    # ---- health and info ---------------------------------------------------------------------------------

    async def handle_health(self, request: web.Request) -> web.Response:
        """GET /health: the HTTP server is up."""
        return web.Response(status=200)

    async def handle_health_generate(self, request: web.Request) -> web.Response:
        """GET /health_generate: 200 once the engine has generated a token, 503 before and while shutting down."""
        if self.ready:
            return web.Response(status=200)
        return web.Response(status=503, text=self.warmup_error or "warming up\n")

    async def handle_model_info(self, request: web.Request) -> web.Response:
        """GET /get_model_info."""
        return web.json_response({"model_path": self.model_path, "tokenizer_path": self.model_path,
                                  "is_generation": True, "preferred_sampling_params": None,
                                  "weight_version": self.weight_version()})

    async def handle_server_info(self, request: web.Request) -> web.Response:
        """GET /get_server_info: settings, load and the engine's own stats."""
        return web.json_response({
            "model_path": self.model_path, "tokenizer_path": self.model_path,
            "served_model_name": self.served_model_name, "context_length": self.context_length,
            "max_running_requests": self.max_running_requests, "weight_version": self.weight_version(),
            "paused": not self.resumed.is_set(), "running_requests": self.running, "waiting_requests": self.waiting,
            "internal_states": [self.engine.stats()]})

    async def handle_models(self, request: web.Request) -> web.Response:
        """GET /v1/models (OpenAI)."""
        return web.json_response({"object": "list", "data": [{
            "id": self.served_model_name, "object": "model", "created": self.created, "owned_by": "searchgym",
            "root": self.served_model_name, "max_model_len": self.context_length}]})

    # ---- /v1/chat/completions -------------------------------------------------------------------------------

    def chat_prompt(self, messages: Any) -> list[int]:
        """Messages -> the tokenizer's chat template with the assistant turn opened."""
        check(isinstance(messages, list) and len(messages) > 0, "messages must be a non-empty list")
        rendered = [_chat_message(m) for m in messages]
        try:
            ids = self.engine.tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=True,
                                                            return_dict=False)
        except Exception as e:  # template code raising on odd roles or content is bad input
            raise BadRequest(f"the chat template rejected the messages: {type(e).__name__}: {e}") from None
        return self.prompt_ids(list(ids))

    def chat_sampling(self, body: dict, prompt_len: int) -> SamplingParams:
        """OpenAI chat fields -> SamplingParams; unset max tokens means the rest of the context window."""
        check(not _or(body.get("stream"), False), "streaming not supported by this server; send stream: false")
        check(_int(_or(body.get("n"), 1), "n") == 1, f"n must be 1 on this server, got {body.get('n')}")
        check(not _or(body.get("logprobs"), False), "logprobs are not supported on /v1/chat/completions here; "
                                                  "use /generate with return_logprob")
        check(not body.get("tools"), "tools are not supported on this server")
        for key in ("frequency_penalty", "presence_penalty"):
            check(_number(_or(body.get(key), 0.0), key) == 0, f"{key} is not supported by this server (only 0)")
        if body.get("seed") is not None:
            _int(body["seed"], "seed")  # accepted: OpenAI's seed is best effort; the engine's RNG is seeded once
        limit = _or(body.get("max_completion_tokens"), body.get("max_tokens"))
        max_tokens = self.context_length - prompt_len - 1 if limit is None else _int(limit, "max_tokens")
        check(max_tokens >= 1, f"max_tokens must be at least 1, got {max_tokens}")
        self.check_budget(prompt_len, max_tokens)
        temperature = _number(_or(body.get("temperature"), 1.0), "temperature")
        top_p = _number(_or(body.get("top_p"), 1.0), "top_p")
        check(0 <= temperature <= 2, f"temperature must be in [0, 2], got {temperature}")
        check(0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p}")
        stop = _stop_strings(body["stop"]) if body.get("stop") is not None else ()
        return SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop)

    async def handle_chat(self, request: web.Request) -> web.Response:
        """POST /v1/chat/completions: non-streaming, n = 1; the stop string is not part of the content."""
        body = await json_body(request)
        prompt = self.chat_prompt(body.get("messages"))
        sampling = self.chat_sampling(body, len(prompt))
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        response = await self.generate(GenerateRequest(prompt, sampling, rid))
        if response.finish_reason.type == "abort":  # paused for a weight update: OpenAI clients retry 503s
            error = _error_response(request, 503, f"generation was aborted ({response.finish_reason.message}); retry")
            error.headers["Retry-After"] = "1"
            return error
        content = self.render_text(list(response.output_ids), response, skip_special_tokens=True, no_stop_trim=False)
        completion = len(response.output_ids)
        return web.json_response({
            "id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") if isinstance(body.get("model"), str) else self.served_model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None,
                         "finish_reason": "length" if response.finish_reason.type == "length" else "stop"}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion,
                      "total_tokens": len(prompt) + completion}})

    # ---- lifecycle -----------------------------------------------------------------------------------------

    async def warm_up(self) -> None:
        """Generate one token so /health_generate turns 200 only when generation really works."""
        try:
            await self.generate(GenerateRequest([0], SamplingParams(max_new_tokens=1, temperature=0.0),
                                                f"HEALTH_CHECK_{time.time()}"))
        except Exception as e:  # reported by /health_generate, which stays 503
            logger.exception("warm-up generation failed")
            self.warmup_error = f"warm-up generation failed: {type(e).__name__}: {e}\n"
            return
        self.ready = True


def _per_item(body: dict, key: str, n: int, batch: bool) -> list[Any]:
    """body[key] for each of n prompts: a list gives one value per prompt in a batch, anything else is shared."""
    value = body.get(key)
    if batch and isinstance(value, list):
        check(len(value) == n, f"{key} has {len(value)} entries for {n} prompts")
        return value
    return [value] * n


def _rids(value: Any, n: int, batch: bool) -> list[str]:
    """Request ids: given (a string, or a list for a batch) or fresh uuid4 hex strings."""
    if value is None:
        return [uuid.uuid4().hex for _ in range(n)]
    rids = value if batch else [value]
    check(isinstance(rids, list) and len(rids) == n and all(isinstance(r, str) and r for r in rids),
           f"rid must be a non-empty string (a list of {n} for a batch), got {_show(value)}")
    return rids


def _version_label(value: Any) -> int | None:
    """weight_version: SGLang takes any string; this server's engine counts versions, so it must be an integer."""
    if value is None:
        return None
    check(isinstance(value, (str, int)) and not isinstance(value, bool) and re.fullmatch(r"-?[0-9]+", str(value)),
           f"weight_version must be an integer (as a string), got {_show(value)}")
    return int(value)


def _chat_message(message: Any) -> dict[str, str]:
    """One OpenAI chat message as {role, content} text; content parts must be text."""
    check(isinstance(message, dict) and isinstance(message.get("role"), str),
           f"each message must be an object with a string role, got {_show(message)}")
    content = message.get("content")
    if isinstance(content, list):
        check(all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content),
               "only text content parts are supported")
        content = "".join(p["text"] for p in content)
    check(content is None or isinstance(content, str), f"message content must be a string, got {_show(content)}")
    return {"role": message["role"], "content": content or ""}


def create_app(engine: TorchEngine, *, model_path: str, served_model_name: str | None = None,
               context_length: int | None = None, max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS,
               client_max_size: int = MAX_REQUEST_BYTES) -> web.Application:
    """The aiohttp application serving `engine` (a TorchEngine) with SGLang's routes; warms up on startup."""
    server = _ModelServer(engine, model_path=model_path, served_model_name=served_model_name,
                          context_length=context_length, max_running_requests=max_running_requests)
    app = web.Application(client_max_size=client_max_size, middlewares=[error_middleware(_error_response, http_errors=False)])
    app.router.add_route("*", "/generate", server.handle_generate)
    app.router.add_post("/abort_request", server.handle_abort_request)
    app.router.add_post("/pause_generation", server.handle_pause)
    app.router.add_post("/continue_generation", server.handle_continue)
    app.router.add_post("/update_weights_from_disk", server.handle_update_weights)
    app.router.add_route("*", "/flush_cache", server.handle_flush_cache)
    app.router.add_get("/health", server.handle_health)
    app.router.add_get("/health_generate", server.handle_health_generate)
    app.router.add_get("/get_model_info", server.handle_model_info)
    app.router.add_get("/get_server_info", server.handle_server_info)
    app.router.add_get("/v1/models", server.handle_models)
    app.router.add_post("/v1/chat/completions", server.handle_chat)
    app.on_startup.append(lambda _: _start_warm_up(app, server))
    app.on_shutdown.append(lambda _: _stop_warm_up(app, server))
    return app


_WARM_UP = web.AppKey("warm_up", asyncio.Task)


async def _start_warm_up(app: web.Application, server: _ModelServer) -> None:
    """Start the warm-up generation in the background; the server answers /health_generate 503 meanwhile."""
    app[_WARM_UP] = asyncio.create_task(server.warm_up())


async def _stop_warm_up(app: web.Application, server: _ModelServer) -> None:
    """Report not-ready from now on and stop a warm-up still running."""
    server.ready = False
    app[_WARM_UP].cancel()


@contextlib.asynccontextmanager
async def serving(engine: TorchEngine, *, model_path: str, host: str = "127.0.0.1", port: int = 0,
                  **app_kwargs: Any) -> AsyncIterator[str]:
    """Serve `engine` (see create_app) on host:port for the duration of the block; yields the base URL."""
    async with serve_app(create_app(engine, model_path=model_path, **app_kwargs), host, port) as url:
        yield url


def run_server(model_dir: str | os.PathLike, host: str = "127.0.0.1", port: int = 30000, *,
               served_model_name: str | None = None, context_length: int | None = None,
               max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS, **engine_kwargs: Any) -> None:
    """Load `model_dir` into a TorchEngine and serve it until SIGINT or SIGTERM (blocking); then shut down cleanly."""
    app_kwargs = {"served_model_name": served_model_name, "context_length": context_length,
                  "max_running_requests": max_running_requests}
    asyncio.run(_serve_until_signal(model_dir, host, port, engine_kwargs, app_kwargs))


async def _serve_until_signal(model_dir: str | os.PathLike, host: str, port: int, engine_kwargs: dict,
                              app_kwargs: dict) -> None:
    """The body of run_server: signal handlers, engine, serve until a signal, close."""
    engine = TorchEngine(model_dir, **engine_kwargs)
    try:
        async with serving(engine, model_path=str(model_dir), host=host, port=port, **app_kwargs) as url:
            logger.info("serving %s at %s", model_dir, url)
            await wait_for_signal()
            logger.info("shutting down")
    finally:
        await engine.close()


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags, named like sglang.launch_server's where they mean the same."""
    parser = argparse.ArgumentParser(prog="python -m searchgym.agents.engines.model_server",
                                     description="Serve a Hugging Face causal LM with SGLang's HTTP API "
                                                 "(CPU or one GPU).")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--max-running-requests", type=int, default=DEFAULT_MAX_RUNNING_REQUESTS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """`python -m searchgym.agents.engines.model_server --model-path DIR --port N`."""
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_server(args.model_path, args.host, args.port, served_model_name=args.served_model_name,
               context_length=args.context_length, max_running_requests=args.max_running_requests,
               device=args.device, seed=args.random_seed)


if __name__ == "__main__":
    main()
