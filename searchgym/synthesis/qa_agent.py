"""ASearcher's QA-synthesis agent over any linked corpus and any chat model.

From a seed page the reasoning model writes a summary and information points, proposes a base
question (answer + supporting statement), then edits it for up to `max_turns` actions: FUZZ (obscure a
detail so more candidates fit), INJECT (pick a linked page, state a fact from it and compose it into the
question, answer unchanged) or EXIT. The final candidate must pass three checks run with the judge
model: quality (fluent, self-contained, unique answer supported by the statements), difficulty (a
solver answers `k` times without tools, each answer judged; keep when the solve rate is at most
`max_solve_rate`) and uniqueness (no wrong solver answer satisfies every constraint).

Every model output is parsed defensively and nothing a model writes crashes a run. A step whose LLM
call failed (transport, rate limit, a reply cut at max_tokens, or one without the JSON the step needs,
asked again with backoff first) raises `CallFailure`: the seed is not finished and a rerun tries it again.
Only a judged outcome (answer changed, quality, difficulty, uniqueness, an unknown link) is a `Rejected`
candidate with a counted reason. The pool driver is
`synthesis.pool.asynthesize`; `synthesis.run.synthesize` wires engines and an index to it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from searchgym.core.llm_calls import CallFailed, ChatModel, ReplyRetry, Unparseable, ask
from searchgym.envs.judges import make_judge, normalize_answer
from searchgym.envs.llm_judge import LLMJudge, json_objects_from_end
from searchgym.envs.tools.base import Page, PageBackend, PageNotFound, SearchBackend
from searchgym.settings import setting
from searchgym.synthesis.prompts import (
    ACT_PROMPT,
    INJECT_PROMPT,
    PROPOSE_PROMPT,
    QUALITY_PROMPT,
    READ_PROMPT,
    SOLVE_PROMPT,
    UNIQUE_PROMPT,
)

MAX_PAGE_CHARS = 3000
MAX_PARSED_CHARS = 20_000
# The stages a seed goes through, in order; a seed's `stage` is the last one it passed ("tried": none yet).
# "edited": after the FUZZ/INJECT turns; "accepted" (past the pool's near-duplicate check) is the pool's.
STAGES = ("tried", "proposed", "edited", "quality", "difficulty", "uniqueness", "accepted")


class Rejected(Exception):
    """A candidate failed a step or a check; `reason` is the counted rejection reason."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.candidate: Candidate | None = None  # the candidate rejected, once one was proposed


def parse_json_object(text: Any, required: dict[str, type | tuple[type, ...]], step: str) -> dict[str, Any]:
    """The last JSON object in `text` holding all `required` fields with the right types.

    Raises Rejected("<step>: malformed JSON") when no JSON object parses at all, and
    Rejected("<step>: missing fields") when objects parse but none has every field well typed.
    """
    if not isinstance(text, str):
        raise Rejected(f"{step}: malformed JSON", f"not text: {type(text).__name__}")
    parsed: list[dict] = []
    for obj in json_objects_from_end(text, MAX_PARSED_CHARS):
        parsed.append(obj)
        if all(
            isinstance(obj.get(k), t) and (not isinstance(obj.get(k), str) or obj[k].strip())
            for k, t in required.items()
        ):
            return obj
    if not parsed:
        raise Rejected(f"{step}: malformed JSON", text[-200:])
    missing = sorted(k for k, t in required.items() if not isinstance(parsed[0].get(k), t))
    raise Rejected(f"{step}: missing fields", ",".join(missing) or "empty field")


class CallFailure(Exception):
    """A step's LLM call gave no usable reply after its retries: a failure of that call, never a rejection."""

    def __init__(self, step: str, failure: CallFailed) -> None:
        self.step = step
        self.kind = failure.kind
        self.detail = failure.detail
        self.reason = f"{step}: {failure.kind}"
        self.candidate: Candidate | None = None  # the candidate whose step failed, once one was proposed
        super().__init__(f"{self.reason}: {failure.detail}")


