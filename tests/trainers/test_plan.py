"""`searchgym train --dry-run`: the resource plan and per-GPU memory estimate (trainers/plan.py).

Parameter counts are the real model's; the byte terms are hand-computed; the activation formula is checked against
the bytes autograd really saves for real Qwen2 models; the 7B configs plan as they intend; what cannot fit is
refused with the biggest term named and remedies that, applied, do fit; and a dry run starts and writes nothing.
"""

import dataclasses
import functools
import json
import math
import multiprocessing
import re
from pathlib import Path

import psutil
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, Qwen2Config

from searchgym.cli import main
from searchgym.trainers.config import LearnerConfig, ModelConfig, RolloutConfig, TrainConfig, load_config
from searchgym.trainers.deployment import resolve_deployment
from searchgym.trainers.plan import (
    GIB,
    HOST_HEADROOM,
    Plan,
    PlanError,
    engine_budget,
    gpu_bytes,
    layer_activation_bytes,
    learner_terms,
    make_plan,
    model_shape,
    remedies,
    step_learner,
    stored_activation_bytes,
)

CONFIGS = Path(__file__).parents[2] / "configs"
ASEARCHER = sorted(CONFIGS.glob("asearcher-7b-*.yaml"))
QWEN_7B = 7_615_616_512  # sum(p.numel()) of Qwen2.5-7B (the model card's 7.61B)


def plan_of(config: TrainConfig, **limits: float) -> Plan:
    """The plan of `config` on its deployment, resolved as `searchgym train` resolves it."""
    return make_plan(config, resolve_deployment(config), **limits)


@functools.cache
def seven_b():
    """Qwen2.5-7B's shapes (built once on the meta device)."""
    return model_shape("Qwen/Qwen2.5-7B")


def dry_run(capsys, *args: str) -> tuple[int, str, str]:
    """`searchgym train --dry-run ARGS`: exit status, stdout, stderr."""
    code = main(["train", "--dry-run", *args])
    out, err = capsys.readouterr()
    return code, out, err


# ---- parameters and bytes per term ------------------------------------------------------------------------------


