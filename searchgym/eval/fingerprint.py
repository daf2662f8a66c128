"""Which model played or judged a run: a hash of a local model's weights, or what its server says it serves.

A local model directory is identified by sha256 over its weight files (`*.safetensors`, else
`pytorch_model*.bin`) and its config/tokenizer files. Up to `FULL_HASH_MAX_BYTES` of weights every
byte is hashed and each file's digest is cached under searchgym's cache directory (keyed by path,
size and mtime; nothing is written into the model directory), so a rerun does not hash again.
Larger models are *sampled*: each weight file contributes its size, mtime and first and last MiB,
and the card says so (`method: sampled`); a copy of the same weights with other mtimes then gets
another hash. An SGLang server is identified by its `/model_info` (served name, path, weight
version) and an OpenAI-compatible endpoint by the model it names and its `/models` entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from searchgym.agents.engines.open import engine_kind
from searchgym.core.atomic_file import write_atomic
from searchgym.core.hashing import file_sha256
from searchgym.core.http_session import read_capped
from searchgym.world.bundle import default_cache_dir

FULL_HASH_MAX_BYTES = 2 * 1024**3
SAMPLE_BYTES = 1024**2
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.pt")
SMALL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)
HTTP_TIMEOUT_S = 10.0


def weight_files(model_dir: Path) -> list[Path]:
    """The weight files of a model directory: safetensors shards, else PyTorch pickles."""
    for pattern in WEIGHT_PATTERNS:
        found = sorted(p for p in model_dir.glob(pattern) if p.is_file())
        if found:
            return found
    return []


def _sampled_digest(path: Path) -> str:
    """sha256 of size, mtime and the first and last MiB: fast for any size, and says the file changed."""
    st = path.stat()
    digest = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:".encode())
    with open(path, "rb") as f:
        digest.update(f.read(SAMPLE_BYTES))
        f.seek(max(0, st.st_size - SAMPLE_BYTES))
        digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


class _DigestCache:
    """Per-file sha256 digests of one model directory, kept in searchgym's cache (never beside the model)."""

    def __init__(self, model_dir: Path, cache_dir: Path | None):
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        key = hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:24]
        self.path = root / "fingerprints" / f"{key}.json"
        try:
            self.entries: dict[str, Any] = json.loads(self.path.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            self.entries = {}
        self.changed = False

    def digest(self, path: Path) -> str:
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns]
        entry = self.entries.get(path.name)
        if isinstance(entry, dict) and entry.get("stamp") == stamp and isinstance(entry.get("sha256"), str):
            return entry["sha256"]
        value = file_sha256(path)
        self.entries[path.name] = {"stamp": stamp, "sha256": value}
        self.changed = True
        return value

    def save(self) -> None:
        if not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps({"files": self.entries}))
        except OSError:  # a read-only cache only costs a rehash next time
            pass


def weights_fingerprint(
    model_dir: str | os.PathLike,
    *,
    cache_dir: str | os.PathLike | None = None,
    full_hash_max_bytes: int = FULL_HASH_MAX_BYTES,
) -> dict[str, Any]:
    """sha256 over a local model's weight and config files; `method` says whether every byte was read."""
    model_dir = Path(model_dir)
    weights = weight_files(model_dir)
    if not weights:
        raise ValueError(f"{model_dir} holds no weight files ({', '.join(WEIGHT_PATTERNS)}): is it a model directory?")
    total = sum(p.stat().st_size for p in weights)
    full = total <= full_hash_max_bytes
    cache = _DigestCache(model_dir, Path(cache_dir) if cache_dir is not None else None) if full else None
    digests = {p.name: (cache.digest(p) if cache else _sampled_digest(p)) for p in weights}
    digests.update({name: file_sha256(model_dir / name) for name in SMALL_FILES if (model_dir / name).is_file()})
    if cache is not None:
        cache.save()
    combined = hashlib.sha256(json.dumps(sorted(digests.items())).encode()).hexdigest()
    method = (
        "full: every byte of every weight file"
        if full
        else f"sampled: size, mtime and first/last {SAMPLE_BYTES // 1024**2} MiB of each weight file "
        f"(weights over {full_hash_max_bytes / 1024**3:g} GiB); a copy with other mtimes hashes differently"
    )
    return {"sha256": combined, "method": method, "weight_files": len(weights), "weight_bytes": total}


