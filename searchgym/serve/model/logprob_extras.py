"""SGLang's `top_logprobs_num` and `logprob_start_len` on `/generate`: the top-k log-probs of each output position
and the prompt's own log-probs from a start index, in SGLang 0.5.23's JSON shape.

The engine returns only each sampled token's log-prob, so these come from one scoring pass of the served model over
the prompt and the reply (the engine's own model and weights, on its worker thread, between its steps): the logits
at each position, as SGLang computes them (srt/layers/logits_processor.py, scheduler_components/
logprob_result_processor.py, srt/layers/sampler.py):

- `input_token_logprobs`: one entry per prompt token from `logprob_start_len` on, `[logprob, token_id, text]`, the
  first one's logprob `null` (SGLang pads with None and drops the last position, which predicts the reply); the
  log-softmax of the raw logits (no temperature). `input_top_logprobs`: the top-k rows at the same positions, the
  first `null`. With `logprob_start_len` -1 (the default) both are empty, as SGLang sets the start to the prompt's
  length; a start past the prompt is refused as SGLang refuses it.
- `output_top_logprobs`: one row of the top-k `[logprob, token_id, text]` per reply token, from the distribution the
  token was sampled from: logit_bias added, divided by the temperature when sampling (greedy: the raw logits), the
  same distribution as the engine's own `output_token_logprobs`.

Rows are sorted by log-prob, highest first (ties: lower token id first). The logits of at most CHUNK_FLOATS floats
are held at once (the forward is repeated per chunk of positions), and one request may ask for at most MAX_ENTRIES
entries (positions x k), so a reply stays bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from searchgym.agents.engines.fields import require
from searchgym.agents.engines.types import GREEDY_TEMPERATURE, SamplingParams

CHUNK_FLOATS = 1 << 24  # logits held at once: positions x vocabulary (64 MiB of fp32)
MAX_ENTRIES = 1 << 20  # top-k entries one request may ask for in all (positions x top_logprobs_num)

Entry = list[Any]  # [logprob | None, token_id, text | None], SGLang's LogprobEntry


@dataclass(frozen=True)
class LogprobAsk:
    """What one /generate item asks for beyond the sampled tokens' log-probs."""

    start: int = -1  # logprob_start_len: -1 none, else the first prompt position with an input log-prob
    top: int = 0  # top_logprobs_num

    @property
    def wanted(self) -> bool:
        return self.start >= 0 or self.top > 0


def check_ask(return_logprob: bool, start: int, top: int, prompt_len: int, vocab_size: int, max_new: int) -> LogprobAsk:
    """The item's ask, checked as SGLang checks it (each error a 400 naming the field); without return_logprob
    both are ignored, as SGLang ignores them."""
    require(start >= -1, f"logprob_start_len must be -1 (none) or a prompt position >= 0, got {start}")
    require(top >= 0, f"top_logprobs_num must be at least 0, got {top}")
    if not return_logprob:
        return LogprobAsk()
    require(
        start <= prompt_len,
        f"logprob_start_len={start} is higher than the number of input tokens {prompt_len}. "
        "Please use a smaller logprob_start_len.",
    )
    require(top <= vocab_size, f"top_logprobs_num={top} is more than the vocabulary ({vocab_size} tokens)")
    input_positions = prompt_len - start if start >= 0 else 0
    require(
        top * (input_positions + max_new) <= MAX_ENTRIES,
        f"top_logprobs_num={top} over {input_positions} prompt and {max_new} reply positions asks for more than "
        f"{MAX_ENTRIES} entries; ask for fewer (top_logprobs_num, logprob_start_len, max_new_tokens)",
    )
    return LogprobAsk(start if start < prompt_len else prompt_len, top)


@dataclass
class LogprobExtras:
    """The computed fields, as token ids and values (text is added when the answer is rendered)."""

    input_logprobs: list[float | None]  # per prompt token from start (first None)
    input_ids: list[int]
    input_top: list[list[tuple[float, int]] | None]  # per prompt token from start (first None); [] unless top > 0
    output_top: list[list[tuple[float, int]]]  # per reply token; [] unless top > 0