def test_the_parameter_count_is_the_real_models(tiny_model_dir):
    shape = model_shape(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shape.parameters == sum(p.numel() for p in model.parameters()) == 223_808  # tied embeddings once
    assert shape.layer_parameters == sum(p.numel() for p in model.model.layers[0].parameters())
    assert shape.root_parameters == 2048 * 64 + 64  # the embedding (tied with the LM head) and the final norm
    assert str(tiny_model_dir) in shape.source
    # model.path null (a fresh tiny model built into the run) plans the model the run would build
    assert model_shape(None).parameters == shape.parameters


def test_the_table_gives_qwen25_7b_and_names_its_source():
    shape = model_shape("Qwen/Qwen2.5-7B-Instruct")  # an alias of the base model's shapes
    assert shape.parameters == QWEN_7B
    assert (shape.hidden_size, shape.num_layers, shape.vocab_size, shape.tied) == (3584, 28, 152064, False)
    assert "shapes.json" in shape.source


def test_an_unknown_model_is_refused_naming_the_known_ones(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PlanError, match="Qwen/Qwen2.5-7B"):
        model_shape("nobody/no-such-model")
    code, _, err = dry_run(capsys, "model.path=nobody/no-such-model")
    assert code == 2 and "no-such-model" in err and "Traceback" not in err


def test_bytes_per_term_are_the_hand_computed_ones(tiny_model_dir):
    shape = model_shape(str(tiny_model_dir))  # P = 223,808; one layer 46,336; h 64, I 176, L 2, 4 heads, 2 kv, V 2048
    two = LearnerConfig(ranks=2, micro_batch_tokens=1000)
    terms = {t.name: t for t in learner_terms(shape, two, ranks=2, dtype="float32", on_gpu=True)}
    assert terms["parameters"].bytes == terms["gradients"].bytes == 223_808 * 4 // 2 == 447_616
    assert terms["optimizer state"].bytes == 2 * 447_616  # AdamW's two states in the parameters' dtype
    # root (131,136) + 2 layers in bf16, one layer's fp32 gradient
    assert terms["FSDP buffers"].bytes == (131_136 + 2 * 46_336) * 2 + 4 * 46_336 == 632_960
    # per token and layer in bf16: (6*2+8)*64 + 4*2*176 + 2*2*(2*16) + 4*4 = 1280 + 1408 + 128 + 16 = 2832;
    # outside the layers: (2+4)*64 + 2*2*16 + 12 = 460; stored 1000*(2*2832 + 460), plus one layer of backward work
    assert terms["activations"].bytes == 1000 * (2 * 2832 + 460) + 1000 * 2832 == 8_956_000
    # chunked loss head: 512 positions x 2048 vocab x two fp32 buffers, the 16-bit head's fp32 gradient sum (1000
    # tokens are two chunks), 12 B per token
    assert terms["loss head"].bytes == 512 * 2048 * 8 + 2048 * 64 * 4 + 12 * 1000
    assert all(t.where == "gpu" for t in terms.values())

    # checkpointing: each layer keeps its input (2*64 B a token), one layer recomputed (and its gradients)
    ckpt = {
        t.name: t.bytes
        for t in learner_terms(
            shape,
            LearnerConfig(ranks=2, micro_batch_tokens=1000, activation_checkpointing=True),
            ranks=2,
            dtype="float32",
            on_gpu=True,
        )
    }
    assert ckpt["activations"] == 1000 * (2 * 128 + (2 + 4) * 64 + 12) + 2 * 1000 * 2832
    # offload: parameters, gradients and optimizer state move to the host, the rest stays on the GPU
    offload = learner_terms(
        shape,
        LearnerConfig(ranks=2, micro_batch_tokens=1000, cpu_offload=True),
        ranks=2,
        dtype="float32",
        on_gpu=True,
    )
    assert {t.name for t in offload if t.where == "host"} == {"parameters", "gradients", "optimizer state"}
    assert gpu_bytes(offload) == 632_960 + 8_956_000 + terms["loss head"].bytes

    # one rank is the plain Learner: whole terms, no FSDP buffers, fp32 compute, and it ignores checkpointing
    one = {
        t.name: t.bytes
        for t in learner_terms(
            shape,
            LearnerConfig(ranks=1, micro_batch_tokens=1000, activation_checkpointing=True),
            ranks=1,
            dtype="float32",
            on_gpu=True,
        )
    }
    layer = (6 * 4 + 8) * 64 + 4 * 4 * 176 + 2 * 4 * 32 + 4 * 4  # 5136 per token and layer in fp32
    assert one == {
        "parameters": 895_232,
        "gradients": 895_232,
        "optimizer state": 1_790_464,
        "activations": 1000 * (2 * layer + 8 * 64 + 8 * 16 + 12) + 1000 * layer,
        "loss head": 512 * 2048 * 8 + 12 * 1000,
    }  # fp32: no separate gradient accumulator


def _saved_bytes(model: torch.nn.Module, tokens: int) -> int:
    """Bytes of the tensors autograd saves for backward in one forward pass (each storage once, parameters not)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return tensor

    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.base_model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return sum(seen.values())


@pytest.mark.parametrize("checkpointing", [False, True], ids=["stored", "checkpointed"])
@pytest.mark.parametrize(
    ("dims", "dtype"),
    [
        (
            {"hidden_size": 128, "intermediate_size": 352, "num_attention_heads": 4, "num_key_value_heads": 2},
            "bfloat16",
        ),
        ({"hidden_size": 96, "intermediate_size": 250, "num_attention_heads": 6, "num_key_value_heads": 6}, "bfloat16"),
        ({"hidden_size": 128, "intermediate_size": 352, "num_attention_heads": 8, "num_key_value_heads": 2}, "float32"),
    ],
)
def test_the_activation_formula_is_what_autograd_saves(tmp_path, dims, dtype, checkpointing):
    """Korthikanti et al.'s count applied to Qwen2, against a real model's saved tensors (CPU, SDPA attention)."""
    config = Qwen2Config(num_hidden_layers=3, vocab_size=512, tie_word_embeddings=False, **dims)
    config.save_pretrained(tmp_path)  # config.json alone: the plan reads shapes, never weights
    shape = model_shape(str(tmp_path))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(getattr(torch, dtype)).train()
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    tokens = 128
    measured = _saved_bytes(model, tokens)
    predicted = stored_activation_bytes(shape, tokens, 2 if dtype == "bfloat16" else 4, checkpointing)
    assert predicted == pytest.approx(measured, rel=0.01), (predicted, measured)


@pytest.mark.parametrize(
    ("dims", "tokens", "dtype"),
    [
        ({"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "vocab_size": 4096}, 512, "float32"),
        ({"hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4, "vocab_size": 512}, 256, "float32"),
        ({"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "vocab_size": 2048}, 128, "bfloat16"),
    ],
    ids=["loss-head-heavy-fp32", "layer-heavy-fp32", "bf16"],
)
def test_the_estimate_bounds_a_real_learner_steps_peak(tmp_path, dims, tokens, dtype):
    """One real Learner update (CPU, one full micro-batch, steady state: AdamW state exists), its peak measured by
    PyTorch's MemTracker: the estimate is above it, by at most 30% (measured: 10% to 25%)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from searchgym.trainers.algorithm.learner import Learner, _Sample

    config = Qwen2Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, **dims)
    config.save_pretrained(tmp_path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(getattr(torch, dtype))
    settings = LearnerConfig(micro_batch_tokens=tokens)
    learner = Learner(model, settings)
    n = tokens - 1  # every position trained: the loss head's worst case, as the estimate assumes
    sample = _Sample(
        ids=torch.randint(0, config.vocab_size, (tokens,)),
        mask=torch.ones(n),
        behav=torch.full((n,), -7.0),
        advantages=torch.ones(n),
        versions=torch.zeros(n, dtype=torch.long),
        prox=torch.full((n,), -7.0),
    )
    learner._update([sample])  # the optimizer's state exists from now on
    tracker = MemTracker()
    tracker.track_external(model, learner.optimizer)
    with tracker:
        learner._update([sample])
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    estimate = gpu_bytes(learner_terms(model_shape(str(tmp_path)), settings, ranks=1, dtype=dtype, on_gpu=True))
    assert peak <= estimate <= 1.3 * peak, (estimate, peak, estimate / peak)


# ---- the shipped 7B configs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ASEARCHER, ids=lambda p: p.name)
def test_the_asearcher_configs_plan_what_they_intend(path, capsys, tmp_path):
    out_dir = tmp_path / "run"
    code, out, err = dry_run(capsys, "--json", "--config", str(path), f"out_dir={out_dir}")
    assert code == 0, err
    plan = json.loads(out)
    config = load_config(path)
    assert plan["fits"] and plan["refusal"] is None
    assert config.learner.ranks > 1 and plan["learner_ranks"] == config.learner.ranks  # a sharded learner
    assert plan["model"]["parameters"] == QWEN_7B and "shapes.json" in plan["model"]["source"]
    # resources: the launcher's own totals, split into learner ranks, servers and rollout actors
    groups = {g["name"]: g for g in plan["groups"]}
    needed = resolve_deployment(config).resources
    for kind, key in (("GPU", "gpus"), ("CPU", "cpus")):
        assert sum(g["count"] * g[key] for g in plan["groups"]) == pytest.approx(needed[kind]) == plan["total"][kind]
    learner = groups["learner ranks"]
    assert learner["count"] == config.learner.ranks and learner["gpus"] == config.ray.learner_gpus > 0
    assert groups["inference servers"]["count"] == config.ray.sglang_servers
    assert groups["inference servers"]["gpus"] == config.ray.sglang_gpus_per_server
    assert groups["rollout actors"]["count"] == config.ray.num_rollout_actors
    # memory: the learner's GPU terms fit 80 GiB, sharded over the configured ranks
    terms = {t["name"]: t for t in plan["learner_memory"]}
    assert terms["optimizer state"]["bytes"] == math.ceil(2 * QWEN_7B * 2 / config.learner.ranks)
    assert plan["learner_gpu_bytes"] == sum(t["bytes"] for t in plan["learner_memory"] if t["where"] == "gpu")
    assert plan["learner_gpu_bytes"] <= 80 * GIB == plan["gpu_memory_bytes"]
    servers = plan["servers"]
    assert servers["weights_per_gpu_bytes"] == math.ceil(QWEN_7B * 2 / config.ray.sglang_gpus_per_server)
    assert (
        servers["weights_per_gpu_bytes"]
        < servers["static_pool_bytes"]
        == int(config.ray.sglang_mem_fraction_static * 80 * GIB)
    )
    assert servers["kv_cache_tokens"] > config.rollout.max_context
    assert not out_dir.exists()  # nothing written


def test_a_dry_run_starts_nothing_and_writes_nothing(capsys, tmp_path, tiny_model_dir):
    out_dir = tmp_path / "run"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    code, out, _ = dry_run(
        capsys,
        "--config",
        str(CONFIGS / "train-cpu.yaml"),
        f"model.path={tiny_model_dir}",
        f"out_dir={out_dir}",
        "learner.ranks=2",
    )
    assert code == 0 and "nothing started, nothing written" in out and "follower ranks" in out
    assert not out_dir.exists()
    assert {
        p.pid for p in psutil.Process().children(recursive=True)
    } == before and not multiprocessing.active_children()
    import ray

    assert not ray.is_initialized()


def test_plan_flags_need_dry_run_and_a_real_gpu_size(capsys):
    assert main(["train", "--json"]) == 2
    assert "--dry-run" in capsys.readouterr().err
    for size in ("0", "-80", "inf", "nan"):
        code, _, err = dry_run(capsys, "--gpu-memory-gib", size)
        assert code == 2 and "--gpu-memory-gib must be a positive number" in err, size


def test_a_one_rank_learner_on_several_gpus_is_pointed_at_fsdp():
    config = load_config(CONFIGS / "asearcher-7b-local.yaml", ["learner.ranks=1", "ray.learner_gpus=4"])
    assert any("set learner.ranks=4 ray.learner_gpus=1" in note for note in plan_of(config).notes)


# ---- refusals ------------------------------------------------------------------------------------------------


def _remedies(message: str) -> list[list[str]]:
    """The overrides a refusal proposes: 'learner.ranks=2 and learner.cpu_offload=true (...)' -> [[...], ...]."""
    fixes = message.split("It would fit with ", 1)[1]
    return [re.findall(r"(?:learner|rollout)\.\w+=\w+", fix) for fix in fixes.split(" or ")]


def test_a_7b_single_rank_plan_is_refused_naming_the_optimizer_state(capsys):
    asearcher = str(CONFIGS / "asearcher-7b-local.yaml")
    short = "rollout.max_context=8000"  # no trajectory longer than a micro-batch: the step's own 8,000 tokens
    code, out, err = dry_run(
        capsys,
        "--config",
        asearcher,
        "learner.ranks=1",
        "ray.learner_gpus=1",
        "learner.cpu_offload=false",
        short,
        "--gpu-memory-gib",
        "80",
    )
    assert code == 2 and "fits: NO" in out
    message = err.strip()
    assert message.count("\n") == 0 and message.startswith("searchgym: error: this plan does not fit")
    optimizer = 2 * QWEN_7B * 2 / GIB  # AdamW's two bf16 states of 7.6B parameters, unsharded: 28.4 GiB
    assert f"optimizer state {optimizer:.1f} GiB" in message
    # each proposed remedy, applied, fits: computed by the estimate, not guessed
    fixes = _remedies(message)
    # checkpointing is on in the config already: it comes with the ranks remedy, never proposed as a second one
    assert {key.split("=")[0] for fix in fixes for key in fix} == {
        "learner.ranks",
        "learner.cpu_offload",
        "learner.micro_batch_tokens",
        "rollout.max_context",  # bounded with the micro-batch, which it equals
    }
    assert len({tuple(sorted(fix)) for fix in fixes}) == len(fixes)  # no remedy twice
    for fix in fixes:
        config = load_config(asearcher, ["learner.ranks=1", "ray.learner_gpus=1", short, *fix])
        assert plan_of(config).refusal is None, fix
    ranks = next(int(k.split("=")[1]) for fix in fixes if len(fix) == 1 for k in fix if k.startswith("learner.ranks"))
    fewer = load_config(asearcher, [f"learner.ranks={ranks - 1}", "ray.learner_gpus=1", short])
    assert plan_of(fewer).refusal is not None


def test_a_gpu_plan_counts_the_longest_trajectory_trained_alone(capsys):
    """A trajectory longer than learner.micro_batch_tokens is trained alone at its own length, on a GPU as on a CPU:
    ASearcher's 7B config (micro-batches of 8,000 tokens, contexts of 32,768) on one rank is refused for the long
    trajectory's activations, and the token remedy bounds rollout.max_context too; each remedy, applied, fits."""
    asearcher = str(CONFIGS / "asearcher-7b-local.yaml")
    base = ["learner.ranks=1", "ray.learner_gpus=1", "learner.cpu_offload=false"]
    code, out, err = dry_run(capsys, "--config", asearcher, *base, "--gpu-memory-gib", "80")
    assert code == 2 and "fits: NO" in out
    assert "the biggest term is activations" in err
    assert "rollout.max_context=32,768 tokens, trained alone (longer than learner.micro_batch_tokens=8,000)" in err
    fixes = _remedies(err)
    assert any("rollout.max_context" in key for fix in fixes for key in fix), fixes
    for fix in fixes:
        assert plan_of(load_config(asearcher, [*base, *fix])).refusal is None, fix
    # the same learner with contexts no longer than a micro-batch needs less by the long trajectory's activations
    long, short = (
        plan_of(load_config(asearcher, [*base, f"rollout.max_context={n}"])).learner_gpu_bytes for n in (32768, 8000)
    )
    activations = lambda n: n * 28 * layer_activation_bytes(seven_b(), 2)  # noqa: E731  # bf16, no checkpointing
    assert long - short >= activations(32768) - activations(8000)


def test_a_token_remedy_under_the_summarise_policy_keeps_its_summary_check():
    """The summarise policy needs rollout.summary_tokens at most half of rollout.max_context: a remedy that shortens
    the context past that shortens the summary too, so the remedy's settings pass the config's own check."""
    asearcher = CONFIGS / "asearcher-7b-local.yaml"
    base = [
        "learner.ranks=1",
        "ray.learner_gpus=1",
        "rollout.context_policy=summarise",
        "rollout.summary_tokens=16000",
    ]
    plan = plan_of(load_config(asearcher, base))
    assert plan.refusal
    fix = next(fix for fix in _remedies(plan.refusal) if any("max_context" in key for key in fix))
    assert any(key.startswith("rollout.summary_tokens=") for key in fix), fix
    assert plan_of(load_config(asearcher, [*base, *fix])).refusal is None, fix


def test_fp32_full_parameter_training_names_the_optimizer_state_as_the_biggest_term(capsys):
    code, _, err = dry_run(
        capsys,
        "--config",
        str(CONFIGS / "asearcher-7b-local.yaml"),
        "learner.ranks=1",
        "ray.learner_gpus=1",
        "model.dtype=float32",
        "learner.micro_batch_tokens=1024",
        "rollout.max_context=1024",  # no trajectory trained alone at 32,768 tokens
    )
    assert code == 2
    assert f"the biggest term is optimizer state ({2 * QWEN_7B * 4 / GIB:.1f} GiB" in err


def test_sglang_weights_that_overflow_the_static_pool_are_refused():
    config = load_config(
        CONFIGS / "asearcher-7b-local.yaml",
        [
            "learner.ranks=4",
            "ray.learner_gpus=1",
            "learner.activation_checkpointing=true",
            "ray.sglang_mem_fraction_static=0.1",
        ],
    )
    refusal = plan_of(config).refusal
    assert refusal and "ray.sglang_mem_fraction_static above 0.18" in refusal  # 14.2 GiB of 80
    assert "ray.sglang_gpus_per_server=2" in refusal  # 7.1 GiB per GPU < 8 GiB
    fixed = load_config(
        CONFIGS / "asearcher-7b-local.yaml",
        [
            "learner.ranks=4",
            "ray.learner_gpus=1",
            "learner.activation_checkpointing=true",
            "ray.sglang_mem_fraction_static=0.1",
            "ray.sglang_servers=6",
            "ray.sglang_gpus_per_server=2",
        ],
    )
    assert plan_of(fixed).refusal is None


def test_the_local_launcher_counts_the_engine_on_rank_0s_gpu(tiny_model_dir):
    config = load_config(
        CONFIGS / "train-cpu.yaml", [f"model.path={tiny_model_dir}", "model.device=cuda", "learner.ranks=2"]
    )
    plan = plan_of(config, gpu_memory_gib=1)
    names = [g.name for g in plan.groups]
    assert names == ["this process", "follower ranks"] and plan.total == {"CPU": 2.0, "GPU": 2.0}
    assert any(t.name == "rollout engine weights" and t.bytes == 223_808 * 4 for t in plan.learner)
    assert plan_of(config, gpu_memory_gib=0.001).refusal  # a GPU smaller than the terms: refused
    assert (
        plan_of(load_config(CONFIGS / "train-cpu.yaml", [f"model.path={tiny_model_dir}"]), gpu_memory_gib=0.001).refusal
        is None
    )  # on CPU there is no GPU to overflow


@settings(max_examples=60, deadline=None)
@given(
    ranks=st.integers(1, 16),
    tokens=st.integers(256, 65_536),
    context=st.integers(256, 131_072),
    ckpt=st.booleans(),
    offload=st.booleans(),
    dtype=st.sampled_from(["bfloat16", "float32"]),
    gib=st.sampled_from([24, 40, 80, 141]),
)
def test_every_proposed_remedy_fits(ranks, tokens, context, ckpt, offload, dtype, gib):
    """Whatever the settings, each remedy a refusal would propose, applied to those settings, fits the GPU at the
    step's largest micro-batch (a trajectory of rollout.max_context tokens trained alone)."""
    learner = LearnerConfig(ranks=ranks, micro_batch_tokens=tokens, activation_checkpointing=ckpt, cpu_offload=offload)
    model = ModelConfig(path="Qwen/Qwen2.5-7B", dtype=dtype)
    config = TrainConfig(learner=learner, model=model, rollout=RolloutConfig(max_context=context))

    def need(config: TrainConfig, ranks: int) -> int:
        return gpu_bytes(learner_terms(seven_b(), step_learner(config), ranks=ranks, dtype=dtype, on_gpu=True))

    if need(config, ranks) <= gib * GIB:
        return
    fixes = remedies(config, resolve_deployment(config), seven_b(), gib * GIB)
    assert fixes
    for fix in fixes:
        changes = dict(kv.split("=") for kv in re.findall(r"(?:learner|rollout)\.\w+=\w+", fix))
        if not changes:
            assert fix.startswith("no number of ranks"), fix
            continue
        fixed_ranks = int(changes.pop("learner.ranks", ranks))
        parts = {"learner": {}, "rollout": {}}
        for key, value in changes.items():
            parts[key.split(".")[0]][key.split(".")[1]] = json.loads(value)
        fixed = dataclasses.replace(
            config,
            learner=dataclasses.replace(learner, **parts["learner"]),
            rollout=dataclasses.replace(config.rollout, **parts["rollout"]),
        )
        assert need(fixed, fixed_ranks) <= gib * GIB, fix


@pytest.mark.parametrize("path", ASEARCHER, ids=lambda p: p.name)
def test_a_65k_token_trajectory_trained_alone_fits_an_80_gib_gpu_in_the_7b_configs(path, capsys):
    """The long-horizon worst case: one trajectory of rollout.max_context = 65,536 tokens, every one trained, alone
    in its micro-batch, counted in the plan. With whole logits it needed 189 GiB; the chunked loss head keeps it
    under 80."""
    code, out, err = dry_run(capsys, "--config", str(path), "rollout.max_context=65536")
    assert code == 0, err
    assert "rollout.max_context=65,536 tokens, trained alone" in out
    need = float(re.search(r"total +([0-9.]+) GiB of 80 GiB", out).group(1))
    assert 40 < need < 80


# ---- a CPU learner: this machine's host memory -------------------------------------------------------------------


def smollm2_shapes(path: Path) -> Path:
    """SmolLM2-135M-Instruct's config.json alone (no weights: the plan builds the model on the meta device)."""
    from transformers import LlamaConfig

    LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        vocab_size=49152,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ).save_pretrained(path)
    return path


