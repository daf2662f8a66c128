"""Train a model with TRL's GRPOTrainer on a searchgym env, on CPU: a supervised warm start on the oracle's
tool-calling episodes (TRL's SFTTrainer), then GRPO with the env as TRL's `environment_factory`.

    pip install 'searchgym[trl]'
    python examples/train_with_trl.py   # 15 to 25 minutes on a CPU; --steps 5 for a quick look

On its defaults the training reward rises over the 80 GRPO steps (docs/benchmarks.md, "TRL": +0.109 over 3 seeds);
held-out accuracy stays 0, since a tiny model learns the 16 tasks it was shown, not to search for unseen names.

Without --model it builds a tiny 2-layer Qwen2 with a tool-capable chat template, its tokenizer trained on the
env's pages, and copy-pretrains it (--copy-steps, about 3 CPU minutes: a random-init model cannot copy a name from
the question into a search, or from a result into the answer, so no rollout would ever earn a reward); pass a
Hugging Face model directory with a tool-capable template (Qwen2.5, Qwen3, ...), or `--model smollm2-135m-instruct
--sft-lr 1e-4 --lr 1e-5` (pip install 'searchgym[trl,models]'), for a real run. The completion
budget and the warm start's length come from the demonstrations (printed first, with why); then one JSON line per
GRPO step: the mean reward (the env judge's verdicts), tool calls per rollout, loss; and a warning when no tool
call ran or no group's rewards differed (GRPO had nothing to learn from).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ENV_ID = "searchgym/SyntheticQA-v0"
SMALL_ENV = {
    "size": 1000,
    "seed": 0,
    "n_tasks": 200,
    "hops": 1,
    "instructions": "brief",
    "top_k": 1,
    "doc_chars": 160,
    "max_turns": 4,
}


SFT_EPOCHS = 40  # passes over a dozen episodes a tiny model needs to write whole calls (80 over 7 memorised them)
COPY_STEPS = 600  # copy accuracy 0.99 on the tiny model (docs/benchmarks.md, trial 4)
SFT_BATCH = 4


def auto_or_int(text: str) -> int | str:
    """`auto` or a non-negative int (argparse type)."""
    if text == "auto":
        return text
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 'auto' or >= 0, got {text}")
    return value


def tiny_base_model(env_class: Any, demos: Any, work: Path, *, copy_steps: int, seed: int, device: str) -> Path:
    """The tiny model: its tokenizer trained on the env's pages and the demonstrations (names become few tokens),
    then `copy_steps` of copy pretraining (so it can copy a name out of its context)."""
    from searchgym.pipeline.stages import StageRun, TinyModelConfig, build_base_model
    from searchgym.trainers.warm_start.copy_pretrain import CopyPretrainConfig

    world = env_class().search_env  # its page backend lists the world's pages
    chats = [[{"content": json.dumps(message)} for message in row["prompt"] + row["completion"]] for row in demos]
    copy = CopyPretrainConfig(steps=copy_steps, seed=seed)
    run = StageRun(seed=seed, device=device, progress=False)
    base, history = build_base_model(world, chats, work, TinyModelConfig(), copy, run)
    if history:
        print(json.dumps({"copy_steps": copy_steps, "copy_accuracy": round(history[-1]["copy_accuracy"], 3)}))
    return base


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        default=None,
        help="a model directory or a packaged model's name (smollm2-135m-instruct: `searchgym model get` converts "
        "it on first use; a ChatML template without tools gets Hermes tool blocks); default: build the tiny model",
    )
    parser.add_argument(
        "--copy-steps",
        type=int,
        default=COPY_STEPS,
        help="copy-pretraining steps of the tiny model built without --model (0: a random init that cannot copy)",
    )
    parser.add_argument("--env", default=ENV_ID)
    parser.add_argument("--env-kwargs", type=json.loads, default=SMALL_ENV, help="JSON kwargs for gym.make")
    parser.add_argument("--tasks", type=int, default=16, help="train on the first N tasks of the pool")
    parser.add_argument(
        "--sft-steps",
        type=auto_or_int,
        default="auto",
        help="warm-start steps on oracle episodes (0: none; auto: --sft-epochs passes over the demonstrations)",
    )
    parser.add_argument(
        "--sft-epochs", type=int, default=SFT_EPOCHS, help="passes over the demos when --sft-steps auto"
    )
    parser.add_argument(
        "--sft-lr", type=float, default=3e-3, help="warm-start learning rate (3e-3 for the tiny model; ~1e-4 real)"
    )
    parser.add_argument(
        "--max-completion-length",
        type=auto_or_int,
        default="auto",
        help="TRL's completion budget in tokens, tool results included (auto: the longest demonstration + 1/8)",
    )
    parser.add_argument("--held-out", type=int, default=0, help="also judge N tasks GRPO never sees, before and after")
    parser.add_argument("--turn-tokens", type=int, default=96, help="tokens per model turn in the held-out episodes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tiny model's init and of TRL")
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="GRPO's sampling temperature (below 1 the warm-started tiny model's groups rarely differ)",
    )
    parser.add_argument(
        "--lr", type=float, default=3e-4, help="GRPO learning rate (at 1e-3 the tiny model lost the tool format)"
    )
    parser.add_argument("--steps", type=int, default=80, help="GRPO steps")
    parser.add_argument("--num-generations", type=int, default=4, help="rollouts per question (GRPO's group)")
    parser.add_argument(
        "--questions-per-step",
        type=int,
        default=4,
        help="questions (groups) per GRPO step: more steadies the logged reward, which swings with the questions drawn",
    )
    parser.add_argument(
        "--micro-batch",
        type=auto_or_int,
        default="auto",
        help="rollouts per forward/backward pass, a divisor of the step's rollouts (TRL accumulates the rest into "
        "one optimizer step; auto: as many as fit 4 GiB of logits, all of them for the tiny model)",
    )
    parser.add_argument("--out", type=Path, default=None, help="where to save the trained model")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a tiny model is fastest on 1)")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoConfig
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    from searchgym.integrations.trl import (
        assistant_tokens,
        completion_lengths,
        demonstrations,
        environment_and_dataset,
        groups_with_spread,
        oversized_rollout_warning,
        play,
        prompt_lengths,
        quiet_groups_warning,
        rollouts_per_pass,
        tool_calling_tokenizer,
    )

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    cpu = {
        "use_cpu": not torch.cuda.is_available(),
        "bf16": False,
        "activation_checkpointing": False,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "seed": args.seed,
    }

    env_class, prompts = environment_and_dataset(args.env, limit=args.tasks + args.held_out, **args.env_kwargs)
    if len(prompts) < args.tasks + args.held_out:  # before any training: a short pool would drop the held-out tasks
        parser.error(
            f"--tasks {args.tasks} and --held-out {args.held_out} need {args.tasks + args.held_out} tasks, but the "
            f"env's train pool has {len(prompts)} (raise n_tasks in --env-kwargs, or ask for fewer)"
        )
    torch.set_num_threads(args.threads)  # process-wide: set once the arguments are known to be good
    work = Path(tempfile.mkdtemp(prefix="searchgym-trl-"))
    out = args.out or work / "grpo"
    held_out = list(prompts["task_id"])[args.tasks :]
    prompts = prompts.select(range(min(args.tasks, len(prompts))))
    demos = demonstrations(env_class, list(prompts["task_id"]))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.model:
        from searchgym.pipeline.stages import resolve_model

        model = str(resolve_model(args.model))
    else:
        model = str(tiny_base_model(env_class, demos, work, copy_steps=args.copy_steps, seed=args.seed, device=device))
    tokenizer = tool_calling_tokenizer(model)
    lengths = completion_lengths(tokenizer, demos)
    budget = args.max_completion_length
    if budget == "auto":
        budget = max(lengths) + max(lengths) // 8
    sft_steps = args.sft_steps
    if sft_steps == "auto":
        sft_steps = args.sft_epochs * math.ceil(len(demos) / SFT_BATCH)
    batch = args.num_generations * max(1, min(args.questions_per_step, len(prompts)))
    micro = args.micro_batch
    if micro == "auto":
        vocab = AutoConfig.from_pretrained(model).vocab_size
        positions = max(prompt_lengths(tokenizer, demos)) + budget
        micro = rollouts_per_pass(batch, positions, vocab)
        if (too_long := oversized_rollout_warning(positions, vocab)) is not None:
            print(too_long, file=sys.stderr, flush=True)
    if micro < 1 or batch % micro:
        parser.error(f"--micro-batch {micro} must divide the step's {batch} rollouts (questions x generations)")
    sizing = {
        "demonstrations": len(demos),
        "demo_completion_tokens": {"min": min(lengths), "max": max(lengths)},
        "max_completion_length": budget,
        "sft_steps": sft_steps,
        "rollouts_per_step": batch,
        "rollouts_per_pass": micro,
    }
    print(json.dumps(sizing), flush=True)
    if budget < max(lengths):
        print(
            f"warning: --max-completion-length {budget} is below the longest demonstration ({max(lengths)} tokens, "
            "tool results included): TRL drops tool results past the budget, so such episodes cannot finish",
            file=sys.stderr,
        )
    if sft_steps > 0:
        sft = SFTTrainer(
            model=model,
            train_dataset=assistant_tokens(tokenizer, demos),  # loss on the tool calls, not the tool results
            processing_class=tokenizer,
            args=SFTConfig(
                output_dir=str(work / "sft"),
                max_steps=sft_steps,
                per_device_train_batch_size=SFT_BATCH,
                learning_rate=args.sft_lr,
                lr_scheduler_type="constant",
                completion_only_loss=True,
                **cpu,
            ),
        )
        sft.train()
        model = str(work / "sft")
        sft.save_model(model)
        tokenizer.save_pretrained(model)

    def held_out_accuracy(trained: Any) -> dict[str, Any]:
        """Greedy episodes on tasks GRPO never sees, judged by the env."""
        played = play(trained.eval(), tokenizer, env_class, held_out, max_new_tokens=args.turn_tokens)
        trained.train()
        return {"accuracy": sum(r["reward"] or 0.0 for r in played) / max(len(played), 1), "tasks": played}

    grpo = GRPOTrainer(
        model=model,
        train_dataset=prompts,
        processing_class=tool_calling_tokenizer(model),
        environment_factory=env_class,
        args=GRPOConfig(
            output_dir=str(out),
            max_steps=args.steps,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=batch // micro,
            num_generations=args.num_generations,
            max_completion_length=budget,
            max_tool_calling_iterations=args.env_kwargs.get("max_turns", 8),
            learning_rate=args.lr,
            temperature=args.temperature,
            **cpu,
        ),
    )
    before = held_out_accuracy(grpo.model) if held_out else None
    grpo.train()
    grpo.save_model(str(out))
    after = held_out_accuracy(grpo.model) if held_out else None
    rows = [
        {
            "step": log["step"],
            "reward": log["reward"],
            "reward_std": log["reward_std"],  # over the whole batch: nonzero even when no group has spread
            "groups_with_spread": groups_with_spread(log),  # the share of groups GRPO learns from (advantage != 0)
            "tool_calls": log["tools/call_frequency"],
            "loss": log["loss"],
        }
        for log in grpo.state.log_history
        if "reward" in log
    ]
    for row in rows:
        print(json.dumps(row))
    warning = quiet_groups_warning(grpo.state.log_history)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    result = {"sizing": sizing, "steps": rows, "held_out_before": before, "held_out_after": after, "model": str(out)}
    if held_out:
        print(json.dumps({"held_out_accuracy": {"before": before["accuracy"], "after": after["accuracy"]}}))  # type: ignore[index]
    print(json.dumps({"model": str(out)}))
    return result


if __name__ == "__main__":
    main()
