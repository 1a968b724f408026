"""
Section 5 of bench/bench_sample.py: the diffusion-forcing sampler (diffusion.py, arXiv 2510.14961) against
sequential decoding and --exit kl at r = 8, 16, 32, batch 1: tokens/s on the (4,6,4) cut, then quality where loops
matter (the depth task's chains, text continuations) and the speed-quality frontier as a PNG. Its flags are
bench_sample.py's:

    python bench/bench_sample.py --sections 5 --cot_ckpt out/depth_cot_loop --text_ckpt out/smollm2_464_healed
    python bench/bench_sample.py --smoke      # every section on tiny random models, seconds
"""

import os
import time

import numpy as np
import torch

from decode_timing import log, side_by_side
from sample import generate, matvec_layout


def decoders(args):
    """name -> generate() keywords: sequential decoding at r, --exit kl at r, and the diffusion sampler with its
    loop budget r alone (fixed) at each of args.headways, and with latent-diff at each of args.thresholds at the
    last headway. A pass freezes `headway` tokens on average (as many join the wave): h1, h2, ... in the names."""
    d = {"sequential": {}, "exit kl": dict(exit_criterion="kl")}
    diff = lambda h, **kw: dict(sampler="diffusion", loops_per_pass=args.loops_per_pass, headway=h, **kw)
    for h in args.headways:
        d[f"diffusion h{h}"] = diff(h)
    for t in args.thresholds:
        d[f"diffusion h{args.headways[-1]} ld {t:g}"] = diff(args.headways[-1], exit_criterion="latent-diff",
                                                               exit_threshold=t)
    return d


def batch_one(model, prompts, n_new, r, kw):
    """Each prompt alone (batch 1, as the sampler decodes): (completions, wall seconds, new tokens)."""
    t0, outs = time.perf_counter(), []
    for p in prompts:
        outs.append(generate(model, [p], max_new_tokens=n_new if isinstance(n_new, int) else n_new(p), num_steps=r,
                             **kw)[0].tokens)
    return outs, time.perf_counter() - t0, sum(len(o) for o in outs)


