"""README and docs/ say what is true: the Python examples run and print what their comments say, the test command
is the one CI runs, every command and flag exists, every link resolves, and every linked figure is in its file."""

import argparse
import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest

from searchgym.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
STOP_REASONS = {"answer", "turn budget", "observation-token budget", "context budget"}
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")  # not the 25 of BM25


def run_readme_examples(tmp_path):
    """Run README's ```python blocks in order, each in its own namespace; (printed output, namespace) per block."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    results = []
    cwd = os.getcwd()
    os.chdir(tmp_path)  # examples may write files (runs/...)
    try:
        for block in blocks:
            out, namespace = io.StringIO(), {"__name__": "readme"}
            with contextlib.redirect_stdout(out):
                exec(compile(block, "README.md", "exec"), namespace)
            results.append((out.getvalue(), namespace))
    finally:
        os.chdir(cwd)
    return results


def test_readme_examples_run(tmp_path):
    (env_example, _), (agent_example, agent_ns) = run_readme_examples(tmp_path)
    assert "Question: Who wrote the book The Sadesh Whispers?" in env_example
    assert "[Doc 1](https://world.searchgym.test/wiki/The_Sadesh_Whispers)" in env_example
    assert env_example.rstrip().endswith("1.0 True True")

    last = agent_example.strip().splitlines()[-1]
    assert len(agent_ns["trajectories"]) == 32
    aligned, stop_reason = last.split(" ", 1)  # the first trajectory's token arrays aligned, and why it stopped
    assert aligned == "True" and stop_reason in STOP_REASONS
    # what the prose claims of every trajectory: a loss mask on exactly the generated tokens, their logprobs and
    # weight versions, and at most max_turns=4 turns
    for traj in agent_ns["trajectories"]:
        generated = [i for i, m in enumerate(traj.loss_mask) if m]
        assert len(generated) == sum(turn.generated_tokens for turn in traj.turns) > 0
        assert all(traj.versions[i] == 0 and traj.logprobs[i] <= 0 for i in generated)
        assert all(v == -1 for v, m in zip(traj.versions, traj.loss_mask, strict=True) if not m)
        assert 1 <= len(traj.turns) <= 4 and traj.stop_reason in STOP_REASONS


def test_readme_is_a_short_user_guide():
    text = README.read_text()
    assert len(text) <= 12_000, f"README.md is {len(text)} characters; measurements and detail belong in docs/"
    assert "## Contents" in text


def code_block_after(text: str, marker: str) -> list[str]:
    """The command lines of the first ```bash block after `marker`."""
    rest = text[text.index(marker) :]
    block = re.search(r"```bash\n(.*?)```", rest, re.DOTALL).group(1)
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_readme_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    start = next(i for i, line in enumerate(ci) if line.startswith("# README's test command"))
    ci_commands = [line.strip() for line in ci[start + 1 :] if line.strip() and not line.lstrip().startswith("#")]
    assert code_block_after(README.read_text(), "Run the tests") == ci_commands


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check_command(command: str) -> None:
    """Assert that `searchgym ...` (README notation: [optional], {a,b}, placeholders) names a real command and flags."""
    tokens = command.replace("[", " ").replace("]", " ").split()[1:]
    parser, path = build_parser(), ["searchgym"]
    for token in tokens:
        if token.startswith("-"):
            flag = token.split("=", 1)[0]
            assert flag in parser._option_string_actions, f"{' '.join(path)}: no flag {flag} (in {command!r})"
            continue
        choices = subcommands(parser)
        if token.startswith("{") and token.endswith("}"):
            missing = set(token[1:-1].split(",")) - set(choices)
            assert not missing, f"{' '.join(path)}: no subcommands {sorted(missing)} (in {command!r})"
            return
        if choices:
            assert token in choices, f"{' '.join(path)}: no subcommand {token!r} (in {command!r})"
            parser = choices[token]
            path.append(token)
    assert not subcommands(parser), f"{command!r} stops before naming a subcommand of {' '.join(path)}"


def commands_in(text: str) -> list[str]:
    """Every `searchgym ...` command: inline code spans and lines of ```bash blocks (continuations joined)."""
    found = re.findall(r"`(searchgym [^`]+)`", text)
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                part = part.split("#", 1)[0].strip()
                if part.startswith("searchgym "):
                    found.append(part)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_and_flag_exists(page):
    commands = commands_in(page.read_text())
    for command in commands:
        check_command(command)
    if page == README:
        assert len(commands) >= 15


def test_command_check_catches_a_wrong_flag_or_command():
    check_command("searchgym eval --env ID --engine SPEC --k 4 [--workflow F:C]")
    check_command("searchgym bench {env,engine,search,trainer}")
    for wrong in ("searchgym eval --episodes 4", "searchgym serve", "searchgym bench {env,gpu}", "searchgym evaluate"):
        with pytest.raises(AssertionError):
            check_command(wrong)


def prose(page: Path) -> str:
    """The page without code blocks and inline code (which hold link-like text such as `[Doc k](url):`)."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL))


