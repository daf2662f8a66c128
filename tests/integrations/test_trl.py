"""TRL: the environment class against the real env, and one real GRPOTrainer step on the tiny model."""

from __future__ import annotations

import json
import math
import os

import pytest

pytest.importorskip("trl")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from searchgym.integrations.trl import (  # noqa: E402
    SearchGymEnv,
    completion_lengths,
    demonstrations,
    environment_and_dataset,
    rollouts_per_pass,
    task_dataset,
    tool_calling_tokenizer,
    tool_schemas,
)
from tests.integrations.conftest import ENV_KWARGS, BrokenJudge  # noqa: E402

ENV_ID = "searchgym/SyntheticQA-v0"


@pytest.fixture(scope="module")
def env_class():
    return SearchGymEnv.configured(ENV_ID, **ENV_KWARGS)


@pytest.fixture(scope="module")
def task_ids():
    return list(task_dataset(ENV_ID, limit=4, **ENV_KWARGS)["task_id"])


def gold(env: SearchGymEnv) -> str:
    return env._env.unwrapped.task.answers[0]


def test_reset_takes_the_rows_task_and_tools_play_the_episode(env_class, task_ids):
    env = env_class()
    opening = env.reset(prompt=[{"role": "user", "content": ""}], task_id=task_ids[1])
    task = env._env.unwrapped.task
    assert env.task_id == task_ids[1] and task.question in opening
    assert "<tool_call>" in opening  # the Hermes instructions, the format TRL's template writes
    results = env.search(task.question)
    assert results.startswith("<information>") and "[Doc 1](" in results
    url = results.split("[Doc 1](", 1)[1].split(")", 1)[0]
    assert ">>>> Page 1 >>>>" in env.access(url)
    assert "recorded" in env.answer(gold(env))
    assert env.get_reward() == 1.0  # the F1 judge's verdict on the gold answer
    with pytest.raises(ValueError, match="episode is over: the answer was given"):
        env.search("anything")  # TRL shows the model this error as the tool's result


def test_each_rollouts_transcript_is_public_and_logged_without_becoming_a_tool(task_ids, tmp_path):
    import inspect

    log = tmp_path / "rollouts.jsonl"
    env_class = SearchGymEnv.configured(ENV_ID, transcripts=log, **ENV_KWARGS)
    tools = {
        name
        for name, _ in inspect.getmembers(env_class, predicate=inspect.isfunction)  # TRL's tool discovery
        if name not in ("reset", "get_reward") and not name.startswith("_")
    }
    assert tools == {"search", "access", "answer"}
    env = env_class()
    env.reset(task_id=task_ids[2])
    seen = env.search(env._env.unwrapped.task.question)
    env.answer(gold(env))
    transcript = env.transcript
    assert transcript["task_id"] == task_ids[2] and transcript["done"]
    assert [s["tool"] for s in transcript["steps"]] == ["search", "answer"] and transcript["steps"][0][
        "observation"
    ] == seen
    assert env.get_reward() == 1.0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["reward"] == 1.0 and rows[0]["steps"][1]["argument"] == gold(env)


def test_env_and_dataset_from_the_same_kwargs_and_a_mismatch_explained():
    env_class, dataset = environment_and_dataset(ENV_ID, limit=3, **ENV_KWARGS)
    for task_id in dataset["task_id"]:
        assert env_class().reset(task_id=task_id)
    other = SearchGymEnv.configured(ENV_ID, **{**ENV_KWARGS, "n_tasks": 20})
    missing = next(
        t
        for t in task_dataset(ENV_ID, **ENV_KWARGS)["task_id"]
        if t not in {x.id for x in other()._env.unwrapped.tasks}
    )
    with pytest.raises(ValueError, match="same kwargs"):
        other().reset(task_id=missing)


def test_reward_is_the_judges_partial_score_and_zero_without_an_answer(env_class, task_ids):
    env = env_class()
    env.reset(task_id=task_ids[0])
    answer = gold(env)
    env.answer(f"{answer} and more words here")
    verdict = env.steps[-1]["info"]["verdict"]
    assert 0.0 < env.get_reward() == verdict["score"] < 1.0
    env.reset(task_id=task_ids[0])
    assert env.steps == [] and env.get_reward() == 0.0


