"""What the agent reads: the opening instructions and the formatting of tool results.

The wording follows ASearcher's agent (search results as `[Doc k](url):`, pages headed
`>>>> Page n >>>>`, everything a tool returns wrapped in `<information>`), so prompts and
trajectories from that system carry over.
"""

from __future__ import annotations

from collections.abc import Sequence

from searchgym.envs.tools.base import SearchHit

TAGS_INSTRUCTIONS = """\
Answer the question below by searching a knowledge source. You may think step by step inside \
<think> </think>. Each turn, make exactly one tool call:
- <search> query </search> searches and returns the top results with their urls.
- <access> url </access> opens a page from the results; pages come in parts, and accessing the \
same url again shows the next part.
- <answer> final answer </answer> ends the episode; give a short answer (a name, a year, a number).
Tool results come back inside <information> </information>. You have at most {max_turns} turns.

Question: {question}"""

HERMES_INSTRUCTIONS = """\
Answer the question below by searching a knowledge source. Each turn, make exactly one tool call \
as JSON inside <tool_call> </tool_call>:
- {{"name": "search", "arguments": {{"query": "..."}}}} searches and returns the top results with their urls.
- {{"name": "access", "arguments": {{"url": "..."}}}} opens a page; accessing the same url again shows the next part.
- {{"name": "answer", "arguments": {{"answer": "..."}}}} ends the episode with a short final answer.
Tool results come back inside <information> </information>. You have at most {max_turns} turns.

Question: {question}"""

INSTRUCTIONS = {"tags": TAGS_INSTRUCTIONS, "hermes": HERMES_INSTRUCTIONS}

# One line instead of the full instructions: for small models that learn the format from
# demonstrations rather than by reading it, where the full text would be most of every sequence.
BRIEF_INSTRUCTIONS = {
    "tags": "Use <search> query </search> and <answer> answer </answer>.\nQuestion: {question}",
    "hermes": "Call search or answer inside <tool_call> </tool_call>.\nQuestion: {question}",
}


def instructions_template(tool_format: str, instructions: str) -> str:
    """The opening prompt's template: "full" (ASearcher's wording), "brief", or a custom template.

    A custom template must contain `{question}` and may use `{max_turns}`; other braces are doubled.
    """
    if instructions == "full":
        return INSTRUCTIONS[tool_format]
    if instructions == "brief":
        return BRIEF_INSTRUCTIONS[tool_format]
    try:
        probe = instructions.format(question="\0q", max_turns=1)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"instructions must be 'full', 'brief' or a template with {{question}} "
            f"(and optionally {{max_turns}}); formatting it failed: {exc!r}"
        ) from None
    if "\0q" not in probe:
        raise ValueError("a custom instructions template must contain {question}")
    return instructions


NO_RESULTS = "No search results are found."


def information(text: str) -> str:
    """Wrap a tool result the way the agent expects to read it."""
    return f"<information>\n{text}\n</information>"


def format_hits(hits: Sequence[SearchHit], doc_chars: int) -> str:
    """Search results as ASearcher prints them: `[Doc k](url):` then the title and snippet."""
    if not hits:
        return NO_RESULTS
    blocks = []
    for k, hit in enumerate(hits, 1):
        body = f"{hit.title}\n{hit.snippet}".strip()[:doc_chars]
        blocks.append(f"[Doc {k}]({hit.url}):\n{body}")
    return "\n\n".join(blocks)


def format_chunk(title: str, chunk: str, number: int, total: int) -> str:
    """One part of a page, headed with its number so the agent knows where it is."""
    more = "Access the same url again for the next part." if number < total else "This is the last part."
    return f">>>> Page {number} >>>> (of {total}) {title}\n{chunk}\n[{more}]"


def invalid_action(errors: Sequence[str], tool_format: str) -> str:
    """Tell the agent what went wrong and what a valid turn looks like."""
    example = (
        '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>'
        if tool_format == "hermes"
        else "<search> query </search>, <access> url </access> or <answer> answer </answer>"
    )
    return f"Your last turn had no valid tool call ({'; '.join(errors)}). Make exactly one call: {example}."
