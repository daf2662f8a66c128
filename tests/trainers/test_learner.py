"""The learner on real trajectories from the real tiny model: consistent log-probs, exact micro-batching."""

import asyncio
import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.workflow import TokenWorkflow, WorkflowSettings
from searchgym.envs.search_env import SearchEnv
from searchgym.trainers.algorithm.learner import Learner, LearnerConfig, has_train_mode_noise, next_token_logits
from searchgym.trainers.algorithm.ppo import PPOCoefficients, decoupled_ppo_loss, token_logprobs


@pytest.fixture(scope="module")
def groups(tiny_model_dir, small_pool, small_index):
    """Two groups of four real episodes each (same task per group), with rewards 1, 0, 1, 0."""
    engine = TorchEngine(tiny_model_dir, seed=0)

    async def collect():
        out = []
        for g in range(2):
            task = small_pool[g]
            envs = [SearchEnv(small_pool, small_index, max_turns=3) for _ in range(4)]
            workflow = TokenWorkflow(engine, engine.tokenizer, WorkflowSettings(SamplingParams(max_new_tokens=32)))
            out.append(
                await asyncio.gather(
                    *(workflow.arun_episode(env, options={"task_id": task.id}, seed=i) for i, env in enumerate(envs))
                )
            )
        return out

    result = asyncio.run(collect())
    for group in result:
        for i, traj in enumerate(group):
            traj.reward = float(i % 2 == 0)
    return result


def fresh_learner(tiny_model_dir, **config):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return Learner(model, LearnerConfig(**config))


def mean_logprob(model, traj):
    with torch.no_grad():
        ids = torch.tensor([traj.input_ids])
        logp = token_logprobs(model(ids).logits[:, :-1], ids[:, 1:])[0]
    mask = torch.tensor(traj.loss_mask[1:], dtype=torch.bool)
    return float(logp[mask].mean())


def test_first_step_behaviour_equals_proximal_policy(tiny_model_dir, groups):
    learner = fresh_learner(tiny_model_dir, lr=1e-3)
    before = copy.deepcopy(learner.model.state_dict())
    stats = learner.step(groups)
    assert stats["updated"] == 1.0 and learner.version == 1 and stats["dropped_groups"] == 0
    # the engine sampled with the same weights, so behaviour and proximal log-probs agree
    assert abs(stats["behav_weight_mean"] - 1.0) < 1e-3 and stats["behav_capped_fraction"] == 0.0
    assert abs(stats["importance_weight_mean"] - 1.0) < 1e-4 and abs(stats["approx_kl"]) < 1e-6
    assert stats["clip_fraction"] == 0.0 and stats["staleness_max"] == 0.0 and stats["grad_norm"] > 0
    assert stats["trained_tokens"] == sum(t.generated_tokens for g in groups for t in g)
    assert any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items())


