"""Parse one agent turn into at most one tool call.

Two formats are understood in the same turn text:
- ASearcher tags: `<search>q</search>`, `<access>url</access>`, `<answer>a</answer>`;
- Hermes/Qwen JSON tool calls: `<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>`.

Reasoning in `<think>...</think>` is never an action. As in ASearcher, the last tool call in the turn
is the one that runs. Anything off (no call, several calls, unbalanced or nested tags, bad JSON, an
empty argument) is recorded in `errors`, so a format gate can act on it, and explained to the agent
in the next observation. Parsing never raises: a language model's output is untrusted input.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

TOOLS: tuple[str, ...] = ("search", "access", "answer")
ARGUMENT_KEYS: dict[str, tuple[str, ...]] = {
    "search": ("query", "q", "queries"),
    "access": ("url", "link"),
    "answer": ("answer", "text", "final_answer"),
}
MAX_ARGUMENT_CHARS = 4096

_TAG_TOKEN = re.compile(r"<(/?)(search|access|answer|tool_call)>")
_THINK_TOKEN = re.compile(r"</?think>")
_ANY_TOOL_TAG = re.compile(r"</?(?:search|access|answer|tool_call)>")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Action:
    """The tool call of one turn (`tool is None` when there is none) and what was wrong with the turn."""

    tool: str | None
    argument: str = ""
    errors: tuple[str, ...] = field(default_factory=tuple)
    format: str = "tags"  # "tags" | "json"

    @property
    def ok(self) -> bool:
        return self.tool is not None and not self.errors


def strip_thinking(text: str) -> str:
    """The part of a turn that may hold actions: without `<think>` blocks or an unterminated one."""
    kept: list[str] = []
    inside, pos = False, 0
    for m in _THINK_TOKEN.finditer(text):  # one linear pass: no regex backtracking on huge turns
        if m.group() == "<think>":
            if not inside:
                kept.append(text[pos : m.start()])
                inside = True
        else:
            if not inside:  # a close without an open: the turn began inside thinking (Qwen3 templates)
                kept.clear()
            inside, pos = False, m.end()
    if not inside:  # an unterminated <think> swallows the rest of the turn
        kept.append(text[pos:])
    return "".join(kept)


def parse_action(text: str) -> Action:
    """Find the turn's tool call; the last one wins, and every irregularity is listed in `errors`."""
    if not isinstance(text, str):
        return Action(None, errors=(f"the action must be a string, got {type(text).__name__}",))
    region = strip_thinking(text)
    errors: list[str] = _balance_errors(region)
    calls: list[tuple[str, str, str]] = []  # (tool, argument, format), in text order
    for tag, body in _scan_calls(region):
        if tag != "tool_call":
            calls.append((tag, body, "tags"))
            continue
        tool, argument, error = _parse_json_call(body)
        if error:
            errors.append(error)
        else:
            calls.append((tool, argument, "json"))
    if not calls:
        if not errors:
            errors.append("no tool call found")
        return Action(None, errors=tuple(errors))
    if len(calls) > 1:
        errors.append(f"{len(calls)} tool calls in one turn; only the last one ({calls[-1][0]}) was run")
    tool, argument, fmt = calls[-1]
    if _ANY_TOOL_TAG.search(argument):
        errors.append(f"tags nested inside <{tool}>")
        return Action(None, errors=tuple(errors), format=fmt)
    argument = _valid_text(argument).strip()
    if not argument:
        errors.append(f"empty <{tool}> argument")
        return Action(None, errors=tuple(errors), format=fmt)
    if len(argument) > MAX_ARGUMENT_CHARS:
        errors.append(f"<{tool}> argument of {len(argument)} characters cut to {MAX_ARGUMENT_CHARS}")
        argument = argument[:MAX_ARGUMENT_CHARS]
    return Action(tool, argument, tuple(errors), fmt)


def _valid_text(text: str) -> str:
    """The text with lone surrogates (which no backend can encode) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def _scan_calls(region: str) -> list[tuple[str, str]]:
    """(tag, body) of each outermost `<tag>...</tag>` call, in one linear pass over the tag tokens."""
    calls: list[tuple[str, str]] = []
    open_tag, body_start = None, 0
    for m in _TAG_TOKEN.finditer(region):
        closing, tag = m.group(1) == "/", m.group(2)
        if open_tag is None and not closing:
            open_tag, body_start = tag, m.end()
        elif open_tag == tag and closing:
            calls.append((tag, region[body_start : m.start()]))
            open_tag = None
    return calls


def _balance_errors(region: str) -> list[str]:
    """One error per tool tag whose opening and closing counts differ."""
    errors = []
    for tag in (*TOOLS, "tool_call"):
        opened, closed = region.count(f"<{tag}>"), region.count(f"</{tag}>")
        if opened != closed:
            errors.append(f"unbalanced <{tag}> tags ({opened} opened, {closed} closed)")
    return errors


def _parse_json_call(body: str) -> tuple[str, str, str | None]:
    """(tool, argument, error) from the JSON inside one `<tool_call>` block."""
    try:
        call = json.loads(body)
    except (ValueError, RecursionError) as e:
        return "", "", f"<tool_call> is not valid JSON ({str(e)[:80]})"
    if not isinstance(call, dict):
        return "", "", "<tool_call> must hold a JSON object with 'name' and 'arguments'"
    name = call.get("name")
    if name not in TOOLS:
        return "", "", f"unknown tool {str(name)[:40]!r} in <tool_call>; use one of {', '.join(TOOLS)}"
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):  # deeply nested brackets overflow the decoder: still just text
            arguments = {ARGUMENT_KEYS[name][0]: arguments}
    if not isinstance(arguments, dict):
        return "", "", f"'arguments' of {name} must be an object"
    for key in ARGUMENT_KEYS[name]:
        value = arguments.get(key)
        if isinstance(value, list) and value:  # {"queries": ["q1", ...]}: take the first
            value = value[0]
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return name, str(value), None
    return "", "", f"{name} needs an argument '{ARGUMENT_KEYS[name][0]}'"


# the argument each searchgym tool takes: the first name the env's parser reads for it
ARGUMENTS = {tool: keys[0] for tool, keys in ARGUMENT_KEYS.items()}


def tool_call_action(tool: str, argument: object) -> str:
    """`<tool_call>{"name": tool, "arguments": {...}}</tool_call>` for the env to parse, `<` escaped in the JSON
    so no argument can close the block early; an unknown tool still makes an action (the env explains it)."""
    key = ARGUMENTS.get(tool, "argument")
    value = argument if isinstance(argument, str) else str(argument)
    body = json.dumps({"name": tool, "arguments": {key: value}}, ensure_ascii=False)
    return "<tool_call>" + body.replace("<", "\\u003c") + "</tool_call>"
