"""
Benchmarks of sample.py's inference features (Geiping et al. 2025, arXiv 2502.05171, §6) on the
offline SmolLM2-135M-Instruct and, when given, a depth-task model trained by train.py:

1. decode tokens/s with our KV cache vs transformers' generate on the same weights at r=1
   (load_model keeps all 30 layers with the identity adapter, so r=1 is the parent itself): under each decode
   kernel of plumbing/decode.py (numpy's BLAS, torch's, the parameters as loaded; the one this machine measured
   fastest is what sample.py runs), timed in turn (wall and CPU time) so that load from other jobs hits all,
   beside the same weights' matrix-vector products alone (the ceiling of any decoder on these kernels);
2. per-token decode cost as r grows on a (4,6,4) retrofit: P + r R + C layers, so it should be linear;
3. adaptive exit vs fixed r on the S3 depth task: accuracy and mean loops per token (--depth_ckpt; with a
   learned exit gate, exit_gate.py, at --gate_threshold too);
4. KV memory and speed with a KV budget (slot i mod N) vs the full cache, and how many greedy
   tokens still agree with the full cache;
5. the diffusion-forcing sampler (diffusion.py, arXiv 2510.14961) against sequential decoding and --exit kl at
   r = 8, 16, 32, batch 1 (bench_diffusion.py): tokens/s at 1 and 2 threads on the (4,6,4) cut, then quality where
   loops matter, the depth task's chains (--cot_ckpt: accuracy) and text continuations (--text_ckpt: tokens equal
   to sequential's, NLL of each output under the sequential model), and the speed-quality frontier as a PNG (--plot).
Figures go to standard error, one table per section.

    python bench/bench_sample.py --sections 1,2,4                  # 1 CPU thread
    python bench/bench_sample.py --smoke                           # every section on tiny random models, seconds
    python data/depth/prepare.py --out_dir data/depth && python train.py --config config/cpu_depth.json
    python bench/bench_sample.py --depth_ckpt out/depth --sections 3
    python bench/bench_sample.py --sections 5 --cot_ckpt out/depth_cot_loop --text_ckpt out/smollm2_464_healed
Section 5's two checkpoints: a from-scratch (1,2,1) loop that writes the depth task's chains, and SmolLM2 cut to
(4,6,4) and healed on text for 30 steps (the healing recipe of RESULTS.md, shortened):
    python data/depth/prepare.py --cot --out_dir data/depth_cot
    python train.py --config config/cpu_depth.json --data data/depth_cot --out_dir out/depth_cot_loop
    python data/sotu/prepare.py && python train.py --config config/cpu_smollm2.json --shape 4,6,4 --max_iters 30 \
        --out_dir out/smollm2_464_healed
Section 3 decodes teacher-forced, one position per step, so that the exit is per token; in a batch,
rows that exited wait for the others, so "loops per token" counts the loops each token needed.
"""

import argparse
import copy
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_gpu's shapes for --parent random
from plumbing.decode import KERNELS, decode_kernel  # noqa: E402
from kv_cache import KVCache  # noqa: E402
from sample import EXIT_THRESHOLDS, ZERO_SHOT, CachedForward, ExitRule, generate, matvec_layout  # noqa: E402
from bench_diffusion import section_diffusion  # noqa: E402
from decode_timing import decode_rate, log, side_by_side  # noqa: E402

# 64 tokens in SmolLM2's chat template (the decode comparison's prompt length)
PROMPT = ("Write a short story about a robot who learns to paint. It lives in a small town by the sea, works nights "
          "at the harbour and has never seen a museum.")


def matvecs_only(model):
    """A run(n) that does only the matrix-vector products of n decode steps at r = 1 (every weight matrix the
    decoder multiplies, once, as the decoder multiplies it: the packed q/k/v and gate/up of matvec_layout, every
    other Linear, the 49k head included, each through its Matvec) and returns no tokens: where reading the weights
    is the cost, the rate no decoder can beat with these kernels."""
    prods, inside = [], set()  # (product, its weight); inside: the Linears multiplied as part of a packed matrix
    for m in model.modules():
        for name, parts in (("qkv", ("q_proj", "k_proj", "v_proj")), ("gate_up", ("gate_proj", "up_proj"))):
            if getattr(m, name, None) is not None:
                prods.append((getattr(m, name), getattr(m, name).weight))
                inside.update(id(getattr(m, p)) for p in parts)
    prods += [(m, m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear) and id(m) not in inside]
    xs = [torch.randn(1, 1, w.shape[1]) for _, w in prods]

    def run(n):
        with torch.inference_mode():
            for _ in range(n):
                for (prod, _), x in zip(prods, xs):
                    prod(x)
        return []
    return run


