"""The three servers `searchgym bench load` drives: how each starts, what a client sends, and the answer it expects.

Every answer under load is checked against the same request's answer taken alone before the load (greedy
generations, ranked hits, an episode's observations and reward), so a wrong answer counts as an error too.
- model: `serve model` on the tiny model; `single` is one prompt a /generate, `batched` eight (max_new_tokens 4);
- search: `serve search` on a small bundle's index; `single` is one query a /retrieve, `batched` 32;
- env: `serve env` (OpenEnv over WebSocket, through OpenEnv's own `GenericEnvClient`) playing reset, search,
  answer; OpenEnv has no batch route, so `single` opens a session per episode and `reused` keeps one for all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

MAX_NEW_TOKENS = 4
MODEL_BATCH = 8
SEARCH_BATCH = 32
TOPK = 3

# (seconds or None when no request's latency, items answered as alone, error kind or None)
Record = Callable[["float | None", int, "str | None"], None]


class WrongAnswer(Exception):
    """An answer under load that differs from the same request's answer alone."""


async def post_json(http: aiohttp.ClientSession, url: str, body: Any, timeout: float) -> Any:
    """POST `body`; the JSON reply, or an error named by its status (`http 503`)."""
    async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        data = await resp.read()
        if resp.status != 200:
            raise HttpStatus(resp.status, data[:200].decode("utf-8", "replace"))
        return json.loads(data)


class HttpStatus(Exception):
    """A reply that was not 200."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"http {status}: {text}")
        self.status = status


def error_kind(e: BaseException) -> str:
    """A short name for what went wrong: `http 503`, `wrong answer`, or the exception's type."""
    if isinstance(e, HttpStatus):
        return f"http {e.status}"
    if isinstance(e, WrongAnswer):
        return "wrong answer"
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    return type(e).__name__


