"""Stopping a training run on SIGTERM or SIGINT: the loop ends at a step boundary with `latest` at a whole checkpoint.

The first signal asks the loop to stop: a step whose batch is still being waited for is abandoned (nothing of
it was trained); a step being trained finishes and is checkpointed; then the run raises TrainingStopped, whose
exit status (`searchgym train`) is 128 + the signal number (143 for SIGTERM, 130 for SIGINT). A second signal
abandons the step (the loop's task is cancelled; work already in a thread, a learner step or a checkpoint
write, ends before the process exits, and `latest` names a whole checkpoint either way). This module imports
only the standard library: the CLI catches TrainingStopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingStopped(Exception):
    """The run stopped on a signal before its last step; `latest` names the checkpoint to --resume from."""

    def __init__(self, signum: int, step: int, checkpoint: str | None):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        name = signal.Signals(signum).name
        where = (
            f"checkpoints/latest names {checkpoint}: continue with --resume"
            if checkpoint
            else "no checkpoint was written yet: --resume starts over at step 1"
        )
        super().__init__(f"training stopped by {name} after step {step}; {where}")

    @property
    def exit_status(self) -> int:
        """The shell's convention for a process ended by a signal."""
        return 128 + self.signum


class StopRequest:
    """Set by a signal; the training loop checks it between the parts of a step."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.abandoned = False  # a second signal came: the loop's task was cancelled
        self._event = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    async def wait(self) -> None:
        await self._event.wait()

    def request(self, signum: int) -> None:
        """The first call asks for a clean stop; a second abandons the run now (cancels the loop's task)."""
        if self.signum is not None:
            if self._task is not None and not self.abandoned:
                self.abandoned = True
                self._task.cancel()
            return
        self.signum = signum
        self._event.set()

    def stopped(self, step: int, checkpoint: str | None) -> TrainingStopped:
        """The error that ends the run after `step`, `checkpoint` being what `latest` names."""
        assert self.signum is not None
        return TrainingStopped(self.signum, step, checkpoint)

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequest]:
        """Route SIGTERM and SIGINT to `request` while the current task trains (in the running event loop)."""
        loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        installed = []  # (signal, the handler it had before): put back after, as asyncio's removal would not
        try:
            for signum in SIGNALS:
                try:
                    previous = signal.getsignal(signum)
                    loop.add_signal_handler(signum, self.request, signum)
                    installed.append((signum, previous))
                except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no signals here
                    pass
            yield self
        finally:
            for signum, previous in installed:
                loop.remove_signal_handler(signum)
                if previous is not None:  # None: set outside Python; asyncio's default is the best left
                    signal.signal(signum, previous)