@dataclass
class QAConfig:
    """Knobs of the agent; defaults follow ASearcher's (k solver attempts, exit at a 0 solve rate)."""

    max_turns: int = setting(3, at_least=1)
    k: int = setting(4, at_least=1)
    max_solve_rate: float = setting(0.0, at_least=0, at_most=1)
    max_tokens: int = setting(1024, at_least=1)
    temperature: float = setting(0.7, at_least=0)
    solver_temperature: float = setting(1.0, at_least=0)
    max_links: int = setting(8, at_least=1)
    near_duplicate: float = setting(
        0.8, at_least=0, at_most=1
    )  # token-set Jaccard at or above which a question is a near duplicate
    difficulty_judge: str = setting(
        "llm",
        help="grades the solver's answers in the difficulty check: 'llm' (the judge model, as ASearcher) or a rule "
        "judge (em, f1, cover_em, ...), for a judge model too weak to compare two answers",
    )
    reply_attempts: int = 3  # tries of a call whose reply was cut off or unparseable
    retry_backoff: float | None = None  # seconds before the second try (doubling); None: $SEARCHGYM_LLM_BACKOFF or 0.5

    def __post_init__(self) -> None:
        if isinstance(self.reply_attempts, bool) or not isinstance(self.reply_attempts, int) or self.reply_attempts < 1:
            raise ValueError(f"reply_attempts must be an integer >= 1, got {self.reply_attempts!r}")
        if self.difficulty_judge != "llm":
            try:
                make_judge(self.difficulty_judge)
            except (ValueError, TypeError) as e:
                raise ValueError(f"difficulty_judge: {e}") from None
        if self.retry_backoff is not None and not (
            isinstance(self.retry_backoff, (int, float)) and 0 <= self.retry_backoff < 1e6
        ):
            raise ValueError(f"retry_backoff must be a number of seconds >= 0 or None, got {self.retry_backoff!r}")

    @property
    def retry(self) -> ReplyRetry:
        """How a cut-off or unparseable reply is asked again."""
        return ReplyRetry(self.reply_attempts, self.retry_backoff)


@dataclass
class Candidate:
    question: str
    answer: str
    statements: list[str]
    pages: list[str]
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: str = ""
    points: list[str] = field(default_factory=list)
    solver: list[dict[str, Any]] = field(default_factory=list)
    solve_rate: float | None = None
    stage: str = "proposed"  # the last of STAGES it passed


def _same_answer(a: str, b: str) -> bool:
    return normalize_answer(a) == normalize_answer(b)


def _bullets(items: Sequence[str]) -> str:
    return "\n".join(f"- {s}" for s in items) or "- (none)"


