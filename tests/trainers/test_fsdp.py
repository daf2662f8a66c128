"""The sharded learner (FSDP2, 2 gloo ranks under torchrun on 127.0.0.1) against the single-rank learner:
the same fixed batches give the same weights after every step, and a run killed after a checkpoint resumes
sharded (rank 0 leading, rank 1 following) to the same weights; the checkpoint's consolidated model directory loads
as an ordinary model."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from searchgym.agents.trajectory import Trajectory, Turn
from searchgym.trainers.algorithm.learner import Learner, LearnerConfig
from searchgym.trainers.run.checkpoint import latest_checkpoint

WORKER = Path(__file__).with_name("fsdp_worker.py")
# two minibatches (two sequential optimizer steps per learner step), micro-batches small enough that the ranks
# run different numbers of them (fillers), a cap that drops some tokens, a learning rate that moves the weights
CONFIG = dict(lr=1e-3, minibatches=2, micro_batch_tokens=48, behav_weight_cap=2.0, eps_clip=0.2, grad_clip=1.0)
STEPS = 3


def trajectory(gen: torch.Generator, vocab: int, reward: float) -> Trajectory:
    """A random token episode: a prompt, then 1-3 generated runs separated by observations, with behaviour log-probs."""
    traj = Trajectory(task_id="t", reward=reward)
    traj.extend(
        torch.randint(3, vocab, (int(torch.randint(3, 8, (1,), generator=gen)),), generator=gen).tolist(),
        generated=False,
    )
    for _ in range(int(torch.randint(1, 4, (1,), generator=gen))):
        n = int(torch.randint(2, 9, (1,), generator=gen))
        traj.extend(
            torch.randint(3, vocab, (n,), generator=gen).tolist(),
            generated=True,
            logprobs=(-torch.rand(n, generator=gen) * 6 - 2).tolist(),
            versions=[0] * n,
        )
        traj.turns.append(Turn(action="", tool="search", observation="", generated_tokens=n))
        traj.extend(torch.randint(3, vocab, (3,), generator=gen).tolist(), generated=False)
    return traj


def fixed_batches(vocab: int) -> list[list[list[Trajectory]]]:
    """STEPS batches of 3 groups of 3 episodes (9 trajectories: ranks and minibatches get unequal shares)."""
    gen = torch.Generator().manual_seed(7)
    return [[[trajectory(gen, vocab, float(i == g % 3)) for i in range(3)] for g in range(3)] for _ in range(STEPS)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(tmp_path: Path, **spec) -> subprocess.CompletedProcess:
    spec_path = tmp_path / f"spec-{spec['resume']}.json"
    spec_path.write_text(json.dumps(spec))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(WORKER),
        str(spec_path),
    ]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).parents[2],
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.fixture(scope="module")
def single_rank(tiny_model_dir):
    """Weights after each step of the single-rank learner on the fixed batches."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    learner = Learner(model, LearnerConfig(**CONFIG))
    batches = fixed_batches(model.config.vocab_size)
    weights, stats = [], []
    for groups in batches:
        stats.append(learner.step(groups))
        assert stats[-1]["updated"] == 1.0
        weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return batches, weights, stats


def assert_same_weights(got: dict, want: dict) -> None:
    """Equal within torch's float32 tolerance (atol 1e-5): a step moves each weight by ~2e-3 (lr 1e-3, 2 Adam
    steps), and the ranks differ only in summation order (measured: at most 2.4e-6, in the embedding)."""
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name)


def test_two_fsdp_ranks_train_like_one_and_resume_sharded(tiny_model_dir, single_rank, tmp_path):
    batches, want, want_stats = single_rank
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert max((want[0][k] - initial[k]).abs().max().item() for k in initial) > 1e-4  # the steps move the weights
    torch.save(batches, tmp_path / "batches.pt")
    run_dir = tmp_path / "run"
    spec = dict(
        model_dir=str(tiny_model_dir),
        batches=str(tmp_path / "batches.pt"),
        run_dir=str(run_dir),
        steps=STEPS,
        config=CONFIG,
    )

    killed = torchrun(tmp_path, resume=False, die_after=2, **spec)
    assert killed.returncode != 0, killed.stderr[-3000:]
    assert latest_checkpoint(run_dir).name == "step-00002" and not (run_dir / "weights-3.pt").exists()
    for step in (1, 2):
        assert_same_weights(torch.load(run_dir / f"weights-{step}.pt")["weights"], want[step - 1])

    # resumed with rank 0 driving (lead) and rank 1 replaying its collectives (follow), as a training loop runs it
    resumed = torchrun(tmp_path, resume=True, die_after=None, follow=True, **spec)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    third = torch.load(run_dir / "weights-3.pt")
    assert_same_weights(third["weights"], want[2])
    assert third["stats"]["version"] == 3.0  # the version came back from the checkpoint
    # Adam hides a gradient's scale; the gradient norm does not (ranks' gradients add up to the whole batch's)
    for key in ("grad_norm", "loss", "importance_weight_max", "behav_capped_fraction"):
        assert third["stats"][key] == pytest.approx(want_stats[2][key], rel=1e-4, abs=1e-7), key
    # token counts are sums over ranks and minibatches: every trained token of the batch, once
    assert third["stats"]["normalizer_tokens"] == sum(sum(t.loss_mask[1:]) for g in batches[2] for t in g)

    # the checkpoint is an ordinary model directory too (serving, eval), holding the step's weights
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint.name == "step-00003" and (checkpoint / "sharded").is_dir()
    dense = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    assert_same_weights(dense.state_dict(), want[2])
