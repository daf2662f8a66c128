"""In-process chat over any token-level engine: OpenAI-style messages (and tools) in, text and tool calls out.

`EngineChat(engine, tokenizer)` renders messages through the tokenizer's own chat template (tools,
assistant `tool_calls` and `tool` messages included, exactly as the template lays them out), generates
with the engine (TorchEngine in process, or SGLang servers), and parses Hermes/Qwen
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks into tool calls. It satisfies
`searchgym.core.llm_calls.ChatModel` (`achat`), so judges, the synthesis agent and chat workflows use a
local model without serving it to themselves over HTTP; `serve model`'s `/v1/chat/completions` is this
adapter behind OpenAI's wire format.

Sampling options are OpenAI's keywords (`temperature`, `top_p`, `max_tokens`, `stop`, `seed`,
`logit_bias`, ...) plus SGLang's usual extras (`top_k`, `min_p`, `ignore_eos`, `stop_token_ids`);
an option this adapter cannot honour is refused with a `ValueError` naming it, never ignored.
"""

from __future__ import annotations

import inspect
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchgym.agents.engines import fields as f
from searchgym.agents.engines.detokenize import output_text
from searchgym.agents.engines.fields import InvalidRequest, require, show
from searchgym.agents.engines.types import GenerateRequest, GenerateResponse, InferenceEngine, SamplingParams

DEFAULT_MAX_TOKENS = 1024  # a reply's budget when neither the caller nor the engine's context length bounds it
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for logit_bias values
ROLES = ("system", "developer", "user", "assistant", "tool")
_MESSAGE_KEYS = {
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "refusal",
    "function_call",
    "audio",
    "annotations",
}
_NEUTRAL_MESSAGE_KEYS = ("refusal", "function_call", "audio", "annotations")  # output-only or deprecated: empty only
_TOOL_CALL_OPEN, _TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)