def section_hf(args, ids):
    from transformers import AutoModelForCausalLM

    from plumbing.hub import resolve_checkpoint
    from surgery import load_model

    src = resolve_checkpoint(args.parent)
    if args.parent == "smollm2" and not src.endswith(".gguf"):
        log(f"1. skipped: smollm2 resolved to {src}, not the offline GGUF this section compares against")
        return
    plain, _ = load_model(src, state_init="zero")
    choice = decode_kernel(plain)  # what sample.py runs on this CPU: measured once, then cached
    # copies, not new loads (each load de-quantizes the GGUF again): the layout rewrites the weights in place
    layouts = {k: plain if k == "plain" else matvec_layout(copy.deepcopy(plain), k) for k in KERNELS}
    where = dict(gguf_file=os.path.basename(src)) if src.endswith(".gguf") else {}
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(src) if where else src, dtype=torch.float32,
                                              **where).eval()
    x = torch.tensor([ids])

    def ours(model):
        return lambda n: generate(model, [ids], max_new_tokens=n, num_steps=1)[0].tokens

    def run_hf(n):
        with torch.inference_mode():
            y = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                            do_sample=False, pad_token_id=0)
        return y[0, len(ids):].tolist()

    name = lambda k: f"ours, kernel {k}" + (" (sample.py's)" if k == choice["kernel"] else "")
    runs = {**{name(k): ours(m) for k, m in layouts.items()}, "transformers generate": run_hf,
            "matrix-vector products alone": matvecs_only(layouts["numpy"])}
    for run in runs.values():
        run(2)  # warm up
    clock = 1 if torch.get_num_threads() == 1 else 0  # CPU time on one thread; on more, it counts spinning workers
    res = side_by_side(runs, args.n_new, args.repeats, ref="transformers generate", clock=clock)
    hf_toks = res["transformers generate"][-1]
    log(f"1. decode at r=1, {args.parent} ({plain.config.n_core + 2} layers), prompt {len(ids)} tokens, {args.n_new} new tokens, greedy, "
        f"{torch.get_num_threads()} thread(s); {args.repeats} repeats, the decoders in turn in each")
    log(f"   decode kernel chosen by measurement ({'cached' if choice['cached'] else 'measured now'}): "
        f"{choice['kernel']}; ms for a token's products at 1 and 4 rows: "
        + ", ".join(f"{k} {v:.2f}" for k, v in choice["ms"].items()))
    log(f"   decoder                                wall tok/s   CPU tok/s   vs hf ({('wall', 'CPU')[clock]}, per "
        "repeat: median, range)  tokens = hf")
    for name, (wall, cpu, ratio, lo, hi, toks) in res.items():
        agree = next((i for i, (a, b) in enumerate(zip(toks, hf_toks)) if a != b), len(toks))
        same = f"{agree}/{len(toks)}" if toks else "-"
        log(f"   {name:38s} {wall:10.1f}   {cpu:9.1f}   {ratio:10.2f}x ({lo:.2f}-{hi:.2f}x){'':16s} {same}")
    log("   (goal >= 1.5x; CPU time leaves out the core time other jobs take, wall time does not; the last row is\n"
        "   the ceiling of any decoder on these kernels: one token's weight matrices times a vector, nothing else)")
    log()


def section_r(args, ids):
    from surgery import retrofit

    model = matvec_layout(retrofit(args.parent, shape=(4, 6, 4), state_init="zero")[0])
    P, R, C = 4, 6, 4
    log(f"2. decode cost vs r, {args.parent} retrofit (4,6,4), {args.n_new} new tokens")
    log("   r    ms/token   layers/token   ms/layer")
    rows = []
    for r in args.r:
        def run(n):
            return generate(model, [ids], max_new_tokens=n, num_steps=r)[0].tokens
        run(2)
        rate, _ = decode_rate(run, args.n_new, args.repeats)
        layers = P + r * R + C
        rows.append((r, 1000 / rate, layers))
        log(f"   {r:<4d} {1000 / rate:9.1f}   {layers:12d}   {1000 / rate / layers:8.2f}")
    r_, ms = np.array([x[0] for x in rows], float), np.array([x[1] for x in rows])
    slope, icpt = np.polyfit(r_, ms, 1)
    pred = slope * r_ + icpt
    r2 = 1 - ((ms - pred) ** 2).sum() / ((ms - ms.mean()) ** 2).sum()
    log(f"   linear fit: ms/token = {icpt:.1f} + {slope:.1f} r   (R^2 = {r2:.4f}; goal: linear)")
    with torch.inference_mode():  # the head's share of the fixed cost, timed alone
        x = torch.zeros(1, 1, model.config.n_embd)
        model.lm_head(x)
        t0 = time.perf_counter()
        for _ in range(10):
            model.lm_head(x)
        head = (time.perf_counter() - t0) / 10 * 1000
    fixed = (icpt - head) / (P + C)
    log(f"   per layer: {slope / R:.2f} ms in a loop (adapter included) vs {fixed:.2f} ms in prelude/coda "
        f"(fixed cost less the head's {head:.1f} ms): ratio {slope / R / fixed:.2f} (goal within 10%)")
    log()


