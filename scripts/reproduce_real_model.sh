#!/bin/bash
# Issue 40: the papers' claims on SmolLM2-135M-Instruct, one (seed, arm) at a time, seed by seed, so every claim
# gains its seeds together. Rerun it each session from the repository root: finished units are skipped (their rows
# are in results/reproduce_CLAIM_smollm2.arms.jsonl), an RL arm cut mid-run goes on from its last checkpoint, and
# after each claim's seed the results file and the pages' tables are rewritten. One unit runs at a time: an arm peaks
# at 12 to 21 GB on the 2-core, 24 GB machine. Long horizon goes before shaping, which reuses its warm start
# (docs/reproductions.md says how each setting was chosen, and which trials failed).
# Run it with the project's venv active (`searchgym` on PATH):
#   setsid nohup bash scripts/reproduce_real_model.sh > /tmp/reproduce.log 2>&1 < /dev/null &
set -euo pipefail
export MALLOC_ARENA_MAX=2  # glibc's per-thread arenas otherwise hold gigabytes the engine's threads freed
for last in 0 1 2 3 4; do
  seeds=$(seq -s, 0 "$last")  # every seed so far, so each report pools them all
  for claim in long_horizon shaping staleness; do
    searchgym bench reproduce "$claim" --model smollm2 --seeds "$seeds"
    searchgym bench reproduce --render
  done
done
