"""SGLang 0.5.23's own JSON contract, loaded from the installed `sglang` wheel, to judge our server by.

The generated module `sglang/api/v1/api_types.py` needs only `msgspec`; importing the `sglang` package
itself would pull in torch kernels and much more, so the module is loaded from its file. Install it
with `pip install --no-deps sglang==0.5.23` (README's test command and `.ci/run` do).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import sys
from types import ModuleType
from typing import Any

import pytest
from aiohttp import web

from tests.agents.sglang_source import SGLANG_VERSION, sglang_root

INSTALL = f"pip install --no-deps sglang=={SGLANG_VERSION} msgspec"


def _load() -> ModuleType | None:
    """sglang.api.v1.api_types, or None when the wheel is not installed."""
    root = sglang_root()
    if root is None:
        return None
    path = root / "api" / "v1" / "api_types.py"
    module_spec = importlib.util.spec_from_file_location("sglang_api_types", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


api_types = _load()


def require_contract() -> ModuleType:
    """The contract module, or skip the test saying how to install it."""
    if api_types is None:
        pytest.skip(f"SGLang's contract is not installed: {INSTALL}")
    return api_types


def check_response(path: str, status: int, body: Any) -> None:
    """Decode one response body of a native route with SGLang's contract; raises JsonContractError if it breaks it."""
    if api_types is None or path.startswith("/v1/") or not isinstance(body, (dict, list)):
        return
    if status != 200:
        if isinstance(body, dict) and "error" in body:  # errors: {"error": {"message", "code"}}
            api_types.decode_GenerateStreamError(body)
            api_types.decode_ErrorBody(body["error"])
        return  # a failed weight update answers {"success": false, "message", ...}, which has no contract type
    decoder = {
        "/generate": api_types.decode_GenerateResponse,
        "/model_info": api_types.decode_GetModelInfoResponse,
        "/get_model_info": api_types.decode_GetModelInfoResponse,
        "/server_info": api_types.decode_GetServerInfoResponse,
        "/get_server_info": api_types.decode_GetServerInfoResponse,
    }.get(path)
    if decoder is not None:
        for item in body if isinstance(body, list) else [body]:
            decoder(item)


def check_generate_request(body: Any) -> None:
    """Decode a /generate request body with SGLang's contract (what a real server admits)."""
    require_contract().decode_GenerateRequest(body)


@web.middleware
async def contract_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Test middleware: every JSON answer of a native route must decode with SGLang's contract (else a 500)."""
    response = await handler(request)
    if isinstance(response, web.Response) and response.content_type == "application/json" and response.body:
        check_response(request.path, response.status, json.loads(response.body))
    return response


def with_contract_check(app: web.Application) -> web.Application:
    """The app with `contract_middleware` outermost (once)."""
    if contract_middleware not in app.middlewares:
        app.middlewares.insert(0, contract_middleware)
    return app


_SERVER_APP = "searchgym.serve.model.app"


def check_every_model_server() -> None:
    """From now on, every app `searchgym.serve.model.app.create_app` makes checks its answers against the contract.

    Tests anywhere in the suite that start `serve model` (through `serving`, `create_app` or a subprocess-free
    helper) are then judged by SGLang's contract too. The server module is patched when it is first imported
    (or at once, if it already is), so calling this costs no import of torch.
    """

    def patch(module):
        if getattr(module.create_app, "contract_checked", False):
            return
        original = module.create_app

        @functools.wraps(original)
        def create_app(*args, **kwargs):
            return with_contract_check(original(*args, **kwargs))

        create_app.contract_checked = True
        module.create_app = create_app

    if _SERVER_APP in sys.modules:
        patch(sys.modules[_SERVER_APP])
        return

    class PatchOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != _SERVER_APP:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                patch(module)

            spec.loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, PatchOnImport())
