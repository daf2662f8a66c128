"""A training run's resource plan and per-GPU memory estimate, computed before anything starts (`train --dry-run`).

    plan = make_plan(config, resolve_deployment(config))  # reads the model's config.json; starts nothing
    print(plan_text(plan)); plan.refusal                    # None, or why it cannot fit and what would

What it counts, per learner rank (every term at once: an upper bound of the step's peak):

- **parameters, gradients, optimizer state**: P parameters in `model.dtype` (p bytes each), sharded over the
  `learner.ranks` FSDP2 ranks. FSDP2's `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` (fsdp.py) keeps
  the *sharded* parameters in their original dtype, computes in bf16 on unsharded copies, reduces gradients in fp32
  and casts them back to the parameters' dtype; the optimizer steps the sharded parameters as they are, so there is
  no fp32 master copy (torch's MixedPrecisionPolicy docstring: "The optimizer step uses the sharded parameter in the
  original dtype"), and AdamW's exp_avg and exp_avg_sq take the parameters' dtype (`zeros_like`). So: P*p
  parameters, P*p gradients, 2*P*p optimizer state, all divided by the ranks; `learner.cpu_offload` moves all three
  to the host (CPUOffloadPolicy). `learner.ranks: 1` is the plain Learner: the same three terms, whole, computing in
  the weights' dtype, with neither checkpointing nor offload (it applies neither).
- **FSDP buffers** (not sharded): the root's unsharded parameters (embeddings, final norm, LM head) and two decoder
  layers' (the one computing and the one prefetched) in the compute dtype, plus one layer's unsharded gradient in
  fp32 for its reduce-scatter.
- **activations** of the step's largest micro-batch, T = max(`learner.micro_batch_tokens`, `rollout.max_context`)
  tokens (a trajectory longer than a micro-batch is trained alone, at its own length), counted as Korthikanti et al.
  2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198, section 4.1) count them:
  the tensors each operation saves for its backward pass. Their GPT layer keeps 34*s*b*h + 5*a*s^2*b bytes (16-bit
  activations, with dropout); the same count for a Hugging Face Qwen2/Llama layer (RMSNorm computed in fp32,
  SwiGLU MLP, grouped-query attention, fused SDPA attention that keeps no s^2 scores, no dropout), with b bytes per
  activation (2: bf16), is per token and layer

      (6b + 8)*h + 4b*I + 2b*h_kv + 4*a       h hidden, I intermediate, h_kv = kv heads * head dim, a heads

  (two norms keep their input, its fp32 copy and their output; q, the attention output and o_proj's input copy;
  k and v; the MLP's gate, up, SiLU and product; SDPA's fp32 log-sum-exp per head), and (b + 4)*h + 2b*head_dim + 12
  per token outside the layers. `tests/trainers/test_plan.py` checks the formula against the bytes autograd actually
  saves for a real model. Without checkpointing all L layers keep theirs, plus one layer's worth of activation
  gradients in the backward pass; with `learner.activation_checkpointing` each layer keeps only its input (b*h)
  and one layer is recomputed (its activations and their gradients) at a time.
- **loss head**: log-probs and entropies from the last hidden states a chunk of C = `learner.logit_chunk_tokens`
  positions at a time (lm_head.chunked_logprobs), so no [tokens, vocab] tensor exists whole: at most two [chunk,
  vocab] buffers at once (fp32 log-probs and probabilities; a b-byte product and its fp32 copy), min(C, T)*V*
  max(8, b + 4) bytes in the forward pass and its recomputation in the backward pass, plus, when T > C and the
  head is in 16 bits, an fp32 accumulator of its gradient (V*h*4), and three fp32 numbers per token.
  Before the chunked head, the whole logits of T trained tokens and three fp32 copies took T*V*(b + 12).

**This machine's host memory, when the learner trains on the CPU** (local launcher): everything above lives in host
memory, and so does the rest of the process, so the plan counts all of it at once against the machine's available
memory (`available_memory`: psutil, else /proc/meminfo's MemAvailable; `host_memory_gib` / `--host-memory-gib`
overrides it), less HOST_HEADROOM left free. First the terms the settings fix: every rank's learner terms at the
step's largest micro-batch (a trajectory longer than `learner.micro_batch_tokens` is trained alone, so the
activations are those of `rollout.max_context` tokens when that is longer); rank 0's consolidated copy (from 2
ranks); the in-process TorchEngine's own fp32 copy of the weights and its prefix cache; the runtime (RUNTIME_BYTES
per process); and ALLOCATOR_MARGIN of the activations, what the host allocator holds beyond live tensors at a
step's peak. Then the engine's batch of `rollout.max_concurrent_rollouts` rows of `rollout.max_context` tokens
(`memory.batch_bytes`: the KV cache twice, as a joining row's merge copies it, decode and prefill activations, times
the allocator factor measured for it), capped by what the rest leaves (`engine_budget`; past it, episodes wait for
a row). The local launcher gives its engine that budget, so the batch is sized not to take what the learner's step,
running beside it, will need. A plan whose fixed terms and one row exceed the memory is refused, naming the largest
`learner.micro_batch_tokens` (and `rollout.max_context`) that fits.

Measured (SmolLM2-135M-Instruct, fp32, one thread, one real `Learner` update on a full micro-batch with AdamW's
state present, peak RSS from `getrusage`): the learner terms alone are 0.90x, 0.89x and 0.88x the peak RSS at
1,024, 2,048 and 4,096 tokens (3.77 GB against 4.20 GB, 5.19 against 5.81, 8.04 against 9.15), 0.96x, 0.94x and
0.91x of what the process gained over the 0.27 GB it holds once torch and transformers are imported: the excess,
11%, 12% and 15% of the activations, grows with them (allocator caching and backward-pass buffers). The host total
for the same learner (the runtime and allocator terms added, no engine) is 1.09x, 1.08x and 1.06x the peak RSS.

SGLang servers: the weights per GPU (P * bytes / tp) must fit in `ray.sglang_mem_fraction_static` of the GPU (the
static pool that holds weights and KV cache); what is left is KV cache, reported in tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from searchgym.agents.engines.memory import RSS_FACTOR, available_memory, batch_bytes, kv_bytes_per_token
from searchgym.trainers.config import LearnerConfig, TrainConfig
from searchgym.trainers.deployment import Deployment, Processes

GIB = 2**30
SHAPES = "shapes.json"  # package data next to this module
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8, "double": 8}
TINY_MODEL = "a fresh tiny model (agents/tiny_model.py: TinyShape's defaults)"
MAX_RANKS = 4096  # the most ranks a remedy proposes
RUNTIME_BYTES = (
    GIB // 2
)  # one process itself: Python, torch, transformers and the rest (0.27 GB measured for the first two)
ALLOCATOR_MARGIN = 0.2  # of the activations: what a step's peak RSS holds beyond the terms (11% to 15% measured)
ENGINE_DTYPE_BYTES = 4  # the in-process TorchEngine holds its weights and KV cache in fp32 (open_engine's default)
# of the available memory a CPU plan leaves free: the environments, the trajectories and what the host allocator holds
# beyond the measured factors (a long-horizon SmolLM2 run was OOM-killed at 23.2 GiB where these terms, the longest
# trajectory counted and the old engine budget, came to 20.8)
HOST_HEADROOM = 0.1


class PlanError(ValueError):
    """A plan that cannot run: the CLI prints the message and exits with status 2."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs of a model: exact parameter counts and the shapes activations scale with."""

    name: str
    source: str  # where the shapes came from (a config.json on disk, the package's table, the tiny model)
    parameters: int  # sum(p.numel()) of the model built on the meta device (tied weights once)
    layer_parameters: int  # one decoder layer's
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied: bool

    @property
    def root_parameters(self) -> int:
        """Parameters outside the decoder layers: embeddings, final norm, LM head (FSDP's root)."""
        return self.parameters - self.num_layers * self.layer_parameters


