"""Fixtures of the agents tests: a tiny model that has learnt one tool-calling exchange.

Loading this file also makes every `serve model` app the test run starts (in any test directory collected
with this one) check its native answers against SGLang 0.5.23's contract (tests/agents/sglang_contract.py).
"""

import aiohttp
import pytest
import pytest_asyncio
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.agents.sglang_contract import check_every_model_server

check_every_model_server()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    """The default tiny model's tokenizer, loaded from its directory."""
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    """The default tiny model, loaded from its directory in eval mode."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir, tmp_path_factory):
    """The default tiny model taught tests/agents/tool_model.py's exchange (greedy decoding reproduces it)."""
    from tests.agents.tool_model import train_tool_model

    return train_tool_model(tiny_model_dir, tmp_path_factory.mktemp("tool-model"))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tiny_model_dir):
    """The default tiny model behind `serve model` for one test module; yields (url, engine)."""
    from tests.agents.servers import model_server

    async with model_server(tiny_model_dir) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def http():
    async with aiohttp.ClientSession() as session:
        yield session
