"""`searchgym bench trainer`: heavy-tailed episode draws, the benchmark env and workflow, and a tiny end-to-end
sweep."""

import asyncio
import dataclasses
import json
import os
import statistics

import gymnasium as gym
import numpy as np
import pytest

from searchgym.bench.plan_workflow import PLANNED_WORKFLOW, word_start_ids, word_start_share
from searchgym.bench.slow_env import SLOW_SYNTHETIC_QA, TOOL_DELAYS, ParetoLatency, SlowSearch, SlowSearchEnv
from searchgym.bench.trainer import TrainerBenchConfig, run_trainer_bench
from searchgym.bench.workload import EpisodePlan, Workload
from searchgym.envs.tools.base import SearchHit
from tests.conftest import SMALL


def test_latency_is_seeded_and_heavy_tailed():
    draws = lambda latency, n: [latency.draw() for _ in range(n)]  # noqa: E731
    a, b = ParetoLatency(0.05, 1.2, 30.0, seed=7), ParetoLatency(0.05, 1.2, 30.0, seed=7)
    assert draws(a, 100) == draws(b, 100)
    assert draws(ParetoLatency(seed=8), 100) != draws(ParetoLatency(seed=7), 100)
    a.reseed(123, "task-1")
    first = draws(a, 5)
    a.reseed(123, "task-2")
    assert draws(a, 5) != first
    a.reseed(123, "task-1")
    assert draws(a, 5) == first  # an episode's delays depend only on (seed, episode seed, task)

    many = draws(ParetoLatency(0.05, 1.2, 30.0, seed=0), 20_000)
    median = statistics.median(many)
    assert 0.045 < median < 0.055
    assert min(many) >= ParetoLatency(0.05, 1.2).scale_s and max(many) <= 30.0
    assert max(many) > 50 * median  # heavy tail: the largest draw dwarfs the typical one
    assert sum(x > 20 * median for x in many) / len(many) > 0.005  # P(X > 20 median) = 20 ** -1.2 = 2.7 %


def test_workload_draws_asearchers_shape_seeded():
    workload = Workload()
    plans = [workload.plan(seed, f"task-{seed % 7}") for seed in range(20_000)]
    turns, tokens = [p.turns for p in plans], [p.tokens for p in plans]
    ordered = sorted(turns)
    assert statistics.median(turns) == 3 and 15 <= ordered[int(0.9 * len(turns))] <= 17  # median 3, p90 16
    assert max(turns) == 40 and min(turns) == 1 and statistics.fmean(turns) > 1.8 * 3  # a long tail, capped
    assert min(tokens) == 58 and max(tokens) == 1920  # ASearcher's 58 to 1,920 generated tokens per episode
    assert statistics.fmean(tokens) > 1.8 * statistics.median(tokens)
    assert all(1 <= t <= workload.turn_tokens_max for p in plans for t in p.turn_tokens)
    # a function of (workload seed, episode seed, task) only: the same episode in every mode and process
    assert [workload.plan(s, "t") for s in range(50)] == [Workload().plan(s, "t") for s in range(50)]
    assert [workload.plan(s, "t") for s in range(50)] != [workload.plan(s, "u") for s in range(50)]
    assert [workload.plan(s, "t") for s in range(50)] != [Workload(seed=1).plan(s, "t") for s in range(50)]
    # configurable: a lighter tail gives shorter episodes
    light = [Workload(turns_median=2, turns_p90=4, turns_max=6).plan(s, "t") for s in range(2000)]
    assert max(p.turns for p in light) == 6 and statistics.median(p.turns for p in light) == 2


@pytest.mark.parametrize(
    "bad",
    [
        dict(turns_median=5, turns_p90=4),
        dict(turns_max=10, turns_p90=16),
        dict(episode_tokens_min=0),
        dict(turn_tokens_median=500),
        dict(episode_tokens_min=500),
    ],
)
def test_workload_refuses_impossible_shapes(bad):
    with pytest.raises(ValueError):
        Workload(**bad)


def test_slow_backend_waits_then_delegates():
    class Inner:
        async def search(self, query, k):
            return [SearchHit("d", query, "u", "s", 1.0)] * k

    TOOL_DELAYS.clear()
    hits = asyncio.run(SlowSearch(Inner(), ParetoLatency(0.001, 1.2, 0.01)).search("q", 2))
    assert [h.title for h in hits] == ["q", "q"] and len(TOOL_DELAYS) == 1 and 0 < TOOL_DELAYS[0] <= 0.01


