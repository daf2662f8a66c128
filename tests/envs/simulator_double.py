"""A scripted chat server that plays the simulated search engine's model (a test double, loopback only)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from aiohttp import web

from searchgym.testing.stand_in_llm import chat_completion, serve_in_thread

TASKS = [
    {"id": "t1", "question": "What colour is the lighthouse of Teslin Bay?", "answer": "green"},
    {"id": "t2", "question": "Who founded the Orrin Vale Observatory?", "answer": "Mirela Kost"},
]
FACTS = {
    "lighthouse": "The lighthouse of Teslin Bay is painted green.",
    "observatory": "The Orrin Vale Observatory was founded by Mirela Kost in 1931.",
}


class ScriptedSimulator:
    """TEST DOUBLE on /v1/chat/completions: writes the asked number of documents, useful ones holding the fact
    the query is about, noisy ones about something else; `mode` "garbage" writes no document at all."""

    def __init__(self, mode: str = "ok"):
        self.mode, self.requests = mode, []

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        self.requests.append(prompt)
        query = re.search(r"^Query: (.*)$", prompt, re.M).group(1)
        n = int(re.search(r"Write (\d+) documents", prompt).group(1))
        noisy = "do not contain" in prompt
        fact = next((f for key, f in FACTS.items() if key in query.lower()), "Nothing is known about this.")
        docs = [
            f"Title: {'Cheese of the valley' if noisy else query.title()} {i}\nURL: http://x/{i}\n"
            f"Text: {'Cheese is made in the valley.' if noisy else fact}"
            for i in range(n)
        ]
        content = "no documents today" if self.mode == "garbage" else "\n\n".join(docs)
        return chat_completion(content, body["model"], usage=(10, 20))


@contextlib.contextmanager
def simulator_server(double: ScriptedSimulator) -> Iterator[str]:
    """Serve the double on loopback; yields its engine spec (openai:URL/v1:simulator)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", double.chat)
    with serve_in_thread(app) as url:
        yield f"openai:{url}/v1:simulator"
