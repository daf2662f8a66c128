"""The local launcher's learner ranks: this process is rank 0 and leads, N-1 spawned processes follow.

    followers = FollowerRanks(spec)       spawns ranks 1..N-1 (torch.multiprocessing, spawn): each joins the
                                          process group on 127.0.0.1 (gloo on CPU, NCCL on GPU), builds the same
                                          ShardedLearner and replays rank 0's collectives (`follow()`)
    learner = followers.lead()            rank 0's ShardedLearner, leading
    ...train...
    followers.close(learner)              release the followers and wait for them to exit

A follower dies with its leader: it polls its parent and exits when the parent is gone (Ctrl-C, SIGKILL),
and the leader's exit (normal or not) ends the followers it spawned. A follower that dies makes the leader
fail with an error naming the rank and its exit code (`failure()`), instead of a wait on a dead peer.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from searchgym.trainers.algorithm.fsdp import ShardedLearner
from searchgym.trainers.learner_side import RankSpec, sharded_learner

log = logging.getLogger(__name__)

PARENT_POLL_S = 0.5


def die_with_parent(parent: int) -> None:
    """Exit this process at once when `parent` is no longer its parent (it died, even by SIGKILL)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def _follow(rank: int, spec: RankSpec, parent: int) -> None:
    """A follower process: build the learner, replay the leader's collectives until it stops them.

    It ignores SIGINT and SIGTERM (a Ctrl-C or a scheduler signals the whole process group): the leader decides
    when to stop, finishing its step and checkpoint with the followers' collectives; they die with it."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    die_with_parent(parent)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    learner = sharded_learner(spec, rank)
    learner.follow()
    dist.destroy_process_group()


class FollowerRanks:
    """Ranks 1..world-1 of a local sharded learner, as child processes of this one (rank 0)."""

    def __init__(self, spec: RankSpec):
        if spec.world < 2:
            raise ValueError("FollowerRanks needs a world of at least 2 ranks")
        self.spec = spec
        context = mp.get_context("spawn")
        self.processes = [
            context.Process(target=_follow, args=(rank, spec, os.getpid()), daemon=True, name=f"learner-rank-{rank}")
            for rank in range(1, spec.world)
        ]
        for process in self.processes:
            process.start()

    def failure(self, wait: float = 0.0) -> str | None:
        """Why the learner cannot go on: a follower that exited (its rank, pid and exit code), or None.

        `wait` seconds are given for a follower to be seen exiting: after a collective failed, the peer's socket
        can close before its process is reaped."""
        deadline = time.monotonic() + wait
        while True:
            for rank, process in enumerate(self.processes, start=1):
                if process.exitcode is not None:
                    return (
                        f"learner rank {rank} (pid {process.pid}) exited with code {process.exitcode}: the "
                        "sharded learner cannot go on without it (its traceback, if any, is above)"
                    )
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def check(self) -> None:
        """Raise if a follower has exited."""
        if (message := self.failure()) is not None:
            raise RuntimeError(message)

    def lead(self) -> ShardedLearner:
        """Build rank 0's learner (joining the group as the followers start) and make it lead them."""
        result: dict[str, Any] = {}

        def build() -> None:
            try:
                result["learner"] = sharded_learner(self.spec, 0)
            except BaseException as e:  # noqa: BLE001 -- handed to the caller below
                result["error"] = e

        builder = threading.Thread(target=build, name="learner-rank-0", daemon=True)
        builder.start()
        while builder.is_alive():  # a follower dying before it joins would leave the group waiting for it
            builder.join(PARENT_POLL_S)
            self.check()
        if "error" in result:  # rank 0's own failure explains a follower's that followed from it
            raise result["error"]
        learner: ShardedLearner = result["learner"]
        learner.lead()
        return learner

    def close(self, learner: ShardedLearner | None = None, *, timeout: float = 60) -> None:
        """Release the followers (`learner.stop()` when the run ended cleanly) and wait for them; end stragglers."""
        if learner is not None and self.failure() is None:
            try:
                learner.stop()
            except Exception as e:  # noqa: BLE001 -- a broken group: the followers are ended below
                log.warning("could not release the learner ranks: %r", e)
        deadline = time.monotonic() + (timeout if learner is not None else 0)
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join()
        if dist.is_initialized():
            dist.destroy_process_group()
