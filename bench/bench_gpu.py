"""
GPU benchmark of retrofitted recurrence (McLeish et al. 2025, arXiv 2511.07384) on random weights in the
shapes of Llama-3.2-1B cut (4,6,4) (h 2048, 32 heads / 8 KV, head_dim 64, MLP 8192, vocab 128256, rope
theta 500000 with llama3 scaling, tied head): nothing is downloaded. One command, a few minutes on one
H100/H200:

  1. train-step throughput in bf16 autocast with fp32 master weights (train.py's path: its optimizers, the
     head only at labeled positions) at sequence 1024, r = 4 and (24, 8) (24 no-grad + 8 grad loops), with
     and without torch.compile of the blocks (as train.py --compile): tokens/s, MFU against --peak_flops by
     the paper's FLOP rule (model.flops_per_token) and with head + attention counted, peak memory;
  2. decode tokens/s (greedy, prompt 64, 128 new tokens, both sides in --decode_dtype) of sample.generate
     with its KV cache at r = 1 and 32, against transformers' LlamaForCausalLM.generate on a random Llama of
     the uncut 16-layer shape, and our (4,8,4) cut at r = 1 (the same 16 layers), with peak memory.
The table goes to standard output; --out FILE gets the figures as JSON, rewritten after every measurement
so a run cut short keeps what it measured.

    python bench/bench_gpu.py --out bench_gpu.json             # the GPU run
    python bench/bench_gpu.py --smoke --out /tmp/smoke.json    # CPU, tiny shapes, the same code, seconds
"""

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import train  # noqa: E402
from bench_train import matmul_flops_per_token  # noqa: E402
from model import RecurrentConfig, RecurrentGPT  # noqa: E402
from plumbing.cli import git_commit  # noqa: E402
from plumbing.device import compile_blocks  # noqa: E402
from sample import generate  # noqa: E402

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
# Llama-3.2-1B's shape, and a tiny one of the same kind (GQA, llama3 rope) for --smoke
SHAPES = {
    "llama-3.2-1b": dict(vocab_size=128256, n_embd=2048, n_head=32, n_kv_head=8, head_dim=64, intermediate_size=8192,
                         rope_theta=500000.0, rope_scaling=LLAMA3_SCALING, block_size=131072, tie_embeddings=True),
    "tiny": dict(vocab_size=512, n_embd=64, n_head=4, n_kv_head=2, head_dim=16, intermediate_size=128,
                 rope_theta=500000.0, rope_scaling=LLAMA3_SCALING, block_size=131072, tie_embeddings=True),
}


def make_config(shape_name, cut):
    P, R, C = cut
    return RecurrentConfig(**SHAPES[shape_name], n_prelude=P, n_core=R, n_coda=C)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device):
    """torch.cuda.max_memory_allocated since reset_peak, in GiB; None on the CPU (no allocator statistics)."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def free():
    """Collect what a finished measurement left (compiled blocks hold reference cycles) before the next allocates."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -----------------------------------------------------------------------------
# 1. the train step


def train_arm(args, device, num_steps, compiled):
    """One (r, compile) setting: train.py's step (bf16 autocast forward with the head at labeled positions,
    backward, gradient clipping, Muon + AdamW from train.make_optimizers) on a fresh fp32 model, at the
    largest batch <= --batch_size that fits (halving on out-of-memory)."""
    n, k = num_steps
    B = args.batch_size
    while True:
        free()  # the last arm's model and optimizer states are gone before this one allocates
        try:
            return _train_arm(args, device, n, k, B, compiled)
        except torch.cuda.OutOfMemoryError:  # torch.OutOfMemoryError: defined on CPU builds too
            if B == 1:
                raise
        # out of the except block: its traceback no longer holds the failed arm's tensors
        print(f"  out of memory at batch {B}, trying {B // 2}", flush=True)
        B //= 2


