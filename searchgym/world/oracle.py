"""The validation oracle: a scripted agent that knows a task's path and must walk it with the env's tools.

It reads only the task's metadata (the path of pages, the phrase to search for the start, the fact
to find on each page), searches for each page by name, opens it from the results and reads parts
until the next fact shows up, then answers. A task it cannot solve through the environment is a
task whose evidence the index does not retrieve, and is rejected. Its episodes double as
demonstrations of tool use (for a supervised warm start).
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from searchgym.envs.actions import ARGUMENT_KEYS
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import Task
from searchgym.world.prover import part_body


@dataclass
class OracleResult:
    """What happened when the oracle played one task."""

    task_id: str
    solved: bool
    reward: float
    failure: str | None = None
    turns: list[dict[str, str]] = field(default_factory=list)  # {"action", "observation"} per step
    prompt: str = ""  # the episode's first observation

    def messages(self) -> list[dict[str, str]]:
        """The episode as a chat (prompt, then action / observation turns), the last observation left out."""
        chat = [{"role": "user", "content": self.prompt}]
        for i, turn in enumerate(self.turns):
            chat.append({"role": "assistant", "content": turn["action"]})
            if i + 1 < len(self.turns):
                chat.append({"role": "user", "content": turn["observation"]})
        return chat


Script = Generator[
    str, tuple[str, dict[str, Any]], "str | None"
]  # yields actions, is sent (obs, info), returns a failure


class OracleAgent:
    """Plays a task from its metadata through the env's tools, exactly as an agent would.

    `script(task, max_page_chunks)` is the policy: a generator that yields each turn's action and is
    sent the env's (observation, info) back; it returns None after answering, or why it gave up.
    `arun` plays it into an `OracleResult` (task validation); `searchgym.agents.scripted.ScriptedWorkflow`
    plays the same script into a Trajectory (demonstrations for a warm start).

    `skim` moves on as soon as the fact it needs shows in the search results (short demonstrations);
    by default it always opens the page (what task validation needs). `think` writes a one-line
    thought before each call. `question_query` makes the first search the question itself, verbatim
    (Search-R1's habit, and a copy a very small model can learn); a task whose page that query does
    not retrieve is then not solved. `tool_format` is how it writes its calls: "tags" or "hermes"
    (`<tool_call>` JSON), so demonstrations for a Hermes-format env teach that env's format. `replay_proofs`
    plays a min-calls question by its proof's witness play (the fewest calls, what validation checks); without it,
    by its path like any question: a witness play often opens by searching the answer verbatim (a lucky guess is
    in the prover's action set), which a demonstration must never teach.
    """

    def __init__(
        self,
        *,
        skim: bool = False,
        think: bool = True,
        question_query: bool = False,
        tool_format: str = "tags",
        replay_proofs: bool = True,
    ):
        if tool_format not in ("tags", "hermes"):
            raise ValueError(f"tool_format must be 'tags' or 'hermes', got {tool_format!r}")
        self.skim, self.think, self.question_query = skim, think, question_query
        self.tool_format, self.replay_proofs = tool_format, replay_proofs

    def script(self, task: Task, max_page_chunks: int) -> Script:
        """The oracle's turns on `task`: look up each page of its path (or replay a min-calls proof's play, with
        `replay_proofs`), then answer."""
        if self.replay_proofs and "min_calls_proof" in task.metadata:
            return (yield from self._replay(task))
        for query, url, expect in self._lookups(task, self.question_query):
            obs, _ = yield self._thought(f"I need the page about {query}.") + self._call("search", query)
            if f"({url})" not in obs:
                return f"not retrieved: searching {query!r} does not return {url}"
            if self.skim and expect in obs:
                continue
            for _ in range(max_page_chunks):
                obs, info = yield self._call("access", url)
                if expect in obs:
                    break
                page = info.get("page") or {}
                if page.get("chunk") is None or page["chunk"] >= page["chunks"]:
                    return f"fact missing: {expect!r} is not on {url}"
            else:
                return f"fact missing: {expect!r} is not on {url}"
        answer = task.answers[0]
        yield self._thought(f"So the answer is {answer}.") + self._call("answer", answer)
        return None

    def _replay(self, task: Task) -> Script:
        """The witness play of the task's min-calls proof, call by call; the last observation must show the answer."""
        meta = task.metadata
        obs, read, last = "", "", None
        for tool, argument in meta["min_calls_proof"]["play"]:
            obs, _ = yield self._call(tool, argument)
            same_page = tool == "access" and last == ("access", argument)
            read = (read if same_page else "") + (part_body(obs) if tool == "access" else "")  # a page's parts, joined
            last = (tool, argument)
        # the answer's text (on the answer page), or for an entity answer its own page naming the answer page's entity
        shown = [meta["answer_on_page"]] + ([meta["path"][-1]["name"]] if meta.get("answer_type") == "entity" else [])
        if not any(text in seen for text in shown for seen in (obs, read)):
            return f"not observed: the proof's play does not show {meta['answer_on_page']!r}"
        answer = task.answers[0]
        yield self._thought(f"So the answer is {answer}.") + self._call("answer", answer)
        return None

    async def arun(self, env: SearchEnv, task: Task) -> OracleResult:
        """Play the script on `task` in `env`; solved when the env judged its answer correct."""
        first, _ = await env.areset(options={"task_id": task.id})
        result = OracleResult(task.id, solved=False, reward=0.0, prompt=first)
        script = self.script(task, env.max_page_chunks)
        action = next(script)
        while True:
            obs, reward, terminated, truncated, info = await env.astep(action)
            result.turns.append({"action": action, "observation": obs})
            if terminated:
                result.reward = reward
                result.solved = bool(info.get("verdict", {}).get("correct"))
                result.failure = None if result.solved else "judged wrong"
                return result
            if truncated:
                result.failure = f"budget: {info.get('truncation')}"
                return result
            try:
                action = script.send((obs, info))
            except StopIteration as stop:
                result.failure = stop.value
                return result

    @staticmethod
    def _lookups(task: Task, question_query: bool = False) -> list[tuple[str, str, str]]:
        """(query, page url, text that must be on that page) for each page the task needs."""
        meta = task.metadata
        path = meta["path"]
        if meta["kind"] == "comparison":
            return [(ref["name"], ref["url"], value) for ref, value in zip(path, meta["values_on_page"], strict=True)]
        expects = [ref["name"] for ref in path[1:]] + [meta["answer_on_page"]]
        queries = [task.question if question_query else meta["start_query"]] + [ref["name"] for ref in path[1:]]
        return [(q, ref["url"], e) for q, ref, e in zip(queries, path, expects, strict=True)]

    def _call(self, tool: str, argument: str) -> str:
        """One tool call in the oracle's format; tags are spaced as the prompts show them."""
        if self.tool_format == "hermes":
            call = {"name": tool, "arguments": {ARGUMENT_KEYS[tool][0]: argument}}
            return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
        return f"<{tool}> {argument} </{tool}>"

    def _thought(self, text: str) -> str:
        return f"<think>{text}</think>\n" if self.think else ""
