"""
Benchmarks of the training step of retrofitted recurrence (McLeish et al. 2025, arXiv 2511.07384),
side by side in one run, on a SmolLM2-135M-shaped model with random weights (h 576, 9 heads / 3 KV,
MLP 1536, vocab 49152, tied head):

  1. matmul peak of this machine (a big fp32 matmul, measured now) and the train-step throughput as a
     share of it (goal >= 60% fp32 on CPU);
  2. peak memory of a step at r=32 vs r=8 with backprop depth k=8 (goal <= 1.15x: the no_grad prefix
     keeps no activations);
  3. step time with a no_grad prefix (r = 16, 32 at k = 8) vs the (6 N1 + 2 N2) prediction;
  4. Muon step time (muon.py, batched Newton-Schulz in fp32 and in bf16) vs torch.optim.Muon (bf16) on
     the same matrices (goal <= 0.6x on CPU; a CPU with bf16 dot products, where bf16 multiplies faster
     than fp32, does not reach it in fp32: RESULTS.md, "How fast is it");
  5. precision: train.py's own step (train_step + apply_update: forward, backward, clipping, Muon + AdamW)
     of the retrofit config (config/cpu_retrofit_depth.json: SmolLM2 (2,2,2), 32 depth-task rows, mean
     r 4, k 4, per-loop supervision) in fp32 (--autocast off) and in what --autocast auto picks on this
     machine, over the same steps alternately; their ratio (goal >= 2x on a CPU with native bf16) and the
     step's share of the bf16 matmul peak.

    python bench/bench_train.py                  # all five, ~7 min on 2 cores
    python bench/bench_train.py --only precision # one of: peak, memory, prefix, muon, precision
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import train  # noqa: E402
from model import RecurrentConfig, RecurrentGPT  # noqa: E402
from muon import Muon  # noqa: E402
from plumbing.batches import open_data  # noqa: E402
from plumbing.device import compile_blocks, precision_context, train_precision  # noqa: E402


def smollm2_config(shape):
    P, R, C = shape
    return RecurrentConfig(vocab_size=49152, n_embd=576, n_head=9, n_kv_head=3, head_dim=64, intermediate_size=1536,
                           rope_theta=100000.0, n_prelude=P, n_core=R, n_coda=C, tie_embeddings=True)


def best_time(fn, repeat):
    fn()  # warm-up (allocations, oneDNN primitive caches)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def matmul_peak(n=2048, repeat=5, dtype=torch.float32):
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / best_time(lambda: a @ b, repeat)


def train_step_fn(model, B, T, num_steps):
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))

    def step():
        _, loss = model(idx, idx, num_steps=num_steps)
        loss.backward()
        model.zero_grad(set_to_none=True)
    return step


def matmul_flops_per_token(model, r, k, T):
    """What the step multiplies: the paper's 6 N1 + 2 N2 over the blocks, plus the tied head (6 V h: it is
    a real matmul with gradient), plus attention scores and values (causal: ~half of 4 T h per layer pass)."""
    c, (n, kk) = model.config, (max(r - k, 0), min(r, k))
    head = 6 * c.vocab_size * c.n_embd
    attn_layer = 2 * T * c.n_head * c.head_dim  # QK^T and AV, causal half of 2 * 2 T h
    grad_layers = c.n_prelude + kk * c.n_core + c.n_coda
    return model.flops_per_token(r, k) + head + 3 * attn_layer * grad_layers + attn_layer * n * c.n_core


def bench_peak(args):
    """Throughput as a share of the matmul peak. Peak and steps are measured alternately (other jobs on
    a shared machine slow both), and the best of each is kept: the peak the machine showed, the step
    time it allowed."""
    model = RecurrentGPT(smollm2_config(args.shape))
    if args.compile:  # the blocks only, as train.py --compile does
        compile_blocks(model)
    r, k = args.r, 8
    B, T = args.batch_size, args.seq
    step = train_step_fn(model, B, T, (max(r - k, 0), min(r, k)))
    step()  # warm-up (and compilation)
    fl = matmul_flops_per_token(model, r, k, T) * B * T
    paper = model.flops_per_token(r, k) * B * T
    peaks, times = [], []
    for _ in range(args.repeat):
        peaks.append(matmul_peak(repeat=3))
        times.append(_time(step))
    peak, t = max(peaks), min(times)
    # bf16's peak, for comparison only: a CPU with bf16 dot products (avx512_bf16, AMX) multiplies bf16 several
    # times faster than fp32, one without them slower; that decides Muon's race against torch's (bf16) below
    return {"matmul_peak_gflops": peak / 1e9, "bf16_matmul_peak_gflops": matmul_peak(dtype=torch.bfloat16) / 1e9,
            "step_s": t, "tokens_per_s": B * T / t,
            "achieved_gflops": fl / t / 1e9, "pct_of_peak": 100 * fl / t / peak,
            "pct_of_peak_paper_rule": 100 * paper / t / peak,
            "setup": f"shape {args.shape} r={r} k={k} batch {B}x{T}" + (" compiled" if args.compile else "")}


def memory_child(r, shape, B, T):
    """Run in a fresh process: the step's peak resident memory above the memory held before it."""
    model = RecurrentGPT(smollm2_config(shape))
    step = train_step_fn(model, B, T, (max(r - 8, 0), min(r, 8)))
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    saved = []
    pack = lambda t: (saved.append(t.numel() * t.element_size()), t)[1]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"step_peak_bytes": peak - before, "total_peak_bytes": peak, "saved_bytes": sum(saved)}))


