"""Run folders for the viewer's tests, written in the stored formats by the project's own types: evaluation
samples (`samples.jsonl` rows around a `Trajectory`) and a training run's `trajectories/version-*.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from searchgym.agents.trajectory import Trajectory, Turn

URL = "https://world.searchgym.test/wiki/{}"


def trajectory(i: int, *, turns: int = 2, folded: bool = False, tokens: int = 40, observation: str = "") -> Trajectory:
    """An episode of `turns` turns: searches, then an answer; `folded` closes a first context segment."""
    traj = Trajectory(task_id=f"q{i}", stop_reason="answer", prediction=f"Answer {i}", reward=float(i % 2))
    traj.extend(list(range(tokens)), generated=False)
    for t in range(turns - 1):
        query = f"entity {i} part {t}"
        traj.turns.append(
            Turn(
                action=f"<search> {query} </search>",
                tool="search",
                observation=observation or f"<information>[Doc 1]({URL.format(f'E{i}')}): page {i}</information>",
                generated_tokens=5,
                observation_tokens=20,
                info={
                    "tool": "search",
                    "query": query,
                    "hits": [{"doc_id": str(i), "url": URL.format(f"E{i}"), "title": f"E{i}", "score": 3.5}],
                },
            )
        )
        traj.extend([7, 8, 9, 10, 11], generated=True, logprobs=[-0.5] * 5, versions=[3] * 5)
        if folded and t == 0:
            traj.start_segment([1, 2, 3], "fold")
            traj.context_events.append({"segment": 2, "turn": 1, "policy": "fold", "tokens_before": 900})
    traj.turns.append(Turn(action=f"<answer> Answer {i} </answer>", tool="answer", observation="", generated_tokens=4))
    traj.extend([12, 13, 14, 15], generated=True, logprobs=[-0.25] * 4, versions=[3] * 4)
    return traj


def sample_row(i: int, *, sample: int = 0, question: str = "", disagree: bool = False, **kwargs: Any) -> dict:
    """An evaluation's stored sample: what eval/harness.py appends to samples.jsonl."""
    traj = trajectory(i, **kwargs)
    right = bool(i % 2)
    f1_right = right != disagree  # `disagree`: F1 calls it the other way from EM
    return {
        "task_id": f"q{i}",
        "sample": sample,
        "question": question or f"What is thing {i}?",
        "answers": [f"Answer {i}"],
        "prediction": traj.prediction,
        "reward": traj.reward,
        "subset": {"hops": 1 + i % 3},
        "env_correct": right,
        "verdicts": {
            "em": {"score": float(right), "correct": right, "judge": "em", "detail": {}, "error": None},
            "f1": {"score": float(f1_right), "correct": f1_right, "judge": "f1", "detail": {}, "error": None},
        },
        "stats": {
            "turns": len(traj.turns),
            "searches": len(traj.turns) - 1,
            "accesses": 0,
            "generated_tokens": traj.generated_tokens,
            "answered": True,
            "stop_reason": "answer",
            "segments": traj.num_segments,
            "tool_cost": {},
        },
        "trajectory": traj.to_dict(),
    }


def write_eval(folder: Path, rows: list[dict], *, k: int = 1, summary: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "samples.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    (folder / "run.json").write_text(json.dumps({"env": "searchgym/SyntheticQA-v0", "env_kwargs": {}, "k": k}))
    if summary:
        metrics = {f"avg@{k}/em": 0.5, f"avg@{k}/f1": 0.625, f"avg@{k}/reward": 0.5}
        (folder / "summary.json").write_text(json.dumps({"k": k, "judges": ["em", "f1"], "metrics": metrics}))
    return folder


def write_training(folder: Path, versions: int = 2, per_version: int = 3) -> Path:
    (folder / "trajectories").mkdir(parents=True, exist_ok=True)
    for v in range(versions):
        with (folder / "trajectories" / f"version-{v:05d}.jsonl").open("w") as f:
            for j in range(per_version):
                traj = trajectory(10 * v + j, turns=2 + j)
                traj.verdict = {"judge": "f1", "correct": bool(j % 2), "score": float(j % 2)}
                traj.messages = [{"role": "user", "content": f"Answer it.\n\nQuestion: What is thing {10 * v + j}?"}]
                f.write(json.dumps(traj.to_dict()) + "\n")
    with (folder / "metrics.jsonl").open("w") as f:
        for step in range(1, versions + 1):
            row = {"step": step, "episode/reward": 0.1 * step, "episode/searches": 1.0, "episode/accesses": 0.5}
            f.write(json.dumps(row) + "\n")
    (folder / "config.json").write_text(json.dumps({"env": {"id": "searchgym/SyntheticQA-v0", "kwargs": {}}}))
    return folder
