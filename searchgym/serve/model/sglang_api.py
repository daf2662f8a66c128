"""SGLang 0.5.23's native HTTP API over the served model: `/generate` and the control, health and info routes.

Field sets are those of SGLang's generated JSON contract (`sglang/api/v1/api_types.py`): unknown
top-level `/generate` keys are ignored, as SGLang ignores them; unknown `sampling_params` keys are a
400, as SGLang refuses them. Every known field is honoured, or changes nothing here (routing,
scheduling, cache and metrics hints, on one engine without a prefix cache), or is accepted only at
its neutral value (null, false, empty) and refused with a 400 naming it otherwise. Routes, bodies and
status codes follow SGLang's `http_server.py`; the `/get_*` names are its deprecated aliases.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from searchgym.agents.engines import fields as f
from searchgym.agents.engines.detokenize import output_text
from searchgym.agents.engines.fields import require, show
from searchgym.agents.engines.types import GenerateRequest, GenerateResponse, SamplingParams
from searchgym.serve.model.core import ServedModel
from searchgym.serve.model.lax_fields import lax_boolean, lax_integer, shapes, strings
from searchgym.serve.model.logprob_extras import LogprobAsk, LogprobExtras, check_ask, render, score
from searchgym.serve.model.sglang_stream import stream_generate
from searchgym.serve.model.wire import encode, json_response, raw_json_response

OFFLOAD_TOKENS = 4096  # answers with more output tokens than this are detokenized and encoded in a request thread

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when a request leaves max_new_tokens unset
LOAD_FORMATS = (None, "auto", "safetensors", "pt")  # what from_pretrained detects by itself

# ---- /generate fields --------------------------------------------------------------------------------------

HONOURED = (
    "text",
    "input_ids",
    "sampling_params",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "stream",
    "return_prompt_token_ids",
)


def _str_or_list(value: Any, name: str) -> None:
    require(
        isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value),
        f"{name} must be a string or a list of strings, got {show(value)}",
    )


def _labels(value: Any, name: str) -> None:
    require(
        isinstance(value, dict) and all(isinstance(v, str) for v in value.values()),
        f"{name} must map names to strings, got {show(value)}",
    )


# hints that change nothing on one engine without a prefix cache: their type is checked, then they are accepted
INERT = {
    "priority": f.integer,
    "routing_key": f.string,
    "extra_key": _str_or_list,
    "cache_salt": _str_or_list,
    "custom_labels": _labels,
}


def _null(value: Any) -> bool:
    return value is None


def _nulls(value: Any) -> bool:
    """null, or a list of nulls (one per prompt of a batch; an empty list too)."""
    return value is None or isinstance(value, list) and all(v is None for v in value)


def _falses(value: Any) -> bool:
    """null, false, or a list of falses."""
    return value is None or value is False or isinstance(value, list) and all(v is False for v in value)


def _empty(value: Any) -> bool:
    """null or an empty list."""
    return value is None or value == []


def _zero(value: Any) -> bool:
    """the integer 0 (the only DP rank, or no offset)."""
    return isinstance(value, int) and not isinstance(value, bool) and value == 0


# fields this server cannot honour: accepted only at a value that asks for nothing (of the contract's type)
NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "token_ids_logprob": _empty,
    "return_hidden_states": _falses,
    "bootstrap_host": _nulls,
    "bootstrap_port": _nulls,
    "bootstrap_room": _nulls,
    "bootstrap_pair_key": _nulls,
    "decode_tp_size": _nulls,
    "routed_dp_rank": lambda v: v is None or _zero(v),
    "disagg_prefill_dp_rank": _null,
    "image_data": _nulls,
    "mm_hashes": _empty,
    "video_data": _nulls,
    "audio_data": _nulls,
    "require_reasoning": lambda v: v is None or v is False,
    "lora_path": _nulls,
    "session_params": _null,
    "kv_hints": _nulls,
    "max_thinking_tokens": _null,
    "session_id": _null,
    "custom_logit_processor": _nulls,
    "images_config": _null,
    "routed_experts_start_len": _zero,  # the contract has no null for it
    "return_sampling_mask": _falses,
    "modalities": _nulls,
}

SAMPLING_HONOURED = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "logit_bias",
    "sampling_seed",
    "stream_interval",  # read by sglang_stream
    "custom_params",
)  # read only by a custom logit processor, and none is allowed: no effect
SAMPLING_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "stop_regex": ("", []),
    "frequency_penalty": (0.0,),
    "presence_penalty": (0.0,),
    "repetition_penalty": (1.0,),
    "min_new_tokens": (0,),
    "n": (1,),
    "json_schema": (),
    "regex": (),
    "ebnf": (),
    "structural_tag": (),
    "beam_width": (),
    "watermark": ({"enabled": False},),
    "choice": ([],),
}
SAMPLING_FIELDS = (*SAMPLING_HONOURED, *SAMPLING_NEUTRAL)


@dataclass(frozen=True)
class Item:
    """One prompt of a /generate call, validated, with how to render its output."""

    request: GenerateRequest
    return_logprob: bool
    text_in_logprobs: bool
    return_prompt_ids: bool
    skip_special_tokens: bool
    no_stop_trim: bool
    spaces_between_special_tokens: bool
    ask: LogprobAsk = LogprobAsk()  # top_logprobs_num and logprob_start_len (logprob_extras)


def check_fields(body: dict) -> None:
    """Refuse non-neutral values of fields this server cannot honour, and ill-typed hints."""
    for name, is_neutral in NEUTRAL.items():
        if name in body:
            require(
                is_neutral(body[name]),
                f"{name}={show(body[name])} is not supported by this server (send null or leave it out)",
            )
    for name, check in INERT.items():
        if body.get(name) is not None:
            check(body[name], name)
    if "return_prompt_token_ids" in body:  # SGLang's contract has no null for it
        f.boolean(body["return_prompt_token_ids"], "return_prompt_token_ids")


def sampling(raw: Any, vocab_size: int) -> tuple[SamplingParams, bool, bool, bool]:
    """sampling_params -> (SamplingParams, skip_special_tokens, no_stop_trim, spaces_between_special_tokens)."""
    raw = f.or_default(raw, {})
    require(isinstance(raw, dict), f"sampling_params must be an object, got {show(raw)}")
    unknown = sorted(set(raw) - set(SAMPLING_FIELDS))
    require(not unknown, f"unknown sampling_params field(s) {unknown}; SGLang's are {list(SAMPLING_FIELDS)}")
    for name, neutrals in SAMPLING_NEUTRAL.items():
        f.neutral(raw, name, neutrals)
    temperature = f.number(f.or_default(raw.get("temperature"), 1.0), "temperature")
    top_p = f.number(f.or_default(raw.get("top_p"), 1.0), "top_p")
    min_p = f.number(f.or_default(raw.get("min_p"), 0.0), "min_p")
    top_k = f.integer(f.or_default(raw.get("top_k"), -1), "top_k")
    max_new_tokens = f.integer(f.or_default(raw.get("max_new_tokens"), DEFAULT_MAX_NEW_TOKENS), "max_new_tokens")
    require(temperature >= 0, f"temperature must be a non-negative finite number, got {temperature}.")
    require(0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p}.")
    require(0 <= min_p <= 1, f"min_p must be in [0, 1], got {min_p}.")
    require(top_k == -1 or top_k >= 1, f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    require(max_new_tokens >= 0, f"max_new_tokens must be at least 0, got {max_new_tokens}.")
    if raw.get("stream_interval") is not None:
        f.integer(raw["stream_interval"], "stream_interval")
    seed = raw.get("sampling_seed")
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        stop=f.stop_strings(raw.get("stop")),
        stop_token_ids=f.token_ids(raw.get("stop_token_ids"), "stop_token_ids", vocab_size),
        ignore_eos=f.boolean(f.or_default(raw.get("ignore_eos"), False), "ignore_eos"),
        seed=None if seed is None else f.integer(seed, "sampling_seed"),
        logit_bias=f.logit_bias(raw.get("logit_bias"), "logit_bias", vocab_size),
    )
    return (
        params,
        f.boolean(f.or_default(raw.get("skip_special_tokens"), True), "skip_special_tokens"),
        f.boolean(f.or_default(raw.get("no_stop_trim"), False), "no_stop_trim"),
        f.boolean(f.or_default(raw.get("spaces_between_special_tokens"), True), "spaces_between_special_tokens"),
    )


def _per_item(body: dict, key: str, n: int, batch: bool) -> list[Any]:
    """body[key] for each of n prompts: a list gives one value per prompt in a batch, anything else is shared."""
    value = body.get(key)
    if batch and isinstance(value, list):
        require(len(value) == n, f"{key} has {len(value)} entries for {n} prompts")
        return value
    return [value] * n


def _rids(value: Any, n: int, batch: bool) -> list[str]:
    """Request ids: given (a string, or a list for a batch) or fresh uuid4 hex strings."""
    if value is None:
        return [uuid.uuid4().hex for _ in range(n)]
    rids = value if batch else [value]
    require(
        isinstance(rids, list) and len(rids) == n and all(isinstance(r, str) and r for r in rids),
        f"rid must be a non-empty string (a list of {n} for a batch), got {show(value)}",
    )
    return rids


class SGLangAPI:
    """The native routes' handlers over one served model."""

    def __init__(self, model: ServedModel) -> None:
        self.model = model
        self.weight_groups: dict[str, tuple[Any, str]] = {}  # group_name -> (process group, backend)

    # ---- /generate --------------------------------------------------------------------------------------

    def prompts(self, body: dict) -> tuple[list[list[int]], bool]:
        """The prompts of a /generate body and whether it is a batch; text is tokenized as SGLang does, each
        prompt's characters checked first (so an oversized one costs no tokenizing)."""
        has_ids, has_text = body.get("input_ids") is not None, body.get("text") is not None
        require(has_ids != has_text, "give exactly one of input_ids or text")
        model = self.model
        if has_text:
            text = body["text"]
            if isinstance(text, str):
                return [model.encode(text, "text")], False
            require(
                isinstance(text, list) and len(text) > 0 and all(isinstance(t, str) for t in text),
                f"text must be a string or a non-empty list of strings, got {show(text)}",
            )
            for i, t in enumerate(text):
                model.check_chars(len(t), f"text[{i}]")
            return [model.encode(t, f"text[{i}]") for i, t in enumerate(text)], True
        ids = body["input_ids"]
        if isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids):
            return [model.prompt_ids(x, f"input_ids[{i}]") for i, x in enumerate(ids)], True
        return [model.prompt_ids(ids)], False

    def items(self, body: dict) -> tuple[list[Item], bool]:
        """Validate a /generate body into one item per prompt (scalars broadcast over a batch, lists per prompt)."""
        check_fields(body)
        f.boolean(f.or_default(body.get("stream"), False), "stream")
        prompts, batch = self.prompts(body)
        n = len(prompts)
        per_item = {
            key: _per_item(body, key, n, batch)
            for key in ("sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num")
        }
        text_in_logprobs = f.boolean(
            f.or_default(body.get("return_text_in_logprobs"), False), "return_text_in_logprobs"
        )
        prompt_ids_out = f.boolean(f.or_default(body.get("return_prompt_token_ids"), False), "return_prompt_token_ids")
        items = []
        for i, (ids, rid) in enumerate(zip(prompts, _rids(body.get("rid"), n, batch), strict=True)):
            params, skip_special, no_trim, spaces = sampling(per_item["sampling_params"][i], self.model.vocab_size)
            given = per_item["sampling_params"][i]
            explicit = isinstance(given, dict) and given.get("max_new_tokens") is not None
            params = dataclasses.replace(
                params,
                max_new_tokens=self.model.fit_reply(
                    len(ids), params.max_new_tokens, "sampling_params.max_new_tokens", explicit=explicit
                ),
            )
            return_logprob = f.boolean(f.or_default(per_item["return_logprob"][i], False), "return_logprob")
            start = f.integer(f.or_default(per_item["logprob_start_len"][i], -1), "logprob_start_len")
            top = f.integer(f.or_default(per_item["top_logprobs_num"][i], 0), "top_logprobs_num")
            ask = check_ask(return_logprob, start, top, len(ids), self.model.vocab_size, params.max_new_tokens)
            items.append(
                Item(
                    GenerateRequest(ids, params, rid),
                    return_logprob,
                    text_in_logprobs,
                    prompt_ids_out,
                    skip_special,
                    no_trim,
                    spaces,
                    ask,
                )
            )
        return items, batch

    async def extras(self, item: Item, response: GenerateResponse) -> LogprobExtras | None:
        """The item's top and input log-probs for this (finished or partial) reply: one scoring pass of the
        served model (logprob_extras), None when it asks for none."""
        if not item.ask.wanted:
            return None
        prompt, output = list(item.request.input_ids), list(response.output_ids)
        return await self.model.model_pass(score, prompt, output, item.request.sampling, item.ask)

    def output(
        self, item: Item, response: GenerateResponse, started: float, extras: LogprobExtras | None = None
    ) -> dict[str, Any]:
        """One SGLang /generate result: text, output_ids and meta_info (with `extras`: the top and input
        log-probs asked for)."""
        ids = list(response.output_ids)
        model = self.model
        meta: dict[str, Any] = {
            "id": item.request.rid,
            "finish_reason": response.finish_reason.to_sglang(),
            "prompt_tokens": len(item.request.input_ids),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": model.weight_version(response),
            "weight_versions": model.weight_versions(response),
            "e2e_latency": time.perf_counter() - started,
        }
        if item.return_logprob:
            texts = model.tokenizer.batch_decode([[t] for t in ids]) if item.text_in_logprobs else [None] * len(ids)
            meta["output_token_logprobs"] = [[lp, t, s] for lp, t, s in zip(response.logprobs, ids, texts, strict=True)]
            if extras is not None:
                decode = model.tokenizer.batch_decode if item.text_in_logprobs else None
                meta.update(render(extras, item.ask, decode))
        text = output_text(
            model.tokenizer,
            ids,
            response.finish_reason,
            skip_special_tokens=item.skip_special_tokens,
            no_stop_trim=item.no_stop_trim,
            spaces_between_special_tokens=item.spaces_between_special_tokens,
        )
        out = {"text": text, "output_ids": ids, "meta_info": meta}
        if item.return_prompt_ids:
            out["prompt_token_ids"] = list(item.request.input_ids)
        return out

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """POST /generate: one prompt or a batch, answered once generation ends (or is aborted); with stream: true
        as server-sent events (sglang_stream)."""
        started = time.perf_counter()
        body, heavy = await self.model.json_body(request)
        items, batch = await self.model.offload(self.items, body, heavy=heavy)  # tokenizing a big one: in a thread
        keep_prefix = body.get("rid") is not None  # a made-up rid names no next turn: cache nothing for it
        if body.get("stream"):
            return await stream_generate(self, body, items, batch, request, started, keep_prefix=keep_prefix)
        responses = await self.model.run([item.request for item in items], keep_prefix=keep_prefix)
        extras = [await self.extras(item, response) for item, response in zip(items, responses, strict=True)]
        tokens = sum(len(r.output_ids) for r in responses)
        heavy = tokens > OFFLOAD_TOKENS or any(e is not None for e in extras)
        answer = await self.model.offload(self._answer, items, responses, extras, batch, started, heavy=heavy)
        return raw_json_response(answer)

    def _answer(
        self,
        items: list[Item],
        responses: list[GenerateResponse],
        extras: list[LogprobExtras | None],
        batch: bool,
        started: float,
    ) -> bytes:
        """The JSON of a finished /generate: one result, or a list for a batch."""
        outputs = [
            self.output(item, response, started, extra)
            for item, response, extra in zip(items, responses, extras, strict=True)
        ]
        return encode(outputs if batch else outputs[0])

    # ---- control -----------------------------------------------------------------------------------------

    async def abort_request(self, request: web.Request) -> web.Response:
        """POST /abort_request {rid, abort_all}: in-flight requests return with finish_reason abort."""
        body, _ = await self.model.json_body(request)
        abort_all = lax_boolean(f.or_default(body.get("abort_all"), False), "abort_all")
        rid = f.string(f.or_default(body.get("rid"), ""), "rid")
        require(abort_all or rid != "", "give a rid or abort_all: true")
        await self.model.engine.abort(None if abort_all else rid)
        return web.Response(status=200)

    async def pause(self, request: web.Request) -> web.Response:
        """POST /pause_generation {mode}: abort returns in-flight requests; retract and in_place keep them."""
        body, _ = await self.model.json_body(request, empty_ok=True)
        await self.model.pause(f.or_default(body.get("mode"), "abort"))
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def resume(self, request: web.Request) -> web.Response:
        """POST /continue_generation: paused requests go on, waiting ones are admitted."""
        body, _ = await self.model.json_body(request, empty_ok=True)
        lax_boolean(f.or_default(body.get("torch_empty_cache"), True), "torch_empty_cache")  # no CUDA cache here
        await self.model.resume()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weights(self, request: web.Request) -> web.Response:
        """POST /update_weights_from_disk: load a checkpoint dir; on failure the old weights keep serving."""
        body, _ = await self.model.json_body(request)
        path: Any = body.get("model_path")
        require(isinstance(path, str) and path != "", f"model_path must be a non-empty string, got {show(path)}")
        require(
            body.get("load_format") in LOAD_FORMATS,
            f"load_format must be one of {list(LOAD_FORMATS)}, got {show(body.get('load_format'))}",
        )
        abort_all = lax_boolean(f.or_default(body.get("abort_all_requests"), False), "abort_all_requests")
        keep_pause = lax_boolean(f.or_default(body.get("keep_pause"), False), "keep_pause")
        for name in ("is_async", "torch_empty_cache", "recapture_cuda_graph", "flush_cache"):  # no effect here
            lax_boolean(f.or_default(body.get(name), False), name)
        lax_integer(f.or_default(body.get("token_step"), 0), "token_step")
        f.neutral(body, "manifest", ())
        label = _label(body.get("weight_version"), "weight_version")
        model = self.model
        aborted = await model.engine.abort(None) if abort_all else 0
        try:
            await model.update_weights(path, label)
        except Exception as e:  # a bad checkpoint of any kind is the caller's problem, reported, not a crash
            message = (
                f"Failed to update weights: {type(e).__name__}: {e}. "
                f"The server keeps serving weight version {model.weight_version()}."
            )
            return json_response({"success": False, "message": message, "num_paused_requests": aborted}, status=400)
        if keep_pause:
            await model.pause("in_place")
        message = "Succeeded to update model weights."
        if label is not None:
            message += f" Weight version updated to {label}."
        return json_response({"success": True, "message": message, "num_paused_requests": aborted})

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        """POST /init_weights_update_group: join a trainer's weight-update group (answers once all members joined)."""
        from searchgym.serve.model.dist_weights import close_group, open_group

        body, _ = await self.model.json_body(request)  # SGLang's lax ints: AReaL sends "master_port": str(port)
        address = f.string(body.get("master_address"), "master_address")
        port = lax_integer(body.get("master_port"), "master_port")
        rank = lax_integer(body.get("rank_offset"), "rank_offset")
        world = lax_integer(body.get("world_size"), "world_size")
        name = f.string(f.or_default(body.get("group_name"), "weight_update_group"), "group_name")
        backend = f.string(f.or_default(body.get("backend"), "nccl"), "backend")
        require(backend in ("gloo", "nccl"), f"backend must be 'gloo' or 'nccl', got {show(backend)}")
        require(
            1 <= port <= 65535 and world >= 2 and 1 <= rank < world,
            f"need 1 <= master_port <= 65535 and 1 <= rank_offset < world_size (>= 2), got {port}, {rank}, {world}",
        )
        if name in self.weight_groups:  # the trainer formed the group again (it restarted): leave the old one
            await asyncio.to_thread(close_group, self.weight_groups.pop(name)[0])
        try:
            group = await asyncio.to_thread(open_group, address, port, rank, world, name, backend)
        except Exception as e:  # unreachable master, NCCL on a CPU box: reported, the server serves on
            return json_response(
                {"success": False, "message": f"Failed to init group: {type(e).__name__}: {e}"}, status=400
            )
        self.weight_groups[name] = (group, backend)
        return json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        """POST /update_weights_from_distributed: receive a bucket of tensors broadcast by rank 0 and load them."""
        from searchgym.serve.model.dist_weights import DTYPES, receive

        body, _ = await self.model.json_body(request)
        names, dtypes = strings(body.get("names"), "names"), strings(body.get("dtypes"), "dtypes")
        sizes = shapes(body.get("shapes"), "shapes")
        require(
            len(names) == len(dtypes) == len(sizes) > 0,
            "names, dtypes and shapes must be non-empty lists of one length",
        )
        for dtype in dtypes:
            require(dtype.removeprefix("torch.") in DTYPES, f"dtypes: unsupported dtype {show(dtype)}")
        require(
            body.get("load_format") is None,  # SGLang's "flattened_bucket" sends one flat tensor per bucket
            f"load_format={show(body.get('load_format'))} is not supported by this server: send null "
            "(tensor by tensor)",
        )
        name = f.string(f.or_default(body.get("group_name"), "weight_update_group"), "group_name")
        require(name in self.weight_groups, f"no weight-update group {show(name)}: call /init_weights_update_group")
        abort_all = lax_boolean(f.or_default(body.get("abort_all_requests"), False), "abort_all_requests")
        for flag in ("flush_cache", "torch_empty_cache"):  # no prefix cache, no CUDA cache here
            lax_boolean(f.or_default(body.get(flag), False), flag)
        label = _label(body.get("weight_version"), "weight_version")
        model = self.model
        group, backend = self.weight_groups[name]
        device = next(model.engine.model.parameters()).device if backend == "nccl" else "cpu"
        aborted = await model.engine.abort(None) if abort_all else 0
        try:
            tensors = await asyncio.to_thread(receive, group, names, dtypes, sizes, device)
            await model.update_weights({**model.engine.model.state_dict(), **tensors}, label)
        except Exception as e:  # wrong names or shapes: the old weights keep serving
            message = (
                f"Failed to update weights: {type(e).__name__}: {e}. "
                f"The server keeps serving weight version {model.weight_version()}."
            )
            return json_response({"success": False, "message": message, "num_paused_requests": aborted}, status=400)
        return json_response(
            {"success": True, "message": "Succeeded to update parameter online.", "num_paused_requests": aborted}
        )

    async def update_weight_version(self, request: web.Request) -> web.Response:
        """POST /update_weight_version {new_version, abort_all_requests}: relabel the current weights."""
        body, _ = await self.model.json_body(request)
        label: Any = _label(body.get("new_version"), "new_version")
        require(label is not None, "new_version is required")
        if lax_boolean(f.or_default(body.get("abort_all_requests"), True), "abort_all_requests"):
            await self.model.engine.abort(None)
        await self.model.set_label(label)
        return json_response({"success": True, "message": f"Weight version updated to {label}", "new_version": label})

    async def flush_cache(self, request: web.Request) -> web.Response:
        """/flush_cache: 400 while requests are running (unless retracted by a pause), like SGLang."""
        if not self.model.can_flush():
            return web.Response(status=400, text=f"Cache not flushed: {self.model.running} requests are running.\n")
        return web.Response(text="Cache flushed.\n")

    # ---- health and info ---------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        """GET /health: the HTTP server is up."""
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        """GET /health_generate and /ready: 200 once the engine has generated a token, 503 before and at shutdown."""
        if self.model.ready:
            return web.Response(status=200)
        return web.Response(status=503, text=self.model.warmup_error or "warming up\n")

    async def model_info(self, request: web.Request) -> web.Response:
        """GET /model_info (and the deprecated /get_model_info)."""
        model = self.model
        return json_response(
            {
                "model_path": model.model_path,
                "served_model_name": model.served_model_name,
                "tokenizer_path": model.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": model.weight_version(),
                "load_format": None,
                "reasoning_parser": None,
                "tool_call_parser": "qwen25",
                "model_type": getattr(model.engine.model.config, "model_type", None),
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        """GET /server_info (and the deprecated /get_server_info): settings, load and the engine's own stats."""
        model = self.model
        return json_response(
            {
                "model_path": model.model_path,
                "tokenizer_path": model.model_path,
                "served_model_name": model.served_model_name,
                "context_length": model.context_length,
                "max_context_length": model.context_length,
                "max_running_requests": model.max_running_requests,
                "weight_version": model.weight_version(),
                **model.stats(),
            }
        )

    async def close_weight_groups(self, _app: web.Application) -> None:
        """Leave every weight-update group on shutdown, so a later server in this process can form one by that name."""
        from searchgym.serve.model.dist_weights import close_group

        while self.weight_groups:
            _, (group, _backend) = self.weight_groups.popitem()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(close_group, group)

    def add_routes(self, app: web.Application) -> None:
        """Register the native routes (current names and SGLang's deprecated aliases), and leave weight groups on
        shutdown."""
        app.on_shutdown.append(self.close_weight_groups)
        router = app.router
        for method in ("POST", "PUT"):
            router.add_route(method, "/generate", self.generate)
        router.add_post("/abort_request", self.abort_request)
        router.add_post("/pause_generation", self.pause)
        router.add_post("/continue_generation", self.resume)
        router.add_post("/update_weights_from_disk", self.update_weights)
        router.add_post("/update_weight_version", self.update_weight_version)
        router.add_post("/init_weights_update_group", self.init_weights_update_group)
        router.add_post("/update_weights_from_distributed", self.update_weights_from_distributed)
        router.add_get("/flush_cache", self.flush_cache)
        router.add_post("/flush_cache", self.flush_cache)
        router.add_get("/health", self.health)
        router.add_get("/health_generate", self.health_generate)
        router.add_get("/ready", self.health_generate)
        for path in ("/model_info", "/get_model_info"):
            router.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            router.add_get(path, self.server_info)


def _label(value: Any, name: str) -> str | None:
    """A weight version label: SGLang's string (an integer is taken as its decimal string)."""
    if value is None:
        return None
    require(
        isinstance(value, str) and value != "" or isinstance(value, int) and not isinstance(value, bool),
        f"{name} must be a non-empty string, got {show(value)}",
    )
    return str(value)