def test_micro_batching_does_not_change_the_update(tiny_model_dir, groups):
    small, large = (
        fresh_learner(tiny_model_dir, micro_batch_tokens=64),
        fresh_learner(tiny_model_dir, micro_batch_tokens=10**6),
    )
    small.step(groups)
    large.step(groups)
    for (name, a), b in zip(small.model.state_dict().items(), large.model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_groups_without_reward_spread_are_dropped(tiny_model_dir, groups):
    flat = [[copy.copy(t) for t in g] for g in groups]
    for group in flat:
        for traj in group:
            traj.reward = 1.0
    learner = fresh_learner(tiny_model_dir)
    before = copy.deepcopy(learner.model.state_dict())
    stats = learner.step(flat)
    assert stats["updated"] == 0.0 and stats["dropped_groups"] == 2
    assert learner.version == 1, "a step with nothing to learn still advances the version"
    assert all(torch.equal(before[k], v) for k, v in learner.model.state_dict().items())


def test_the_update_moves_log_probs_towards_rewarded_trajectories(tiny_model_dir, groups):
    learner = fresh_learner(tiny_model_dir, lr=3e-3, grad_clip=100.0)
    rewarded, unrewarded = groups[0][0], groups[0][1]
    before = mean_logprob(learner.model, rewarded), mean_logprob(learner.model, unrewarded)
    learner.step(groups)
    after = mean_logprob(learner.model, rewarded), mean_logprob(learner.model, unrewarded)
    assert after[0] > before[0] and after[1] < before[1]


def test_state_dict_round_trip(tiny_model_dir, groups):
    learner = fresh_learner(tiny_model_dir, warmup_steps=4)
    learner.step(groups)
    other = fresh_learner(tiny_model_dir, warmup_steps=4)
    other.load_state_dict(copy.deepcopy(learner.state_dict()))
    assert other.version == 1 and other.scheduler.get_last_lr() == learner.scheduler.get_last_lr()
    learner.step(groups), other.step(groups)
    for a, b in zip(learner.model.state_dict().values(), other.model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_logits_only_at_trained_positions_match_the_full_forward_pass(tiny_model_dir, groups):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    traj = groups[0][0]
    ids = torch.tensor([traj.input_ids])
    where = torch.tensor([traj.loss_mask[1:]], dtype=torch.bool)
    with torch.no_grad():
        full = model(ids).logits[:, :-1][where]
        picked = next_token_logits(model, ids, torch.ones_like(ids), where)
    assert picked.shape == (int(where.sum()), model.config.vocab_size)
    torch.testing.assert_close(picked, full, rtol=1e-5, atol=1e-5)


# --- minibatches: sequential updates from proximal log-probs fixed at the start of the step ---------------------


def reference_step(model, groups, *, minibatches, lr, eps_clip, grad_clip, behav_weight_cap, fixed_prox=True):
    """The learner's step as the math says, trajectory by trajectory: group-baseline advantages, proximal log-probs
    of the pre-update weights (recomputed before each minibatch when not `fixed_prox`), then for minibatch i (the
    trajectories i, i + m, i + 2m, ...) the decoupled PPO loss token-mean over the minibatch, gradient clipping and
    one AdamW step. Returns the pre-clip gradient norm of each minibatch."""
    trajs = [t for group in groups for t in group]
    rewards = torch.tensor([[t.reward for t in group] for group in groups], dtype=torch.float64)
    advantages = (rewards - rewards.mean(dim=1, keepdim=True)).flatten().tolist()
    tensors = [
        (
            torch.tensor([t.input_ids]),
            torch.tensor([t.loss_mask[1:]], dtype=torch.float32),
            torch.tensor([t.logprobs[1:]], dtype=torch.float32),
        )
        for t in trajs
    ]

    def logprobs(ids):
        return token_logprobs(model(ids).logits[:, :-1], ids[:, 1:])

    def proximal():
        model.eval()
        with torch.no_grad():
            return [logprobs(ids) for ids, _, _ in tensors]

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.0)
    prox, norms = proximal(), []
    for i in range(minibatches):
        if not fixed_prox:
            prox = proximal()
        part = range(i, len(trajs), minibatches)
        normalizer = sum(int(tensors[k][1].sum()) for k in part)  # every trained token, capped or not (AReaL 1.0.4)
        model.train()
        optimizer.zero_grad()
        for k in part:
            ids, mask, behav = tensors[k]
            loss, _ = decoupled_ppo_loss(
                logprobs(ids),
                prox[k],
                behav,
                torch.full_like(mask, advantages[k]),
                mask,
                PPOCoefficients(eps_clip=eps_clip, behav_weight_cap=behav_weight_cap),
                normalizer=normalizer,
            )
            loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)))
        optimizer.step()
    return norms


def test_two_minibatches_are_two_sequential_updates_from_fixed_proximal_log_probs(tiny_model_dir, groups):
    settings = dict(lr=1e-2, eps_clip=0.02, grad_clip=0.5, behav_weight_cap=5.0)
    learner = fresh_learner(tiny_model_dir, minibatches=2, **settings)
    stats = learner.step(groups)
    expected = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    norms = reference_step(expected, groups, minibatches=2, **settings)
    update = distance(expected, fresh_learner(tiny_model_dir).model)
    # Adam divides by the gradient's own scale, so float noise on near-zero gradients moves a few weights by up to
    # ~lr/100 either way: compare whole updates (the update is ~10^5 times larger than that noise)
    assert distance(learner.model, expected) < 1e-4 * update
    # the reported gradient norm is the mean of the minibatches' pre-clip norms, and they were clipped
    assert stats["grad_norm"] == pytest.approx(sum(norms) / 2, rel=1e-4) and min(norms) > settings["grad_clip"]
    assert stats["updated"] == 1.0 and learner.version == 1
    # the second minibatch really met the trust region: its tokens were clipped against the step's proximal policy,
    # so recomputing the proximal log-probs between minibatches, or one minibatch, would give other weights
    assert stats["clip_fraction"] > 0
    for other in (dict(minibatches=2, fixed_prox=False), dict(minibatches=1)):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        reference_step(model, groups, **settings, **other)
        assert distance(model, expected) > 0.1 * update, other


