"""An agent program: an ordinary tool-calling loop written only against the `openai` client.

Evaluate it with `searchgym eval --agent examples/agent_program.py:agent ...` or train it with
`searchgym train rollout.agent=examples/agent_program.py:agent ...`: searchgym points `client` at a recording
proxy in front of the policy, so every token the model writes here is trained on exactly (docs/agents.md).
"""

from __future__ import annotations

MAX_STEPS = 4  # model calls per episode (the reply length is the run's: --max-new-tokens, rollout.max_new_tokens)


async def agent(task, client) -> str:
    """Ask the model with the env's tools until it answers in text; run each tool call on the env."""
    messages = [{"role": "user", "content": task.question}]
    for _ in range(MAX_STEPS):
        reply = await client.chat.completions.create(model=task.model, messages=messages, tools=task.tools)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            result = await task.call_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""
