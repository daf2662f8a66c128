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

from searchgym.agents.engines.prefix_cache import PrefixCache, shared_prefixes
from searchgym.agents.engines.torch_engine import MIN_SHARED_PREFIX, EngineLimits, TorchEngine
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
    reused = TorchEngine(tiny_model_dir, limits=EngineLimits(share_prefixes=False))  # counted exactly below
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
    # a different rid only borrows what another episode holds (read-only), so the result is the same
    entries = {rid: list(e.tokens) for rid, e in engine.prefix_cache._entries.items()}
    third = await engine.agenerate(GenerateRequest(edited, sampling(0), rid="other"))
    assert third.output_ids == second.output_ids
    assert engine.stats()["shared_tokens"] == engine.stats()["reused_tokens"] - after["reused_tokens"] > 0
    assert {rid: e.tokens for rid, e in engine.prefix_cache._entries.items() if rid != "other"} == entries
    await engine.close()


async def test_lru_eviction_keeps_the_cache_within_its_budget(tiny_model_dir, tokenizer):
    probe = TorchEngine(tiny_model_dir)
    await probe.agenerate(GenerateRequest(first_prompt(tokenizer, 3), sampling(0), rid="probe"))
    per_token = probe.prefix_cache.nbytes / (len(first_prompt(tokenizer, 3)) + 11)
    await probe.close()
    budget = int(per_token * 160)  # room for two to four of these episodes' first turns (37 to 70 tokens)
    # sharing off: an evicted episode would borrow the chat template's opening from the others
    engine = TorchEngine(tiny_model_dir, limits=EngineLimits(prefix_cache_bytes=budget, share_prefixes=False))
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


def test_a_prompt_without_its_own_entry_borrows_the_longest_shared_prefix_read_only():
    cache = PrefixCache(10_000)
    values = {n: torch.arange(n, dtype=torch.float32)[None, :, None] for n in (6, 9)}
    kv = {n: [(values[n], -values[n])] for n in (6, 9)}
    cache.put("short", [1, 2, 3, 4, 5, 6], kv[6])
    cache.put("long", [1, 2, 3, 4, 7, 8, 9, 10, 11], kv[9])
    length, past = cache.take("new", [1, 2, 3, 4, 7, 8, 0])  # shares 4 with "short", 6 with "long"
    assert length == 6 and torch.equal(past[0][1], -torch.arange(6, dtype=torch.float32)[None, :, None])
    assert set(cache._entries) == {"short", "long"} and list(cache._entries)[-1] == "long"  # kept, recently used
    assert cache.shared_tokens == 6
    assert cache.take("new", [1, 2, 3, 4, 7, 8, 9, 10, 11])[0] == 8  # the whole prompt held: one token left to feed
    assert cache.take("z", [9, 1, 2]) == (0, None)  # nothing in common
    off = PrefixCache(10_000, share=False)
    off.put("long", [1, 2, 3, 4, 5, 6], kv[6])
    assert off.take("new", [1, 2, 3, 4]) == (0, None) and off.shared_tokens == 0


@settings(max_examples=60, deadline=None)
@given(
    held=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=0, max_size=5),
    prompt=st.lists(st.integers(0, 3), min_size=1, max_size=12),
)
def test_borrowing_finds_the_longest_common_prefix_any_entry_holds(held, prompt):
    """Over any entries and prompt: the borrowed length is the longest common prefix with any entry (leaving one
    token to feed), and the keys and values are exactly that entry's first tokens; no entry is removed."""
    cache = PrefixCache(1 << 20)
    for i, tokens in enumerate(held):
        cache.put(f"e{i}", tokens, [(torch.tensor(tokens, dtype=torch.float32)[None, :, None],) * 2])

    def common(a, b):
        n = 0
        while n < min(len(a), len(b), len(prompt) - 1) and a[n] == b[n]:
            n += 1
        return n

    want = max([common(tokens, prompt) for tokens in held], default=0)
    length, past = cache.take("new", prompt)
    assert length == want and len(cache) == len(held)
    if want:
        assert past[0][0][0, :, 0].tolist() == prompt[:want]
    else:
        assert past is None


async def test_a_first_turn_prefills_only_what_no_other_episode_holds(tiny_model_dir, tokenizer, model):
    """Episodes that open with the same long system message: once one has finished a turn, each later first turn
    prefills only its own question, and gives the tokens and logprobs of a full prefill."""
    system = "You search a fictional encyclopedia. Call the search tool, read the pages, then answer. " * 4

    def opening(i: int) -> list[int]:
        chat = [{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: who founded it?"}]
        return tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)

    shared = TorchEngine(tiny_model_dir)
    alone = TorchEngine(tiny_model_dir, limits=EngineLimits(share_prefixes=False))
    for i in range(4):
        a = await shared.agenerate(GenerateRequest(opening(i), sampling(i), rid=f"episode-{i}"))
        b = await alone.agenerate(GenerateRequest(opening(i), sampling(i), rid=f"episode-{i}"))
        assert a.output_ids == b.output_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5)
        assert torch.allclose(
            torch.tensor(a.logprobs), teacher_logprobs(model, opening(i), a.output_ids), atol=1e-4, rtol=0
        )
    common = next(n for n in range(len(opening(0))) if opening(0)[n] != opening(1)[n])  # system + "Question "
    assert common > 60
    assert alone.stats()["prefill_tokens"] == sum(len(opening(i)) for i in range(4))
    assert shared.stats()["shared_tokens"] == 3 * common == shared.stats()["reused_tokens"]
    assert shared.stats()["prefill_tokens"] == alone.stats()["prefill_tokens"] - 3 * common
    assert shared.stats()["prefix_cache_entries"] == 4  # every episode keeps its own entry for its next turn
    await shared.close()
    await alone.close()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=10), max_size=8), st.integers(1, 4))