async def timed(record: Record, items: int, call: Any) -> Any:
    """Await `call`, recording its latency and its items (0 and the error's kind if it failed)."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        result = await call
    except Exception as e:  # noqa: BLE001 -- every failure is counted by kind, never raised out of a client
        record(loop.time() - t0, 0, error_kind(e))
        return e
    record(loop.time() - t0, items, None)
    return result


class ModelTarget:
    """`serve model` on the tiny model: greedy generations of a few tokens."""

    name, modes = "model", ("single", "batched")

    def __init__(self, model_dir: Path, n_prompts: int = 32) -> None:
        self.model_dir = model_dir
        self.prompts = [f"Question {i}: which company published the book number {i}?" for i in range(n_prompts)]
        self.reference: list[list[int]] = []

    def argv(self, port: int) -> list[str]:
        return ["serve", "model", "--model", str(self.model_dir), "--port", str(port)]

    def _body(self, texts: str | list[str]) -> dict[str, Any]:
        return {"text": texts, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0}}

    async def prepare(self, http: aiohttp.ClientSession, url: str) -> None:
        self.reference = [
            (await post_json(http, url + "/generate", self._body(p), 120))["output_ids"] for p in self.prompts
        ]

    async def client(
        self, http: aiohttp.ClientSession, url: str, mode: str, i: int, rounds: int, record: Record, timeout: float
    ) -> None:
        for r in range(rounds):
            n = MODEL_BATCH if mode == "batched" else 1
            picks = [(i * rounds + r) * n + j for j in range(n)]
            picks = [k % len(self.prompts) for k in picks]
            texts = [self.prompts[k] for k in picks]

            async def call(texts: list[str], n: int, picks: list[int]) -> None:
                out = await post_json(http, url + "/generate", self._body(texts if n > 1 else texts[0]), timeout)
                outs = out if n > 1 else [out]
                if [o["output_ids"] for o in outs] != [self.reference[k] for k in picks]:
                    raise WrongAnswer(f"prompts {picks}")

            await timed(record, n, call(texts, n, picks))

    def oversized(self, nbytes: int) -> tuple[str, dict[str, Any]]:
        return "/generate", self._body("x " * (nbytes // 2))


class SearchTarget:
    """`serve search` over a small built index: ranked hits (ids) of task questions."""

    name, modes = "search", ("single", "batched")

    def __init__(self, index_dir: Path, queries: list[str]) -> None:
        self.index_dir, self.queries = index_dir, queries
        self.reference: list[list[str]] = []

    def argv(self, port: int) -> list[str]:
        return ["serve", "search", "--index", str(self.index_dir), "--port", str(port)]

    @staticmethod
    def _ids(out: dict[str, Any]) -> list[list[str]]:
        return [[doc["id"] for doc in hits] for hits in out["result"]]

    async def prepare(self, http: aiohttp.ClientSession, url: str) -> None:
        self.reference = [
            self._ids(await post_json(http, url + "/retrieve", {"queries": [q], "topk": TOPK}, 60))[0]
            for q in self.queries
        ]

    async def client(
        self, http: aiohttp.ClientSession, url: str, mode: str, i: int, rounds: int, record: Record, timeout: float
    ) -> None:
        for r in range(rounds):
            n = SEARCH_BATCH if mode == "batched" else 1
            picks = [((i * rounds + r) * n + j) % len(self.queries) for j in range(n)]

            async def call(picks: list[int]) -> None:
                out = await post_json(
                    http, url + "/retrieve", {"queries": [self.queries[k] for k in picks], "topk": TOPK}, timeout
                )
                if self._ids(out) != [self.reference[k] for k in picks]:
                    raise WrongAnswer(f"queries {picks}")

            await timed(record, n, call(picks))

    def oversized(self, nbytes: int) -> tuple[str, dict[str, Any]]:
        return "/retrieve", {"queries": ["word " * (nbytes // 5)], "topk": TOPK}


class EnvTarget:
    """`serve env` (OpenEnv over WebSocket): episodes of reset, search the task's start query, answer it."""

    name, modes = "env", ("single", "reused")

    def __init__(
        self, env_id: str, env_kwargs: dict[str, Any], tasks: list[tuple[str, str, str]], max_sessions: int
    ) -> None:
        self.env_id, self.env_kwargs, self.max_sessions = env_id, env_kwargs, max_sessions
        self.tasks = tasks  # (task id, start query, answer) by index
        self.reference: list[tuple[str, float | None]] = []

    def argv(self, port: int) -> list[str]:
        return [
            "serve",
            "env",
            self.env_id,
            "--env-kwargs",
            json.dumps(self.env_kwargs),
            "--port",
            str(port),
            "--max-sessions",
            str(self.max_sessions),
        ]

    async def _episode(self, client: Any, k: int, record: Record | None, timeout: float) -> tuple[str, float | None]:
        """reset(index=k), search, answer: (the search step's text, the final reward); each message one request."""
        task_id, query, answer = self.tasks[k]
        steps = [
            lambda: client.reset(index=k),
            lambda: client.step({"tool": "search", "argument": query}),
            lambda: client.step({"tool": "answer", "argument": answer}),
        ]
        results = []
        for step in steps:
            call = asyncio.wait_for(step(), timeout)
            result = await (timed(record, 1, call) if record else call)
            if isinstance(result, Exception):
                raise _Counted() from result
            results.append(result)
        if results[0].observation.get("task_id") != task_id:
            raise WrongAnswer(f"reset(index={k}) gave task {results[0].observation.get('task_id')}")
        return results[1].observation.get("text"), results[2].reward

    async def prepare(self, http: aiohttp.ClientSession, url: str) -> None:
        from openenv.core import GenericEnvClient

        async with GenericEnvClient(base_url=url) as client:
            self.reference = [await self._episode(client, k, None, 60) for k in range(len(self.tasks))]
        wrong = [k for k, (_, reward) in enumerate(self.reference) if reward != 1.0]
        if wrong:  # the reference episodes answer each task's own answer: anything else is a broken reference
            raise RuntimeError(f"env reference: tasks {wrong[:5]} did not score 1.0 with their own answer")

    async def client(
        self, http: aiohttp.ClientSession, url: str, mode: str, i: int, rounds: int, record: Record, timeout: float
    ) -> None:
        from openenv.core import GenericEnvClient

        session: Any = None
        try:
            for r in range(rounds):
                k = (i * rounds + r) % len(self.tasks)
                if session is None:
                    try:
                        session = await GenericEnvClient(
                            base_url=url, connect_timeout_s=timeout, message_timeout_s=timeout
                        ).__aenter__()
                    except Exception as e:  # noqa: BLE001 -- a refused session is counted like a failed request
                        record(None, 0, f"connect: {error_kind(e)}")
                        continue
                try:
                    if await self._episode(session, k, record, timeout) != self.reference[k]:
                        record(None, -3, "wrong answer")  # take back the episode's three items
                except _Counted:
                    await _close(session)
                    session = None
                    continue
                if mode == "single":
                    await _close(session)
                    session = None
        finally:
            if session is not None:
                await _close(session)

    def oversized(self, nbytes: int) -> tuple[str, dict[str, Any]]:
        return "/step", {"action": {"text": "x" * nbytes}}


class _Counted(Exception):
    """A message of an episode failed and was recorded already: the episode stops there."""


async def _close(client: Any) -> None:
    try:
        await client.close()
    except Exception:  # noqa: BLE001 -- a session that broke under load may not close cleanly; it was counted
        pass
