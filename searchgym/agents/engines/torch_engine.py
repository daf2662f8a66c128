"""TorchEngine: an in-process Hugging Face causal LM served with continuous batching.

One background task owns a left-padded batch and its KV cache. Each step it (1) drops finished,
aborted and cancelled rows, (2) runs one decode forward for every row still generating and samples
a token each, and (3) prefills waiting requests (left-padded, in token-budgeted groups), samples
their first token, and merges their caches into the batch by left-padding the shorter side. Rows
carry explicit position ids (the count of real tokens before them) and a 2D attention mask, so
padding never changes a row's result. Model work runs on one dedicated worker thread under
`torch.inference_mode`, so the event loop keeps serving thousands of environment coroutines.

Prefix reuse: when a row finishes (stop or length), its keys and values (prompt + output, less the
last sampled token, which was never fed) go into a `PrefixCache` under its rid, LRU-evicted under
`prefix_cache_bytes` (0 turns reuse off); a request without a rid, or sent with `keep_prefix=False` (a
rid a server made up, which no next turn can name), keeps nothing, so it never evicts a conversation. A
request whose rid has an entry takes it, keeps the longest common token prefix with its prompt and
prefills only the rest on top of it, at exact positions, so the result is that of a full prefill. Keyed by rid: the
episode runners send one rid per episode and each turn's prompt extends the last turn's tokens exactly, so a rid
lookup and one list comparison find the whole reusable prefix. A first turn (no entry of its own) borrows the
longest prefix any entry shares with it (`EngineLimits.share_prefixes`): episodes open with the same system
message and instructions, which with ASearcher's instructions is most of a first prompt. The borrowed keys and
values are copied into the batch (rows share no blocks in this dense batch), so only the compute is saved, not
memory. Aborted and cancelled rows are not kept, and `abort(rid)` drops rid's entry: an abort ends or restarts that
trajectory.

Pause, abort and weight updates take the step lock, so they happen between steps. A weight update
re-prefills every in-flight row (prompt plus tokens so far, minus the last sampled token, which the
next decode step feeds) with the new weights, so every later token comes from the new weights alone,
and it empties the prefix cache for the same reason (as SGLang flushes its radix cache on a weight
update): AReaL's interruptible generation labels each token with the one version that produced it,
and a next turn computed over keys and values from older weights would come from neither policy. The
next turn of every episode therefore prefills in full once after an update.

Stop strings are matched incrementally (`detokenize.StopStrings`): each new token is decoded once.

Memory: a waiting request joins the batch only while the batch, every row grown to its longest (prompt plus
token budget), fits `memory_budget_bytes` (`batch_memory_bytes`: keys and values twice, as joining and dropping
rows copy the batch, plus each row's decode activations and one prefill's, times the allocator's share measured on
CPU); the rest wait in order, and an empty batch always takes one. By default ("auto") a CPU engine's budget is
MEMORY_FRACTION of the host's available memory at start, less the prefix cache's budget (the local trainer gives
its engine the budget its memory plan leaves beside the learner instead: `trainers.plan.engine_budget`); on a GPU
there is none (only `max_batch_size`). `stats()` shows the budget, the most rows decoded at once and how many steps
held a request back. So an eval's `concurrency` or a trainer's `rollout.max_concurrent_rollouts` sets how many episodes
are in flight, and memory how many decode at once: measured on SmolLM2-135M, 32 episodes at 4,096 tokens of context
had peaked at 12.6 GB RSS with no bound (the measurements behind the estimate: docs/agents.md, "The TorchEngine's
memory").
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from searchgym.core.extras import needs

with needs("TorchEngine"):
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from searchgym.agents.engines.detokenize import StopStrings
from searchgym.agents.engines.memory import batch_bytes, config_shapes, kv_bytes_per_token, memory_after_release
from searchgym.agents.engines.prefix_cache import PrefixCache, shared_prefixes
from searchgym.agents.engines.types import (
    GREEDY_TEMPERATURE,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    SamplingParams,
)
from searchgym.agents.hf_bars import no_hf_bars
from searchgym.agents.model_dir import check_policy_dir

PREFILL_TOKENS = 16384  # padded tokens (cached + new) per prefill forward: bounds attention-mask memory
MIN_SHARED_PREFIX = 16  # tokens that requests arriving together must share for one prefill of them to pay
PREFIX_CACHE_BYTES = 1 << 30  # default budget of finished sequences' keys and values kept for their next turn
MEMORY_FRACTION = 0.5  # of the host's available memory a CPU engine's batch may take by default
logger = logging.getLogger(__name__)
KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each (rows, kv_heads, length, head_dim)
Progress = Callable[[list[int], list[float], list[int]], None]  # new (output ids, logprobs, versions): streaming


@dataclass(eq=False)
class _Sequence:
    """One request in flight: what to continue, how to sample, and what it has produced so far."""

    request: GenerateRequest
    prompt: list[int]
    future: asyncio.Future
    generator: torch.Generator | None  # None: greedy
    stop_ids: frozenset[int]
    budget: int  # tokens it may generate: max_new_tokens capped by the model's context
    stops: StopStrings | None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    cancelled: bool = False
    past: KV | None = None  # keys and values of prompt[:cached], taken from the prefix cache, until prefilled
    cached: int = 0
    progress: Progress | None = None  # told the new tokens after each step that leaves the sequence unfinished
    reported: int = 0  # output tokens already given to `progress`
    keep_prefix: bool = True  # whether its keys and values go into the prefix cache when it finishes

    @property
    def live(self) -> bool:
        return self.finish is None and not self.cancelled


@dataclass
class EngineLimits:
    """What a `TorchEngine` holds at once: rows decoded together (`max_batch_size`), the keys and values kept between
    an episode's turns (`prefix_cache_bytes`, 0: no reuse), and the bound on the batch's memory
    (`memory_budget_bytes`, module docstring): "auto", a number of bytes, or None for no bound."""

    max_batch_size: int = 64
    prefix_cache_bytes: int = PREFIX_CACHE_BYTES
    memory_budget_bytes: int | None | Literal["auto"] = "auto"
    share_prefixes: bool = True  # a first turn borrows the prefix (system message, instructions) other rids hold


class TorchEngine:
    """Token-in, token-out generation from a local HF causal LM; satisfies `types.InferenceEngine`.

    A model given as an object is owned by the engine from then on (moved, cast, updated in place).
    `limits` bounds its batch, prefix cache and memory (`EngineLimits`).
    """

    def __init__(
        self,
        model: str | os.PathLike | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        version: int = 0,
        limits: EngineLimits | None = None,
    ):
        limits = limits or EngineLimits()
        prefix_cache_bytes, memory_budget_bytes = limits.prefix_cache_bytes, limits.memory_budget_bytes
        if not isinstance(model, PreTrainedModel):
            check_policy_dir(model, chat_template=tokenizer is None)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            with no_hf_bars():
                model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model.name_or_path)
        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=dtype).eval()
        self._cache_kwarg = cache_kwarg(self.model)
        self.max_batch_size = limits.max_batch_size
        self.max_context = model.config.max_position_embeddings
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.eos_ids = frozenset(_as_ids(self.tokenizer.eos_token_id) + _as_ids(model.generation_config.eos_token_id))
        self._seed, self._requests, self._version = seed, 0, version
        self._shared_entries = 0  # prefixes prefilled once for requests that arrived together
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []  # batch rows, in order
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # (rows, length): 1 for real tokens, 0 for left padding
        self.prefix_cache = PrefixCache(prefix_cache_bytes, share=limits.share_prefixes)
        self._shape, self._dtype_bytes = config_shapes(model.config), torch.empty((), dtype=dtype).element_size()
        self.kv_bytes_per_token = kv_bytes_per_token(
            self._shape["layers"], self._shape["kv_heads"], self._shape["head_dim"], self._dtype_bytes
        )
        if memory_budget_bytes == "auto":
            memory_budget_bytes = _default_budget(self.device, prefix_cache_bytes)
        self.memory_budget_bytes = memory_budget_bytes
        self._counts = {
            "generated_tokens": 0,
            "prefill_tokens": 0,
            "reused_tokens": 0,
            "decode_steps": 0,
            "busy_s": 0.0,
            "max_rows": 0,  # the most rows decoded at once
            "memory_waits": 0,  # steps that left a waiting request out for the memory budget
        }
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-engine")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    # ---- public API -------------------------------------------------------------------------------------------------

    async def agenerate(
        self, request: GenerateRequest, *, progress: Progress | None = None, keep_prefix: bool = True
    ) -> GenerateResponse:
        """Queue a request, wait for the batch loop to finish it, and return tokens, logprobs and versions.

        A prompt that leaves no room in the model's context returns at once: no tokens, finish "length".
        `progress`, if given, is called in the event loop with the new (output ids, logprobs, versions) after
        every step that leaves the request unfinished (a server streams from it); the last step's tokens come
        only in the returned response. Cancelling the call drops the request from the batch at the next step.
        With `keep_prefix=False` the finished sequence is not kept in the prefix cache (nor is one without a rid).
        """
        self._ensure_started()
        seq = self._new_sequence(request)
        seq.progress, seq.keep_prefix = progress, keep_prefix
        if seq.budget <= 0:
            return _response(seq, FinishReason("length", 0), text="")
        self._waiting.append(seq)
        self._wake.set()
        try:
            return await seq.future
        except asyncio.CancelledError:
            seq.cancelled = True
            if seq in self._waiting:
                self._waiting.remove(seq)
            raise

    async def pause(self) -> None:
        """Stop decoding between steps; returns once no step is running. In-flight requests wait."""
        self._ensure_started()
        self._unpaused.clear()
        async with self._lock:
            pass

    async def resume(self) -> None:
        """Let the batch loop decode again."""
        self._ensure_started()
        self._unpaused.set()

    async def abort(self, rid: str | None = None) -> int:
        """End the in-flight requests with this rid (all when None) now, with their partial tokens; count them.

        The rid's cached prefix (every one when None) is dropped too.
        """
        self._ensure_started()
        async with self._lock:
            hits = [s for s in [*self._running, *self._waiting] if s.live and (rid is None or s.request.rid == rid)]
            for seq in hits:
                seq.finish = FinishReason("abort", message="aborted")
                self._resolve(seq)
            self._waiting = deque(s for s in self._waiting if s.live)
            self.prefix_cache.discard(rid)
            return len(hits)

    async def update_weights(self, source: str | os.PathLike | Mapping[str, torch.Tensor], version: int) -> None:
        """Between steps, load new weights in place, set the version, rebuild in-flight KV caches with them
        and empty the prefix cache.

        Bad weights (unknown or missing keys, wrong shapes, NaN or infinite values) raise before anything
        changes; a failure while
        rebuilding the caches fails the in-flight requests with it.
        """
        self._ensure_started()
        async with self._lock:
            await self._in_worker(self._load_weights, source)
            self._version = version
            try:
                await self._in_worker(self._rebuild_cache)
            except Exception as exc:
                self._fail([*self._running], exc)
                raise
            finally:
                self.prefix_cache.discard()

    def nonfinite_weights(self) -> list[str]:
        """Names of the model's floating-point weights holding NaN or infinite values (none in a sound model)."""
        return _nonfinite(self.model.state_dict().items())

    def stats(self) -> dict:
        """Load and work counters; busy_s is time spent inside steps, for an idle fraction over a window."""
        return {
            "running": sum(s.live for s in self._running),
            "waiting": len(self._waiting),
            "version": self._version,
            "paused": self._task is not None and not self._unpaused.is_set(),
            "prefix_cache_entries": len(self.prefix_cache),
            "prefix_cache_bytes": self.prefix_cache.nbytes,
            "shared_tokens": self.prefix_cache.shared_tokens,  # of reused_tokens, those borrowed from another rid
            "memory_budget_bytes": self.memory_budget_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            **self._counts,
        }

    async def close(self) -> None:
        """Abort everything in flight and stop the batch loop and its thread; later requests raise."""
        if self._task is not None and self._loop is asyncio.get_running_loop():
            await self.abort()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.prefix_cache.discard()
        self._closed = True
        self._worker.shutdown(wait=False)

    # ---- requests ---------------------------------------------------------------------------------------------------

    def _new_sequence(self, request: GenerateRequest) -> _Sequence:
        """Validate a request and attach its future, seeded generator, stop ids and token budget."""
        prompt = list(request.input_ids)
        if not prompt:
            raise ValueError("input_ids is empty")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValueError(f"input_ids must lie in [0, {self.vocab_size})")
        params = request.sampling
        if any(not 0 <= token < self.vocab_size for token, _ in params.logit_bias):
            raise ValueError(f"logit_bias token ids must lie in [0, {self.vocab_size})")
        self._requests += 1
        generator = None
        if params.temperature >= GREEDY_TEMPERATURE:
            # torch's CPU generator keeps only 32 bits of a seed: mix (engine seed, counter) into 32 good ones
            seed = int(np.random.SeedSequence((self._seed, self._requests)).generate_state(1)[0])
            generator = torch.Generator().manual_seed(seed)
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_ids)
        stops = StopStrings(self.tokenizer, params.stop) if params.stop else None
        budget = min(params.max_new_tokens, self.max_context - len(prompt))
        future = asyncio.get_running_loop().create_future()
        return _Sequence(request, prompt, future, generator, stop_ids, budget, stops)

    def _finish_reason(self, seq: _Sequence) -> FinishReason | None:
        """SGLang's order: length, then stop token, then stop string (matched as the text grows)."""
        if len(seq.output_ids) >= seq.budget:
            return FinishReason("length", len(seq.output_ids))
        if seq.output_ids[-1] in seq.stop_ids:
            return FinishReason("stop", seq.output_ids[-1])
        if seq.stops is not None and (stop := seq.stops.push(seq.output_ids[-1])) is not None:
            return FinishReason("stop", stop)
        return None

    def _resolve(self, seq: _Sequence) -> None:
        """Hand a finished sequence's response to its caller, if the caller still waits."""
        assert seq.finish is not None
        if not seq.future.done():
            text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=False)
            seq.future.set_result(_response(seq, seq.finish, text))

    def _fail(self, seqs: list[_Sequence], exc: Exception) -> None:
        """Raise `exc` in every caller of `seqs` and start over with an empty batch."""
        for seq in seqs:
            if not seq.future.done():
                seq.future.set_exception(exc)
        self._reset_batch()

    # ---- the batch loop ---------------------------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        """Start the batch loop in the running event loop (again, if an earlier loop has gone)."""
        if self._closed:
            raise RuntimeError("engine is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._lock = loop, asyncio.Lock()
            self._wake, self._unpaused = asyncio.Event(), asyncio.Event()
            self._unpaused.set()
            self._waiting.clear()
            self._reset_batch()
            self._task = None
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())

    async def _in_worker(self, fn: Callable[..., Any], *args: Any) -> object:
        """Run model work on the engine's own thread, so the event loop stays free and never waits for a slot."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)  # self._loop

    async def _run(self) -> None:
        """Forever: wait for resume and for work, then run one step under the lock."""
        while True:
            await self._unpaused.wait()
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            async with self._lock:
                if self._unpaused.is_set():
                    await self._guarded_step()

    async def _guarded_step(self) -> None:
        """Admit what fits, run a step on the worker, and resolve what finished; an error fails its rows."""
        admitted = self._admit([s for s in self._running if s.live])
        rows = [*self._running, *admitted]
        start = time.perf_counter()
        try:
            await self._in_worker(self._step, admitted)
        except Exception as exc:  # noqa: BLE001 -- any failure must reach the callers, not hang them
            self._fail(rows, exc)
        finally:
            self._counts["busy_s"] += time.perf_counter() - start
        for seq in rows:
            if seq.finish is not None:
                self._resolve(seq)
            elif seq.progress is not None and seq.live and not seq.future.done() and len(seq.output_ids) > seq.reported:
                new = slice(seq.reported, len(seq.output_ids))
                seq.reported = new.stop
                seq.progress(seq.output_ids[new], seq.logprobs[new], seq.versions[new])

    def batch_memory_bytes(self, rows: int, tokens: int) -> int:
        """The most a batch of `rows` rows, each at most `tokens` long, takes (memory.batch_bytes)."""
        return batch_bytes(self._shape, self._dtype_bytes, rows=rows, tokens=tokens, prefill_tokens=PREFILL_TOKENS)

    def _admit(self, live: list[_Sequence]) -> list[_Sequence]:
        """Waiting requests, in order, while the batch has rows free (`max_batch_size`) and, under a memory
        budget, while the batch at its longest (each row's prompt plus token budget) fits it; an empty batch
        always takes one."""
        admitted: list[_Sequence] = []
        longest = max((len(s.prompt) + s.budget for s in live), default=0)
        while self._waiting and len(live) + len(admitted) < self.max_batch_size:
            head = self._waiting[0]
            rows, tokens = len(live) + len(admitted) + 1, max(longest, len(head.prompt) + head.budget)
            budget = self.memory_budget_bytes
            if budget is not None and rows > 1 and self.batch_memory_bytes(rows, tokens) > budget:
                if not self._counts["memory_waits"]:
                    logger.info(
                        "TorchEngine: %d rows decode at once under its memory budget of %.2f GiB (%d B of keys "
                        "and values per token); %d requests wait",
                        rows - 1,
                        budget / 2**30,
                        self.kv_bytes_per_token,
                        len(self._waiting),
                    )
                self._counts["memory_waits"] += 1
                break
            longest = tokens
            admitted.append(self._waiting.popleft())
        self._counts["max_rows"] = max(self._counts["max_rows"], len(live) + len(admitted))
        return admitted

    @torch.inference_mode()
    def _step(self, admitted: list[_Sequence]) -> None:
        """One engine step: drop dead rows, decode the rest by one token, prefill and merge the admitted, then
        drop (and cache) the rows that finished."""
        self._drop_dead_rows()
        if self._running:
            self._decode()
        admitted = [s for s in admitted if s.live]
        if admitted:
            self._prefill_shared_prefixes(admitted)
            for seq in admitted:
                seq.cached, seq.past = self.prefix_cache.take(seq.request.rid, seq.prompt)
            try:
                kv, mask, logits = self._prefill([(s.prompt[s.cached :], s.past) for s in admitted])
            finally:
                for seq in admitted:
                    seq.past = None
            self._sample(admitted, logits)
            if self._running:
                assert self._cache is not None and self._mask is not None  # a running batch has both
                kv, mask = _merge([(_layers(self._cache), self._mask), (kv, mask)])
            self._cache, self._mask = DynamicCache(kv), mask
            self._running += admitted
        self._drop_dead_rows()

    def _prefill_shared_prefixes(self, admitted: list[_Sequence]) -> None:
        """Prefill once what two or more admitted first turns share beyond what the prefix cache can lend (a GRPO
        group's identical prompt, one env's instructions), and put it in the cache, from which each borrows it.
        Only requests that keep their own prefix count: a rid-less request never adds an entry that could evict one."""
        cache = self.prefix_cache
        if not (cache.share and cache.budget_bytes) or len(admitted) < 2:
            return
        fresh = [s.prompt for s in admitted if s.request.rid and s.keep_prefix and not cache.holds(s.request.rid)]
        for prefix in shared_prefixes(fresh, minimum=MIN_SHARED_PREFIX):  # shortest first: each builds on the last
            cached, past = cache.borrow(prefix, limit=len(prefix))
            if cached == len(prefix):
                continue  # the cache lends all of it already
            kv, _, _ = self._prefill([(prefix[cached:], past)])
            self._shared_entries += 1
            cache.put(f"\0shared-{self._shared_entries}", prefix, [(k[0], v[0]) for k, v in kv])

    def _decode(self) -> None:
        """Feed every row its last sampled token and sample the next one."""
        ids = torch.tensor([[s.output_ids[-1]] for s in self._running], device=self.device)
        assert self._cache is not None and self._mask is not None  # a running batch has both
        positions = self._mask.sum(-1, keepdim=True)
        self._mask = F.pad(self._mask, (0, 1), value=1)
        logits = self._forward(ids, self._mask, positions, self._cache)
        self._counts["decode_steps"] += 1
        self._sample(self._running, logits)

    def _prefill(self, rows: list[tuple[list[int], KV | None]]) -> tuple[KV, torch.Tensor, torch.Tensor]:
        """Run new tokens through the model on top of each row's cached keys and values (or none), in
        left-padded groups; return their merged, compacted cache, mask and last logits."""
        parts, logits = [], []
        for group in _groups(rows, PREFILL_TOKENS):
            cached = [_length(past) for _, past in group]
            past_width, width = max(cached), max(len(new) for new, _ in group)
            ids = torch.tensor([[0] * (width - len(new)) + new for new, _ in group], device=self.device)  # pad: masked
            mask = torch.tensor(
                [
                    [0] * (past_width - c) + [1] * c + [0] * (width - len(new)) + [1] * len(new)
                    for c, (new, _) in zip(cached, group, strict=True)
                ],
                device=self.device,
            )
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past_width:]
            cache = DynamicCache(_stack_past(group, past_width)) if past_width else DynamicCache()
            logits.append(self._forward(ids, mask, positions, cache))
            kv = _layers(cache)
            parts.append(_compact(kv, mask) if past_width else (kv, mask))
            self._counts["prefill_tokens"] += sum(len(new) for new, _ in group)
            self._counts["reused_tokens"] += sum(cached)
        kv, mask = _merge(parts)
        return kv, mask, torch.cat(logits)

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """The model's own forward on new tokens, extending the cache; fp32 logits at each row's last position."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        return out.logits[:, -1].float()

    def _sample(self, seqs: list[_Sequence], logits: torch.Tensor) -> None:
        """Pick each row's next token (greedy or seeded sampling) and record it with its logprob and version."""
        params = [s.request.sampling for s in seqs]
        logits = _add_logit_bias(logits, params)
        temperatures = [p.temperature if s.generator is not None else 1.0 for p, s in zip(params, seqs, strict=True)]
        logprobs = torch.log_softmax(logits / torch.tensor(temperatures, device=logits.device)[:, None], dim=-1)
        tokens = logits.argmax(-1)
        rows = [i for i, s in enumerate(seqs) if s.generator is not None]
        if rows:
            probs = _truncate(logprobs[rows].exp(), [params[i] for i in rows])
            tokens[rows] = _draw(probs, [_token_generator(seqs[i]) for i in rows])
        chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
        for seq, token, logprob in zip(seqs, tokens.tolist(), chosen.tolist(), strict=True):
            seq.output_ids.append(token)
            seq.logprobs.append(logprob)
            seq.versions.append(self._version)
            seq.finish = self._finish_reason(seq)
        self._counts["generated_tokens"] += len(seqs)

    # ---- batch bookkeeping ------------------------------------------------------------------------------------------

    def _reset_batch(self) -> None:
        self._running, self._cache, self._mask = [], None, None

    def _drop_dead_rows(self) -> None:
        """Keep finished rows' keys and values for their next turn, remove finished, aborted and cancelled
        rows, then cut columns that are padding in every row."""
        keep = [i for i, s in enumerate(self._running) if s.live]
        if len(keep) == len(self._running):
            return
        assert self._cache is not None and self._mask is not None  # a running batch has both
        for i, seq in enumerate(self._running):
            if seq.finish is not None and seq.finish.type != "abort" and not seq.cancelled:
                self._keep_prefix(i, seq)
        if not keep:
            self._reset_batch()
            return
        rows = torch.tensor(keep, device=self.device)
        mask = self._mask[rows]
        start = int(mask.any(0).int().argmax())  # first column some row still uses
        self._cache = DynamicCache([(k[rows, :, start:], v[rows, :, start:]) for k, v in _layers(self._cache)])
        self._mask = mask[:, start:]
        self._running = [self._running[i] for i in keep]

    def _keep_prefix(self, row: int, seq: _Sequence) -> None:
        """Put a finished row's keys and values (prompt + output less its unfed last token) in the prefix cache."""
        assert self._cache is not None and self._mask is not None  # called on a running batch
        length = int(self._mask[row].sum())
        tokens = seq.prompt + seq.output_ids[:-1]
        if seq.request.rid and seq.keep_prefix and self.prefix_cache.budget_bytes and len(tokens) == length:
            self.prefix_cache.put(
                seq.request.rid, tokens, [(k[row, :, -length:], v[row, :, -length:]) for k, v in _layers(self._cache)]
            )

    def _load_weights(self, source: str | os.PathLike | Mapping[str, torch.Tensor]) -> None:
        """Copy new weights into the model's own tensors, after checking them all."""
        state = _read_state_dict(source)
        _check_state_dict(self.model, state)
        with torch.no_grad():
            self.model.load_state_dict(state, strict=False)

    @torch.inference_mode()
    def _rebuild_cache(self) -> None:
        """Re-prefill in-flight rows with the current weights; each row's last sampled token stays unfed."""
        self._drop_dead_rows()
        if self._running:
            kv, self._mask, _ = self._prefill([(s.prompt + s.output_ids[:-1], None) for s in self._running])
            self._cache = DynamicCache(kv)


# ---- helpers --------------------------------------------------------------------------------------------------------


def cache_kwarg(model: Any) -> str:
    """The name the model's forward takes its KV cache by: `cache` (Transformers 5.2x on; the old `past_key_values`
    still works there but warns, a FutureWarning on every forward) or, before, `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _default_budget(device: torch.device, prefix_cache_bytes: int) -> int | None:
    """A CPU engine's memory budget: MEMORY_FRACTION of the available host memory less the prefix cache's budget;
    None (no bound) on other devices or where the available memory cannot be read.

    What earlier stages of this process freed goes back to the OS first (`memory_after_release`): an evaluation after
    RL in one process otherwise holds the learner's freed heap beside its own batch (SmolLM2's long-horizon eval
    after RL peaked at 22.8 GB on a 24 GB machine, the same eval before RL at 16.7)."""
    if device.type != "cpu":
        return None
    found = memory_after_release()
    if found is None:
        return None
    budget = max(int(found[0] * MEMORY_FRACTION) - prefix_cache_bytes, 0)
    logger.info("TorchEngine: batch memory budget %.2f GiB (%s)", budget / 2**30, found[1])
    return budget


def _as_ids(value: int | list[int] | None) -> list[int]:
    """An eos id setting (None, one id or several) as a list."""
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


def _token_generator(seq: _Sequence) -> torch.Generator:
    """The request's own random stream, or for a seeded request one keyed by (seed, position).

    Keying by position (as SGLang's sampling_seed does) makes a seeded request reproducible even when it
    is resubmitted as prompt + partial output after an abort.
    """
    seed = seq.request.sampling.seed
    if seed is None:
        assert seq.generator is not None  # a sampled (not greedy) row has one
        return seq.generator
    position = len(seq.prompt) + len(seq.output_ids)
    state = np.random.SeedSequence((seed % 2**64, position)).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


def _add_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Logits with each row's logit_bias added (a copy; the input is returned when no row has a bias)."""
    rows = [i for i, p in enumerate(params) if p.logit_bias]
    if not rows:
        return logits
    logits = logits.clone()
    for i in rows:
        ids, biases = zip(*params[i].logit_bias, strict=True)
        logits[i, list(ids)] += torch.tensor(biases, dtype=logits.dtype, device=logits.device)
    return logits


def _response(seq: _Sequence, finish: FinishReason, text: str) -> GenerateResponse:
    return GenerateResponse(
        output_ids=list(seq.output_ids),
        logprobs=list(seq.logprobs),
        versions=list(seq.versions),
        finish_reason=finish,
        prompt_tokens=len(seq.prompt),
        text=text,
        rid=seq.request.rid,
    )


def _groups(rows: list[tuple[list[int], KV | None]], budget: int) -> list[list[tuple[list[int], KV | None]]]:
    """Split (new tokens, cached KV) rows, in order, into groups whose left-padded size (rows x (longest cached +
    longest new)) stays within budget."""
    groups: list[list[tuple[list[int], KV | None]]] = []
    current: list[tuple[list[int], KV | None]] = []
    past, width = 0, 0
    for new, kv in rows:
        new_past, new_width = max(past, _length(kv)), max(width, len(new))
        if current and (new_past + new_width) * (len(current) + 1) > budget:
            groups.append(current)
            current, new_past, new_width = [], _length(kv), len(new)
        current.append((new, kv))
        past, width = new_past, new_width
    return [*groups, current]


def _length(kv: KV | None) -> int:
    """Tokens in one sequence's cached keys and values (kv_heads, length, head_dim) per layer; 0 for none."""
    return 0 if kv is None else kv[0][0].shape[-2]


def _stack_past(group: list[tuple[list[int], KV | None]], width: int) -> KV:
    """One batch of cached keys and values, each row left-padded to `width` (zeros where a row has none)."""
    layers = []
    some = next(kv for _, kv in group if kv is not None)
    for layer, (k0, v0) in enumerate(some):
        keys, values = [], []
        for _, kv in group:
            k, v = kv[layer] if kv is not None else (k0[:, :0], v0[:, :0])
            keys.append(F.pad(k, (0, 0, width - k.shape[-2], 0)))
            values.append(F.pad(v, (0, 0, width - v.shape[-2], 0)))
        layers.append((torch.stack(keys), torch.stack(values)))
    return layers


def _compact(kv: KV, mask: torch.Tensor) -> tuple[KV, torch.Tensor]:
    """Move each row's padding holes (between cached and new tokens) to its left, then cut all-padding columns."""
    order = torch.sort(mask, dim=1, stable=True).indices  # padding first, real tokens in their order after it
    start = mask.shape[1] - int(mask.sum(1).max())
    order = order[:, start:]
    index = order[:, None, :, None]
    kv = [
        (
            k.gather(2, index.expand(-1, k.shape[1], -1, k.shape[3])),
            v.gather(2, index.expand(-1, v.shape[1], -1, v.shape[3])),
        )
        for k, v in kv
    ]
    return kv, mask.gather(1, order)


def _layers(cache: DynamicCache) -> KV:
    return [(keys, values) for keys, values, _ in cache]


def _merge(parts: list[tuple[KV, torch.Tensor]]) -> tuple[KV, torch.Tensor]:
    """Stack batches of caches and masks along the batch, left-padding each to the longest length."""
    length = max(mask.shape[1] for _, mask in parts)
    masks = torch.cat([F.pad(mask, (length - mask.shape[1], 0)) for _, mask in parts])
    kv = []
    for layer in zip(*(layers for layers, _ in parts), strict=True):
        keys = torch.cat([F.pad(k, (0, 0, length - k.shape[2], 0)) for k, _ in layer])
        values = torch.cat([F.pad(v, (0, 0, length - v.shape[2], 0)) for _, v in layer])
        kv.append((keys, values))
    return kv, masks


def _truncate(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Zero probabilities outside each row's top-k, top-p and min-p sets (SGLang: all on the full distribution)."""
    vocab = probs.shape[-1]
    top_k = [p.top_k if p.top_k > 0 else vocab for p in params]
    top_p = [p.top_p for p in params]
    min_p = [p.min_p for p in params]
    if min(top_k) == vocab and min(top_p) >= 1.0 and max(min_p) <= 0.0:
        return probs

    def column(values: Sequence[float]) -> torch.Tensor:
        return torch.tensor(values, device=probs.device, dtype=probs.dtype)[:, None]

    sorted_probs, order = probs.sort(dim=-1, descending=True)
    drop = torch.arange(vocab, device=probs.device) >= column(top_k)
    drop |= sorted_probs.cumsum(-1) - sorted_probs > column(top_p)
    drop |= sorted_probs < sorted_probs[:, :1] * column(min_p)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))