def test_turn_budget_ends_the_episode(env_class, task_ids):
    env = env_class()
    env.reset(task_id=task_ids[0])
    for _ in range(ENV_KWARGS["max_turns"]):
        env.search("nothing in particular")
    with pytest.raises(ValueError, match="turn budget is spent"):
        env.answer(gold(env))
    assert env.get_reward() == 0.0


def test_a_judge_failure_is_unscorable_not_zero(task_ids):
    env = SearchGymEnv.configured(ENV_ID, judge=BrokenJudge(), **ENV_KWARGS)()
    env.reset(task_id=task_ids[0])
    env.answer(gold(env))
    assert env.get_reward() is None  # TRL turns None into NaN: the rollout gets no advantage
    assert env.judge_error == "judge endpoint timed out"


@pytest.mark.parametrize("mode", ["clip", "delta"])
def test_repeating_a_rewarded_search_cannot_raise_the_reward(mode, task_ids):
    """Process rewards (a search that finds the answer page) cross only refined: repetition never pays."""
    kwargs = {**ENV_KWARGS, "max_turns": 8}
    env = SearchGymEnv.configured(ENV_ID, process_reward=mode, process_weight=0.5, process_threshold=0.5, **kwargs)()
    rewards = []
    for repeats in (1, 3, 6):
        env.reset(task_id=task_ids[0])
        for _ in range(repeats):
            env.search(env._env.unwrapped.task.question)
        assert env.steps[0]["info"]["evidence"]["answer_page_rank"] is not None  # the search does find it
        env.answer(gold(env))
        rewards.append(env.get_reward())
    assert rewards[0] >= rewards[1] >= rewards[2]
    assert max(rewards) <= 1.0 + (0.5 if mode == "delta" else 0.0)


def test_configuration_errors_are_clear():
    with pytest.raises(ValueError, match="tool_format='hermes'"):
        SearchGymEnv.configured(ENV_ID, tool_format="tags")
    with pytest.raises(ValueError, match="process rewards cross only refined"):
        SearchGymEnv.configured(ENV_ID, process_reward="none", process_weight=1.0)
    with pytest.raises(ValueError, match="unknown env id"):
        SearchGymEnv.configured("searchgym/Nope-v0")
    with pytest.raises(KeyError, match="no task with id"):
        task_dataset(ENV_ID, task_ids=["no-such-task"], **ENV_KWARGS)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tool=st.sampled_from(["search", "access", "answer"]), text=st.text(max_size=300))
def test_any_tool_argument_is_an_observation_never_a_crash(env_class, task_ids, tool, text):
    env = env_class()
    env.reset(task_id=task_ids[0])
    obs = getattr(env, tool)(text)
    assert isinstance(obs, str) and obs.startswith("<information>")
    reward = env.get_reward()
    assert reward is not None and 0.0 <= reward <= 1.0


def test_task_dataset_rows_reset_to_their_tasks(env_class, task_ids):
    data = task_dataset(ENV_ID, task_ids=task_ids[:2], **ENV_KWARGS)
    assert data["task_id"] == task_ids[:2]
    assert data["prompt"] == [[{"role": "user", "content": ""}]] * 2
    env = env_class()
    for row in data:
        env.reset(**row)
        assert env.task_id == row["task_id"]


def test_demonstrations_are_solved_episodes_in_trls_tool_format(env_class, task_ids):
    demos = demonstrations(env_class, task_ids)
    assert len(demos) >= 1
    env = env_class()
    for row in demos:
        calls = [m["tool_calls"][0]["function"] for m in row["completion"] if m.get("tool_calls")]
        assert calls[-1]["name"] == "answer" and {c["name"] for c in calls} <= {"search", "access", "answer"}
        for call in calls:  # exactly the tool's own argument: no keys merged in from other calls
            assert list(call["arguments"]) == [{"search": "query", "access": "url", "answer": "answer"}[call["name"]]]
        env.reset(task_id=row["task_id"])  # replaying the calls earns the reward again
        for call in calls:
            getattr(env, call["name"])(**call["arguments"])
        assert env.get_reward() == 1.0
        assert json.loads(row["tools"]) == tool_schemas(env)