def test_bench_env_wraps_backends_and_turns_bad_turns_into_searches(small_bundle):
    env = gym.make(SLOW_SYNTHETIC_QA, **SMALL, max_turns=3, latency_median_s=0.001, latency_max_s=0.01).unwrapped
    assert isinstance(env, SlowSearchEnv) and isinstance(env.search_backend, SlowSearch)
    env.reset(seed=1)
    TOOL_DELAYS.clear()
    _, _, _, _, info = env.step("gibberish <|im_end|> founded company")
    assert info["tool"] == "search" and info["query"] == "gibberish founded company" and len(TOOL_DELAYS) == 1
    env.close()


def test_bench_env_plays_the_drawn_number_of_turns_as_searches(small_bundle):
    workload = {"turns_median": 2, "turns_p90": 4, "turns_max": 6, "seed": 3}

    def make():
        return gym.make(
            SLOW_SYNTHETIC_QA, **SMALL, latency_median_s=0.0, latency_max_s=0.0, workload=workload
        ).unwrapped

    env, other = make(), make()
    for seed in range(6):
        _, info = env.reset(seed=seed)
        plan = Workload(**workload).plan(seed, info["task_id"])
        assert env.plan == plan and info["plan"] == list(plan.turn_tokens)
        _, other_info = other.reset(seed=seed, options={"task_id": info["task_id"]})
        assert other.plan == plan  # the same episode whichever env instance (and trainer mode) plays it
        for turn in range(1, plan.turns + 1):
            # even an answer is played as a search: the episode lasts exactly its drawn number of turns
            _, reward, terminated, truncated, step = env.step(f"<answer>{env.task.answers[0]}</answer>")
            assert step["tool"] == "search" and not terminated and reward == 0.0
            assert truncated == (turn == plan.turns)
        assert step["truncation"] == "turn budget"
    env.close(), other.close()


def test_word_start_share_scores_each_turns_first_token(tiny_model_dir):
    from transformers import AutoTokenizer

    from searchgym.agents.trajectory import Trajectory

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    starts = word_start_ids(tokenizer)
    word, other = tokenizer.encode(" search")[0], tokenizer.encode("<search>")[0]
    assert word in starts and other not in starts and 0.2 < len(starts) / len(tokenizer) < 0.8
    traj = Trajectory("t")
    traj.extend([other, other], generated=False)
    traj.extend([word, other], generated=True, logprobs=[0.0, 0.0], versions=[0, 0])
    traj.extend([word], generated=False)
    traj.extend([other, word], generated=True, logprobs=[0.0, 0.0], versions=[0, 0])
    assert word_start_share(traj, starts) == 0.5 and word_start_share(Trajectory("t"), starts) == 0.0


def _plans_by_position(run, workload: Workload, seed: int, group_size: int) -> dict[int, list[list[int]]]:
    """Each trained group's per-episode turn tokens, checked against the plans its episodes' seeds draw."""
    groups: dict[int, list[list[int]]] = {}
    for path in sorted((run / "trajectories").glob("version-*.jsonl")):
        for line in path.read_text().splitlines():
            traj = json.loads(line)
            played = [t["generated_tokens"] for t in traj["turns"]]
            position = traj["group"]
            drawn = [
                list(
                    workload.plan(
                        int(np.random.SeedSequence([seed, position, k]).generate_state(1)[0]), traj["task_id"]
                    ).turn_tokens
                )
                for k in range(group_size)
            ]
            assert played in drawn  # the episode played exactly one of its group's drawn plans
            assert sum(traj["loss_mask"]) == sum(played)
            groups.setdefault(position, []).append(played)
    return {p: sorted(g) for p, g in groups.items()}