def _draw(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """Inverse-CDF sampling with one uniform per row from that row's own (CPU) generator.

    One tiny draw per row keeps each request's randomness independent of its batch and of the device,
    and costs far less than a multinomial call per row.
    """
    uniforms = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators]).to(probs.device)
    cdf = probs.double().cumsum(-1)
    tokens = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).squeeze(-1)
    return tokens.clamp(max=probs.shape[-1] - 1)


def _read_state_dict(source: str | os.PathLike | Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
    """A state dict as given, or read from the safetensors files of a saved HF model directory."""
    if isinstance(source, Mapping):
        return source
    files = sorted(Path(source).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {source}")
    return {name: tensor for file in files for name, tensor in load_file(file).items()}


def _check_state_dict(model: PreTrainedModel, state: Mapping[str, torch.Tensor]) -> None:
    """Refuse, before touching any weight, a state dict with unknown keys, wrong shapes, untied missing keys or
    non-finite values (the model's own tensors, as a relabel or a partial update passes them, are not re-read)."""
    own = model.state_dict()
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise KeyError(f"unexpected weights: {unknown[:5]}")
    wrong = [name for name, tensor in state.items() if tensor.shape != own[name].shape]
    if wrong:
        raise ValueError(f"shape mismatch for weights: {wrong[:5]}")
    loaded = {own[name].data_ptr() for name in state}
    missing = [name for name in own if name not in state and own[name].data_ptr() not in loaded]  # tied ones are fine
    if missing:
        raise KeyError(f"missing weights: {missing[:5]}")
    bad = _nonfinite((name, tensor) for name, tensor in state.items() if tensor.data_ptr() != own[name].data_ptr())
    if bad:
        raise ValueError(f"non-finite values (NaN or Infinity) in weights: {bad[:5]}")


def _nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of floating-point tensors holding a NaN or an infinity."""
    return [name for name, tensor in named if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
