"""OpenEnv: our server on loopback against OpenEnv's own clients and its shipped conformance checks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import gymnasium as gym
import pytest

pytest.importorskip("openenv")
import requests  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from searchgym.integrations.openenv import SearchAction, SearchGymClient  # noqa: E402
from searchgym.serve.env_host import SearchGymEnvironment, make_app, open_sessions  # noqa: E402
from searchgym.serve.settings import EnvHostSettings  # noqa: E402
from tests.integrations.conftest import ENV_KWARGS, BrokenJudge, free_port, wait_until  # noqa: E402

ENV_ID = "searchgym/SyntheticQA-v0"


@pytest.fixture(scope="module")
def task_ids():
    env = gym.make(ENV_ID, **ENV_KWARGS)
    try:
        return [t.id for t in env.unwrapped.tasks][:4]
    finally:
        env.close()


def test_openenvs_conformance_check_passes(server_url):
    from openenv.cli._validation import validate_running_environment

    report = validate_running_environment(server_url)
    failed = [c for c in report["criteria"] if not c["passed"]]
    assert report["passed"], failed
    assert report["mode"] == "simulation"


def test_metadata_and_schema_describe_the_env(server_url):
    metadata = requests.get(f"{server_url}/metadata", timeout=10).json()
    assert metadata["name"] == ENV_ID and "f1 judge" in metadata["description"]
    schema = requests.get(f"{server_url}/schema", timeout=10).json()
    assert {"tool", "argument", "text"} <= set(schema["action"]["properties"])
    assert {"text", "task_id", "judge_error", "info"} <= set(schema["observation"]["properties"])


def test_openenvs_generic_client_plays_an_episode(server_url, task_ids):
    async def play():
        async with GenericEnvClient(base_url=server_url) as client:
            first = await client.reset(task_id=task_ids[0])
            found = await client.step({"tool": "search", "argument": "anything at all"})
            state = await client.state()
            return first, found, state

    first, found, state = asyncio.run(play())
    assert first.observation["task_id"] == task_ids[0] and first.reward is None and not first.done
    assert found.observation["tool"] == "search" and found.reward == 0.0 and not found.done
    assert state["step_count"] == 1 and state["task_id"] == task_ids[0] and state["turn"] == 1


def test_served_episode_equals_the_in_process_episode(server_url, task_ids):
    """Same seed, same actions: the server's episode is the in-process env's, reward included."""
    actions = [
        SearchAction(tool="search", argument="capital"),
        SearchAction(text="<search> river </search>"),
        SearchAction(tool="answer", argument="Kelveholm"),
    ]
    local = gym.make(ENV_ID, **ENV_KWARGS)
    obs, info = local.reset(seed=7)
    expected = [(obs, None, False)]
    for action in actions:
        key = "query" if action.tool == "search" else "answer"
        call = json.dumps({"name": action.tool, "arguments": {key: action.argument}})
        text = action.text if action.text is not None else f"<tool_call>{call}</tool_call>"
        obs, reward, terminated, truncated, info = local.step(text)
        expected.append((obs, reward, terminated or truncated))
    local.close()

    with SearchGymClient(base_url=server_url).sync() as client:
        got = [
            (r.observation.text, r.reward, r.done) for r in [client.reset(seed=7)] + [client.step(a) for a in actions]
        ]
    assert got == expected
    assert got[-1][2] and got[-1][1] == expected[-1][1]  # the episode ends on the answer, with the judge's score


def test_concurrent_sessions_are_isolated(server_url, task_ids):
    async def session(task_id: str, query: str) -> list:
        async with SearchGymClient(base_url=server_url) as client:
            results = [await client.reset(task_id=task_id)]
            for _ in range(2):
                results.append(await client.step(SearchAction(tool="search", argument=query)))
                await asyncio.sleep(0)  # interleave with the other session
            results.append(await client.state())
            return results

    async def both():
        return await asyncio.gather(session(task_ids[0], "mountain"), session(task_ids[1], "river"))

    a, b = asyncio.run(both())
    for results, task_id, query in ((a, task_ids[0], "mountain"), (b, task_ids[1], "river")):
        assert all(r.observation.task_id == task_id for r in results[:3])
        assert [r.observation.info["query"] for r in results[1:3]] == [query, query]
        assert [r.observation.turn for r in results[1:3]] == [1, 2]
        assert results[3].task_id == task_id and results[3].step_count == 2


def test_a_killed_client_leaks_no_session(server_url, task_ids):
    wait_until(lambda: open_sessions() == 0, "earlier tests' sessions to close")  # they close asynchronously
    before = 0
    code = (  # a bare WebSocket client speaking OpenEnv's protocol (quick to start), killed mid-episode
        "import json, sys; from websockets.sync.client import connect\n"
        f"ws = connect({server_url.replace('http', 'ws') + '/ws'!r})\n"
        f"ws.send(json.dumps({{'type': 'reset', 'data': {{'task_id': {task_ids[0]!r}}}}})); ws.recv()\n"
        "ws.send(json.dumps({'type': 'step', 'data': {'tool': 'search', 'argument': 'x'}})); ws.recv()\n"
        "print('ready', flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert child.stdout.readline().strip() == b"ready"
        assert open_sessions() == before + 1
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    wait_until(lambda: open_sessions() == before, "the killed client's session to close")
    health = requests.get(f"{server_url}/health", timeout=10).json()
    assert health["status"] == "healthy"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    action=st.fixed_dictionaries(
        {},
        optional={
            "tool": st.one_of(st.sampled_from(["search", "access", "answer"]), st.text(max_size=20)),
            "argument": st.text(max_size=200),
            "text": st.text(max_size=200),
        },
    )
)
def test_bad_actions_are_observations_never_a_500(server_url, action):
    """Over the stateless HTTP route and a WebSocket session alike, any well-typed action gets an observation."""
    response = requests.post(f"{server_url}/step", json={"action": action}, timeout=30)
    assert response.status_code == 200, response.text  # a fresh env per request: nothing to step, and it says so
    assert "reset first" in response.json()["observation"]["text"]
    with SearchGymClient(base_url=server_url).sync() as client:
        client.reset(seed=0)
        result = client.step(SearchAction(**action))
    assert result.observation.text
    has_text, has_call = "text" in action, bool({"tool", "argument"} & set(action))
    if has_text == has_call:  # both forms, or neither: explained, and no turn is spent
        assert "either `text`" in result.observation.text and result.observation.turn == 0
    elif has_call and (
        action.get("tool") not in ("search", "access", "answer") or not action.get("argument", "").strip()
    ):
        # an unknown tool or a call without its argument: explained, and no turn is spent (as docs/integrations.md says)
        assert "Nothing was run" in result.observation.text and result.observation.turn == 0 and not result.done
    else:
        # one turn spent; only an answer call can end the episode (a valid one does: tool answer, argument "0")
        assert result.observation.turn == 1
        assert not result.done or (has_call and action.get("tool") == "answer")


def test_reset_on_an_unknown_task_is_an_observation(server_url):
    response = requests.post(f"{server_url}/reset", json={"task_id": "no-such-task"}, timeout=30)
    assert response.status_code == 200
    assert "no task with id 'no-such-task'" in response.json()["observation"]["text"]


def test_judge_failure_ends_with_no_reward_and_the_error(task_ids):
    env = SearchGymEnvironment(ENV_ID, {**ENV_KWARGS, "judge": BrokenJudge()})
    try:
        env.reset(task_id=task_ids[0])
        result = env.step(SearchAction(tool="answer", argument="anything"))
    finally:
        env.close()
    assert result.done and result.reward is None and result.judge_error == "judge endpoint timed out"


def test_process_rewards_are_paid_refined_at_the_end(task_ids):
    env = SearchGymEnvironment(
        ENV_ID, {**ENV_KWARGS, "max_turns": 8}, process_reward="clip", process_weight=0.5, process_threshold=0.5
    )
    try:
        paid = []
        for repeats in (1, 4):
            env.reset(task_id=task_ids[0])
            question = env._env.task.question
            steps = [env.step(SearchAction(tool="search", argument=question)) for _ in range(repeats)]
            assert all(s.reward == 0.0 for s in steps)
            paid.append(env.step(SearchAction(tool="answer", argument=env._env.task.answers[0])).reward)
    finally:
        env.close()
    # clip: min(r - 0.5, 0) per turn, so the answer turn (no evidence) costs 0.5 and a search that finds the
    # answer page costs nothing: repeating it cannot raise the reward
    assert paid[1] <= paid[0] == 0.5


def test_searchgym_serve_env_serves_a_registered_id(task_ids, tmp_path):
    port = free_port()
    kwargs = json.dumps(ENV_KWARGS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchgym.cli", "serve", "env", ENV_ID, "--env-kwargs", kwargs, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return requests.get(f"{url}/health", timeout=5).ok
            except requests.ConnectionError:
                assert proc.poll() is None, proc.stdout.read().decode()
                return False

        wait_until(up, "`searchgym serve env` to answer", limit=120)
        with SearchGymClient(base_url=url).sync() as client:
            assert client.reset(task_id=task_ids[2]).observation.task_id == task_ids[2]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_serve_env_refuses_bad_kwargs_clearly():
    bad = subprocess.run(
        [sys.executable, "-m", "searchgym.cli", "serve", "env", ENV_ID, "--env-kwargs", "[1, 2]"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "expected a JSON object" in bad.stderr
    with pytest.raises(ValueError, match="unknown env id"):
        make_app(EnvHostSettings(env_id="searchgym/Nope-v0"))


def test_a_text_only_action_type_has_text_as_its_one_required_field(task_ids):
    """`serve env --action text`: TextAction's schema requires only `text`, so a plain reply maps into it."""
    from fastapi.testclient import TestClient

    from searchgym.serve.env_host import TextAction, make_app

    with TestClient(make_app(EnvHostSettings(env_id=ENV_ID, env_kwargs=ENV_KWARGS, action="text"))) as http:
        schema = http.get("/schema").json()["action"]
        assert schema["required"] == ["text"] and set(schema["properties"]) >= {"text"}
        assert "tool" not in schema["properties"]
    with pytest.raises(ValueError, match="action must be one of"):
        make_app(EnvHostSettings(env_id=ENV_ID, env_kwargs=ENV_KWARGS, action="xml"))
    env = SearchGymEnvironment(ENV_ID, ENV_KWARGS)
    try:
        env.reset(task_id=task_ids[0])
        result = env.step(TextAction(text="<search>anything</search>"))
        assert result.turn == 1 and result.tool == "search"
        result = env.step(SearchAction(tool="serach", argument="x"))  # a typo of a tool: explained, not spent
        assert "There is no tool 'serach'" in result.text and result.turn == 1
        result = env.step(SearchAction(tool="access", argument="  "))
        assert "needs its url" in result.text and result.turn == 1
    finally:
        env.close()
