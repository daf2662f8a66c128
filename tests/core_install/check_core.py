"""What the base install (`pip install searchgym`, no extras) gives, checked in the Python that runs this script.

`gym.make` of SyntheticQA and of LocalQA over the world's index and over `searchgym serve search` (the retrieval
client), each passing Gymnasium's `check_env` and won by the oracle with reward 1; the judges; `searchgym --help`;
and a command that needs an extra failing with the extra's name. Torch, Ray and Transformers are never imported.
`--core-only` also asserts that no extra's packages are installed at all and that `searchgym quickstart` names
its extra: CI runs it in a fresh core-only venv (.ci/run), the main suite with the extras made unimportable
(tests/test_light_core.py). Without it the extras may be installed, and must still not be imported.
Run: python tests/core_install/check_core.py [--core-only] [--cache DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HEAVY = ("torch", "ray", "transformers", "tokenizers", "tensorboard", "matplotlib", "trafilatura", "datasets")
SMALL = {"size": 1000, "seed": 0, "n_tasks": 200}  # tests/conftest.py's small world: the suite's cache has it


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # tests/test_light_core.py's stand-in for an absent package raises here
        return False


def searchgym_command() -> list[str]:
    """The `searchgym` console script of this Python's install (or the module, when run from a source tree)."""
    script = Path(sys.executable).with_name("searchgym")
    return (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "import sys; from searchgym.cli import main; sys.exit(main())"]
    )


def play_oracle(env) -> float:
    """Play the validation oracle on the env's first task through gym.make's API; the episode's final reward."""
    from searchgym.world.oracle import OracleAgent

    inner = env.unwrapped
    task = inner.tasks[0]
    obs, info = env.reset(seed=0, options={"task_id": task.id})
    script = OracleAgent().script(task, inner.max_page_chunks)
    action = next(script)
    while True:
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return float(reward)
        action = script.send((obs, info))


def check_env_and_oracle(env, name: str) -> None:
    from gymnasium.utils.env_checker import check_env

    check_env(env.unwrapped)
    reward = play_oracle(env)
    assert reward == 1.0, f"{name}: the oracle's episode ended with reward {reward}, not 1"
    print(f"ok: {name}: check_env passes, the oracle wins with reward 1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_retrieval_client(bundle: Path, tasks: Path) -> None:
    """`searchgym serve search` in a child process, LocalQA over it through the retrieval client (RemoteSearch)."""
    import gymnasium as gym

    port = free_port()
    server = subprocess.Popen(
        [*searchgym_command(), "serve", "search", "--index", str(bundle / "index"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"`searchgym serve search` did not start: {server.stderr.read().decode()}"
                    ) from None
                time.sleep(0.2)
        env = gym.make("searchgym/LocalQA-v0", tasks=tasks, servers=f"http://127.0.0.1:{port}")
        check_env_and_oracle(env, "LocalQA over `serve search`")
        env.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def check_judges() -> None:
    from searchgym.envs.judges import make_judge
    from searchgym.envs.llm_judge import LLMJudge  # noqa: F401  (its HTTP side is aiohttp: core)

    for name in ("f1", "em", "cover_em", "asearcher_f1", "searchr1_em"):
        judge = make_judge(name)
        assert judge.judge("Paris", ["paris"]).score == 1.0, name
        assert judge.judge("Rome", ["paris"]).score == 0.0, name
    print("ok: the judges score")


def check_missing_extra(tasks: Path) -> None:
    """A command or an env that needs an extra fails naming it (run only where the extras are absent)."""
    import gymnasium as gym

    from searchgym.core.extras import MissingExtra
    from searchgym.envs.tasks import TaskPool

    done = subprocess.run([*searchgym_command(), "quickstart"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "pip install 'searchgym[train]'" in done.stderr, (done.returncode, done.stderr)
    print(f"ok: {done.stderr.strip()}")
    done = subprocess.run(
        [*searchgym_command(), "serve", "mcp", "searchgym/SyntheticQA-v0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "pip install 'searchgym[mcp]'" in done.stderr, (done.returncode, done.stderr)
    print(f"ok: {done.stderr.strip()}")
    for make, extra in (
        (lambda: gym.make("searchgym/WebQA-v0", tasks=tasks, search_api_key="k"), "web"),
        (lambda: TaskPool.load(tasks.parent), "datasets"),
    ):  # a folder is read as a `datasets` one
        try:
            make()
        except MissingExtra as e:
            assert f"pip install 'searchgym[{extra}]'" in str(e), e
            print(f"ok: {e}")
        else:
            raise AssertionError(f"no MissingExtra naming searchgym[{extra}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--core-only", action="store_true", help="also assert that no extra is installed")
    parser.add_argument(
        "--cache", type=Path, default=None, help="bundle cache (default: $SEARCHGYM_CACHE or a temp dir)"
    )
    args = parser.parse_args()
    if args.cache or not os.environ.get("SEARCHGYM_CACHE"):
        os.environ["SEARCHGYM_CACHE"] = str(args.cache or tempfile.mkdtemp(prefix="searchgym-core-"))
    if args.core_only:
        installed_extras = [m for m in HEAVY if installed(m)]
        assert not installed_extras, f"the core install brought extras' packages: {installed_extras}"

    import gymnasium as gym

    import searchgym
    from searchgym.world.bundle import ensure_bundle

    print(f"searchgym from {Path(searchgym.__file__).parent}")
    env = gym.make("searchgym/SyntheticQA-v0", **SMALL)
    check_env_and_oracle(env, "SyntheticQA")
    env.close()
    bundle = ensure_bundle(**SMALL)
    tasks = bundle / "tasks.jsonl"
    env = gym.make("searchgym/LocalQA-v0", tasks=tasks, index=bundle)
    check_env_and_oracle(env, "LocalQA over a local index")
    env.close()
    check_retrieval_client(bundle, tasks)
    check_judges()
    subprocess.run([*searchgym_command(), "--help"], check=True, capture_output=True, timeout=120)
    print("ok: searchgym --help")
    if args.core_only:
        check_missing_extra(tasks)
    imported = [m for m in HEAVY if m in sys.modules]
    assert not imported, f"the core imported {imported}"
    print(f"ok: none of {', '.join(HEAVY)} imported")


if __name__ == "__main__":
    main()
