"""The sharded learner: the same decoupled-PPO step on N ranks with PyTorch FSDP2 (gloo on CPU, NCCL on GPU).

    ranks = torchrun (one node) or torch.multiprocessing; each rank calls `init_ranks()` then builds a
    `ShardedLearner` on the same pretrained weights:
      - `fully_shard` per decoder layer, then a root holding embeddings, final norm and LM head (tied or not);
        on GPU bf16 parameters with fp32 gradient reduction (MixedPrecisionPolicy), optionally activation
        checkpointing and CPU offload of parameters, gradients and optimizer state;
      - `step(groups)`: rank 0's groups are broadcast, every rank computes the same advantages and minibatches,
        and each rank trains its share of each minibatch (trajectories rank, rank + N, ...), packed to the
        token budget. The normaliser is the whole minibatch's trained-token count and gradients add up
        over ranks, so the update is the single-rank learner's (up to float summation order);
      - checkpoints: a sharded save of weights and optimizer (torch.distributed.checkpoint, `sharded/`) inside
        an ordinary checkpoint directory whose consolidated Hugging Face model serves and evaluates as usual;
        `load_checkpoint` resumes from it on the same number of ranks (or another: DCP reshards).

Every rank must call `step`, `save_checkpoint`, `load_checkpoint` and `consolidated_model` together (they are
collectives): either every rank runs the same program (SPMD, as torchrun scripts do), or rank 0 runs the
training loop with `lead()` set and the other ranks call `follow()`, which replays each collective rank 0 starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from searchgym.agents.hf_bars import no_hf_bars
from searchgym.agents.trajectory import Trajectory
from searchgym.core.atomic_file import disk_error
from searchgym.trainers.algorithm.learner import Learner, _Sample, next_token_logprobs
from searchgym.trainers.config import LearnerConfig
from searchgym.trainers.run.checkpoint import checkpoint_root, load_trainer_state, save_checkpoint
from searchgym.trainers.run.partials import writer_lock

SHARDED = "sharded"  # the DCP directory inside a checkpoint


def init_ranks(
    backend: str | None = None,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    device_index: int | None = None,
    timeout_s: float = 1800,
    device: str | None = None,
) -> tuple[int, int]:
    """Join the learner's process group; (rank, world size).

    With no arguments it takes what torchrun put in the environment; the launchers pass `rank`, `world_size`
    and rank 0's `master_addr:master_port` instead. `device` "cpu" gives gloo, "cuda" gives NCCL for CUDA tensors
    and gloo for CPU ones (the learner's small bookkeeping collectives); None: "cuda" when CUDA is available. On GPU
    each rank takes the device `device_index` (default LOCAL_RANK).
    """
    if not dist.is_initialized():
        cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) if device_index is None else device_index)
        options: dict[str, Any] = {"timeout": timedelta(seconds=timeout_s)}
        if rank is not None:
            if world_size is None or master_addr is None or master_port is None:
                raise ValueError("init_ranks(rank=...) needs world_size, master_addr and master_port too")
            options.update(rank=rank, world_size=world_size, init_method=f"tcp://{master_addr}:{int(master_port)}")
        dist.init_process_group(backend or ("cpu:gloo,cuda:nccl" if cuda else "gloo"), **options)
    return dist.get_rank(), dist.get_world_size()


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a Hugging Face causal LM (Qwen2, Llama, Mistral: `model.model.layers`)."""
    layers = getattr(model.base_model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no base_model.layers: cannot shard it per decoder layer")
    return layers


class _TrainedTokenLogprobs(nn.Module):
    """The FSDP root: `next_token_logprobs` as a forward, so the root's parameters are gathered around it (the LM
    head's weight too, which the chunked log-probs use in the forward pass and again in the backward pass)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self,
        ids: torch.Tensor,
        attention: torch.Tensor | None,
        where: torch.Tensor,
        temperature: float = 1.0,
        chunk_tokens: int = 512,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return next_token_logprobs(self.model, ids, attention, where, temperature, chunk_tokens, positions)


def shard_model(
    model: nn.Module,
    *,
    mixed_precision: bool | None = None,
    activation_checkpointing: bool = False,
    cpu_offload: bool = False,
) -> nn.Module:
    """Shard `model` in place with FSDP2 (per decoder layer, then a root) and return the root to call.

    `mixed_precision` (default: on when the weights are on a GPU) computes in bf16 and reduces gradients in
    fp32 while the optimizer keeps the weights' own dtype. FSDP averages gradients over ranks; the sharded
    learner scales each rank's loss by the number of ranks, as its loss is normalised by the whole batch.
    """
    on_gpu = next(model.parameters()).device.type == "cuda"
    options: dict[str, Any] = {}
    if mixed_precision if mixed_precision is not None else on_gpu:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    if activation_checkpointing:
        hf: Any = model  # a Transformers model
        if hasattr(hf, "activation_checkpointing_enable"):  # transformers >= 5.x's name
            hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    return cast(nn.Module, fully_shard(_TrainedTokenLogprobs(model), **options))  # an FSDPModule and an nn.Module


class ShardedLearner(Learner):
    """`Learner` on this rank's shard of the weights; all ranks call its methods together."""

    def __init__(
        self,
        model: nn.Module,
        config: LearnerConfig | None = None,
        *,
        pad_id: int = 0,
        version: int = 0,
        activation_checkpointing: bool = False,
        cpu_offload: bool = False,
        mixed_precision: bool | None = None,
    ):
        if not dist.is_initialized():
            raise RuntimeError("ShardedLearner needs a process group: call init_ranks() on every rank first")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.root = shard_model(
            model,
            mixed_precision=mixed_precision,
            activation_checkpointing=activation_checkpointing,
            cpu_offload=cpu_offload,
        )
        super().__init__(model, config, pad_id=pad_id, version=version)
        self._gradient_scale = float(self.world)  # FSDP averages over ranks; the loss is already a whole-batch mean
        self._mine: set[int] = set()
        self._leading = False
        self._dense: nn.Module | None = None  # rank 0's consolidated copy, reused
        self._filler = _Sample(
            ids=torch.full((2,), pad_id, dtype=torch.long),
            mask=torch.zeros(1),
            behav=torch.zeros(1),
            advantages=torch.zeros(1),
            versions=torch.full((1,), -1),
            prox=torch.zeros(1),
        )

    # --- the step: same batch on every rank, each trains its share ----------------------------------------

    # --- rank 0 drives, the others follow --------------------------------------------------------------

    def lead(self) -> None:
        """On rank 0: from now on each collective call first tells the followers which one to run."""
        if self.rank != 0:
            raise RuntimeError("only rank 0 leads; the other ranks call follow()")
        self._leading = True

    def follow(self) -> None:
        """On ranks > 0: run each collective rank 0 starts, until it calls `stop()`."""
        calls: dict[str, Callable[..., Any]] = {
            "step": self.step,
            "save_checkpoint": self.save_checkpoint,
            "load_checkpoint": self.load_checkpoint,
            "consolidated_model": self.consolidated_model,
        }
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            name, kwargs = box[0]
            if name == "stop":
                dist.barrier()  # meet the leader's: no rank tears its group down while another is mid-collective
                return
            calls[name](**kwargs)

    def stop(self) -> None:
        """On the leader: release the followers from `follow()`, and wait until every one has left it (a rank that
        destroyed its process group while a peer still sent to it aborted gloo at exit, seen once under load)."""
        self._announce("stop")
        if self._leading:
            dist.barrier()

    def _announce(self, name: str, **kwargs: Any) -> None:
        """Tell the followers to run `name(**kwargs)` (rank 0, when leading)."""
        if self._leading:
            dist.broadcast_object_list([(name, kwargs)], src=0)

    def step(self, groups: list[list[Trajectory]] | None = None) -> dict[str, float]:
        """One PPO update on rank 0's `groups` (other ranks may pass None); the same statistics on every rank."""
        self._announce("step")
        box = [groups]
        dist.broadcast_object_list(box, src=0)
        return super().step(box[0] or [])

    def _assign(self, samples: list[_Sample]) -> None:
        """The samples this rank trains: its share of each minibatch."""
        m = self.config.minibatches
        self._mine = {id(s) for i in range(m) for s in samples[i::m][self.rank :: self.world]}

    def _micro_batches(self, samples: list[_Sample]) -> list[list[_Sample]]:
        """This rank's micro-batches of `samples`, padded with empty ones to the most any rank has.

        FSDP's all-gathers and reduce-scatters are collectives: every rank must run as many forward and
        backward passes. A filler micro-batch has no trained token: zero loss, zero gradient.
        """
        batches = super()._micro_batches([s for s in samples if id(s) in self._mine])
        count = torch.tensor([len(batches)])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return batches + [[self._filler]] * (int(count) - len(batches))

    def _trained_logprobs(
        self,
        ids: torch.Tensor,
        attention: torch.Tensor | None,
        where: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.root(ids, attention, where, self.config.temperature, self.config.logit_chunk_tokens, positions)

    def _clip_gradients(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def _gather_stats(self, parts: list[dict[str, float]]) -> list[dict[str, float]]:
        """Every rank's micro-batch statistics, less the fillers' (they have no trained token)."""
        gathered: list[list[dict[str, float]] | None] = [None] * self.world
        dist.all_gather_object(gathered, parts)
        flat = [part for rank_parts in gathered for part in rank_parts or []]
        real = [part for part in flat if part.get("normalizer_tokens", 0.0) > 0]
        return real or flat[:1]

    # --- checkpoints ---------------------------------------------------------------------------------

    def trainer_state(self) -> dict[str, Any]:
        """Scheduler and version (the optimizer state is sharded: it lives in the checkpoint's `sharded/`)."""
        return {"scheduler": self.scheduler.state_dict(), "version": self.version, "sharded_ranks": self.world}

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError("a sharded learner saves with save_checkpoint (torch.distributed.checkpoint)")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights on rank 0's CPU (empty on the other ranks); a collective."""
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))  # type: ignore[return-value]  # full: plain tensors

    restorable = False  # the collapse watchdog's restore is not written for sharded weights yet

    def full_model(self) -> nn.Module | None:
        """The whole model, to send to the engines: the consolidated copy on rank 0 (a collective)."""
        return self.consolidated_model()

    def consolidated_model(self) -> nn.Module | None:
        """An ordinary (unsharded) copy of the model on rank 0's CPU, None elsewhere; a collective.

        The copy is one module reused (and overwritten) by every later call: read or save it before the next.
        """
        self._announce("consolidated_model")
        return self._consolidated()

    def _consolidated(self) -> nn.Module | None:
        from transformers import AutoModelForCausalLM

        weights = self.full_state_dict()
        if self.rank != 0:
            return None
        if self._dense is None:  # built once: rebuilding a 7B model on every weight push costs minutes
            dtype = next(iter(weights.values())).dtype if weights else torch.float32
            self._dense = AutoModelForCausalLM.from_config(self.model.config, dtype=dtype)
        self._dense.load_state_dict(weights)
        return self._dense

    def save_checkpoint(
        self,
        run_dir: str | os.PathLike,
        step: int,
        *,
        tokenizer: Any,
        state: dict[str, Any] | None = None,
        keep: int = 2,
    ) -> Path:
        """Checkpoint `step` as the single-rank learner writes it (a consolidated model dir and trainer.pt,
        `state` plus this learner's under "learner"), with the sharded weights and optimizer in `sharded/`."""
        self._announce("save_checkpoint", run_dir=run_dir, step=step, tokenizer=None, keep=keep)
        root = checkpoint_root(run_dir)
        staging = root / f".sharded-step-{step:05d}"
        # rank 0 holds the staging directory's lock while the ranks write it (a killed run's is removed at start)
        with writer_lock(staging) if self.rank == 0 else contextlib.nullcontext():
            try:
                if self.rank == 0:
                    shutil.rmtree(staging, ignore_errors=True)
                dist.barrier()
                model_state, optim_state = get_state_dict(self.model, self.optimizer)
                dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=staging)
                dense = self._consolidated()
                final = checkpoint_root(run_dir) / f"step-{step:05d}"
                if self.rank == 0:
                    final = save_checkpoint(
                        run_dir,
                        step,
                        model=dense,
                        tokenizer=tokenizer,
                        state={**(state or {}), "learner": self.trainer_state()},
                        keep=keep,
                        extra=lambda d: os.replace(staging, d / SHARDED),
                    )
            except Exception as e:
                if self.rank == 0:
                    shutil.rmtree(staging, ignore_errors=True)
                if (disk := disk_error(e, staging, f"the sharded state of step-{step:05d}")) is not None:
                    raise disk from e
                raise
        dist.barrier()
        return final

    def load_checkpoint(self, checkpoint: str | os.PathLike) -> dict[str, Any]:
        """Restore weights and optimizer from `checkpoint/sharded`, scheduler and version from trainer.pt.

        Returns the whole trainer state (rollout positions and the rest), as `load_trainer_state` does.
        """
        self._announce("load_checkpoint", checkpoint=checkpoint)
        checkpoint = Path(checkpoint)
        if not (checkpoint / SHARDED).is_dir():
            raise FileNotFoundError(
                f"{checkpoint} has no {SHARDED}/ directory: it was written by a single-rank "
                "learner; resume it with learner.ranks=1"
            )
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=checkpoint / SHARDED)
        set_state_dict(self.model, self.optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
        state = load_trainer_state(checkpoint)
        self.scheduler.load_state_dict(state["learner"]["scheduler"])
        self.version = int(state["learner"]["version"])
        return state


def load_sharded_learner(
    model_dir: str | os.PathLike,
    config: LearnerConfig,
    *,
    dtype: torch.dtype = torch.float32,
    pad_id: int = 0,
    checkpoint: str | os.PathLike | None = None,
    version: int = 0,
    device: str | None = None,
    **ranks: Any,
) -> ShardedLearner:
    """A ShardedLearner on this rank (joining the process group) from `model_dir`, resumed from `checkpoint`.

    `ranks` go to `init_ranks` (rank, world_size, master_addr, master_port, device_index; default: torchrun's
    environment). Every rank calls this together (loading a checkpoint is a collective). `device` "cpu" or "cuda"
    (None: CUDA when available); on GPU each rank loads onto its own device; `config.activation_checkpointing` and
    `config.cpu_offload` apply.
    """
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    init_ranks(device="cuda" if cuda else "cpu", **ranks)
    with no_hf_bars():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    if cuda and not config.cpu_offload:
        model = model.to(torch.device("cuda", torch.cuda.current_device()))
    learner = ShardedLearner(
        model,
        config,
        pad_id=pad_id,
        version=version,
        activation_checkpointing=config.activation_checkpointing,
        cpu_offload=config.cpu_offload,
    )
    if checkpoint is not None:
        learner.load_checkpoint(checkpoint)
    return learner