def bench_memory(args):
    out = {}
    for r in (8, 32):
        p = subprocess.run([sys.executable, __file__, "--memory_child", str(r), "--shape", ",".join(map(str, args.shape)),
                            "--batch_size", str(args.batch_size), "--seq", str(args.seq)],
                           capture_output=True, text=True, check=True)
        out[r] = json.loads(p.stdout.strip().splitlines()[-1])
    return {"r8": out[8], "r32": out[32], "step_peak_ratio": out[32]["step_peak_bytes"] / out[8]["step_peak_bytes"],
            "total_peak_ratio": out[32]["total_peak_bytes"] / out[8]["total_peak_bytes"],
            "saved_ratio": out[32]["saved_bytes"] / out[8]["saved_bytes"]}


def bench_prefix(args):
    model = RecurrentGPT(smollm2_config(args.shape))
    steps = {r: train_step_fn(model, args.batch_size, args.seq, (max(r - 8, 0), min(r, 8))) for r in (8, 16, 32)}
    times = {r: [] for r in steps}
    steps[8]()  # warm-up
    for _ in range(args.repeat):  # interleaved, so load changes hit every r alike; best of each
        for r, fn in steps.items():
            times[r].append(_time(fn))
    res = {r: {"step_s": min(times[r]), "paper_flops_per_token": model.flops_per_token(r, 8)} for r in steps}
    for r in (16, 32):
        res[r]["measured_ratio_vs_r8"] = res[r]["step_s"] / res[8]["step_s"]
        res[r]["predicted_ratio_vs_r8"] = res[r]["paper_flops_per_token"] / res[8]["paper_flops_per_token"]
        res[r]["predicted_ratio_with_head"] = (matmul_flops_per_token(model, r, 8, args.seq)
                                               / matmul_flops_per_token(model, 8, 8, args.seq))
    return res


def bench_muon(args):
    model = RecurrentGPT(smollm2_config(args.muon_shape))
    mats = [p for n, p in model.named_parameters() if p.ndim == 2 and not n.startswith(("embed", "lm_head"))]
    g = torch.Generator().manual_seed(0)
    for p in mats:
        p.grad = torch.randn(p.shape, generator=g)
    # ours in fp32 (train.py --autocast off, and auto on a CPU without native bf16), in bf16, and torch's (bf16)
    opts = {"ours": Muon(mats, lr=1e-3, weight_decay=1e-4, ns_dtype=torch.float32),
            "ours_bf16": Muon(mats, lr=1e-3, weight_decay=1e-4, ns_dtype=torch.bfloat16),
            "torch": torch.optim.Muon(mats, lr=1e-3, weight_decay=1e-4)}
    times = {name: [] for name in opts}
    for opt in opts.values():  # warm-up, and the momentum buffers exist
        opt.step()
    for _ in range(args.repeat):  # interleaved, so all see the same machine load
        for name, opt in opts.items():
            times[name].append(_time(opt.step))
    best = {name: min(t) for name, t in times.items()}
    return {"matrices": len(mats), "ours_s": best["ours"], "ours_bf16_s": best["ours_bf16"], "torch_s": best["torch"],
            "ratio": best["ours"] / best["torch"], "ratio_bf16": best["ours_bf16"] / best["torch"],
            "setup": f"shape {args.muon_shape}, fp32 NS (ours), bf16 NS (ours_bf16, torch)"}