def test_a_cpu_plan_counts_the_host_memory_and_names_the_micro_batch_that_fits(capsys, tmp_path):
    """Issue 40: the default micro-batch of a 135M model needs 21 GiB of activations; on a 24 GiB CPU machine the
    dry run used to say "fits: yes". Now every host term counts, and the remedy, applied, fits where one more token
    does not."""
    model = smollm2_shapes(tmp_path / "smollm2")
    args = ["--config", str(CONFIGS / "train-cpu.yaml"), f"model.path={model}"]
    code, out, err = dry_run(capsys, "--host-memory-gib", "24", *args)
    assert code == 2 and "fits: NO" in out and "this machine's host memory" in out
    assert "the CPU learner needs" in err
    assert "of this machine's 24.0 GiB available memory (--host-memory-gib; 10% of it is left free)" in err
    assert "the biggest term is activations (21.2 GiB" in err
    tokens = int(re.search(r"learner\.micro_batch_tokens=(\d+)", err).group(1))
    config = load_config(CONFIGS / "train-cpu.yaml", [f"model.path={model}", f"learner.micro_batch_tokens={tokens}"])
    plan = plan_of(config, host_memory_gib=24)
    usable = int(24 * GIB * (1 - HOST_HEADROOM))
    assert plan.refusal is None and plan.machine_bytes <= usable and plan.host_memory_bytes == 24 * GIB
    assert not any("row(s) of full context" in n for n in plan.notes)  # the remedy leaves the engine a group's rows
    over = dataclasses.replace(config, learner=dataclasses.replace(config.learner, micro_batch_tokens=tokens + 1))
    assert any(
        f"fewer than a group ({config.rollout.group_size})" in n for n in plan_of(over, host_memory_gib=24).notes
    )
    terms = {t.name: t.bytes for t in plan.machine}
    parameters = plan.model.parameters
    assert terms["parameters"] == terms["gradients"] == terms["engine weights"] == parameters * 4
    assert terms["optimizer state"] == 2 * parameters * 4
    kv = 2 * 30 * 3 * 64 * 4 * config.rollout.max_concurrent_rollouts * config.rollout.max_context  # keys, values
    fixed = sum(b for name, b in terms.items() if name != "engine batch")
    assert 2 * kv > usable - fixed == terms["engine batch"]  # the engine's batch takes what the rest leaves
    assert terms["engine batch"] == engine_budget(config, plan.deployment, plan.model, 24 * GIB)
    assert {"engine prefix cache", "runtime", "allocator margin", "activations", "loss head"} <= set(terms)
    assert plan.to_json()["machine_bytes"] == sum(terms.values()) == plan.machine_bytes


