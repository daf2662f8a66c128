"""An agent built with the OpenAI Agents SDK (`pip install openai-agents`), unmodified, as a searchgym agent program.

The SDK's own `Agent`, `function_tool` and `Runner` play the episode; the only searchgym parts are the two tools,
which run on the env through `task.call_tool`, and the client, which searchgym points at its recording proxy:

    searchgym eval --env searchgym/SyntheticQA-v0 --engine MODEL_DIR --agent examples/openai_agents_program.py:agent
    searchgym train rollout.agent=examples/openai_agents_program.py:agent ...
"""

from __future__ import annotations

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)  # the SDK would send traces to OpenAI's servers; a searchgym run stays on loopback

MAX_TURNS = 4  # model calls per episode


async def agent(task, client) -> str:
    """Search and read with the SDK's tool loop; its final output is the answer."""

    @function_tool
    async def search(query: str) -> str:
        """Search the knowledge source; returns the top results with their urls."""
        return await task.call_tool("search", {"query": query})

    @function_tool
    async def access(url: str) -> str:
        """Open a page from the search results; opening it again shows its next part."""
        return await task.call_tool("access", {"url": url})

    searcher = Agent(
        name="searcher",
        instructions="Answer the question. Search, read pages, then reply with the answer.",
        tools=[search, access],
        model=OpenAIChatCompletionsModel(model=task.model, openai_client=client),
    )
    result = await Runner.run(searcher, task.question, max_turns=MAX_TURNS)
    return str(result.final_output or "")
