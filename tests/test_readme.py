"""README's Python example runs as written and prints what its comments say."""
import contextlib
import io
import re
from pathlib import Path


def test_readme_example_runs():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.DOTALL).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    printed = out.getvalue()
    assert "Question: Who wrote the book The Sadesh Whispers?" in printed
    assert "[Doc 1](https://world.searchgym.test/wiki/The_Sadesh_Whispers)" in printed
    assert printed.rstrip().endswith("1.0 True True")