class ChatAborted(RuntimeError):
    """The engine aborted the generation (a pause in abort mode); nothing complete to return."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call; `arguments` is JSON text, as OpenAI sends and returns it."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's `message.tool_calls[]` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ChatResult:
    """One chat completion: the prompt's token ids, the engine's response, and the reply as OpenAI shapes it."""

    prompt_ids: list[int]
    response: GenerateResponse
    text: str  # the whole reply text (stop trimmed), before tool calls are taken out
    content: str | None  # the reply without its tool calls; None when the reply is only tool calls
    tool_calls: list[ToolCall]
    finish_reason: str  # "stop", "length", "tool_calls", or "abort" (the engine aborted it)


class EngineChat:
    """Chat completions from a token-level engine and its tokenizer's chat template; satisfies ChatModel."""

    def __init__(self, engine: InferenceEngine, tokenizer: Any, *, context_length: int | None = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.context_length = context_length or getattr(engine, "max_context", None)
        self.vocab_size = len(tokenizer)

    # ---- the ChatModel protocol ------------------------------------------------------------------------

    async def achat(self, messages: list[dict[str, Any]], **sampling: Any) -> str:
        """The assistant's reply text to `messages`; `sampling` holds OpenAI keywords (temperature, max_tokens, ...)."""
        prompt = self.render(messages)
        result = await self.acomplete(messages, self.sampling(len(prompt), **sampling), prompt_ids=prompt)
        if result.finish_reason == "abort":
            raise ChatAborted(f"generation was aborted: {result.response.finish_reason.message}")
        return result.text

    async def achat_full(self, messages: list[dict[str, Any]], **sampling: Any) -> dict[str, Any]:
        """{content, finish_reason} of one reply, as OpenAIEngine gives them: judges tell a cut-off reply apart."""
        prompt = self.render(messages)
        result = await self.acomplete(messages, self.sampling(len(prompt), **sampling), prompt_ids=prompt)
        if result.finish_reason == "abort":
            raise ChatAborted(f"generation was aborted: {result.response.finish_reason.message}")
        return {"content": result.text, "finish_reason": result.finish_reason}

    # ---- the richer call the model server uses --------------------------------------------------------

    async def acomplete(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
        *,
        rid: str = "",
        parallel_tool_calls: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> ChatResult:
        """Render, generate and parse one reply; with `tools`, `<tool_call>` blocks become `tool_calls`."""
        tools = chat_tools(tools)
        prompt = prompt_ids if prompt_ids is not None else self.render(messages, tools, template_kwargs)
        self.check_budget(len(prompt), sampling.max_new_tokens)
        response = await self.engine.agenerate(GenerateRequest(prompt, sampling, rid))
        return self.result(prompt, response, tools, parallel_tool_calls=parallel_tool_calls)

    def result(
        self,
        prompt: list[int],
        response: GenerateResponse,
        tools: list[dict[str, Any]] | None = None,
        *,
        parallel_tool_calls: bool = True,
    ) -> ChatResult:
        """The reply in a finished response: its text, and with `tools` its `<tool_call>` blocks as tool calls."""
        text = output_text(self.tokenizer, list(response.output_ids), response.finish_reason)
        content: str | None = text
        calls: list[ToolCall] = []
        if tools:
            content, calls = parse_tool_calls(text, tool_names(tools))
            if not parallel_tool_calls:
                calls = calls[:1]
        finish = response.finish_reason.type
        if finish == "stop" and calls:
            finish = "tool_calls"
        return ChatResult(prompt, response, text, content, calls, finish)

    def render(self, messages: Any, tools: Any = None, template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """Prompt token ids: the messages through the chat template, the assistant turn opened."""
        rendered = chat_messages(messages)
        tool_list = chat_tools(tools)
        extra = dict(template_kwargs or {})
        reserved = sorted(set(extra) & set(inspect.signature(self.tokenizer.apply_chat_template).parameters))
        require(not reserved, f"chat_template_kwargs may only hold template variables, not {reserved}")
        try:
            ids = self.tokenizer.apply_chat_template(
                rendered, tools=tool_list, add_generation_prompt=True, tokenize=True, return_dict=False, **extra
            )
        except Exception as e:  # template code raising on odd roles or content is bad input
            raise InvalidRequest(f"the chat template rejected the messages: {type(e).__name__}: {e}") from None
        ids = list(ids)
        if self.context_length is not None:
            require(
                len(ids) < self.context_length,
                f"messages: The input ({len(ids)} tokens) is longer than the "
                f"model's context length ({self.context_length} tokens).",
            )
        return ids

    def sampling(self, prompt_len: int, **options: Any) -> SamplingParams:
        """OpenAI sampling keywords -> SamplingParams; unset max tokens means the rest of the context window."""
        return openai_sampling(
            options, prompt_len=prompt_len, context_length=self.context_length, vocab_size=self.vocab_size
        )

    def check_budget(self, prompt_len: int, max_new_tokens: int) -> None:
        """Refuse prompt + max_new_tokens beyond the context window, as SGLang does (no silent truncation)."""
        if self.context_length is None:
            return
        require(
            prompt_len + max_new_tokens < self.context_length,
            context_overflow(self.context_length, prompt_len, max_new_tokens),
        )


def context_overflow(context_length: int, prompt_len: int, max_new_tokens: int) -> str:
    """SGLang's words for a prompt plus reply budget past the context (clients parse them to shrink and retry)."""
    return (
        f"Requested token count exceeds the model's maximum context length of {context_length} tokens. You "
        f"requested a total of {prompt_len + max_new_tokens} tokens: {prompt_len} tokens from the input messages "
        f"and {max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input "
        f"messages or the completion to fit within the limit."
    )


# ---- sampling options ------------------------------------------------------------------------------------

SAMPLING_OPTIONS = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "logit_bias",
    "n",
    "frequency_penalty",
    "presence_penalty",
    "top_k",
    "min_p",
    "ignore_eos",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
)


def openai_sampling(
    options: Mapping[str, Any], *, prompt_len: int, context_length: int | None, vocab_size: int
) -> SamplingParams:
    """OpenAI's sampling fields (plus SGLang's top_k, min_p, ignore_eos, stop_token_ids) -> SamplingParams."""
    unknown = sorted(set(options) - set(SAMPLING_OPTIONS))
    require(not unknown, f"unsupported sampling option(s) {unknown}; supported: {list(SAMPLING_OPTIONS)}")
    o = options.get
    require(f.integer(f.or_default(o("n"), 1), "n") == 1, f"n must be 1 on this server, got {show(o('n'))}")
    for name, value in (
        ("frequency_penalty", 0.0),
        ("presence_penalty", 0.0),
        ("repetition_penalty", 1.0),
        ("min_tokens", 0.0),
    ):
        f.neutral(options, name, (value,), " (the engine has no penalties)")
    limit_name = "max_completion_tokens" if o("max_completion_tokens") is not None else "max_tokens"
    if o(limit_name) is None:
        max_tokens = context_length - prompt_len - 1 if context_length else DEFAULT_MAX_TOKENS
        require(
            max_tokens >= 1,
            f"the prompt ({prompt_len} tokens) leaves no room for a reply in the model's "
            f"context length ({context_length} tokens)",
        )
    else:
        max_tokens = f.integer(o(limit_name), limit_name)
        require(max_tokens >= 1, f"{limit_name} must be at least 1, got {max_tokens}")
    temperature = f.number(f.or_default(o("temperature"), 1.0), "temperature")
    top_p = f.number(f.or_default(o("top_p"), 1.0), "top_p")
    top_k = f.integer(f.or_default(o("top_k"), -1), "top_k")
    min_p = f.number(f.or_default(o("min_p"), 0.0), "min_p")
    require(0 <= temperature <= 2, f"temperature must be in [0, 2], got {temperature:g}")
    require(0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p:g}")
    require(top_k == -1 or top_k >= 1, f"top_k must be -1 (disable) or at least 1, got {top_k}")
    require(0 <= min_p <= 1, f"min_p must be in [0, 1], got {min_p:g}")
    seed = o("seed")
    return SamplingParams(
        max_new_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        stop=f.stop_strings(o("stop")),
        stop_token_ids=f.token_ids(o("stop_token_ids"), "stop_token_ids", vocab_size),
        ignore_eos=f.boolean(f.or_default(o("ignore_eos"), False), "ignore_eos"),
        seed=None if seed is None else f.integer(seed, "seed"),
        logit_bias=f.logit_bias(o("logit_bias"), "logit_bias", vocab_size, LOGIT_BIAS_LIMIT),
    )


# ---- messages and tools ----------------------------------------------------------------------------------


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages -> what chat templates take: text content, tool-call arguments as objects."""
    require(isinstance(messages, list) and len(messages) > 0, "messages must be a non-empty list")
    return [_message(m, i) for i, m in enumerate(messages)]


def _message(message: Any, index: int) -> dict[str, Any]:
    """One message, checked and normalised ('developer' is the template's 'system')."""
    where = f"messages[{index}]"
    require(
        isinstance(message, dict) and message.get("role") in ROLES,
        f"{where} must be an object with a role in {list(ROLES)}, got {show(message)}",
    )
    unknown = sorted(set(message) - _MESSAGE_KEYS)
    require(not unknown, f"{where} has unsupported field(s) {unknown}")
    for key in _NEUTRAL_MESSAGE_KEYS:
        require(message.get(key) in (None, []), f"{where}.{key} is not supported by this server (only null)")
    role = "system" if message["role"] == "developer" else message["role"]
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"), where)}
    if message.get("name") is not None:
        out["name"] = f.string(message["name"], f"{where}.name")
    if message.get("tool_calls"):
        require(role == "assistant", f"{where}: only assistant messages carry tool_calls")
        calls = message["tool_calls"]
        require(isinstance(calls, list), f"{where}.tool_calls must be a list, got {show(calls)}")
        out["tool_calls"] = [_history_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = f.string(message["tool_call_id"], f"{where}.tool_call_id")
    if role in ("user", "system", "tool"):
        require(message.get("content") is not None, f"{where}: a {message['role']} message needs content")
    return out


def _text(content: Any, where: str) -> str:
    """Message content as text: a string, null (empty), or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, list):
        require(
            all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content),
            f"{where}: only text content parts are supported",
        )
        return "".join(p["text"] for p in content)
    return f.string(content, f"{where}.content")


def _history_call(call: Any, where: str) -> dict[str, Any]:
    """An assistant tool call from the history, arguments decoded from OpenAI's JSON text to an object."""
    function: Any = call.get("function") if isinstance(call, dict) else None
    require(
        isinstance(function, dict) and isinstance(function.get("name"), str),
        f"{where} must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}, got {show(call)}",
    )
    require(call.get("type", "function") == "function", f"{where}.type must be 'function'")
    arguments = f.or_default(function.get("arguments"), "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as e:
            raise InvalidRequest(f"{where}.function.arguments is not valid JSON: {e}") from None
    require(isinstance(arguments, dict), f"{where}.function.arguments must be a JSON object, got {show(arguments)}")
    out = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if call.get("id") is not None:
        out["id"] = f.string(call["id"], f"{where}.id")
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI `tools` checked: function tools with a name (and an object of parameters); None when empty."""
    if tools is None or tools == []:
        return None
    require(isinstance(tools, list), f"tools must be a list, got {show(tools)}")
    names = set()
    for i, tool in enumerate(tools):
        function: Any = tool.get("function") if isinstance(tool, dict) else None
        require(
            isinstance(tool, dict)
            and tool.get("type") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and function["name"],
            f"tools[{i}] must be {{'type': 'function', 'function': {{'name', ...}}}}, got {show(tool)}",
        )
        require(isinstance(function.get("parameters", {}), dict), f"tools[{i}].function.parameters must be an object")
        require(function["name"] not in names, f"tools[{i}]: duplicate function name {function['name']!r}")
        names.add(function["name"])
    return tools


# ---- tool calls in the output ----------------------------------------------------------------------------


def parse_tool_calls(text: str, names: set[str] | frozenset[str]) -> tuple[str | None, list[ToolCall]]:
    """(content, tool calls) of a reply: its `<tool_call>{json}</tool_call>` blocks, if all are well formed.

    A block must hold {"name": one of `names`, "arguments": an object}; a last block may lack its closing
    tag (a stop string cut it). If any block is malformed, or prose sits between blocks, the reply is
    left whole as content with no tool calls: nothing the model wrote is dropped.
    """
    start = text.find(_TOOL_CALL_OPEN)
    if start < 0:
        return text, []
    calls, end = [], start
    for match in _BLOCK.finditer(text, start):
        if text[end : match.start()].strip():
            return text, []
        call = _tool_call(match.group(1), names)
        if call is None:
            return text, []
        calls.append(call)
        end = match.end()
    content = (text[:start] + text[end:]).strip()
    return content or None, calls


def _tool_call(block: str, names: set[str] | frozenset[str]) -> ToolCall | None:
    """The call in one block's JSON, or None if it is not {"name": known, "arguments": object}."""
    try:
        data = json.loads(block)
    except (ValueError, RecursionError):  # a model's output is untrusted: deep nesting is malformed, not a crash
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or data["name"] not in names:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(data["name"], json.dumps(arguments, ensure_ascii=False))


def tool_names(tools: Sequence[dict[str, Any]] | None) -> frozenset[str]:
    """The function names of checked `tools`."""
    return frozenset(t["function"]["name"] for t in tools or ())
