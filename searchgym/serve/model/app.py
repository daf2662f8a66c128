"""The model server's application and lifecycle: routes of both APIs, errors in each one's dialect, warm-up,
serving on a port, and the command line (flags named like `sglang.launch_server`'s).

Every client path written for SGLang (SGLangEngine, AReaL, slime, verl, curl scripts) or for OpenAI (the
`openai` client) runs for real against it on a CPU machine and in CI. Bad input is always a 400 with a
message, never a 500; unknown routes and wrong methods get a JSON body in the caller's dialect too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.serve.http import error_middleware, serve_app, wait_for_signal
from searchgym.serve.limits import ServerLimits, add_limit_flags, add_request_limit_flags, limits_from_args
from searchgym.serve.model.core import Limits, ServedModel
from searchgym.serve.model.openai_api import OpenAIAPI, error_body
from searchgym.serve.model.sglang_api import SGLangAPI
from searchgym.serve.model.sglang_control import ControlAPI
from searchgym.serve.model.wire import json_response

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 2**20
DEFAULT_MAX_RUNNING_REQUESTS = 256
_MODEL = web.AppKey("model", ServedModel)
_WARM_UP = web.AppKey("warm_up", asyncio.Task)


def error_response(request: web.Request, status: int, message: str) -> web.Response:
    """An error body in the caller's dialect: OpenAI's envelope under /v1, SGLang's {"error": {message, code}} else."""
    if request.path.startswith("/v1/"):
        return json_response(error_body(status, message), status=status)
    return json_response({"error": {"message": message, "code": status}}, status=status)


def create_app(
    engine: TorchEngine,
    *,
    model_path: str,
    served_model_name: str | None = None,
    context_length: int | None = None,
    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS,
    weight_version: str | None = None,
    client_max_size: int = MAX_REQUEST_BYTES,
    max_prompt_chars: int | None = None,
    max_reply_tokens: int | None = None,
) -> web.Application:
    """The aiohttp app serving `engine` (a TorchEngine) with SGLang's and OpenAI's routes; warms up on startup.

    Per-request limits (core.Limits; None: the defaults) are checked here, a bad one a ValueError naming it.
    """
    model = ServedModel(
        engine,
        model_path=model_path,
        served_model_name=served_model_name,
        context_length=context_length,
        max_running_requests=max_running_requests,
        weight_version=weight_version,
        max_prompt_chars=max_prompt_chars,
        max_reply_tokens=max_reply_tokens,
    )
    app = web.Application(client_max_size=client_max_size, middlewares=[error_middleware(error_response)])
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
async def serving(
    engine: TorchEngine,
    *,
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 0,
    limits: ServerLimits | None = None,
    **app_kwargs: Any,
) -> AsyncIterator[str]:
    """Serve `engine` (see create_app) on host:port for the duration of the block, its connections under `limits`
    (header and idle timeouts, a connection cap); yields the base URL."""
    async with serve_app(create_app(engine, model_path=model_path, **app_kwargs), host, port, limits=limits) as url:
        yield url


def run_server(
    model_dir: str | os.PathLike,
    host: str = "127.0.0.1",
    port: int = 30000,
    *,
    served_model_name: str | None = None,
    context_length: int | None = None,
    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS,
    weight_version: str | None = None,
    max_prompt_chars: int | None = None,
    max_reply_tokens: int | None = None,
    limits: ServerLimits | None = None,
    **engine_kwargs: Any,
) -> None:
    """Load `model_dir` into a TorchEngine and serve it until SIGINT or SIGTERM (blocking); then shut down cleanly.

    Weights holding NaN or infinite values are refused (ValueError) before the server starts.
    """
    Limits.check(context_length, max_prompt_chars, max_reply_tokens)  # before the minutes a model takes to load
    app_kwargs = {
        "served_model_name": served_model_name,
        "context_length": context_length,
        "max_running_requests": max_running_requests,
        "weight_version": weight_version,
        "max_prompt_chars": max_prompt_chars,
        "max_reply_tokens": max_reply_tokens,
        "limits": limits,
    }
    asyncio.run(_serve_until_signal(model_dir, host, port, engine_kwargs, app_kwargs))


async def _serve_until_signal(
    model_dir: str | os.PathLike, host: str, port: int, engine_kwargs: dict, app_kwargs: dict
) -> None:
    """The body of run_server: engine, serve until a signal, close."""
    engine = TorchEngine(model_dir, **engine_kwargs)
    bad = engine.nonfinite_weights()
    if bad:
        await engine.close()
        raise ValueError(f"{model_dir}: the weights hold non-finite values (NaN or Infinity): {bad[:5]}")
    try:
        async with serving(engine, model_path=str(model_dir), host=host, port=port, **app_kwargs) as url:
            logger.info("serving %s at %s", model_dir, url)
            await wait_for_signal()
            logger.info("shutting down")
    finally:
        await engine.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags, named like sglang.launch_server's where they mean the same."""
    parser = argparse.ArgumentParser(
        prog="python -m searchgym.serve.model",
        description="Serve a Hugging Face causal LM with SGLang's native HTTP API and OpenAI's (CPU or one GPU).",
    )
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--context-length", type=int, default=None)
    add_request_limit_flags(parser)
    parser.add_argument("--max-running-requests", type=int, default=DEFAULT_MAX_RUNNING_REQUESTS)
    parser.add_argument("--weight-version", default=None, help="the initial weight_version label (default: 0)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-seed", type=int, default=0)
    add_limit_flags(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """`python -m searchgym.serve.model --model-path DIR --port N`."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_server(
        args.model_path,
        args.host,
        args.port,
        served_model_name=args.served_model_name,
        context_length=args.context_length,
        max_running_requests=args.max_running_requests,
        weight_version=args.weight_version,
        max_prompt_chars=args.max_prompt_chars,
        max_reply_tokens=args.max_reply_tokens,
        device=args.device,
        seed=args.random_seed,
        limits=limits_from_args(args),
    )
