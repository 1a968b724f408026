"""
What the paper's GPU recipes cost, by the paper's FLOP rule (McLeish et al. 2025, arXiv 2511.07384):
with n = max(r - k, 0) no-grad loops and min(r, k) grad loops per step,
FLOPs per token = 6 (P + min(r,k) R + C) + 2 n R (embeddings, head and adapter left out).
And the memory per GPU of the training state, under DDP and under train.py --fsdp (plumbing/fsdp.py),
for those recipes and for an 8B parent (Llama-3.1-8B's shape; its (8,12,8) cut is the Llama-3.2-1B
(4,6,4) map scaled to 32 layers, ours, not a published recipe), as a markdown table.

The models are built on the meta device from the parents' published config.json shapes (no download),
so the parameter counts per part are exact; GPU-hours assume the given peak and MFU. The optimizer split
is train.py's own (make_optimizers): Muon on the blocks' matrices and the adapter, AdamW on the rest.

    python bench/recipe_costs.py                              # H100 bf16 dense peak, 40% MFU, 50B tokens
    python bench/recipe_costs.py --mfu 0.3 --tokens 25e9 --peak 989e12
    python bench/recipe_costs.py --world 8,64                 # the FSDP memory at 8 and at 64 GPUs
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402
from model import RecurrentConfig, RecurrentGPT  # noqa: E402

# shapes from the parents' config.json on the hub (hidden, heads, kv heads, MLP, vocab, tied head, layers)
PARENTS = {
    "TinyLlama-1.1B": dict(n_embd=2048, n_head=32, n_kv_head=4, head_dim=64, intermediate_size=5632, vocab_size=32000,
                           tie_embeddings=False, n_layers=22),
    "Llama-3.2-1B": dict(n_embd=2048, n_head=32, n_kv_head=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
                         tie_embeddings=True, n_layers=16),
    "OLMo-2-0425-1B": dict(n_embd=2048, n_head=16, n_kv_head=16, head_dim=128, intermediate_size=8192, vocab_size=100352,
                           tie_embeddings=False, n_layers=16, block_type="olmo2", qk_norm=True),
    "Llama-3.1-8B": dict(n_embd=4096, n_head=32, n_kv_head=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
                         tie_embeddings=False, n_layers=32),
}  # fmt: skip
RECIPES = [("TinyLlama-1.1B", (4, 8, 4)), ("Llama-3.2-1B", (4, 6, 4)), ("OLMo-2-0425-1B", (4, 6, 4))]
BIG = [("Llama-3.1-8B", (8, 12, 8))]  # memory only: an 8B parent, the Llama-3.2 (4,6,4) map scaled to 32 layers
GB = 1e9


def training_bytes(model, world):
    """Bytes per GPU of the training state, as train.py holds it (activations not counted): (DDP, FSDP
    sharded, FSDP gathered) for `world` GPUs. Per parameter: fp32 weights 4 + fp32 gradients 4, Muon's
    momentum 4 or AdamW's two moments 8; DDP adds its gradient buckets (4: torch's default
    gradient_as_bucket_view=False keeps them apart from .grad). FSDP divides all of it by world, and holds
    whole the units it has gathered: the root (embedding, adapter, final norm) in fp32 from the forward's
    start to the backward's end, two blocks in bf16 (the one running and the one prefetched), and an
    untied head in bf16 during the readout (plumbing/fsdp.py)."""
    opts, split = train.make_optimizers(model, train.parse_args(["--init=scratch"]))
    named = dict(model.named_parameters())
    n = lambda names: sum(named[k].numel() for k in names)
    total = n(named)
    state = 4 * (total + total) + 4 * n(split["muon"]) + 8 * n(split["adamw"])
    count = lambda m: sum(p.numel() for p in m.parameters())
    untied = not model.config.tie_embeddings
    root = total - sum(count(b) for b in (*model.prelude, *model.core, *model.coda)) - untied * count(model.lm_head)
    block = max(count(b) for b in (*model.prelude, *model.core, *model.coda))
    gathered = 4 * root + 2 * 2 * block + 2 * untied * count(model.lm_head)
    return state + 4 * total, state / world, gathered


def memory_table(rows, worlds):
    """The markdown table: parameters, and GB per GPU under DDP and under FSDP at each world size."""
    head = ["model (P,R,C)", "params", "DDP"] + [f"FSDP, {w} GPUs" for w in worlds]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, model in rows:
        ddp = training_bytes(model, 1)[0]
        fsdp = [training_bytes(model, w)[1:] for w in worlds]
        cells = [name, f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B", f"{ddp / GB:.1f} GB"]
        cells += [f"{(s + g) / GB:.1f} GB ({s / GB:.1f} + {g / GB:.1f})" for s, g in fsdp]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--r", type=int, default=32, help="mean train recurrence (the paper's final rbar)")
    p.add_argument("--k", type=int, default=8, help="truncated backprop depth")
    p.add_argument("--tokens", type=float, default=50e9, help="training tokens")
    p.add_argument("--peak", type=float, default=989e12, help="peak FLOP/s of one GPU (H100 SXM bf16 dense)")
    p.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilization you expect")
    p.add_argument("--world", default="8", help="GPUs for the FSDP memory columns, e.g. 8,64")
    args = p.parse_args()
    worlds = [int(w) for w in args.world.split(",")]
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

    rows = []
    for name, (P, R, C) in RECIPES + BIG:
        shape = dict(PARENTS[name])
        n_layers = shape.pop("n_layers")
        with torch.device("meta"):
            model = RecurrentGPT(RecurrentConfig(**shape, n_prelude=P, n_core=R, n_coda=C))
        rows.append((f"{name} ({P},{R},{C})", model))
    with torch.device("meta"):  # the 8B parent itself, every layer once: what training it without a loop holds
        rows.append((f"{name}, all {n_layers} layers (static)", RecurrentGPT(RecurrentConfig(
            **shape, n_prelude=1, n_core=n_layers - 2, n_coda=1, recurrent=False))))
    print("\nTraining state per GPU (GB = 1e9 bytes): fp32 weights and gradients, Muon on the block matrices and the "
          "adapter,\nAdamW on the rest; activations not counted (they scale with --batch_size, the sequence and k).\n"
          "DDP: 4 weights + 4 gradients + 4 DDP's gradient buckets, + 4 (Muon) or 8 (AdamW) of state, B a parameter.\n"
          "FSDP: sharded + gathered: all of that but the buckets, over the GPUs; plus the units gathered whole (the "
          "root in fp32,\ntwo blocks and an untied head in bf16), whose gradients add about as much again in the "
          "backward.\n")
    print(memory_table(rows, worlds))


if __name__ == "__main__":
    main()