def test_a_cpu_plan_counts_the_longest_trajectory_trained_alone(tmp_path):
    """A trajectory longer than learner.micro_batch_tokens is trained alone at its own length: the step's peak is
    that of rollout.max_context tokens. Measured on SmolLM2-135M (micro-batches of 2,048 tokens): one learner step on
    two 4,000-token trajectories peaked at 8.3 GB, 1.5x what 2,048 tokens give; beside the engine's batch, sized for
    the shorter micro-batch, a long-horizon run was killed for memory."""
    model = smollm2_shapes(tmp_path / "smollm2")
    overrides = [f"model.path={model}", "learner.micro_batch_tokens=2048"]
    short = plan_of(
        load_config(CONFIGS / "train-cpu.yaml", [*overrides, "rollout.max_context=2048"]), host_memory_gib=24
    )
    long = plan_of(
        load_config(CONFIGS / "train-cpu.yaml", [*overrides, "rollout.max_context=4096"]), host_memory_gib=24
    )
    a_short, a_long = (next(t for t in p.machine if t.name == "activations") for p in (short, long))
    assert a_long.bytes == pytest.approx(2 * a_short.bytes, rel=0.01)
    assert "rollout.max_context=4,096 tokens, trained alone" in a_long.detail
    assert "trained alone" not in a_short.detail
    b_short, b_long = (next(t.bytes for t in p.machine if t.name == "engine batch") for p in (short, long))
    assert b_long < b_short  # what the learner's longer step takes, the engine's batch gives up


