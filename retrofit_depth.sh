#!/usr/bin/env bash
# The retrofit on the depth task, whole, as one command (`make retrofit_depth`): the offline SmolLM2-135M cut
# to (2,2,2), the S3 depth task in its own tokens, phase 1 (config/cpu_retrofit_depth.json: 400 steps at mean
# r 4), phase 2 (config/cpu_retrofit_depth_phase2.json: 50 steps at mean r 16), then accuracy by (task depth,
# test loops r) on the test split. One seed (SEED, default 1337); RESULTS.md has several seeds of the same two
# configs, and the time it takes. demo.sh runs it shorter: STEPS=260 PHASE2_STEPS=30.
# Its outputs in $OUT, the same names as the configs' own when they run by hand:
#   $OUT/smollm2_2_2_2 (the cut), $OUT/data_depth_smollm2 (the task), $OUT/retrofit_depth_phase1 (phase 1),
#   $OUT/retrofit_depth (phase 2: the final checkpoint), $OUT/eval_retrofit_depth (its accuracy table and PNGs)
#   bash retrofit_depth.sh                       # OUT=out/retrofit (make retrofit_depth)
#   STEPS=260 PHASE2_STEPS=30 OUT=out/demo bash retrofit_depth.sh   # make demo
set -euo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-out/retrofit}
STEPS=${STEPS:-400}
PHASE2_STEPS=${PHASE2_STEPS:-50}
SEED=${SEED:-1337}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}  # no hub: smollm2 resolves to the GGUF from PyPI
step() { printf '\n=== %s\n' "$*"; }
start=$(date +%s)
rm -rf "$OUT/retrofit_depth" "$OUT/retrofit_depth_phase1"  # fresh runs (train.py without --resume would append to them)
final="$OUT/retrofit_depth"
phase1="$OUT/retrofit_depth_phase1"
[ "$PHASE2_STEPS" -gt 0 ] || phase1="$final"

step "surgery: SmolLM2-135M (30 layers) cut to (2,2,2), adapter [0 | I]; the self-check must print diff 0"
python surgery.py --init=smollm2 --shape 2,2,2 --out "$OUT/smollm2_2_2_2" --overwrite
step "the depth task in SmolLM2's own tokens (' a'..' f' in, ' A'..' F' out), train depth 6, test up to 9"
python data/depth/prepare.py --tokenizer "$OUT/smollm2_2_2_2" --out_dir "$OUT/data_depth_smollm2" --train_depth 6 --test_depth 9
step "phase 1: $STEPS steps of config/cpu_retrofit_depth.json (mean r 4, per-loop supervision)"
python train.py --config config/cpu_retrofit_depth.json --init "$OUT/smollm2_2_2_2" --data "$OUT/data_depth_smollm2" \
  --out_dir "$phase1" --max_iters "$STEPS" --seed "$SEED"
if [ "$PHASE2_STEPS" -gt 0 ]; then
  step "phase 2: $PHASE2_STEPS steps of config/cpu_retrofit_depth_phase2.json (mean r 16, lr / 3), from phase 1"
  python train.py --config config/cpu_retrofit_depth_phase2.json --init "$phase1" \
    --data "$OUT/data_depth_smollm2" --out_dir "$final" --max_iters "$PHASE2_STEPS" --seed "$SEED"
fi
step "the retrofit's accuracy by task depth and test-time loops r, on the test split"
python eval_math.py --init "$final" --task depth --data "$OUT/data_depth_smollm2" --r 1,2,4,8,16,32 \
  --split test --batch_size 100 --out_dir "$OUT/eval_retrofit_depth"

step "retrofit_depth.sh done in $(( $(date +%s) - start )) s; plots: $final/*.png $OUT/eval_retrofit_depth/*.png"