def forward_passes(learner):
    """A list that gets one entry per forward pass of the learner's model body."""
    calls = []
    learner.model.base_model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls


def test_one_minibatch_takes_its_proximal_log_probs_from_its_own_forward_pass(tiny_model_dir, groups):
    # the update is the math's (proximal log-probs of the pre-update weights), one forward pass per micro-batch
    settings = dict(lr=1e-2, eps_clip=0.02, grad_clip=0.5, behav_weight_cap=5.0)
    learner = fresh_learner(tiny_model_dir, micro_batch_tokens=64, **settings)
    calls = forward_passes(learner)
    learner.step(groups)
    expected = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference_step(expected, groups, minibatches=1, **settings)
    update = distance(expected, fresh_learner(tiny_model_dir).model)
    # micro-batches sum their gradients in another order than one whole pass, and that float noise depends on torch's
    # thread count (1.3e-4 of the update on one thread, under 1e-4 on two); a wrong proximal policy is over 0.1
    assert distance(learner.model, expected) < 5e-4 * update
    assert len(calls) == len(learner._micro_batches(learner._samples(groups)[0]))
    # two minibatches: the second one's proximal log-probs need a pass before the first update, the first's do not
    two = fresh_learner(tiny_model_dir, micro_batch_tokens=10**6, minibatches=2)
    calls = forward_passes(two)
    two.step(groups)
    assert len(calls) == 3


def test_a_model_with_dropout_gets_a_separate_eval_mode_proximal_pass(tiny_model_dir, groups):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.config.attention_dropout = 0.1  # train-mode passes are random: they cannot stand for the proximal policy
    learner = Learner(model, LearnerConfig(micro_batch_tokens=10**6))
    calls = forward_passes(learner)
    learner.step(groups)
    assert len(calls) == 2


@pytest.mark.parametrize(
    "setting",
    [
        {"attention_dropout": 0.1},
        {"router_jitter_noise": 0.01},
        {"layerdrop": 0.1},
        {"text_config": {"hidden_dropout": 0.1}},
    ],
)
def test_train_mode_noise_is_found_wherever_the_config_keeps_it(tiny_model_dir, setting):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert not has_train_mode_noise(model)
    for key, value in setting.items():
        setattr(model.config, key, value)
    assert has_train_mode_noise(model)


def distance(a, b):
    """Euclidean distance between two models' weights, all parameters together."""
    return float(
        torch.cat(
            [(x - y).flatten() for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)]
        ).norm()
    )


def test_reported_gradient_norm_is_the_norm_of_the_loss_gradient(tiny_model_dir, groups):
    settings = dict(lr=1e-3, eps_clip=0.2, grad_clip=1.0, behav_weight_cap=5.0)
    learner = fresh_learner(tiny_model_dir, **settings)
    stats = learner.step(groups)
    [norm] = reference_step(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), groups, minibatches=1, **settings
    )
    assert norm > 0 and stats["grad_norm"] == pytest.approx(norm, rel=1e-4)


# --- process rewards: credit for the turn whose search found the answer page --------------------------------------


