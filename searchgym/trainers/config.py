"""Training configs: dataclasses loaded with OmegaConf from YAML plus dotted command-line overrides.

`load_config("configs/quickstart-cpu.yaml", ["learner.lr=1e-6", "rollout.max_staleness=2"])` gives a
typed `TrainConfig`; unknown keys and wrong types are errors that name the key.
"""
from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException


@dataclass
class LearnerConfig:
    """Optimisation and PPO settings (AReaL's defaults where it has them)."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    warmup_steps: int = 0
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    behav_weight_cap: float | None = 5.0  # drop tokens with pi_prox / pi_behav above it; None: no behaviour weighting
    c_clip: float | None = None  # dual clip (> 1): a token's loss is at most c_clip * |A|; None: off
    temperature: float = 1.0
    micro_batch_tokens: int = 16_384
    logit_chunk_tokens: int = 512  # positions whose [chunk, vocab] logits exist at once (lm_head.chunked_logprobs)
    packing: str = "auto"  # "auto" | "on" | "off": several trajectories in one row (auto: with flash attention)
    minibatches: int = 1
    std_normalize: bool = False
    drop_no_spread: bool = True  # groups whose returns are all equal carry no signal: skip them
    process_reward: str = "clip"  # "clip" | "delta" | "none": how process rewards enter the return
    process_reward_weight: float = 0.0  # reward for a search that retrieves the answer page; 0: off
    process_reward_threshold: float = 0.0
    # the sharded learner (trainers/algorithm/fsdp.py): FSDP2 over `ranks` processes, one per GPU (local launcher: this
    # process and ranks - 1 it spawns; Ray launcher: `ranks` learner actors); 1: the plain Learner
    ranks: int = 1
    activation_checkpointing: bool = False  # recompute each decoder layer's activations in the backward pass
    cpu_offload: bool = False  # keep parameters, gradients and optimizer state on the CPU between uses


@dataclass
class EnvConfig:
    """Which env trains the agent, and its kwargs (as for gym.make)."""

    id: str = "searchgym/SyntheticQA-v0"
    kwargs: dict[str, Any] = field(default_factory=lambda: {"size": 1000, "n_tasks": 200, "split": "train",
                                                              "max_turns": 4})


@dataclass
class ModelConfig:
    """The policy: a Hugging Face model directory, or None for a fresh tiny model built into the run."""

    path: str | None = None
    device: str = "cpu"
    dtype: str = "float32"  # the learner's weights ("bfloat16" for 7B models on GPUs)


@dataclass
class RolloutConfig:
    """How episodes are generated (units: groups of `group_size` episodes of one task)."""

    group_size: int = 4
    batch_size: int = 4
    max_staleness: int = 1
    max_concurrent_rollouts: int = 32
    max_new_tokens: int = 64
    temperature: float = 1.0
    max_context: int = 4096
    observation_role: str = "user"  # how tool results enter the chat: "user", "tool" or "inline" (Search-R1)
    # when an episode outgrows max_context: "end" it truncated, "fold" old observations into stubs, or have the
    # policy "summarise" its findings (trained); the episode then goes on in a new segment (agents/context.py);
    # or a ContextPolicy subclass, "module:Class" or "file.py:Class"
    context_policy: str = "end"
    summary_tokens: int = 256  # the longest summary "summarise" asks for
    max_segments: int = 64  # an episode needing more context segments ends truncated
    workflow: str | None = None  # a custom Workflow class, "module:Class" or "file.py:Class" (default: TokenWorkflow)
    agent: str | None = None  # an agent program, "module:function" or "file.py:function" (agents/program.py)
    engine: str = "torch"  # "torch": an in-process TorchEngine; "sglang": SGLang servers, weights synced via disk
    sglang_addresses: list[str] = field(default_factory=list)  # running servers ("host:port") for engine "sglang"


@dataclass
class RayConfig:
    """The Ray launcher's topology: a learner actor, rollout actors, and optionally SGLang server actors.

    The `batch_size` groups of a step and `max_concurrent_rollouts` are split evenly over the rollout
    actors; actor i plays the tasks i::num_rollout_actors (see launchers/ray_cluster.py). With engine "sglang",
    the servers (`rollout.sglang_addresses`, or `sglang_servers` launched here) are split over the actors
    the same way, so each actor pauses and updates only its own servers.
    """

    address: str | None = None  # None: start a local cluster; "auto" or "host:port": join a running one
    num_rollout_actors: int = 2
    learner_gpus: float = 0  # GPUs per learner rank (learner.ranks actors, each training on its own device)
    learner_cpus: float = 1  # per learner rank
    rollout_cpus: float = 1  # per rollout actor (its env instances and, for engine "torch", the CPU engine)
    rollout_gpus: float = 0  # per rollout actor; > 0 puts its TorchEngine on "cuda"
    # "auto": object store for torch engines, "distributed" for SGLang servers launched here, disk for ones given
    # by address | "object_store" | "disk" | "distributed" (learner rank 0 broadcasts to the servers, SGLang's API)
    weight_sync: str = "auto"
    sglang_servers: int = 0  # server actors to launch (0: use rollout.sglang_addresses)
    sglang_gpus_per_server: int = 1  # each server's GPUs, also its --tp-size
    sglang_mem_fraction_static: float = 0.8
    sglang_args: list[str] = field(default_factory=list)  # extra launch_server flags, e.g. ["--dtype", "bfloat16"]
    sglang_server: str = "sglang"  # "sglang": python -m sglang.launch_server; "searchgym": our CPU stand-in server
    sglang_start_timeout_s: float = 1800
    # A local cluster (address null) binds what it can to local_host: the model servers launched here and, with
    # dashboard on, Ray's dashboard. A routable address (or 0.0.0.0) lets other machines reach them; a joined
    # cluster's servers bind their node's IP.
    local_host: str = "127.0.0.1"
    dashboard: bool = False  # Ray's dashboard for a local cluster (on local_host)


@dataclass
class WatchdogConfig:
    """The collapse watchdog (trainers/run/watchdog.py): the signals that make a step unhealthy, and what a restore does.

    A null threshold turns its rule off. "Median" is over the last `history` healthy steps; the relative rules wait
    for `min_history` of them. On a trigger the run restores its last healthy checkpoint with the learning rate
    times `lr_factor`; after `max_restores` restores the next trigger stops the run.
    """

    enabled: bool = True
    max_restores: int = 2
    lr_factor: float = 0.5  # each restore multiplies the learning rate by this (0 < lr_factor <= 1)
    history: int = 20
    min_history: int = 3
    grad_norm_factor: float | None = 20.0  # grad_norm (before clipping) above this times its median
    entropy_floor: float | None = 0.05  # mean token entropy (nats) below this ...
    entropy_drop: float = 0.1  # ... and below this share of its median (one healthy step is enough)
    entropy_rise: float | None = 10.0  # mean token entropy above this times its median
    ratio_max: float | None = 100.0  # importance_weight_max (pi_theta / pi_prox) above this
    clip_fraction_max: float | None = 0.8  # share of tokens the PPO clip cut
    behav_capped_max: float | None = 0.5  # share of tokens dropped for pi_prox / pi_behav above behav_weight_cap
    reward_window: int = 5  # steps whose mean episode reward is compared with the median before them
    reward_level: float = 0.1  # the reward rule watches only a median reward of at least this ...
    reward_drop: float | None = 0.1  # ... and triggers when the window's mean falls below this share of it


@dataclass
class TrainConfig:
    """One training run. mode "sync" is the same code with staleness 0: generate a batch, then train."""

    steps: int = 10
    mode: str = "async"
    launcher: str = "local"  # "local": one process (launchers/local.py); "ray": a Ray cluster (launchers/ray_cluster.py)
    seed: int = 0
    out_dir: str = "runs/train"
    save_every: int = 10  # learner steps between checkpoints (the last step always saves one)
    keep_checkpoints: int = 2
    env: EnvConfig = field(default_factory=EnvConfig)
    tasks: list[str] | None = None  # ids of the env's tasks to train on, in this order (default: all of them)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Defaults, then the YAML file, then `key.sub=value` overrides; validated against the dataclasses.

    Unknown keys, values of the wrong type and settings outside their choices or ranges are refused
    with a ValueError that names the key and where it came from (the file, or the override).
    """
    merged = OmegaConf.structured(TrainConfig)
    if path is not None:
        merged = _merge(merged, lambda: OmegaConf.load(path), os.fspath(path))
    for override in overrides:
        merged = _merge(merged, lambda: OmegaConf.from_dotlist([override]), f"override {override!r}",
                        key=override.partition("=")[0].strip())
    config: TrainConfig = OmegaConf.to_object(merged)
    for key, value, least in (("steps", config.steps, 1), ("save_every", config.save_every, 1),
                              ("keep_checkpoints", config.keep_checkpoints, 1),
                              ("rollout.group_size", config.rollout.group_size, 1),
                              ("rollout.batch_size", config.rollout.batch_size, 1),
                              ("rollout.max_staleness", config.rollout.max_staleness, 0),
                              ("rollout.max_concurrent_rollouts", config.rollout.max_concurrent_rollouts,
                               config.rollout.group_size),
                              ("rollout.max_new_tokens", config.rollout.max_new_tokens, 1),
                              ("rollout.summary_tokens", config.rollout.summary_tokens, 1),
                              ("rollout.max_segments", config.rollout.max_segments, 1),
                              ("learner.minibatches", config.learner.minibatches, 1),
                              ("learner.micro_batch_tokens", config.learner.micro_batch_tokens, 1),
                              ("learner.logit_chunk_tokens", config.learner.logit_chunk_tokens, 1),
                              ("learner.ranks", config.learner.ranks, 1)):
        if value < least:
            raise ValueError(f"{key} must be at least {least}, got {value}")
    if config.learner.c_clip is not None and not config.learner.c_clip > 1:
        raise ValueError(f"learner.c_clip must be > 1 (or null: no dual clip), got {config.learner.c_clip}")
    _check_choice("mode", config.mode, ("async", "sync"))
    _check_choice("launcher", config.launcher, ("local", "ray"))
    _check_choice("rollout.engine", config.rollout.engine, ("torch", "sglang"))
    _check_choice("rollout.observation_role", config.rollout.observation_role, ("user", "tool", "inline"))
    _check_choice("learner.packing", config.learner.packing, ("auto", "on", "off"))
    if ":" not in config.rollout.context_policy:  # else a custom ContextPolicy class, "module:Class" or "file.py:Class"
        _check_choice("rollout.context_policy", config.rollout.context_policy, ("end", "fold", "summarise"))
    if config.rollout.context_policy == "summarise" and config.rollout.summary_tokens * 2 > config.rollout.max_context:
        raise ValueError(f"rollout.summary_tokens must be at most half of rollout.max_context "
                         f"({config.rollout.max_context}) so a segment has room to summarise, "
                         f"got {config.rollout.summary_tokens}")
    if config.rollout.agent is not None and config.rollout.workflow is not None:
        raise ValueError("rollout.agent and rollout.workflow both name what plays the episodes: set one")
    if config.rollout.agent is not None and ":" not in config.rollout.agent:
        raise ValueError(f"rollout.agent must be 'module:function' or 'file.py:function', got {config.rollout.agent!r}")
    _check_choice("learner.process_reward", config.learner.process_reward, ("clip", "delta", "none"))
    _check_choice("ray.weight_sync", config.ray.weight_sync, ("auto", "object_store", "disk", "distributed"))
    _check_choice("ray.sglang_server", config.ray.sglang_server, ("sglang", "searchgym"))
    try:
        ipaddress.IPv4Address(config.ray.local_host)  # servers' URLs are host:port, which an IPv6 address breaks
    except ValueError:
        raise ValueError(f"ray.local_host must be an IPv4 address (127.0.0.1 keeps a local cluster's servers on this "
                         f"machine; 0.0.0.0 opens them to the network), got {config.ray.local_host!r}") from None
    _check_watchdog(config.watchdog)
    return config


