"""One LLM call that gives a complete, parseable reply or fails as such: a dependency's failure is never a result.

`ask` sends one chat request and hands the reply to the caller's `parse`. A transport failure (the
client already retried 429s, 5xx and dropped connections with backoff, honouring Retry-After) is raised
at once as `CallFailed`; a reply cut at max_tokens (finish_reason "length") or one `parse` refuses
(`Unparseable`) is asked again, with backoff, up to `ReplyRetry.attempts` times, then raised as
`CallFailed`. Callers record a `CallFailed` as a failure of that call and retry it on a rerun; they never
score or reject on it.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from searchgym.core.cost_meter import charge

T = TypeVar("T")
BACKOFF_ENV = "SEARCHGYM_LLM_BACKOFF"  # base seconds of every LLM retry backoff (tests set it tiny)
RETRIES_ENV = "SEARCHGYM_LLM_RETRIES"  # transport retries of the OpenAI-compatible client


class ChatModel(Protocol):
    """What an LLM call needs from an inference engine: judges, simulated search and synthesis call one (the agents
    package's engines satisfy it)."""

    async def achat(self, messages: list[dict[str, str]], **sampling: Any) -> str: ...


class Unparseable(ValueError):
    """`parse` found no usable answer in a complete reply (no verdict, no JSON with the needed fields)."""


class CallFailed(Exception):
    """An LLM call that gave no usable reply: `kind` is "call" (transport, rate limit, server error),
    "cut off" (finish_reason length), "too long" (past MAX_REPLY_CHARS) or "unparseable"; `calls` is how many
    requests it made."""

    def __init__(self, kind: str, detail: str, *, calls: int = 1, output: str | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.calls = calls
        self.output = output


class DependencyFailed(RuntimeError):
    """A command whose work items failed on a dependency (an LLM endpoint); its message names the cause."""


def env_float(name: str, default: float) -> float:
    """A non-negative number from environment variable `name` (unset: `default`); a bad value names the variable."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{name}={raw!r}: expected a finite number >= 0")
    return value


def env_int(name: str, default: int) -> int:
    """A non-negative integer from environment variable `name` (unset: `default`); a bad value names the variable."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: expected an integer >= 0")
    return value


def llm_retries() -> int:
    """$SEARCHGYM_LLM_RETRIES: transport retries of every LLM call (default 5); junk is a ValueError naming it."""
    return env_int(RETRIES_ENV, 5)


def llm_backoff() -> float:
    """$SEARCHGYM_LLM_BACKOFF: base seconds of every LLM retry backoff (default 0.5); junk is a ValueError naming it."""
    return env_float(BACKOFF_ENV, 0.5)


@dataclass(frozen=True)
class ReplyRetry:
    """How often and how patiently a cut-off or unparseable reply is asked again (backoff doubles, with jitter)."""

    attempts: int = 3
    backoff: float | None = None  # seconds before the second try; None: $SEARCHGYM_LLM_BACKOFF or 0.5
    backoff_max: float = 8.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"attempts must be an integer >= 1, got {self.attempts!r}")
        if self.backoff is not None and not (isinstance(self.backoff, (int, float)) and 0 <= self.backoff < 1e6):
            raise ValueError(f"backoff must be a number of seconds >= 0, got {self.backoff!r}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed try number `attempt` (0-based)."""
        base = llm_backoff() if self.backoff is None else self.backoff
        return min(self.backoff_max, base * 2**attempt) * random.uniform(0.5, 1.0)


def endpoint_of(model: Any) -> str:
    """Where a chat model sends its calls (an endpoint URL), or its class name."""
    return str(getattr(model, "url", None) or type(model).__name__)


async def complete_reply(model: ChatModel, messages: list[dict[str, Any]], **sampling: Any) -> str:
    """The text of one complete reply; CallFailed("call") when the call failed, ("cut off") at finish_reason length.

    Models with `achat_full` (OpenAIEngine, EngineChat) report their finish reason; others are trusted."""
    full = getattr(model, "achat_full", None)
    try:
        if full is not None:
            out = await full(messages, **sampling)
            text, finish = out.get("content") or "", out.get("finish_reason")
            usage = out.get("usage") if isinstance(out.get("usage"), dict) else {}
            # a tool's cost where the endpoint reports tokens (charged only inside a metered tool call)
            charge(
                prompt_tokens=_count(usage.get("prompt_tokens")),
                generated_tokens=_count(usage.get("completion_tokens")),
            )
        else:
            text, finish = await model.achat(messages, **sampling), None
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 -- any failure of the call is the dependency's, reported with its cause
        endpoint, message = endpoint_of(model), str(e)
        cause = message.removeprefix(f"{endpoint}: ") if message.startswith(endpoint) else f"{type(e).__name__}: {e}"
        raise CallFailed("call", f"LLM endpoint {endpoint}: {cause}"[:600]) from None
    if finish == "length":
        raise CallFailed(
            "cut off",
            f"the reply was cut at max_tokens={sampling.get('max_tokens')} (finish_reason length)",
            output=text,
        )
    if not isinstance(text, str):
        raise CallFailed("unparseable", f"the reply is not text: {type(text).__name__}")
    if len(text) > MAX_REPLY_CHARS:  # dropped here, before any parser splits it into pieces
        raise CallFailed("too long", f"the reply has {len(text):,} characters, over the {MAX_REPLY_CHARS:,} cap")
    return text


MAX_REPLY_CHARS = 1_000_000  # a chat reply past this (about 250k tokens: more than any max_tokens asked) is junk


def _count(value: Any) -> int:
    """A token count an endpoint reported, or 0 when it reported none (or junk)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


async def ask(
    model: ChatModel,
    messages: list[dict[str, Any]],
    parse: Callable[[str], T],
    *,
    retry: ReplyRetry | None = None,
    **sampling: Any,
) -> tuple[T, int]:
    """(parse(reply), calls made) of the first complete reply `parse` accepts; raises CallFailed otherwise."""
    retry = retry or ReplyRetry()
    last: CallFailed | None = None
    for attempt in range(retry.attempts):
        if attempt:
            await asyncio.sleep(retry.delay(attempt - 1))
        try:
            text = await complete_reply(model, messages, **sampling)
            try:
                return parse(text), attempt + 1
            except Unparseable as e:
                raise CallFailed("unparseable", str(e)[:300], output=text) from None
        except CallFailed as e:
            e.calls = attempt + 1
            if e.kind == "call":  # the client retried transport failures already: do not multiply its retries
                raise
            last = e
    assert last is not None
    last.detail += f" (after {retry.attempts} tries)"
    last.args = (f"{last.kind}: {last.detail}",)
    raise last
