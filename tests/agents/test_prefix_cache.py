"""Prefix reuse across an episode's turns in TorchEngine: same tokens and logprobs as a full prefill, only the new
tokens prefilled, an LRU cache that never exceeds its budget, emptied by weight updates, and never leaking or
corrupting rows on abort, cancellation or errors."""

import asyncio
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from searchgym.agents.engines.prefix_cache import PrefixCache
from searchgym.agents.engines.torch_engine import EngineLimits, TorchEngine
from searchgym.agents.engines.types import GenerateRequest, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # a tiny model on a shared 2-core machine

OBSERVATIONS = [
    "<result> Krimar Therth was born in Ostvale, a port town on the northern coast. </result>",
    "<result> No pages matched. </result>",
    "<result> Ganin Brewery was founded in 1841 by Olt Ganin, "
    "whose family ran it for three generations before it was sold. </result>",
]


def first_prompt(tokenizer, i: int) -> list[int]:
    content = f"Question {i}: " + " and ".join(["where was Krimar Therth born"] * (1 + i % 4))
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, return_dict=False
    )


def observation(tokenizer, episode: int, turn: int) -> list[int]:
    return tokenizer.encode(OBSERVATIONS[(episode + turn) % len(OBSERVATIONS)])


def sampling(episode: int, max_new_tokens: int = 12) -> SamplingParams:
    """Greedy for even episodes, seeded sampling (reproducible by position) for odd ones."""
    if episode % 2 == 0:
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, ignore_eos=True, seed=episode)


async def episode(engine: TorchEngine, tokenizer, i: int, turns: int, delay: float = 0.0) -> tuple[list, list]:
    """A TokenWorkflow-shaped episode: each turn's prompt is the last prompt + its output + an observation."""
    await asyncio.sleep(delay)
    ids, responses = first_prompt(tokenizer, i), []
    for turn in range(turns):
        response = await engine.agenerate(GenerateRequest(list(ids), sampling(i), rid=f"episode-{i}"))
        responses.append(response)
        ids = ids + response.output_ids + observation(tokenizer, i, turn)
    return ids, responses


def teacher_logprobs(model, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + output_ids])).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(output_ids)[:, None]).squeeze(-1)


async def run_episodes(engine: TorchEngine, tokenizer, n: int, turns: int) -> list[tuple[list, list]]:
    # staggered starts: turns of different episodes join the batch at different steps, some groups mix
    # rows with a cached prefix and fresh rows
    out = await asyncio.gather(*(episode(engine, tokenizer, i, turns, delay=0.003 * (i % 3)) for i in range(n)))
    await engine.close()
    return out


async def test_reuse_gives_the_full_prefill_result_and_prefills_only_new_tokens(tiny_model_dir, tokenizer, model):
    n, turns = 6, 3
    reused = TorchEngine(tiny_model_dir)
    full = TorchEngine(tiny_model_dir, limits=EngineLimits(prefix_cache_bytes=0))
    with_reuse = await run_episodes(reused, tokenizer, n, turns)
    without = await run_episodes(full, tokenizer, n, turns)
    for (ids_a, turns_a), (ids_b, turns_b) in zip(with_reuse, without, strict=True):
        assert ids_a == ids_b
        for a, b in zip(turns_a, turns_b, strict=True):
            assert a.output_ids == b.output_ids
            # fp32: a prefill over a cached prefix sums in another order than a full one (a few ulps; the
            # property test below measures it on logits up to ~2e-6 relative)
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5)
    # and both are the model's own: the last turn of each episode, teacher-forced over the whole conversation
    for ids, responses in with_reuse:
        last = responses[-1]
        prompt = ids[: last.prompt_tokens]
        assert torch.allclose(
            torch.tensor(last.logprobs), teacher_logprobs(model, prompt, last.output_ids), atol=1e-4, rtol=0
        )

    # what was prefilled: every prompt in full without reuse; with it, the first prompt, then per turn only the
    # observation and the previous turn's last token (sampled, never fed)
    prompts = [r.prompt_tokens for _, responses in with_reuse for r in responses]
    new = sum(
        len(first_prompt(tokenizer, i)) + sum(len(observation(tokenizer, i, t)) + 1 for t in range(turns - 1))
        for i in range(n)
    )
    assert full.stats()["prefill_tokens"] == sum(prompts) and full.stats()["reused_tokens"] == 0
    assert reused.stats()["prefill_tokens"] == new
    assert reused.stats()["reused_tokens"] == sum(prompts) - new