class SearchFirst(TokenWorkflow):
    """The model's own tokens, but the first turn's action is a search: for the answer page's name, or for nothing
    useful.

    So the real env judges the search and writes its evidence (the answer page's rank) into the turn's info.
    """

    def __init__(self, *args, finds: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.finds = finds

    async def act(self, env, traj, text):
        if traj.turns:
            return text
        return f"<search>{env.task.metadata['path'][-1]['name'] if self.finds else 'qqqq zzzz'}</search>"


@pytest.fixture(scope="module")
def searched_groups(tiny_model_dir, small_pool, small_index):
    """Two groups of four real episodes of three turns; only episode 0's first search finds the answer page."""
    engine = TorchEngine(tiny_model_dir, seed=1)
    settings = WorkflowSettings(SamplingParams(max_new_tokens=16))

    async def collect():
        out = []
        for task in small_pool[:2]:
            workflows = [SearchFirst(engine, engine.tokenizer, settings, finds=i == 0) for i in range(4)]
            out.append(
                await asyncio.gather(
                    *(
                        workflow.arun_episode(
                            SearchEnv(small_pool, small_index, max_turns=3), options={"task_id": task.id}, seed=i
                        )
                        for i, workflow in enumerate(workflows)
                    )
                )
            )
        return out

    result = asyncio.run(collect())
    for group in result:
        for i, traj in enumerate(group):
            found = [t.info.get("evidence", {}).get("answer_page_rank") for t in traj.turns]
            assert (found[0] is not None) == (i == 0) and found[1:] == [None] * (len(found) - 1)
            assert len(traj.turns) == 3 and all(t.generated_tokens for t in traj.turns)
            traj.reward = 0.0  # the same outcome for all: only the process reward tells them apart
    return result


def turn_logprob(model, traj, turn):
    """Mean log-prob of the tokens the model generated in one turn (the turn-th run of loss_mask == 1)."""
    runs, previous = [], 0
    for i, generated in enumerate(traj.loss_mask):
        if generated and not previous:
            runs.append([])
        if generated:
            runs[-1].append(i)
        previous = generated
    with torch.no_grad():
        ids = torch.tensor([traj.input_ids])
        logp = token_logprobs(model(ids).logits[:, :-1], ids[:, 1:])[0]
    return float(logp[[i - 1 for i in runs[turn]]].mean())


def test_process_rewards_credit_the_turn_whose_search_found_the_answer_page(tiny_model_dir, searched_groups):
    outcome_only = fresh_learner(tiny_model_dir)
    stats = outcome_only.step(searched_groups)
    assert stats["updated"] == 0.0 and stats["dropped_groups"] == 2  # equal outcomes: nothing to learn

    learner = fresh_learner(tiny_model_dir, lr=3e-3, grad_clip=100.0, process_reward_weight=1.0, process_reward="none")
    finder, other = searched_groups[0][0], searched_groups[0][1]
    before = {
        (t, k): turn_logprob(learner.model, traj, k)
        for t, traj in (("finder", finder), ("other", other))
        for k in range(3)
    }
    stats = learner.step(searched_groups)
    assert stats["updated"] == 1.0 and stats["dropped_groups"] == 0
    after = {
        (t, k): turn_logprob(learner.model, traj, k)
        for t, traj in (("finder", finder), ("other", other))
        for k in range(3)
    }
    # returns-to-go: the finder's first turn earns 1 (advantage +3/4 against the group), every later turn and every
    # turn of the others earns nothing (advantage -1/4): only the searching turn that found the page is reinforced
    assert after["finder", 0] > before["finder", 0]
    for key in [("finder", 1), ("finder", 2), ("other", 0), ("other", 1), ("other", 2)]:
        assert after[key] < before[key], key


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_the_chunked_loss_head_trains_as_the_whole_logits_one_did(tiny_model_dir, groups, chunk):
    """Two steps on real episodes: the same statistics and the same weights after, within fp32 tolerance, whether
    the logits come a few positions at a time or whole (the head this learner had before)."""
    from searchgym.bench.learner_memory import whole_logits_learner

    config = LearnerConfig(lr=1e-3, minibatches=2, logit_chunk_tokens=chunk)
    chunked = Learner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), config)
    whole = whole_logits_learner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), config)
    for _ in range(2):
        a, b = chunked.step(groups), whole.step(groups)
        for key in ("loss", "entropy", "grad_norm", "approx_kl", "importance_weight_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    # Adam moves each weight by about lr a step whatever its gradient's size, so a weight whose gradient is near Adam's
    # eps turns fp32 summation-order noise into a visible share of one step (measured: 1.6e-5 on a 1.6e-3 move). The
    # weights must agree to 2% of one step; a head that got the gradient wrong moves them by a whole one.
    for (name, p), q in zip(chunked.model.named_parameters(), whole.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=0.02 * config.lr, rtol=1e-4, msg=name)


def test_packed_rows_give_the_log_probs_of_padded_ones_and_train_alike(tiny_model_dir, groups):
    """Several trajectories in one row, positions restarting and attention kept inside each: the same log-probs as
    one padded row each, and the same update."""
    packed = fresh_learner(tiny_model_dir, lr=1e-3, packing="on", micro_batch_tokens=4096)
    padded = fresh_learner(tiny_model_dir, lr=1e-3, packing="off", micro_batch_tokens=4096)
    assert packed.packed and not padded.packed
    samples, _ = packed._samples(groups)
    batches = packed._micro_batches(samples)
    assert len(batches[0]) > 2 and sum(len(s.ids) for s in batches[0]) <= 4096  # several samples share a row
    layout = packed._layout(batches[0])
    assert layout.ids.shape[0] == 1 and layout.attention is None
    with torch.no_grad():
        logp, _, _ = packed._logprobs(layout)
        for (row, start), sample in zip(layout.spans, batches[0], strict=True):
            alone, _, _ = padded._logprobs(padded._layout([sample]))
            n = len(sample.ids) - 1
            torch.testing.assert_close(logp[row, start : start + n], alone[0, :n], atol=1e-5, rtol=1e-5)
            if start + n < layout.mask.shape[1]:
                assert (
                    layout.mask[row, start + n] == 0
                )  # the position ending a sample (before the next) is never trained
    a, b = packed.step(groups), padded.step(groups)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    # AdamW's first step moves each weight by about lr (1e-3) whatever its gradient's size, so a gradient that is ~0
    # in both and differs in float noise may move differently: compare at a tenth of one step
    for p, q in zip(packed.model.parameters(), padded.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-4)


def test_packing_is_off_by_default_without_varlen_attention_and_settings_are_checked(tiny_model_dir):
    from searchgym.trainers.algorithm.learner import packs_sequences
    from searchgym.trainers.config import load_config

    learner = fresh_learner(tiny_model_dir)
    assert learner.config.packing == "auto" and not learner.packed  # sdpa: a packed row would cost O(row^2)
    model = learner.model
    model.config._attn_implementation = "flash_attention_2"
    assert packs_sequences(model, "auto") and not packs_sequences(model, "off")
    with pytest.raises(ValueError, match="learner.packing"):
        load_config(overrides=["learner.packing=sometimes"])


def stale(groups, shift):
    """The groups as if sampled by an older policy: every generated token's behaviour log-prob moved by `shift`."""
    out = copy.deepcopy(groups)
    for group in out:
        for traj in group:
            traj.logprobs = [lp + shift if m else lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True)]
    return out


