"""Agent fixtures: one tiny Qwen2 model (tokenizer and random weights) built once per test session."""
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A default `build_tiny_model` directory, loadable with the Auto classes."""
    from searchgym.agents.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