def test_tokenizer_gets_a_hermes_response_parser(tiny_model_dir):
    tokenizer = tool_calling_tokenizer(str(tiny_model_dir))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}], add_generation_prompt=True, tokenize=False
    )
    reply = '<tool_call>\n{"name": "search", "arguments": {"query": "Aldra"}}\n</tool_call><|im_end|>'
    parsed = tokenizer.parse_response(reply, prefix=prompt)
    assert parsed["tool_calls"] == [
        {"type": "function", "function": {"name": "search", "arguments": {"query": "Aldra"}}}
    ]


def warm_start(model_dir, out_dir, env_class, task_ids, steps: int = 100):
    """Teach the tiny model to answer each task with one `answer` tool call (loss on the reply only)."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = tool_calling_tokenizer(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    env = env_class()
    examples = []
    for task_id in task_ids:
        chat = [{"role": "user", "content": env.reset(task_id=task_id)}]
        call = {"type": "function", "function": {"name": "answer", "arguments": {"answer": gold(env)}}}
        prompt = tokenizer.apply_chat_template(
            chat, tools=tool_schemas(env), add_generation_prompt=True, return_dict=False
        )
        full = tokenizer.apply_chat_template(
            chat + [{"role": "assistant", "content": "", "tool_calls": [call]}],
            tools=tool_schemas(env),
            return_dict=False,
        )
        assert full[: len(prompt)] == prompt
        examples.append((list(full), len(prompt)))
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = 0.0
        for ids, n_prompt in examples:
            logits = model(torch.tensor([ids]), logits_to_keep=len(ids) - n_prompt + 1).logits[0, :-1]
            loss = loss + torch.nn.functional.cross_entropy(logits, torch.tensor(ids[n_prompt:]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def test_one_grpo_step_calls_the_tools_pays_the_judges_verdict_and_trains(
    tiny_model_dir, tmp_path, env_class, task_ids, one_torch_thread, monkeypatch
):
    import torch
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    ids = task_ids[:2]
    model_dir = warm_start(tiny_model_dir, tmp_path / "warm", env_class, ids)
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        max_steps=1,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=96,
        max_tool_calling_iterations=3,
        learning_rate=1e-3,
        bf16=False,
        use_cpu=True,
        activation_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        args=args,
        train_dataset=task_dataset(ENV_ID, task_ids=ids, **ENV_KWARGS),
        processing_class=tool_calling_tokenizer(str(model_dir)),
        environment_factory=env_class,
    )
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()

    envs = trainer._environment_pool[None]  # the 8 rollouts' environments, as TRL scored them
    assert len(envs) == 8 and {e.task_id for e in envs} == set(ids)
    judged = [s["info"]["verdict"] for e in envs for s in e.steps if s["tool"] == "answer"]
    assert judged, "no rollout called the answer tool"
    logs = trainer.state.log_history[0]
    assert logs["tools/call_frequency"] > 0
    rewards = [e.get_reward() for e in envs]
    assert all(
        r == (e.steps[-1]["info"]["verdict"]["score"] if e.steps and e.steps[-1]["tool"] == "answer" else 0.0)
        for r, e in zip(rewards, envs, strict=True)
    )
    assert math.isclose(logs["rewards/SearchGymEnv/mean"], sum(rewards) / len(rewards), abs_tol=1e-6)
    assert logs["frac_reward_zero_std"] < 1  # the judge told a group's rollouts apart: there was something to learn
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert changed, "the GRPO step did not change the weights"
    assert os.environ["TRL_EXPERIMENTAL_SILENCE"] == "1"


def test_the_example_script_parses_tool_calls_and_has_reward_spread(
    tiny_model_dir, tmp_path, env_class, task_ids, one_torch_thread, capsys
):
    """README's recipe end to end from a warm model (the test's quick warm start, not the example's): it sizes its
    budget from the demonstrations, and GRPO's rollouts call tools that TRL parsed (count > 0) with rewards that
    differ within a group (something to learn)."""
    import runpy
    from pathlib import Path

    warm = warm_start(tiny_model_dir, tmp_path / "warm", env_class, task_ids[:2])
    script = Path(__file__).resolve().parents[2] / "examples" / "train_with_trl.py"
    argv = ["--model", str(warm), "--sft-steps", "0", "--tasks", "2", "--held-out", "1", "--steps", "1"]
    argv += ["--num-generations", "4", "--max-completion-length", "96", "--out", str(tmp_path / "out")]
    argv += ["--env-kwargs", json.dumps(ENV_KWARGS), "--temperature", "1.0"]  # this warm model is sure of itself
    result = runpy.run_path(str(script))["main"](argv)
    sizing = result["sizing"]
    assert sizing["demonstrations"] >= 1 and sizing["max_completion_length"] == 96 and sizing["sft_steps"] == 0
    assert sizing["rollouts_per_step"] == sizing["rollouts_per_pass"] == 8  # a tiny vocabulary: one pass holds all
    assert "is below the longest demonstration" in capsys.readouterr().err  # 96 tokens cannot hold an oracle episode
    [step] = result["steps"]
    assert step["tool_calls"] > 0, "no tool call parsed"
    assert step["groups_with_spread"] > 0, "every group's rollouts had the same reward: nothing to learn"
    assert result["held_out_before"]["tasks"][0]["task_id"] == task_ids[2]  # not a training task
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_the_example_refuses_a_held_out_set_the_pool_cannot_hold_before_training(capsys):
    """--tasks + --held-out beyond the env's train pool is an error naming the pool's size, not a run that trains
    for minutes and then has no held-out tasks to judge."""
    import runpy
    from pathlib import Path

    import torch

    threads = torch.get_num_threads()

    script = Path(__file__).resolve().parents[2] / "examples" / "train_with_trl.py"
    argv = ["--tasks", "1000", "--held-out", "5", "--env-kwargs", json.dumps(ENV_KWARGS)]
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(script))["main"](argv)
    assert stop.value.code == 2
    assert torch.get_num_threads() == threads  # refused before it set anything up (torch's threads are process-wide)
    err = capsys.readouterr().err
    assert "need 1005 tasks" in err and "train pool has" in err


@given(
    batch=st.integers(1, 64),
    tokens=st.integers(1, 4096),
    vocab=st.integers(1, 200_000),
    budget=st.integers(1, 1 << 34),
)
def test_rollouts_per_pass_is_the_largest_divisor_whose_logits_fit(batch, tokens, vocab, budget):
    m = rollouts_per_pass(batch, tokens, vocab, budget_bytes=budget)
    fits = lambda n: n * tokens * vocab * 16 <= budget  # noqa: E731
    assert batch % m == 0 and (m == 1 or fits(m))
    assert not any(batch % n == 0 and fits(n) for n in range(m + 1, batch + 1))


def test_a_real_vocabulary_splits_a_grpo_step_into_passes_and_bad_sizes_are_refused():
    assert rollouts_per_pass(16, 1200, 49152) == 4  # SmolLM2: 16 rollouts at once passed 24 GB on this machine
    assert rollouts_per_pass(16, 1200, 2048) == 16  # the tiny model's vocabulary
    for bad in ({"batch": 0}, {"tokens": -1}, {"vocab_size": 2.5}, {"budget_bytes": True}):
        args = {"batch": 16, "tokens": 100, "vocab_size": 100, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            rollouts_per_pass(args.pop("batch"), args.pop("tokens"), args.pop("vocab_size"), **args)


def test_a_rollout_whose_logits_alone_pass_the_budget_is_named_and_one_that_fits_is_not():
    from searchgym.integrations.trl import LOGIT_BUDGET_BYTES, oversized_rollout_warning

    # 64 turns of a long search at SmolLM2's vocabulary: 32,768 positions x 49,152 x 16 bytes = 24 GiB
    warning = oversized_rollout_warning(32_768, 49_152)
    assert warning is not None and "24.0 GiB" in warning and "--max-completion-length" in warning
    assert rollouts_per_pass(16, 32_768, 49_152) == 1  # the split cannot go lower: hence the warning
    assert oversized_rollout_warning(1_200, 49_152) is None  # the TRL runs' episodes: 0.9 GiB a rollout
    edge = LOGIT_BUDGET_BYTES // (49_152 * 16)
    assert oversized_rollout_warning(edge, 49_152) is None and oversized_rollout_warning(edge + 1, 49_152)


def test_the_example_refuses_a_micro_batch_that_does_not_divide_the_step(tiny_model_dir, capsys):
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "train_with_trl.py"
    argv = [
        "--model",
        str(tiny_model_dir),
        "--tasks",
        "2",
        "--micro-batch",
        "3",
        "--env-kwargs",
        json.dumps(ENV_KWARGS),
    ]
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(script))["main"](argv)
    assert stop.value.code == 2 and "--micro-batch 3 must divide the step's 8 rollouts" in capsys.readouterr().err


def test_the_examples_own_base_model_reads_the_env_in_few_tokens_and_renders_tool_calls(
    env_class, task_ids, tiny_model_dir, tmp_path, one_torch_thread
):
    """Without --model the example builds its base: a tokenizer trained on this env's pages and demonstrations (a
    world's name is a token or two, not a spelling-out), copy pretraining on it, and a template TRL can parse."""
    import runpy
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    script = Path(__file__).resolve().parents[2] / "examples" / "train_with_trl.py"
    tiny_base_model = runpy.run_path(str(script))["tiny_base_model"]
    demos = demonstrations(env_class, task_ids[:2])
    base = tiny_base_model(env_class, demos, tmp_path, copy_steps=3, seed=0, device="cpu")
    tokenizer = tool_calling_tokenizer(str(base))
    AutoModelForCausalLM.from_pretrained(base)  # loads
    history = (base / "copy_pretrain_history.jsonl").read_text().splitlines()
    assert len(history) == 3  # the copy-pretraining steps ran
    calls = [m["tool_calls"][0]["function"] for m in demos[0]["completion"] if m.get("tool_calls")]
    [answer] = [c["arguments"]["answer"] for c in calls if c["name"] == "answer"]
    generic = tool_calling_tokenizer(str(tiny_model_dir))  # the test model's tokenizer, not trained on this world
    assert len(tokenizer(answer)["input_ids"]) < len(generic(answer)["input_ids"])
    assert len(completion_lengths(tokenizer, demos)) == len(demos)


