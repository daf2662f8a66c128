"""Training configs: dataclasses loaded with OmegaConf from YAML plus dotted command-line overrides.

`load_config("configs/train-cpu.yaml", ["learner.lr=1e-6", "rollout.max_staleness=2"])` gives a
typed `TrainConfig` through `searchgym.settings.load_settings`; unknown keys, wrong types and settings outside
their declared choices or ranges are errors that name the key.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import searchgym  # noqa: F401  (registers the env ids EnvConfig checks kwargs against)
from searchgym.envs.env_kwargs import accepted_kwargs
from searchgym.settings import load_settings, setting, settings_dict


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
    # "recompute": decoupled PPO, the proximal policy is the pre-update weights (one extra forward pass);
    # "behaviour": plain PPO (AReaL's use_decoupled_loss=False), the proximal policy IS the behaviour policy
    proximal: str = setting("recompute", choices=("recompute", "behaviour"))
    c_clip: float | None = setting(None, above=1)  # dual clip (> 1): a token's loss is at most c_clip * |A|; None: off
    temperature: float = 1.0
    micro_batch_tokens: int = setting(16_384, at_least=1)
    logit_chunk_tokens: int = setting(
        512, at_least=1
    )  # positions whose [chunk, vocab] logits exist at once (lm_head.chunked_logprobs)
    packing: str = setting(
        "auto", choices=("auto", "on", "off")
    )  # "auto" | "on" | "off": several trajectories in one row (auto: with flash attention)
    minibatches: int = setting(1, at_least=1)
    std_normalize: bool = False
    drop_no_spread: bool = True  # groups whose returns are all equal carry no signal: skip them
    process_reward: str = setting(
        "clip", choices=("clip", "delta", "none")
    )  # "clip" | "delta" | "none": how process rewards enter the return
    process_reward_weight: float = 0.0  # reward for a search that retrieves the answer page; 0: off
    process_reward_threshold: float = 0.0
    # the sharded learner (trainers/algorithm/fsdp.py): FSDP2 over `ranks` processes, one per GPU (local launcher: this
    # process and ranks - 1 it spawns; Ray launcher: `ranks` learner actors); 1: the plain Learner
    ranks: int = setting(1, at_least=1)
    activation_checkpointing: bool = False  # recompute each decoder layer's activations in the backward pass
    cpu_offload: bool = False  # keep parameters, gradients and optimizer state on the CPU between uses
    # CPU levers (docs/training.md#cpu-levers, measured by `searchgym bench levers`): "bf16" runs the learner's
    # forward and backward under bf16 autocast (weights and optimizer stay fp32); off: fp32 throughout
    autocast: str = setting("off", choices=("off", "bf16"))
    # train only the top N decoder layers (and the final norm; a tied lm_head stays frozen with the embeddings):
    # the lower layers build no autograd graph, which saves their backward and activations; None: train everything
    trainable_layers: int | None = setting(None, at_least=1)

    def check(self) -> Iterator[tuple[str, str]]:
        """Freezing layers is for the plain learner: the sharded one shards every parameter."""
        if self.trainable_layers is not None and self.ranks > 1:
            yield ("trainable_layers", f"needs ranks 1 (the plain learner), got ranks {self.ranks}")


SYNTHETIC_QA = "searchgym/SyntheticQA-v0"
SYNTHETIC_DEFAULTS = {"size": 1000, "n_tasks": 200, "split": "train", "max_turns": 4}  # a small world, its train split


@dataclass
class EnvConfig:
    """Which env trains the agent, and its kwargs (as for gym.make).

    The default kwargs are SyntheticQA's; a config that names another id (LocalQA, a suite, a simulated engine) keeps
    only those of them its env takes, so `env.id` plus that env's own kwargs is a whole config (a file's or an
    override's kwargs merge into the defaults, as every dict of a config does).
    """

    id: str = SYNTHETIC_QA
    kwargs: dict[str, Any] = field(default_factory=lambda: dict(SYNTHETIC_DEFAULTS))

    def __post_init__(self) -> None:
        if self.id == SYNTHETIC_QA:
            return
        accepted = accepted_kwargs(self.id)
        if accepted is not None:
            self.kwargs = {
                k: v
                for k, v in self.kwargs.items()
                if not (k in SYNTHETIC_DEFAULTS and v == SYNTHETIC_DEFAULTS[k] and k not in accepted)
            }


@dataclass
class ModelConfig:
    """The policy: a Hugging Face model directory, or None for a fresh tiny model built into the run."""

    path: str | None = None
    device: str = "cpu"
    dtype: str = "float32"  # the learner's weights ("bfloat16" for 7B models on GPUs)


@dataclass
class RolloutConfig:
    """How episodes are generated (units: groups of `group_size` episodes of one task)."""

    group_size: int = setting(4, at_least=1)
    batch_size: int = setting(4, at_least=1)
    max_staleness: int = setting(1, at_least=0)
    max_concurrent_rollouts: int = 32  # at least group_size (check)
    max_new_tokens: int = setting(64, at_least=1)
    temperature: float = 1.0
    max_context: int = 4096
    observation_role: str = setting(
        "user", choices=("user", "tool", "inline")
    )  # how tool results enter the chat: "user", "tool" or "inline" (Search-R1)
    # when an episode outgrows max_context: "end" it truncated, "fold" old observations into stubs, or have the
    # policy "summarise" its findings (trained); the episode then goes on in a new segment (agents/context.py);
    # or a ContextPolicy subclass, "module:Class" or "file.py:Class"
    context_policy: str = "end"
    summary_tokens: int = setting(256, at_least=1)  # the longest summary "summarise" asks for
    max_segments: int = setting(64, at_least=1)  # an episode needing more context segments ends truncated
    # the system message of every episode (None: none, or a search-agent one where the template writes its own
    # default); the warm start must have used the same (sft's system_prompt)
    system_prompt: str | None = None
    workflow: str | None = None  # a custom Workflow class, "module:Class" or "file.py:Class" (default: TokenWorkflow)
    agent: str | None = None  # an agent program, "module:function" or "file.py:function" (serve/program.py)
    engine: str = setting(
        "torch", choices=("torch", "sglang")
    )  # "torch": an in-process TorchEngine; "sglang": SGLang servers, weights synced via disk
    sglang_addresses: list[str] = field(default_factory=list)  # running servers ("host:port") for engine "sglang"

    def check(self) -> Iterator[tuple[str, str]]:
        """The checks that span fields: (key, what is wrong) for each one failed."""
        if self.max_concurrent_rollouts < self.group_size:
            yield (
                "max_concurrent_rollouts",
                f"must be at least {self.group_size} (group_size), got {self.max_concurrent_rollouts}",
            )
        # else a custom ContextPolicy class, "module:Class" or "file.py:Class"
        if ":" not in self.context_policy and self.context_policy not in ("end", "fold", "summarise"):
            yield (
                "context_policy",
                f"must be one of 'end', 'fold', 'summarise' (or module:Class), got {self.context_policy!r}",
            )
        elif ":" in self.context_policy and (why := context_policy_path_error(self.context_policy)):
            yield ("context_policy", why)
        if self.context_policy == "summarise" and self.summary_tokens * 2 > self.max_context:
            yield (
                "summary_tokens",
                f"must be at most half of rollout.max_context ({self.max_context}) so a "
                f"segment has room to summarise, got {self.summary_tokens}",
            )
        if self.agent is not None and self.workflow is not None:
            yield ("agent", "rollout.agent and rollout.workflow both name what plays the episodes: set one")
        if self.agent is not None and ":" not in self.agent:
            yield ("agent", f"must be 'module:function' or 'file.py:function', got {self.agent!r}")


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
    weight_sync: str = setting("auto", choices=("auto", "object_store", "disk", "distributed"))
    sglang_servers: int = 0  # server actors to launch (0: use rollout.sglang_addresses)
    sglang_gpus_per_server: int = 1  # each server's GPUs, also its --tp-size
    sglang_mem_fraction_static: float = 0.8
    sglang_args: list[str] = field(default_factory=list)  # extra launch_server flags, e.g. ["--dtype", "bfloat16"]
    sglang_server: str = setting(
        "sglang", choices=("sglang", "searchgym")
    )  # "sglang": python -m sglang.launch_server; "searchgym": our CPU stand-in server
    sglang_start_timeout_s: float = 1800
    # A local cluster (address null) binds what it can to local_host: the model servers launched here and, with
    # dashboard on, Ray's dashboard. A routable address (or 0.0.0.0) lets other machines reach them; a joined
    # cluster's servers bind their node's IP.
    local_host: str = "127.0.0.1"
    dashboard: bool = False  # Ray's dashboard for a local cluster (on local_host)

    def check(self) -> Iterator[tuple[str, str]]:
        """The local host must be an IPv4 address: servers' URLs are host:port, which an IPv6 address breaks."""
        try:
            ipaddress.IPv4Address(self.local_host)
        except ValueError:
            yield (
                "local_host",
                f"must be an IPv4 address (127.0.0.1 keeps a local cluster's servers on this "
                f"machine; 0.0.0.0 opens them to the network), got {self.local_host!r}",
            )


