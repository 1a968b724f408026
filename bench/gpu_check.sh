#!/usr/bin/env bash
# The GPU figures of one accelerator in a few minutes, on random weights (nothing downloaded, no GGUF):
#   1. bench/bench_gpu.py: the bf16 train step of Llama-3.2-1B's shape cut (4,6,4), eager, and decode against
#      transformers' generate (its docstring says what each figure is);
#   2. bench/bench_sample.py section 5's speed table: the diffusion-forcing sampler (diffusion.py, arXiv 2510.14961)
#      against sequential decoding and --exit kl at r = 8, 16, 32, batch 1, on the same shape cut (4,6,4), bf16.
# Each writes its table to OUT_DIR (default out/gpu_check) as it goes.
#
#   bash bench/gpu_check.sh [OUT_DIR]          # on the GPU machine (python3 there holds torch and transformers)
#   bash bench/gpu_check.sh --smoke [OUT_DIR]  # CPU rehearsal: tiny shapes, the same code, under a minute
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE=0
if [ "${1:-}" = "--smoke" ]; then SMOKE=1; shift; fi
OUT_DIR=${1:-out/gpu_check}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
if [ $SMOKE = 1 ]; then
  GPU=(--smoke --only train,decode --new_tokens 4 --compile off)
  SAMPLER=(--parent random --random_shape tiny --device cpu --diffusion_r 4 --diffusion_threads 1 --n_new 4
           --repeats 1 --loops_per_pass 2 --thresholds 0.03 --headways 1,2)
else
  GPU=(--compile off --steps 2 --warmup 1 --new_tokens 64 --repeats 1)
  SAMPLER=(--parent random --device cuda --diffusion_r 8,16,32 --diffusion_threads 1 --n_new 48 --repeats 2)
fi
"$PY" -c "import torch; print('torch', torch.__version__, '| device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" \
  | tee "$OUT_DIR/device.txt"
"$PY" bench/bench_gpu.py "${GPU[@]}" --out "$OUT_DIR/bench_gpu.json" 2>&1 | tee "$OUT_DIR/bench_gpu.txt"
"$PY" bench/bench_sample.py --sections 5 "${SAMPLER[@]}" 2>&1 | tee "$OUT_DIR/sampler.txt"
echo "gpu_check: done, tables in $OUT_DIR"