@dataclass(frozen=True)
class Term:
    """One line of a memory estimate: bytes on one device (`where`: "gpu" or "host")."""

    name: str
    bytes: int
    where: str
    detail: str


@dataclass
class Plan:
    """The whole dry run: the deployment, the learner's per-rank memory, the servers' and whether it all fits."""

    deployment: Deployment  # what runs where (its processes and their totals), as the launchers will run it
    model: ModelShape
    gpu_memory_bytes: int
    learner: list[Term]
    load_bytes: int  # each rank's GPU while the whole model is loaded, before it is sharded
    host: list[Term]
    servers: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    refusal: str | None = None
    machine: list[Term] = field(default_factory=list)  # a CPU learner: all this machine's host memory holds at once
    host_memory_bytes: int | None = None  # the machine's available memory the CPU plan is checked against
    host_memory_source: str = ""

    @property
    def groups(self) -> list[Processes]:
        """The processes or actors the run starts (the deployment's)."""
        return list(self.deployment.processes)

    @property
    def total(self) -> dict[str, float]:
        """CPUs and GPUs they hold together."""
        return self.deployment.resources

    @property
    def on_gpu(self) -> bool:
        """The learner ranks hold GPUs."""
        return self.deployment.learner_on_gpu

    @property
    def learner_gpu_bytes(self) -> int:
        """The estimate for one learner rank's GPU: every GPU term at once."""
        return gpu_bytes(self.learner)

    @property
    def machine_bytes(self) -> int:
        """A CPU plan's host total: every term of `machine` at once."""
        return sum(t.bytes for t in self.machine)

    def to_json(self) -> dict[str, Any]:
        """The plan as plain JSON-ready data (what `--dry-run --json` prints)."""
        return {
            "deployment": self.deployment.to_json(),
            "launcher": self.deployment.launcher,
            "learner_ranks": self.deployment.learner_ranks,
            "model": dataclasses.asdict(self.model),
            "groups": [dataclasses.asdict(g) for g in self.groups],
            "total": self.total,
            "cluster": self.deployment.cluster,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "learner_on_gpu": self.on_gpu,
            "learner_memory": [dataclasses.asdict(t) for t in self.learner],
            "learner_gpu_bytes": self.learner_gpu_bytes,
            "load_gpu_bytes": self.load_bytes,
            "host_memory": [dataclasses.asdict(t) for t in self.host],
            "servers": self.servers,
            "machine_memory": [dataclasses.asdict(t) for t in self.machine],
            "machine_bytes": self.machine_bytes,
            "host_memory_bytes": self.host_memory_bytes,
            "host_memory_source": self.host_memory_source,
            "notes": self.notes,
            "fits": self.refusal is None,
            "refusal": self.refusal,
        }


# ---- the model's shapes ----------------------------------------------------------------------------------------


def known_shapes() -> dict[str, dict[str, Any]]:
    """The package's table of config.json shapes (shapes.json), aliases resolved: {hub id: config.json fields}."""
    table = json.loads(resources.files("searchgym.trainers").joinpath(SHAPES).read_text())
    models = dict(table["models"])
    models.update({alias: models[target] for alias, target in table["aliases"].items()})
    return models


def model_shape(path: str | None) -> ModelShape:
    """The shapes of `model.path`: its config.json on disk, else the package's table for hub ids, else the HF cache.

    Parameters are counted exactly by building the model on the meta device (no weights are read or allocated).
    """
    from transformers import AutoConfig

    if path is None:
        from searchgym.agents.tiny_model import TinyShape

        shape = TinyShape()
        fields = {
            "model_type": "qwen2",
            "hidden_size": shape.hidden_size,
            "intermediate_size": shape.intermediate_size,
            "num_hidden_layers": shape.num_layers,
            "num_attention_heads": shape.num_heads,
            "num_key_value_heads": shape.num_kv_heads,
            "vocab_size": shape.vocab_size,
            "tie_word_embeddings": True,
        }
        return _count("searchgym tiny model", TINY_MODEL, AutoConfig.for_model(**fields))
    local = Path(path).expanduser()
    if (local / "config.json").is_file():
        return _count(path, f"{local / 'config.json'}", AutoConfig.from_pretrained(local))
    table = known_shapes()
    if path in table:
        return _count(
            path,
            f"searchgym/trainers/{SHAPES} (the public config.json of {path}: no such directory here)",
            AutoConfig.for_model(**table[path]),
        )
    try:  # a hub id downloaded before: the Hugging Face cache, never the network
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        raise PlanError(
            f"model.path {path!r}: no config.json on disk, not in the Hugging Face cache, and not one of "
            f"the known shapes ({', '.join(sorted(table))}): download it, or point model.path at a "
            "model directory"
        ) from None
    return _count(path, "the Hugging Face cache's config.json", config)