def retrofit_run(data, precision, seed=0):
    """What train.train_step and apply_update read of train.py's run, for the retrofit config's model (random
    weights: the products are the same as the real cut's) in one precision."""
    args = SimpleNamespace(**{**train.DEFAULTS, **{k: v for k, v in train.read_json(
        REPO / "config" / "cpu_retrofit_depth.json").items() if not k.startswith("_")}, "out_dir": "-"})
    torch.manual_seed(seed)
    model = RecurrentGPT(smollm2_config((2, 2, 2)))
    opts, _ = train.make_optimizers(model, args, precision)
    run = SimpleNamespace(model=model, ddp_model=model, opts=opts, trainable=list(model.parameters()),
                          train_data=data, device=torch.device("cpu"), world=1, rank=0, grad_accum=1, wrap=False,
                          ddp=False, bad_in_row=0, step=0,
                          autocast=precision_context("cpu", precision))
    return run, args


def bench_precision(args):
    """train.py's step of the retrofit config in fp32 and in --autocast auto's choice, over the same steps (the
    same r draws and rows), alternately so that a load change hits both; forward + backward and the update apart."""
    chosen, why = train_precision("cpu")
    with tempfile.TemporaryDirectory() as tmp:  # the depth task's rows (seq_len 10 at test depth 9), in 0.5 s
        subprocess.run([sys.executable, str(REPO / "data/depth/prepare.py"), "--out_dir", tmp, "--train_k", "6",
                        "--test_k", "9"], check=True, capture_output=True)
        data = open_data(tmp, "train", 256)
    runs = {"fp32": retrofit_run(data, "fp32"), chosen: retrofit_run(data, chosen)}
    times = {name: {"fwd_bwd": 0.0, "update": 0.0, "flops": 0.0} for name in runs}
    steps = range(20, 20 + args.steps)  # past the warmup: lr at its peak, the r draws of the stable phase
    for (run, a) in runs.values():  # warm-up (oneDNN's primitive caches, the optimizers' states)
        run.step = 0
        train.apply_update(run, train.train_step(run, a), False, a)
    for s in steps:
        for name, (run, a) in runs.items():
            run.step = s
            t0 = time.perf_counter()
            out = train.train_step(run, a)
            t1 = time.perf_counter()
            train.apply_update(run, out, False, a)
            t2 = time.perf_counter()
            t = times[name]
            t["fwd_bwd"], t["update"] = t["fwd_bwd"] + t1 - t0, t["update"] + t2 - t1
            t["flops"] += matmul_flops_per_token(run.model, out["r"], a.backprop_depth, out["T_step"]) * \
                a.batch_size * out["T_step"]
    step_s = {name: (t["fwd_bwd"] + t["update"]) / len(steps) for name, t in times.items()}
    bf16_peak = matmul_peak(dtype=torch.bfloat16)
    return {"precision": chosen, "why": why, "steps": len(steps),
            **{f"{name}_step_s": step_s[name] for name in runs},
            **{f"{name}_{part}_s": times[name][part] / len(steps) for name in runs for part in ("fwd_bwd", "update")},
            "ratio": step_s["fp32"] / step_s[chosen], "bf16_matmul_peak_gflops": bf16_peak / 1e9,
            "pct_of_bf16_peak": 100 * times[chosen]["flops"] / len(steps) / step_s[chosen] / bf16_peak,
            "setup": "config/cpu_retrofit_depth.json: SmolLM2 (2,2,2), 32 rows, mean r 4, k 4, per-loop supervision"}


