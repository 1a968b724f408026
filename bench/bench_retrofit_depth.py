"""
Calibration of the retrofitted depth task (config/cpu_retrofit_depth.json): the step time of small
SmolLM2 cuts on the S3 running-product rows in SmolLM2's own tokens, measured side by side in one run.

At 13 tokens a row (test depth 12) and 7 labeled columns (train depth 6), two costs dominate a step
that a text step does not show: the 49k-vocabulary head and Muon's Newton-Schulz, which does not
shrink with the batch. For each shape this prints, per optimizer step of B rows at r = 4 (all four
loops with grad, McLeish et al. 2025, arXiv 2511.07384):
  full      forward + backward on whole rows, head at every position (train.py before the cut)
  cut       rows cut to their labeled columns (exact: causal attention, padding only after them)
  cut+head  and the head only at the labeled positions (exact: same loss)
  loop/all  per-loop supervision (the config's --step_supervision, arXiv 2608.11233), the head after every
            loop at every label (model.forward before it read out only the labels a loop reaches)
  loop      the same, the head after loop i only at the labels of depth <= i (exact: same loss, as train.py)
  muon      one Muon step over the block matrices and the adapter (muon.py)
with the loss of each variant, which must agree (the two per-loop ones with each other). Random weights
in SmolLM2-135M's shapes: the timing does not depend on the values.

    python bench/bench_retrofit_depth.py                         # (2,2,2), (2,4,2), (4,4,4), B = 32
    python bench/bench_retrofit_depth.py --shapes 2,2,2 --batch 64 --repeat 3
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_train import smollm2_config  # noqa: E402
from model import RecurrentGPT  # noqa: E402
from per_loop import IGNORE_INDEX  # noqa: E402
from muon import Muon  # noqa: E402


def depth_rows(B, train_k, test_k, vocab, seed=0):
    """B train rows in the data's layout: start token, train_k elements, padding up to test_k + 1."""
    g = torch.Generator().manual_seed(seed)
    T = test_k + 1
    x = torch.zeros(B, T, dtype=torch.long)
    x[:, 1:train_k + 1] = torch.randint(253, 259, (B, train_k), generator=g)
    y = torch.full((B, T), IGNORE_INDEX)
    y[:, 1:train_k + 1] = torch.randint(330, 336, (B, train_k), generator=g)
    return x, y


def time_it(fns, repeat):
    """Best-of times of several functions, interleaved so that a busy moment hits them alike."""
    for fn in fns.values():
        fn()  # warm-up
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--shapes", default="2,2,2;2,4,2;4,4,4", help="prelude,core,coda; separated by ;")
    ap.add_argument("--batch", type=int, default=32, help="rows per optimizer step")
    ap.add_argument("--r", type=int, default=4, help="loops, all with grad")
    ap.add_argument("--train_k", type=int, default=6)
    ap.add_argument("--test_k", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"threads {torch.get_num_threads()}, batch {args.batch} rows of {args.test_k + 1} tokens "
          f"({args.train_k} labeled), r = {args.r}")
    print(f"{'shape':>8} {'full s':>8} {'cut s':>8} {'cut+head s':>11} {'loop/all s':>11} {'loop s':>8} {'muon s':>8} "
          f"{'step s':>8}  losses")
    for spec in args.shapes.split(";"):
        shape = tuple(int(v) for v in spec.split(","))
        torch.manual_seed(0)
        model = RecurrentGPT(smollm2_config(shape))
        model.reset_adapter("random")  # a state path that matters, as after some training
        model.config.state_init = "zero"  # the same forward in every variant, so the losses compare
        x, y = depth_rows(args.batch, args.train_k, args.test_k, model.config.vocab_size)
        xc, yc = x[:, :args.train_k + 1], y[:, :args.train_k + 1]
        dc = torch.arange(args.train_k + 1).expand_as(xc)  # a label's task depth is its position
        losses = {}

        def run(name, fn):
            def step():
                model.zero_grad(set_to_none=True)
                loss = fn()
                loss.backward()
                losses[name] = loss.item()
            return step

        full = run("full", lambda: model(x, y, num_steps=args.r)[1])
        cut = run("cut", lambda: F.cross_entropy(model(xc, num_steps=args.r)[0].flatten(0, 1), yc.flatten(),
                                                 ignore_index=IGNORE_INDEX))
        head = run("cut+head", lambda: model(xc, yc, num_steps=args.r, labeled_only=True)[1])
        per_loop = dict(num_steps=args.r, depths=dc, depth_weight=1.0, labeled_only=True)
        loop_all = run("loop/all", lambda: model(xc, yc, **per_loop, return_loop_logits=True).loss)  # every label
        loop = run("loop", lambda: model(xc, yc, **per_loop)[1])  # as train.py with --step_supervision
        matrices = [p for n, p in model.named_parameters()
                    if p.ndim == 2 and n.startswith(("prelude.", "core.", "coda.", "adapter."))]
        opt = Muon(matrices, lr=1e-9)  # a tiny lr: timing only, the weights barely move
        for p in matrices:
            p.grad = torch.randn_like(p)
        t = time_it({"full": full, "cut": cut, "cut+head": head, "loop/all": loop_all, "loop": loop, "muon": opt.step},
                    args.repeat)
        step = t["loop"] + t["muon"]  # the config's step
        print(f"{spec:>8} {t['full']:>8.2f} {t['cut']:>8.2f} {t['cut+head']:>11.2f} {t['loop/all']:>11.2f} "
              f"{t['loop']:>8.2f} {t['muon']:>8.2f} {step:>8.2f}  " + " ".join(f"{v:.6f}" for v in losses.values()))


if __name__ == "__main__":
    main()
