"""SGLang 0.5.23's own functions, taken from the installed wheel's source files at test time.

`pip install --no-deps sglang==0.5.23` leaves out most of SGLang's dependencies (zmq, pybase64, ...), so
importing the modules that hold its weight-update code fails. Tests that judge our code against SGLang's
therefore read the definitions they need out of the wheel's files with `ast` and run them in a namespace
holding only what those definitions use: SGLang's code, not a copy of it in this repository.
"""

from __future__ import annotations
import __future__

import ast
import importlib.util
from pathlib import Path
from typing import Any

import pytest

SGLANG_VERSION = "0.5.23"
INSTALL = f"pip install --no-deps sglang=={SGLANG_VERSION}"


def sglang_root() -> Path | None:
    """The installed `sglang` package folder, or None (found without importing the package)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def require_sglang() -> Path:
    """The package folder, or skip the test saying how to install it."""
    root = sglang_root()
    if root is None:
        pytest.skip(f"SGLang is not installed: {INSTALL}")
    return root


def _find(tree: ast.Module, name: str) -> ast.stmt:
    """The top-level def, class or assignment `name`, or the method `Class.method`."""
    owner, _, member = name.rpartition(".")
    body = tree.body
    if owner:
        body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == owner).body
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == member:
            return node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == member for t in node.targets):
            return node
    raise LookupError(f"{name} not found")


def load(relative: str, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Run the definitions `names` of the wheel's file `relative` (e.g. "srt/utils/common.py") in `namespace`.

    Definitions run in the order given, with postponed annotations (as the wheel's files declare), so the
    namespace needs only what their bodies and decorators use. Returns the namespace.
    """
    path = require_sglang() / relative
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = [_find(tree, name) for name in names]
    code = compile(
        ast.Module(body=nodes, type_ignores=[]),
        str(path),
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    exec(code, namespace)
    return namespace
