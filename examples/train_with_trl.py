"""Train a model with TRL's GRPOTrainer on a searchgym env, on CPU: a supervised warm start on the oracle's
tool-calling episodes (TRL's SFTTrainer), then GRPO with the env as TRL's `environment_factory`.

    pip install 'searchgym[trl]'
    python examples/train_with_trl.py --steps 5

Without --model it builds the tiny test model (a 2-layer Qwen2 with a tool-capable chat template); pass a
Hugging Face model directory with a tool-capable template (Qwen2.5, Qwen3, ...) for a real run. It prints
one JSON line per GRPO step: the mean reward (the env judge's verdicts), tool calls, loss.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

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


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: build the tiny model)")
    parser.add_argument("--env", default=ENV_ID)
    parser.add_argument("--env-kwargs", type=json.loads, default=SMALL_ENV, help="JSON kwargs for gym.make")
    parser.add_argument("--tasks", type=int, default=8, help="train on the first N tasks of the pool")
    parser.add_argument("--sft-steps", type=int, default=100, help="warm-start steps on oracle episodes (0: none)")
    parser.add_argument("--steps", type=int, default=5, help="GRPO steps")
    parser.add_argument("--num-generations", type=int, default=4, help="rollouts per question (GRPO's group)")
    parser.add_argument("--out", type=Path, default=None, help="where to save the trained model")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a tiny model is fastest on 1)")
    args = parser.parse_args(argv)

    import torch
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    from searchgym.integrations.trl import SearchGymEnv, demonstrations, task_dataset, tool_calling_tokenizer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="searchgym-trl-"))
    model = args.model
    if model is None:
        from searchgym.agents.tiny_model import build_tiny_model

        model = str(build_tiny_model(work / "tiny", init_std=0.02))
    out = args.out or work / "grpo"
    cpu = {
        "use_cpu": not torch.cuda.is_available(),
        "bf16": False,
        "activation_checkpointing": False,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "seed": 0,
    }

    env_class = SearchGymEnv.configured(args.env, **args.env_kwargs)
    prompts = task_dataset(args.env, limit=args.tasks, **args.env_kwargs)
    tokenizer = tool_calling_tokenizer(model)
    if args.sft_steps > 0:
        demos = demonstrations(env_class, list(prompts["task_id"]))
        sft = SFTTrainer(
            model=model,
            train_dataset=demos,
            processing_class=tokenizer,
            args=SFTConfig(
                output_dir=str(work / "sft"),
                max_steps=args.sft_steps,
                per_device_train_batch_size=4,
                learning_rate=3e-3,
                lr_scheduler_type="constant",
                **cpu,
            ),
        )
        sft.train()
        model = str(work / "sft")
        sft.save_model(model)
        tokenizer.save_pretrained(model)

    batch = args.num_generations * max(1, min(2, len(prompts)))
    grpo = GRPOTrainer(
        model=model,
        train_dataset=prompts,
        processing_class=tool_calling_tokenizer(model),
        environment_factory=env_class,
        args=GRPOConfig(
            output_dir=str(out),
            max_steps=args.steps,
            per_device_train_batch_size=batch,
            num_generations=args.num_generations,
            max_completion_length=256,
            max_tool_calling_iterations=args.env_kwargs.get("max_turns", 8),
            learning_rate=1e-4,
            **cpu,
        ),
    )
    grpo.train()
    grpo.save_model(str(out))
    rows = [
        {
            "step": log["step"],
            "reward": log["reward"],
            "reward_std": log["reward_std"],
            "tool_calls": log["tools/call_frequency"],
            "loss": log["loss"],
        }
        for log in grpo.state.log_history
        if "reward" in log
    ]
    for row in rows:
        print(json.dumps(row))
    print(json.dumps({"model": str(out)}))
    return rows


if __name__ == "__main__":
    main()