def test_shared_prefixes_are_what_two_prompts_share_shortest_first(prompts, minimum):
    found = shared_prefixes(prompts, minimum=minimum)
    assert [len(p) for p in found] == sorted(len(p) for p in found) and len({tuple(p) for p in found}) == len(found)
    for prefix in found:
        assert len(prefix) >= minimum
        assert sum(p[: len(prefix)] == prefix and len(p) > len(prefix) for p in prompts) >= 2
    for i, a in enumerate(prompts):  # identical prompts: all but their last token is found
        if len(a) > minimum and a in prompts[i + 1 :]:
            assert a[:-1] in found


async def test_a_group_arriving_together_prefills_its_shared_prompt_once(tiny_model_dir, tokenizer, model):
    """Two GRPO-shaped groups (4 episodes of one question each, one system message) sent at once: the system
    message is prefilled once, each question once on top of it, each row only its last token; every episode's
    tokens and logprobs are those of a full prefill."""
    system = "You search a fictional encyclopedia. Call the search tool, read the pages, then answer. " * 3

    def opening(q: int) -> list[int]:
        chat = [{"role": "system", "content": system}, {"role": "user", "content": f"Question {q}: who founded it?"}]
        return tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)

    episodes = [(q, e) for q in (1, 2) for e in range(4)]

    async def play(engine):
        requests = [GenerateRequest(opening(q), sampling(e), rid=f"q{q}-e{e}") for q, e in episodes]
        return await asyncio.gather(*(engine.agenerate(r) for r in requests))

    shared = TorchEngine(tiny_model_dir)
    alone = TorchEngine(tiny_model_dir, limits=EngineLimits(share_prefixes=False))
    got, want = await play(shared), await play(alone)
    for a, b, (q, _) in zip(got, want, episodes, strict=True):
        assert a.output_ids == b.output_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5)
        assert torch.allclose(
            torch.tensor(a.logprobs), teacher_logprobs(model, opening(q), a.output_ids), atol=1e-4, rtol=0
        )
    one, two = opening(1), opening(2)
    system_tokens = next(n for n in range(len(one)) if one[n] != two[n])
    assert alone.stats()["prefill_tokens"] == 4 * (len(one) + len(two))
    assert shared.stats()["prefill_tokens"] == system_tokens + (len(one) - 1 - system_tokens) + (
        len(two) - 1 - system_tokens
    ) + len(episodes)
    await shared.close()
    await alone.close()


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
    episodes, turns, tokens = 4, 3, 5
    results = run_engine_bench(
        EngineBenchSettings(
            model=str(tiny_model_dir),
            out=out,
            episodes=[episodes],
            turns=turns,
            turn_tokens=tokens,
            repeats=2,
            group_size=2,
        )
    )
    assert json.loads(out.read_text()) == results and results["engine_tokens_per_s"] == {"64": 5399.1}
    multiturn = results["multiturn"]
    conversations = _conversations(AutoTokenizer.from_pretrained(tiny_model_dir), episodes, turns, group_size=2)
    firsts = [c[0] for c in conversations]
    assert firsts[0] == firsts[1] != firsts[2] == firsts[3]  # two groups of two, as GRPO's
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    opened = _conversations(tokenizer, episodes, turns, group_size=2, instructions="full")
    assert [c[1:] for c in opened] == [c[1:] for c in conversations]  # the same observations, a longer opening
    text = tokenizer.decode(opened[2][0])
    assert "Answer the question below by searching" in text and f"at most {turns} turns" in text
    assert tokenizer.decode(firsts[2]).split("about ")[-1].split("?")[0] in text.split("Question:")[-1]
    generated = episodes * turns * tokens
    given = sum(len(part) for c in conversations for part in c)
    prompts = sum(
        len(c[0]) + sum(len(o) for o in c[1:t]) + (t - 1) * tokens for c in conversations for t in range(1, turns + 1)
    )
    assert multiturn["given_tokens_per_generated_token"] == round(given / generated, 3)
    for name, expected in [
        ("engine_prefix_reuse", given - sum(map(len, firsts)) + first_turn_reads(firsts) + episodes * (turns - 1)),
        ("engine_reuse_no_sharing", given + episodes * (turns - 1)),
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


def first_turn_reads(firsts: list[list[int]]) -> int:
    """Prompt tokens a sharing engine reads for first turns admitted together: each shared prefix on top of the
    longest one before it, then each prompt past the longest shared prefix it starts with (one token at least)."""

    def common(a, b, limit):
        n = 0
        while n < min(len(a), len(b), limit) and a[n] == b[n]:
            n += 1
        return n

    done, reads = [], 0
    for prefix in shared_prefixes(firsts, minimum=MIN_SHARED_PREFIX):
        reads += len(prefix) - max((common(prefix, d, len(prefix)) for d in done), default=0)
        done.append(prefix)
    return reads + sum(len(f) - max((common(f, d, len(f) - 1) for d in done), default=0) for f in firsts)


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
