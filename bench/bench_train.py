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
     step's share of the bf16 matmul peak;
  6. layers: forward + backward per layer application, ours ((4,6,4) at r = 4: 32 applications) against
     transformers' LlamaForCausalLM (30 layers) of the same dimensions, batch 4 x 256, side by side, fp32, and
     bf16 autocast where the CPU multiplies bf16 natively (goal >= 0.95x);
  7. gemm: the step's roofline: every GEMM shape of a forward + backward (each Linear's product, input and
     weight gradients, the adapter, the head) timed alone, the step's time if each ran at its measured speed,
     and the step against it (goal >= 30% of the bf16 peak at the step's shapes, where bf16 is native);
  8. profile: where train.py's step of the retrofit config goes (torch.profiler, self CPU time by kind:
     matmul, the adapter, attention, norms, casts, elementwise) and its update (Muon's Newton-Schulz apart).
CPUs without native bf16 (no avx512_bf16, no AMX) emulate bf16 products at ~1 GFLOP/s: there the bf16 rows
are left out and the table says so.

    python bench/bench_train.py                  # all eight
    python bench/bench_train.py --only precision # or peak, memory, prefix, muon, layers, gemm, profile (commas)
    python bench/bench_train.py --smoke          # every bench on tiny shapes, seconds
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
from muon import Muon, ns_dtype, orthogonalize  # noqa: E402
from plumbing.batches import open_data  # noqa: E402
from plumbing.cli import read_json  # noqa: E402
from plumbing.device import compile_blocks, cpu_bf16, precision_context, train_precision  # noqa: E402


# SmolLM2-135M's dimensions; --smoke swaps in tiny ones of the same kind (GQA, tied head)
DIMS = dict(vocab_size=49152, n_embd=576, n_head=9, n_kv_head=3, head_dim=64, intermediate_size=1536,
            rope_theta=100000.0)
TINY = dict(vocab_size=256, n_embd=32, n_head=4, n_kv_head=2, head_dim=8, intermediate_size=64, rope_theta=100000.0)


def smollm2_config(shape):
    P, R, C = shape
    return RecurrentConfig(**DIMS, n_prelude=P, n_core=R, n_coda=C, tie_embeddings=True)


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
        peaks.append(matmul_peak(n=args.peak_n, repeat=3))
        times.append(_time(step))
    peak, t = max(peaks), min(times)
    # bf16's peak, for comparison only: a CPU with bf16 dot products (avx512_bf16, AMX) multiplies bf16 several
    # times faster than fp32, one without them slower; that decides Muon's race against torch's (bf16) below
    return {"matmul_peak_gflops": peak / 1e9, "bf16_matmul_peak_gflops": matmul_peak(n=args.peak_n if cpu_bf16() else 256, dtype=torch.bfloat16) / 1e9,
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
                            "--batch_size", str(args.batch_size), "--seq", str(args.seq)]
                           + (["--smoke"] if args.smoke else []),
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
    key = {name: k for k, name in train.FLAG_NAMES.items()}  # a config may name a flag by its command-line name
    args = SimpleNamespace(**{**train.DEFAULTS, **{key.get(k, k): v for k, v in read_json(
        REPO / "config" / "cpu_retrofit_depth.json").items() if not k.startswith("_")}, "out_dir": "-"})
    torch.manual_seed(seed)
    model = RecurrentGPT(smollm2_config((2, 2, 2)))
    opts, _ = train.make_optimizers(model, args, precision)
    run = SimpleNamespace(model=model, kl=None, ddp_model=model, opts=opts, trainable=list(model.parameters()),
                          train_data=data, device=torch.device("cpu"), world=1, rank=0, grad_accum=1,
                          ddp=False, bad_in_row=0, step=0,
                          autocast=precision_context("cpu", precision))
    return run, args


def step_of(run, args):
    """train.py's forward and backward of run.step: its r and loops (sample_loops), then train_step."""
    return train.train_step(run, args, *train.sample_loops(run.step, args, run.model.config.recurrent))


def bench_precision(args):
    """train.py's step of the retrofit config in fp32 and in --autocast auto's choice, over the same steps (the
    same r draws and rows), alternately so that a load change hits both; forward + backward and the update apart."""
    chosen, why = train_precision("cpu")
    data = depth_rows()
    runs = {"fp32": retrofit_run(data, "fp32"), chosen: retrofit_run(data, chosen)}
    times = {name: {"fwd_bwd": 0.0, "update": 0.0, "flops": 0.0} for name in runs}
    steps = range(20, 20 + args.steps)  # past the warmup: lr at its peak, the r draws of the stable phase
    for (run, a) in runs.values():  # warm-up (oneDNN's primitive caches, the optimizers' states)
        run.step = 0
        train.apply_update(run, step_of(run, a), False, a)
    for s in steps:
        for name, (run, a) in runs.items():
            run.step = s
            t0 = time.perf_counter()
            out = step_of(run, a)
            t1 = time.perf_counter()
            train.apply_update(run, out, False, a)
            t2 = time.perf_counter()
            t = times[name]
            t["fwd_bwd"], t["update"] = t["fwd_bwd"] + t1 - t0, t["update"] + t2 - t1
            t["flops"] += matmul_flops_per_token(run.model, out["r"], a.backprop_depth, out["T_step"]) * \
                a.batch_size * out["T_step"]
    step_s = {name: (t["fwd_bwd"] + t["update"]) / len(steps) for name, t in times.items()}
    bf16_peak = matmul_peak(n=args.peak_n if cpu_bf16() else 256, dtype=torch.bfloat16)
    return {"precision": chosen, "why": why, "steps": len(steps),
            **{f"{name}_step_s": step_s[name] for name in runs},
            **{f"{name}_{part}_s": times[name][part] / len(steps) for name in runs for part in ("fwd_bwd", "update")},
            "ratio": step_s["fp32"] / step_s[chosen], "bf16_matmul_peak_gflops": bf16_peak / 1e9,
            "pct_of_bf16_peak": 100 * times[chosen]["flops"] / len(steps) / step_s[chosen] / bf16_peak,
            "setup": "config/cpu_retrofit_depth.json: SmolLM2 (2,2,2), 32 rows, mean r 4, k 4, per-loop supervision"}


# -----------------------------------------------------------------------------
# the step against transformers' Llama, against the peak at its own GEMM shapes, and where its time goes


def hf_llama(n_layers):
    """transformers' LlamaForCausalLM of DIMS with n_layers layers, random weights, eager fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    d = DIMS
    cfg = LlamaConfig(vocab_size=d["vocab_size"], hidden_size=d["n_embd"], intermediate_size=d["intermediate_size"],
                      num_hidden_layers=n_layers, num_attention_heads=d["n_head"], num_key_value_heads=d["n_kv_head"],
                      head_dim=d["head_dim"], rope_theta=d["rope_theta"], tie_word_embeddings=True,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def bench_layers(args):
    """Forward + backward per layer application, ours against transformers' Llama, side by side: our (P,R,C) cut at
    --r loops (all with grad: P + r R + C layer applications) against a Llama of --hf_layers layers, the same
    batch, in fp32 and under bf16 autocast, the two in turn every repeat (best of each). ratio > 1: ours faster."""
    P, R, C = args.layer_shape
    ours = RecurrentGPT(smollm2_config(args.layer_shape))
    hf = hf_llama(args.hf_layers)
    idx = torch.randint(0, DIMS["vocab_size"], (args.batch_size, args.seq), generator=torch.Generator().manual_seed(0))

    def step_ours():
        ours(idx, idx, num_steps=(0, args.r))[1].backward()
        ours.zero_grad(set_to_none=True)

    def step_hf():
        hf(input_ids=idx, labels=idx).loss.backward()
        hf.zero_grad(set_to_none=True)

    layers = {"ours": P + args.r * R + C, "hf": args.hf_layers}
    out = {"setup": f"ours ({P},{R},{C}) at r={args.r} ({layers['ours']} layer applications) vs transformers Llama "
                    f"{args.hf_layers} layers, batch {args.batch_size}x{args.seq}"}
    for precision in ("fp32", "bf16") if cpu_bf16() else ("fp32",):  # emulated bf16 products crawl: nothing to compare
        ctx = precision_context("cpu", precision)
        times = {"ours": [], "hf": []}
        with ctx:
            step_ours(), step_hf()  # warm-up
            for _ in range(args.repeat):
                for name, fn in (("ours", step_ours), ("hf", step_hf)):
                    times[name].append(_time(fn))
        per = {k: min(t) / layers[k] for k, t in times.items()}
        out[precision] = {"ours_s": min(times["ours"]), "hf_s": min(times["hf"]), "ours_per_layer_s": per["ours"],
                          "hf_per_layer_s": per["hf"], "ratio": per["hf"] / per["ours"]}
    return out


def step_gemms(model, r, k, N):
    """The (M, K, N') GEMMs of one forward + backward over N tokens, with their counts: every Linear's product,
    its input gradient and its weight gradient, per layer application (r loops, the last k with grad), and the head."""
    c = model.config
    h, hd, I = c.n_embd, c.head_dim, c.intermediate_size
    layer = [(c.n_head * hd, h), (c.n_kv_head * hd, h), (c.n_kv_head * hd, h), (h, c.n_head * hd), (I, h), (I, h),
             (h, I)]  # (out, in) of q, k, v, o, gate, up, down
    n, kk = max(r - k, 0), min(r, k)
    grad_layers, fwd_only = c.n_prelude + kk * c.n_core + c.n_coda, n * c.n_core
    gemms = {}
    add = lambda shape, count: gemms.__setitem__(shape, gemms.get(shape, 0) + count)
    for out_f, in_f in layer:
        add((N, in_f, out_f), grad_layers + fwd_only)  # forward
        add((N, out_f, in_f), grad_layers)  # input gradient
        add((out_f, N, in_f), grad_layers)  # weight gradient
    for out_f, in_f in ((h, 2 * h), (c.vocab_size, h)):  # the adapter (every loop), the head
        times = kk + n if out_f == h else 1
        grads = kk if out_f == h else 1
        add((N, in_f, out_f), times), add((N, out_f, in_f), grads), add((out_f, N, in_f), grads)
    return gemms


def bench_gemm(args):
    """The step's roofline: each GEMM shape of the retrofit step (--r loops, k 8, batch x seq tokens) timed alone in
    fp32 and bf16; the step's time if every GEMM ran at its measured speed (the time a step cannot beat by its
    products) beside the best square-matrix peak, and the bf16 peak at the step's own shapes (flop-weighted)."""
    model = RecurrentGPT(smollm2_config(args.shape))
    gemms = step_gemms(model, args.r, 8, args.batch_size * args.seq)
    flops = {s: 2 * s[0] * s[1] * s[2] for s in gemms}
    out = {"shapes": len(gemms), "step_gemm_gflop": sum(flops[s] * n for s, n in gemms.items()) / 1e9}
    out["bf16_native"] = cpu_bf16()
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        if dtype == torch.bfloat16 and not cpu_bf16():  # emulated: ~1 GFLOP/s, a step's shapes would take minutes
            out[name] = {"square_peak_gflops": matmul_peak(n=256, repeat=1, dtype=dtype) / 1e9, "square_n": 256}
            continue
        rate = {}
        for (M, K, N2) in gemms:
            a, b = torch.randn(M, K, dtype=dtype), torch.randn(K, N2, dtype=dtype)
            rate[(M, K, N2)] = 2 * M * K * N2 / best_time(lambda: a @ b, args.repeat)
        t = sum(flops[s] * n / rate[s] for s, n in gemms.items())
        with precision_context("cpu", name):  # the step itself, in this precision, against its roofline
            step_s = best_time(train_step_fn(model, args.batch_size, args.seq, (max(args.r - 8, 0), min(args.r, 8))),
                               args.repeat)
        out[name] = {"roofline_step_gemm_s": t, "step_s": step_s, "pct_of_roofline": 100 * t / step_s, "gflops_at_step_shapes": out["step_gemm_gflop"] / t,
                     "square_peak_gflops": matmul_peak(n=args.peak_n, dtype=dtype) / 1e9,
                     "slowest_shape": str(min(rate, key=rate.get)), "slowest_gflops": min(rate.values()) / 1e9}
    return out


CATEGORIES = (  # op name fragments -> where a step's time goes; the first match wins
    ("attention", ("scaled_dot_product", "_flash_attention", "_efficient_attention", "softmax")),
    ("norms", ("rms_norm", "rsqrt", "pow", "mean")),
    ("casts", ("aten::to", "_to_copy", "copy_", "clone", "contiguous")),
    ("matmul", ("mm", "linear", "matmul", "addmm", "bmm")),
    ("elementwise", ("mul", "add", "silu", "sigmoid", "neg", "cat", "sub", "div", "roll", "where", "fill")),
)


def bench_profile(args):
    """Where a step's time goes, in the precision --autocast auto picks here and in fp32: train.py's step of the
    retrofit config under torch.profiler, self CPU time by kind of op; the adapter's products apart (their K is 2h),
    Muon's Newton-Schulz and the rest of the optimizer step timed apart (apply_update)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    chosen, _ = train_precision("cpu")
    data = depth_rows()
    out = {}
    for precision in dict.fromkeys(("fp32", chosen)):
        run, a = retrofit_run(data, precision)
        run.step = 20
        train.apply_update(run, step_of(run, a), False, a)  # warm-up
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            o = step_of(run, a)
        t0 = time.perf_counter()
        train.apply_update(run, o, False, a)
        update_s = time.perf_counter() - t0
        muon = next(opt for opt in run.opts if isinstance(opt, Muon))
        grads = [p.grad if p.grad is not None else torch.randn_like(p) for g in muon.param_groups for p in g["params"]]
        t0 = time.perf_counter()
        orthogonalize(grads, muon.param_groups[0])
        ns_s = time.perf_counter() - t0
        with FlopCounterMode(display=False) as counter:  # once more, untimed: torch counts its products
            orthogonalize(grads, muon.param_groups[0])
        kinds = {}
        for ev in prof.key_averages(group_by_input_shape=True):
            name = ev.key
            kind = next((k for k, parts in CATEGORIES if any(p in name for p in parts)), "other")
            if kind == "matmul" and any(len(s) == 2 and s[-1] == 2 * DIMS["n_embd"] for s in ev.input_shapes or []):
                kind = "adapter"
            kinds[kind] = kinds.get(kind, 0.0) + ev.self_cpu_time_total / 1e6
        total = sum(kinds.values())
        out[precision] = {"fwd_bwd_s": total, "update_s": update_s, "newton_schulz_s": ns_s,
                          "newton_schulz_gflop": counter.get_total_flops() / 1e9,
                          "newton_schulz_dtype": str(ns_dtype(muon.param_groups[0], grads[0].device)),
                          "optimizer_rest_s": max(update_s - ns_s, 0.0),
                          "share": {k: v / total for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}}
    return out


def depth_rows():
    """The depth task's train rows (seq_len 10 at test depth 9), made in a temporary dir."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, str(REPO / "data/depth/prepare.py"), "--out_dir", tmp, "--train_k", "6",
                        "--test_k", "9"], check=True, capture_output=True)
        return open_data(tmp, "train", 256)


