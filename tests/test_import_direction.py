"""Imports only go down: a room may import its own modules and the floors below it, never a floor above
or a sibling room on its floor; no two searchgym modules need each other, however indirectly (no circle); and no
module off the ground floor (the floors below envs: settings, core) is imported by more than half of the rooms.

Every rule counts every import statement, module-level and function-level alike: a lazy import only defers
the dependency, it is upward (or circular) all the same. A module's import of its own package is not an
edge (Python imports the package first anyway); `from package import name` is an edge to the submodule
`package.name` when that is a module, else to the package. The floors rule also counts a `"searchgym.room.module:name"`
string (a gym `entry_point=`, gem's or SkyRL's, a `forwards_kwargs_to`, the CLI's table): it is an import
deferred to `gym.make`, so it too must name the module's floor or one below."""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import searchgym

PACKAGE = Path(searchgym.__file__).parent

# room -> floor; rooms on the same floor must not import each other
FLOORS = {
    "settings": 0.5,  # the one settings loader (stdlib and OmegaConf only): every room's configs use it
    "core": 0.75,  # the ground floor of shared I/O (atomic files, JSONL logs, HTTP, extras, LLM-call retries)
    "envs": 1,
    "world": 2,
    "agents": 3,
    "registration": 3.25,  # registers the gym ids: its entry-point strings name world's and agents' factories
    "serve": 3.5,  # every server: the model server, the recording proxy and agent programs played through it,
    # retrieval, the OpenEnv and MCP env hosts, and their limits (needs agents' engines and envs)
    "synthesis": 4,
    "trainers": 4,
    "eval": 4,
    "integrations": 4,
    "pipeline": 5,
    "testing": 5,  # the quickstart's stages; test and reliability support
    "view": 5,  # `searchgym view`: pages over the runs the rooms below write
    "bench": 6,  # measurements only: runs the pipeline (bench learning) and the drills (bench reliability)
    "quickstart": 7,
    "demo": 7,
    "cli": 8,
    "__main__": 9,  # `python -m searchgym`: runs the command
    "__init__": 3.3,  # `import searchgym` calls registration; both import only envs (test_import_searchgym_is_light)
}
# "searchgym.room.module:name": a module named by string, imported when gym.make (or the CLI) loads it
ENTRY_POINT = re.compile(r"searchgym(\.\w+)+:[\w.]+")


def room_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_rooms(path: Path, strings: bool = True) -> set[tuple[str, int]]:
    """The searchgym rooms a module imports, with the line of each import (and, with `strings`, of each
    `"searchgym.room.module:name"` string)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "searchgym"]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            if not ENTRY_POINT.fullmatch(node.value):
                continue
            names = [node.value.partition(":")[0]]
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
                upward.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line} ({room}, floor {FLOORS[room]}) "
                    f"imports {target} (floor {FLOORS[target]})"
                )
    assert not upward, "imports that do not go down:\n" + "\n".join(upward)


def test_only_the_cli_imports_the_bench():
    """`bench/` holds measurements only: the product's pipeline and the test support live in rooms below it."""
    users = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if room_of(path) not in ("bench", "cli")
        for target, line in imported_rooms(path)
        if target == "bench"
    ]
    assert not users, "modules outside the CLI that import bench/:\n" + "\n".join(users)


def test_the_checker_catches_an_upward_import(tmp_path):
    fake = tmp_path / "m.py"
    fake.write_text("def f():\n    from searchgym.trainers.algorithm.learner import Learner\n")
    assert ("trainers", 2) in imported_rooms(fake)


def test_the_checker_counts_entry_point_strings(tmp_path):
    fake = tmp_path / "m.py"
    fake.write_text(
        'import gym\nSPECS = {"a": "searchgym.world.synthetic_env:make_synthetic_qa"}\n'
        'gym.register(id="b", entry_point="searchgym.agents.simulated_env:make_simulated_qa")\n'
        '"""Docs naming searchgym.serve.model:main in a sentence are no import."""\n'
    )
    assert imported_rooms(fake) == {("world", 2), ("agents", 3)}


# what `import searchgym` loads: the package and the registration it runs, each importing at most these rooms
LIGHT = {"__init__": {"registration"}, "registration": {"envs"}}


def test_import_searchgym_is_light():
    """`__init__` and `registration` sit above agents only because registration's entry-point strings name agents'
    and world's factories; by import statement they reach envs and no further, so `import searchgym` stays light
    (tests/test_light_core.py runs it with every extra unimportable)."""
    ground = {room for room, floor in FLOORS.items() if floor < 1}
    for room, allowed in LIGHT.items():
        imports = {target for target, _ in imported_rooms(PACKAGE / f"{room}.py", strings=False)}
        assert imports <= allowed | ground, f"{room}.py imports {sorted(imports - allowed - ground)}"


