"""OpenAI's HTTP API over the served model: `/v1/chat/completions` (tools included), `/v1/completions`, `/v1/models`.

Chat goes through `EngineChat` (the chat template renders `tools`, assistant `tool_calls` and `tool`
messages; `<tool_call>` output becomes `message.tool_calls` with finish_reason "tool_calls"). Every
documented request field is honoured, inert (identifiers and tags that change no output), or refused
with a 400 in OpenAI's error envelope; an unknown field is refused as OpenAI refuses it. Nothing is
silently ignored. `stream: true` is answered by `openai_stream`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from searchgym.agents.chat import SAMPLING_OPTIONS, ChatResult, chat_tools
from searchgym.agents.engines import fields as f
from searchgym.agents.engines.detokenize import output_text
from searchgym.agents.engines.fields import require, show
from searchgym.agents.engines.types import GenerateRequest, GenerateResponse, SamplingParams
from searchgym.serve.model.core import ServedModel
from searchgym.serve.model.openai_stream import stream_chat, stream_completion, stream_settings
from searchgym.serve.model.wire import json_response, text_chars

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and SGLang's) default for /v1/completions
OFFLOAD_TOKENS = 4096  # replies longer than this are detokenized in a request thread


def _string_map(value: Any, name: str) -> None:
    require(
        isinstance(value, dict) and all(isinstance(v, str) for v in value.values()),
        f"{name} must map keys to strings, got {show(value)}",
    )


def _object(value: Any, name: str) -> None:
    require(isinstance(value, dict), f"{name} must be an object, got {show(value)}")


# identifiers, tags and prompt-cache hints (there is no prompt cache): checked for type, and they change no output
INERT: dict[str, Callable[[Any, str], Any]] = {
    "model": f.string,
    "user": f.string,
    "safety_identifier": f.string,
    "prompt_cache_key": f.string,
    "metadata": _string_map,
    "prompt_cache_options": _object,
    "prompt_cache_retention": f.string,
}
# accepted only at values that ask for nothing this server cannot do (null is always accepted)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logprobs": (False,),
    "top_logprobs": (0,),
    "response_format": ({"type": "text"},),
    "store": (False,),
    "service_tier": ("auto", "default"),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "reasoning_effort": ("none",),
    "verbosity": ("medium",),
    "web_search_options": (),
    "functions": (),
    "function_call": (),
    "moderation": (),
}
WHY = {
    "logprobs": "; /generate returns per-token logprobs",
    "response_format": ": structured output needs constrained decoding",
    "functions": "; use tools",
    "function_call": "; use tool_choice",
}
CHAT_FIELDS = {
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "stream",
    "stream_options",
    *INERT,
    *NEUTRAL,
    *SAMPLING_OPTIONS,
}
COMPLETION_NEUTRAL: dict[str, tuple[Any, ...]] = {"logprobs": (0,), "suffix": ("",), "best_of": (1,)}
COMPLETION_FIELDS = {
    "prompt",
    "echo",
    "model",
    "user",
    "stream",
    "stream_options",
    *COMPLETION_NEUTRAL,
    *SAMPLING_OPTIONS,
}


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error envelope."""
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _check_known(body: Mapping[str, Any], known: set[str]) -> None:
    """Refuse fields OpenAI does not define, as OpenAI does."""
    unknown = sorted(set(body) - known)
    require(not unknown, f"Unrecognized request argument(s) supplied: {unknown}")


def _check_neutral(body: Mapping[str, Any], neutrals: Mapping[str, tuple[Any, ...]]) -> None:
    for name, values in neutrals.items():
        f.neutral(body, name, values, WHY.get(name, ""))


def _sampling_options(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k in SAMPLING_OPTIONS}


