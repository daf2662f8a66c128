#!/bin/bash
# GPU check of README's TRL recipe (never in CI): `searchgym bench trl` on CUDA, one process per seed, then the
# pooled summary. The example trains on CUDA whenever torch sees a GPU (copy pretraining, warm start, GRPO, held-out
# play). Usage: OUT=/tmp/out NAME=bench_trl_gpu SEEDS="0 1 2" COMMIT=$(git rev-parse HEAD) bash scripts/gpu_trl.sh [example args]
# Writes OUT/NAME.json (the summary), OUT/NAME.seeds.jsonl (one row per seed) and OUT/NAME.log (each seed's log tail).
set -o pipefail
OUT=${OUT:-/tmp/gpuout}; mkdir -p "$OUT"
NAME=${NAME:-bench_trl_gpu}
SEEDS=${SEEDS:-0 1 2 3 4}
ARGS=("$@")
sg() { python3 -c "import sys; from searchgym.cli import main; sys.exit(main(sys.argv[1:]))" "$@"; }
W=/tmp/trlwork-$NAME; rm -rf "$W"; mkdir -p "$W"
t0=$(date +%s)
for s in $SEEDS; do
  (PYTHONUNBUFFERED=1 sg bench trl --seeds "$s" --out "$W/seed$s.json" -- "${ARGS[@]}" > "$W/seed$s.log" 2>&1
   echo "$NAME seed $s rc=$? at $(( $(date +%s) - t0 )) s") &
done
wait
cat "$W"/seed*.seeds.jsonl > "$W/$NAME.seeds.jsonl" 2>/dev/null
sg bench trl --seeds "$(echo $SEEDS | tr ' ' ,)" --out "$W/$NAME.json" -- "${ARGS[@]}" > "$W/summary.log" 2>&1
tail -12 "$W/summary.log"
# the device's copy of the tree has no .git: the commit it ran is passed in COMMIT
[ -n "$COMMIT" ] && python3 -c "import json,sys; p=sys.argv[1]; d=json.load(open(p)); d['commit']=d['commit'] or sys.argv[2]; json.dump(d, open(p,'w'), indent=2)" "$W/$NAME.json" "$COMMIT"
cp "$W/$NAME.json" "$W/$NAME.seeds.jsonl" "$OUT"/ 2>/dev/null
for s in $SEEDS; do echo "== seed $s"; grep -v "Writing\|Loading\|^{'loss'\|it/s\]" "$W/seed$s.log" | tail -25; done > "$OUT/$NAME.log"
echo "$NAME total $(( $(date +%s) - t0 )) s"
