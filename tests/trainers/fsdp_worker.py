"""One rank of a sharded learner trained on fixed batches (run by test_fsdp.py under torchrun, 127.0.0.1).

    python -m torch.distributed.run --nproc-per-node 2 tests/trainers/fsdp_worker.py SPEC.json

SPEC: model_dir, batches (a torch.save'd list of steps' groups), run_dir, steps, config (LearnerConfig kwargs),
resume (bool), die_after (a step after whose checkpoint rank 0 exits abruptly, as a killed job would), follow
(bool: rank 0 runs the loop with lead(), the others follow(); else every rank runs it).
After each step rank 0 writes the consolidated weights to run_dir/weights-<step>.pt.
"""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from searchgym.trainers.algorithm.fsdp import ShardedLearner, init_ranks
from searchgym.trainers.config import LearnerConfig
from searchgym.trainers.run.checkpoint import latest_checkpoint


def main(spec_path: str) -> None:
    spec = json.load(open(spec_path))
    rank, _ = init_ranks()
    os.makedirs(spec["run_dir"], exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    learner = ShardedLearner(model, LearnerConfig(**spec["config"]), pad_id=tokenizer.pad_token_id or 0)
    if spec.get("follow"):  # rank 0 runs the loop and leads; the others replay its collectives
        if rank != 0:
            learner.follow()
            torch.distributed.destroy_process_group()
            return
        learner.lead()
    start = 0
    if spec["resume"]:
        start = learner.load_checkpoint(latest_checkpoint(spec["run_dir"]))["step"]
    batches = torch.load(spec["batches"], weights_only=False) if rank == 0 else None
    for step in range(start, spec["steps"]):
        stats = learner.step(batches[step] if rank == 0 else None)
        weights = learner.consolidated_model() if spec.get("follow") else learner.full_state_dict()
        if rank == 0:
            weights = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
            torch.save({"weights": weights, "stats": stats}, os.path.join(spec["run_dir"], f"weights-{step + 1}.pt"))
        learner.save_checkpoint(spec["run_dir"], step + 1, tokenizer=tokenizer, state={"step_note": step + 1})
        if spec.get("die_after") == step + 1 and rank == 0:
            os._exit(3)
    if spec.get("follow"):
        learner.stop()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
