"""The env's tools over MCP: their JSON schemas, and the check of a call's arguments against them.

Plain data and jsonschema (a dependency of the `mcp` SDK), no server: `serve/mcp.py` (an env served over MCP)
and `serve/mcp_endpoint` (an agent program's episode over MCP) turn these into `mcp.types.Tool`s.
A call's arguments are checked here so a bad one is a short tool error naming the field, never an echo of a
megabyte argument (as jsonschema's own messages would give) and never an exception in the server.
"""

from __future__ import annotations

from typing import Any

from searchgym.envs.actions import ARGUMENTS, MAX_ARGUMENT_CHARS


class ToolError(Exception):
    """A call the server refuses: the client gets the message as a tool error (isError), the server goes on."""


START = "start"
ENV_TOOLS = ("search", "access", "answer")  # searchgym's tools, each with its one argument (integrations.actions)
MAX_TASK_ID_CHARS = 256

DESCRIPTIONS = {
    START: "Start this session's episode and get the question. Optional: seed (draw a task), task_id or index "
    "(pick one). Call it once, first; one MCP session is one episode.",
    "search": "Search the knowledge source; returns the top results, each with its url.",
    "access": "Open a page from the search results; pages come in parts, opening the same url again shows the next.",
    "answer": "Give the final answer (short: a name, a year, a number). Returns the verdict and the reward, and "
    "ends the episode.",
}
ARGUMENT_DESCRIPTIONS = {
    "search": "the search query",
    "access": "a url from the search results",
    "answer": "the final answer",
}

# the default opening prompt over MCP: the env's own instructions teach tag or <tool_call> syntax, which an MCP
# client does not write (an `instructions` env kwarg replaces it)
MCP_INSTRUCTIONS = (
    "Answer the question below with the tools search, access and answer; answer with a short "
    "final answer (a name, a year, a number). You have at most {max_turns} tool calls.\n\n"
    "Question: {question}"
)


def input_schema(tool: str, n_tasks: int) -> dict[str, Any]:
    """The JSON schema of `tool`'s arguments; `n_tasks` bounds start's `index`."""
    if tool == START:
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "seed": {"type": "integer", "minimum": 0, "description": "draw the task with this seed"},
                "task_id": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_TASK_ID_CHARS,
                    "description": "the task to play",
                },
                "index": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": n_tasks - 1,
                    "description": f"the task at this position of the pool of {n_tasks}",
                },
            },
        }
    key = ARGUMENTS[tool]
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [key],
        "properties": {
            key: {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_ARGUMENT_CHARS,
                "description": ARGUMENT_DESCRIPTIONS[tool],
            }
        },
    }


START_OUTPUT = {
    "type": "object",
    "required": ["task_id", "turn", "max_turns"],
    "properties": {"task_id": {"type": "string"}, "turn": {"type": "integer"}, "max_turns": {"type": "integer"}},
}

STEP_OUTPUT = {
    "type": "object",
    "required": ["task_id", "turn", "tool", "done", "terminated", "truncated", "reward"],
    "properties": {
        "task_id": {"type": "string"},
        "turn": {"type": "integer"},
        "tool": {"type": "string", "description": "the tool that ran (invalid: none did)"},
        "done": {"type": "boolean"},
        "terminated": {"type": "boolean"},
        "truncated": {"type": "boolean"},
        "reward": {
            "type": ["number", "null"],
            "description": "the judge's score once answered; null when the judge failed",
        },
        "truncation": {"type": "string", "description": "the budget that ended the episode"},
        "format_errors": {"type": "array", "items": {"type": "string"}},
        "verdict": {"type": "object", "description": "score, correct, judge, detail, error"},
        "judge_error": {"type": ["string", "null"]},
    },
}


def output_schema(tool: str) -> dict[str, Any]:
    """The JSON schema of `tool`'s structured result."""
    return START_OUTPUT if tool == START else STEP_OUTPUT


def argument_error(tool: str, arguments: Any, n_tasks: int) -> str | None:
    """Why `arguments` do not fit `tool`'s schema (short, naming the field), or None when they do."""
    import jsonschema

    if not isinstance(arguments, dict):
        return f"{tool} takes a JSON object of arguments, got {type(arguments).__name__}"
    errors = sorted(
        jsonschema.Draft202012Validator(input_schema(tool, n_tasks)).iter_errors(arguments),
        key=lambda e: (list(e.path), e.validator),
    )
    if not errors:
        if tool == START and arguments.get("task_id") is not None and arguments.get("index") is not None:
            return "start takes task_id or index, not both"
        return None
    e = errors[0]
    field = ".".join(str(p) for p in e.path)
    if e.validator == "additionalProperties":
        extra = sorted(str(k)[:40] for k in arguments if k not in input_schema(tool, n_tasks)["properties"])
        return f"{tool} has no argument {extra[0]!r}; it takes {_takes(tool)}"
    if e.validator == "required":
        return f"{tool} needs the argument {ARGUMENTS[tool]!r} (a string)"
    length = len(e.instance) if isinstance(e.instance, str) else 0
    what = {
        "type": f"must be {_a(e.validator_value)}, got {type(e.instance).__name__}",
        "minLength": "must not be empty",
        "maxLength": f"must be at most {e.validator_value} characters, got {length}",
        "minimum": f"must be at least {e.validator_value}",
        "maximum": f"must be at most {e.validator_value}",
    }
    return f"{tool}: {field or 'arguments'} {what.get(str(e.validator), 'is not valid: ' + e.message[:120])}"


def _takes(tool: str) -> str:
    return "seed, task_id or index (all optional)" if tool == START else repr(ARGUMENTS[tool])


def _a(kind: Any) -> str:
    return {"integer": "a whole number", "string": "a string", "object": "an object"}.get(str(kind), str(kind))
