#!/usr/bin/env bash
# The CPU demo (`make demo`): the core claim of retrofitted recurrence on 2 cores, no hub access.
#   1. a small recurrent model trained from scratch on the synthetic depth task (S3 running products):
#      accuracy by (task depth k, test loops r), beyond the trained depth included;
#   2. the offline SmolLM2-135M retrofit (retrofit_depth.sh, shortened): the surgery's exactness check, the same
#      task in SmolLM2's own tokens, the cut model trained on it, its accuracy by (k, r) beside 1's, and its
#      latent trajectories. `make retrofit_depth` runs the whole of it (both phases).
# Everything goes through the project's own scripts; outputs land in $OUT (default out/demo).
set -euo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-out/demo}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}  # the demo needs no hub: smollm2 resolves to the GGUF from PyPI
step() { printf '\n=== %s\n' "$*"; }
start=$(date +%s)
rm -rf "$OUT/depth"  # a fresh run each time (train.py without --resume would append to it; retrofit_depth.sh clears its own)

step "1a. the depth task: S3 running products, train depth k <= 6, test up to 12"
python data/depth/prepare.py --out_dir "$OUT/data_depth"
step "1b. a small recurrent model trained from scratch (mean r 5, backprop through the last 4 loops, 1000 steps)"
python train.py --config config/cpu_depth.json --data "$OUT/data_depth" --out_dir "$OUT/depth"
step "1c. accuracy by depth k and test-time loops r"
python eval_math.py --init "$OUT/depth" --task depth --data "$OUT/data_depth" --r 1,2,4,8,16,32 --out_dir "$OUT/eval_depth"

step "2a-d. the retrofit (retrofit_depth.sh, shortened: 100 of phase 1's 400 steps, no phase 2, ~12 min, one seed)"
STEPS=100 PHASE2_STEPS=0 OUT="$OUT" bash retrofit_depth.sh
step "2e. the two side by side: the from-scratch model (1b) and the retrofit (2a-d)"
python -m experiments.repeat --compare "$OUT/eval_depth" "$OUT/eval_retrofit_depth"
step "2f. latent trajectories of the retrofit on one depth-9 problem"
python analyze.py --init "$OUT/retrofit_depth" --prompt " c a f b e d a b c" --r 32 --seeds 2 --out_dir "$OUT/analyze"

step "done in $(( $(date +%s) - start )) s; plots: $OUT/depth/*.png $OUT/eval_depth/*.png $OUT/retrofit_depth/*.png $OUT/eval_retrofit_depth/*.png $OUT/analyze/*.png"