def test_a_cpu_plan_is_checked_against_the_available_memory(tmp_path, tiny_model_dir, monkeypatch):
    from searchgym.trainers import plan as plan_module

    config = load_config(CONFIGS / "train-cpu.yaml", [f"model.path={tiny_model_dir}"])
    monkeypatch.setattr(plan_module, "available_memory", lambda: (64 * GIB, "test"))
    assert plan_of(config).host_memory_bytes == 64 * GIB and plan_of(config).refusal is None
    monkeypatch.setattr(plan_module, "available_memory", lambda: (GIB, "test"))
    assert "of this machine's 1.0 GiB available memory (test; 10% of it is left free)" in plan_of(config).refusal
    monkeypatch.setattr(plan_module, "available_memory", lambda: None)
    unknown = plan_of(config)
    assert unknown.refusal is None and not unknown.machine and any("not checked" in n for n in unknown.notes)
    gpu = load_config(CONFIGS / "train-cpu.yaml", [f"model.path={tiny_model_dir}", "model.device=cuda"])
    assert not plan_of(gpu, host_memory_gib=0.001).machine  # a GPU learner: the GPU path, as before


def test_the_host_memory_flag_needs_dry_run_and_a_real_size(capsys):
    assert main(["train", "--host-memory-gib", "8"]) == 2
    assert "--dry-run" in capsys.readouterr().err
    for size in ("0", "-8", "inf", "nan"):
        code, _, err = dry_run(capsys, "--host-memory-gib", size)
        assert code == 2 and "--host-memory-gib must be a positive number" in err, size