def _top(logprobs: torch.Tensor, k: int) -> list[list[tuple[float, int]]]:
    """Each row's top-k (logprob, token id), highest first, ties by lower id (a stable sort)."""
    order = torch.sort(logprobs, dim=-1, descending=True, stable=True)
    values, ids = order.values[:, :k].tolist(), order.indices[:, :k].tolist()
    return [list(zip(v, i, strict=True)) for v, i in zip(values, ids, strict=True)]


@torch.no_grad()
def score(
    model: Any, device: torch.device, prompt: list[int], output: list[int], sampling: SamplingParams, ask: LogprobAsk
) -> LogprobExtras:
    """The extras for one finished (or partial) reply, from the model's own logits (see the module docstring)."""
    n_prompt, n_out = len(prompt), len(output)
    start = ask.start if ask.start >= 0 else n_prompt
    input_positions = list(range(start, n_prompt - 1))  # position p predicts prompt token p + 1
    output_positions = list(range(n_prompt - 1, n_prompt - 1 + n_out)) if ask.top > 0 else []
    positions = input_positions + output_positions
    logits_by_position: dict[int, torch.Tensor] = {}
    if positions:
        sequence = torch.tensor([prompt + output[:-1] if n_out else prompt], device=device)
        vocab = int(model.get_output_embeddings().weight.shape[0])
        chunk = max(1, CHUNK_FLOATS // vocab)
        for i in range(0, len(positions), chunk):
            keep = torch.tensor(positions[i : i + chunk], device=device)
            logits = model(input_ids=sequence, logits_to_keep=keep, use_cache=False).logits[0].float()
            for p, row in zip(positions[i : i + chunk], logits, strict=True):
                logits_by_position[p] = row
    input_logprobs: list[float | None] = [None] if start < n_prompt else []
    input_top: list[list[tuple[float, int]] | None] = [None] if start < n_prompt and ask.top > 0 else []
    if input_positions:
        raw = torch.log_softmax(torch.stack([logits_by_position[p] for p in input_positions]), dim=-1)
        targets = torch.tensor(prompt[start + 1 :], device=raw.device)
        input_logprobs += raw.gather(-1, targets[:, None]).squeeze(-1).tolist()
        if ask.top > 0:
            input_top += _top(raw, ask.top)
    output_top: list[list[tuple[float, int]]] = []
    if output_positions:
        logits = torch.stack([logits_by_position[p] for p in output_positions])
        for token, bias in sampling.logit_bias:
            logits[:, token] += bias
        temperature = sampling.temperature if sampling.temperature >= GREEDY_TEMPERATURE else 1.0
        output_top = _top(torch.log_softmax(logits / temperature, dim=-1), ask.top)
    return LogprobExtras(input_logprobs, prompt[start:], input_top, output_top)


def render(extras: LogprobExtras, ask: LogprobAsk, decode: Any | None) -> dict[str, Any]:
    """The meta_info fields of `extras`; `decode(ids) -> texts` (return_text_in_logprobs) or None (text null)."""

    def texts(ids: list[int]) -> list[str | None]:
        return list(decode([[t] for t in ids])) if decode is not None and ids else [None] * len(ids)

    def rows(top: list[list[tuple[float, int]]]) -> list[list[Entry]]:
        out = []
        for row in top:
            names = texts([t for _, t in row])
            out.append([[lp, t, s] for (lp, t), s in zip(row, names, strict=True)])
        return out

    meta: dict[str, Any] = {
        "input_token_logprobs": [
            [lp, t, s]
            for lp, t, s in zip(extras.input_logprobs, extras.input_ids, texts(extras.input_ids), strict=True)
        ]
    }
    if ask.top > 0:
        meta["input_top_logprobs"] = [None if row is None else rows([row])[0] for row in extras.input_top]
        meta["output_top_logprobs"] = rows(extras.output_top)
    return meta