@dataclass
class WatchdogConfig:
    """The collapse watchdog (trainers/run/watchdog.py): the signals that make a step unhealthy, and what a restore
    does.

    A null threshold turns its rule off. "Median" is over the last `history` healthy steps; the relative rules wait
    for `min_history` of them. On a trigger the run restores its last healthy checkpoint with the learning rate
    times `lr_factor`; after `max_restores` restores the next trigger stops the run.
    """

    enabled: bool = True
    max_restores: int = setting(2, at_least=0)
    lr_factor: float = setting(
        0.5, above=0, at_most=1
    )  # each restore multiplies the learning rate by this (0 < lr_factor <= 1)
    history: int = setting(20, at_least=1)
    min_history: int = setting(3, at_least=0)
    grad_norm_factor: float | None = 20.0  # grad_norm (before clipping) above this times its median
    entropy_floor: float | None = 0.05  # mean token entropy (nats) below this ...
    entropy_drop: float = 0.1  # ... and below this share of its median (one healthy step is enough)
    entropy_rise: float | None = 10.0  # mean token entropy above this times its median
    ratio_max: float | None = 100.0  # importance_weight_max (pi_theta / pi_prox) above this
    clip_fraction_max: float | None = 0.8  # share of tokens the PPO clip cut
    behav_capped_max: float | None = 0.5  # share of tokens dropped for pi_prox / pi_behav above behav_weight_cap
    reward_window: int = setting(
        5, at_least=1
    )  # steps whose mean episode reward is compared with the median before them
    reward_level: float = 0.1  # the reward rule watches only a median reward of at least this ...
    reward_drop: float | None = 0.1  # ... and triggers when the window's mean falls below this share of it