def _count(name: str, source: str, config: Any) -> ModelShape:
    """Build `config`'s causal LM on the meta device and count its parameters (tied weights once)."""
    import torch
    from transformers import AutoModelForCausalLM

    from searchgym.trainers.algorithm.fsdp import decoder_layers

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    layers = decoder_layers(model)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelShape(
        name=name,
        source=source,
        parameters=sum(p.numel() for p in model.parameters()),
        layer_parameters=sum(p.numel() for p in layers[0].parameters()),
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        num_layers=len(layers),
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=text.vocab_size,
        tied=bool(getattr(text, "tie_word_embeddings", False)),
    )


# ---- the memory model ------------------------------------------------------------------------------------------


def dtype_bytes(name: str) -> int:
    """Bytes per element of a torch floating dtype name ("bfloat16" -> 2)."""
    if name not in DTYPE_BYTES:
        raise PlanError(f"model.dtype {name!r} is not one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def layer_activation_bytes(shape: ModelShape, act_bytes: int) -> int:
    """Bytes one decoder layer saves for backward per token (module docstring: Korthikanti et al. 2022's count)."""
    b, h = act_bytes, shape.hidden_size
    return (
        (6 * b + 8) * h
        + 4 * b * shape.intermediate_size
        + 2 * b * shape.num_kv_heads * shape.head_dim
        + 4 * shape.num_heads
    )


def outside_activation_bytes(shape: ModelShape, act_bytes: int, checkpointing: bool = False) -> int:
    """Bytes saved per token outside the decoder layers: the embedding output and the final norm's ((b + 4)*h), the
    rotary cos/sin tables the layers share (2b*head_dim; recomputed inside checkpointed layers) and 12 bytes of ids
    and positions."""
    rotary = 0 if checkpointing else 2 * act_bytes * shape.head_dim
    return (act_bytes + 4) * shape.hidden_size + rotary + 12


def stored_activation_bytes(shape: ModelShape, tokens: int, act_bytes: int, checkpointing: bool) -> int:
    """What autograd keeps after the forward pass of `tokens` tokens (the part the test measures)."""
    per_layer = act_bytes * shape.hidden_size if checkpointing else layer_activation_bytes(shape, act_bytes)
    return tokens * (shape.num_layers * per_layer + outside_activation_bytes(shape, act_bytes, checkpointing))


def loss_head_bytes(shape: ModelShape, tokens: int, chunk_tokens: int, act_bytes: int) -> int:
    """The chunked loss head's peak for `tokens` trained tokens (module docstring)."""
    accumulator = shape.vocab_size * shape.hidden_size * 4 if tokens > chunk_tokens and act_bytes < 4 else 0
    return min(chunk_tokens, tokens) * shape.vocab_size * max(8, act_bytes + 4) + accumulator + 12 * tokens


def learner_terms(
    shape: ModelShape, learner: LearnerConfig, *, ranks: int, dtype: str, on_gpu: bool, sized_by: str = ""
) -> list[Term]:
    """One learner rank's memory, term by term (module docstring), for a learner of `ranks` ranks (the deployment's
    learner ranks, or a remedy's); `sized_by` says what sets the micro-batch's tokens when not the setting itself.

    One rank is the plain Learner: no FSDP, so no buffers and no mixed precision (it computes in the weights'
    dtype), and it applies neither activation checkpointing nor CPU offload. More ranks are FSDP2's.
    """
    p, tokens = dtype_bytes(dtype), learner.micro_batch_tokens
    sharded = ranks > 1
    b = 2 if on_gpu and sharded else p  # FSDP's mixed precision computes in bf16 on GPUs
    offload = learner.cpu_offload and sharded
    ckpt = learner.activation_checkpointing and sharded
    device = "gpu" if on_gpu else "host"
    where = "host" if offload else device
    shard = f"{dtype}, 1/{ranks} of {shape.parameters:,}" if sharded else f"{dtype}, {shape.parameters:,} (one rank)"
    offloaded = " (learner.cpu_offload: on the host)" if offload else ""
    layer = layer_activation_bytes(shape, b)
    activations = stored_activation_bytes(shape, tokens, b, ckpt) + (2 if ckpt else 1) * tokens * layer
    how = (
        "checkpointing on: each layer keeps its input, one layer recomputed at a time"
        if ckpt
        else f"checkpointing off: all {shape.num_layers} layers keep theirs"
    )
    master = "FSDP2 keeps no fp32 master copy" if sharded else "the plain Learner keeps no fp32 master copy"
    terms = [
        Term("parameters", math.ceil(shape.parameters * p / ranks), where, shard + offloaded),
        Term(
            "gradients",
            math.ceil(shape.parameters * p / ranks),
            where,
            f"{dtype}{' (reduced in fp32, kept in the parameters dtype)' if sharded else ''}{offloaded}",
        ),
        Term(
            "optimizer state",
            math.ceil(2 * shape.parameters * p / ranks),
            where,
            f"AdamW exp_avg + exp_avg_sq in {dtype}, the parameters' dtype ({master}){offloaded}",
        ),
    ]
    if sharded:
        terms.append(
            Term(
                "FSDP buffers",
                (shape.root_parameters + 2 * shape.layer_parameters) * b + 4 * shape.layer_parameters,
                device,
                "unsharded root (embeddings, LM head) and 2 layers in the compute dtype, one layer's fp32 gradient",
            )
        )
    terms += [
        Term(
            "activations",
            activations,
            device,
            f"{sized_by or f'{tokens:,} tokens a micro-batch'}, {how} ({layer:,} B per token and layer)",
        ),
        Term(
            "loss head",
            loss_head_bytes(shape, tokens, learner.logit_chunk_tokens, b),
            device,
            f"logits of {min(tokens, learner.logit_chunk_tokens):,} positions at a time (learner.logit_chunk_tokens) x "
            f"{shape.vocab_size:,} vocab, two buffers at once",
        ),
    ]
    return terms


def step_learner(config: TrainConfig, learner: LearnerConfig | None = None) -> LearnerConfig:
    """`learner` (the config's by default) at its step's largest micro-batch: a trajectory longer than
    `learner.micro_batch_tokens` is trained alone at its own length, so up to `rollout.max_context` tokens."""
    learner = learner or config.learner
    longest = max(learner.micro_batch_tokens, config.rollout.max_context)
    return dataclasses.replace(learner, micro_batch_tokens=longest)


def step_terms(config: TrainConfig, shape: ModelShape, *, ranks: int, on_gpu: bool) -> list[Term]:
    """One learner rank's terms (`learner_terms`) at the step's largest micro-batch (`step_learner`), their details
    naming the longest trajectory where it is what sizes them."""
    learner, step = config.learner, step_learner(config)
    longest = step.micro_batch_tokens
    alone = (
        f"the longest trajectory, rollout.max_context={longest:,} tokens, trained alone (longer than "
        f"learner.micro_batch_tokens={learner.micro_batch_tokens:,})"
        if longest > learner.micro_batch_tokens
        else ""
    )
    return learner_terms(shape, step, ranks=ranks, dtype=config.model.dtype, on_gpu=on_gpu, sized_by=alone)


def gpu_bytes(terms: list[Term]) -> int:
    """The GPU terms' sum."""
    return sum(t.bytes for t in terms if t.where == "gpu")


# ---- the plan --------------------------------------------------------------------------------------------------


def machine_terms(config: TrainConfig, deployment: Deployment, shape: ModelShape, capacity: int) -> list[Term]:
    """Everything the host memory of this machine holds at once when the learner trains on its CPU (module
    docstring), for a machine of `capacity` available bytes: the fixed terms, then the in-process TorchEngine's
    batch, which takes what they leave (`engine_budget`)."""
    terms = fixed_machine_terms(config, deployment, shape)
    if deployment.engine == "torch":
        budget = engine_budget(config, deployment, shape, capacity)
        terms.insert(-2, engine_batch_term(config, shape, budget))  # before the runtime and the allocator margin
    return terms


def fixed_machine_terms(config: TrainConfig, deployment: Deployment, shape: ModelShape) -> list[Term]:
    """The host terms whose size the settings fix: every rank's learner at the step's largest micro-batch (a
    trajectory longer than `learner.micro_batch_tokens` is trained alone, so up to `rollout.max_context` tokens), rank
    0's consolidated copy, the engine's weights and prefix cache, the runtime and the allocator's margin."""
    ranks = deployment.learner_ranks
    per_rank = step_terms(config, shape, ranks=ranks, on_gpu=False)
    times = f" x {ranks} ranks" if ranks > 1 else ""
    terms = [Term(t.name, t.bytes * ranks, "host", t.detail + times) for t in per_rank]
    if ranks > 1:
        terms.append(
            Term(
                "consolidated copy",
                shape.parameters * dtype_bytes(config.model.dtype),
                "host",
                "rank 0's unsharded copy for weight pushes and checkpoints",
            )
        )
    if deployment.engine == "torch":
        from searchgym.agents.engines.torch_engine import PREFIX_CACHE_BYTES

        terms += [
            Term("engine weights", shape.parameters * ENGINE_DTYPE_BYTES, "host", "the TorchEngine's own fp32 copy"),
            Term("engine prefix cache", PREFIX_CACHE_BYTES, "host", "finished turns' keys and values, its budget"),
        ]
    activations = sum(t.bytes for t in per_rank if t.name == "activations") * ranks
    terms += [
        Term("runtime", RUNTIME_BYTES * ranks, "host", f"Python, torch and the libraries, per process{times}"),
        Term(
            "allocator margin",
            int(activations * ALLOCATOR_MARGIN),
            "host",
            f"{ALLOCATOR_MARGIN:.0%} of the activations: freed memory the allocator keeps at the peak (measured)",
        ),
    ]
    return terms


def engine_budget(config: TrainConfig, deployment: Deployment, shape: ModelShape, capacity: int) -> int:
    """The in-process CPU TorchEngine's batch budget (`EngineLimits.memory_budget_bytes`): what `capacity`, less
    HOST_HEADROOM, leaves after the fixed terms. The local launcher gives it to its engine, so the engine's batch is
    sized not to take the memory the learner's step will need (it runs beside the engine in async training)."""
    fixed = sum(t.bytes for t in fixed_machine_terms(config, deployment, shape))
    return max(int(capacity * (1 - HOST_HEADROOM)) - fixed, 0)


def few_rows_warning(config: TrainConfig, deployment: Deployment, shape: ModelShape, capacity: int) -> list[str]:
    """A line when the engine's budget leaves fewer rows of full context at once than a group: episodes then decode
    a few at a time while the learner's memory sits idle between steps (the launcher logs it as a warning)."""
    rows = engine_rows(config, shape, engine_budget(config, deployment, shape, capacity))
    group = min(config.rollout.group_size, config.rollout.max_concurrent_rollouts)
    if rows >= group:
        return []
    return [
        f"the engine's memory budget leaves {rows} row(s) of full context (rollout.max_context="
        f"{config.rollout.max_context:,}) at once, fewer than a group ({group}): rollouts will crawl; a smaller "
        "learner.micro_batch_tokens or rollout.max_context leaves the engine more"
    ]


def engine_batch_bytes(config: TrainConfig, shape: ModelShape, rows: int) -> int:
    """What the in-process TorchEngine's batch of `rows` rows of `rollout.max_context` tokens takes (its own estimate,
    `memory.batch_bytes`, in fp32)."""
    from searchgym.agents.engines.torch_engine import PREFILL_TOKENS

    sizes = {
        "layers": shape.num_layers,
        "kv_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "hidden": shape.hidden_size,
        "intermediate": shape.intermediate_size,
        "vocab": shape.vocab_size,
    }
    tokens = config.rollout.max_context
    return batch_bytes(sizes, ENGINE_DTYPE_BYTES, rows=rows, tokens=tokens, prefill_tokens=PREFILL_TOKENS)


def engine_rows(config: TrainConfig, shape: ModelShape, budget: int) -> int:
    """How many rows of full context (`rollout.max_context`) decode at once under `budget`: at least one (an empty
    batch takes one), at most `rollout.max_concurrent_rollouts`."""
    rows = 1
    while rows < config.rollout.max_concurrent_rollouts and engine_batch_bytes(config, shape, rows + 1) <= budget:
        rows += 1
    return rows


def engine_batch_term(config: TrainConfig, shape: ModelShape, budget: int) -> Term:
    """The in-process TorchEngine's batch: `rollout.max_concurrent_rollouts` rows of `rollout.max_context` tokens,
    capped by its `budget` (past it, episodes wait for a row), never less than one row (an empty batch takes one)."""
    rollout, gib = config.rollout, lambda n: f"{n / GIB:.1f} GiB"  # noqa: E731
    per_token = kv_bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim, ENGINE_DTYPE_BYTES)
    full = engine_batch_bytes(config, shape, rollout.max_concurrent_rollouts)
    one = engine_batch_bytes(config, shape, 1)
    rows = engine_rows(config, shape, budget)
    capped = (
        f"; capped by the engine's memory budget ({gib(budget)}: what the memory less {HOST_HEADROOM:.0%} leaves "
        f"after the other terms): of {gib(full)}, {rows} of {rollout.max_concurrent_rollouts} rows at full context "
        f"at once{' (one row at least: an empty batch always takes one)' if budget < one else ''}, the rest wait"
        if full > budget
        else ""
    )
    return Term(
        "engine batch",
        max(min(full, budget), one),
        "host",
        f"KV cache of {rollout.max_concurrent_rollouts} rollouts x {rollout.max_context:,} tokens x "
        f"{per_token:,} B (fp32), twice (a joining row's merge copies the batch), decode and prefill "
        f"activations, x {RSS_FACTOR:g} for the allocator (measured){capped}",
    )


