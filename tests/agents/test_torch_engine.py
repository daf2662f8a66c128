"""TorchEngine against the real tiny model: exact logprobs, batch-invariant greedy, finish reasons, updates."""

import asyncio
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from searchgym.agents.engines.detokenize import StopStrings
from searchgym.agents.engines.torch_engine import EngineLimits, TorchEngine
from searchgym.agents.engines.types import FinishReason, GenerateRequest, InferenceEngine, SamplingParams

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
QUESTIONS = [
    "Where was Krimar Therth born?",
    "<search> Ganin Brewery founder </search>",
    "Who wrote it?",
    "<think> The river flows through two countries, so I should search for both of them. </think>",
]


@pytest.fixture
async def engine(tiny_model_dir):
    engine = TorchEngine(tiny_model_dir)
    yield engine
    await engine.close()


def prompt(tokenizer, i: int) -> list[int]:
    """A chat prompt; its length cycles through seven sizes with i."""
    content = " ".join(QUESTIONS[j % len(QUESTIONS)] for j in range(i % 7 + 1))
    messages = [{"role": "user", "content": f"Question {i}: {content}"}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]


def teacher_logprobs(model, prompt_ids: list[int], output_ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    """What the learner computes: log softmax(logits / T) of each output token, teacher-forced in fp32."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + output_ids])).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(output_ids)[:, None]).squeeze(-1)


def reference_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    """Exactly n greedy tokens from Hugging Face's own `generate`."""
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(prompt_ids) :].tolist()


async def wait_for_tokens(engine: TorchEngine, n: int) -> None:
    """Poll until the engine has generated at least n tokens in total."""
    while engine.stats()["generated_tokens"] < n:
        await asyncio.sleep(0.001)


def perturbed(model) -> dict[str, torch.Tensor]:
    """The model's parameters plus seeded noise: a visibly different policy (tied lm_head left out, as tied)."""
    noise = torch.Generator().manual_seed(7)
    return {name: p.detach() + 0.05 * torch.randn(p.shape, generator=noise) for name, p in model.named_parameters()}


def load_perturbed(model, tiny_model_dir):
    """A fresh copy of the tiny model carrying `perturbed(model)`."""
    new_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    missing, unexpected = new_model.load_state_dict(perturbed(model), strict=False)
    assert missing == ["lm_head.weight"] and not unexpected
    return new_model


def test_satisfies_the_protocol(tiny_model_dir):
    assert isinstance(TorchEngine(tiny_model_dir), InferenceEngine)


