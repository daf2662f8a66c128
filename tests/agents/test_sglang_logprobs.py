"""SGLang's `top_logprobs_num` and `logprob_start_len` on `serve model`'s /generate, as verl's HTTP adapter sends them:
the answer decodes with SGLang 0.5.23's own contract module, has SGLang's shape (`input_token_logprobs` from the
start, its first logprob null; `input_top_logprobs`; `output_top_logprobs` per reply token), and every value is the
model's own log-softmax; the stream's events carry the same; a start past the prompt is refused as SGLang does."""

import json

import pytest
import torch

from tests.agents.servers import PROMPT, post
from tests.agents.sglang_contract import require_contract
from tests.agents.test_serve_streaming import stream_generate

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOP = 4


def verl_adapter_body(temperature: float, **extra) -> dict:
    """A /generate body as verl's AsyncHttpServerAdapter.generate builds it (None values filtered out), with the
    log-prob fields a reference-log-prob pass asks for."""
    payload = {
        "sampling_params": {
            "temperature": temperature,
            "top_p": 1.0,
            "top_k": -1,
            "repetition_penalty": 1.0,
            "max_new_tokens": 6,
            "ignore_eos": True,
        },
        "input_ids": PROMPT,
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": TOP,
        "return_text_in_logprobs": True,
        "image_data": None,
        "lora_path": None,
        **extra,
    }
    return {k: v for k, v in payload.items() if v is not None}


def log_softmax(model, ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    """The model's own log-softmax at every position of `ids` (row p: the distribution of token p + 1)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits / temperature, -1)


def top_of(row: torch.Tensor, k: int) -> list[tuple[float, int]]:
    values, ids = torch.sort(row, descending=True, stable=True)
    return list(zip(values[:k].tolist(), ids[:k].tolist(), strict=True))


def assert_rows(got: list, want: list[tuple[float, int]], tokenizer) -> None:
    assert [e[1] for e in got] == [t for _, t in want]
    assert [e[0] for e in got] == pytest.approx([v for v, _ in want], abs=1e-4)
    assert [e[2] for e in got] == [tokenizer.decode([t]) for _, t in want]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
async def test_verl_adapter_request_gets_top_and_input_logprobs_equal_to_the_models_log_softmax(
    server, http, model, tokenizer, temperature
):
    url, _ = server
    status, out = await post(http, url, "/generate", verl_adapter_body(temperature))
    assert status == 200, out
    require_contract().decode_GenerateResponse(out)  # SGLang 0.5.23's own decoder accepts it
    meta, ids = out["meta_info"], out["output_ids"]
    raw = log_softmax(model, PROMPT + ids[:-1])
    # input: one entry per prompt token from logprob_start_len 0, the first without a logprob (SGLang's None)
    assert [e[1] for e in meta["input_token_logprobs"]] == PROMPT and meta["input_token_logprobs"][0][0] is None
    want = raw[: len(PROMPT) - 1].gather(-1, torch.tensor(PROMPT[1:])[:, None])[:, 0].tolist()
    assert [e[0] for e in meta["input_token_logprobs"][1:]] == pytest.approx(want, abs=1e-4)
    assert len(meta["input_top_logprobs"]) == len(PROMPT) and meta["input_top_logprobs"][0] is None
    for p, row in enumerate(meta["input_top_logprobs"][1:]):
        assert_rows(row, top_of(raw[p], TOP), tokenizer)
    # output: the top-k of the distribution each token was drawn from (greedy: the raw logits)
    scaled = log_softmax(model, PROMPT + ids[:-1], temperature if temperature > 0 else 1.0)
    assert len(meta["output_top_logprobs"]) == len(ids) == len(meta["output_token_logprobs"])
    for j, row in enumerate(meta["output_top_logprobs"]):
        assert_rows(row, top_of(scaled[len(PROMPT) - 1 + j], TOP), tokenizer)
        sampled = meta["output_token_logprobs"][j]
        assert sampled[0] == pytest.approx(scaled[len(PROMPT) - 1 + j, sampled[1]].item(), abs=1e-4)
        if temperature == 0:
            assert row[0][1] == sampled[1]  # greedy took the top token


async def test_a_start_inside_the_prompt_and_past_it(server, http, model):
    url, _ = server
    body = verl_adapter_body(0.0, logprob_start_len=3, top_logprobs_num=0)
    body["sampling_params"]["max_new_tokens"] = 2
    status, out = await post(http, url, "/generate", body)
    assert status == 200, out
    entries = out["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == PROMPT[3:] and entries[0][0] is None  # SGLang's first entry: null
    assert entries[1][0] == pytest.approx(log_softmax(model, PROMPT)[3, PROMPT[4]].item(), abs=1e-4)
    assert "output_top_logprobs" not in out["meta_info"]
    status, out = await post(http, url, "/generate", {**body, "logprob_start_len": len(PROMPT) + 1})
    assert status == 400 and "is higher than the number of input tokens" in out["error"]["message"]
    status, out = await post(http, url, "/generate", {**body, "top_logprobs_num": 10**7})
    assert status == 400 and "top_logprobs_num" in out["error"]["message"]
    status, out = await post(http, url, "/generate", {**body, "logprob_start_len": -1, "top_logprobs_num": 2})
    assert status == 200 and out["meta_info"]["input_token_logprobs"] == []  # -1: no input log-probs, as SGLang


async def test_the_stream_carries_them_and_its_last_event_is_the_answer(server, http):
    url, _ = server
    body = verl_adapter_body(0.0)
    status, whole = await post(http, url, "/generate", body)
    events = await stream_generate(http, url, body)
    assert events[-1] == "[DONE]"
    for event in events[:-1]:
        meta = event["meta_info"]
        assert len(meta["output_top_logprobs"]) == len(event["output_ids"]) == len(meta["output_token_logprobs"])
        assert len(meta["input_token_logprobs"]) == len(PROMPT)
        require_contract().decode_GenerateResponse(json.loads(json.dumps(event)))
    last = events[-2]["meta_info"]
    for key in ("input_token_logprobs", "input_top_logprobs", "output_top_logprobs"):
        assert last[key] == whole["meta_info"][key]
