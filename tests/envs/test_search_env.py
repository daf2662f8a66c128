"""SearchEnv against a real tantivy index over a real synthetic world."""

import asyncio
import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401  (registers the ids)
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import TaskFileError
from searchgym.envs.tools.chunking import chunk_text
from searchgym.world.oracle import OracleAgent
from tests.conftest import SMALL


@pytest.fixture
def env(small_pool, small_index):
    env = SearchEnv(small_pool, small_index, small_index, max_turns=8)
    yield env
    env.close()


def first_task(pool, **filters):
    return next(t for t in pool if all(t.metadata.get(k) == v for k, v in filters.items()))


def test_check_env_on_every_registered_id(small_bundle, tmp_path):
    kwargs = {
        "searchgym/SyntheticQA-v0": SMALL,
        "searchgym/LocalQA-v0": {"tasks": small_bundle / "tasks.jsonl", "index": small_bundle / "index"},
        "searchgym/WebQA-v0": {
            "tasks": small_bundle / "tasks.jsonl",
            "search_api_key": "unused",  # nothing listens on :9
            "search_endpoint": "http://127.0.0.1:9/search",
        },
    }
    from searchgym.envs.suites import SUITES
    from tests.envs.browsecomp_layout import write_layout
    from tests.envs.simulator_double import TASKS, ScriptedSimulator, simulator_server

    tasks = tmp_path / "simulated.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    server = simulator_server(ScriptedSimulator())
    kwargs["searchgym/SimulatedQA-v0"] = {"tasks": tasks, "engine": server.__enter__(), "noise": 0.5}

    for suite in SUITES.values():  # benchmark suites: LocalQA / WebQA envs over a suite's task file
        if suite.kind == "browsecomp":  # its repository's own layout
            kwargs[suite.env_id] = {"root": write_layout(tmp_path / "browsecomp-plus")}
        elif suite.kind != "embedded":
            base = kwargs[f"searchgym/{'LocalQA' if suite.kind == 'local' else 'WebQA'}-v0"]
            kwargs[suite.env_id] = {
                **{k: v for k, v in base.items() if k != "tasks"},
                "data": small_bundle / "tasks.jsonl",
            }
    ids = [i for i in gym.registry if i.startswith("searchgym/")]
    assert set(ids) == set(kwargs), "a new env id needs a check_env entry here"
    try:
        for env_id in ids:
            env = gym.make(env_id, **kwargs[env_id])
            check_env(env.unwrapped, skip_render_check=False)
            env.close()
    finally:
        server.__exit__(None, None, None)


@pytest.mark.slow
def test_default_synthetic_qa_builds_and_plays():
    env = gym.make("searchgym/SyntheticQA-v0")
    obs, info = env.reset(seed=0)
    assert "Question:" in obs and len(env.unwrapped.tasks) >= 1000
    check_env(env.unwrapped)
    env.close()


def test_an_episode_from_search_to_answer(env, small_pool):
    task = first_task(small_pool, hops=1, kind="chain", fuzzed=False)
    obs, info = env.reset(options={"task_id": task.id})
    assert task.question in obs and "<search>" in obs
    assert info == {"task_id": task.id, "turn": 0, "obs_tokens": info["obs_tokens"]}
    path = task.metadata["path"]
    obs, reward, terminated, truncated, info = env.step(f"<think>find it</think><search>{path[0]['name']}</search>")
    assert obs.startswith("<information>") and obs.endswith("</information>")
    assert f"[Doc 1]({path[0]['url']}):" in obs
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["tool"] == "search" and info["hits"][0]["url"] == path[0]["url"]
    assert info["evidence"]["answer_page_rank"] == 1
    obs, reward, terminated, truncated, info = env.step(f"<access>{path[0]['url']}</access>")
    assert ">>>> Page 1 >>>>" in obs and task.metadata["answer_on_page"] in obs
    assert info["page"]["chunk"] == 1 and info["evidence"]["answer_page_accessed"]
    obs, reward, terminated, truncated, info = env.step(f"<answer>{task.answers[0]}</answer>")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["verdict"]["correct"] and info["answers"] == list(task.answers)
    assert info["counts"] == {"search": 1, "access": 1, "answer": 1, "invalid": 0, "backend_errors": 0}


def test_info_never_reveals_the_answer_before_the_end(env, small_pool):
    for task in list(small_pool)[:20]:
        _, info = env.reset(options={"task_id": task.id})
        trail = [info]
        for action in ("<search>zebra festival</search>", "<access>https://nowhere.test/x</access>", "junk"):
            trail.append(env.step(action)[-1])
        dumped = json.dumps(trail)
        assert "verdict" not in dumped and "answers" not in dumped
        assert all(f'"{a}"' not in dumped for a in task.answers)