def depth_eval(model, ids, targets, r, rule, batch_size, seed, budget=None):
    """Teacher-forced, one position per decode step (adaptive exit is per token): accuracy and
    loops at the labeled positions, and the KV cache bytes per row."""
    correct, loops = [], []
    gen = torch.Generator().manual_seed(seed)
    for b in range(0, len(ids), batch_size):
        x = torch.from_numpy(ids[b:b + batch_size].astype(np.int64))
        B, T = x.shape
        kv = KVCache(model.config, B, T, min(budget or r, r))
        fwd = CachedForward(model, [0] * B, T, r, kv, rule, generator=gen)
        preds, ns = [], []
        with torch.inference_mode():
            for t in range(T):
                lg, n = fwd.run(x[:, t:t + 1], adaptive=rule is not None and t > 0)
                preds.append(lg[:, -1].argmax(-1))
                ns.append(n)
        pred, n = torch.stack(preds, 1).numpy(), torch.stack(ns, 1).numpy()
        lab = targets[b:b + batch_size] != -1
        correct.append(pred[lab] == targets[b:b + batch_size][lab])
        loops.append(n[lab])
    return np.concatenate(correct).mean(), np.concatenate(loops).mean(), kv.nbytes / B


def section_depth(args):
    from data.common import load_meta, open_split
    from surgery import load_model

    if not args.depth_ckpt:
        log("3. adaptive exit on the depth task: skipped (pass --depth_ckpt DIR, a model trained by train.py "
            "on data/depth, and --depth_data DIR)")
        log()
        return
    model, _ = load_model(args.depth_ckpt)
    meta = load_meta(args.depth_data)
    ids, targets, _ = open_split(args.depth_data, "val", meta)
    shape = (-1, meta["seq_len"])
    ids, targets = np.asarray(ids).reshape(shape)[:args.depth_rows], np.asarray(targets).reshape(shape)[:args.depth_rows]
    r_max = args.depth_r
    log(f"3. depth task ({args.depth_ckpt}, {len(ids)} val rows, k up to {meta.get('test_max_k')}): "
        f"teacher-forced, one token per decode step, r_max = {r_max}")
    log("   mode                      accuracy   mean loops/token   KV KiB/row")
    for r in sorted({x for x in (1, 2, 4, 8, 16) if x < r_max} | {r_max}):
        acc, n, kv = depth_eval(model, ids, targets, r, None, args.batch_size, args.seed)
        log(f"   fixed r={r:<17d} {acc:8.3f}   {n:8.2f}   {kv / 1024:18.1f}")
        if r == r_max:
            base_acc, base_n = acc, n
    gate = getattr(model, "exit_gate", None)  # a learned gate (exit_gate.py) when the checkpoint has one
    for crit in ZERO_SHOT + (["gate"] if gate is not None else []):
        thr = args.gate_threshold if crit == "gate" else EXIT_THRESHOLDS[crit]
        rule = ExitRule(crit, thr, args.exit_min_loops, gate)
        acc, n, kv = depth_eval(model, ids, targets, r_max, rule, args.batch_size, args.seed)
        log(f"   exit {crit:<12s} {thr:<8g} {acc:8.3f}   {n:8.2f}   {kv / 1024:18.1f}   ({base_n / n:.1f}x fewer "
            f"loops, {100 * (acc - base_acc):+.1f} points vs fixed r={r_max}; goal >= 2x within 1 point)")
    for budget in (b for b in (8, 4, 2, 1) if b < r_max):  # Huginn's KV sharing on a trained model
        acc, n, kv = depth_eval(model, ids, targets, r_max, None, args.batch_size, args.seed, budget)
        log(f"   r={r_max} kv_budget={budget:<11d} {acc:8.3f}   {n:8.2f}   {kv / 1024:18.1f}")
    acc, n, kv = depth_eval(model, ids, targets, r_max, ExitRule("kl", None, args.exit_min_loops), args.batch_size,
                            args.seed, 4)
    log(f"   exit kl + kv_budget=4      {acc:8.3f}   {n:8.2f}   {kv / 1024:18.1f}")
    log()