def _train_arm(args, device, n, k, B, compiled):
    torch.manual_seed(0)
    with torch.device(device):  # random init on the device: 1.2B parameters initialized on the host take long
        model = RecurrentGPT(make_config(args.shape, args.cut))
    if compiled:  # the blocks only, as train.py --compile does (the loop over r has a data-dependent length)
        compile_blocks(model, backend=args.compile_backend)
    opts, _ = train.make_optimizers(model, argparse.Namespace(**{**train.DEFAULTS, "optimizer": "muon"}))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)  # plumbing/device.py's on CUDA; the same on CPU
    T, V = args.seq, model.config.vocab_size
    g = torch.Generator(device).manual_seed(0)
    x = torch.randint(0, V, (B, T), device=device, generator=g)
    y = torch.randint(0, V, (B, T), device=device, generator=g)
    seeds = torch.arange(B)
    trainable = [p for p in model.parameters() if p.requires_grad]

    def fwd_bwd():
        with autocast:
            loss = model(x, y, (n, k), seeds=seeds, labeled_only=True)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        return loss

    def opt_step():
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)

    reset_peak(device)
    t0 = time.perf_counter()
    for _ in range(args.warmup):  # allocations, cuBLAS heuristics, and with compile the compilation itself
        fwd_bwd()
        opt_step()
    sync(device)
    warmup_s = time.perf_counter() - t0
    t_fb, t_opt = [], []
    for _ in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        loss = fwd_bwd()
        sync(device)
        t1 = time.perf_counter()
        opt_step()
        sync(device)
        t_fb.append(t1 - t0)
        t_opt.append(time.perf_counter() - t1)
    fb, op = min(t_fb), min(t_opt)
    r = n + k
    tokens = B * T
    paper = model.flops_per_token(r, grad_loops=k) * tokens  # 6 N1 + 2 N2, as train.py logs for MFU
    full = matmul_flops_per_token(model, r, k, T) * tokens  # + the tied head and attention's own matmuls
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    res = {"r": f"({n},{k})" if n else str(k), "compiled": compiled, "batch": B, "seq": T, "tokens_per_step": tokens,
           "loss": loss.item(), "fwd_bwd_s": fb, "optimizer_s": op, "step_s": fb + op,
           "tokens_per_s": tokens / (fb + op), "tokens_per_s_fwd_bwd": tokens / fb,
           "mfu": paper / (fb + op) / args.peak_flops, "mfu_fwd_bwd": paper / fb / args.peak_flops,
           "mfu_with_head_attn": full / (fb + op) / args.peak_flops, "warmup_s": warmup_s,
           "peak_mem_gib": peak_gib(device), "param_dtypes": dtypes}
    return res


# -----------------------------------------------------------------------------
# 2. decoding


def decode_rate(run, n_new, repeats, device):
    """Decode tokens/s as (n_new - 1) / (t(n_new) - t(1)), so that prefill cancels (bench_sample.py's rule);
    the best of `repeats`."""
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        run(1)
        sync(device)
        t1 = time.perf_counter()
        run(n_new)
        sync(device)
        best = min(best, (time.perf_counter() - t1) - (t1 - t0))
    return (n_new - 1) / best