def host_remedies(config: TrainConfig, deployment: Deployment, shape: ModelShape, capacity: int) -> list[str]:
    """The largest token bound with which a CPU plan fits `capacity` (less HOST_HEADROOM) and still leaves the engine
    a group's rows of full context at once (`rollout.group_size`; fewer serialise the rollouts), as the settings to
    change: `learner.micro_batch_tokens`, and `rollout.max_context` where the longest trajectory (trained alone) must
    shrink too (with `rollout.summary_tokens` where the summarise policy needs it); each computed with the estimate
    itself."""
    usable = int(capacity * (1 - HOST_HEADROOM))
    rollout = config.rollout
    reserved = min(rollout.group_size, rollout.max_concurrent_rollouts) if deployment.engine == "torch" else 0

    def fits(smaller: TrainConfig) -> bool:
        engine = engine_batch_bytes(smaller, shape, reserved) if reserved else 0
        return sum(t.bytes for t in fixed_machine_terms(smaller, deployment, shape)) + engine <= usable

    found = largest_token_bound(config, fits)
    if found is None:
        return []
    rows = engine_rows(found, shape, engine_budget(found, deployment, shape, capacity)) if reserved else 0
    engine = f" (the engine then decodes {rows} rows of full context at once)" if reserved else ""
    return [token_fix(config, found) + engine]