@dataclass
class TrainConfig:
    """One training run. mode "sync" is the same code with staleness 0: generate a batch, then train."""

    steps: int = setting(10, at_least=1)
    mode: str = setting("async", choices=("async", "sync"))
    launcher: str = setting(
        "local", choices=("local", "ray")
    )  # "local": launchers/local.py; "ray": launchers/ray_cluster.py
    seed: int = 0
    out_dir: str = "runs/train"
    save_every: int = setting(10, at_least=1)  # learner steps between checkpoints (the last step always saves one)
    keep_checkpoints: int = setting(2, at_least=1)
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
    return load_settings(TrainConfig, path, overrides)


def config_dict(config: TrainConfig) -> dict[str, Any]:
    """The config as plain JSON-ready data (what a run directory's config.json holds)."""
    return settings_dict(config)


def context_policy_path_error(path: str) -> str | None:
    """Why `module:Class` / `file.py:Class` names no ContextPolicy subclass (None: it does); loaded now, so a bad path
    is refused when the config is read, not when the first episode outgrows its window."""
    from searchgym.agents.context import ContextPolicy
    from searchgym.agents.workflow import load_object

    try:
        cls = load_object(path)
    except Exception as e:  # noqa: BLE001 -- user code: any failure to import it is the setting's error
        return f"cannot load {path!r}: {type(e).__name__}: {e}"
    if not (isinstance(cls, type) and issubclass(cls, ContextPolicy)):
        return (
            f"{path!r} is not a ContextPolicy subclass (searchgym.agents.context); the built-in policies are "
            "'end', 'fold', 'summarise'"
        )
    return None