def test_bench_sweeps_staleness_at_equal_workload_with_reward(tmp_path, small_bundle):
    workload = Workload(
        turns_median=1.5,
        turns_p90=3,
        turns_max=3,
        turn_tokens_median=4,
        turn_tokens_max=8,
        episode_tokens_min=2,
        episode_tokens_max=20,
        seed=5,
    )
    out, runs = tmp_path / "bench_trainer.json", tmp_path / "runs"
    result = small_trainer_bench(out, runs, workload, rounds=2)
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(result))
    # interleaved: each round plays every bound, alternately forwards and backwards
    assert [(r["round"], r["staleness"], r["mode"]) for r in written["runs"]] == [
        (0, 0, "sync"),
        (0, 2, "async"),
        (1, 2, "async"),
        (1, 0, "sync"),
    ]
    plans = {}
    for r in written["runs"]:
        run = runs / f"round{r['round']}-eta{r['staleness']}"
        history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert r["steps"] == len(history) == 2
        # the steady-state metric counts the steps after the warm-up only, over their own window
        assert (
            r["steady_trained_tokens"]
            == sum(h["trained_tokens"] for h in history[1:])
            < sum(h["trained_tokens"] for h in history)
        )
        assert r["steady_tokens_per_s"] == pytest.approx(r["steady_trained_tokens"] / r["steady_window_s"], rel=0.01)
        assert r["steady_window_s"] < history[-1]["elapsed_s"]
        # the reward is non-zero, and the report's is the trained episodes' (the last final_steps steps)
        rewards = [
            [json.loads(line)["reward"] for line in path.read_text().splitlines()]
            for path in sorted((run / "trajectories").glob("version-*.jsonl"))
        ]
        assert r["reward_first_step"] == pytest.approx(statistics.fmean(rewards[0]), abs=1e-4)
        assert r["final_reward"]["mean"] == pytest.approx(statistics.fmean(rewards[-1]), abs=1e-4)
        assert r["final_reward"]["n"] == len(rewards[-1]) == 2
        assert any(x > 0 for step in rewards for x in step)
        assert r["staleness_max"] <= r["staleness"]
        for key in ("engine_idle_fraction", "learner_share", "admission_blocked_share"):
            assert 0.0 <= r[key] <= 1.0
        assert 0 < r["episodes_in_flight_mean"] <= 8
        # the engine's own counters: it decoded every trained token, batching rows, reusing cached prefixes
        assert r["engine_rows_per_decode_step"] >= 1 and r["engine_prefill_per_generated_token"] > 0
        assert len(r["load_average_1min"]) == 2
        assert r["episode_turns"]["max"] <= 3 and r["episode_tokens"]["max"] <= 20
        plans[(r["round"], r["staleness"])] = _plans_by_position(run, workload, 0, 2)
    # the same groups are the same episodes in every run, sync or async
    for groups in plans.values():
        for other in plans.values():
            assert all(groups[p] == other[p] for p in set(groups) & set(other))
    sweep = written["sweep"]
    assert set(sweep) == {"0", "2"} and sweep["0"]["mode"] == "sync" and sweep["2"]["mode"] == "async"
    assert sweep["0"]["speedup_per_round"] == [1.0, 1.0] and sweep["0"]["speedup_median"] == 1.0
    sync = {r["round"]: r for r in written["runs"] if r["staleness"] == 0}
    ratios = [
        r["steady_tokens_per_s"] / sync[r["round"]]["steady_tokens_per_s"]
        for r in written["runs"]
        if r["staleness"] == 2
    ]
    assert sweep["2"]["speedup_per_round"] == pytest.approx(ratios, abs=1e-3)
    assert sweep["2"]["speedup_median"] == pytest.approx(statistics.median(ratios), abs=1e-3)
    assert sweep["2"]["final_reward"]["per_round"] == [
        r["final_reward"]["mean"] for r in written["runs"] if r["staleness"] == 2
    ]
    assert (
        written["headline"]["staleness"] == 2 and written["headline"]["speedup_median"] == sweep["2"]["speedup_median"]
    )
    assert written["workload"]["turns_max"] == 3 and written["machine"]["cpus"] == os.cpu_count()


def test_bench_refuses_a_sweep_without_the_sync_baseline(tmp_path):
    with pytest.raises(ValueError, match="staleness must be .* including 0"):
        run_trainer_bench(TrainerBenchConfig(staleness=[1, 2], out=str(tmp_path / "x.json")))
    with pytest.raises(ValueError, match="warmup_steps"):
        run_trainer_bench(TrainerBenchConfig(steps=2, warmup_steps=2, out=str(tmp_path / "x.json")))


def test_planned_workflow_names_an_importable_class():
    from searchgym.agents.workflow import load_object
    from searchgym.bench.plan_workflow import PlannedWorkflow

    assert load_object(PLANNED_WORKFLOW) is PlannedWorkflow
    assert EpisodePlan((3, 4)).turns == 2 and EpisodePlan((3, 4)).tokens == 7


