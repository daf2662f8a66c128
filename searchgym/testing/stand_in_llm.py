"""A scripted stand-in for a chat LLM that drives the QA-synthesis agent down every path, for tests and the
reliability bench (loopback only; never a model).

It speaks the OpenAI chat completions wire format on /v1/chat/completions, so the agent runs through its
real OpenAIEngine client; `stand_in_server` serves it from a thread of its own, so blocking callers (a CLI
in a subprocess, `asyncio.run` in the caller's thread) can reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web

from searchgym.envs.judges import normalize_answer
from searchgym.serve.http import serve_app


def _find(pattern: str, text: str, flags: int = 0) -> str:
    """The first group of `pattern` in `text`: the stand-in knows its prompts, so no match is a bug to name."""
    match = re.search(pattern, text, flags)
    if match is None:
        raise ValueError(f"the stand-in LLM found no {pattern!r} in its prompt")
    return match.group(1)


class StandInLLM:
    """TEST DOUBLE: a rule-based stand-in for a chat LLM on /v1/chat/completions (loopback only).

    It recognises each of the agent's prompts by its heading and answers by rule. Its behaviour per seed
    page comes from `scenarios` (page title -> scenario; default "accept"); every question it writes is
    remembered, so later prompts (solver, judge) that quote a question map back to the scenario.
    """

    def __init__(
        self, scenarios: dict[str, str] | None = None, faults: Callable[[int, str], str | None] | None = None
    ) -> None:
        self.scenarios = dict(scenarios or {})
        # faults(request number, prompt) -> None, "503" or "429" (an error with Retry-After: 0), "cut" (half
        # the reply, finish_reason "length") or "empty" (an empty reply): an endpoint that fails as real ones do,
        # and a model that loops to its token budget or says nothing, for outage and bad-output tests
        self.faults = faults
        self.questions: dict[str, dict[str, Any]] = {}  # question -> {"scenario", "answer", "turn"}
        self.requests = 0
        self.lock = threading.Lock()

    # ---- rules ------------------------------------------------------------------------------------------
    def _entry(self, prompt: str) -> dict[str, Any]:
        line = _find(r"^(?:Current question|Question): (.*)$", prompt, re.M)
        return self.questions[line.strip()]

    def _remember(self, question: str, scenario: str, answer: str, turn: int = 0) -> str:
        self.questions[question] = {"scenario": scenario, "answer": answer, "turn": turn}
        return question

    def reply(self, prompt: str) -> str:
        if prompt.startswith("## Task: read a page"):
            title = _find(r"^Title: (.*)$", prompt, re.M)
            if self.scenarios.get(title) == "malformed":
                return 'Here you go: {"summary": "cut short, "points": [}'
            text = prompt.split("Page:\n", 1)[1]
            first = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
            reading = {"summary": f"A page about {title}.", "points": [first, f"The page is titled {title}."]}
            return "Reading done.\n```json\n" + json.dumps(reading) + "\n```"
        if prompt.startswith("## Task: propose a question"):
            title = _find(r'of the page "(.*)"', prompt)
            scenario = self.scenarios.get(title, "accept")
            first = _find(r"^- (.*)$", prompt, re.M)
            question = "Who or what is this: " + first.replace(title, "this subject").rstrip(".") + "?"
            self._remember(question, scenario, title)
            if scenario == "missing":
                return json.dumps({"question": question, "statement": first})
            return json.dumps({"question": question, "answer": title, "statement": first})
        if prompt.startswith("## Task: make the question harder"):
            entry = self._entry(prompt)
            entry["turn"] += 1
            question = _find(r"^Current question: (.*)$", prompt, re.M)
            if entry["turn"] == 1:  # FUZZ: hide the year (or blur the wording)
                fuzzed = re.sub(r"\b\d{3,4}\b", "a certain year", question)
                fuzzed = fuzzed if fuzzed != question else question.replace("Who or what", "Which subject")
                answer = "Somebody Else" if entry["scenario"] == "answer_changed" else entry["answer"]
                self.questions[fuzzed] = entry
                return json.dumps({"action": "FUZZ", "question": fuzzed, "answer": answer, "reason": "year"})
            if entry["turn"] == 2:
                link = re.search(r"^- (https?://\S+)$", prompt, re.M)
                if link:
                    return json.dumps({"action": "INJECT", "url": link.group(1)})
            return 'Enough. {"action": "EXIT"}'
        if prompt.startswith("## Task: inject a fact"):
            entry = self._entry(prompt)
            question = _find(r"^Current question: (.*)$", prompt, re.M)
            linked = _find(r'^Linked page "(.*)"', prompt, re.M)
            new = question.rstrip("?") + f", and is connected to {linked}?"
            self.questions[new] = entry
            return json.dumps(
                {"statement": f"This subject is connected to {linked}.", "question": new, "answer": entry["answer"]}
            )
        if prompt.startswith("## Task: check a question's quality"):
            ok = self._entry(prompt)["scenario"] != "quality"
            return json.dumps(
                {
                    "fluent": ok,
                    "self_contained": True,
                    "unique_answer": True,
                    "supported": True,
                    "reason": "reads well" if ok else "a concatenation",
                }
            )
        if prompt.startswith("## Task: answer a question without tools"):
            entry = self._entry(prompt)
            guess = {"easy": entry["answer"], "nonunique": "Other Candidate"}.get(entry["scenario"], "Nobody Known")
            return "Hmm, hard.\n" + json.dumps({"answer": guess})
        if prompt.startswith("You are grading an answer"):
            labels = _find(r"^Labelled answer\(s\): (.*)$", prompt, re.M).split(" | ")
            predicted = _find(r"^Predicted answer: (.*)$", prompt, re.M)
            ok = any(normalize_answer(predicted) == normalize_answer(label) for label in labels)
            return json.dumps({"rationale": "compared", "judgement": "Correct" if ok else "Incorrect"})
        if prompt.startswith("## Task: check an alternative answer"):
            fits = self._entry(prompt)["scenario"] == "nonunique"
            return json.dumps({"satisfies_all": fits, "reason": "checked"})
        return "I do not understand."

    # ---- the wire format ----------------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        with self.lock:
            self.requests += 1
            fault = self.faults(self.requests, prompt) if self.faults else None
            if fault in ("503", "429"):
                return web.json_response(
                    {"error": {"message": "the stand-in is unavailable"}},
                    status=int(fault),
                    headers={"Retry-After": "0"},
                )
            content = self.reply(prompt)
        finish = "stop"
        if fault == "cut":
            content, finish = content[: len(content) // 2], "length"
        elif fault == "empty":
            content = ""
        return chat_completion(content, body.get("model", "stand-in"), finish=finish, rid=f"standin-{self.requests}")


def chat_completion(
    content: str, model: str, *, finish: str = "stop", rid: str = "standin", usage: tuple[int, int] = (1, 1)
) -> web.Response:
    """An OpenAI chat.completion response holding `content` (for the test doubles of chat LLMs)."""
    return web.json_response(
        {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
        }
    )


@contextlib.contextmanager
def stand_in_server(double: StandInLLM) -> Iterator[str]:
    """Serve the stand-in on a free loopback port from a thread of its own; yields the base URL (…/v1)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", double.chat)
    with serve_in_thread(app) as url:
        yield url + "/v1"


@contextlib.contextmanager
def serve_in_thread(app: web.Application) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 (a free port) from a thread with its own event loop; yields the base URL."""
    started: list[Any] = []  # the URL, or what kept the server from starting
    ready = threading.Event()
    handles: dict[str, Any] = {}

    async def main() -> None:
        handles["loop"], handles["stop"] = asyncio.get_running_loop(), asyncio.Event()
        async with serve_app(app, "127.0.0.1", 0, shutdown_timeout=0.1) as url:
            started.append(url)
            ready.set()
            await handles["stop"].wait()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 -- handed to the caller instead of a silent dead thread
            started.append(e)
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(60)
    if not started or isinstance(started[0], BaseException):
        raise RuntimeError(f"the server did not start: {started[0] if started else 'no answer in 60 s'}")
    try:
        yield started[0]
    finally:
        handles["loop"].call_soon_threadsafe(handles["stop"].set)
        thread.join(30)