def _time(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--only", default="", help="peak | memory | prefix | muon | precision (default: all)")
    p.add_argument("--shape", default="2,4,2", help="P,R,C of the SmolLM2-shaped model for peak/memory/prefix")
    p.add_argument("--muon_shape", default="6,8,6", help="P,R,C whose matrices the Muon bench steps")
    p.add_argument("--r", type=int, default=4, help="loops in the throughput step")
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=12, help="train steps per precision in the precision bench")
    p.add_argument("--compile", action="store_true", help="torch.compile the blocks in the throughput step")
    p.add_argument("--memory_child", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.shape = tuple(int(v) for v in args.shape.split(","))
    args.muon_shape = tuple(int(v) for v in args.muon_shape.split(","))
    if args.memory_child:
        return memory_child(args.memory_child, args.shape, args.batch_size, args.seq)
    print("config:", json.dumps(vars(args)), "| torch", torch.__version__, "| threads", torch.get_num_threads())
    benches = {"peak": bench_peak, "memory": bench_memory, "prefix": bench_prefix, "muon": bench_muon,
               "precision": bench_precision}
    if args.only and args.only not in benches:
        p.error(f"--only must be one of {sorted(benches)}")
    results = {}
    for name, fn in benches.items():
        if not args.only or args.only == name:
            results[name] = fn(args)
            print(f"{name}: {json.dumps(results[name])}", flush=True)

    print("\n| measurement | value | goal |\n|---|---|---|")
    if "peak" in results:
        r = results["peak"]
        print(f"| fp32 matmul peak | {r['matmul_peak_gflops']:.0f} GFLOP/s (bf16: {r['bf16_matmul_peak_gflops']:.0f}) | |")
        print(f"| train step ({r['setup']}) | {r['step_s']:.2f} s, {r['tokens_per_s']:.0f} tok/s, "
              f"{r['pct_of_peak']:.0f}% of peak ({r['pct_of_peak_paper_rule']:.0f}% by the paper's rule) | >= 60% |")
    if "memory" in results:
        r = results["memory"]
        print(f"| peak step memory r=32 / r=8 (k=8) | {r['step_peak_ratio']:.3f}x "
              f"({r['r32']['step_peak_bytes'] / 2**20:.0f} / {r['r8']['step_peak_bytes'] / 2**20:.0f} MiB; "
              f"saved activations {r['saved_ratio']:.3f}x) | <= 1.15x |")
    if "prefix" in results:
        r = results["prefix"]
        for rr in (16, 32):
            print(f"| step time r={rr} / r=8 (k=8) | measured {r[rr]['measured_ratio_vs_r8']:.2f}x, (6N1+2N2) predicts "
                  f"{r[rr]['predicted_ratio_vs_r8']:.2f}x ({r[rr]['predicted_ratio_with_head']:.2f}x with head+attention) | |")
    if "muon" in results:
        r = results["muon"]
        print(f"| Muon step, {r['matrices']} matrices | ours {r['ours_s']:.2f} s vs torch.optim.Muon {r['torch_s']:.2f} s "
              f"= {r['ratio']:.2f}x (ours in bf16: {r['ours_bf16_s']:.2f} s = {r['ratio_bf16']:.2f}x) | <= 0.6x |")
    if "precision" in results:
        r, c = results["precision"], results["precision"]["precision"]
        print(f"| train step, retrofit config, fp32 vs --autocast auto = {c} ({r['why']}) | {r['fp32_step_s']:.2f} s "
              f"vs {r[f'{c}_step_s']:.2f} s = {r['ratio']:.2f}x (forward+backward {r['fp32_fwd_bwd_s']:.2f} vs "
              f"{r[f'{c}_fwd_bwd_s']:.2f} s, update {r['fp32_update_s']:.2f} vs {r[f'{c}_update_s']:.2f} s); "
              f"{r['pct_of_bf16_peak']:.0f}% of the bf16 peak ({r['bf16_matmul_peak_gflops']:.0f} GFLOP/s) | >= 2x |")


if __name__ == "__main__":
    main()
