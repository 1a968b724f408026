#!/usr/bin/env bash
# The CPU demo (`make demo`): retrofitted recurrence on 2 cores, no hub access. The offline SmolLM2-135M is cut
# to (2,2,2) (the surgery's exactness check), the S3 depth task is written in its own tokens, the cut model is
# trained with both phases of the retrofit recipe, shortened (retrofit_depth.sh with STEPS=260 PHASE2_STEPS=30:
# phase 1's first 260 steps, phase 2's first 30; RESULTS.md has this recipe's three seeds), and its accuracy by
# (task depth k, test loops r) is printed, beyond the trained depth included; then its latent trajectories on one
# depth-9 problem. `make retrofit_depth` runs the whole recipe (400 + 50 steps).
# Everything goes through the project's own scripts; outputs land in $OUT (default out/demo).
set -euo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-out/demo}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}  # the demo needs no hub: smollm2 resolves to the GGUF from PyPI
step() { printf '\n=== %s\n' "$*"; }
start=$(date +%s)

step "1-4. the retrofit (retrofit_depth.sh, shortened: 260 + 30 steps, one seed)"
STEPS=260 PHASE2_STEPS=30 OUT="$OUT" bash retrofit_depth.sh
step "5. latent trajectories of the retrofit on one depth-9 problem"
python analyze.py --init "$OUT/retrofit_depth" --prompt " c a f b e d a b c" --r 32 --seeds 2 --out_dir "$OUT/analyze"

step "done in $(( $(date +%s) - start )) s; plots: $OUT/retrofit_depth/*.png $OUT/eval_retrofit_depth/*.png $OUT/analyze/*.png"