def module_name(path: Path) -> str:
    """Dotted name of a searchgym source file (`searchgym.envs` for envs/__init__.py)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str], me: str = "") -> set[str]:
    """The searchgym modules a file imports (any statement, lazy ones included), each named by its module."""

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            ]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out |= {m for m in map(owner, names) if m is not None}
    return {m for m in out if m != me and not me.startswith(m + ".")}


def import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports in `graph` (module -> modules it imports), or None when there is none."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def module_graph() -> dict[str, set[str]]:
    """Every searchgym module -> the searchgym modules it imports."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, modules, module_name(p)) for p in paths}


def test_no_circle_of_imports():
    circle = import_circle(module_graph())
    assert circle is None, "modules that import each other: " + " -> ".join(circle or [])


def test_the_checker_catches_a_circle(tmp_path):
    fake = tmp_path / "m.py"
    fake.write_text("import searchgym.envs.judges\ndef f():\n    from searchgym.envs import llm_judge\n")
    modules = {"searchgym.envs", "searchgym.envs.judges", "searchgym.envs.llm_judge"}
    assert imported_modules(fake, modules) == {"searchgym.envs.judges", "searchgym.envs.llm_judge"}
    assert imported_modules(fake, modules, "searchgym.envs.judges.x") == {"searchgym.envs.llm_judge"}
    circle = import_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert circle is not None and set(circle) == {"a", "b", "c"}
    assert import_circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


# the ground floor(s): shared by every room on purpose (settings, core); any other module most rooms need belongs there
GROUND = {room for room, floor in FLOORS.items() if floor < 1}


def module_room(module: str) -> str:
    """The room of a dotted searchgym module (`searchgym.envs.tasks` -> envs; `searchgym` -> __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def importing_rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module -> the rooms, other than its own, with a module that imports it (any statement, lazy ones included)."""
    out: dict[str, set[str]] = {}
    for importer, targets in graph.items():
        for target in targets:
            if module_room(importer) != module_room(target):
                out.setdefault(target, set()).add(module_room(importer))
    return out


def overshared(graph: dict[str, set[str]], rooms: int) -> list[tuple[int, str, list[str]]]:
    """(room count, module, rooms) of each module off the ground floor that more than half of `rooms` import, most
    shared first."""
    shared = [(len(users), module, sorted(users)) for module, users in importing_rooms(graph).items()]
    return sorted(
        (row for row in shared if module_room(row[1]) not in GROUND and row[0] > rooms / 2),
        key=lambda row: (-row[0], row[1]),
    )


def test_only_the_ground_floor_is_shared_by_most_rooms():
    """A module that more than half of the package's rooms import is shared plumbing: it belongs on the ground
    floor (core/, settings), not in a room that holds one kind of thing (as envs/ held atomic files and HTTP)."""
    graph = module_graph()
    offenders = overshared(graph, len(FLOORS))
    worst = overshared(graph, 0)[:5]  # the most shared modules off the ground floor, to say how close the rest are
    assert not offenders, (
        f"modules off the ground floor imported by more than half of the {len(FLOORS)} rooms "
        "(shared plumbing belongs in core/):\n"
        + "\n".join(f"  {module}: {n} rooms ({', '.join(users)})" for n, module, users in offenders)
        + "\nmost shared off the ground floor: "
        + "; ".join(f"{module} ({n})" for n, module, _ in worst)
    )


def test_the_checker_catches_a_module_most_rooms_share():
    graph = {
        "searchgym.envs.tasks": {"searchgym.envs.tools.base"},
        "searchgym.world.world": {"searchgym.envs.tasks", "searchgym.core.atomic_file"},
        "searchgym.agents.workflow": {"searchgym.envs.tasks", "searchgym.core.atomic_file"},
        "searchgym.eval.harness": {"searchgym.envs.tasks", "searchgym.core.atomic_file", "searchgym.settings"},
        "searchgym.cli": {"searchgym.settings"},
    }
    assert importing_rooms(graph)["searchgym.envs.tasks"] == {"world", "agents", "eval"}  # envs' own use not counted
    assert "searchgym.envs.tools.base" not in importing_rooms(graph)
    # 3 of 5 rooms import envs.tasks: over half; core and settings may be shared by any number
    assert overshared(graph, 5) == [(3, "searchgym.envs.tasks", ["agents", "eval", "world"])]
    assert overshared(graph, 6) == []
