"""Imports only go down: a room may import its own modules and the floors below it, never a floor above
or a sibling room on its floor. Function-level (lazy) imports count too: they are upward all the same."""
from __future__ import annotations

import ast
from pathlib import Path

import searchgym

PACKAGE = Path(searchgym.__file__).parent

# room -> floor; rooms on the same floor must not import each other
FLOORS = {
    "envs": 1,
    "world": 2,
    "agents": 3,
    "synthesis": 4, "trainers": 4, "eval": 4,
    "pipeline": 5, "testing": 5, "integrations": 5,  # the quickstart's stages; test and reliability support
    "bench": 6,  # measurements only: runs the pipeline (bench learning) and the drills (bench reliability)
    "quickstart": 7, "demo": 7,
    "cli": 8, "__main__": 8,
    "__init__": 1.5,  # `import searchgym` registers the env ids: it may import envs and nothing else
}


def room_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_rooms(path: Path) -> set[tuple[str, int]]:
    """The searchgym rooms a module imports, with the line of each import."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "searchgym"]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "searchgym" and len(parts) > 1 and parts[1] in FLOORS:
                out.add((parts[1], node.lineno))
    return out


def test_every_room_has_a_floor():
    rooms = {room_of(p) for p in PACKAGE.rglob("*.py")}
    assert rooms <= set(FLOORS), f"rooms without a floor: {rooms - set(FLOORS)}"


def test_imports_only_go_down():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        room = room_of(path)
        for target, line in imported_rooms(path):
            if target == room:
                continue
            if FLOORS[target] >= FLOORS[room]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({room}, floor {FLOORS[room]}) "
                              f"imports {target} (floor {FLOORS[target]})")
    assert not upward, "imports that do not go down:\n" + "\n".join(upward)


def test_only_the_cli_imports_the_bench():
    """`bench/` holds measurements only: the product's pipeline and the test support live in rooms below it."""
    users = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             if room_of(path) not in ("bench", "cli") for target, line in imported_rooms(path) if target == "bench"]
    assert not users, "modules outside the CLI that import bench/:\n" + "\n".join(users)


def test_the_checker_catches_an_upward_import(tmp_path):
    fake = tmp_path / "m.py"
    fake.write_text("def f():\n    from searchgym.trainers.learner import Learner\n")
    assert ("trainers", 2) in imported_rooms(fake)
