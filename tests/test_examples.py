"""examples/: a third-party REINFORCE loop that uses only Gymnasium, torch and transformers, and a custom agent
written as a rollout workflow that the stock train and eval commands run unchanged."""

import ast
import json
import math
import runpy
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from tests.conftest import SMALL
from tests.stock_commands import eval_small, train_small

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "reinforce.py"
SHAPED_ID = "searchgym_test/LetterShareSyntheticQA-v0"


class LetterShare(gym.Wrapper):
    """Final reward = half the judge's score + half the share of ASCII letters in the last turn.

    A random tiny model never answers correctly, so on the plain env every return is 0 and REINFORCE
    has no signal; this keeps the reward in [0, 1] but makes it differ between episodes.
    """

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            letters = sum(c.isascii() and c.isalpha() for c in action) / max(len(action), 1)
            reward = 0.5 * reward + 0.5 * letters
        return obs, reward, terminated, truncated, info


def make_letter_share(**kwargs):
    return LetterShare(gym.make("searchgym:searchgym/SyntheticQA-v0", **kwargs))


@pytest.fixture(autouse=True)
def one_torch_thread():
    """A 224k-parameter model runs fastest on one thread; on a busy machine more threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_example(argv: list[str]) -> list[dict]:
    """Load the example from its path (examples/ is not a package) and run its main."""
    return runpy.run_path(str(EXAMPLE))["main"](argv)


def test_example_imports_nothing_from_searchgym():
    tree = ast.parse(EXAMPLE.read_text())
    modules = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    modules += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert {"gymnasium", "torch", "transformers"} <= {m.split(".")[0] for m in modules}
    assert not [m for m in modules if m.split(".")[0] == "searchgym"]


def test_reinforce_runs_on_the_registered_env(tiny_model_dir):
    """The default env id, built by gym.make's "module:EnvId" form: a random model earns 0, so no update."""
    stats = run_example(
        [
            "--model",
            str(tiny_model_dir),
            "--env-kwargs",
            json.dumps(SMALL),
            "--iterations",
            "1",
            "--episodes-per-iteration",
            "2",
            "--max-new-tokens",
            "8",
            "--max-turns",
            "1",
        ]
    )
    assert len(stats) == 1
    assert stats[0]["mean_reward"] == 0.0 and stats[0]["loss"] == 0.0 and stats[0]["grad_norm"] == 0.0
    assert stats[0]["mean_turns"] == 1.0 and 0 < stats[0]["generated_tokens"] <= 2 * 8


def test_reinforce_takes_a_gradient_step(tiny_model_dir, tmp_path):
    if SHAPED_ID not in gym.registry:
        gym.register(id=SHAPED_ID, entry_point=make_letter_share)
    out = tmp_path / "trained"
    stats = run_example(
        [
            "--model",
            str(tiny_model_dir),
            "--env-id",
            SHAPED_ID,
            "--env-kwargs",
            json.dumps(SMALL),
            "--iterations",
            "1",
            "--episodes-per-iteration",
            "4",
            "--max-new-tokens",
            "24",
            "--max-turns",
            "2",
            "--lr",
            "1e-3",
            "--seed",
            "0",
            "--save",
            str(out),
        ]
    )
    assert len(stats) == 1
    row = stats[0]
    assert math.isfinite(row["loss"]) and 0.0 <= row["mean_reward"] <= 1.0
    assert row["grad_norm"] > 0.0 and 1.0 <= row["mean_turns"] <= 2.0

    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert before.keys() == after.keys()
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert changed, "no weight changed: no gradient step happened"
    assert all(torch.isfinite(t).all() for t in after.values())


SUMMARIZING = Path(__file__).resolve().parents[1] / "examples" / "summarizing_workflow.py"


def test_a_custom_workflow_trains_and_evaluates_with_the_stock_commands(tiny_model_dir, small_bundle, tmp_path):
    """examples/summarizing_workflow.py, named on the command line, plays every episode of `train` and `eval`."""
    agent = tmp_path / "agent.py"  # a user's file: summarize every tool result, so a random model triggers it too
    agent.write_text(
        "import runpy\n"
        f"SummarizingWorkflow = runpy.run_path({str(SUMMARIZING)!r})['SummarizingWorkflow']\n\n\n"
        "class SummarizeEverything(SummarizingWorkflow):\n"
        "    summarize_tools = ('search', 'access', 'invalid')\n"
        "    min_chars = 0\n"
        "    summary_tokens = 6\n"
    )
    workflow = f"{agent}:SummarizeEverything"
    trained = train_small(tiny_model_dir, tmp_path / "run", f"rollout.workflow={workflow}")
    assert len(trained) == 2 * 2 * 2  # two steps of two groups of two
    assert (tmp_path / "run" / "checkpoints" / "step-00002").is_dir()
    summarized = [(traj, i) for traj in trained for i, turn in enumerate(traj.turns) if "summary" in turn.info]
    assert summarized, "the custom workflow never ran"
    for traj, i in summarized:
        seen = traj.messages[2 * i + 2]["content"]  # what the policy read after turn i
        assert seen.startswith("<information>\nNotes on ") and traj.turns[i].info["summary"] in seen
        assert seen != traj.turns[i].observation  # the raw tool result is kept in the record, not in the context

    out = tmp_path / "eval"
    rows = eval_small(tiny_model_dir, out, "--workflow", workflow, env_kwargs={"max_turns": 2}, max_tasks=3)
    assert len(rows) == 3 and json.loads((out / "run.json").read_text())["workflow"] == workflow
    assert any("summary" in turn["info"] for row in rows for turn in row["trajectory"]["turns"])


def test_help_answers_before_torch_or_transformers_load():
    """`--help` of the example and of every searchgym command parses without importing torch or transformers."""
    probe = (
        "import runpy, sys\n"
        "from searchgym.cli import main\n"
        "for argv in (['--help'], ['train', '--help'], ['eval', '--help'], ['quickstart', '--help'],\n"
        "             ['serve', 'model', '--help'], ['bench', 'trainer', '--help']):\n"
        "    try: main(argv)\n"
        "    except SystemExit: pass\n"
        "sys.argv = ['reinforce.py', '--help']\n"
        f"try: runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')\n"
        "except SystemExit: pass\n"
        "print(sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]