async def test_a_prompt_that_leaves_the_cached_tokens_reuses_their_common_prefix(tiny_model_dir, tokenizer, model):
    engine = TorchEngine(tiny_model_dir)
    p = first_prompt(tokenizer, 1)
    first = await engine.agenerate(GenerateRequest(p, sampling(0), rid="r"))
    edited = p + first.output_ids[:5] + observation(tokenizer, 0, 0)  # the runner cut the turn after 5 tokens
    before = engine.stats()
    second = await engine.agenerate(GenerateRequest(edited, sampling(0), rid="r"))
    after = engine.stats()
    assert after["reused_tokens"] - before["reused_tokens"] == len(p) + 5
    assert after["prefill_tokens"] - before["prefill_tokens"] == len(edited) - len(p) - 5
    assert torch.allclose(
        torch.tensor(second.logprobs), teacher_logprobs(model, edited, second.output_ids), atol=1e-4, rtol=0
    )
    # a different rid, or the same prompt again, never reads another episode's cache
    third = await engine.agenerate(GenerateRequest(edited, sampling(0), rid="other"))
    assert engine.stats()["reused_tokens"] == after["reused_tokens"] and third.output_ids == second.output_ids
    await engine.close()


async def test_lru_eviction_keeps_the_cache_within_its_budget(tiny_model_dir, tokenizer):
    probe = TorchEngine(tiny_model_dir)
    await probe.agenerate(GenerateRequest(first_prompt(tokenizer, 3), sampling(0), rid="probe"))
    per_token = probe.prefix_cache.nbytes / (len(first_prompt(tokenizer, 3)) + 11)
    await probe.close()
    budget = int(per_token * 160)  # room for two to four of these episodes' first turns (37 to 70 tokens)
    engine = TorchEngine(tiny_model_dir, limits=EngineLimits(prefix_cache_bytes=budget))
    lengths, outputs = [], []
    for i in range(8):
        r = await engine.agenerate(GenerateRequest(first_prompt(tokenizer, i), sampling(0), rid=f"e{i}"))
        lengths.append(r.prompt_tokens + len(r.output_ids) - 1)
        outputs.append(r.output_ids)
        stats = engine.stats()
        assert 0 < stats["prefix_cache_bytes"] <= budget
        assert stats["prefix_cache_bytes"] == per_token * sum(lengths[-stats["prefix_cache_entries"] :])
    kept = engine.stats()["prefix_cache_entries"]
    assert 2 <= kept < 8
    # the most recent episodes are still cached, the oldest was evicted
    before = engine.stats()["reused_tokens"]
    await engine.agenerate(GenerateRequest(first_prompt(tokenizer, 7) + outputs[7] + [5] * 3, sampling(0), rid="e7"))
    assert engine.stats()["reused_tokens"] - before == lengths[7]
    before = engine.stats()["reused_tokens"]
    await engine.agenerate(GenerateRequest(first_prompt(tokenizer, 0) + outputs[0] + [5] * 3, sampling(0), rid="e0"))
    assert engine.stats()["reused_tokens"] == before
    # a sequence larger than the whole budget is not kept, and does not evict the others for nothing
    entries = dict(engine.prefix_cache._entries)
    long = SamplingParams(max_new_tokens=120, temperature=0.0, ignore_eos=True)
    await engine.agenerate(GenerateRequest(first_prompt(tokenizer, 2), long, rid="huge"))
    await engine.agenerate(GenerateRequest([1, 2, 3], sampling(0)))  # no rid: never cached; drops the huge row
    assert engine.prefix_cache._entries == entries
    assert engine.stats()["prefix_cache_bytes"] <= budget
    await engine.close()


