"""Parts for eval tests that need answers and verdicts fast: an agent with known odds and a stub LLM judge server.

`NoisyOracle` is a real workflow (run by `run_eval` through `--workflow`) that searches 0-2 times and then
answers right, right with extra words, or wrong, decided by the episode seed, so scores are non-zero,
vary with the run's seed, and split the judges (EM says no to "ANSWER or so", a covering judge says yes).
`judge_app` is an OpenAI-compatible chat endpoint on loopback serving two judge "models" that both call an
answer Correct when it contains a labelled answer; it records every request body it was sent.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from aiohttp import web

from searchgym.agents.trajectory import Trajectory
from searchgym.agents.workflow import ChatWorkflow
from searchgym.envs.judges import normalize_answer
from searchgym.envs.search_env import SearchEnv

JUDGE_MODELS = ("judge-a", "judge-b")


class NoisyOracle(ChatWorkflow):
    """Answers each episode right (1/2), right plus extra words (1/4) or wrong (1/4), after 0-2 searches."""

    async def arun_episode(
        self, env: SearchEnv, *, seed: int | None = None, options: dict[str, Any] | None = None, rid: str | None = None
    ) -> Trajectory:
        rng = random.Random(seed)
        _, traj = await self.start_episode(env, seed, options)
        for _ in range(rng.randint(0, 2)):
            step = await self.step_env(env, traj, f"<search>{env.task.question}</search>", 0.0)
            if step.done:
                return traj
            traj.messages.append({"role": "user", "content": step.observation})
        draw, answer = rng.random(), env.task.answers[0]
        text = answer if draw < 0.5 else (f"{answer} or so" if draw < 0.75 else "nobody knows")
        await self.step_env(env, traj, f"<answer>{text}</answer>", 0.0)
        return traj


def judge_app(requests: list[dict[str, Any]]) -> web.Application:
    """/v1/models lists JUDGE_MODELS; /v1/chat/completions answers ASearcher's verdict block (cover match)."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "tests"} for m in JUDGE_MODELS]}
        )

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append(body)
        prompt = body["messages"][-1]["content"]
        prediction = re.search(r"^Predicted answer: (.*)$", prompt, re.MULTILINE).group(1)
        labels = re.search(r"^Labelled answer\(s\): (.*)$", prompt, re.MULTILINE).group(1).split(" | ")
        correct = any(normalize_answer(label) in normalize_answer(prediction) for label in labels)
        content = "Checked.\n" + json.dumps({"rationale": "stub", "judgement": "Correct" if correct else "Incorrect"})
        return web.json_response(
            {
                "id": "stub",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app