def test_plain_ppo_centres_the_trust_region_on_the_behaviour_policy(tiny_model_dir, groups):
    # fresh data (behaviour = pre-update weights): plain and decoupled PPO are the same update, plain without the
    # extra proximal pass a second minibatch needs
    settings = dict(lr=1e-2, micro_batch_tokens=10**6, minibatches=2)
    decoupled, plain = (
        fresh_learner(tiny_model_dir, **settings),
        fresh_learner(tiny_model_dir, proximal="behaviour", **settings),
    )
    calls = forward_passes(plain)
    decoupled.step(groups)
    plain.step(groups)
    assert len(calls) == 2  # one training pass per minibatch, no proximal pass
    update = distance(decoupled.model, fresh_learner(tiny_model_dir).model)
    assert distance(plain.model, decoupled.model) < 1e-3 * update

    # stale data (behaviour log-probs 0.5 higher than the current policy's): decoupled PPO's ratio is against the
    # proximal (current) policy and the staleness goes into the behaviour weight exp(-0.5); plain PPO's ratio is
    # against the behaviour policy itself, exp(-0.5) = 0.61, outside the clip range, and it has no behaviour weight
    old = stale(groups, 0.5)
    d = fresh_learner(tiny_model_dir, minibatches=1).step(old)
    p = fresh_learner(tiny_model_dir, minibatches=1, proximal="behaviour").step(old)
    assert abs(d["importance_weight_mean"] - 1.0) < 1e-4 and abs(d["behav_weight_mean"] - 0.6065) < 1e-3
    assert abs(p["importance_weight_mean"] - 0.6065) < 1e-3 and abs(p["behav_weight_mean"] - 1.0) < 1e-6
    assert d["clip_fraction"] == 0.0 and p["clip_fraction"] > 0.4


