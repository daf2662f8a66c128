"""KB-walk questions are right by the KB, unambiguous, and reachable through the env's own tools."""

import asyncio
import json
from collections import Counter

import pytest

from searchgym.agents.scripted import demonstrations
from searchgym.envs.judges import normalize_answer
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import Task, TaskPool
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.world import schema
from searchgym.world.kbwalk import DESCRIPTIONS, KBWalker
from searchgym.world.oracle import OracleAgent
from searchgym.world.validation import synthesize_pool
from searchgym.world.world import World
from tests.conftest import SMALL


@pytest.fixture(scope="module")
def world():
    return World(SMALL["size"], SMALL["seed"])


def walk_answer(world: World, task: Task) -> str:
    """Recompute a chain task's answer from the KB alone, by following its relations."""
    entity = world.entity(int(task.metadata["path"][0]["id"]))
    *walk, final = task.metadata["relations"]
    for relation in walk:
        entity = world.entity(entity.rels[relation])
    if final in entity.rels:
        return world.name(entity.rels[final])
    return schema.format_value(schema.attribute(entity.type, final).kind, entity.attrs[final])


def test_every_task_is_right_by_the_kb(world, small_pool):
    for task in small_pool:
        meta = task.metadata
        assert meta["path"][-1 if meta["kind"] == "chain" else 0]["url"].startswith(
            "https://world.searchgym.test/wiki/"
        )
        assert 1 <= meta["hops"] <= 4 and meta["split"] in ("train", "test")
        if meta["kind"] == "chain":
            assert len(meta["relations"]) == meta["hops"] == len(meta["path"])
            assert task.answers[0] == walk_answer(world, task)
            assert len({ref["id"] for ref in meta["path"]}) == len(meta["path"]), "a walk never revisits an entity"
        else:
            a, b = (world.entity(int(ref["id"])) for ref in meta["path"])
            attr = meta["relations"][0]
            assert a.attrs[attr] != b.attrs[attr] and task.answers[0] in (a.name, b.name)
            assert a.name in task.question and b.name in task.question
        if meta["kind"] == "chain":  # a comparison names both candidates by design
            padded = f" {normalize_answer(task.question)} "
            assert all(f" {normalize_answer(ans)} " not in padded for ans in task.answers), "answer given away"


def test_fuzzed_descriptions_fit_exactly_one_entity(world, small_pool):
    fuzzed = [t for t in small_pool if t.metadata["fuzzed"]]
    assert fuzzed, "the default pool has fuzzed questions"
    for task in fuzzed:
        start = world.entity(int(task.metadata["path"][0]["id"]))
        fields, _ = DESCRIPTIONS[start.type]
        key = lambda e, fields=fields: tuple(e.rels.get(f, e.attrs.get(f)) for f in fields)  # noqa: E731
        twins = [e.eid for e in world if e.type == start.type and key(e) == key(start)]
        assert twins == [start.eid]
        assert start.name not in task.question and task.metadata["start_query"] in task.question


def test_pool_covers_hops_kinds_and_splits(small_pool):
    hops = Counter(t.metadata["hops"] for t in small_pool)
    kinds = Counter(t.metadata["kind"] for t in small_pool)
    assert set(hops) == {1, 2, 3, 4} and set(kinds) == {"chain", "comparison"}
    assert 0 < len(small_pool.filter(split="test")) < len(small_pool) / 4
    assert len({t.question for t in small_pool}) == len(small_pool), "no duplicate questions"


def test_oracle_solves_one_and_two_hop_tasks_through_the_env(small_bundle):
    report = json.loads((small_bundle / "report.json").read_text())
    rates = report["oracle_solve_rate_by_hops"]
    assert rates["1"] >= 0.95 and rates["2"] >= 0.95, rates
    assert report["accepted"] == SMALL["n_tasks"]


def test_oracle_rejects_a_task_the_index_cannot_serve(tmp_path, world, small_pool):
    """Validation is real: remove the answer page from the corpus and the oracle fails the task."""
    task = next(t for t in small_pool if t.metadata["kind"] == "chain" and t.metadata["hops"] == 2)
    missing = task.metadata["path"][-1]["url"]
    rows = [world.page_row(e) for e in world if e.url != missing]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    index = LocalIndex.build(corpus, tmp_path / "index")
    env = SearchEnv(TaskPool([task]), index)
    result = asyncio.run(OracleAgent().arun(env, task))
    assert not result.solved and result.failure.startswith("not retrieved")


def test_synthesis_is_seeded(world, small_index):
    a, _ = synthesize_pool(world, small_index, 30, seed=5)
    b, _ = synthesize_pool(world, small_index, 30, seed=5)
    c, _ = synthesize_pool(world, small_index, 30, seed=6)
    assert [t.to_row() for t in a] == [t.to_row() for t in b]
    assert [t.question for t in a] != [t.question for t in c]


def test_hop_weights_are_respected(world):
    walker = KBWalker(world, seed=1, comparison_prob=0.0, hop_weights={3: 1.0})
    stream = walker.candidates()
    assert {next(stream).metadata["hops"] for _ in range(30)} == {3}
    with pytest.raises(ValueError, match="between 1 and 4"):
        KBWalker(world, hop_weights={5: 1.0})


def test_question_query_demonstrations_search_the_question_verbatim(small_index, small_pool):
    env = SearchEnv(small_pool.filter(hops=1), small_index, top_k=3)
    chats = asyncio.run(demonstrations(env, list(env.tasks)[:20], question_query=True))
    assert len(chats) >= 15  # the question finds its page nearly always
    by_question = {t.question: t for t in env.tasks}
    for chat in chats:
        question = chat[0]["content"].rsplit("Question: ", 1)[1]
        assert chat[1]["content"] == f"<search> {question} </search>"
        assert chat[-1]["content"] == f"<answer> {by_question[question].answers[0]} </answer>"


def test_drop_given_links_leaves_out_questions_whose_start_names_a_later_hop(world):
    """A described start may name the entity its first relation leads to ("the city in Zethinia founded in 657 lies
    in" Zethinia): then a k-hop question needs k - 1 lookups. SyntheticQA(drop_given_links=True) leaves those out."""
    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the env ids)
    from searchgym.world.kbwalk import start_gives_link

    every = gym.make("searchgym/SyntheticQA-v0", **SMALL).unwrapped.tasks
    strict = gym.make("searchgym/SyntheticQA-v0", **SMALL, drop_given_links=True).unwrapped.tasks
    given = [t for t in every if start_gives_link(t)]
    assert given and len(strict) == len(every) - len(given) and not any(start_gives_link(t) for t in strict)
    for task in given:  # each is a described start naming an entity of its own path that the walk then visits
        names = [ref["name"] for ref in task.metadata["path"][1:]]
        assert task.metadata["fuzzed"] and any(n in task.metadata["start_query"] for n in names)
        start = world.entity(int(task.metadata["path"][0]["id"]))
        assert start.name not in task.question
    assert all(start_gives_link(t) is False for t in every if t.metadata["kind"] != "chain")
    with pytest.raises(ValueError, match="drop_given_links"):
        gym.make("searchgym/SyntheticQA-v0", **SMALL, drop_given_links="yes")