def test_the_completion_budget_defaults_to_the_longest_demonstration(env_class, task_ids, tiny_model_dir):
    from searchgym.integrations.trl import completion_lengths

    tokenizer = tool_calling_tokenizer(str(tiny_model_dir))
    demos = demonstrations(env_class, task_ids[:2])
    lengths = completion_lengths(tokenizer, demos)
    for row, n in zip(demos, lengths, strict=True):
        tools = json.loads(row["tools"])
        whole = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tools=tools, return_dict=False)
        prompt = tokenizer.apply_chat_template(
            row["prompt"], tools=tools, add_generation_prompt=True, return_dict=False
        )
        assert n == len(whole) - len(prompt)
        assert n > 100  # tool results count: one search result alone is longer than a reply


@pytest.mark.parametrize(
    ("logs", "says"),
    [
        ([{"reward": 0.0, "reward_std": 0.0, "tools/call_frequency": 0.0}], ["no tool call ran", "same reward"]),
        ([{"reward": 1.0, "reward_std": 0.0, "tools/call_frequency": 2.0}], ["same reward"]),
        ([{"reward": 0.5, "reward_std": 0.3, "tools/call_frequency": 0.0}], ["no tool call ran"]),
        # one question's group all right, the other's all wrong: the batch has spread, no group does
        (
            [{"reward": 0.5, "reward_std": 0.53, "frac_reward_zero_std": 1.0, "tools/call_frequency": 2.0}],
            ["same reward"],
        ),
    ],
)
def test_a_run_with_nothing_to_learn_says_so(logs, says):
    from searchgym.integrations.trl import quiet_groups_warning

    warning = quiet_groups_warning([{"loss": 0.0}, *logs])
    assert warning is not None and all(s in warning for s in says)
    assert quiet_groups_warning([*logs, {"reward": 0.5, "reward_std": 0.2, "tools/call_frequency": 1.0}]) is None
    assert quiet_groups_warning([{"loss": 1.0}]) is None


