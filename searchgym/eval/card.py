"""The protocol card of an evaluation: everything its scores depend on, so that two runs compare safely.

A card has three parts. `protocol` holds the score-relevant fields, and its sha256 is the card hash:
the suite and a hash of its question set (ids, questions, references), every judge with its
definition (the LLM judge's model, decoding settings and prompt hash), k, sampling, turn/token/context
budgets, the env's prompt and the tool stack (backend kind, index manifest or replayed web-cache hash,
top_k, doc_chars, page chunking). `agent` is what was evaluated (engine, model fingerprint, workflow)
and `run` how it was run (seed, concurrency, env kwargs, searchgym's version and commit); those may
differ between runs that are compared. `eval compare` refuses runs whose protocols differ.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchgym.eval.eval_settings import EvalSettings

CARD_VERSION = 1
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "max_new_tokens")
SECRET_KEY = re.compile(r"(^|_)(api_?key|key|secret|password|passwd|token|auth|authorization)$", re.IGNORECASE)


def redacted(obj: Any) -> Any:
    """`obj` with the values of secret-looking keys (api_key, ..._token, password) replaced: cards get shared."""
    if isinstance(obj, Mapping):
        return {k: "<redacted>" if SECRET_KEY.search(str(k)) and v is not None else redacted(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redacted(v) for v in obj]
    return obj


def canonical_sha256(obj: Any) -> str:
    """sha256 of the canonical JSON form of `obj` (sorted keys, no whitespace): equal data, equal hash."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def question_set(tasks: Iterable[Any]) -> dict[str, Any]:
    """The size and hash of a question set: ids, questions and reference answers, order-free."""
    rows = sorted([str(t.id), t.question, sorted(t.answers)] for t in tasks)
    return {"questions": len(rows), "sha256": canonical_sha256(rows)}


# --- the tool stack --------------------------------------------------------------------------------


def web_cache_state(cache: Any) -> dict[str, Any]:
    """Mode, entry count and a hash of a WebCache's recorded rows (read-only; order-free)."""
    state: dict[str, Any] = {"mode": cache.mode}
    path = Path(cache.path)
    if cache.mode == "off" or not path.exists():
        return state
    digest, entries = hashlib.sha256(), 0
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            for kind, key, value in db.execute("SELECT kind, key, value FROM entries ORDER BY kind, key"):
                digest.update(json.dumps([kind, key, value]).encode())
                entries += 1
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        state["error"] = f"cannot read {path}: {e}"
        return state
    return {**state, "entries": entries, "sha256": digest.hexdigest()}


