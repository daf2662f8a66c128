#!/bin/bash
# Issue 40: the papers' claims on SmolLM2-135M-Instruct, one (seed, arm) at a time. Rerun it each session from the
# repository root: finished units are skipped (their rows are in results/reproduce_CLAIM_smollm2.arms.jsonl), an RL
# arm cut mid-run goes on from its last checkpoint, and after each claim's seed the results file and the pages'
# tables are rewritten. One unit runs at a time: an arm peaks at 12 to 21 GB on the 2-core, 24 GB machine.
# Long horizon's seeds come first: about 70 minutes a seed, so its verdict comes soonest, and shaping reuses each of
# its warm starts (the two settings differ only in RL). Then shaping and staleness, about 3 hours a seed each, seed
# by seed. docs/reproductions.md says how each setting was chosen, and which trials failed.
# Run it with the project's venv active (`searchgym` on PATH):
#   setsid nohup bash scripts/reproduce_real_model.sh > /tmp/reproduce.log 2>&1 < /dev/null &
# Where the run folder does not outlive the session (a fresh checkout each time), set STOP_BY to the time the machine
# must be free (an ISO date and time, e.g. STOP_BY=2026-12-08T02:55): no unit starts that would end later at the
# finished units' pace, so none is cut and lost.
set -euo pipefail
export MALLOC_ARENA_MAX=2  # glibc's per-thread arenas otherwise hold gigabytes the engine's threads freed
reproduce() {  # a claim over seeds 0..$2, so each report pools every seed so far
  searchgym bench reproduce "$1" --model smollm2 --seeds "$(seq -s, 0 "$2")" ${STOP_BY:+--stop-by "$STOP_BY"}
  searchgym bench reproduce --render
}
for last in 0 1 2 3 4; do reproduce long_horizon "$last"; done
for last in 0 1 2 3 4; do
  for claim in shaping staleness; do reproduce "$claim" "$last"; done
done