def test_a_cpu_remedy_below_the_context_also_bounds_the_context(tmp_path):
    """A trajectory longer than a micro-batch is trained alone at its own length: a micro-batch remedy shorter than
    rollout.max_context also lowers the context, so the longest trajectory fits too."""
    model = smollm2_shapes(tmp_path / "smollm2")
    config = load_config(CONFIGS / "train-cpu.yaml", [f"model.path={model}", "rollout.max_context=8192"])
    refusal = plan_of(config, host_memory_gib=12).refusal
    tokens, context = (
        int(n) for n in re.search(r"micro_batch_tokens=(\d+) and rollout\.max_context=(\d+)", refusal).groups()
    )
    assert tokens == context < 8192
    fixed = load_config(
        CONFIGS / "train-cpu.yaml",
        [f"model.path={model}", f"learner.micro_batch_tokens={tokens}", f"rollout.max_context={context}"],
    )
    assert plan_of(fixed, host_memory_gib=12).refusal is None


def test_no_token_bound_is_proposed_that_the_configs_own_checks_refuse():
    """The summarise policy needs a summary of one token at least in half the context: a bound under 2 tokens is no
    remedy there (its summary would be 0), while under another policy 1 token is still a bound."""
    from searchgym.trainers.plan import largest_token_bound

    only_one = lambda c: c.rollout.max_context <= 1  # noqa: E731
    summarise = RolloutConfig(context_policy="summarise", summary_tokens=256, max_context=4096)
    assert largest_token_bound(TrainConfig(rollout=summarise), only_one) is None
    assert largest_token_bound(TrainConfig(rollout=RolloutConfig(max_context=4096)), only_one).rollout.max_context == 1
    found = largest_token_bound(TrainConfig(rollout=summarise), lambda c: c.rollout.max_context <= 300)
    assert (found.rollout.max_context, found.rollout.summary_tokens) == (300, 150)
    assert not list(found.rollout.check())
