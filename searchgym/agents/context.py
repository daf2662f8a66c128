"""Context management: how a token workflow keeps an episode going past the model's context window.

When the next observation would not fit (leaving room for one more turn), `TokenWorkflow` asks its
`ContextPolicy` for a new, shorter engine prompt and starts a new *segment* of the trajectory from it
(`Trajectory.start_segment`). Each segment stays token-exact: the engine's output ids are appended as they
came, only environment text is tokenised, and a new prompt is built from the question (text), the engine's
own output ids of earlier turns, and environment text (stubs, notes, the latest observation).

Policies (pick one in `WorkflowSettings.context`, or in the train config as `rollout.context_policy`):

- `EndPolicy` ("end"): no management; the episode ends truncated with stop reason "context budget" (the
  behaviour before segments existed, and the default).
- `FoldPolicy` ("fold"): old observations become one-line stubs ("[folded: result of search 'q']"), oldest
  first, keeping the question and every action; the newest observation stays whole. If even that does not
  fit, the oldest whole turns are dropped (never part of a turn) and the prompt says how many.
- `SummarisePolicy` ("summarise"): the policy model is asked, inside the current segment, to summarise what
  it has found; that summary is policy output (trained, with its log-probs and versions) and the new
  segment is the question, the summary's exact ids, and the newest observation. An empty summary falls
  back to folding, recorded in `Trajectory.context_events`.

Subclass `ContextPolicy` (override `rebuild`, and `reserve` if the policy itself generates) for another rule;
a custom workflow passes its instance in `WorkflowSettings(context=...)`, no fork of `TokenWorkflow` needed. A
subclass's `rebuild` is checked (`checked_rebuild`): one that raises, or returns a prompt that is empty, not token
ids, or longer than the segment holds, is a `ContextPolicyError` naming the policy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

from searchgym.agents.engines.types import GenerateResponse, SamplingParams
from searchgym.agents.formats import ChatTemplateDelta
from searchgym.agents.trajectory import Trajectory

SUMMARY_INSTRUCTION = (
    "Your context is full. Summarise what you have found so far that helps answer the "
    "question: the facts, the sources, and what is left to find. Write only the summary."
)
TRUNCATION_NOTE = "\n[truncated: this result had {n} tokens, more than the context allows]"
MAX_SUMMARY_TOKENS = 1 << 17  # no context window holds a longer summary and room to go on
DROPPED_NOTE = "\n\n[{n} earlier turns omitted to fit the context]"


@dataclass
class Entry:
    """One turn as a rebuilt context lays it out: the engine's exact action ids, then what the model was shown.

    `stub` replaces `observation` when the entry is folded; `foldable` is False for a summary (its
    observation is the one that came after it).
    """

    action_ids: list[int]
    ended_with_eos: bool
    observation: str
    stub: str
    foldable: bool = True
    _ids: dict[str, list[int]] = field(default_factory=dict, repr=False, compare=False)  # tokenised once per text

    def ids(self, template: ChatTemplateDelta, which: str) -> list[int]:
        """The observation (`which`="observation") or stub ("stub") as the template's delta after this action."""
        if which not in self._ids:
            self._ids[which] = template.observation_ids(getattr(self, which), self.ended_with_eos)
        return self._ids[which]


@dataclass
class History:
    """What a policy rebuilds from: the question and the turns since the last rebuild that dropped them."""

    question: str
    entries: list[Entry] = field(default_factory=list)


@dataclass
class Layout:
    """A rebuilt prompt and where its pieces lie (kind "prompt", "action" or "observation"; start, end, entry)."""

    ids: list[int]
    pieces: list[tuple[str, int, int, int]]
    folded: int = 0
    dropped: int = 0
    truncated_tokens: int = 0  # tokens cut from the newest observation (0: it fitted)


@dataclass
class Rebuild:
    """A policy's answer: the next segment's prompt ids, why the old segment ended, and what to log."""

    prompt_ids: list[int]
    end: str
    event: dict[str, Any] = field(default_factory=dict)


