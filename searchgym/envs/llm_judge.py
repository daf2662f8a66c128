"""LLM-as-judge over any chat model, with ASearcher's verdict format and explicit failures.

The judge sees the question, the labelled answers and the prediction, and must end with a JSON block
`{"rationale": "...", "judgement": "Correct" | "Incorrect"}`. Parsing is strict: reasoning inside
`<think>` blocks is never read (a reply that ends inside one holds no verdict), the last JSON block with a
judgement decides, and the only fallback is a last line that is the verdict alone ("Judgement: Correct").
A reply cut at max_tokens (finish_reason "length") or without a clear verdict is asked again with
backoff (`ReplyRetry`), then is a judge *failure* (`Verdict.error` set, counted in `stats`), never a
verdict. Each verdict's detail says how many model calls it took (`calls`; 0 when cached). Valid
verdicts are cached, so re-judging the same (question, references, prediction) is free.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from searchgym.core.llm_calls import CallFailed, ChatModel, ReplyRetry, Unparseable, ask
from searchgym.envs.answer_text import normalize_answer
from searchgym.envs.verdicts import Verdict

JUDGE_PROMPT = """\
You are grading an answer to a question against the labelled correct answer(s).

Question: {question}
Labelled answer(s): {references}
Predicted answer: {prediction}

The prediction is Correct if it means the same thing as any labelled answer (differences in \
wording, spelling, formatting, units or extra detail that does not contradict it are fine). It is \
Incorrect if it is wrong, contradicts the labels, hedges between several answers, or is empty.

Reply with a short rationale, then end with exactly one JSON block:
```json
{{"rationale": "<one or two sentences>", "judgement": "Correct" or "Incorrect"}}
```"""

# the fallback: a last line holding only the verdict, optionally labelled and in markdown emphasis
_VERDICT_LINE = re.compile(
    r"[\s*_`#>-]*(?:(?:final\s+)?(?:judgement|judgment|verdict|grade)\s*[:=-]?[\s*_`]*)?"
    r"(correct|incorrect)[\s*_`.!]*",
    re.IGNORECASE,
)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
MAX_PROMPT_FIELD = 4000
MAX_PARSED_CHARS = 8000  # a verdict sits at the end; do not scan megabytes of rambling


def json_objects_from_end(text: str, max_chars: int = MAX_PARSED_CHARS, limit: int = 50) -> Iterator[dict]:
    """The JSON objects embedded in the last `max_chars` of `text`, last first (at most `limit` of them).

    LLMs end their replies with the JSON block that matters, after free text that may hold braces of
    its own; scanning back from the end finds it without trusting anything else in the reply.
    """
    tail = text[-max_chars:]
    decoder = json.JSONDecoder()
    found = 0
    for start in reversed([i for i, ch in enumerate(tail) if ch == "{"]):
        try:
            obj, _ = decoder.raw_decode(tail, start)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict):
            yield obj
            found += 1
            if found >= limit:
                return


def visible_reply(text: str) -> str | None:
    """The part of a reply after its reasoning: text after the last `</think>`; None when it ends inside `<think>`.

    Reasoning models open their thoughts in the prompt or the reply and close them with `</think>`; a
    verdict-like word in the thoughts ("could this be incorrect?") is never the verdict."""
    lowered = text.lower()
    close = lowered.rfind(_THINK_CLOSE)
    tail = text[close + len(_THINK_CLOSE) :] if close >= 0 else text
    return None if _THINK_OPEN in tail.lower() else tail


def parse_judgement(text: str) -> str | None:
    """'Correct', 'Incorrect', or None when the judge's output holds no clear verdict."""
    if not isinstance(text, str):
        return None
    visible = visible_reply(text[-MAX_PARSED_CHARS * 4 :])
    if visible is None:
        return None
    for obj in json_objects_from_end(visible):  # the last JSON object that carries a judgement decides
        if "judgement" in obj:
            value = obj["judgement"]
            if isinstance(value, str) and value.strip().lower() in ("correct", "incorrect"):
                return value.strip().capitalize()
            return None
    lines = [line for line in visible[-2000:].splitlines() if line.strip()]
    match = _VERDICT_LINE.fullmatch(lines[-1]) if lines else None
    return match.group(1).capitalize() if match else None


def _verdict_of(text: str) -> str:
    judgement = parse_judgement(text)
    if judgement is None:
        raise Unparseable("no verdict in the judge's output")
    return judgement


class LLMJudge:
    """A Judge (see searchgym.envs.judges) backed by a chat model; failures are flagged, not scored."""

    name = "llm"

    def __init__(
        self, model: ChatModel, *, cache_size: int = 100_000, max_tokens: int = 512, retry: ReplyRetry | None = None
    ):
        self.model = model
        self.retry = retry or ReplyRetry()
        self.max_tokens = max_tokens
        self.decoding = {"temperature": 0.0, "max_tokens": max_tokens}  # what every call sends (and eval cards record)
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple, Verdict] = OrderedDict()
        self.stats = {"calls": 0, "cache_hits": 0, "failures": 0}

    async def ajudge(
        self, prediction: str, references: Sequence[str], *, question: str = "", format_errors: Sequence[str] = ()
    ) -> Verdict:
        references = [references] if isinstance(references, str) else list(references)
        key = (question, tuple(references), prediction)
        if key in self._cache:
            self.stats["cache_hits"] += 1
            self._cache.move_to_end(key)
            cached = self._cache[key]
            return replace(cached, detail={**cached.detail, "calls": 0, "cached": True})
        if not normalize_answer(prediction):
            return Verdict(0.0, False, self.name, {"reason": "empty prediction", "calls": 0})
        prompt = JUDGE_PROMPT.format(
            question=question[:MAX_PROMPT_FIELD],
            references=" | ".join(r[:MAX_PROMPT_FIELD] for r in references),
            prediction=prediction[:MAX_PROMPT_FIELD],
        )
        try:
            (judgement, output), calls = await ask(
                self.model,
                [{"role": "user", "content": prompt}],
                lambda text: (_verdict_of(text), text),
                retry=self.retry,
                **self.decoding,
            )
        except CallFailed as e:  # transport, cut-off or verdict-less replies: a judge failure, never a verdict
            self.stats["calls"] += e.calls
            reason = {"call": f"judge call failed: {e.detail}", "cut off": f"judge reply cut off: {e.detail}"}.get(
                e.kind, e.detail
            )
            return self._failure(reason, e.output, e.calls)
        self.stats["calls"] += calls
        verdict = Verdict(
            1.0 if judgement == "Correct" else 0.0,
            judgement == "Correct",
            self.name,
            {"judgement": judgement, "output": output[-1000:], "calls": calls},
        )
        self._remember(key, verdict)
        return verdict

    def judge(
        self, prediction: str, references: Sequence[str], *, question: str = "", format_errors: Sequence[str] = ()
    ) -> Verdict:
        return asyncio.run(self.ajudge(prediction, references, question=question, format_errors=format_errors))

    def _failure(self, reason: str, output: Any, calls: int) -> Verdict:
        self.stats["failures"] += 1
        detail = {"output": output[-1000:], "calls": calls} if isinstance(output, str) else {"calls": calls}
        return Verdict(0.0, False, self.name, detail, error=reason)

    def _remember(self, key: tuple, verdict: Verdict) -> None:
        self._cache[key] = verdict
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
