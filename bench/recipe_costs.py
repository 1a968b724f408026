"""
What the paper's GPU recipes cost, by the paper's FLOP rule (McLeish et al. 2025, arXiv 2511.07384):
with n = max(r - k, 0) no-grad loops and min(r, k) grad loops per step,
FLOPs per token = 6 (P + min(r,k) R + C) + 2 n R (embeddings, head and adapter left out).

The models are built on the meta device from the parents' published config.json shapes (no download),
so the parameter counts per part are exact; GPU-hours assume the given peak and MFU.

    python bench/recipe_costs.py                              # H100 bf16 dense peak, 40% MFU, 50B tokens
    python bench/recipe_costs.py --mfu 0.3 --tokens 25e9 --peak 989e12
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import RecurrentConfig, RecurrentGPT  # noqa: E402

# shapes from the parents' config.json on the hub (hidden, heads, kv heads, MLP, vocab, tied head, layers)
PARENTS = {
    "TinyLlama-1.1B": dict(n_embd=2048, n_head=32, n_kv_head=4, head_dim=64, intermediate_size=5632, vocab_size=32000,
                           tie_embeddings=False, n_layers=22),
    "Llama-3.2-1B": dict(n_embd=2048, n_head=32, n_kv_head=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
                         tie_embeddings=True, n_layers=16),
    "OLMo-2-0425-1B": dict(n_embd=2048, n_head=16, n_kv_head=16, head_dim=128, intermediate_size=8192, vocab_size=100352,
                           tie_embeddings=False, n_layers=16, block_type="olmo2", qk_norm=True),
}  # fmt: skip
RECIPES = [("TinyLlama-1.1B", (4, 8, 4)), ("Llama-3.2-1B", (4, 6, 4)), ("OLMo-2-0425-1B", (4, 6, 4))]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--r", type=int, default=32, help="mean train recurrence (the paper's final rbar)")
    p.add_argument("--k", type=int, default=8, help="truncated backprop depth")
    p.add_argument("--tokens", type=float, default=50e9, help="training tokens")
    p.add_argument("--peak", type=float, default=989e12, help="peak FLOP/s of one GPU (H100 SXM bf16 dense)")
    p.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilization you expect")
    args = p.parse_args()
    print(f"r={args.r} k={args.k} tokens={args.tokens:.3g} peak={args.peak:.3g} FLOP/s mfu={args.mfu}")
    print(f"{'recipe':<24}{'P+R+C params':>14}{'static GF/tok':>15}{'recur GF/tok':>14}{'ratio':>7}{'GPU-hours':>11}")
    for name, (P, R, C) in RECIPES:
        shape = dict(PARENTS[name])
        n_layers = shape.pop("n_layers")
        with torch.device("meta"):
            rec = RecurrentGPT(RecurrentConfig(**shape, n_prelude=P, n_core=R, n_coda=C))
            static = RecurrentGPT(RecurrentConfig(**shape, n_prelude=1, n_core=n_layers - 2, n_coda=1, recurrent=False))
        pc = rec.param_counts()
        f_rec, f_static = rec.flops_per_token(args.r, args.k), static.flops_per_token(1)
        hours = f_rec * args.tokens / (args.peak * args.mfu) / 3600
        blocks = pc["prelude"] + pc["core"] + pc["coda"]
        print(f"{name + f' ({P},{R},{C})':<24}{blocks / 1e6:>13.0f}M{f_static / 1e9:>15.2f}{f_rec / 1e9:>14.2f}"
              f"{f_rec / f_static:>7.1f}{hours:>11,.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