def test_the_proximal_setting_is_checked():
    from searchgym.trainers.config import load_config

    assert load_config(None, ["learner.proximal=behaviour"]).learner.proximal == "behaviour"
    with pytest.raises(ValueError, match="learner.proximal"):
        load_config(None, ["learner.proximal=old"])


# --- CPU levers: frozen lower layers, bf16 autocast ------------------------------------------------------------


def test_trainable_layers_train_the_top_layers_only_and_still_move_towards_reward(tiny_model_dir, groups):
    learner = fresh_learner(tiny_model_dir, lr=3e-3, grad_clip=100.0, trainable_layers=1)
    before = {name: p.detach().clone() for name, p in learner.model.named_parameters()}
    rewarded, unrewarded = groups[0][0], groups[0][1]
    logps = mean_logprob(learner.model, rewarded), mean_logprob(learner.model, unrewarded)
    learner.step(groups)
    moved = {name for name, p in learner.model.named_parameters() if not p.equal(before[name])}
    top = len(learner.model.get_decoder().layers) - 1
    assert moved and all(name.startswith(f"model.layers.{top}.") or name == "model.norm.weight" for name in moved)
    assert any(name.startswith(f"model.layers.{top}.") for name in moved) and "model.norm.weight" in moved
    assert sum(len(g["params"]) for g in learner.optimizer.param_groups) == len(moved)  # no state for frozen ones
    after = mean_logprob(learner.model, rewarded), mean_logprob(learner.model, unrewarded)
    assert after[0] > logps[0] and after[1] < logps[1]


def test_trainable_layers_are_checked_against_the_model_and_the_learner(tiny_model_dir):
    from searchgym.trainers.config import load_config

    with pytest.raises(ValueError, match="trainable_layers is 9, but the model has 2 decoder layers"):
        fresh_learner(tiny_model_dir, trainable_layers=9)
    with pytest.raises(ValueError, match="learner.trainable_layers"):
        load_config(None, ["learner.trainable_layers=0"])
    with pytest.raises(ValueError, match="learner.trainable_layers needs ranks 1"):
        load_config(None, ["learner.trainable_layers=2", "learner.ranks=2"])
    with pytest.raises(ValueError, match="learner.autocast"):
        load_config(None, ["learner.autocast=fp8"])


def test_bf16_autocast_gives_nearly_the_fp32_log_probs_and_update(tiny_model_dir, groups):
    fp32, bf16 = fresh_learner(tiny_model_dir, lr=3e-3), fresh_learner(tiny_model_dir, lr=3e-3, autocast="bf16")
    start = {name: p.detach().clone() for name, p in fp32.model.named_parameters()}
    samples, _ = fp32._samples(groups)
    layout = fp32._layout(samples)
    with torch.no_grad():
        exact, _, where = fp32._logprobs(layout)
        close, _, _ = bf16._logprobs(layout)
    error = (close - exact)[where].abs()
    assert close.dtype == torch.float32 and 0 < float(error.mean()) < 0.1 and float(error.max()) < 0.5
    fp32.step(groups)
    bf16.step(groups)

    def update(learner):
        return torch.cat([(p.detach() - start[name]).flatten() for name, p in learner.model.named_parameters()])

    a, b = update(fp32), update(bf16)
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.9  # the same step, to bf16's precision


def test_a_cpu_step_gives_its_freed_memory_back(tiny_model_dir, groups, monkeypatch):
    """After a CPU step the activations it freed go back to the OS (core.heap), not kept beside the engine."""
    from searchgym.trainers.algorithm import learner as learner_module

    calls = []
    monkeypatch.setattr(learner_module, "release_free_heap", lambda: calls.append(1) or True)
    learner = fresh_learner(tiny_model_dir, lr=1e-3)
    learner.step(groups)
    assert calls == [1]
