"""One episode as the viewer shows it: turns with their tool calls, observations and search hits, where the
context was rebuilt, the judges' verdicts, and its tokens page by page on demand.

    row = read_episode(run, summary)          # the stored row again (from its byte offset)
    shown = episode_view(row, run.kind)       # what the episode page renders
    tokens = token_page(row, run.kind, segment=0, start=0, decode=tokenizer_for(run))

Texts longer than MAX_SHOWN_CHARS are cut on the page (the full text is one link away), so a 50 MB trajectory
opens as quickly as its turns can be listed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchgym.view.runs import EpisodeSummary, Run, RunKind, field_dict, field_list, question_of, read_line

MAX_SHOWN_CHARS = 6_000  # of one action or observation on the page
TOKENS_PER_PAGE = 1_000


class EpisodeGone(Exception):
    """The line an index pointed at no longer holds that episode (the file changed under the viewer)."""


@dataclass
class Hit:
    rank: int
    title: str
    url: str
    score: float | None


@dataclass
class TurnView:
    """One turn as shown: the action, the tool call read from it, the observation, hits and costs."""

    number: int
    action: str
    action_cut: bool
    tool: str
    call: str  # the query or url the tool was called with ("" for an answer or an invalid action)
    observation: str
    observation_cut: bool
    observation_chars: int
    hits: list[Hit]
    reward: float
    generated_tokens: int
    observation_tokens: int
    finish_reason: str
    format_errors: list[str]
    seconds: float
    rebuilt: dict[str, Any] | None = None  # the context rebuild before this turn (fold, summarise), if any


@dataclass
class EpisodeView:
    task_id: str
    question: str
    answers: list[str]
    prediction: str | None
    reward: float
    stop_reason: str
    verdicts: list[dict[str, Any]]
    turns: list[TurnView]
    segments: list[dict[str, Any]]  # per token segment: tokens, generated tokens, how it ended
    versions: list[int] = field(default_factory=list)  # the policy versions that wrote its tokens


def read_episode(run: Run, summary: EpisodeSummary) -> dict[str, Any]:
    """The stored row an index entry points at; EpisodeGone if the file no longer holds it there."""
    try:
        row = read_line(summary.path, summary.offset)
    except (OSError, ValueError) as e:
        raise EpisodeGone(f"{summary.path.name} changed since the list was read ({e}); reload the list") from None
    if str(row.get("task_id")) != summary.task_id:
        raise EpisodeGone(f"{summary.path.name} changed since the list was read; reload the list")
    return row


def trajectory_of(row: dict[str, Any], kind: RunKind) -> dict[str, Any]:
    """The trajectory of a stored row: an evaluation sample's "trajectory", or a training run's row itself."""
    return field_dict(row, "trajectory") if kind == "eval" else row


def _cut(text: Any) -> tuple[str, bool]:
    text = "" if text is None else str(text)
    return (text[:MAX_SHOWN_CHARS], True) if len(text) > MAX_SHOWN_CHARS else (text, False)


def _number(value: Any, default: float = 0.0) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return out if math.isfinite(out) else default


def _hits(info: dict[str, Any]) -> list[Hit]:
    out = []
    for rank, hit in enumerate(field_list(info, "hits"), 1):
        if isinstance(hit, dict):
            score = hit.get("score")
            out.append(
                Hit(
                    rank,
                    str(hit.get("title") or hit.get("url") or "")[:300],
                    str(hit.get("url") or "")[:2000],
                    _number(score) if score is not None else None,
                )
            )
    return out


def turn_view(number: int, turn: dict[str, Any]) -> TurnView:
    info = field_dict(turn, "info")
    action, action_cut = _cut(turn.get("action"))
    observation = "" if turn.get("observation") is None else str(turn.get("observation"))
    shown, cut = _cut(observation)
    errors = field_list(info, "format_errors")
    return TurnView(
        number=number,
        action=action,
        action_cut=action_cut,
        tool=str(turn.get("tool") or ""),
        call=str(info.get("query") or info.get("url") or "")[:2000],
        observation=shown,
        observation_cut=cut,
        observation_chars=len(observation),
        hits=_hits(info),
        reward=_number(turn.get("reward")),
        generated_tokens=int(_number(turn.get("generated_tokens"))),
        observation_tokens=int(_number(turn.get("observation_tokens"))),
        finish_reason=str(turn.get("finish_reason") or ""),
        format_errors=[str(e)[:300] for e in errors],
        seconds=_number(turn.get("generate_seconds")) + _number(turn.get("env_seconds")),
    )


def _segments(traj: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for segment in [*field_list(traj, "segments"), traj]:
        if isinstance(segment, dict):
            mask, ids = field_list(segment, "loss_mask"), field_list(segment, "input_ids")
            end = segment.get("end", "") if segment is not traj else traj.get("stop_reason", "")
            out.append({"tokens": len(ids), "generated": sum(1 for m in mask if m == 1), "end": str(end or "")})
    return out


def episode_view(row: dict[str, Any], kind: RunKind) -> EpisodeView:
    """What the episode page shows of a stored row (an evaluation sample or a trained trajectory)."""
    traj = trajectory_of(row, kind)
    turns = [turn_view(i, t) for i, t in enumerate(field_list(traj, "turns")) if isinstance(t, dict)]
    for event in field_list(traj, "context_events"):
        at = event.get("turn") if isinstance(event, dict) else None
        if isinstance(at, int) and 0 <= at < len(turns):
            turns[at].rebuilt = {k: v for k, v in event.items() if isinstance(v, (str, int, float, bool))}
    verdicts = field_dict(row, "verdicts") if kind == "eval" else {"env": traj.get("verdict")}
    versions = field_list(traj, "versions")
    question = row.get("question") if kind == "eval" else None
    if not question:
        question = question_of(traj.get("messages"))
    return EpisodeView(
        task_id=str(row.get("task_id")),
        question=str(question or ""),
        answers=[str(a) for a in field_list(row, "answers")],
        prediction=None if row.get("prediction") is None else str(row["prediction"]),
        reward=_number(row.get("reward")),
        stop_reason=str(traj.get("stop_reason") or ""),
        verdicts=[
            {
                "judge": str(name),
                "score": v.get("score"),
                "correct": v.get("correct"),
                "error": v.get("error"),
            }
            for name, v in verdicts.items()
            if isinstance(v, dict)
        ],
        turns=turns,
        segments=_segments(traj),
        versions=sorted({int(v) for v in versions if isinstance(v, int) and v >= 0}),
    )


def full_text(row: dict[str, Any], kind: RunKind, turn: int, part: str) -> str:
    """A turn's whole action or observation (what the page cut); KeyError for a turn or part it does not have."""
    turns = field_list(trajectory_of(row, kind), "turns")
    if not 0 <= turn < len(turns) or not isinstance(turns[turn], dict) or part not in ("action", "observation"):
        raise KeyError(f"turn {turn} {part}")
    return str(turns[turn].get(part) or "")


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> Callable[[int], str] | None:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception:  # a damaged or foreign tokenizer.json: the tokens are shown as ids
        return None

    def decode(token: int) -> str:
        return str(tokenizer.decode([token], skip_special_tokens=False))

    return decode