def test_prefix_cache_refuses_a_negative_budget_and_counts_bytes():
    with pytest.raises(ValueError, match="budget"):
        PrefixCache(-1)
    cache = PrefixCache(3 * 2 * 4 * 10)  # three entries of one layer, (1 head, 10 tokens, 1 dim) keys and values
    kv = [(torch.zeros(1, 10, 1), torch.zeros(1, 10, 1))]
    for rid in "abcd":
        assert cache.put(rid, list(range(10)), kv)
    assert list(cache._entries) == ["b", "c", "d"] and cache.nbytes == 240
    length, past = cache.take("b", list(range(4)) + [99])  # shares 4 tokens with the cached 10
    assert length == 4 and past[0][0].shape == (1, 4, 1) and cache.take("nope", [1, 2]) == (0, None)
    assert "b" not in cache._entries and cache.nbytes == 160
    length, past = cache.take("c", list(range(10)))  # the whole prompt cached: one token is left to feed
    assert length == 9 and past[0][0].shape == (1, 9, 1)
    assert cache.take("d", [7, 8]) == (0, None) and len(cache) == 0 and cache.nbytes == 0
    assert not cache.put("", [1], kv) and not PrefixCache(0).put("a", [1], kv)


async def test_a_weight_update_empties_the_cache(tiny_model_dir, tokenizer, model):
    engine = TorchEngine(tiny_model_dir)
    p = first_prompt(tokenizer, 2)
    first = await engine.agenerate(GenerateRequest(p, sampling(0), rid="r"))
    running = asyncio.create_task(engine.agenerate(GenerateRequest(p, sampling(0, 400), rid="in-flight")))
    while engine.stats()["generated_tokens"] < 20:
        await asyncio.sleep(0.001)
    assert engine.stats()["prefix_cache_entries"] == 1
    noise = torch.Generator().manual_seed(3)
    new_weights = {n: w.detach() + 0.05 * torch.randn(w.shape, generator=noise) for n, w in model.named_parameters()}
    await engine.update_weights(new_weights, version=1)
    assert engine.stats()["prefix_cache_entries"] == 0 and engine.stats()["prefix_cache_bytes"] == 0
    turn2 = p + first.output_ids + observation(tokenizer, 0, 0)
    before = engine.stats()["reused_tokens"]
    second = await engine.agenerate(GenerateRequest(turn2, sampling(0), rid="r"))
    assert engine.stats()["reused_tokens"] == before and second.versions == [1] * len(second.output_ids)
    new_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    new_model.load_state_dict(new_weights, strict=False)
    assert torch.allclose(
        torch.tensor(second.logprobs), teacher_logprobs(new_model, turn2, second.output_ids), atol=1e-4, rtol=0
    )
    assert (await running).versions[-1] == 1
    await engine.close()