def test_long_pages_are_served_in_parts(small_pool, small_index):
    env = SearchEnv(small_pool, small_index, max_turns=50, page_chunk_chars=300, max_page_chunks=100)
    task = first_task(small_pool, kind="chain")
    env.reset(options={"task_id": task.id})
    url = task.metadata["path"][0]["url"]
    page = asyncio.run(small_index.fetch(url))
    parts = []
    for number in range(1, 60):
        obs, _, _, _, info = env.step(f"<access>{url}</access>")
        if info["page"]["chunk"] is None:
            assert "You have read all" in obs
            break
        assert info["page"]["chunk"] == number and f">>>> Page {number} >>>>" in obs
        parts.append(obs)
    chunks = chunk_text(page.text, 300)
    assert len(parts) == info["page"]["chunks"] == len(chunks) >= 2
    assert all(chunk in part for chunk, part in zip(chunks, parts, strict=True))  # every character served, in order


def test_turn_budget_truncates(small_pool, small_index):
    env = SearchEnv(small_pool, small_index, max_turns=3)
    env.reset(seed=1)
    results = [env.step("<search>river</search>") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True] and not any(r[2] for r in results)
    assert results[-1][4]["truncation"] == "turn budget"
    with pytest.warns(UserWarning, match="after the episode ended"):
        obs, reward, terminated, truncated, info = env.step("<answer>late</answer>")
    assert "episode is over" in obs and (reward, terminated, truncated) == (0.0, False, True) and info["error"]


def test_observation_token_budget_truncates(small_pool, small_index):
    env = SearchEnv(small_pool, small_index, max_turns=100, max_obs_tokens=600)
    env.reset(seed=0)
    for turn in range(1, 100):  # turn is checked after the loop  # noqa: B007
        *_, truncated, info = env.step("<search>city founded</search>")
        if truncated:
            break
    assert info["truncation"] == "observation-token budget" and info["obs_tokens"] >= 600 and turn < 100


def test_format_gate_zeroes_a_sloppy_episode(small_pool, small_index):
    task = first_task(small_pool, hops=1)
    for gate, expected in ((False, 1.0), (True, 0.0)):
        env = SearchEnv(small_pool, small_index, format_gate=gate)
        env.reset(options={"task_id": task.id})
        env.step("<search>a</search><search>b</search>")  # two calls in one turn: a format error
        _, reward, terminated, _, info = env.step(f"<answer>{task.answers[0]}</answer>")
        assert terminated and reward == expected
        if gate:
            assert info["verdict"]["detail"]["format_errors"]


@pytest.mark.parametrize(
    "action, expected",
    [
        ("", "no tool call found"),
        ("<search>x" * 1000, "unbalanced <search>"),
        ("<search><answer>x</answer></search>", "nested"),
        ("<answer>" + "ä😀北" * 350_000 + "</answer>", None),  # ~1 MB of Unicode, judged, not crashed
        ("<search>qxzv wpljk</search>", "No search results are found."),
        ("<access>https://world.searchgym.test/wiki/No_Such_Page</access>", "could not be found"),
        ("<access>not a url at all</access>", "could not be found"),
        ('<tool_call>{"name": "search", "arguments": {"query": "river"}}</tool_call>', "[Doc 1]("),
    ],
)
def test_bad_and_odd_actions_become_observations(env, action, expected):
    env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step(action)
    assert env.observation_space.contains(obs)
    if expected is None:
        assert terminated and reward == 0.0
    else:
        assert expected in obs, obs[:300]


actions = st.one_of(
    st.sampled_from(
        [
            "<search>river</search>",
            "<search>founded</search>",
            "<answer>1900</answer>",
            "<access>https://world.searchgym.test/wiki/X</access>",
            "<think>hmm</think>",
            "<search>",
        ]
    ),
    st.text(max_size=60),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), script=st.lists(actions, min_size=1, max_size=12))
def test_env_invariants_and_replay(small_pool, small_index, seed, script):
    def play():
        env = SearchEnv(small_pool, small_index, max_turns=6)
        obs, info = env.reset(seed=seed)
        trace = [(obs, info)]
        assert env.observation_space.contains(obs)
        for turn, action in enumerate(script, 1):
            obs, reward, terminated, truncated, info = env.step(action)
            assert env.observation_space.contains(obs)
            assert 0.0 <= reward <= 1.0 and (reward == 0.0 or terminated)
            trace.append((obs, reward, terminated, truncated, info))
            if terminated or truncated:
                assert turn <= 6
                break
        else:
            assert len(script) < 6
        env.close()
        return trace

    assert play() == play()  # same seed, same actions, local backend: the same episode


def test_sync_api_works_inside_a_running_event_loop(env):
    async def notebook_cell():
        obs, _ = env.reset(seed=0)  # the sync call from inside a loop, as in Jupyter
        return env.step("<search>river</search>")[0]

    assert "[Doc 1](" in asyncio.run(notebook_cell())


def test_many_episodes_in_one_event_loop(small_pool, small_index):
    async def run_all():
        envs = [SearchEnv(small_pool, small_index) for _ in range(64)]
        results = await asyncio.gather(*(OracleAgent().arun(e, small_pool[i]) for i, e in enumerate(envs)))
        return results

    assert all(r.solved for r in asyncio.run(run_all()))