async def test_generating_warns_nothing_about_past_key_values(engine, tokenizer):
    """Transformers 5.2x renamed a forward's `past_key_values` to `cache` and warns (a FutureWarning and a stray
    `return forward_call(*args, **kwargs)` line) on every forward given the old name: the tests printed it hundreds
    of times. The engine passes its KV cache by the name the model's forward takes: prefill, decode and a prefill
    on a reused prefix warn nothing."""
    first = prompt(tokenizer, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done = await engine.agenerate(GenerateRequest(first, GREEDY, rid="episode"))
        await engine.agenerate(GenerateRequest(first + done.output_ids + first[-4:], GREEDY, rid="episode"))
    assert engine.stats()["reused_tokens"] > 0  # the second request prefilled on top of the first one's cache
    assert [str(w.message) for w in caught if "past_key_values" in str(w.message)] == []


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_logprobs_match_teacher_forcing(engine, model, tokenizer, temperature):
    params = SamplingParams(max_new_tokens=32, temperature=temperature, ignore_eos=True)
    prompts = [prompt(tokenizer, i) for i in range(6)]
    responses = await asyncio.gather(*(engine.agenerate(GenerateRequest(p, params)) for p in prompts))
    for p, r in zip(prompts, responses, strict=True):
        assert len(r.output_ids) == 32 and r.versions == [0] * 32 and r.prompt_tokens == len(p)
        expected = teacher_logprobs(model, p, r.output_ids, temperature)
        assert torch.allclose(torch.tensor(r.logprobs), expected, atol=1e-4, rtol=0)


async def test_greedy_is_batch_invariant_and_matches_generate(engine, model, tokenizer):
    prompts = [prompt(tokenizer, i) for i in range(16)]
    assert len({len(p) for p in prompts}) > 5
    alone = [(await engine.agenerate(GenerateRequest(p, GREEDY))).output_ids for p in prompts]
    batched = await asyncio.gather(*(engine.agenerate(GenerateRequest(p, GREEDY)) for p in prompts))
    assert [r.output_ids for r in batched] == alone
    assert alone == [reference_greedy(model, p, GREEDY.max_new_tokens) for p in prompts]
    assert len({tuple(a) for a in alone}) > 1
    for p, r in zip(prompts, batched, strict=True):
        assert torch.allclose(torch.tensor(r.logprobs), teacher_logprobs(model, p, r.output_ids), atol=1e-4, rtol=0)


async def test_many_requests_join_while_others_decode(tiny_model_dir, tokenizer):
    engine = TorchEngine(tiny_model_dir, limits=EngineLimits(max_batch_size=8))

    async def staggered(i: int):
        while engine.stats()["decode_steps"] < i // 2:  # two arrivals per decode step, however fast the box is
            await asyncio.sleep(0.001)
        params = SamplingParams(max_new_tokens=4 + i % 13, temperature=1.0, ignore_eos=True)
        return await engine.agenerate(GenerateRequest(prompt(tokenizer, i), params, rid=str(i)))

    responses = await asyncio.gather(*(staggered(i) for i in range(40)))
    assert [r.rid for r in responses] == [str(i) for i in range(40)]
    assert [len(r.output_ids) for r in responses] == [4 + i % 13 for i in range(40)]
    assert all(r.finish_reason == FinishReason("length", len(r.output_ids)) for r in responses)
    stats = engine.stats()
    assert stats["running"] == stats["waiting"] == 0
    assert stats["decode_steps"] < stats["generated_tokens"] / 3  # steps were shared by several requests
    await engine.close()


async def test_finish_reasons(engine, model, tokenizer):
    p = prompt(tokenizer, 3)
    greedy = reference_greedy(model, p, 24)
    length = await engine.agenerate(GenerateRequest(p, GREEDY))
    assert length.finish_reason == FinishReason("length", 24) and length.text == tokenizer.decode(greedy)

    stop_id = greedy[10]
    cut = greedy.index(stop_id) + 1
    by_id = await engine.agenerate(GenerateRequest(p, SamplingParams(**{**vars(GREEDY), "stop_token_ids": (stop_id,)})))
    assert by_id.output_ids == greedy[:cut] and by_id.finish_reason == FinishReason("stop", stop_id)

    stop = tokenizer.decode(greedy[8:10])[-3:]
    cut = next(j for j in range(1, 25) if stop in tokenizer.decode(greedy[:j]))
    by_text = await engine.agenerate(GenerateRequest(p, SamplingParams(**{**vars(GREEDY), "stop": ("zzzz", stop)})))
    assert by_text.output_ids == greedy[:cut] and by_text.finish_reason == FinishReason("stop", stop)
    assert by_text.text == tokenizer.decode(greedy[:cut]) and stop in by_text.text  # kept, not trimmed

    engine.eos_ids = frozenset({greedy[5]})
    by_eos = await engine.agenerate(GenerateRequest(p, GREEDY))
    assert by_eos.output_ids == greedy[: greedy.index(greedy[5]) + 1]
    assert by_eos.finish_reason == FinishReason("stop", greedy[5])
    ignored = await engine.agenerate(GenerateRequest(p, SamplingParams(**{**vars(GREEDY), "ignore_eos": True})))
    assert ignored.output_ids == greedy


async def test_context_limit(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.config.max_position_embeddings = 40
    engine = TorchEngine(model, tokenizer)
    p = prompt(tokenizer, 0)
    near = await engine.agenerate(GenerateRequest(p, SamplingParams(max_new_tokens=100, temperature=0.0)))
    assert len(p) + len(near.output_ids) == 40 and near.finish_reason == FinishReason("length", 40 - len(p))
    over = await engine.agenerate(GenerateRequest(list(range(41)), GREEDY))
    assert over.output_ids == [] and over.finish_reason.type == "length" and over.finish_reason.matched == 0
    await engine.close()


async def test_bad_requests_raise(engine):
    with pytest.raises(ValueError, match="empty"):
        await engine.agenerate(GenerateRequest([], GREEDY))
    with pytest.raises(ValueError, match="input_ids"):
        await engine.agenerate(GenerateRequest([1, 5000], GREEDY))


async def test_weight_update_mid_generation(engine, model, tokenizer, tiny_model_dir):
    prompts = [prompt(tokenizer, i) for i in range(3)]
    params = [SamplingParams(max_new_tokens=60, temperature=t, ignore_eos=True) for t in (0.0, 1.0, 0.7)]
    tasks = [asyncio.create_task(engine.agenerate(GenerateRequest(p, s))) for p, s in zip(prompts, params, strict=True)]
    await wait_for_tokens(engine, 15)
    await engine.update_weights(perturbed(model), version=1)
    assert engine.version == 1
    responses = await asyncio.gather(*tasks)
    new_model = load_perturbed(model, tiny_model_dir)
    for p, s, r in zip(prompts, params, responses, strict=True):
        switch = r.versions.index(1)
        assert 0 < switch < 60 and r.versions == [0] * switch + [1] * (60 - switch)
        t = s.temperature or 1.0  # greedy logprobs are at temperature 1
        old, new = teacher_logprobs(model, p, r.output_ids, t), teacher_logprobs(new_model, p, r.output_ids, t)
        got = torch.tensor(r.logprobs)
        assert torch.allclose(got[:switch], old[:switch], atol=1e-4, rtol=0)
        assert torch.allclose(got[switch:], new[switch:], atol=1e-4, rtol=0)
        assert (old[switch:] - new[switch:]).abs().max() > 1e-2  # the update is visible


async def test_weight_update_from_a_directory_while_paused(engine, model, tokenizer, tiny_model_dir, tmp_path):
    new_model = load_perturbed(model, tiny_model_dir)
    new_model.save_pretrained(tmp_path)
    await engine.pause()
    await engine.update_weights(tmp_path, version=5)  # applies at once, no step needed
    assert engine.version == 5
    await engine.resume()
    p = prompt(tokenizer, 1)
    r = await engine.agenerate(GenerateRequest(p, GREEDY))
    assert r.versions == [5] * 24 and r.output_ids == reference_greedy(new_model, p, 24)


async def test_bad_weights_are_refused_before_loading(engine, model):
    weights = dict(model.state_dict())
    weights["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        await engine.update_weights(weights, version=1)
    with pytest.raises(KeyError, match="unexpected"):
        await engine.update_weights({"nope": torch.zeros(1)}, version=1)
    assert engine.version == 0
    assert all(
        torch.equal(a, b) for a, b in zip(engine.model.state_dict().values(), model.state_dict().values(), strict=True)
    )


async def test_pause_resume_loses_nothing(engine, model, tokenizer):
    p = prompt(tokenizer, 2)
    params = SamplingParams(max_new_tokens=60, temperature=0.0, ignore_eos=True)
    task = asyncio.create_task(engine.agenerate(GenerateRequest(p, params)))
    await wait_for_tokens(engine, 10)
    await engine.pause()
    frozen = engine.stats()["generated_tokens"]
    await asyncio.sleep(0.05)
    assert engine.stats()["generated_tokens"] == frozen and engine.stats()["paused"] and not task.done()
    await engine.resume()
    assert (await task).output_ids == reference_greedy(model, p, 60)


async def test_abort_then_resubmit_completes_the_same(engine, model, tokenizer):
    p = prompt(tokenizer, 4)
    params = SamplingParams(max_new_tokens=60, temperature=0.0, ignore_eos=True)
    task = asyncio.create_task(engine.agenerate(GenerateRequest(p, params, rid="a")))
    other = asyncio.create_task(engine.agenerate(GenerateRequest(p, params, rid="b")))
    await wait_for_tokens(engine, 10)
    assert await engine.abort("a") == 1
    partial = await task
    assert partial.finish_reason.type == "abort" and 0 < len(partial.output_ids) < 60 and partial.rid == "a"
    rest = SamplingParams(max_new_tokens=60 - len(partial.output_ids), temperature=0.0, ignore_eos=True)
    resumed = await engine.agenerate(GenerateRequest(p + partial.output_ids, rest))
    expected = reference_greedy(model, p, 60)
    assert partial.output_ids + resumed.output_ids == expected
    assert (await other).output_ids == expected
    assert await engine.abort() == 0


async def test_same_seed_same_samples(tiny_model_dir, tokenizer):
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, top_k=50, min_p=0.01, ignore_eos=True)

    async def run(seed: int) -> list[list[int]]:
        engine = TorchEngine(tiny_model_dir, seed=seed)
        out = await asyncio.gather(*(engine.agenerate(GenerateRequest(prompt(tokenizer, i), params)) for i in range(4)))
        await engine.close()
        return [r.output_ids for r in out]

    first = await run(3)
    assert first == await run(3)
    assert first != await run(4)
    assert len({tuple(o) for o in first}) == 4


async def test_top_k_one_is_greedy(engine, model, tokenizer):
    p = prompt(tokenizer, 5)
    r = await engine.agenerate(GenerateRequest(p, SamplingParams(max_new_tokens=16, temperature=1.0, top_k=1)))
    assert r.output_ids == reference_greedy(model, p, 16)
    assert torch.allclose(torch.tensor(r.logprobs), teacher_logprobs(model, p, r.output_ids), atol=1e-4, rtol=0)


async def test_cancelling_one_request_spares_the_others(engine, model, tokenizer):
    prompts = [prompt(tokenizer, i) for i in range(3)]
    params = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
    tasks = [asyncio.create_task(engine.agenerate(GenerateRequest(p, params))) for p in prompts]
    await wait_for_tokens(engine, 10)
    tasks[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    for i in (0, 2):
        assert (await tasks[i]).output_ids == reference_greedy(model, prompts[i], 40)
    assert engine.stats()["running"] == 0


async def test_a_failing_step_fails_its_requests_then_recovers(engine, tokenizer, monkeypatch):
    p = prompt(tokenizer, 0)
    forward, calls = engine._forward, []

    def breaks_on_fourth_call(*args):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("device on fire")
        return forward(*args)

    with monkeypatch.context() as patch:
        patch.setattr(engine, "_forward", breaks_on_fourth_call)
        requests = [engine.agenerate(GenerateRequest(p, GREEDY)) for _ in range(2)]
        outcomes = await asyncio.wait_for(asyncio.gather(*requests, return_exceptions=True), timeout=10)
    assert [str(o) for o in outcomes] == ["device on fire"] * 2
    assert engine.stats()["running"] == 0
    assert len((await engine.agenerate(GenerateRequest(p, GREEDY))).output_ids) == 24


async def test_closed_engine_refuses_work(tiny_model_dir, tokenizer):
    engine = TorchEngine(tiny_model_dir)
    params = SamplingParams(max_new_tokens=500, ignore_eos=True)
    task = asyncio.create_task(engine.agenerate(GenerateRequest(prompt(tokenizer, 0), params)))
    await wait_for_tokens(engine, 2)
    await engine.close()
    assert (await task).finish_reason.type == "abort"
    with pytest.raises(RuntimeError, match="closed"):
        await engine.agenerate(GenerateRequest([1, 2, 3], GREEDY))


def first_stop_by_tail_decoding(tokenizer, ids: list[int], stops: tuple[str, ...]) -> tuple[int, str] | None:
    """The engine's former rule, kept as the reference: after each token, decode the last 4n+4 tokens (n: the
    longest stop's length) and return the first stop string, in `stops` order, found in that text."""
    window = 4 * max(map(len, stops)) + 4
    for j in range(1, len(ids) + 1):
        tail = tokenizer.decode(ids[max(0, j - window) : j], skip_special_tokens=False)
        for stop in stops:
            if stop in tail:
                return j, stop
    return None


def first_stop_incrementally(tokenizer, ids: list[int], stops: tuple[str, ...]) -> tuple[int, str] | None:
    matcher = StopStrings(tokenizer, stops)
    for j, token in enumerate(ids, 1):
        if (stop := matcher.push(token)) is not None:
            return j, stop
    return None


TEXT_PIECES = ["héllo", " wörld", "</search>", "日本語", "\n\n", "<|im_end|>", "😀x", " the", "<answer>", "—"]


@st.composite
def ids_and_stops(draw, tokenizer):
    """Generated ids (random vocabulary ids, split multi-byte characters included, or encoded text) and stop
    strings: pieces of their decoded text (so that they match, anywhere) or strings that may not occur."""
    if draw(st.booleans()):
        ids = draw(st.lists(st.integers(0, len(tokenizer) - 1), min_size=1, max_size=60))
    else:
        ids = tokenizer.encode("".join(draw(st.lists(st.sampled_from(TEXT_PIECES), min_size=1, max_size=12))))
    text = tokenizer.decode(ids, skip_special_tokens=False)
    piece = st.builds(lambda a, n: text[a : a + n], st.integers(0, max(len(text) - 1, 0)), st.integers(1, 10))
    stops = draw(
        st.lists(
            st.one_of(piece, st.sampled_from(["zz", "\n", "é", "</search>", "語"])), min_size=1, max_size=3
        ).filter(lambda s: all(s))
    )
    return ids, tuple(stops)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_incremental_stop_strings_finish_where_tail_decoding_did(tokenizer, data):
    ids, stops = data.draw(ids_and_stops(tokenizer))
    expected = first_stop_by_tail_decoding(tokenizer, ids, stops)
    assert first_stop_incrementally(tokenizer, ids, stops) == expected


async def test_stop_strings_end_the_engine_where_tail_decoding_does(engine, model, tokenizer):
    """The engine's finish position and text with stop strings equal the reference rule on its own output."""
    for i in range(4):
        p = prompt(tokenizer, i)
        greedy = reference_greedy(model, p, 40)
        text = tokenizer.decode(greedy, skip_special_tokens=False)
        stops = ("zzzz", text[20 + i : 23 + i], text[30:32])
        j, stop = first_stop_by_tail_decoding(tokenizer, greedy, stops)
        params = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True, stop=stops)
        r = await engine.agenerate(GenerateRequest(p, params))
        assert r.output_ids == greedy[:j] and r.finish_reason == FinishReason("stop", stop)
        assert r.text == tokenizer.decode(greedy[:j], skip_special_tokens=False)


@pytest.mark.parametrize("rows", [3, 1])
async def test_a_memory_budget_caps_the_rows_decoded_at_once(tiny_model_dir, tokenizer, rows):
    """With a budget that holds `rows` rows at their longest, ten requests decode at most that many at once, the rest
    wait in order, and each finishes with the tokens and logprobs it gets from an engine without a bound."""
    p = prompt(tokenizer, 2)
    requests = [
        GenerateRequest(p, SamplingParams(max_new_tokens=12, temperature=1.0, seed=i, ignore_eos=True))
        for i in range(10)
    ]
    free = TorchEngine(tiny_model_dir, limits=EngineLimits(memory_budget_bytes=None))
    expected = await asyncio.gather(*(free.agenerate(r) for r in requests))
    assert free.stats()["max_rows"] == 10 and free.stats()["memory_waits"] == 0
    budget = free.batch_memory_bytes(rows, len(p) + 12)
    bounded = TorchEngine(tiny_model_dir, limits=EngineLimits(memory_budget_bytes=budget))
    responses = await asyncio.gather(*(bounded.agenerate(r) for r in requests))
    stats = bounded.stats()
    assert stats["max_rows"] == rows and stats["memory_waits"] > 0 and stats["memory_budget_bytes"] == budget
    assert stats["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # keys and values x 2 layers x 2 kv heads x 16 dims x fp32
    assert stats["running"] == stats["waiting"] == 0
    for got, want in zip(responses, expected, strict=True):
        assert got.output_ids == want.output_ids and len(got.output_ids) == 12
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-4, rtol=0)
    await free.close()
    await bounded.close()


def test_a_cpu_engine_bounds_its_batch_by_the_available_memory(tiny_model_dir, monkeypatch):
    from searchgym.agents.engines import torch_engine

    monkeypatch.setattr(torch_engine, "memory_after_release", lambda: (10 << 30, "test"))
    engine = TorchEngine(tiny_model_dir, limits=EngineLimits(prefix_cache_bytes=1 << 30))
    assert engine.memory_budget_bytes == int((10 << 30) * torch_engine.MEMORY_FRACTION) - (1 << 30)
    monkeypatch.setattr(torch_engine, "memory_after_release", lambda: None)
    assert TorchEngine(tiny_model_dir).memory_budget_bytes is None  # unknown memory: max_batch_size alone


def test_a_cpu_engines_default_budget_counts_the_heap_earlier_stages_freed(tiny_model_dir, monkeypatch):
    """An evaluation after RL in one process: the learner's freed heap goes back to the OS before the engine reads
    the available memory, so the budget neither counts it as taken nor leaves it held beside the engine's batch."""
    from searchgym.agents.engines import memory

    calls = []
    monkeypatch.setattr(memory, "release_free_heap", lambda: calls.append("release") or True)
    monkeypatch.setattr(memory, "available_memory", lambda: calls.append("read") or (8 << 30, "test"))
    TorchEngine(tiny_model_dir)
    assert calls == ["release", "read"]
