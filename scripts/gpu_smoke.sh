#!/bin/bash
# A GPU smoke check of the trainer and eval (never in CI): DEV=cuda OUT=/tmp/out bash scripts/gpu_smoke.sh
# GPU smoke of the refactored trainer: searchgym train (local launcher) on CUDA, fp32 and bf16, then eval on CUDA.
set -o pipefail
DEV=${DEV:-cuda}
OUT=${OUT:-/tmp/gpuout}; mkdir -p $OUT
sg() { python3 -c "import sys; from searchgym.cli import main; sys.exit(main(sys.argv[1:]))" "$@"; }
W=/tmp/sgwork; rm -rf $W; mkdir -p $W
python3 -c "import torch,sys; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
t0=$(date +%s)
sg model tiny --out $W/tiny --hidden 64 --layers 2 2>&1 | tail -2
for dtype in float32 bfloat16; do
  s=$(date +%s)
  sg train model.path=$W/tiny model.device=$DEV model.dtype=$dtype steps=4 save_every=2 out_dir=$W/run-$dtype \
     rollout.group_size=4 rollout.batch_size=4 rollout.max_new_tokens=32 'env.kwargs={size: 300, n_tasks: 40, split: train, max_turns: 3}' 2>&1 | tail -4
  echo "train $dtype rc=$? in $(( $(date +%s) - s )) s"
  cp $W/run-$dtype/metrics.jsonl $OUT/metrics-$dtype.jsonl 2>/dev/null
  ls $W/run-$dtype/checkpoints 2>&1 | tr '\n' ' '; echo
done
s=$(date +%s)
sg eval --env searchgym/SyntheticQA-v0 --env-kwargs '{"size": 300, "n_tasks": 40, "split": "test", "max_turns": 3}' \
   --engine $W/run-bfloat16/checkpoints/step-00004 --device $DEV --k 2 --max-tasks 16 --max-new-tokens 32 --out $W/eval 2>&1 | tail -4
echo "eval rc=$? in $(( $(date +%s) - s )) s"
cp $W/eval/summary.json $OUT/eval-summary.json 2>/dev/null; cp $W/eval/run.json $OUT/eval-run.json 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