def test_render_and_hermes_prompt(small_pool, small_index):
    env = SearchEnv(small_pool, small_index, tool_format="hermes", render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert '"name": "search"' in obs and "<tool_call>" in obs
    env.step('<tool_call>{"name": "search", "arguments": {"query": "river"}}</tool_call>')
    text = env.render()
    assert "[agent]" in text and "[env]" in text and "[Doc 1](" in text


def test_local_qa_reports_bad_task_files(tmp_path, small_bundle):
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"question": "ok?", "answer": "a"}\n{"question": "?"}\n')
    with pytest.raises(TaskFileError, match=r"tasks\.jsonl:2"):
        gym.make("searchgym/LocalQA-v0", tasks=bad, index=small_bundle / "index")
    with pytest.warns(UserWarning):
        env = gym.make("searchgym/LocalQA-v0", tasks=bad, index=small_bundle / "index", on_bad_task="skip")
    assert len(env.unwrapped.tasks) == 1 and env.unwrapped.tasks.rejected


def test_local_qa_indexes_a_corpus_on_first_use(tmp_path):
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text(
        json.dumps({"id": "0", "contents": '"Tessar Works"\nTessar Works was founded in 1873 by Kelda Voss.'})
        + "\n"
        + json.dumps({"id": "1", "contents": '"Kelda Voss"\nKelda Voss was born in Velmora.'})
        + "\n"
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"question": "Who founded Tessar Works?", "answer": "Kelda Voss"}) + "\n")
    env = gym.make("searchgym/LocalQA-v0", tasks=tasks, corpus=corpus)
    env.reset(seed=0)
    obs, *_ = env.step("<search>Tessar Works</search>")
    assert "[Doc 1](doc://0):\nTessar Works" in obs
    obs, *_ = env.step("<access>doc://0</access>")
    assert "founded in 1873" in obs
    assert env.step("<answer>Kelda Voss</answer>")[1] == 1.0


def test_random_agent_episodes_end_within_budget(small_pool, small_index):
    from searchgym.agents.scripted import RandomAgent

    async def play(seed):
        env = SearchEnv(small_pool, small_index, max_turns=10)
        obs, _ = await env.areset(seed=seed)
        reward = await RandomAgent(seed, max_turns=20).arun(env, obs)
        assert env.turn <= 10 and 0.0 <= reward <= 1.0
        return env.counts

    counts = [asyncio.run(play(seed)) for seed in range(50)]
    assert sum(c["search"] for c in counts) and sum(c["access"] for c in counts) and sum(c["invalid"] for c in counts)


async def test_a_first_make_inside_a_running_loop_builds_its_bundle(tmp_path):
    """Trainers create envs inside their event loop; building an uncached bundle there must work."""
    env = gym.make("searchgym/SyntheticQA-v0", size=300, n_tasks=12, cache_dir=tmp_path).unwrapped
    obs, info = await env.areset(options={"task_id": env.tasks[0].id})
    assert "Question:" in obs and len(env.tasks) == 12


@pytest.mark.parametrize("instructions", ["brief", "Q ({max_turns} turns, JSON {{ok}}): {question}"])
def test_instructions_can_be_brief_or_custom(small_pool, small_index, instructions):
    task = small_pool[0]
    env = SearchEnv(small_pool, small_index, max_turns=3, instructions=instructions)
    obs, _ = env.reset(options={"task_id": task.id})
    assert obs.endswith(task.question) and "searching a knowledge source" not in obs
    if instructions != "brief":
        assert obs == f"Q (3 turns, JSON {{ok}}): {task.question}"
    obs, reward, terminated, _, _ = env.step(f"<answer> {task.answers[0]} </answer>")  # the tools are the same
    assert terminated and reward == 1.0


@pytest.mark.parametrize("bad", ["no placeholder", "{question} {unknown}", "{question"])
def test_a_bad_instructions_template_is_refused_up_front(small_pool, small_index, bad):
    with pytest.raises(ValueError, match="instructions"):
        SearchEnv(small_pool, small_index, instructions=bad)


@given(
    st.one_of(
        st.none(),
        st.integers(),
        st.floats(),
        st.binary(max_size=20),
        st.lists(st.integers(), max_size=3),
        st.text(alphabet=st.characters(blacklist_categories=()), max_size=200).map(lambda t: f"<search>{t}</search>"),
        st.text(alphabet=st.characters(blacklist_categories=()), max_size=200).map(lambda t: f"<access>{t}</access>"),
    )
)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_action_of_any_type_or_text_raises(small_pool, small_index, action):
    """None, numbers, bytes, lists, lone surrogates in queries and urls: an observation in the space, never a crash."""
    env = SearchEnv(small_pool, small_index, max_turns=3)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert env.observation_space.contains(obs) and reward == 0.0 and not terminated
    env.close()
