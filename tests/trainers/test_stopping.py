"""SIGTERM/SIGINT during training: the loop stops at a step boundary with `latest` at a whole checkpoint."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from searchgym.trainers.config import load_config
from searchgym.trainers.launchers.local import train
from searchgym.trainers.loop import Batch, Schedule, train_loop
from searchgym.trainers.rollout.controller import RolloutStats
from searchgym.trainers.run.checkpoint import (
    LATEST,
    checkpoint_root,
    latest_checkpoint,
    load_trainer_state,
    write_pointer,
)
from searchgym.trainers.run.stopping import StopRequest, TrainingStopped
from tests.conftest import SMALL


class FakeRollouts:
    """Batches of no groups; the batch for `block_at` never comes (a slow rollout) and its wait records a cancel."""

    def __init__(self, block_at: int | None, cancel_safe: bool):
        self.block_at, self.cancel_safe, self.served, self.cancelled = block_at, cancel_safe, 0, False

    async def get_batch(self) -> Batch:
        if self.served + 1 == self.block_at:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        self.served += 1
        return Batch([])

    async def set_trained_version(self, version):
        pass

    async def stats(self):
        return [RolloutStats()]

    async def state_dicts(self):
        return [{"served": self.served}]

    async def discard(self):
        return 0


class FakeLearner:
    """Steps that wait for `release` at `hold_at`; checkpoints recorded and pointed to as the real ones are."""

    def __init__(self, run_dir: Path, hold_at: int | None = None):
        self.run_dir, self.hold_at, self.version, self.saved = run_dir, hold_at, 0, []
        self.holding, self.release = asyncio.Event(), asyncio.Event()

    async def train_step(self, batch):
        if self.version + 1 == self.hold_at:
            self.holding.set()
            await self.release.wait()
        self.version += 1
        return {"loss": 0.0, "version": float(self.version)}

    async def push_weights(self):
        return self.version

    async def save_checkpoint(self, step, rollouts):
        self.saved.append(step)
        checkpoint_root(self.run_dir).mkdir(parents=True, exist_ok=True)
        write_pointer(checkpoint_root(self.run_dir) / LATEST, f"step-{step:05d}")


class FakeLog:
    def __init__(self, run_dir: Path):
        self.dir, self.rows = run_dir, []

    def record(self, step, stats, batch, trained_version):
        self.rows.append(step)

    def history(self):
        return self.rows


async def _run(rollouts, learner, log, act) -> TrainingStopped:
    """Train 10 steps (checkpoint every 10), `act(stop)` meanwhile; the TrainingStopped the run ends with."""
    with StopRequest().installed() as stop:
        loop = asyncio.ensure_future(
            train_loop(rollouts, learner, log, Schedule(1, 10, 0, 10), progress=False, stop=stop)
        )
        await act(stop)
        with pytest.raises(TrainingStopped) as caught:
            await loop
    return caught.value


def test_a_stop_during_a_learner_step_finishes_it_and_checkpoints_it(tmp_path):
    rollouts, learner, log = FakeRollouts(None, cancel_safe=False), FakeLearner(tmp_path, hold_at=3), FakeLog(tmp_path)

    async def act(stop):
        await learner.holding.wait()
        stop.request(signal.SIGTERM)
        learner.release.set()

    stopped = asyncio.run(_run(rollouts, learner, log, act))
    assert log.rows == [1, 2, 3] and learner.saved == [3]  # step 3 was trained, then kept
    assert (stopped.step, stopped.checkpoint, stopped.exit_status) == (3, "step-00003", 143)
    assert "stopped by SIGTERM after step 3; checkpoints/latest names step-00003" in str(stopped)


@pytest.mark.parametrize("cancel_safe", [True, False])
def test_a_stop_while_waiting_for_a_batch_abandons_the_wait(tmp_path, cancel_safe):
    rollouts, learner, log = FakeRollouts(3, cancel_safe), FakeLearner(tmp_path), FakeLog(tmp_path)

    async def act(stop):
        while len(log.rows) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        stop.request(signal.SIGINT)

    stopped = asyncio.run(_run(rollouts, learner, log, act))
    assert rollouts.cancelled and log.rows == [1, 2]
    # the trained steps are checkpointed only where a cancelled wait takes no group from the rollouts' state
    assert learner.saved == ([2] if cancel_safe else [])
    assert (stopped.step, stopped.checkpoint, stopped.exit_status) == (2, "step-00002" if cancel_safe else None, 130)


def test_a_second_signal_abandons_the_step(tmp_path):
    rollouts, learner, log = FakeRollouts(None, cancel_safe=True), FakeLearner(tmp_path, hold_at=2), FakeLog(tmp_path)

    async def act(stop):
        await learner.holding.wait()  # never released: a step that would not end
        stop.request(signal.SIGTERM)
        stop.request(signal.SIGTERM)

    stopped = asyncio.run(_run(rollouts, learner, log, act))
    assert log.rows == [1] and learner.saved == [] and stopped.checkpoint is None and stopped.step == 1


STEPS = 8


def _overrides(run_dir: Path, model: Path) -> list[str]:
    return [
        f"out_dir={run_dir}",
        f"model.path={model}",
        f"steps={STEPS}",
        "save_every=6",
        "keep_checkpoints=2",
        f"env.kwargs.size={SMALL['size']}",
        f"env.kwargs.n_tasks={SMALL['n_tasks']}",
        "env.kwargs.max_turns=2",
        "rollout.group_size=2",
        "rollout.batch_size=2",
        "rollout.max_new_tokens=12",
        "rollout.max_staleness=1",
        "learner.drop_no_spread=false",
        "learner.lr=1e-3",
    ]


def _metric_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def test_sigterm_stops_searchgym_train_cleanly_and_resume_goes_on(tmp_path, small_bundle, tiny_model_dir):
    run_dir = tmp_path / "run"
    overrides = _overrides(run_dir, tiny_model_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchgym.cli", "train", *overrides],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and len(_metric_steps(run_dir)) < 1:
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before the signal: {proc.stderr.read()[-2000:]}"
    proc.send_signal(signal.SIGTERM)  # after step 1 and (most likely) before step 6, the first scheduled checkpoint
    _, stderr = proc.communicate(timeout=120)

    trained = _metric_steps(run_dir)
    assert proc.returncode == 143, stderr[-2000:]
    assert 1 <= len(trained) < STEPS, trained
    root = run_dir / "checkpoints"
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # no partial dirs, locks or temp files
    checkpoint = latest_checkpoint(run_dir)  # a whole checkpoint: its trainer state and weights load
    assert load_trainer_state(checkpoint)["step"] == trained[-1]  # the stop kept every trained step
    assert f"training stopped by SIGTERM after step {trained[-1]}; checkpoints/latest names {checkpoint.name}" in stderr
    assert "Traceback" not in stderr

    history = train(load_config(None, overrides), resume=True, progress=False)
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    assert [h["version"] for h in history] == [float(v) for v in range(1, STEPS + 1)]


def test_the_handlers_a_caller_had_are_back_after_training():
    """asyncio's remove_signal_handler leaves SIG_DFL: a handler set before train() (Ray's, a caller's) must come
    back, or a SIGTERM during shutdown kills the process outright."""
    seen = []

    def callers(signum, frame):
        seen.append(signum)

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, callers)
    try:

        async def main():
            with StopRequest().installed() as stop:
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.sleep(0.2)
                return stop.signum

        assert asyncio.run(main()) == signal.SIGTERM and seen == []  # during training: the stop request's
        assert signal.getsignal(signal.SIGTERM) is callers and signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert seen == [signal.SIGTERM]  # after: the caller's again
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