def _tools_for(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The tools to render and parse: none when tool_choice is "none"; forced choices are refused."""
    tools = chat_tools(body.get("tools"))
    choice = f.or_default(body.get("tool_choice"), "auto")
    require(
        choice in ("auto", "none"),
        f"tool_choice={show(choice)} is not supported by this server (only 'auto' or 'none'): forcing a call "
        f"needs constrained decoding",
    )
    return None if choice == "none" else tools


class OpenAIAPI:
    """The OpenAI routes' handlers over one served model."""

    def __init__(self, model: ServedModel) -> None:
        self.model = model

    def _model_name(self, body: Mapping[str, Any]) -> str:
        return body["model"] if isinstance(body.get("model"), str) else self.model.served_model_name

    def _usage(self, prompt_len: int, response: GenerateResponse) -> dict[str, int]:
        completion = len(response.output_ids)
        return {"prompt_tokens": prompt_len, "completion_tokens": completion, "total_tokens": prompt_len + completion}

    def _reply_budget(self, body: Mapping[str, Any], prompt_len: int, sampling: SamplingParams) -> SamplingParams:
        """The reply's max tokens within --max-reply-tokens and the context (unset: the most that fits)."""
        limit_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        budget = self.model.fit_reply(
            prompt_len, sampling.max_new_tokens, limit_name, explicit=body.get(limit_name) is not None
        )
        return dataclasses.replace(sampling, max_new_tokens=budget)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions: n = 1; tool calls parsed when tools are given; streamed on request."""
        body, heavy = await self.model.json_body(request)
        _check_known(body, CHAT_FIELDS)
        for name, check in INERT.items():
            if body.get(name) is not None:
                check(body[name], name)
        _check_neutral(body, NEUTRAL)
        streamed = stream_settings(body)
        tools = _tools_for(body)
        parallel = f.boolean(f.or_default(body.get("parallel_tool_calls"), True), "parallel_tool_calls")
        template_kwargs = f.or_default(body.get("chat_template_kwargs"), {})
        require(isinstance(template_kwargs, dict), "chat_template_kwargs must be an object")
        chat = self.model.chat
        self.model.check_chars(text_chars(body.get("messages")) + text_chars(body.get("tools")), "messages")
        prompt = await self.model.offload(chat.render, body.get("messages"), tools, template_kwargs, heavy=heavy)
        sampling = self._reply_budget(body, len(prompt), chat.sampling(len(prompt), **_sampling_options(body)))
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if streamed is not None:
            return await stream_chat(
                self.model,
                request,
                GenerateRequest(prompt, sampling, rid),
                model_name=self._model_name(body),
                tools=tools,
                parallel_tool_calls=parallel,
                settings=streamed,
            )
        # the rid is made up here, so no next turn can name it: keep no prefix for it
        response = await self.model.agenerate(GenerateRequest(prompt, sampling, rid), keep_prefix=False)
        result = await self.model.offload(
            functools.partial(chat.result, parallel_tool_calls=parallel),
            prompt,
            response,
            tools,
            heavy=len(response.output_ids) > OFFLOAD_TOKENS,
        )
        if result.finish_reason == "abort":
            return self._aborted(result.response)
        return json_response(
            {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self._model_name(body),
                "choices": [
                    {"index": 0, "message": _message(result), "logprobs": None, "finish_reason": result.finish_reason}
                ],
                "usage": self._usage(len(prompt), result.response),
                "system_fingerprint": None,
                "metadata": {"weight_version": self.model.weight_version(result.response)},
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions: text (or token ids) in, text out; no chat template; streamed on request."""
        body, heavy = await self.model.json_body(request)
        _check_known(body, COMPLETION_FIELDS)
        for name in ("model", "user"):
            if body.get(name) is not None:
                f.string(body[name], name)
        _check_neutral(body, COMPLETION_NEUTRAL)
        streamed = stream_settings(body)
        prompt = await self.model.offload(self._prompt, body.get("prompt"), heavy=heavy)
        echo = f.boolean(f.or_default(body.get("echo"), False), "echo")
        options = _sampling_options(body)
        options.setdefault("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
        sampling = self._reply_budget(body, len(prompt), self.model.chat.sampling(len(prompt), **options))
        rid = f"cmpl-{uuid.uuid4().hex}"
        if streamed is not None:
            return await stream_completion(
                self.model,
                request,
                GenerateRequest(prompt, sampling, rid),
                model_name=self._model_name(body),
                echo=echo,
                settings=streamed,
            )
        response = await self.model.agenerate(GenerateRequest(prompt, sampling, rid), keep_prefix=False)
        if response.finish_reason.type == "abort":
            return self._aborted(response)
        text = await self.model.offload(
            self._completion_text,
            prompt,
            response,
            echo,
            heavy=len(response.output_ids) + echo * len(prompt) > OFFLOAD_TOKENS,
        )
        return json_response(
            {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self._model_name(body),
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": response.finish_reason.type}],
                "usage": self._usage(len(prompt), response),
                "system_fingerprint": None,
                "metadata": {"weight_version": self.model.weight_version(response)},
            }
        )

    def _completion_text(self, prompt: list[int], response: GenerateResponse, echo: bool) -> str:
        """A completion's text (after the prompt's, with echo)."""
        text = output_text(self.model.tokenizer, list(response.output_ids), response.finish_reason)
        if echo:
            text = self.model.tokenizer.decode(prompt, skip_special_tokens=True) + text
        return text

    def _prompt(self, prompt: Any) -> list[int]:
        """One prompt: a string, a list holding one string, or a list of token ids."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            require(prompt != "", "prompt must not be empty")
            return self.model.encode(prompt, "prompt")
        require(
            isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt),
            f"prompt must be a string or a list of token ids (one prompt per request), got {show(prompt)}",
        )
        return self.model.prompt_ids(prompt, "prompt")

    def _aborted(self, response: GenerateResponse) -> web.Response:
        """A generation aborted by a pause for a weight update: 503 with Retry-After, which OpenAI clients retry."""
        message = f"generation was aborted ({response.finish_reason.message}); retry"
        return json_response(error_body(503, message), status=503, headers={"Retry-After": "1"})

    async def models(self, request: web.Request) -> web.Response:
        """GET /v1/models."""
        return json_response({"object": "list", "data": [self._card()]})

    async def model_card(self, request: web.Request) -> web.Response:
        """GET /v1/models/{model}: the served model's card, or OpenAI's 404."""
        name = request.match_info["model"]
        if name != self.model.served_model_name:
            return json_response(error_body(404, f"The model '{name}' does not exist", "model_not_found"), status=404)
        return json_response(self._card())

    def _card(self) -> dict[str, Any]:
        name = self.model.served_model_name
        return {
            "id": name,
            "object": "model",
            "created": self.model.created,
            "owned_by": "searchgym",
            "root": name,
            "parent": None,
            "max_model_len": self.model.context_length,
        }

    def add_routes(self, app: web.Application) -> None:
        """Register the OpenAI routes."""
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model:.+}", self.model_card)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)


def _message(result: ChatResult) -> dict[str, Any]:
    """The assistant message of a chat completion."""
    message: dict[str, Any] = {"role": "assistant", "content": result.content, "refusal": None}
    if result.tool_calls:
        message["tool_calls"] = [call.to_openai() for call in result.tool_calls]
    elif message["content"] is None:
        message["content"] = ""
    return message
