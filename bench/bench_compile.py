"""
Benchmark of --compile (plumbing/device.py compile_blocks: torch.compile of every block, inductor) against the
eager model, side by side in one run, for retrofitted recurrence (McLeish et al. 2025, arXiv 2511.07384):

  1. a training step as train.py takes it (forward at r = (n no-grad, k grad) loops, loss, backward) at each
     --train_r, eager vs compiled;
  2. decode tokens/s of sample.generate (greedy, KV cache; matvec_layout on the CPU, as sample.py) at each
     --decode_r, eager vs compiled, and whether their greedy tokens agree.
The two arms are two copies of one model, timed in turn within every repeat so that load from other jobs hits
both: medians of the train step's wall and process CPU time (the latter leaves out the time other jobs take the
core, not their memory traffic), and of generate's own decode clock (wall, the prefill left out). Compiling (the
first calls) is timed on its own and left out of the rates. The model is
SmolLM2-135M's shape (h 576, 9 heads / 3 KV, MLP 1536, vocab 49152, tied head) cut (2,2,2) with random weights,
or with --init smollm2 the offline SmolLM2-135M-Instruct cut (2,2,2) by surgery.load_model.

    python bench/bench_compile.py                    # CPU, 1 thread (compiling is much of its time)
    python bench/bench_compile.py --init smollm2     # the offline parent's weights
    python bench/bench_compile.py --smoke            # tiny shapes, the same code (fast once cached)
"""

import argparse
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import RecurrentConfig, RecurrentGPT  # noqa: E402
from plumbing.device import compile_blocks  # noqa: E402
from sample import generate, matvec_layout  # noqa: E402

SHAPES = {  # the blocks of SmolLM2-135M, and a tiny model of the same kind for --smoke
    "smollm2": dict(vocab_size=49152, n_embd=576, n_head=9, n_kv_head=3, head_dim=64, intermediate_size=1536,
                    rope_theta=100000.0),
    "tiny": dict(vocab_size=256, n_embd=64, n_head=4, n_kv_head=2, head_dim=16, intermediate_size=128),
}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device):
    """(wall s, process CPU s, result) of one call."""
    sync(device)
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    sync(device)
    return time.perf_counter() - w, time.process_time() - c, out


def build(args, device):
    """(eager, compiled): two copies of one model, in train mode."""
    if args.init == "random":
        torch.manual_seed(0)
        model = RecurrentGPT(RecurrentConfig(**SHAPES["tiny" if args.smoke else "smollm2"], n_prelude=2, n_core=2,
                                             n_coda=2, adapter_init="random", state_init="zero"))
    else:
        from surgery import load_model

        model, _ = load_model(args.init, shape=(2, 2, 2), state_init="zero", adapter_init="sum")
    model.to(device)
    return model, compile_blocks(copy.deepcopy(model))


def split(r, k):
    return (max(r - k, 0), min(r, k))  # train.py's (no-grad loops, grad loops) at backprop depth k


def bench_train(args, eager, compiled, device):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, eager.config.vocab_size, (args.batch_size, args.seq), generator=g).to(device)

    def step(model, r):
        def run():
            loss = model(x, x, num_steps=split(r, args.backprop_depth))[1]
            loss.backward()
            model.zero_grad(set_to_none=True)
            return loss.item()
        return run

    for r in args.train_r:
        first = {name: timed(step(m, r), device) for name, m in (("eager", eager), ("compiled", compiled))}
        times = {"eager": ([], []), "compiled": ([], [])}
        for _ in range(args.repeats):
            for name, m in (("eager", eager), ("compiled", compiled)):
                w, c, _ = timed(step(m, r), device)
                times[name][0].append(w)
                times[name][1].append(c)
        med = {k: (statistics.median(w), statistics.median(c)) for k, (w, c) in times.items()}
        print(f"   r={str(split(r, args.backprop_depth)):8s} first call: eager {first['eager'][0]:6.1f} s, compiled "
              f"{first['compiled'][0]:6.1f} s | step: eager {med['eager'][0]:.3f} s (CPU {med['eager'][1]:.3f}), "
              f"compiled {med['compiled'][0]:.3f} s (CPU {med['compiled'][1]:.3f}) | compiled speedup wall "
              f"{med['eager'][0] / med['compiled'][0]:.2f}x, CPU {med['eager'][1] / med['compiled'][1]:.2f}x",
              flush=True)