async def test_abort_and_cancel_keep_nothing_and_spare_the_other_rows(tiny_model_dir, tokenizer, model):
    engine = TorchEngine(tiny_model_dir)
    reference = TorchEngine(tiny_model_dir, limits=EngineLimits(prefix_cache_bytes=0))
    long = SamplingParams(max_new_tokens=60, temperature=0.0, ignore_eos=True)
    prompts = {rid: first_prompt(tokenizer, i) for i, rid in enumerate(["aborted", "cancelled", "kept"])}
    done = await engine.agenerate(GenerateRequest(prompts["aborted"], sampling(0), rid="aborted"))
    assert engine.stats()["prefix_cache_entries"] == 1
    tasks = {
        rid: asyncio.create_task(engine.agenerate(GenerateRequest(prompts[rid], long, rid=rid)))
        for rid in ["cancelled", "kept"]
    }
    tasks["aborted"] = asyncio.create_task(
        engine.agenerate(
            GenerateRequest(prompts["aborted"] + done.output_ids + observation(tokenizer, 0, 0), long, rid="aborted")
        )
    )
    while engine.stats()["generated_tokens"] < 30:
        await asyncio.sleep(0.001)
    assert await engine.abort("aborted") == 1
    tasks["cancelled"].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks["cancelled"]
    assert (await tasks["aborted"]).finish_reason.type == "abort"
    kept = await tasks["kept"]
    assert kept.output_ids == (await reference.agenerate(GenerateRequest(prompts["kept"], long))).output_ids
    assert torch.allclose(
        torch.tensor(kept.logprobs), teacher_logprobs(model, prompts["kept"], kept.output_ids), atol=1e-4, rtol=0
    )
    await engine.agenerate(GenerateRequest([1, 2, 3], sampling(0), rid="flush"))  # a step that drops dead rows
    assert set(engine.prefix_cache._entries) == {"kept", "flush"}
    assert await engine.abort("kept") == 0 and set(engine.prefix_cache._entries) == {"flush"}
    await engine.close()
    await reference.close()
    assert engine.stats()["prefix_cache_bytes"] == 0


async def test_a_failing_prefill_loses_its_prefix_without_leaking_it(tiny_model_dir, tokenizer, model, monkeypatch):
    engine = TorchEngine(tiny_model_dir)
    p = first_prompt(tokenizer, 1)
    first = await engine.agenerate(GenerateRequest(p, sampling(0), rid="r"))
    turn2 = p + first.output_ids + observation(tokenizer, 0, 0)
    with monkeypatch.context() as patch:
        patch.setattr(engine, "_forward", lambda *args: (_ for _ in ()).throw(RuntimeError("device on fire")))
        with pytest.raises(RuntimeError, match="on fire"):
            await asyncio.wait_for(engine.agenerate(GenerateRequest(turn2, sampling(0), rid="r")), timeout=10)
    stats = engine.stats()
    assert stats["prefix_cache_entries"] == 0 and stats["prefix_cache_bytes"] == 0 and stats["running"] == 0
    second = await engine.agenerate(GenerateRequest(turn2, sampling(0), rid="r"))  # a full prefill, right result
    assert torch.allclose(
        torch.tensor(second.logprobs), teacher_logprobs(model, turn2, second.output_ids), atol=1e-4, rtol=0
    )
    await engine.close()


def test_bench_engine_multiturn_counts_what_each_system_reads(tiny_model_dir, tmp_path):
    """`bench engine`'s multi-turn figures, recomputed from its conversations: with reuse the engine reads each
    given token once (plus each turn's last sampled token); without it, and `model.generate`, every prompt."""
    import json

    from searchgym.bench.engine import EngineBenchSettings, _conversations, run_engine_bench

    out = tmp_path / "bench_engine.json"
    out.write_text(json.dumps({"engine_tokens_per_s": {"64": 5399.1}}))  # single-turn figures already there
    episodes, turns, tokens = 3, 3, 5
    results = run_engine_bench(
        EngineBenchSettings(
            model=str(tiny_model_dir), out=out, episodes=[episodes], turns=turns, turn_tokens=tokens, repeats=2
        )
    )
    assert json.loads(out.read_text()) == results and results["engine_tokens_per_s"] == {"64": 5399.1}
    multiturn = results["multiturn"]
    conversations = _conversations(AutoTokenizer.from_pretrained(tiny_model_dir), episodes, turns)
    generated = episodes * turns * tokens
    given = sum(len(part) for c in conversations for part in c)
    prompts = sum(
        len(c[0]) + sum(len(o) for o in c[1:t]) + (t - 1) * tokens for c in conversations for t in range(1, turns + 1)
    )
    assert multiturn["given_tokens_per_generated_token"] == round(given / generated, 3)
    for name, expected in [
        ("engine_prefix_reuse", given + episodes * (turns - 1)),
        ("engine_no_reuse", prompts),
        ("batched_generate", prompts),
    ]:
        assert len(multiturn["runs"][name]) == 2
        for run in multiturn["runs"][name]:
            assert run["generated_tokens"] == generated
            assert run["prompt_tokens_per_generated_token"] == round(expected / generated, 3)
    ratio = (
        multiturn["median"]["engine_prefix_reuse"]["tokens_per_s"]
        / multiturn["median"]["engine_no_reuse"]["tokens_per_s"]
    )
    assert multiturn["speedup_reuse_vs_no_reuse"] == round(ratio, 2)
    with pytest.raises(ValueError, match="traffic"):
        run_engine_bench(EngineBenchSettings(model=str(tiny_model_dir), out=out, traffic="chat"))