def section_budget(args, ids):
    from surgery import retrofit

    from surgery import load_model

    if args.budget_init:
        model, _ = load_model(args.budget_init, state_init="zero")
        name = args.budget_init
    else:  # with the identity adapter every iteration computes the same thing and a budget changes
        # nothing; (1/sqrt 2)[I | I] makes the state matter (untrained: the text itself is poor)
        model, _ = retrofit(args.parent, shape=(4, 6, 4), state_init="zero", adapter_init="sum")
        name = f"{args.parent} retrofit (4,6,4), adapter (1/sqrt2)[I|I], untrained"
    r = args.budget_r
    log(f"4. KV budget at r={r}, {name}, prompt {len(ids)} + {args.n_new} new tokens, greedy")
    log("   budget   KV cache MiB   core KV MiB   tok/s   greedy tokens equal to the full cache")
    full = None
    for budget in [None] + [b for b in (8, 4, 2, 1) if b < r]:
        stats = {}

        def run(n):
            return generate(model, [ids], max_new_tokens=n, num_steps=r, kv_budget=budget, stats=stats)[0].tokens

        rate, toks = decode_rate(run, args.n_new, args.repeats)
        full = toks if budget is None else full
        agree = next((i for i, (a, b) in enumerate(zip(toks, full)) if a != b), len(toks))
        c, slots = model.config, min(budget or r, r)
        core = 2 * c.n_core * slots * c.n_kv_head * (len(ids) + args.n_new) * c.head_dim * 4
        log(f"   {str(budget or r):<8s} {stats['kv_bytes'] / 2**20:12.2f}   {core / 2**20:11.2f}   {rate:5.1f}"
            f"   first {agree}/{len(toks)}")
    log()