def make_plan(
    config: TrainConfig, deployment: Deployment, *, gpu_memory_gib: float = 80.0, host_memory_gib: float | None = None
) -> Plan:
    """The run's resource plan and memory estimate; `refusal` says why it cannot fit (and what would), else None.

    `deployment` is the config's, resolved once (`resolve_deployment`), as the launchers take it. A CPU learner
    under the local launcher is checked against this machine's available memory, or `host_memory_gib` when given.
    """
    if not (gpu_memory_gib > 0 and math.isfinite(gpu_memory_gib)):
        raise PlanError(f"--gpu-memory-gib must be a positive number of GiB, got {gpu_memory_gib}")
    if host_memory_gib is not None and not (host_memory_gib > 0 and math.isfinite(host_memory_gib)):
        raise PlanError(f"--host-memory-gib must be a positive number of GiB, got {host_memory_gib}")
    shape = model_shape(config.model.path)
    on_gpu = deployment.learner_on_gpu
    capacity = int(gpu_memory_gib * GIB)
    terms = step_terms(config, shape, ranks=deployment.learner_ranks, on_gpu=on_gpu)
    plan = Plan(
        deployment,
        shape,
        capacity,
        terms,
        0 if config.learner.cpu_offload or not on_gpu else shape.parameters * dtype_bytes(config.model.dtype),
        _host_terms(config, deployment, shape, terms),
        _servers(config, deployment, shape, capacity),
    )
    if deployment.launcher == "local" and on_gpu and deployment.engine == "torch":
        engine = Term(
            "rollout engine weights",
            shape.parameters * 4,
            "gpu",
            f"rank 0's GPU also holds the in-process TorchEngine's fp32 copy ({deployment.engine_device}), "
            "plus its KV cache",
        )
        plan.learner.append(engine)
        plan.notes.append("the in-process TorchEngine shares rank 0's GPU: its weights are counted above")
    plan.notes += _notes(config, deployment)
    if not on_gpu and deployment.launcher == "local":
        found = (int(host_memory_gib * GIB), "--host-memory-gib") if host_memory_gib is not None else available_memory()
        if found is None:
            plan.notes.append("this machine's available memory is unknown (no psutil, no /proc/meminfo): not checked")
        else:
            plan.host_memory_bytes, plan.host_memory_source = found
            plan.machine = machine_terms(config, deployment, shape, found[0])
            if deployment.engine == "torch":
                plan.notes += few_rows_warning(config, deployment, shape, found[0])
    elif not on_gpu:
        plan.notes.append("host memory not checked: Ray places the learner and rollout actors over the cluster")
    plan.refusal = _refusal(plan, config)
    return plan