def bench_decode(args, eager, compiled, device):
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, eager.config.vocab_size, (args.prompt,), generator=g).tolist()

    def run(model, r):
        stats = {}
        out = generate(model, [prompt], max_new_tokens=args.n_new, num_steps=r, stats=stats)[0].tokens
        return stats["decode_tokens"] / stats["decode_s"], out  # generate's own clock: the prefill left out

    for r in args.decode_r:
        first = {name: timed(lambda: run(m, r), device)[0] for name, m in (("eager", eager), ("compiled", compiled))}
        rates, toks = {"eager": [], "compiled": []}, {}
        for _ in range(args.repeats):
            for name, m in (("eager", eager), ("compiled", compiled)):
                rate, toks[name] = run(m, r)
                rates[name].append(rate)
        med = {k: statistics.median(v) for k, v in rates.items()}
        agree = next((i for i, (a, b) in enumerate(zip(toks["eager"], toks["compiled"])) if a != b), len(toks["eager"]))
        print(f"   r={r:<3d} first call: eager {first['eager']:6.1f} s, compiled {first['compiled']:6.1f} s | decode: "
              f"eager {med['eager']:7.1f} tok/s, compiled {med['compiled']:7.1f} tok/s | compiled speedup "
              f"{med['compiled'] / med['eager']:.2f}x | greedy tokens equal {agree}/{len(toks['eager'])}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--init", default="random", help="random (SmolLM2-135M's shape) or a parent for surgery.load_model")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (fp32; not run on a GPU so far)")
    p.add_argument("--only", default="", choices=("", "train", "decode"), help="one section (default: both)")
    p.add_argument("--train_r", default="4,12", help="loops of the timed train steps")
    p.add_argument("--backprop_depth", type=int, default=8, help="k: loops beyond it run without gradient")
    p.add_argument("--batch_size", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--decode_r", default="1,4", help="loops per decoded token")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens (random ids)")
    p.add_argument("--n_new", type=int, default=32, help="new tokens per timed generation")
    p.add_argument("--repeats", type=int, default=3, help="timings per arm (medians)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (1: the cores are shared)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes: the same code in seconds")
    args = p.parse_args(argv)
    try:
        args.train_r = [int(v) for v in args.train_r.split(",")]
        args.decode_r = [int(v) for v in args.decode_r.split(",")]
    except ValueError:
        p.error(f"--train_r and --decode_r take comma-separated integers, got {args.train_r!r}, {args.decode_r!r}")
    if min(args.train_r + args.decode_r) < 1 or min(args.batch_size, args.seq, args.prompt, args.n_new,
                                                     args.repeats, args.threads, args.backprop_depth) < 1:
        p.error("every r, size, count and --threads must be >= 1")
    if args.smoke:
        args.seq, args.n_new, args.repeats = 16, 8, 2
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print("config: " + " ".join(f"{k}={v}" for k, v in vars(args).items()) + f" torch={torch.__version__}")
    eager, compiled = build(args, device)
    c = eager.config
    print(f"model: h {c.n_embd}, {c.n_head} heads / {c.n_kv_head} KV, MLP {c.intermediate_size}, vocab {c.vocab_size}, "
          f"cut ({c.n_prelude},{c.n_core},{c.n_coda}), fp32 on {device}")
    if args.only in ("", "train"):
        print(f"1. train step (forward + backward), batch {args.batch_size} x {args.seq}, medians of {args.repeats}")
        bench_train(args, eager, compiled, device)
    if args.only in ("", "decode"):
        if device.type == "cpu":  # what sample.py runs on the CPU, in both arms
            matvec_layout(eager)
            matvec_layout(compiled)
        print(f"2. decode, prompt {args.prompt} + {args.n_new} new tokens, greedy, batch 1, medians of {args.repeats}")
        bench_decode(args, eager, compiled, device)


if __name__ == "__main__":
    main()