def _check_watchdog(watchdog: WatchdogConfig) -> None:
    """Refuse watchdog settings that cannot work, naming the key."""
    if not 0 < watchdog.lr_factor <= 1:
        raise ValueError(f"watchdog.lr_factor must be in (0, 1], got {watchdog.lr_factor}")
    for key in ("max_restores", "min_history"):
        if getattr(watchdog, key) < 0:
            raise ValueError(f"watchdog.{key} must be at least 0, got {getattr(watchdog, key)}")
    for key in ("history", "reward_window"):
        if getattr(watchdog, key) < 1:
            raise ValueError(f"watchdog.{key} must be at least 1, got {getattr(watchdog, key)}")


def _merge(base: Any, load: Callable[[], Any], source: str, key: str | None = None) -> Any:
    """`base` merged with what `load` reads; OmegaConf's errors become one ValueError naming the key and the source."""
    try:
        return OmegaConf.merge(base, load())
    except OmegaConfBaseException as e:
        message = (e.msg or str(e)).splitlines()[0]
        raise ValueError(f"{e.full_key or key or e.key or 'config'}: {message} (from {source})") from None


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """Refuse a setting outside its choices, naming the key."""
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


def config_dict(config: TrainConfig) -> dict[str, Any]:
    """The config as plain JSON-ready data (what a run directory's config.json holds)."""
    return OmegaConf.to_container(OmegaConf.structured(config))