def _host_terms(config: TrainConfig, deployment: Deployment, shape: ModelShape, terms: list[Term]) -> list[Term]:
    """What each rank holds in host memory besides its learner terms: the model it loads, rank 0's consolidated copy
    (sharded), the offloaded state (learner.cpu_offload)."""
    p = dtype_bytes(config.model.dtype)
    host = [
        Term(
            "model load",
            shape.parameters * p,
            "host",
            "each rank reads the whole model into host memory before sharding it",
        )
    ]
    if deployment.sharded:
        host.append(
            Term(
                "consolidated copy (rank 0)",
                shape.parameters * p,
                "host",
                "rank 0's unsharded copy for weight pushes and checkpoints",
            )
        )
    if config.learner.cpu_offload:
        host.append(
            Term(
                "offloaded state per rank",
                sum(
                    t.bytes
                    for t in terms
                    if t.where == "host" and t.name in ("parameters", "gradients", "optimizer state")
                ),
                "host",
                "parameters, gradients and optimizer state of one rank (pinned)",
            )
        )
    return host


def _notes(config: TrainConfig, deployment: Deployment) -> list[str]:
    """What the estimate leaves out or the settings waste: a plain learner's ignored options, GPUs one rank cannot
    use."""
    notes, learner = [], config.learner
    if not deployment.sharded and (learner.activation_checkpointing or learner.cpu_offload):
        notes.append(
            "learner.ranks=1 runs the plain Learner, which applies neither learner.activation_checkpointing "
            "nor learner.cpu_offload (the sharded learner does, from 2 ranks): the estimate leaves them out"
        )
    if deployment.launcher == "ray" and not deployment.sharded and config.ray.learner_gpus > 1:
        notes.append(
            f"learner.ranks=1 trains on one device: {config.ray.learner_gpus:g} GPUs are reserved for it "
            f"(ray.learner_gpus is per rank); for FSDP2 over them set learner.ranks="
            f"{config.ray.learner_gpus:g} ray.learner_gpus=1"
        )
    return notes


def _servers(config: TrainConfig, deployment: Deployment, shape: ModelShape, capacity: int) -> dict[str, Any] | None:
    """SGLang servers launched on GPUs: weights per GPU against the static pool, and the KV cache left."""
    ray_cfg = config.ray
    if deployment.servers != "launched" or deployment.server_program != "sglang":
        return None
    tp = max(ray_cfg.sglang_gpus_per_server, 1)
    args = list(ray_cfg.sglang_args)
    dtype = args[args.index("--dtype") + 1] if "--dtype" in args[:-1] else config.model.dtype
    size = DTYPE_BYTES.get(dtype, dtype_bytes(config.model.dtype))
    weights = math.ceil(shape.parameters * size / tp)
    pool = int(ray_cfg.sglang_mem_fraction_static * capacity)
    kv_per_token = 2 * shape.num_layers * max(1, math.ceil(shape.num_kv_heads / tp)) * shape.head_dim * size
    kv_tokens = max(pool - weights, 0) // kv_per_token
    in_flight = math.ceil(config.rollout.max_concurrent_rollouts / deployment.server_count)
    return {
        "servers": deployment.server_count,
        "tp": tp,
        "dtype": dtype,
        "weights_per_gpu_bytes": weights,
        "mem_fraction_static": ray_cfg.sglang_mem_fraction_static,
        "static_pool_bytes": pool,
        "kv_bytes_per_token": kv_per_token,
        "kv_cache_tokens": kv_tokens,
        "episodes_per_server": in_flight,
        "full_context_episodes": kv_tokens // max(config.rollout.max_context, 1),
    }


# ---- the verdict -----------------------------------------------------------------------------------------------


def _need(config: TrainConfig, shape: ModelShape, learner: LearnerConfig, ranks: int, extra: int) -> int:
    """GPU bytes of one rank under `learner` on `ranks` ranks at the step's largest micro-batch (`step_learner`), with
    `extra` bytes of other GPU terms."""
    step = step_learner(config, learner)
    return gpu_bytes(learner_terms(shape, step, ranks=ranks, dtype=config.model.dtype, on_gpu=True)) + extra


def _fits(config: TrainConfig, shape: ModelShape, learner: LearnerConfig, ranks: int, capacity: int, extra: int) -> int:
    """`_need`'s bytes, or -1 when they do not fit `capacity`."""
    need = _need(config, shape, learner, ranks, extra)
    return need if need <= capacity else -1