def test_a_tail_share_makes_that_share_of_episodes_play_every_turn_and_leaves_other_workloads_alone():
    tail = Workload(turns_max=128, episode_tokens_max=6144, tail_share=0.1)
    plans = [tail.plan(s, "t") for s in range(2000)]
    share = sum(p.turns == 128 for p in plans) / len(plans)
    assert 0.07 < share < 0.13  # the log-normal alone reaches 128 turns about 0.2% of the time
    assert [Workload().plan(s, "t") for s in range(50)] == [Workload(tail_share=0.0).plan(s, "t") for s in range(50)]
    with pytest.raises(ValueError, match="tail_share"):
        Workload(tail_share=1.5)


def test_the_planned_reward_counts_turns_in_every_context_segment():
    from searchgym.agents.trajectory import Segment, Trajectory
    from searchgym.bench.plan_workflow import word_start_share

    traj = Trajectory(task_id="t")
    traj.segments.append(Segment(input_ids=[5, 6, 9], loss_mask=[0, 1, 1]))  # a closed segment: one turn, starts 6
    traj.extend([5, 6], generated=False)
    traj.extend([7, 8], generated=True, logprobs=[-1.0, -1.0], versions=[0, 0])  # the live one: one turn, starts 7
    assert word_start_share(traj, frozenset({6})) == 0.5


def test_episode_tokens_count_every_context_segment(tmp_path):
    from searchgym.bench.trainer import _episodes

    row = {"reward": 1.0, "turns": [{}], "loss_mask": [0, 1, 1], "segments": [{"loss_mask": [0, 1, 1, 1]}]}
    (tmp_path / "version-00000.jsonl").write_text(json.dumps(row) + "\n")
    assert _episodes(tmp_path)[0]["tokens"] == 5


def test_bench_crosses_the_sweep_with_the_ppo_objective(tmp_path, small_bundle):
    """Issue 29's objective axis: each (bound, proximal) once per round; plain PPO's runs centre the trust region on
    the behaviour policy (its importance weight pi_prox / pi_behav is exactly 1), and each objective gets its own
    sweep against its own sync run."""
    workload = Workload(1.5, 3, 3, 4, 0.5, 8, 2, 20, seed=5)
    out, runs = tmp_path / "bench_trainer.json", tmp_path / "runs"
    result = small_trainer_bench(out, runs, workload, proximal=("recompute", "behaviour"))
    cells = [(r["staleness"], r["proximal"]) for r in result["runs"]]
    assert cells == [(0, "recompute"), (0, "behaviour"), (2, "recompute"), (2, "behaviour")]
    assert result["settings"]["proximal"] == ["recompute", "behaviour"]
    for eta, p in cells:
        run = runs / (f"round0-eta{eta}" if p == "recompute" else f"round0-eta{eta}-{p}")
        history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        weights = [v for h in history for k, v in h.items() if k.endswith("behav_weight_max")]
        assert weights, "the learner logs its importance weights"
        if p == "behaviour":
            assert all(w == 1.0 for w in weights)
    by = result["sweep_by_proximal"]
    assert set(by) == {"recompute", "behaviour"} and result["sweep"] == by["recompute"]
    plain = {r["staleness"]: r for r in result["runs"] if r["proximal"] == "behaviour"}
    ratio = plain[2]["steady_tokens_per_s"] / plain[0]["steady_tokens_per_s"]
    assert by["behaviour"]["2"]["speedup_per_round"] == pytest.approx([ratio], abs=1e-3)
    with pytest.raises(ValueError, match="proximal"):
        from searchgym.bench.trainer import TrainerBenchConfig
        from searchgym.settings import load_settings

        load_settings(TrainerBenchConfig, overrides=["proximal=[recompute,nope]"])


def small_trainer_bench(out, runs, workload, **settings):
    """bench trainer on the small world: 2 steps (1 warm-up) at staleness 0 and 2, tiny groups, fast tool latency."""
    shape = {k: v for k, v in dataclasses.asdict(workload).items() if k != "seed"}
    config = TrainerBenchConfig(
        **{
            "steps": 2,
            "warmup_steps": 1,
            "final_steps": 1,
            "staleness": [0, 2],
            "headline_staleness": 2,
            "size": SMALL["size"],
            "n_tasks": SMALL["n_tasks"],
            "world_seed": SMALL["seed"],
            "out": str(out),
            "workdir": str(runs),
            "group_size": 2,
            "batch_size": 1,
            "max_concurrent": 8,
            "workload_seed": workload.seed,
            "latency_ms": 2.0,
            "latency_alpha": 1.2,
            "latency_max_s": 0.02,
            **shape,
            **settings,
        }
    )
    return run_trainer_bench(config, progress=False)