def speed_model(args):
    """The (4,6,4) cut of --parent (identity adapter), laid out for CPU decoding; --parent random: random weights in
    bench_gpu.py's --random_shape (no download), bf16 on CUDA."""
    from surgery import retrofit

    if args.parent != "random":
        return matvec_layout(retrofit(args.parent, shape=(4, 6, 4), state_init="zero")[0])
    from bench_gpu import make_config
    from model import RecurrentGPT

    torch.manual_seed(0)
    config = make_config(args.random_shape, (4, 6, 4))
    config.state_init = "zero"
    model = RecurrentGPT(config).eval()
    device = torch.device(args.device)
    model = model.to(device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    return matvec_layout(model) if device.type == "cpu" else model


def diffusion_speed(args, ids):
    model = speed_model(args)
    if args.parent == "random":
        ids = torch.randint(0, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    log(f"5a. speed, {args.parent} (4,6,4) cut on {model.embed_tokens.weight.device} "
        f"({model.embed_tokens.weight.dtype}), prompt {len(ids)} tokens, {args.n_new} new tokens, "
        f"greedy, batch 1; the decoders in turn in each of {args.repeats} repeats; wall clock")
    log("   threads  r    decoder                  tok/s   vs sequential (median, range)  loops/token  "
        "tokens = sequential")
    for threads in args.diffusion_threads:
        torch.set_num_threads(threads)
        for r in args.diffusion_r:
            stats = {name: {} for name in decoders(args)}
            runs = {name: (lambda n, kw=kw, st=stats[name]: generate(model, [ids], max_new_tokens=n, num_steps=r,
                                                                      stats=st, **kw)[0].tokens)
                    for name, kw in decoders(args).items()}
            res = side_by_side(runs, args.n_new, args.repeats, ref="sequential", clock=0)
            seq = res["sequential"][-1]
            for name, (wall, _, ratio, lo, hi, toks) in res.items():
                st = stats[name]
                per = st["loops_run"] / max(st["decode_tokens"], 1)
                agree = next((i for i, (a, b) in enumerate(zip(toks, seq)) if a != b), len(toks))
                log(f"   {threads:<8d} {r:<4d} {name:22s} {wall:7.1f}   {ratio:6.2f}x ({lo:.2f}-{hi:.2f}x)"
                    f"{'':14s} {per:8.1f}   first {agree}/{len(toks)}")
    torch.set_num_threads(args.threads)
    log("   (goal at r = 32: diffusion >= 3x sequential and ahead of exit kl; loops/token: core loops run summed "
        "over positions per decoded token)")


def diffusion_quality(args, results):
    """Depth-task chains (a) and text continuations (b) at each r: accuracy, tokens equal to sequential's, and the
    NLL of each decoder's text under the sequential model at that r. Fills results[(r, name)] for the plot."""
    from data.common import load_meta, open_split
    from plumbing.depth_cot import chain_rows
    from surgery import load_model

    if args.cot_ckpt:
        model, _ = load_model(args.cot_ckpt, state_init="zero")
        meta = load_meta(args.cot_data)
        rows, ends, chains = (a[:args.cot_rows] for a in chain_rows(meta, open_split(args.cot_data, "dev", meta)[0]))
        depths = range(1, meta["train_max_k"] + 1)  # depth d's prompt: the row up to its problem's end, then SEP
        prompts = [rows[i, :ends[i, d - 1] + 1].tolist() + [meta["sep_id"]] for d in depths for i in range(len(rows))]
        want = [int(chains[i, d - 1]) for d in depths for i in range(len(rows))]
        log(f"5b. depth-task chains ({args.cot_ckpt}, {len(rows)} dev rows x depths 1..{depths[-1]}): greedy chain of "
            "d tokens, correct when its last is p_d; batch 1")
        log("   r    decoder                  accuracy   vs sequential   tok/s")
        for r in args.diffusion_r:
            for name, kw in decoders(args).items():
                outs, sec, n = batch_one(model, prompts, lambda p: len(p) - 2, r, kw)
                acc = sum(len(o) == len(p) - 2 and o[-1] == w for o, p, w in zip(outs, prompts, want)) / len(want)
                if name == "sequential":  # decoders() lists it first
                    base = acc
                results.setdefault((r, name), {}).update(acc=acc, cot_tok_s=n / sec)
                log(f"   {r:<4d} {name:22s} {acc:8.3f}   {100 * (acc - base):+8.1f} pt   {n / sec:7.1f}")
    if args.text_ckpt:
        model, _ = load_model(args.text_ckpt, state_init="zero")
        matvec_layout(model)
        val = np.asarray(open_split(args.text_data, "val")[0])
        starts = np.linspace(0, len(val) - args.text_prompt - 1, args.text_prompts).astype(int)
        prompts = [val[s:s + args.text_prompt].astype(np.int64).tolist() for s in starts]
        log(f"5c. text ({args.text_ckpt}, {len(prompts)} held-out prompts of {args.text_prompt} tokens from "
            f"{args.text_data}'s val split, {args.text_new} new tokens, greedy, batch 1): NLL per token of each output "
            "under the sequential model at that r")
        log("   r    decoder                  tokens = seq   rows = seq   NLL      vs seq    tok/s")
        for r in args.diffusion_r:
            for name, kw in decoders(args).items():
                outs, sec, n = batch_one(model, prompts, args.text_new, r, kw)
                if name == "sequential":
                    seq, base = outs, None
                nll = sequence_nll(model, prompts, outs, r)
                base = nll if base is None else base
                same = sum(a == b for o, s in zip(outs, seq) for a, b in zip(o, s)) / sum(len(s) for s in seq)
                rows = sum(o == s for o, s in zip(outs, seq))
                results.setdefault((r, name), {}).update(nll=nll, nll_ratio=nll / base, text_tok_s=n / sec)
                log(f"   {r:<4d} {name:22s} {same:10.3f}   {rows:5d}/{len(seq):<4d} {nll:7.3f}   {nll / base:6.3f}x"
                    f"  {n / sec:7.1f}")
    log("   (goal: accuracy within 1 point of sequential's, NLL within 2%)")


def sequence_nll(model, prompts, outs, r):
    """Mean NLL per token of the outputs after their prompts under model at r loops (zero s_0)."""
    total, count = 0.0, 0
    with torch.inference_mode():
        for p, o in zip(prompts, outs):
            x = torch.tensor([p + o])
            logits, _ = model(x, num_steps=r)
            logp = torch.log_softmax(logits[0, len(p) - 1:-1].double(), -1)
            total -= logp.gather(1, x[0, len(p):, None]).sum().item()
            count += len(o)
    return total / max(count, 1)


def frontier_plot(args, results):
    """accuracy and NLL ratio against tok/s at the largest r, one point per decoder: the PNG of --plot."""
    from plumbing.plots import pyplot, save_figures

    r, plt = max(args.diffusion_r), pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    markers = "osD^vP*X"  # one marker and colour per decoder, named in the legend: decoders that tie overlap
    for ax, (y, x, label) in zip(axes, (("acc", "cot_tok_s", "depth-task chain accuracy"),
                                        ("nll_ratio", "text_tok_s", "NLL / sequential's NLL"))):
        for i, name in enumerate(decoders(args)):
            got = results.get((r, name), {})
            if y in got:
                ax.scatter(got[x], got[y], marker=markers[i % len(markers)], s=60, alpha=0.7, label=name)
        ax.set(xlabel="tokens/s (batch 1)", ylabel=label, title=f"r = {r}: decoders, headways, latent-diff thresholds")
        if ax.has_data():
            ax.legend(fontsize=7)
    os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
    path = save_figures([(fig, os.path.basename(args.plot))], os.path.dirname(os.path.abspath(args.plot)))[0]
    log(f"   frontier: {path}")


def section_diffusion(args, ids):
    diffusion_speed(args, ids)
    results = {}
    diffusion_quality(args, results)
    if results:
        frontier_plot(args, results)
    log()
