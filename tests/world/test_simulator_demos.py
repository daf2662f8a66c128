"""Demonstrations of the simulated search engine cut from the world: useful ones hold the answer, noisy ones never,
every reply parses, the prompts are the very ones SimulatedSearch sends, and the demonstrated questions are not the
measured ones."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.envs.answer_text import holds_answer
from searchgym.envs.tools.base import SEARCHING_FOR
from searchgym.envs.tools.simulated_search import SimulatedSearch, SimulatorOptions, parse_documents
from searchgym.world.simulator_demos import demo_tasks, one_hop_tasks, simulator_demos
from searchgym.world.world import World


class RecordingChat:
    """A ChatModel double that records the messages of every call and replies with one fixed document."""

    def __init__(self) -> None:
        self.calls: list[list[dict[str, Any]]] = []

    async def achat(self, messages: list[dict[str, Any]], **sampling: Any) -> str:
        self.calls.append(messages)
        return "Title: t\nURL: u\nText: x"


@pytest.fixture(scope="module")
def world() -> World:
    return World(300, 0)


def _sent(prompts: str, task: Any, n: int, kind: str) -> list[dict[str, Any]]:
    chat = RecordingChat()
    engine = SimulatedSearch(chat, SimulatorOptions(noise=0.0 if kind == "useful" else 1.0, prompts=prompts))
    token = SEARCHING_FOR.set((task.question, tuple(task.answers)))
    try:
        asyncio.run(engine.search(task.question, n))
    finally:
        SEARCHING_FOR.reset(token)
    (messages,) = chat.calls
    return messages


@pytest.mark.parametrize("prompt_set", ["answer_aware", "blind"])
def test_demos_are_what_the_engine_is_asked_and_hold_the_answer_only_when_useful(world, prompt_set):
    tasks = demo_tasks(world, 12, one_hop_tasks(world, 4, 0), 0)
    demos = simulator_demos(world, tasks, prompt_set=prompt_set, max_docs=3, seed=0)
    assert [d["kind"] for d in demos] == ["useful", "noisy"] * len(tasks)
    by_id = {t.id: t for t in tasks}
    for demo in demos:
        task = by_id[demo["task_id"]]
        system, user, reply = demo["messages"]
        docs = parse_documents(reply["content"])
        assert 1 <= len(docs) <= 3 and reply["role"] == "assistant"
        assert [system, user] == _sent(prompt_set, task, len(docs), demo["kind"])
        for doc in docs:
            if demo["kind"] == "useful":
                assert holds_answer(doc["text"], task.answers)
            else:
                assert not holds_answer(f"{doc['title']} {doc['text']}", task.answers)
        assert len({d["text"] for d in docs}) == len(docs)  # no repeated document


def test_demo_questions_are_disjoint_from_the_measured_ones_and_deterministic(world):
    held = one_hop_tasks(world, 6, 0)
    tasks = demo_tasks(world, 10, held, 0)
    assert len(tasks) == 10
    assert not {t.question for t in held} & {t.question for t in tasks}
    assert not {t.metadata["entity_id"] for t in held} & {t.metadata["entity_id"] for t in tasks}
    assert simulator_demos(world, tasks, seed=3) == simulator_demos(world, tasks, seed=3)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 40), st.integers(1, 4), st.integers(0, 10**6))
def test_any_question_any_count_any_seed_gives_faithful_demos(world, start, max_docs, seed):
    (task,) = one_hop_tasks(world, start + 1, 0)[start:]
    useful, noisy = simulator_demos(world, [task], max_docs=max_docs, seed=seed)
    for demo, held in ((useful, True), (noisy, False)):
        docs = parse_documents(demo["messages"][2]["content"])
        assert 1 <= len(docs) <= max_docs
        assert all(holds_answer(f"{d['title']} {d['text']}", task.answers) == held for d in docs)