def token_bound(config: TrainConfig, tokens: int) -> TrainConfig:
    """`config` with `learner.micro_batch_tokens` and `rollout.max_context` each at most `tokens`: the one bound on
    the step's largest micro-batch (a trajectory longer than a micro-batch is trained alone, at its own length); under
    the summarise policy `rollout.summary_tokens` at most half the context, as its check requires."""
    learner, rollout = config.learner, config.rollout
    context = min(rollout.max_context, tokens)
    summary = min(rollout.summary_tokens, context // 2) if rollout.context_policy == "summarise" else None
    return dataclasses.replace(
        config,
        learner=dataclasses.replace(learner, micro_batch_tokens=min(learner.micro_batch_tokens, tokens)),
        rollout=dataclasses.replace(
            rollout, max_context=context, summary_tokens=rollout.summary_tokens if summary is None else summary
        ),
    )


def largest_token_bound(config: TrainConfig, fits: Callable[[TrainConfig], bool]) -> TrainConfig | None:
    """The `token_bound` of `config` with the most tokens that `fits` (the plan's sizes only grow with tokens, so by
    bisection below the step's largest micro-batch), or None when none does (the summarise policy needs 2 tokens at
    least: one of summary, half the context)."""
    low, high = 0, step_learner(config).micro_batch_tokens - 1
    while low < high:
        mid = (low + high + 1) // 2
        if fits(token_bound(config, mid)):
            low = mid
        else:
            high = mid - 1
    if low < (2 if config.rollout.context_policy == "summarise" else 1):
        return None
    return token_bound(config, low)


def token_fix(config: TrainConfig, found: TrainConfig) -> str:
    """The settings `found` (a `token_bound` of `config`) changes, as `key=value` text."""
    fixes = []
    if found.learner.micro_batch_tokens < config.learner.micro_batch_tokens:
        fixes.append(f"learner.micro_batch_tokens={found.learner.micro_batch_tokens}")
    if found.rollout.max_context < config.rollout.max_context:
        fixes.append(
            f"rollout.max_context={found.rollout.max_context} (a trajectory longer than a micro-batch is trained "
            "alone, at its own length)"
        )
    if found.rollout.summary_tokens < config.rollout.summary_tokens:
        fixes.append(f"rollout.summary_tokens={found.rollout.summary_tokens} (at most half of rollout.max_context)")
    return " and ".join(fixes)


def remedies(
    config: TrainConfig, deployment: Deployment, shape: ModelShape, capacity: int, extra: int = 0
) -> list[str]:
    """Settings that would make one learner rank fit `capacity`, each computed with the estimate itself, at the
    step's largest micro-batch (`step_learner`).

    CPU offload and activation checkpointing need the sharded learner: from one rank they are proposed with two.
    """
    learner, ranks, found = config.learner, deployment.learner_ranks, []
    gib = lambda n: f"{n / GIB:.1f} GiB"  # noqa: E731
    fits = functools.partial(_fits, config, shape, capacity=capacity, extra=extra)
    # from 2 ranks up every sharded term shrinks and nothing grows: the fewest ranks that fit, by bisection
    low, high = max(ranks + 1, 2), MAX_RANKS
    if fits(learner, high) < 0:
        unsharded = _need(config, shape, learner, high, extra)
        found.append(f"no number of ranks (what FSDP does not shard alone needs {gib(unsharded)})")
    else:
        while low < high:
            mid = (low + high) // 2
            if fits(learner, mid) >= 0:
                high = mid
            else:
                low = mid + 1
        found.append(f"learner.ranks={low} ({gib(fits(learner, low))} per GPU)")
    for key in ("cpu_offload", "activation_checkpointing"):  # one already on is in the ranks remedy above
        if not getattr(learner, key):
            sharded = max(ranks, 2)
            need = fits(dataclasses.replace(learner, **{key: True}), sharded)  # type: ignore[arg-type]  # a bool field
            if need >= 0:
                more = f"learner.ranks={sharded} and " if sharded != ranks else ""
                found.append(f"{more}learner.{key}=true ({gib(need)} per GPU)")

    # the largest bound on the step's micro-batch that fits (micro_batch_tokens, and max_context where it is longer)
    bound = largest_token_bound(
        config, lambda smaller: _fits(smaller, shape, smaller.learner, ranks, capacity, extra) >= 0
    )
    if bound is not None:
        found.append(f"{token_fix(config, bound)} ({gib(_need(bound, shape, bound.learner, ranks, extra))} per GPU)")
    return found


def _refusal(plan: Plan, config: TrainConfig) -> str | None:
    """Why this plan cannot fit its GPUs (naming the biggest term and what would fit), or None."""
    problems, capacity = [], plan.gpu_memory_bytes
    gib = lambda n: f"{n / GIB:.1f} GiB"  # noqa: E731
    if plan.on_gpu and plan.learner_gpu_bytes > capacity:
        ranked = sorted((t for t in plan.learner if t.where == "gpu"), key=lambda t: -t.bytes)
        extra = sum(t.bytes for t in plan.learner if t.name == "rollout engine weights")
        terms = ", ".join(f"{t.name} {gib(t.bytes)}" for t in ranked)
        fixes = " or ".join(remedies(config, plan.deployment, plan.model, capacity, extra)) or (
            "none of learner.ranks, cpu_offload, activation_checkpointing or micro_batch_tokens (and max_context) alone"
        )
        problems.append(
            f"one learner rank needs {gib(plan.learner_gpu_bytes)} of a {gib(capacity)} GPU; the biggest "
            f"term is {ranked[0].name} ({gib(ranked[0].bytes)}: {ranked[0].detail}); by size: {terms}. "
            f"It would fit with {fixes}"
        )
    elif plan.on_gpu and plan.load_bytes > capacity:
        problems.append(
            f"each learner rank loads the whole model ({gib(plan.load_bytes)}) onto its GPU before "
            f"sharding it, more than its {gib(capacity)}: set learner.cpu_offload=true"
        )
    host = plan.host_memory_bytes
    if plan.machine and host is not None and plan.machine_bytes > host * (1 - HOST_HEADROOM):
        ranked = sorted(plan.machine, key=lambda t: -t.bytes)
        terms = ", ".join(f"{t.name} {gib(t.bytes)}" for t in ranked)
        fixes = " or ".join(host_remedies(config, plan.deployment, plan.model, host)) or (
            "no micro_batch_tokens or max_context: a smaller model or a machine with more memory"
        )
        problems.append(
            f"the CPU learner needs {gib(plan.machine_bytes)} of this machine's {gib(host)} available memory "
            f"({plan.host_memory_source}; {HOST_HEADROOM:.0%} of it is left free); the biggest term is "
            f"{ranked[0].name} ({gib(ranked[0].bytes)}: {ranked[0].detail}); by size: {terms}. It would fit with "
            f"{fixes}"
        )
    servers = plan.servers
    if servers and servers["weights_per_gpu_bytes"] >= servers["static_pool_bytes"]:
        tp = next(
            (
                t
                for t in (2, 4, 8, 16)
                if t > servers["tp"]
                and servers["weights_per_gpu_bytes"] * servers["tp"] / t < servers["static_pool_bytes"]
            ),
            None,
        )
        need = servers["weights_per_gpu_bytes"] / capacity
        problems.append(
            f"an SGLang server's weights take {gib(servers['weights_per_gpu_bytes'])} per GPU, more than "
            f"ray.sglang_mem_fraction_static={servers['mem_fraction_static']} of {gib(capacity)} "
            f"({gib(servers['static_pool_bytes'])}) leaves for weights and KV cache: raise "
            f"ray.sglang_mem_fraction_static above {need:.2f}"
            + (f" or set ray.sglang_gpus_per_server={tp}" if tp else "")
        )
    return "; ".join(problems) or None


# ---- output ----------------------------------------------------------------------------------------------------


ROUTES = {
    "in_process": "the engine loads the learner's state dict in this process",
    "disk": "a model dir under out_dir/weights that each engine loads (SGLang: /update_weights_from_disk)",
    "object_store": "one ray.put copy of the weights, read by every rollout actor's engine",
    "distributed": "learner rank 0 broadcasts to the servers over a torch.distributed group (SGLang's protocol)",
}


def deployment_lines(d: Deployment) -> list[str]:
    """The deployment as a block of aligned lines (`train --dry-run`)."""
    where = f"{d.launcher}" + (f" (cluster: {d.cluster})" if d.cluster else "")
    kind = f"{d.learner_ranks} ranks, FSDP2 over {d.backend}" if d.sharded else "1 rank, the plain Learner"
    return [
        "deployment (resolved once from the config: trainers/deployment.py)",
        f"  {'launcher':<15}{where}",
        f"  {'engine':<15}{_engine_text(d)}",
        f"  {'learner':<15}{kind}, on {d.learner_device}",
        f"  {'weight route':<15}{d.weight_route}: {ROUTES[d.weight_route]}",
    ]


def _engine_text(d: Deployment) -> str:
    """Which engine the rollouts use, where, and (for servers) whose."""
    if d.engine == "torch":
        where = "in this process" if d.launcher == "local" else f"in each of {d.rollout_actors} rollout actors"
        return f"torch: a TorchEngine {where}, on {d.engine_device}"
    clients = "in this process" if d.launcher == "local" else f"in {d.rollout_actors} rollout actors"
    if d.servers == "given":
        return f"sglang: clients {clients} of {d.server_count} running servers (rollout.sglang_addresses)"
    program = "SGLang" if d.server_program == "sglang" else "searchgym serve model"
    return f"sglang: clients {clients} of {d.server_count} {program} servers launched here (ray.sglang_servers)"


def plan_text(plan: Plan) -> str:
    """The plan as a few aligned lines for a terminal."""
    gib = lambda n: f"{n / GIB:7.2f} GiB"  # noqa: E731
    m = plan.model
    lines = [
        f"model    {m.name}: {m.parameters:,} parameters ({m.num_layers} layers, hidden {m.hidden_size}, "
        f"vocab {m.vocab_size}{', tied embeddings' if m.tied else ''})",
        f"         shapes from {m.source}",
        "",
        *deployment_lines(plan.deployment),
        "",
        "resources (the deployment's processes and actors)",
    ]
    for g in plan.groups:
        lines.append(f"  {g.name:<18} {g.count:>3} x {{CPU {g.cpus:g}, GPU {g.gpus:g}}}  {g.detail}")
    lines.append(f"  {'total':<18} {plan.total['GPU']:g} GPUs, {plan.total['CPU']:g} CPUs")
    device = "GPU" if plan.on_gpu else "process (CPU)"
    ranks = plan.deployment.learner_ranks
    kind = f"{ranks} FSDP2 ranks" if plan.deployment.sharded else "one rank: the plain Learner"
    lines += ["", f"learner memory per rank's {device} ({kind}; an upper bound: every term at once)"]
    for t in plan.learner:
        where = "" if t.where == "gpu" or not plan.on_gpu else " [host]"
        lines.append(f"  {t.name:<24}{gib(t.bytes)}{where}  {t.detail}")
    if plan.on_gpu:
        lines.append(f"  {'total':<24}{gib(plan.learner_gpu_bytes)} of {plan.gpu_memory_bytes / GIB:g} GiB")
    for t in plan.host:
        lines.append(f"  host: {t.name:<18}{gib(t.bytes)}  {t.detail}")
    s = plan.servers
    if s:
        lines += [
            "",
            f"SGLang servers ({s['servers']} x tp {s['tp']}, {s['dtype']})",
            f"  weights per GPU         {gib(s['weights_per_gpu_bytes'])}  of the static pool "
            f"{s['mem_fraction_static']} x {plan.gpu_memory_bytes / GIB:g} GiB = {gib(s['static_pool_bytes']).strip()}",
            f"  KV cache                {s['kv_cache_tokens']:>11,} tokens ({s['kv_bytes_per_token']:,} B each): "
            f"{s['full_context_episodes']:,} full-context episodes; up to {s['episodes_per_server']} in flight "
            "per server",
        ]
    if plan.machine:
        lines += ["", "this machine's host memory (a CPU learner: every term at once)"]
        learner = {t.name for t in plan.learner}
        times = f" x {ranks} ranks" if plan.deployment.sharded else ""
        mine = sum(t.bytes for t in plan.machine if t.name in learner)
        lines.append(f"  {'learner':<24}{gib(mine)}  the terms above{times}")
        for t in plan.machine:
            if t.name not in learner:
                lines.append(f"  {t.name:<24}{gib(t.bytes)}  {t.detail}")
        assert plan.host_memory_bytes is not None  # set with `machine`
        lines.append(
            f"  {'total':<24}{gib(plan.machine_bytes)} of {plan.host_memory_bytes / GIB:.1f} GiB available "
            f"({plan.host_memory_source}), {HOST_HEADROOM:.0%} of it left free"
        )
    lines += [f"note: {n}" for n in plan.notes]
    lines.append("")
    lines.append("fits: yes" if plan.refusal is None else "fits: NO (why, and what would fit: below)")
    return "\n".join(lines)


@dataclass(frozen=True)
class PlanRequest:
    """What `train --dry-run` asks of the plan: the GPU's memory (default 80 GiB), the host's (default: this
    machine's available memory), and JSON or text."""

    gpu_memory_gib: float | None = None
    host_memory_gib: float | None = None
    json: bool = False


def print_plan(config: TrainConfig, deployment: Deployment, request: PlanRequest) -> None:
    """`train --dry-run`: print the resource plan and the per-GPU (or, on CPU, host) memory estimate; refuse
    (PlanError, status 2) what cannot fit."""
    gpu = 80.0 if request.gpu_memory_gib is None else request.gpu_memory_gib
    plan = make_plan(config, deployment, gpu_memory_gib=gpu, host_memory_gib=request.host_memory_gib)
    if request.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print("dry run: nothing started, nothing written\n")
        print(plan_text(plan))
    if plan.refusal:
        raise PlanError(f"this plan does not fit: {plan.refusal}")
