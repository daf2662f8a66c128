"""Model servers for tests: the tiny model behind `serve model` on loopback, and small request helpers."""

import asyncio
import contextlib

import aiohttp
import torch
from transformers import AutoModelForCausalLM

from searchgym.agents.engines.sglang_engine import wait_until_ready
from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.serve.http import serve_app
from searchgym.serve.model import ModelServerSettings, create_app
from tests.agents.sglang_contract import with_contract_check

CONTEXT = 256  # the server's context length: bounds the work any accepted request can ask for
PROMPT = [11, 22, 33, 44, 55]
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@contextlib.asynccontextmanager
async def model_server(model_dir, **app_kwargs):
    """A TorchEngine on the model served on a free loopback port until the block ends; yields (url, engine).

    Every JSON answer of a native route is checked against SGLang's contract (a violation is a 500).
    """
    engine = TorchEngine(model_dir, seed=0)
    app = create_app(
        engine, ModelServerSettings(model_path=str(model_dir), **{"context_length": CONTEXT, **app_kwargs})
    )
    app = with_contract_check(app)
    try:
        async with serve_app(app) as url:
            async with aiohttp.ClientSession() as http:
                await wait_until_ready(http, url, 60, interval=0.05)
            yield url, engine
    finally:
        await engine.close()


async def post(http, url, path, body):
    async with http.post(url + path, json=body) as resp:
        return resp.status, await resp.json()


async def generate(http, url, **body):
    status, out = await post(http, url, "/generate", body)
    assert status == 200, out
    return out


async def wait_for_tokens(engine, n, timeout_s=60.0):
    """Return once the engine has generated at least n more tokens than when called (fail after `timeout_s`)."""
    start = engine.stats()["generated_tokens"]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while engine.stats()["generated_tokens"] < start + n:
        assert asyncio.get_running_loop().time() < deadline, f"the engine generated no {n} tokens in {timeout_s} s"
        await asyncio.sleep(0.005)


def perturbed_copy(model_dir, out_dir, scale=0.5, seed=1):
    """Save the model with noise added to every weight: same shapes, different outputs."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * scale)
    model.save_pretrained(out_dir)
    return out_dir


def teacher_forced(model, prompt, output):
    """log softmax of the model's logits at each output position (temperature 1), for the tokens taken."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(output)[:, None])[:, 0].tolist()


def tool_model_fixtures(name: str):
    """Module-scoped fixtures `server` (the tool-trained tiny model behind `serve model` as `name`, context 1024,
    yielding (url, engine)) and `client` (the official openai client on it), for OpenAI-route test modules:
    `server_fixture, client_fixture = tool_model_fixtures(NAME)`."""
    import openai
    import pytest_asyncio

    @pytest_asyncio.fixture(loop_scope="module", scope="module", name="server")
    async def server(tool_model_dir):
        async with model_server(tool_model_dir, served_model_name=name, context_length=1024) as running:
            yield running

    @pytest_asyncio.fixture(loop_scope="module", name="client")
    async def client(server):
        url, _ = server
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as c:
            yield c

    return server, client