def test_the_served_env_is_the_same_environment_for_trl(
    server_url, env_class, task_ids, tiny_model_dir, tmp_path, monkeypatch
):
    """`SearchGymEnv.served(url)` plays through OpenEnv what `configured` plays in process, and TRL sees the same
    tools."""
    from trl import GRPOConfig, GRPOTrainer

    served = SearchGymEnv.served(server_url)
    local, remote = env_class(), served()
    for env in (local, remote):
        env.reset(task_id=task_ids[0])
    calls = [("search", "mountain"), ("access", "https://world.searchgym.test/wiki/Nowhere"), ("answer", None)]
    for tool, argument in calls:
        argument = gold(local) if argument is None else argument
        assert getattr(remote, tool)(argument) == getattr(local, tool)(argument)
    assert remote.get_reward() == local.get_reward() == 1.0
    with pytest.raises(ValueError, match="episode is over"):
        remote.search("more")
    with pytest.raises(ValueError, match="no task with id"):
        remote.reset(task_id="no-such-task")
    assert local.search_env.task.id == task_ids[0]
    with pytest.raises(TypeError, match="lives in its server"):
        remote.search_env  # noqa: B018 - the property raises

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        bf16=False,
        use_cpu=True,
        activation_checkpointing=False,
        report_to="none",
    )
    tools = {}
    for cls in (env_class, served):
        trainer = GRPOTrainer(
            model=str(tiny_model_dir),
            args=args,
            environment_factory=cls,
            train_dataset=task_dataset(ENV_ID, task_ids=task_ids[:1], **ENV_KWARGS),
            processing_class=tool_calling_tokenizer(str(tiny_model_dir)),
        )
        tools[cls] = sorted(t.__name__ for t in trainer._env_tools[None])
    assert tools[env_class] == tools[served] == ["access", "answer", "search"]


