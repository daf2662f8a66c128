"""The episode list's filter: read from a page's query string (each bad value named), applied to an index.

    chosen, errors = EpisodeFilter.parse({"outcome": "wrong", "min_turns": "3"}, judges=["em", "f1"])
    shown = chosen.apply(index.episodes)         # sorted as `chosen.sort` says
    chosen.query(page=2)                         # the same filter as a query string, for links

The filter lives in the URL, so a filtered view can be linked and reloaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from searchgym.view.runs import OUTCOMES, EpisodeSummary

SORTS = {
    "file": "as written",
    "reward-desc": "reward, high first",
    "reward-asc": "reward, low first",
    "turns-desc": "turns, most first",
    "turns-asc": "turns, fewest first",
    "calls-desc": "tool calls, most first",
}
PAGE_SIZE = 50


@dataclass
class EpisodeFilter:
    """Which episodes the list shows, in which order; the empty value of a field filters nothing."""

    outcome: str = ""  # one of OUTCOMES, judged by `judge`
    judge: str = ""  # the judge whose call makes the outcome ("" = the run's first)
    disagree: bool = False  # only episodes whose judges split
    folded: bool = False  # only episodes whose context was folded or summarised
    min_turns: int | None = None
    max_turns: int | None = None
    min_calls: int | None = None
    max_calls: int | None = None
    hops: int | None = None
    stop: str = ""  # stop reason
    text: str = ""  # in the question, task id or prediction (case-insensitive)
    sort: str = "file"
    page: int = 1

    @classmethod
    def parse(cls, query: Mapping[str, str], judges: list[str]) -> tuple[EpisodeFilter, list[str]]:
        """The filter a query string asks for; a value it cannot use is left out and named in the errors."""
        chosen, errors = cls(), []
        for f in dataclasses.fields(cls):
            raw = query.get(f.name, "").strip()
            if not raw:
                continue
            if f.name in ("disagree", "folded"):
                setattr(chosen, f.name, raw in ("1", "on", "true", "yes"))
            elif f.type == "int | None" or f.name == "page":
                try:
                    value = int(raw)
                except ValueError:
                    errors.append(f"{f.name}: {raw[:40]!r} is not a whole number")
                    continue
                if value < (1 if f.name == "page" else 0):
                    errors.append(f"{f.name}: {value} is below {1 if f.name == 'page' else 0}")
                    continue
                setattr(chosen, f.name, value)
            else:
                setattr(chosen, f.name, raw[:200])
        if chosen.outcome and chosen.outcome not in OUTCOMES:
            errors.append(f"outcome: {chosen.outcome[:40]!r} is not one of {', '.join(OUTCOMES)}")
            chosen.outcome = ""
        if chosen.judge and chosen.judge not in judges:
            errors.append(f"judge: {chosen.judge[:40]!r} is not a judge of this run ({', '.join(judges) or 'none'})")
            chosen.judge = ""
        if chosen.sort not in SORTS:
            errors.append(f"sort: {chosen.sort[:40]!r} is not one of {', '.join(SORTS)}")
            chosen.sort = "file"
        chosen.judge = chosen.judge or (judges[0] if judges else "")
        return chosen, errors

    def keeps(self, episode: EpisodeSummary) -> bool:
        """Whether one episode passes every filter."""
        checks = (
            not self.outcome or episode.outcome(self.judge) == self.outcome,
            not self.disagree or episode.judges_disagree,
            not self.folded or episode.folded,
            self.min_turns is None or episode.turns >= self.min_turns,
            self.max_turns is None or episode.turns <= self.max_turns,
            self.min_calls is None or episode.tool_calls >= self.min_calls,
            self.max_calls is None or episode.tool_calls <= self.max_calls,
            self.hops is None or episode.hops == self.hops,
            not self.stop or episode.stop_reason == self.stop,
            not self.text or self.text.lower() in f"{episode.question} {episode.task_id} {episode.prediction}".lower(),
        )
        return all(checks)

    def apply(self, episodes: list[EpisodeSummary]) -> list[EpisodeSummary]:
        """The episodes that pass, in the chosen order (ties keep file order)."""
        kept = [e for e in episodes if self.keeps(e)]
        keys = {
            "reward-desc": lambda e: -e.reward,
            "reward-asc": lambda e: e.reward,
            "turns-desc": lambda e: -e.turns,
            "turns-asc": lambda e: e.turns,
            "calls-desc": lambda e: -e.tool_calls,
        }
        return sorted(kept, key=keys[self.sort]) if self.sort in keys else kept

    def query(self, **changes: object) -> str:
        """This filter (with `changes`) as a query string holding only what differs from no filter."""
        values = {**dataclasses.asdict(self), **changes}
        default = dataclasses.asdict(EpisodeFilter())
        kept = {k: (int(v) if isinstance(v, bool) else v) for k, v in values.items() if v != default[k]}
        return urlencode(kept)
