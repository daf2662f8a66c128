"""README's Python examples run as written and print what their comments say."""
import contextlib
import io
import os
import re
from pathlib import Path


def run_readme_examples(tmp_path):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    outputs = []
    cwd = os.getcwd()
    os.chdir(tmp_path)  # examples may write files (runs/...)
    try:
        for block in blocks:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
            outputs.append(out.getvalue())
    finally:
        os.chdir(cwd)
    return outputs


def test_readme_examples_run(tmp_path):
    env_example, agent_example = run_readme_examples(tmp_path)
    assert "Question: Who wrote the book The Sadesh Whispers?" in env_example
    assert "[Doc 1](https://world.searchgym.test/wiki/The_Sadesh_Whispers)" in env_example
    assert env_example.rstrip().endswith("1.0 True True")
    assert agent_example.startswith("True ")