def hf_llama(config, n_layers, dtype, device):
    """transformers' LlamaForCausalLM with random weights in our config's shape, n_layers deep."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = config
    hf_config = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.intermediate_size,
                            num_hidden_layers=n_layers, num_attention_heads=c.n_head, num_key_value_heads=c.n_kv_head,
                            head_dim=c.head_dim, rope_theta=c.rope_theta, rope_scaling=c.rope_scaling,
                            rms_norm_eps=c.norm_eps, max_position_embeddings=c.block_size,
                            tie_word_embeddings=c.tie_embeddings, bos_token_id=None, eos_token_id=None,
                            pad_token_id=0)
    with torch.device(device):
        model = LlamaForCausalLM(hf_config)
    return model.to(dtype).eval()


def bench_decode(args, device):
    dtype = getattr(torch, args.decode_dtype)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, SHAPES[args.shape]["vocab_size"], (args.prompt_len,), generator=g).tolist()
    rows = []
    P, R, C = args.cut
    # ours: the (P,R,C) cut at each r, and the uncut parent (P, 16 - P - C, C) at r = 1: the same layers as HF's
    arms = [(args.cut, r) for r in args.decode_r] + [((P, args.parent_layers - P - C, C), 1)]
    for cut, r in arms:
        torch.manual_seed(0)
        with torch.device(device):
            model = RecurrentGPT(make_config(args.shape, cut))
        model = model.to(dtype).eval()  # the RoPE frequencies stay fp32 (RecurrentGPT._apply)
        run = lambda m, rr=r, model=model: generate(model, [prompt], max_new_tokens=m, num_steps=rr, temperature=0,
                                                    seed=0)[0].tokens
        assert len(run(3)) == 3  # warm-up; and no early stop
        reset_peak(device)
        rate = decode_rate(run, args.new_tokens, args.repeats, device)
        layers = cut[0] + r * cut[1] + cut[2]
        rows.append({"impl": "ours", "cut": ",".join(map(str, cut)), "r": r, "layers_per_token": layers,
                     "tokens_per_s": rate, "ms_per_token": 1000 / rate, "peak_mem_gib": peak_gib(device)})
        print(f"  decode ours {cut} r={r}: {rate:.1f} tok/s", flush=True)
        del model, run
        free()
    hf = hf_llama(make_config(args.shape, args.cut), args.parent_layers, dtype, device)
    x = torch.tensor([prompt], device=device)

    def run_hf(m, hf=hf):
        with torch.inference_mode():
            return hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=m, min_new_tokens=m,
                               do_sample=False, pad_token_id=0)

    assert run_hf(3).shape[1] == len(prompt) + 3  # warm-up; and no early stop: every figure times m new tokens
    reset_peak(device)
    rate = decode_rate(run_hf, args.new_tokens, args.repeats, device)
    rows.append({"impl": "transformers", "cut": f"uncut {args.parent_layers}", "r": None,
                 "layers_per_token": args.parent_layers, "tokens_per_s": rate, "ms_per_token": 1000 / rate,
                 "peak_mem_gib": peak_gib(device)})
    print(f"  decode transformers {args.parent_layers} layers: {rate:.1f} tok/s", flush=True)
    del hf, run_hf
    free()
    hf_rate = rows[-1]["tokens_per_s"]
    for row in rows:  # tok/s ratio, and per layer pass (layer-passes/s): the recurrence runs more layers per token
        row["vs_transformers"] = row["tokens_per_s"] / hf_rate
        row["layer_passes_vs_transformers"] = row["tokens_per_s"] * row["layers_per_token"] / (hf_rate * args.parent_layers)
    return rows


# -----------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, few steps: checks the script in seconds")
    p.add_argument("--only", default="train,decode", help="train, decode, or both (comma-separated)")
    p.add_argument("--device", default="auto", help="auto (cuda when available) | cpu | cuda | cuda:N")
    p.add_argument("--cut", default="4,6,4", help="P,R,C of the recurrent model")
    p.add_argument("--parent_layers", type=int, default=16, help="layers of the uncut parent (Llama-3.2-1B: 16)")
    p.add_argument("--seq", type=int, default=1024, help="train: tokens per row")
    p.add_argument("--batch_size", type=int, default=8, help="train: rows per step (halved on out-of-memory)")
    p.add_argument("--train_r", default="0:4,24:8", help="train: n:k pairs (n no-grad + k grad loops)")
    p.add_argument("--compile", default="off,on", help="train: off, on, or both")
    p.add_argument("--compile_backend", default="inductor", help="torch.compile backend of the blocks")
    p.add_argument("--warmup", type=int, default=2, help="train: untimed steps (the compilation among them)")
    p.add_argument("--steps", type=int, default=3, help="train: timed steps (the best is kept)")
    p.add_argument("--peak_flops", type=float, default=989e12, help="FLOP/s for MFU (H100/H200 dense bf16: 989e12)")
    p.add_argument("--decode_r", default="1,32", help="decode: r values of the (P,R,C) cut")
    p.add_argument("--decode_dtype", default="bfloat16", choices=("bfloat16", "float32"), help="decode: weights, both sides")
    p.add_argument("--prompt_len", type=int, default=64)
    p.add_argument("--new_tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2, help="decode: timings per figure (the best is kept)")
    p.add_argument("--out", default="", help="write the figures here as JSON")
    p.add_argument("--shape", default="llama-3.2-1b", choices=list(SHAPES), help="the model's shape (random weights)")
    if p.parse_known_args(argv)[0].smoke:  # the same functions on tiny shapes, as defaults the flags still override;
        # compile with the eager backend (dynamo's capture, no code generation)
        p.set_defaults(shape="tiny", device="cpu", seq=64, batch_size=2, train_r="0:4,3:2", compile_backend="eager",
                       warmup=1, steps=1, parent_layers=6, cut="1,2,1", decode_r="1,4", prompt_len=8, new_tokens=8,
                       repeats=1)
    args = p.parse_args(argv)
    args.cut = tuple(int(v) for v in args.cut.split(","))
    args.train_r = [tuple(int(v) for v in pair.split(":")) for pair in args.train_r.split(",")]
    args.decode_r = [int(v) for v in args.decode_r.split(",")]
    args.only = set(args.only.split(","))
    args.compile = [{"off": False, "on": True}[v] for v in args.compile.split(",")]
    if len(args.cut) != 3 or args.only - {"train", "decode"}:
        p.error("--cut needs P,R,C and --only takes train and/or decode")
    return args


def print_table(results):
    dev = results["device"]
    print(f"\n{dev}, peak {results['config']['peak_flops']:.3g} FLOP/s, shape {results['config']['shape']} "
          f"cut {results['config']['cut']}, torch {results['torch']}")
    if results["train"]:
        print("\n| train r | compile | batch x seq | tokens/s | MFU (paper rule) | MFU fwd+bwd | MFU with head+attn "
              "| optimizer s | peak GiB |\n|---|---|---|---|---|---|---|---|---|")
        for t in results["train"]:
            mem = "n/a" if t["peak_mem_gib"] is None else f"{t['peak_mem_gib']:.1f}"
            print(f"| {t['r']} | {'on' if t['compiled'] else 'off'} | {t['batch']} x {t['seq']} | {t['tokens_per_s']:.0f} "
                  f"| {100 * t['mfu']:.1f}% | {100 * t['mfu_fwd_bwd']:.1f}% | {100 * t['mfu_with_head_attn']:.1f}% "
                  f"| {t['optimizer_s']:.3f} | {mem} |")
    if results["decode"]:
        print(f"\n| decode ({results['config']['decode_dtype']}, greedy) | r | layers/token | tok/s | ms/token "
              "| vs transformers | layer passes vs transformers | peak GiB |\n|---|---|---|---|---|---|---|---|")
        for d in results["decode"]:
            mem = "n/a" if d["peak_mem_gib"] is None else f"{d['peak_mem_gib']:.2f}"
            print(f"| {d['impl']} {d['cut']} | {d['r'] or '-'} | {d['layers_per_token']} | {d['tokens_per_s']:.1f} "
                  f"| {d['ms_per_token']:.2f} | {d['vs_transformers']:.2f}x | {d['layer_passes_vs_transformers']:.2f}x "
                  f"| {mem} |")


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the fp32 matmuls left outside autocast (Muon runs bf16)
        name = torch.cuda.get_device_name(device)
    else:
        name = "cpu"
    config = {k: (list(v) if isinstance(v, (tuple, set)) else v) for k, v in vars(args).items()}
    print("config:", json.dumps(config), "| torch", torch.__version__, "| device", name, flush=True)
    results = {"device": name, "torch": torch.__version__, "git": git_commit(short=True), "config": config,
               "train": [], "decode": []}

    def save():
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.out + ".tmp", "w") as f:
                json.dump(results, f, indent=2)
            os.replace(args.out + ".tmp", args.out)

    t_start = time.perf_counter()
    if "train" in args.only:
        for compiled in args.compile:  # eager first; the compiled arms share dynamo's cache of Block.forward
            for n, k in args.train_r:
                res = train_arm(args, device, (n, k), compiled)
                results["train"].append(res)
                print(f"  train r={res['r']} compile={'on' if compiled else 'off'}: {res['tokens_per_s']:.0f} tok/s, "
                      f"MFU {100 * res['mfu']:.1f}%, warm-up {res['warmup_s']:.1f} s", flush=True)
                save()
    if "decode" in args.only:
        results["decode"] = bench_decode(args, device)
        save()
    results["wall_s"] = time.perf_counter() - t_start
    save()
    print_table(results)
    print(f"\n{results['wall_s']:.1f} s" + (f"; figures in {args.out}" if args.out else ""))
    return results


if __name__ == "__main__":
    main()