def test_the_warm_start_loss_covers_the_tool_calls_not_the_tool_results(env_class, task_ids, tiny_model_dir):
    from searchgym.integrations.trl import assistant_tokens

    tokenizer = tool_calling_tokenizer(str(tiny_model_dir))
    demos = demonstrations(env_class, task_ids[:1])
    [row] = assistant_tokens(tokenizer, demos)
    tools = json.loads(demos[0]["tools"])
    whole = demos[0]["prompt"] + demos[0]["completion"]
    assert row["input_ids"] == list(tokenizer.apply_chat_template(whole, tools=tools, return_dict=False))
    trained = tokenizer.decode([t for t, m in zip(row["input_ids"], row["completion_mask"], strict=True) if m])
    shown = tokenizer.decode([t for t, m in zip(row["input_ids"], row["completion_mask"], strict=True) if not m])
    calls = [m["tool_calls"][0]["function"] for m in demos[0]["completion"] if m.get("tool_calls")]
    assert trained.count("<tool_call>") == len(calls) >= 2  # every call, in the format TRL parses
    for call in calls:
        assert json.dumps(call["arguments"])[1:-1] in trained
    assert "<information>" in shown and "<information>" not in trained  # search results are context, not targets
    question = demos[0]["prompt"][0]["content"]
    assert question[:40] in shown


def test_a_split_step_still_makes_one_optimizer_step_of_all_its_rollouts(tiny_model_dir, monkeypatch):
    """--micro-batch 2 of a step's 8 rollouts: TRL's own GRPOConfig must generate all 8 per optimizer step and
    accumulate 4 passes of 2 (without the accumulation each optimizer step would see a quarter of the groups)."""
    import runpy
    from pathlib import Path

    import trl

    seen = {}

    class Stop(Exception):
        pass

    def capture(*args, **kwargs):
        seen["args"] = kwargs["args"]
        raise Stop

    monkeypatch.setattr(trl, "GRPOTrainer", capture)
    script = Path(__file__).resolve().parents[2] / "examples" / "train_with_trl.py"
    argv = ["--model", str(tiny_model_dir), "--tasks", "2", "--sft-steps", "0", "--micro-batch", "2"]
    with pytest.raises(Stop):
        runpy.run_path(str(script))["main"]([*argv, "--env-kwargs", json.dumps(ENV_KWARGS)])
    config = seen["args"]
    assert config.per_device_train_batch_size == 2 and config.gradient_accumulation_steps == 4
    assert config.generation_batch_size == 8 and config.generation_batch_size % config.num_generations == 0