class QASynthesisAgent:
    """One seed page -> one validated Candidate or a Rejected reason; `model` reasons, `judge_model` checks."""

    def __init__(
        self,
        search: SearchBackend | None,
        pages: PageBackend,
        model: ChatModel,
        judge_model: ChatModel | None = None,
        config: QAConfig | None = None,
    ) -> None:
        self.search = search
        self.pages = pages
        self.model = model
        self.judge_model = judge_model or model
        self.config = config or QAConfig()
        self.judge = (
            LLMJudge(self.judge_model, max_tokens=self.config.max_tokens, retry=self.config.retry)
            if self.config.difficulty_judge == "llm"
            else make_judge(self.config.difficulty_judge)
        )
        self.calls: Counter[str] = Counter()

    async def _json(
        self,
        model: ChatModel,
        prompt: str,
        step: str,
        required: dict,
        *,
        check: Any = None,
        temperature: float | None = None,
    ) -> dict[str, Any]:
        """The JSON object a step asks for; `check(obj)` may raise Unparseable. Raises CallFailure."""

        def parse(text: str) -> dict[str, Any]:
            try:
                obj = parse_json_object(text, required, step)
            except Rejected as r:
                raise Unparseable(f"{r.reason} ({r.detail})"[:300] if r.detail else r.reason) from None
            if check is not None:
                check(obj)
            return obj

        try:
            obj, calls = await ask(
                model,
                [{"role": "user", "content": prompt}],
                parse,
                retry=self.config.retry,
                max_tokens=self.config.max_tokens,
                temperature=self.config.temperature if temperature is None else temperature,
            )
        except CallFailed as e:
            self.calls[step] += e.calls
            raise CallFailure(step, e) from None
        self.calls[step] += calls
        return obj

    async def _fetch(self, url: str) -> Page:
        try:
            return await self.pages.fetch(url)
        except PageNotFound as e:
            raise Rejected("page not found", str(e)[:200]) from None
        except Exception as e:
            raise Rejected("page fetch failed", f"{type(e).__name__}: {e}"[:200]) from None

    async def _linked(self, page: Page) -> list[str]:
        """Urls of pages linked from `page`; without links, the top search hits for its title."""
        links = [u for u in page.links if u != page.url]
        if not links and self.search is not None:
            try:
                hits = await self.search.search(page.title, self.config.max_links + 1)
                links = [h.url for h in hits if h.url != page.url]
            except Exception:
                links = []
        return links[: self.config.max_links]

    async def run(self, url: str) -> Candidate:
        """Build and check one candidate from the page at `url`; raises Rejected (or CallFailure), which carries the
        candidate (`.candidate`, its `stage` the last one passed) once one was proposed."""
        page = await self._fetch(url)
        cand = await self._propose(page)
        try:
            await self._edit(cand, await self._linked(page))
            cand.stage = "edited"
            await self.check(cand)
        except (Rejected, CallFailure) as e:
            e.candidate = cand
            raise
        return cand

    async def _edit(self, cand: Candidate, links: list[str]) -> None:
        """Up to `max_turns` actions on the candidate: FUZZ, INJECT (a fact of one of `links`) or EXIT."""
        for _ in range(self.config.max_turns):
            act = await self._json(
                self.model,
                ACT_PROMPT.format(
                    question=cand.question,
                    answer=cand.answer,
                    statements=_bullets(cand.statements),
                    links=_bullets(links),
                ),
                "act",
                {"action": str},
                check=_check_action,
            )
            action = act["action"].strip().upper()
            if action == "EXIT":
                cand.history.append({"action": "EXIT"})
                return
            if action == "FUZZ":
                self._keep_answer(cand, act["answer"], "fuzz")
                cand.history.append(
                    {
                        "action": "FUZZ",
                        "before": cand.question,
                        "question": act["question"].strip(),
                        "reason": str(act.get("reason", "")),
                    }
                )
                cand.question = act["question"].strip()
            elif action == "INJECT":
                await self._inject(cand, act["url"], links)

    async def _propose(self, page: Page) -> Candidate:
        """The seed page read into points and a first question on them (with its answer and the statement)."""
        read = await self._json(
            self.model,
            READ_PROMPT.format(title=page.title, url=page.url, text=page.text[:MAX_PAGE_CHARS]),
            "read",
            {"summary": str, "points": list},
            check=_has_points,
        )
        points = _points(read)
        base = await self._json(
            self.model,
            PROPOSE_PROMPT.format(title=page.title, points=_bullets(points)),
            "propose",
            {"question": str, "answer": str, "statement": str},
        )
        cand = Candidate(
            base["question"].strip(),
            base["answer"].strip(),
            [base["statement"].strip()],
            [page.url],
            summary=str(read["summary"]),
            points=points,
        )
        cand.history.append(
            {
                "action": "PROPOSE",
                "question": cand.question,
                "answer": cand.answer,
                "statement": cand.statements[0],
                "page": page.url,
            }
        )
        return cand

    async def _inject(self, cand: Candidate, target: str, links: list[str]) -> None:
        """INJECT: a fact of the linked page `target` woven into the question (another hop); the answer must stay."""
        if target.strip() not in links:
            raise Rejected("inject: unknown link", target[:200])
        linked = await self._fetch(target.strip())
        edit = await self._json(
            self.model,
            INJECT_PROMPT.format(
                question=cand.question,
                answer=cand.answer,
                title=linked.title,
                url=linked.url,
                text=linked.text[:MAX_PAGE_CHARS],
            ),
            "inject",
            {"statement": str, "question": str, "answer": str},
        )
        self._keep_answer(cand, edit["answer"], "inject")
        cand.history.append(
            {
                "action": "INJECT",
                "before": cand.question,
                "question": edit["question"].strip(),
                "page": linked.url,
                "statement": edit["statement"].strip(),
            }
        )
        cand.question = edit["question"].strip()
        cand.statements.append(edit["statement"].strip())
        if linked.url not in cand.pages:
            cand.pages.append(linked.url)

    @staticmethod
    def _keep_answer(cand: Candidate, answer: str, step: str) -> None:
        if not _same_answer(answer, cand.answer):
            raise Rejected(f"{step}: answer changed", f"{cand.answer!r} -> {answer!r}"[:200])

    async def check(self, cand: Candidate) -> None:
        """Quality, difficulty and uniqueness checks; raises Rejected, fills cand.solver and cand.solve_rate."""
        cfg = self.config
        statements = _bullets(cand.statements)
        flags = ("fluent", "self_contained", "unique_answer", "supported")
        quality = await self._json(
            self.judge_model,
            QUALITY_PROMPT.format(question=cand.question, answer=cand.answer, statements=statements),
            "quality",
            {k: bool for k in flags},
            temperature=0.0,
        )
        failed = [k for k in flags if not quality[k]]
        if failed:
            raise Rejected("quality: failed", ",".join(failed) + f" ({str(quality.get('reason', ''))[:150]})")
        cand.stage = "quality"
        attempts = await asyncio.gather(*(self._solve(cand.question) for _ in range(cfg.k)), return_exceptions=True)
        for attempt in attempts:  # every attempt ran to its end; the first failure of a call fails the seed
            if isinstance(attempt, BaseException):
                raise attempt
        correct = 0
        for answer in cast(list[str], attempts):  # none is an exception (raised above)
            verdict = await self.judge.ajudge(answer, [cand.answer], question=cand.question)
            self.calls["judge"] += verdict.detail.get("calls", 0)
            if verdict.error:
                raise CallFailure("difficulty judge", CallFailed("judge failed", verdict.error))
            correct += bool(verdict.correct)
            cand.solver.append({"answer": answer, "correct": bool(verdict.correct), "parsed": True})
        cand.solve_rate = correct / max(1, cfg.k)
        if cand.solve_rate > cfg.max_solve_rate:
            raise Rejected("difficulty: too easy", f"solved {correct}/{cfg.k}")
        cand.stage = "difficulty"
        wrong = list(dict.fromkeys(s["answer"] for s in cand.solver if s["answer"] and not s["correct"]))
        for alternative in wrong:
            fits = await self._json(
                self.judge_model,
                UNIQUE_PROMPT.format(
                    question=cand.question, answer=cand.answer, candidate=alternative, statements=statements
                ),
                "uniqueness",
                {"satisfies_all": bool},
                temperature=0.0,
            )
            if fits["satisfies_all"]:
                raise Rejected("uniqueness: another answer fits", alternative[:200])
        cand.stage = "uniqueness"

    async def _solve(self, question: str) -> str:
        """One tool-free solver answer; a reply without one is asked again, then fails the seed (CallFailure)."""
        out = await self._json(
            self.model,
            SOLVE_PROMPT.format(question=question),
            "solve",
            {"answer": str},
            temperature=self.config.solver_temperature,
        )
        return out["answer"].strip()[:500]


def _points(read: dict[str, Any]) -> list[str]:
    return [str(p) for p in read["points"] if isinstance(p, (str, int, float)) and str(p).strip()]


def _has_points(read: dict[str, Any]) -> None:
    if not _points(read):
        raise Unparseable("read: missing fields (no information points)")


def _check_action(act: dict[str, Any]) -> None:
    """An act reply must name a known action with that action's fields; anything else is unparseable."""
    action = act["action"].strip().upper()
    needs = {"EXIT": {}, "FUZZ": {"question": str, "answer": str}, "INJECT": {"url": str}}.get(action)
    if needs is None:
        raise Unparseable(f"act: unknown action {action[:50]!r}")
    missing = [k for k, t in needs.items() if not isinstance(act.get(k), t) or not act[k].strip()]
    if missing:
        raise Unparseable(f"act: {action} without {', '.join(missing)}")


# ---- the pool driver ---------------------------------------------------------------------------------------