def _time(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--only", default="", help="one of peak, memory, prefix, muon, precision, layers, gemm, profile, or "
                   "several with commas (default: all)")
    p.add_argument("--shape", default="2,4,2", help="P,R,C of the SmolLM2-shaped model for peak/memory/prefix/gemm")
    p.add_argument("--muon_shape", default="6,8,6", help="P,R,C whose matrices the Muon bench steps")
    p.add_argument("--layer_shape", default="4,6,4", help="P,R,C of ours in the per-layer comparison")
    p.add_argument("--hf_layers", type=int, default=30, help="layers of transformers' Llama in the comparison")
    p.add_argument("--r", type=int, default=4, help="loops in the throughput step and the per-layer comparison")
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--peak_n", type=int, default=2048, help="the square matmul of the peak")
    p.add_argument("--steps", type=int, default=12, help="train steps per precision in the precision bench")
    p.add_argument("--compile", action="store_true", help="torch.compile the blocks in the throughput step")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repeat: every bench's code in seconds")
    p.add_argument("--memory_child", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        DIMS.update(TINY)
        vars(args).update(shape="1,1,1", muon_shape="1,1,1", layer_shape="1,1,1", hf_layers=3, r=2, batch_size=2,
                          seq=16, repeat=1, peak_n=64, steps=2)
    args.shape, args.muon_shape, args.layer_shape = (tuple(int(v) for v in getattr(args, k).split(","))
                                                     for k in ("shape", "muon_shape", "layer_shape"))
    if args.memory_child:
        return memory_child(args.memory_child, args.shape, args.batch_size, args.seq)
    print("config:", json.dumps(vars(args)), "| torch", torch.__version__, "| threads", torch.get_num_threads())
    benches = {"peak": bench_peak, "memory": bench_memory, "prefix": bench_prefix, "muon": bench_muon,
               "precision": bench_precision, "layers": bench_layers, "gemm": bench_gemm, "profile": bench_profile}
    only = [x for x in args.only.split(",") if x]
    if any(x not in benches for x in only):
        p.error(f"--only takes {', '.join(benches)} (comma-separated), got {args.only!r}")
    results = {}
    for name, fn in benches.items():
        if not only or name in only:
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
    if "layers" in results:
        r = results["layers"]
        for prec in (p for p in ("fp32", "bf16") if p in r):
            x = r[prec]
            print(f"| forward + backward per layer application, {prec}: {r['setup']} | ours "
                  f"{1000 * x['ours_per_layer_s']:.1f} ms vs transformers {1000 * x['hf_per_layer_s']:.1f} ms = "
                  f"{x['ratio']:.2f}x | >= 0.95x |")
    if "gemm" in results:
        r = results["gemm"]
        for prec in ("fp32", "bf16"):
            x = r[prec]
            if "gflops_at_step_shapes" not in x:
                print(f"| the step's GEMM shapes, {prec} | not measured: no native {prec} products on this CPU (a "
                      f"{x['square_n']}-square matmul runs at {x['square_peak_gflops']:.1f} GFLOP/s) | |")
                continue
            print(f"| the step's {r['shapes']} GEMM shapes ({r['step_gemm_gflop']:.0f} GFLOP), {prec} | "
                  f"{x['gflops_at_step_shapes']:.0f} GFLOP/s at the step's shapes ({x['roofline_step_gemm_s']:.2f} s "
                  f"a step at best) vs {x['square_peak_gflops']:.0f} square; slowest {x['slowest_shape']} at "
                  f"{x['slowest_gflops']:.0f}; the step {x['step_s']:.2f} s = {x['pct_of_roofline']:.0f}% of its "
                  f"roofline | >= 30% (bf16) |")
    if "profile" in results:
        for prec, x in results["profile"].items():
            share = ", ".join(f"{k} {100 * v:.0f}%" for k, v in x["share"].items())
            print(f"| where a {prec} step goes (self CPU time) | forward+backward {x['fwd_bwd_s']:.2f} s: {share}; "
                  f"update {x['update_s']:.2f} s (Newton-Schulz {x['newton_schulz_s']:.2f} s in "
                  f"{x['newton_schulz_dtype'].replace('torch.', '')}: {x['newton_schulz_gflop']:.0f} GFLOP, "
                  f"{x['newton_schulz_gflop'] / x['newton_schulz_s']:.0f} GFLOP/s) | |")
    return results


if __name__ == "__main__":
    main()