def tokenizer_for(run: Run) -> Callable[[int], str] | None:
    """A decoder for the run's model's tokens (its tokenizer.json), or None where the model dir is not here."""
    meta = run.meta()
    model = meta.get("engine") if run.kind == "eval" else field_dict(meta, "model").get("path")
    if not isinstance(model, str) or not model:
        return None
    path = Path(model) / "tokenizer.json"
    return _load_tokenizer(str(path)) if path.is_file() else None


def token_page(
    row: dict[str, Any], kind: RunKind, *, segment: int, start: int, decode: Callable[[int], str] | None
) -> dict[str, Any]:
    """TOKENS_PER_PAGE tokens of one segment from `start`: id, text, whether the policy wrote it, its log-prob and
    the version that wrote it; KeyError for a segment the episode does not have."""
    traj = trajectory_of(row, kind)
    every = [*field_list(traj, "segments"), traj]
    if not 0 <= segment < len(every) or not isinstance(every[segment], dict):
        raise KeyError(f"segment {segment}")
    chosen = every[segment]
    ids, mask = field_list(chosen, "input_ids"), field_list(chosen, "loss_mask")
    logprobs, versions = field_list(chosen, "logprobs"), field_list(chosen, "versions")
    start = max(0, min(start, max(len(ids) - 1, 0)))
    rows = []
    for i in range(start, min(start + TOKENS_PER_PAGE, len(ids))):
        token = ids[i]
        written = i < len(mask) and mask[i] == 1
        rows.append(
            {
                "position": i,
                "id": token,
                "text": decode(token) if decode is not None and isinstance(token, int) else "",
                "generated": written,
                "logprob": logprobs[i] if written and i < len(logprobs) else None,
                "version": versions[i] if written and i < len(versions) else None,
            }
        )
    return {"segment": segment, "segments": len(every), "start": start, "total": len(ids), "rows": rows}