def smoke_setup(args, tmp):
    """--smoke: every section on tiny stand-ins in `tmp`, the same code in seconds: a random Llama in the hub's
    layout as the parent, a depth-task dir with a random model for sections 3 and 5 (chains and text)."""
    import subprocess

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=16,
                                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                 max_position_embeddings=128)).save_pretrained(f"{tmp}/parent")
    for name, extra in (("depth", []), ("cot", ["--cot"])):
        subprocess.run([sys.executable, "data/depth/prepare.py", "--out_dir", f"{tmp}/{name}", "--train_depth", "3",
                        "--test_depth", "4", "--num_train", "256", "--num_dev", "16", "--num_test", "16", *extra],
                       check=True, capture_output=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from data.common import load_meta
    from model import RecurrentConfig, RecurrentGPT

    for name in ("depth", "cot"):
        v = load_meta(f"{tmp}/{name}")["vocab_size"]
        RecurrentGPT(RecurrentConfig(vocab_size=v, n_embd=32, n_head=4, n_kv_head=4, head_dim=8, intermediate_size=64,
                                     adapter_init="random")).save_pretrained(f"{tmp}/{name}_ckpt")
    vars(args).update(parent=f"{tmp}/parent", n_new=4, repeats=1, r=[1, 2], budget_r=4, depth_ckpt=f"{tmp}/depth_ckpt",
                      depth_data=f"{tmp}/depth", depth_rows=8, depth_r=4, batch_size=8, diffusion_r=[4],
                      diffusion_threads=[1], loops_per_pass=2, thresholds=[0.03], headways=[1, 2], cot_ckpt=f"{tmp}/cot_ckpt",
                      cot_data=f"{tmp}/cot", cot_rows=4, text_ckpt=f"{tmp}/depth_ckpt", text_data=f"{tmp}/depth",
                      text_prompts=3, text_prompt=6, text_new=4, plot=f"{tmp}/frontier.png")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--sections", default="1,2,3,4,5", help="which sections to run, e.g. 1,3")
    p.add_argument("--n_new", type=int, default=32, help="new tokens per timed generation")
    p.add_argument("--repeats", type=int, default=2, help="timings per figure (the best is kept)")
    p.add_argument("--r", default="1,2,4,8,16", help="section 2: the r values")
    p.add_argument("--budget_r", type=int, default=16, help="section 4: r")
    p.add_argument("--budget_init", default=None, help="section 4: a trained checkpoint (default: an untrained retrofit)")
    p.add_argument("--depth_ckpt", default=None, help="section 3: a checkpoint trained on the depth task")
    p.add_argument("--depth_data", default="data/depth", help="section 3: the prepared depth data dir")
    p.add_argument("--depth_rows", type=int, default=1000, help="section 3: val rows used")
    p.add_argument("--depth_r", type=int, default=32, help="section 3: r_max (fixed-r baseline and exit cap)")
    p.add_argument("--exit_min_loops", type=int, default=1, help="section 3: never exit before this many loops")
    p.add_argument("--gate_threshold", type=float, default=EXIT_THRESHOLDS["gate"],
                   help="section 3: the learned exit gate's threshold, when --depth_ckpt has a gate")
    p.add_argument("--batch_size", type=int, default=1000, help="section 3: rows per batch")
    p.add_argument("--diffusion_r", default="8,16,32", help="section 5: the r values")
    p.add_argument("--diffusion_threads", default="1,2", help="section 5: thread counts of the speed table")
    p.add_argument("--loops_per_pass", type=int, default=4, help="section 5: the diffusion sampler's loops per pass")
    p.add_argument("--headways", default="1,2,4", help="section 5: the diffusion sampler's headways")
    p.add_argument("--thresholds", default="0.03,0.1", help="section 5: latent-diff freeze thresholds (at the "
                   "last headway)")
    p.add_argument("--cot_ckpt", default=None, help="section 5: a looped model trained on data/depth/prepare.py --cot")
    p.add_argument("--cot_data", default="data/depth_cot", help="section 5: its data dir")
    p.add_argument("--cot_rows", type=int, default=50, help="section 5: dev rows (each at depths 1..train depth)")
    p.add_argument("--text_ckpt", default=None, help="section 5: a looped model trained on text")
    p.add_argument("--text_data", default="data/sotu", help="section 5: the text data dir (its val split)")
    p.add_argument("--text_prompts", type=int, default=20, help="section 5: held-out prompts")
    p.add_argument("--text_prompt", type=int, default=32, help="section 5: tokens per prompt")
    p.add_argument("--text_new", type=int, default=24, help="section 5: new tokens per prompt")
    p.add_argument("--plot", default="out/bench/diffusion_frontier.png", help="section 5: the frontier PNG")
    p.add_argument("--parent", default="smollm2", help="the parent of sections 1, 2, 4 and 5's speed table; random: "
                   "5's speed table on random weights of --random_shape (bench/gpu_check.sh)")
    p.add_argument("--random_shape", default="llama-3.2-1b", help="--parent random: a shape of bench_gpu.py")
    p.add_argument("--device", default="cpu", help="--parent random: where section 5's speed table runs")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=1,
                   help="1 by default: decode is matrix-vector work, and a 2nd thread waits a lot on shared cores")
    p.add_argument("--smoke", action="store_true", help="tiny random stand-ins for every model: the code in seconds")
    args = p.parse_args(argv)
    args.r = [int(x) for x in args.r.split(",")]
    args.diffusion_r = [int(x) for x in args.diffusion_r.split(",")]
    args.diffusion_threads = [int(x) for x in args.diffusion_threads.split(",")]
    args.thresholds = [float(x) for x in args.thresholds.split(",")]
    args.headways = [int(x) for x in args.headways.split(",")]
    sections = {int(x) for x in args.sections.split(",")}
    if args.parent == "random" and sections != {5}:
        p.error("--parent random has random weights for section 5's speed table only: add --sections 5")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            smoke_setup(args, tmp)
        log("config: " + " ".join(f"{k}={v}" for k, v in vars(args).items()) + f" torch={torch.__version__}")
        ids = list(range(3, 19))  # --smoke: any ids of the tiny vocabulary
        if sections & {1, 2, 4, 5} and not args.smoke and args.parent != "random":
            from plumbing.hub import resolve_checkpoint
            from plumbing.tokenizer import load_tokenizer

            tok = load_tokenizer(resolve_checkpoint(args.parent))
            ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]))
        for n, section in ((1, section_hf), (2, section_r), (3, section_depth), (4, section_budget),
                           (5, section_diffusion)):
            if n in sections:
                section(args) if n == 3 else section(args, ids)


if __name__ == "__main__":
    main()