@pytest.fixture(scope="module")
def bare_engine(tiny_model_dir):
    return TorchEngine(tiny_model_dir)


def real_columns(kv, mask, row: int) -> list[torch.Tensor]:
    """One row's keys and values at its real (unpadded) positions, per layer."""
    keep = mask[row].bool()
    return [t[row][:, keep] for layer in kv for t in layer]


@settings(max_examples=30, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 25)), min_size=1, max_size=5), seed=st.integers(0, 2**16)
)
def test_prefill_over_cached_prefixes_equals_a_full_prefill(bare_engine, rows, seed):
    """Any mix of rows with and without a cached prefix, of any lengths, in one group: the same last logits and the
    same keys and values at every real position as prefilling each whole prompt, and no padding left between."""
    noise = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 2000, (c + n,), generator=noise).tolist() for c, n in rows]
    with torch.inference_mode():
        full_kv, full_mask, full_logits = bare_engine._prefill([(p, None) for p in prompts])
        pasts = []
        for (cached, _), p in zip(rows, prompts, strict=True):
            if cached == 0:
                pasts.append(None)
                continue
            kv, mask, _ = bare_engine._prefill([(p[:cached], None)])
            pasts.append([(k[0, :, -cached:], v[0, :, -cached:]) for k, v in kv])
        kv, mask, logits = bare_engine._prefill(
            [(p[c:], past) for (c, _), p, past in zip(rows, prompts, pasts, strict=True)]
        )
    # fp32 summation order alone moves these logits by up to ~2e-5 (one prompt prefilled alone vs in a batch);
    # a wrong position or a misplaced cache column moves them by O(1)
    assert torch.allclose(logits, full_logits, atol=1e-4, rtol=1e-5)
    assert mask.shape[1] == max(map(len, prompts))  # compact: left padding only
    assert all(mask[i, -len(p) :].all() and not mask[i, : -len(p)].any() for i, p in enumerate(prompts))
    for i in range(len(prompts)):
        for got, expected in zip(real_columns(kv, mask, i), real_columns(full_kv, full_mask, i), strict=True):
            assert torch.allclose(got, expected, atol=1e-4, rtol=1e-5)


def test_bench_engine_sweeps_concurrencies_in_one_run(tiny_model_dir, tmp_path):
    from searchgym.bench.engine import EngineBenchSettings, run_engine_bench

    out = tmp_path / "bench_engine.json"
    results = run_engine_bench(
        EngineBenchSettings(model=str(tiny_model_dir), out=out, episodes=[1, 3], turns=2, turn_tokens=4, repeats=1)
    )
    assert set(results["multiturn_sweep"]) == {"1", "3"} and results["multiturn"]["episodes"] == 3
    for run in results["multiturn_sweep"].values():
        assert run["median"]["engine_prefix_reuse"]["tokens_per_s"] > 0 and run["speedup_reuse_vs_batched_generate"] > 0
    assert json.loads(out.read_text())["multiturn_sweep"] == results["multiturn_sweep"]
