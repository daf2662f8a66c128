"""trainers/ keeps its rooms: launchers do not import each other, learner kinds differ by method (no
isinstance on them), and nothing reaches into a workflow for its engine (the caller owns it)."""

from __future__ import annotations

import ast
from pathlib import Path

import searchgym

PACKAGE = Path(searchgym.__file__).parent
LAUNCHERS = PACKAGE / "trainers" / "launchers"
LEARNER_KINDS = {"Learner", "ShardedLearner"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def _launcher(module: str) -> str | None:
    """'local' or 'ray' for a module of one launcher (local.py, local_ranks.py / ray_*.py), else None."""
    name = module.rsplit(".", 1)[-1]
    return "local" if name.startswith("local") else "ray" if name.startswith("ray") else None


def test_launchers_do_not_import_each_other():
    crossings = []
    for path in sorted(LAUNCHERS.glob("*.py")):
        own = _launcher(path.stem)
        for module in _imports(path):
            if module.startswith("searchgym.trainers.launchers.") and _launcher(module) not in (own, None):
                crossings.append(f"{path.name} imports {module}")
    assert not crossings, crossings
    assert {_launcher(p.stem) for p in LAUNCHERS.glob("*.py")} == {"local", "ray", None}


def test_no_isinstance_on_learner_kinds_and_no_engine_reach_in():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
                continue
            target = node.args[1]
            kinds = target.elts if isinstance(target, ast.Tuple) else [target]
            if node.func.id == "isinstance" and any(isinstance(k, ast.Name) and k.id in LEARNER_KINDS for k in kinds):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} isinstance on a learner kind")
            if (
                node.func.id in ("getattr", "hasattr")
                and isinstance(target, ast.Constant)
                and target.value in ("engine", "handle")
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} reaches for .{target.value}")
    assert not found, found


def test_every_trainers_room_says_what_it_holds():
    for room in ("algorithm", "rollout", "launchers", "run", "warm_start"):
        init = PACKAGE / "trainers" / room / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"trainers/{room}/__init__.py has no docstring"
