"""The model server's application and lifecycle: routes of both APIs, errors in each one's dialect, warm-up,
serving on a port, and `python -m searchgym.serve.model`, whose flags are `searchgym serve model`'s
(ModelServerSettings, named like `sglang.launch_server`'s).

Every client path written for SGLang (SGLangEngine, AReaL, slime, verl, curl scripts) or for OpenAI (the
`openai` client) runs for real against it on a CPU machine and in CI. Bad input is always a 400 with a
message, never a 500; unknown routes and wrong methods get a JSON body in the caller's dialect too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.serve.http import error_middleware, serve_app, wait_for_signal
from searchgym.serve.model.core import Limits, ServedModel
from searchgym.serve.model.openai_api import OpenAIAPI, error_body
from searchgym.serve.model.sglang_api import SGLangAPI
from searchgym.serve.model.sglang_control import ControlAPI
from searchgym.serve.model.wire import json_response
from searchgym.serve.settings import (
    ModelServerSettings,
    add_model_flags,
    checked,
    server_settings,
)

logger = logging.getLogger(__name__)

_MODEL = web.AppKey("model", ServedModel)
_WARM_UP = web.AppKey("warm_up", asyncio.Task)


def error_response(request: web.Request, status: int, message: str) -> web.Response:
    """An error body in the caller's dialect: OpenAI's envelope under /v1, SGLang's {"error": {message, code}} else."""
    if request.path.startswith("/v1/"):
        return json_response(error_body(status, message), status=status)
    return json_response({"error": {"message": message, "code": status}}, status=status)


def create_app(engine: TorchEngine, settings: ModelServerSettings) -> web.Application:
    """The aiohttp app serving `engine` (a TorchEngine) with SGLang's and OpenAI's routes; warms up on startup.

    `settings.model_path` is the label replies carry; its per-request limits (core.Limits; None: the defaults) are
    checked here, a bad one a ValueError naming it. Host, port, device and socket limits are run_server's.
    """
    model = ServedModel(
        engine,
        model_path=settings.model_path,
        served_model_name=settings.served_model_name,
        context_length=settings.context_length,
        max_running_requests=settings.max_running_requests,
        weight_version=settings.weight_version,
        max_prompt_chars=settings.max_prompt_chars,
        max_reply_tokens=settings.max_reply_tokens,
    )
    app = web.Application(client_max_size=settings.client_max_size, middlewares=[error_middleware(error_response)])
    app[_MODEL] = model
    SGLangAPI(model).add_routes(app)
    ControlAPI(model).add_routes(app)
    OpenAIAPI(model).add_routes(app)
    app.on_startup.append(_start_warm_up)
    app.on_shutdown.append(_stop_warm_up)
    app.on_cleanup.append(_stop_threads)
    return app


async def _start_warm_up(app: web.Application) -> None:
    """Start the warm-up generation in the background; the server answers /health_generate 503 meanwhile."""
    app[_WARM_UP] = asyncio.create_task(app[_MODEL].warm_up())


async def _stop_warm_up(app: web.Application) -> None:
    """Report not-ready from now on and stop a warm-up still running."""
    app[_MODEL].ready = False
    app[_WARM_UP].cancel()


async def _stop_threads(app: web.Application) -> None:
    """Stop the request threads once the server has closed."""
    app[_MODEL].close()


@contextlib.asynccontextmanager
async def serving(engine: TorchEngine, settings: ModelServerSettings) -> AsyncIterator[str]:
    """Serve `engine` (see create_app) on the settings' host:port (0: a free port) for the duration of the block,
    its connections under `settings.limits` (header and idle timeouts, a connection cap); yields the base URL."""
    app = create_app(engine, settings)
    async with serve_app(app, settings.host, settings.port, limits=settings.limits) as url:
        yield url


def run_server(settings: ModelServerSettings) -> None:
    """Load `settings.model_path` into a TorchEngine and serve it until SIGINT or SIGTERM (blocking); then shut down
    cleanly. Weights holding NaN or infinite values are refused (ValueError) before the server starts."""
    Limits.check(settings.context_length, settings.max_prompt_chars, settings.max_reply_tokens)
    checked(settings)  # before the minutes a model takes to load
    asyncio.run(_serve_until_signal(settings))


async def _serve_until_signal(settings: ModelServerSettings) -> None:
    """The body of run_server: engine, serve until a signal, close."""
    model_dir = settings.model_path
    engine = TorchEngine(model_dir, device=settings.device, seed=settings.random_seed)
    bad = engine.nonfinite_weights()
    if bad:
        await engine.close()
        raise ValueError(f"{model_dir}: the weights hold non-finite values (NaN or Infinity): {bad[:5]}")
    try:
        async with serving(engine, settings) as url:
            logger.info("serving %s at %s", model_dir, url)
            await wait_for_signal()
            logger.info("shutting down")
    finally:
        await engine.close()


def main(argv: list[str] | None = None) -> None:
    """`python -m searchgym.serve.model --model-path DIR --port N`: the flags of `searchgym serve model`."""
    parser = argparse.ArgumentParser(
        prog="python -m searchgym.serve.model",
        description="Serve a Hugging Face causal LM with SGLang's native HTTP API and OpenAI's (CPU or one GPU).",
    )
    add_model_flags(parser, "--model-path", "--model")
    args = parser.parse_args(argv)
    try:
        settings = server_settings(args, ModelServerSettings)
    except ValueError as e:
        parser.error(str(e))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_server(settings)
