"""The light core: the base install's dependencies are the core's, each extra names what it adds, and the core runs
with every extra's packages unimportable (CI also runs tests/core_install/check_core.py in a fresh core-only venv)."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

from searchgym.core.extras import EXTRA_OF, MissingExtra, needs, require

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tests" / "core_install" / "check_core.py"
# a stand-in for a core-only install: the extras' top-level packages raise ModuleNotFoundError on import, in this
# Python and in every child it starts (sitecustomize runs at start-up)
ABSENT = """import sys


class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {modules!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (a core-only install)", name=name)
        return None


sys.meta_path.insert(0, _Absent())
"""


def extras() -> dict[str, set[str]]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return {
        name: {line.strip() for line in value.splitlines() if line.strip()}
        for name, value in config["options.extras_require"].items()
    } | {"core": {line.strip() for line in config["options"]["install_requires"].splitlines() if line.strip()}}


def project(requirement: str) -> str:
    """The distribution a requirement names, normalised (`bm25s[core]>=0.2` -> bm25s, `faiss-cpu` -> faiss_cpu)."""
    for mark in "[<>=!~ ":
        requirement = requirement.split(mark)[0]
    return requirement.lower().replace("-", "_")


def test_the_core_plays_with_every_extra_unimportable(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(ABSENT.format(modules=sorted(EXTRA_OF)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, str(CHECK), "--core-only"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the oracle wins with reward 1" in done.stdout
    assert "searchgym quickstart: " in done.stdout and "needs searchgym[train]" in done.stdout  # named its extra


def test_the_core_imports_no_extra_even_where_they_are_installed():
    done = subprocess.run(
        [sys.executable, str(CHECK)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: none of torch, ray, transformers" in done.stdout


def test_the_base_install_is_the_core():
    deps = extras()
    core = {project(r) for r in deps["core"]}
    assert core == {"gymnasium", "numpy", "tantivy", "tqdm", "aiohttp", "omegaconf"}
    heavy = {project(r) for name, reqs in deps.items() if name != "core" for r in reqs} - core
    assert {"torch", "ray", "transformers", "trafilatura", "tensorboard", "matplotlib", "datasets"} <= heavy


# extras that cannot be installed with the others: verifiers 0.4 needs mcp 2, openenv mcp<2 (its own venv in .ci/run)
OWN_VENV = ("verifiers",)


def test_all_holds_every_extra_and_test_holds_all():
    deps = {name: {project(r) for r in reqs} for name, reqs in extras().items()}
    for name, reqs in deps.items():
        if name not in ("core", "all", "test", *OWN_VENV):
            assert reqs <= deps["all"], f"all lacks {name}'s {reqs - deps['all']}"
    for name in OWN_VENV:  # installed apart, or `all` would not resolve
        assert deps[name] and not deps[name] & deps["all"], f"{name} must stay out of all"
    assert deps["all"] <= deps["test"], f"test lacks {deps['all'] - deps['test']}"  # README's test command
    assert set(EXTRA_OF.values()) <= set(deps), "an extra named in an error message must exist in setup.cfg"


def test_a_missing_extra_is_named_with_its_install_command():
    with pytest.raises(
        MissingExtra,
        match=r"training needs searchgym\[train\] \(torch is not installed\): "
        r"pip install 'searchgym\[train\]'",
    ):
        with needs("training"):
            raise ModuleNotFoundError("No module named 'torch.nn'", name="torch.nn")
    with pytest.raises(ModuleNotFoundError) as raised:  # not an extra's module: a real bug, left as it is
        with needs("training"):
            raise ModuleNotFoundError("No module named 'nonesuch'", name="nonesuch")
    assert not isinstance(raised.value, MissingExtra)
    require("reading web pages", "trafilatura")  # installed here: no error
