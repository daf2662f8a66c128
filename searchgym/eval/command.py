"""`searchgym eval`: the command's own flags (the eval's settings are `EvalSettings`, eval_settings.py) and what it
runs: an evaluation (resumable), or with `compare RUN_DIR...` a comparison of finished runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.settings import setting

USAGE = (
    "searchgym eval --env ID --engine SPEC --out DIR [options] [key=value ...]\n"
    "       searchgym eval compare RUN_DIR RUN_DIR... [--allow-different] [--out DIR] [--seed N]"
)


@dataclass
class EvalCommand:
    """What `searchgym eval` takes besides the eval's settings: where they come from, where results go, and what
    plays the episodes."""

    compare: list[str] = setting(
        default_factory=list,
        metavar="compare RUN_DIR | key=value",
        help="compare finished runs (the first is the baseline) instead of evaluating; refused when their "
        "protocol cards differ. Else dotted overrides of the eval's settings, e.g. k=2 max_tasks=8",
    )
    config: Path | None = setting(
        None, help="a YAML of the eval's settings (EvalSettings: env, engine, k, ...); flags and overrides win"
    )
    agent: str | None = setting(
        None, help="an agent program (openai client, through a recording proxy): module:function or file.py:function"
    )
    out: Path | None = setting(
        None, help="output directory (rerun the command to resume); with compare: where compare.{json,md,html} go"
    )
    allow_different: bool = setting(
        False, help="compare: compare runs whose protocol cards differ, listing every differing field"
    )


def eval_command(command: EvalCommand, values: dict[str, Any]) -> None:
    """Evaluate with the settings `values` (the flags typed) layered over `command.config` and the overrides."""
    if command.compare and command.compare[0] == "compare":
        _compare(command, values)
        return
    overrides = command.compare  # without `compare`, the positionals are dotted overrides (k=2 max_tasks=8)
    missing = [
        flag
        for flag, value in (
            ("--env", values.get("env") or command.config),
            ("--engine", values.get("engine") or command.config),
            ("--out", command.out),
        )
        if value is None
    ]
    if missing:
        raise ValueError(
            f"eval needs {', '.join(missing)} (or compare finished runs: searchgym eval compare RUN_DIR...)"
        )
    if command.allow_different:
        raise ValueError("--allow-different belongs to `searchgym eval compare RUN_DIR...`")
    from searchgym.eval.eval_settings import load_eval_settings
    from searchgym.eval.harness import run_eval

    player = _player(command, values)  # --agent (an agent program) or --workflow (a Workflow class)
    if player is not None:
        values["workflow"] = player
    out = Path(str(command.out))
    summary = run_eval(load_eval_settings(command.config, overrides, values), out)
    print((out / "summary.md").read_text())
    print(f"samples, summary.json, plots and report.html in {out} ({int(summary['metrics']['samples'])} samples)")


def _player(command: EvalCommand, values: dict[str, Any]) -> str | None:
    """What plays the episodes: `--agent` (an agent program's function) or `--workflow` (a Workflow class)."""
    if command.agent is None:
        return values.get("workflow")
    if values.get("workflow") is not None:
        raise ValueError("--agent and --workflow both name what plays the episodes: give one")
    from searchgym.agents.workflow import load_object
    from searchgym.serve.program import is_agent_program

    if not is_agent_program(load_object(command.agent)):
        raise ValueError(
            f"--agent {command.agent}: expected an agent function `async def agent(task, client)`; "
            f"a Workflow class goes to --workflow"
        )
    if str(values.get("engine", "")).startswith("openai:"):
        raise ValueError(
            "--agent needs a token-level engine (a model directory or sglang:...): the recording proxy "
            "trains and records tokens, which an openai: endpoint does not give"
        )
    return command.agent


def _compare(command: EvalCommand, values: dict[str, Any]) -> None:
    _, *runs = command.compare
    if values.keys() & {"env", "engine", "labels"}:
        raise ValueError("`searchgym eval compare` takes finished run directories, not --env/--engine/--labels")
    from searchgym.eval.compare import compare_runs, comparison_markdown, write_comparison

    comparison = compare_runs(runs, allow_different=command.allow_different, seed=values.get("seed", 0))
    print(comparison_markdown(comparison))
    if command.out:
        write_comparison(comparison, command.out)
        print(f"compare.json, compare.md and compare.html in {command.out}")
