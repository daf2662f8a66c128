"""`searchgym synthesize`: its settings (the command's flags are these fields) and the two methods it runs."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from searchgym.settings import load_settings, setting


@dataclass
class SynthesizeSettings:
    """New hard questions over a corpus, by an LLM agent (`agent`) or from a world's facts (`kbwalk`)."""

    corpus: Path = setting(help="agent: an index dir or corpus JSONL; kbwalk: a world dir from `searchgym world build`")
    out: Path = setting(
        help="pool JSONL: the agent appends and resumes (OUT.progress.jsonl, OUT.summary.json); kbwalk writes it whole"
    )
    method: str = setting("agent", choices=("agent", "kbwalk"), help="an LLM agent, or walks over a world's facts")
    engine: str | None = setting(
        None, help="reasoning model: openai:http://host:port/v1[:model] or a local model directory"
    )
    judge_engine: str | None = setting(None, help="judge model (same forms; default: --engine)")
    n: int = setting(100, at_least=1, help="tasks wanted in the pool (a rerun resumes)")
    overwrite: bool = setting(False, help="kbwalk: replace an existing --out pool")
    concurrency: int = setting(4, at_least=1, help="candidates in flight")
    seed: int = setting(0, help="the candidates' seed")
    max_turns: int = setting(3, help="FUZZ/INJECT actions at most")
    k: int = setting(4, help="solver attempts per candidate")
    max_solve_rate: float = setting(0.0, help="keep candidates solved at most this often")
    max_tokens: int = setting(1024, help="tokens per reply")
    max_seeds: int | None = setting(None, help="seed pages to try at most")
    device: str = setting("cpu", help="for a local model directory")


def run_synthesize(settings: SynthesizeSettings) -> None:
    """Fill the pool at `settings.out` by the chosen method; print its report."""
    if settings.method == "kbwalk":
        _kbwalk(settings)
        return
    from searchgym.synthesis.qa_agent import QAConfig
    from searchgym.synthesis.run import SynthesisSettings, synthesize

    if not settings.engine:
        raise ValueError("--method agent needs --engine (openai:http://host/v1[:model] or a local model directory)")
    knobs = ("max_turns", "k", "max_solve_rate", "max_tokens")
    config = load_settings(QAConfig, values={key: getattr(settings, key) for key in knobs})
    run = SynthesisSettings(
        str(settings.corpus),
        settings.engine,
        settings.n,
        str(settings.out),
        judge_engine=settings.judge_engine,
        concurrency=settings.concurrency,
        seed=settings.seed,
        max_seeds=settings.max_seeds,
        device=settings.device,
        qa=config,
    )
    report = synthesize(run, progress=True)
    shown = ("out", "accepted", "acceptance_rate", "stages", "rejections", "this_run")
    print(json.dumps({k: report[k] for k in shown}, indent=2))


def _kbwalk(settings: SynthesizeSettings) -> None:
    from searchgym.core.atomic_file import write_atomic
    from searchgym.envs.tools.indexes import open_index
    from searchgym.synthesis.pool import summary_path
    from searchgym.world.commands import refuse_to_replace
    from searchgym.world.validation import synthesize_pool
    from searchgym.world.world import World

    refuse_to_replace(Path(settings.out), settings.overwrite)
    meta_path = Path(settings.corpus) / "world.json"
    if not meta_path.exists():
        raise ValueError(f"--method kbwalk needs --corpus WORLD_DIR from `searchgym world build` (no {meta_path})")
    meta = json.loads(meta_path.read_text())
    world = World(meta["size"], meta["seed"])
    index = open_index(settings.corpus, progress=True)  # WORLD/index, built on first use
    t0 = time.perf_counter()
    pool, report = synthesize_pool(world, index, settings.n, seed=settings.seed, progress=True)
    report["seconds"] = round(time.perf_counter() - t0, 2)
    # the summary first, the pool (written atomically) last: a kill between them leaves no pool, so a rerun runs
    write_atomic(summary_path(Path(settings.out)), json.dumps(report, indent=2) + "\n")
    pool.to_jsonl(settings.out)
    print(json.dumps(report, indent=2))
