"""A Hermes-format env end to end: a policy warm-started on `<tool_call>` JSON demonstrations trains for two
RL steps and is evaluated, with generation stopping at the format's own close and every call parsed."""

import json

from safetensors.torch import load_file

from searchgym.envs.actions import parse_action
from searchgym.eval.harness import run_eval
from searchgym.trainers.algorithm.learner import LearnerConfig
from searchgym.trainers.config import EnvConfig, ModelConfig, RolloutConfig, TrainConfig
from searchgym.trainers.launchers.local import train
from tests.conftest import WARM_ENV, WARM_TASKS

SYN = "searchgym/SyntheticQA-v0"
HERMES_ENV = {**WARM_ENV, "tool_format": "hermes"}
MAX_NEW_TOKENS = 96  # a JSON call is ~60 tokens of the tiny tokenizer


def generated_turns(traj):
    """The text of each run of generated tokens (one per turn), decoded with the trajectory's tokenizer."""
    runs, current = [], []
    for token, mask in zip(traj["input_ids"], traj["loss_mask"], strict=True):
        if mask:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def check_calls_stop_at_their_close(trajectories, tokenizer):
    """Every turn whose call ran was cut right after `</tool_call>` by the stop string (not an eos, not the
    token budget), its JSON call parsed; returns how often each tool ran."""
    counts = {}
    for traj in trajectories:
        runs = generated_turns(traj)
        assert len(runs) == len(traj["turns"])
        for run, turn in zip(runs, traj["turns"], strict=True):
            counts[turn["tool"]] = counts.get(turn["tool"], 0) + 1
            if turn["tool"] == "invalid":
                continue
            assert tokenizer.decode(run, skip_special_tokens=False).endswith("</tool_call>"), turn["action"]
            assert turn["finish_reason"] == "stop" and parse_action(turn["action"]).format == "json"
    return counts


def test_a_hermes_format_env_trains_and_evaluates_end_to_end(tmp_path, hermes_model, one_torch_thread):
    from transformers import AutoTokenizer

    model_dir, demos = hermes_model
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # the oracle demonstrated the env's own format: every action is one JSON call
    actions = [m["content"] for chat in demos for m in chat if m["role"] == "assistant"]
    assert len(demos) >= WARM_TASKS - 2 and all(a.startswith("<tool_call>\n{") for a in actions)
    assert {"search", "answer"} <= {parse_action(a).tool for a in actions} and all(parse_action(a).ok for a in actions)

    import gymnasium as gym

    learnt = {chat[0]["content"] for chat in demos}  # the prompt is the question itself
    tasks = [t.id for t in list(gym.make(SYN, **HERMES_ENV).unwrapped.tasks)[:WARM_TASKS] if t.question in learnt]
    config = TrainConfig(
        steps=2,
        out_dir=str(tmp_path / "rl"),
        env=EnvConfig(kwargs=HERMES_ENV),
        tasks=tasks,
        model=ModelConfig(path=str(model_dir)),
        rollout=RolloutConfig(
            group_size=2, batch_size=2, max_new_tokens=MAX_NEW_TOKENS, max_context=1024, temperature=0.5
        ),  # a ~60-token JSON call sampled at 1.0 often breaks somewhere
        learner=LearnerConfig(drop_no_spread=False, lr=1e-3, temperature=0.5),
    )
    history = train(config, progress=False)
    assert [h["step"] for h in history] == [1, 2]
    trained = [
        json.loads(line)
        for path in sorted((tmp_path / "rl" / "trajectories").glob("version-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert len(trained) == 2 * 2 * 2
    counts = check_calls_stop_at_their_close(trained, tokenizer)
    assert counts.get("search", 0) >= 4 and counts.get("answer", 0) >= 4, counts
    checkpoint = tmp_path / "rl" / "checkpoints" / "step-00002"
    before, after = load_file(model_dir / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    changed = any(not before[name].equal(after[name]) for name in before)
    assert changed == any(h["grad_norm"] > 0 for h in history)  # the checkpoint is the trained policy

    summary = run_eval(
        SYN,
        str(checkpoint),
        tmp_path / "eval",
        k=2,
        judge="em,f1",
        env_kwargs=HERMES_ENV,
        max_tasks=4,
        temperature=0.0,
        max_new_tokens=MAX_NEW_TOKENS,
        max_context=1024,
        progress=False,
    )
    rows = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    counts = check_calls_stop_at_their_close([r["trajectory"] for r in rows], tokenizer)
    m = summary["metrics"]
    assert m["samples"] == 8 and m["searches"] == counts.get("search", 0) / 8 >= 0.5
    assert m["answered"] == counts.get("answer", 0) / 8 >= 0.5
    for row in rows:
        assert set(row["verdicts"]) == {"em", "f1"} and all(v["error"] is None for v in row["verdicts"].values())
        if row["prediction"] is not None:
            assert row["prediction"] == parse_action(row["trajectory"]["turns"][-1]["action"]).argument
    assert any(r["verdicts"]["em"]["correct"] for r in rows)
