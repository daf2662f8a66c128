"""An agent program that reaches its tools over MCP: the official `mcp` client for the tools, `openai` for the model.

    searchgym eval --env searchgym/SyntheticQA-v0 --engine MODEL_DIR --out runs/eval \\
        --agent examples/mcp_agent_program.py:agent

`task.mcp_url` is this episode's MCP endpoint (streamable HTTP): its tools `search`, `access` and `answer` act on
the env being played, and the model's replies go through searchgym's recording proxy, so the episode is judged and
its tokens trained as for any agent program (docs/agents.md). The loop is the usual one: list the MCP tools, offer
them to the model as OpenAI function tools, run each tool call on the MCP server, stop at an answer. Needs
`pip install 'searchgym[mcp]'`.
"""

from __future__ import annotations

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

MAX_STEPS = 4  # model calls per episode


def function_tools(listed) -> list[dict]:
    """The MCP server's tools as OpenAI function tools (the schemas pass through unchanged)."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.inputSchema}}
        for t in listed.tools
    ]


async def agent(task, client) -> str:
    """Ask the model with the MCP server's tools until it answers; an `answer` tool call ends the episode."""
    async with streamable_http_client(task.mcp_url) as (read, write, _), ClientSession(read, write) as session:
        await session.initialize()
        tools = function_tools(await session.list_tools())
        messages = [{"role": "user", "content": task.question}]
        for _ in range(MAX_STEPS):
            reply = await client.chat.completions.create(model=task.model, messages=messages, tools=tools)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content or ""
            for call in message.tool_calls:
                result = await session.call_tool(call.function.name, _arguments(call.function.arguments))
                text = "\n".join(c.text for c in result.content if c.type == "text")
                if call.function.name == "answer" and not result.isError:
                    return text  # the episode is over: the env judged the answer the model gave
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
    return ""


def _arguments(text: str) -> dict:
    """The model's arguments as an object (the server answers a bad one with a tool error naming the field)."""
    import json

    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}
