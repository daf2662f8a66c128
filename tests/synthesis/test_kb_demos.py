"""The KB's demonstrations of the QA-synthesis agent: the agent itself, with the KB writing every reply, accepts
questions the world confirms (harder after FUZZ and INJECT, the answer never given away), and what it records
teaches every step, both verdicts of each check included."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.envs.answer_text import holds_answer
from searchgym.envs.llm_judge import parse_judgement
from searchgym.synthesis.kb_demos import KBWriter, synthesis_demos
from searchgym.synthesis.qa_agent import QAConfig
from searchgym.synthesis.run import seed_pages
from searchgym.world.world import World

from ..conftest import SMALL


@pytest.fixture(scope="module")
def world():
    return World(SMALL["size"], SMALL["seed"])


@pytest.fixture(scope="module")
def demos(world, small_index):
    urls = seed_pages(small_index, 0)[:12]
    return urls, synthesis_demos(world, small_index, small_index, urls, seed=0, config=QAConfig(k=2))


def _reply_json(record):
    return json.loads(record["messages"][-1]["content"].rstrip("`").splitlines()[-1])


def test_the_agent_accepts_what_the_kb_writes_and_the_world_confirms_it(world, demos):
    urls, got = demos
    assert got.outcomes["accepted"] == len(urls) and got.outcomes["corrupted"] == 3  # seeds 0, 4 and 8
    writer = KBWriter(world, 0)
    edited = 0
    for url in urls:
        entity = writer.entity_at(url)
        plan = writer.plan(entity)
        assert holds_answer(world.render_text(entity), plan.answers)  # the seed page states the answer
        assert not any(holds_answer(q, plan.answers) for q in plan.questions)  # no question gives it away
        if len(plan.questions) > 1:  # FUZZ: the name gives way to a description only this entity fits
            edited += 1
            assert entity.name not in plan.questions[1] and writer.walker.description(entity)
        if plan.inject:  # INJECT: a linked page's name gives way to its own unique description
            linked = writer.entity_at(plan.inject[0])
            assert plan.inject[0] in world.page_row(entity)["links"] and linked.name not in plan.questions[-1]
    assert edited >= len(urls) // 2
    final = {r["seed_page"]: _reply_json(r) for r in got.records if r["step"] == "inject"}
    assert final and all(writer.plan_of(reply["question"]) for reply in final.values())


def test_each_check_is_demonstrated_with_both_verdicts(demos):
    urls, got = demos
    steps = {r["step"] for r in got.records}
    assert steps == {"read", "propose", "act", "inject", "quality", "solve", "judge", "uniqueness"}
    verdicts = [parse_judgement(r["messages"][-1]["content"]) for r in got.records if r["step"] == "judge"]
    # per seed: two right spellings graded Correct, two wrong guesses Incorrect (the same guess twice: judged once)
    assert verdicts.count("Correct") == 2 * len(urls) and len(urls) <= verdicts.count("Incorrect") <= 2 * len(urls)
    supported = [_reply_json(r)["supported"] for r in got.records if r["step"] == "quality"]
    assert True in supported and False in supported
    actions = {_reply_json(r)["action"] for r in got.records if r["step"] == "act"}
    assert actions == {"FUZZ", "INJECT", "EXIT"}
    for record in got.records:  # exactly the agent's call: one user message, as the agent sends it
        user, reply = record["messages"]
        assert user["role"] == "user" and reply["role"] == "assistant" and reply["content"]


def test_the_demonstrations_are_a_function_of_the_world_and_seed(world, small_index, demos):
    urls, got = demos
    again = synthesis_demos(world, small_index, small_index, urls, seed=0, config=QAConfig(k=2))
    assert again.records == got.records and again.questions == got.questions


@settings(max_examples=60, deadline=None)
@given(st.integers(0, SMALL["size"] - 1), st.integers(0, 3))
def test_no_plan_gives_its_answer_away_and_no_guess_is_right(world, eid, seed):
    writer = KBWriter(world, seed)
    plan = writer.plan(world.entity(eid))
    if plan is None:
        return
    assert plan.statement.startswith(world.entity(eid).name)
    assert not any(holds_answer(q, plan.answers) for q in plan.questions)
    for _ in range(3):
        assert not writer.is_answer(writer.guess(plan), plan.answers)


def test_a_prompt_it_does_not_know_gets_a_reply_without_json(world):
    import asyncio

    writer = KBWriter(world, 0)
    reply = asyncio.run(writer.achat([{"role": "user", "content": "## Task: something else\nURL: nowhere"}]))
    assert "{" not in reply and writer.records[-1]["step"] == "unknown"


def test_a_pool_the_kb_writes_loads_plays_and_passes_the_kb_check(world, small_bundle, small_index, tmp_path):
    import asyncio

    from searchgym.bench.synthesis import play_one
    from searchgym.bench.synthesis_sft import kb_check
    from searchgym.envs.tasks import TaskPool
    from searchgym.synthesis.pool import PoolOptions, asynthesize
    from searchgym.synthesis.qa_agent import QASynthesisAgent

    writer = KBWriter(world, 0)
    agent = QASynthesisAgent(small_index, small_index, writer, writer, QAConfig(k=2))
    pool = tmp_path / "pool.jsonl"
    asyncio.run(asynthesize(agent, seed_pages(small_index, 0)[:4], pool, 4, PoolOptions(concurrency=2)))
    tasks = list(TaskPool.from_jsonl(pool))
    assert kb_check(tasks, world, set(writer.questions)) == {
        "tasks": 4,
        "answer_on_seed_page": 4,
        "answer_in_question": 0,
        "a_demonstration_question": 4,  # the writer's own questions: a tuned model's are counted against these
    }
    played = play_one(pool, small_bundle / "index", tasks[0])
    assert played["question_in_first_observation"] and played["steps"][-1]["reward"] == 1.0


def test_a_rule_difficulty_judge_grades_the_solver_without_the_judge_model(world, small_index):
    """difficulty_judge='cover_em': the judge model is never asked to grade, and a solver that knows the answer makes
    the candidate too easy (graded by the rule), one that guesses wrong lets it through."""
    import asyncio

    from searchgym.synthesis.qa_agent import QASynthesisAgent, Rejected

    class Knowing(KBWriter):
        def _solve(self, prompt):
            plan = self.plan_of(prompt.split("Question: ", 1)[1].splitlines()[0])
            return json.dumps({"answer": f"It is {plan.answers[0]}"})

    url = seed_pages(small_index, 0)[0]
    for writer, accepted in ((KBWriter(world, 0), True), (Knowing(world, 0), False)):
        agent = QASynthesisAgent(small_index, small_index, writer, writer, QAConfig(k=2, difficulty_judge="cover_em"))
        try:
            asyncio.run(agent.run(url))
            outcome = True
        except Rejected as e:
            assert e.reason == "difficulty: too easy" and e.detail == "solved 2/2"
            outcome = False
        assert outcome is accepted and "judge" not in {r["step"] for r in writer.records}
    with pytest.raises(ValueError, match="difficulty_judge: unknown judge 'nope'"):
        QAConfig(difficulty_judge="nope")