MAX_INFO_BYTES = 1 << 20  # a /model_info or /models answer past this is refused (read no further)


async def _get_json(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, JSON body) of a GET; a body past MAX_INFO_BYTES is a ReplyTooLarge (a ValueError)."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        async with http.get(url, headers=headers or {}) as resp:
            if resp.status != 200:
                return resp.status, None
            return 200, json.loads(await read_capped(resp, MAX_INFO_BYTES))


MODEL_INFO_KEYS = ("model_path", "served_model_name", "tokenizer_path", "weight_version", "model_type")


async def sglang_fingerprint(addresses: list[str]) -> list[dict[str, Any]]:
    """Each server's `/model_info` (or the older `/get_model_info`), or the error that kept it from answering."""
    found = []
    for address in addresses:
        address = address.strip().rstrip("/")
        url = address if "://" in address else f"http://{address}"
        entry: dict[str, Any] = {"url": url}
        try:
            for route in ("/model_info", "/get_model_info"):
                status, info = await _get_json(url + route)
                if status == 200 and isinstance(info, dict):
                    entry.update({k: info.get(k) for k in MODEL_INFO_KEYS if k in info})
                    break
            else:
                entry["error"] = "answers neither /model_info nor /get_model_info"
        except Exception as e:  # noqa: BLE001 - a fingerprint that could not be taken is recorded, not fatal
            entry["error"] = f"{type(e).__name__}: {e}"
        found.append(entry)
    return found


async def openai_fingerprint(spec: str) -> dict[str, Any]:
    """The model an OpenAI-compatible spec names, with the endpoint's `/models` entry for it when it lists one."""
    from searchgym.agents.engines.openai_engine import parse_openai_spec

    base, model = parse_openai_spec(spec)
    out: dict[str, Any] = {"base_url": base, "model": model}
    key = os.environ.get("OPENAI_API_KEY")
    try:
        status, listing = await _get_json(base + "/models", {"Authorization": f"Bearer {key}"} if key else None)
        data = listing.get("data") if isinstance(listing, dict) else None
        if status != 200 or not isinstance(data, list):
            out["served"] = None
            out["error"] = f"GET /models answered {status}"
            return out
        entries = [e for e in data if isinstance(e, dict)]
        match = next((e for e in entries if e.get("id") == model), None)
        if match is None and model == "default" and len(entries) == 1:
            match = entries[0]
        out["served"] = (
            {k: match.get(k) for k in ("id", "owned_by", "created", "root") if k in match} if match else None
        )
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        out["served"] = None
        out["error"] = f"{type(e).__name__}: {e}"
    return out


async def engine_fingerprint(spec: str, *, cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """What an engine spec evaluates: {kind, identity, ...}; `identity` is the one string that names the model."""
    kind = engine_kind(spec)
    if kind == "local":
        weights = weights_fingerprint(spec, cache_dir=cache_dir)
        return {
            "kind": kind,
            "path": str(Path(spec).resolve()),
            "weights": weights,
            "identity": f"weights sha256 {weights['sha256']}",
        }
    if kind == "sglang":
        servers = await sglang_fingerprint([a for a in spec.removeprefix("sglang:").split(",") if a])
        names = sorted(
            {
                f"{s.get('served_model_name') or s.get('model_path')} (weight version {s.get('weight_version')})"
                for s in servers
                if "error" not in s
            }
        )
        identity = " | ".join(names) if names else None
        return {"kind": kind, "servers": servers, "identity": identity}
    info = await openai_fingerprint(spec)
    served = info.get("served") or {}
    return {"kind": kind, **info, "identity": served.get("id") or info["model"]}