def _index_card(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """An on-disk index by its manifest: kind, size, corpus hash; paths left out (a moved index is the same)."""
    from searchgym.envs.tools.index_files import manifest_kind

    portable = {k: v for k, v in manifest.items() if not k.endswith("_path")}
    return {
        "kind": manifest_kind(dict(manifest)),
        "doc_count": manifest.get("doc_count"),
        "corpus_sha256": manifest.get("corpus_sha256"),
        "manifest_sha256": canonical_sha256(portable),
    }


def backend_card(backend: Any) -> dict[str, Any]:
    """What a search or page backend is, in the fields that change what the agent sees (no keys, no paths)."""
    from searchgym.envs.tools.hybrid import HybridIndex
    from searchgym.envs.tools.remote_search import RemoteSearch
    from searchgym.envs.tools.web_cache import CachedPages, CachedSearch
    from searchgym.envs.tools.web_fetch import WebFetcher
    from searchgym.envs.tools.web_search import WebSearch

    if isinstance(backend, (CachedSearch, CachedPages)):
        return backend_card(backend.backend)
    manifest = getattr(backend, "manifest", None)
    if isinstance(manifest, Mapping):
        return _index_card(manifest)
    if isinstance(backend, HybridIndex):
        return {
            "kind": "hybrid",
            "bm25": backend_card(backend.bm25),
            "dense": backend_card(backend.dense),
            "k_rrf": backend.k_rrf,
            "depth": backend.depth,
        }
    if isinstance(backend, RemoteSearch):
        return {
            "kind": "retrieval_server",
            "servers": len(backend.servers),
            "corpus": "not verifiable from the client (the server does not publish its index manifest)",
        }
    if isinstance(backend, WebSearch):
        return {
            "kind": "web_search",
            "provider": type(backend).__name__,
            "blocked_domains": sorted(getattr(backend.policy, "block", ()) or ()),
        }
    if isinstance(backend, WebFetcher):
        return {"kind": "web_fetch", "blocked_domains": sorted(getattr(backend.policy, "block", ()) or ())}
    return {"kind": type(backend).__name__}


def tool_stack(env: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(score-relevant tool fields, informational ones) of a SearchEnv.

    A web cache replayed without network (`replay_only`) fixes what the agent can see, so its hash is
    score-relevant; a read-write cache only saves money on the live web, so its state is informational.
    """
    search, pages = env.search_backend, env.page_backend
    protocol: dict[str, Any] = {
        "search": backend_card(search),
        "pages": "same as search" if pages is search else backend_card(pages),
        "format": env.tool_format,
        "top_k": env.top_k,
        "doc_chars": env.doc_chars,
        "page_chunk_chars": env.page_chunk_chars,
        "max_page_chars": env.max_page_chars,
        "max_page_chunks": env.max_page_chunks,
    }
    info: dict[str, Any] = {}
    cache = getattr(env, "web_cache", None) or getattr(search, "cache", None)
    if cache is not None:
        state = web_cache_state(cache)
        protocol["web_cache"] = state if state["mode"] == "replay_only" else {"mode": state["mode"]}
        info["web_cache"] = state
    return protocol, info


# --- judges ------------------------------------------------------------------------------------------


def judges_card(judges: Mapping[str, Any], primary: str, judge_model: dict[str, Any] | None) -> dict[str, Any]:
    """Every judge by name with what defines it; the LLM judge with its model, decoding and prompt hash."""
    from searchgym.envs.judges import FormatGate
    from searchgym.envs.llm_judge import JUDGE_PROMPT, LLMJudge

    out: dict[str, Any] = {}
    for name, judge in judges.items():
        inner = judge.inner if isinstance(judge, FormatGate) else judge
        entry: dict[str, Any] = {"kind": type(inner).__name__, "format_gate": isinstance(judge, FormatGate)}
        if isinstance(inner, LLMJudge):
            entry.update(
                {
                    "model": (judge_model or {}).get("identity"),
                    "decoding": dict(inner.decoding),
                    "prompt_sha256": hashlib.sha256(JUDGE_PROMPT.encode()).hexdigest(),
                }
            )
        out[name] = entry
    return {"primary": primary, "judges": out}


# --- software ---------------------------------------------------------------------------------------


def edited_package_files(root: Path) -> list[str] | None:
    """The tracked files under `root`/searchgym that differ from the checkout's commit; None where git cannot say."""
    try:
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "searchgym"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if status.returncode != 0:
        return None
    return sorted(line[3:] for line in status.stdout.splitlines() if line.strip())


def software() -> dict[str, Any]:
    """searchgym's version, and the git commit of its checkout (with `dirty` when it has local changes)."""
    import searchgym

    out: dict[str, Any] = {"version": getattr(searchgym, "__version__", None), "commit": None, "dirty": None}
    root = Path(searchgym.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if commit.returncode == 0:
            out["commit"] = commit.stdout.strip()
            edited = edited_package_files(root)
            out["dirty"] = None if edited is None else bool(edited)
    except (OSError, subprocess.SubprocessError):
        pass
    return out


# --- the card ---------------------------------------------------------------------------------------


@dataclass
class CardFacts:
    """What an evaluation learns on the way that its card records beside its settings: the env it played (a
    probe of it), the questions, the judges, the fingerprints of the judge's and the agent's models, what the
    episodes were sampled with, and the calls and tool costs counted over the stored samples."""

    env: Any
    tasks: Sequence[Any]
    judges: Mapping[str, Any]
    primary: str
    sampling: Any
    judge_model: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    llm_calls: Mapping[str, Any] = field(default_factory=dict)
    tool_costs: Mapping[str, float] = field(default_factory=dict)


def build_card(settings: EvalSettings, facts: CardFacts) -> dict[str, Any]:
    """The card of one evaluation (see the module docstring); `card["hash"]` is sha256 over `protocol`."""
    from searchgym.envs.suites import suite_of

    env, sampling = facts.env, facts.sampling
    suite = suite_of(settings.env)
    tools, tools_info = tool_stack(env)
    protocol = {
        "suite": {"env": settings.env, "name": suite.name if suite else None, **question_set(facts.tasks)},
        **judges_card(facts.judges, facts.primary, facts.judge_model),
        "reward_judge": getattr(env.judge, "name", type(env.judge).__name__),
        "k": settings.k,
        "sampling": {f: getattr(sampling, f) for f in SAMPLING_FIELDS},
        "budgets": {
            "max_turns": env.max_turns,
            "max_new_tokens_per_turn": sampling.max_new_tokens,
            "max_context_tokens": settings.max_context,
            "max_obs_tokens": env.max_obs_tokens,
            **({"cost_budget": dict(env.cost_budget)} if getattr(env, "cost_budget", None) else {}),
        },
        "prompt_sha256": hashlib.sha256(env.instructions.encode()).hexdigest(),
        "tools": tools,
    }
    run = {
        "seed": settings.seed,
        "env_kwargs": dict(settings.env_kwargs),
        "max_tasks": settings.max_tasks,
        "concurrency": settings.concurrency,
        "device": settings.device,
        "tokenizer": settings.tokenizer,
        "llm_calls": facts.llm_calls,
        "tool_costs": facts.tool_costs,
    }
    return {
        "version": CARD_VERSION,
        "hash": canonical_sha256(protocol),
        "protocol": protocol,
        "agent": {"engine": settings.engine, "model": facts.model, "workflow": settings.workflow},
        "run": {**redacted(run), **tools_info, "judge_model": facts.judge_model, "searchgym": software()},
    }


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested card part as {"a.b.c": leaf}; lists are leaves."""
    if isinstance(tree, Mapping) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: tree}


def differences(cards: Sequence[Mapping[str, Any]], part: str = "protocol") -> dict[str, list[Any]]:
    """The dotted fields of `part` ("protocol.k", ...) not equal in every card, with each card's value (None:
    absent)."""
    flat = [flatten(card.get(part) or {}, part) for card in cards]
    keys = sorted(set().union(*flat)) if flat else []
    return {key: [f.get(key) for f in flat] for key in keys if len({canonical_sha256(f.get(key)) for f in flat}) > 1}