def github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {github_anchor(h.replace("`", "")) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page):
    text = prose(page)
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    for target in [t for _, t in LINK.findall(text)] + images:
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        assert path.exists(), f"{page.name}: link to {target} - no such file"
        if anchor:
            assert anchor in anchors(path), f"{page.name}: link to {target} - no such heading in {path.name}"


def numbers_in(data) -> list[float]:
    """Every number a JSON document holds: values, numeric keys, and numbers inside strings (commands)."""
    out: list[float] = []
    if isinstance(data, bool):
        return out
    if isinstance(data, (int, float)):
        return [float(data), abs(float(data))]  # a page may show the sign outside the link: -[0.012](file)
    if isinstance(data, str):
        return [float(n.replace(",", "")) for n in NUMBER.findall(data)]
    if isinstance(data, dict):
        for key, value in data.items():
            out += numbers_in(str(key)) + numbers_in(value)
    if isinstance(data, list):
        for value in data:
            out += numbers_in(value)
    return out


def shown_number_in(text: str, file: Path) -> None:
    """Assert the number a link shows is held by the file it links to, to the precision shown."""
    shown = NUMBER.search(text).group().replace(",", "")
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    value, tolerance = float(shown), 0.5 * 10**-decimals + 1e-9
    held = numbers_in(json.loads(file.read_text()))
    assert any(abs(v - value) <= tolerance for v in held), f"{text!r} is not in {file.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_linked_figures_are_in_the_files_they_link(page):
    for text, target in LINK.findall(prose(page)):
        if target.endswith(".json") and NUMBER.match(text):
            shown_number_in(text, (page.parent / target).resolve())


def test_every_number_of_the_results_table_links_to_its_file():
    text = README.read_text()
    section = text[text.index("## Results") :]
    section = section[: section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")]
    assert len(rows) >= 6
    for row in rows:
        bare = LINK.sub(lambda m: "" if m.group(2).startswith("results/") else m.group(1), row)
        bare = re.sub(r"`[^`]*`", "", bare)
        assert not NUMBER.search(bare), f"a number in {row!r} links to no file"
        for shown, target in LINK.findall(row):
            if target.startswith("results/"):
                assert NUMBER.fullmatch(shown), f"link text {shown!r} should be the number alone"


def test_figure_check_catches_a_stale_number(tmp_path):
    file = tmp_path / "r.json"
    file.write_text(json.dumps({"qps": 723.7, "cmd": "bench --size 1000000", "by": {"64": 1.0}}))
    for fine in ("724", "723.7", "1,000,000", "64"):
        shown_number_in(fine, file)
    for stale in ("723.6", "725", "0.160"):
        with pytest.raises(AssertionError):
            shown_number_in(stale, file)