def stub_for(tool: str, info: dict[str, Any]) -> str:
    """The one line a folded observation becomes, naming the call it answered."""
    if tool == "search" and info.get("query") is not None:
        return f"[folded: result of search {info['query']!r}]"
    if tool == "access" and info.get("url") is not None:
        return f"[folded: page {info['url']!r}]"
    return f"[folded: result of {tool}]"


def truncate_text(template: ChatTemplateDelta, text: str, limit: int) -> tuple[str, int]:
    """`text` cut to at most `limit` tokens, a note saying so included; (text, tokens cut). Environment text only."""
    ids = template.encode(text)
    if len(ids) <= limit:
        return text, 0
    note = TRUNCATION_NOTE.format(n=len(ids))
    keep = max(limit - len(template.encode(note)), 0)
    while True:  # a cut inside a multi-byte character can re-encode longer: shrink until it fits
        cut = template.tokenizer.decode(ids[:keep]) + note
        if len(template.encode(cut)) <= limit or keep == 0:
            return cut, len(ids) - keep
        keep = max(keep - max(len(template.encode(cut)) - limit, 1), 0)


def lay_out(template: ChatTemplateDelta, history: History, target: int, fold_to: int | None = None) -> Layout | None:
    """A prompt of at most `target` tokens: fold old observations oldest first, then drop oldest whole turns, until
    it is at most `fold_to` (default `target`) long, then truncate the newest observation if it still exceeds
    `target` (one longer than half of `target` is cut to that half first, so it does not evict every turn). Turns
    are never split. None when not even the question and the newest turn (its observation cut to nothing) fit.

    Folding below the hard limit (`fold_to` < `target`) leaves room for a few turns before the next rebuild, so
    an episode is not rebuilt (and a new segment prompt prefilled) at every turn.
    """
    soft = min(target, fold_to if fold_to is not None else target)
    entries = history.entries
    if not entries:
        return None
    folded = [False] * len(entries)
    observations = [e.ids(template, "observation") for e in entries]
    stubs = [e.ids(template, "stub") for e in entries]
    prompts = {0: template.prompt_ids(history.question)}

    def prompt(dropped: int) -> list[int]:
        if dropped not in prompts:
            prompts[dropped] = template.prompt_ids(history.question + DROPPED_NOTE.format(n=dropped))
        return prompts[dropped]

    def size(first: int) -> int:
        return len(prompt(first)) + sum(
            len(entries[i].action_ids) + len(stubs[i] if folded[i] else observations[i])
            for i in range(first, len(entries))
        )

    last, cut = entries[-1], 0
    if len(observations[-1]) > target // 2:  # a huge newest result is cut first, so it does not evict every turn
        text, cut = truncate_text(template, last.observation, target // 2)
        observations[-1] = template.observation_ids(text, last.ended_with_eos)
    first = 0
    for i in range(len(entries) - 1):  # fold oldest first; the newest observation stays whole
        if size(first) <= soft:
            break
        if entries[i].foldable:
            folded[i] = True
    while size(first) > soft and first < len(entries) - 1:  # drop oldest whole turns
        first += 1
    newest = observations[-1]
    if size(first) > target:  # the newest observation is bigger than what is left: truncate it (again)
        fixed = size(first) - len(newest)
        overhead = len(template.observation_ids("", last.ended_with_eos))
        limit = target - fixed - overhead
        if limit <= 0:
            return None
        full = len(template.encode(last.observation))
        text, _ = truncate_text(template, last.observation, limit)
        newest = template.observation_ids(text, last.ended_with_eos)
        cut = full - len(template.encode(text))
        if fixed + len(newest) > target:
            return None
    ids = list(prompt(first))
    pieces = [("prompt", 0, len(ids), -1)]
    for i in range(first, len(entries)):
        obs = newest if i == len(entries) - 1 else (stubs[i] if folded[i] else observations[i])
        for kind, part in (("action", entries[i].action_ids), ("observation", obs)):
            pieces.append((kind, len(ids), len(ids) + len(part), i))
            ids.extend(part)
    return Layout(ids, pieces, folded=sum(folded[first:]), dropped=first, truncated_tokens=cut)


class ContextHost(Protocol):
    """What a context policy may use of the `TokenWorkflow` running it (a structural view, not a second workflow
    contract: the workflow module imports this one)."""

    template: ChatTemplateDelta
    eos_ids: set[int]

    @property
    def max_context(self) -> int: ...

    async def generate(self, traj: Trajectory, sampling: SamplingParams, rid: str) -> GenerateResponse: ...

    def turn_text(self, output_ids: list[int]) -> str: ...


class ContextPolicy:
    """How a `TokenWorkflow` rebuilds its context when the next observation would not fit.

    `managed` False (this base class) ends the episode instead. `reserve` is the room a segment keeps free for
    the policy's own generation (a summary). `rebuild` returns the next segment's prompt, or None to end the
    episode truncated; it may extend the live segment first (the summary request and reply).
    """

    name = "end"
    managed = False

    def reserve(self, workflow: ContextHost) -> int:
        return 0

    async def rebuild(
        self,
        workflow: ContextHost,
        traj: Trajectory,
        history: History,
        *,
        target: int,
        sampling: SamplingParams,
        rid: str,
    ) -> Rebuild | None:
        return None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every subclass's `rebuild` answers through `checked_rebuild`: a policy that fails or returns a prompt
        the next segment cannot hold is a ContextPolicyError naming it, never a crash deep in the engine."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("rebuild")
        if own is not None and not getattr(own, "_checked", False):
            cls.rebuild = checked_rebuild(own)  # type: ignore[method-assign]


class ContextPolicyError(RuntimeError):
    """A context policy failed, or answered with a prompt that does not fit; the message names the policy."""


def checked_rebuild(rebuild: Any) -> Any:
    """`rebuild` whose errors and answers are checked, naming the policy's class: it must return None or a Rebuild
    whose prompt is a non-empty list of token ids of at most `target` tokens."""

    async def checked(
        self: ContextPolicy,
        workflow: ContextHost,
        traj: Trajectory,
        history: History,
        *,
        target: int,
        sampling: SamplingParams,
        rid: str,
    ) -> Rebuild | None:
        name = type(self).__qualname__
        try:
            out = await rebuild(self, workflow, traj, history, target=target, sampling=sampling, rid=rid)
        except ContextPolicyError:
            raise
        except Exception as e:
            raise ContextPolicyError(f"context policy {name} failed: {type(e).__name__}: {e}") from e
        if out is None:
            return None
        if not isinstance(out, Rebuild):
            raise ContextPolicyError(f"context policy {name} returned {type(out).__name__}, not a Rebuild or None")
        ids = out.prompt_ids
        if not (isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            raise ContextPolicyError(f"context policy {name} returned a prompt that is not a non-empty list of ids")
        if len(ids) > target:
            raise ContextPolicyError(
                f"context policy {name} returned a prompt of {len(ids)} tokens, over the {target} the segment holds"
            )
        return out

    checked._checked = True  # type: ignore[attr-defined]
    checked.__doc__ = rebuild.__doc__
    return checked


class EndPolicy(ContextPolicy):
    """No context management: an episode that outgrows the window ends truncated ("context budget")."""


@dataclass
class FoldPolicy(ContextPolicy):
    """Replace old observations by stubs (oldest first), keeping the question and every action whole.

    Each rebuild folds until the prompt is at most `keep_fraction` of the room a segment has, so a few turns
    fit before the next rebuild (1.0: fold only what must go, rebuilding at nearly every turn late in an episode).
    """

    keep_fraction: float = 0.75
    name = "fold"
    managed = True

    def __post_init__(self) -> None:
        if isinstance(self.keep_fraction, bool) or not isinstance(self.keep_fraction, (int, float)):
            raise ValueError(f"keep_fraction must be a number in (0, 1], got {self.keep_fraction!r}")
        if not 0 < self.keep_fraction <= 1:
            raise ValueError(f"keep_fraction must be in (0, 1], got {self.keep_fraction}")

    async def rebuild(
        self,
        workflow: ContextHost,
        traj: Trajectory,
        history: History,
        *,
        target: int,
        sampling: SamplingParams,
        rid: str,
    ) -> Rebuild | None:
        return fold(workflow.template, history, target, self.name, fold_to=int(target * self.keep_fraction))


def fold(
    template: ChatTemplateDelta, history: History, target: int, end: str, fold_to: int | None = None, **event: Any
) -> Rebuild | None:
    """The folded layout as a Rebuild (None when nothing fits), its sizes in the event."""
    layout = lay_out(template, history, target, fold_to)
    if layout is None:
        return None
    return Rebuild(
        layout.ids,
        end,
        {
            "policy": end,
            "prompt_tokens": len(layout.ids),
            "folded": layout.folded,
            "dropped_turns": layout.dropped,
            "truncated_tokens": layout.truncated_tokens,
            **event,
        },
    )


@dataclass
class SummarisePolicy(ContextPolicy):
    """Have the policy summarise its findings (trained policy output), then restart from question + summary.

    `summary_tokens` bounds the summary; `instruction` is the user message that asks for it.
    """

    summary_tokens: int = 256
    instruction: str = SUMMARY_INSTRUCTION
    name = "summarise"
    managed = True

    def __post_init__(self) -> None:
        n = self.summary_tokens
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SUMMARY_TOKENS:
            raise ValueError(f"summary_tokens must be a whole number in [1, {MAX_SUMMARY_TOKENS}], got {n!r}")

    def reserve(self, workflow: ContextHost) -> int:
        return self.summary_tokens + len(workflow.template.observation_ids(self.instruction, False)) + 1

    async def rebuild(
        self,
        workflow: ContextHost,
        traj: Trajectory,
        history: History,
        *,
        target: int,
        sampling: SamplingParams,
        rid: str,
    ) -> Rebuild | None:
        last = history.entries[-1]
        request = workflow.template.observation_ids(self.instruction, last.ended_with_eos)
        if len(traj.input_ids) + len(request) >= workflow.max_context:  # no room left to ask: fold instead
            return fold(
                workflow.template, history, target, "fold (no room to summarise)", fallback="no room to summarise"
            )
        traj.extend(request, generated=False)
        traj.messages.append({"role": "user", "content": self.instruction})
        room = min(self.summary_tokens, workflow.max_context - len(traj.input_ids))
        summary_sampling = dataclasses.replace(sampling, max_new_tokens=max(room, 1), stop=())
        response = await workflow.generate(traj, summary_sampling, rid)
        if response.output_ids:  # policy output: trained with the advantage of the turn it serves
            traj.extend(response.output_ids, generated=True, logprobs=response.logprobs, versions=response.versions)
            traj.run_turns.append(max(len(traj.turns) - 1, 0))
        text = workflow.turn_text(response.output_ids)
        traj.messages.append({"role": "assistant", "content": text})
        event = {"summary_tokens": len(response.output_ids)}
        if not text.strip():
            return fold(workflow.template, history, target, "fold (empty summary)", fallback="empty summary", **event)
        ended = response.output_ids[-1] in workflow.eos_ids
        summarised = History(
            history.question, [Entry(list(response.output_ids), ended, last.observation, last.stub, foldable=False)]
        )
        rebuilt = fold(workflow.template, summarised, target, self.name, **event)
        if rebuilt is None:  # the summary itself is too long for the window: fold the turns instead
            return fold(
                workflow.template, history, target, "fold (summary too long)", fallback="summary too long", **event
            )
        history.entries[:] = summarised.entries  # later rebuilds start from the summary
        return rebuilt


POLICIES: dict[str, type[ContextPolicy]] = {"end": EndPolicy, "fold": FoldPolicy, "summarise": SummarisePolicy}


def context_policy(name: str, *, summary_tokens: int = 256, keep_fraction: float = 0.75) -> ContextPolicy:
    """The built-in policy called `name` ("end", "fold" or "summarise")."""
    if name not in POLICIES:
        raise ValueError(f"unknown context policy {name!r}; use one of {sorted(POLICIES)}")
    if name == "summarise":
        return SummarisePolicy(summary_tokens=summary_tokens)
    if name == "fold":
        return FoldPolicy(keep_fraction=keep_fraction)
    return POLICIES[name]()
