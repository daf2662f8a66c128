"""Shared by the integration tests: the small SyntheticQA env kwargs, one torch thread, the env served on loopback."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from searchgym.envs.judges import Verdict
from tests.conftest import SMALL

# one-hop tasks, the brief instructions and short results: short prompts for the tiny model
ENV_KWARGS = {**SMALL, "hops": 1, "instructions": "brief", "top_k": 1, "doc_chars": 120, "max_turns": 3}


class BrokenJudge:
    """A judge that could not score (as an LLM judge whose endpoint failed reports it)."""

    name = "broken"

    async def ajudge(self, prediction, references, *, question="", format_errors=()) -> Verdict:
        return Verdict(0.0, False, self.name, error="judge endpoint timed out")


@pytest.fixture
def one_torch_thread():
    """A tiny model runs fastest on one thread; on a busy machine more threads only contend."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, what: str, limit: float = 30.0) -> None:
    """Poll `condition` (a bounded wait for an event, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def uvicorn_in_thread(app, **options):
    """Serve an ASGI app with uvicorn on a free 127.0.0.1 port in a thread for the block; yields its URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the server to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def server_url():
    """The env served in this process (so the test can see its sessions) by uvicorn on 127.0.0.1."""
    pytest.importorskip("openenv")
    from searchgym.serve.env_host import make_app
    from searchgym.serve.settings import EnvHostSettings

    with uvicorn_in_thread(
        make_app(EnvHostSettings(env_id="searchgym/SyntheticQA-v0", env_kwargs=ENV_KWARGS, max_sessions=16))
    ) as url:
        yield url
