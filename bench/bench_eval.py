"""
Batched GSM8K generation throughput: nanorecur's KV-cache decoder (sample.generate, what eval_math.py runs)
against transformers' batched generate on the same weights and prompts, and what adaptive exit saves when the
rows that converged leave the batch (Huginn's exit, Geiping et al. 2025, arXiv 2502.05171, §6.1; the model is
McLeish et al. 2025's retrofit, arXiv 2511.07384).

The model is a (P,R,C) cut of the offline SmolLM2-135M (default 4,6,4, as bench_sample.py section 2) with the
adapter at [I | 0] and s_0 = e: the adapter then hands loop i's output to loop i+1 unchanged (exactly: it adds
zeros), so r loops are a plain stack of P + r R + C layers, which transformers runs as its own LlamaForCausalLM
loaded from the same GGUF, its layer list cut to the prelude, the core r times (the same parameter tensors) and
the coda, each entry with its own KV-cache slot as ours has one per (layer, loop). Both decode eval_math.py's
GSM8K prompts (--shots exemplars, "Q: ...\\nA: Let's think step by step.", left-padded) greedily in fp32 for
--max_new_tokens tokens: EOS is an ordinary token and there are no stop strings, so every row writes as many
tokens in both (eval_math stops rows at EOS and "Q:"; finished rows stay in the batch there too). The
completions are compared token by token. Arms at every batch size and r, timed in turn so load from other jobs
hits all: transformers, ours, and ours with --exit (r > 1): prefill seconds, decode tokens/s (prefill left out),
the ratio to transformers, agreement, and for --exit the core loops run (summed over rows) against rows x r.
The text is not GSM8K-quality: the cut model is untrained and loops a core that was never looped.

    python bench/bench_eval.py                 # batch 8 and 32, r 1 and 8, 32 tokens, 0-shot (~4 CPU minutes, 1 thread)
    python bench/bench_eval.py --shots 1       # eval_math's default prompt: ~3.7x the prefill
    python bench/bench_eval.py --batch 8 --r 1,8 --max_new_tokens 8               # about a minute
"""

import copy
import os
import statistics
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm loads: no progress bar of transformers' GGUF loader
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import eval_math  # noqa: E402
from plumbing.cli import THREADS_HELP, Parser, default_threads, int_list  # noqa: E402
from plumbing.eval_data import EvalError, load_problems  # noqa: E402
from sample import EXIT_THRESHOLDS, generate  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg=""):
    print(msg, file=sys.stderr, flush=True)


def gsm8k_prompts(args, tok, n):
    """The first n GSM8K test prompts as eval_math.py builds them (its exemplar draw, template, separator)."""
    ea = eval_math.parse_args(["--init", "smollm2", "--task", "gsm8k", "--data", args.data, "--shots",
                               str(args.shots), "--seed", str(args.seed)])
    test, train = load_problems(ea)
    if len(test) < n:
        raise EvalError(f"{args.data} holds {len(test)} test problems, the largest --batch needs {n}")
    shots = eval_math.exemplars(ea, train)
    return [eval_math.encode_prompt(tok, eval_math.build_prompt(ea, tok, row["question"], shots)) for row in test[:n]]


def passthrough(model):
    """Adapter W = [I | 0] on cat[s, e]: loop i's input is loop i-1's output, so the loops are a plain layer stack."""
    h = model.config.n_embd
    with torch.no_grad():
        eye = torch.eye(h, dtype=model.adapter.weight.dtype, device=model.adapter.weight.device)
        model.adapter.weight.copy_(torch.cat([eye, torch.zeros_like(eye)], dim=1))
    return model


def unrolled(hf, parent_layers, layers, r):
    """transformers' model with the layer list prelude, core x r, coda: the parent's own layer modules (their
    parameters shared), each entry a shallow copy with its own layer_idx, i.e. its own KV-cache slot."""
    order = layers["prelude"] + layers["core"] * r + layers["coda"]
    stack = []
    for j, i in enumerate(order):
        layer = copy.copy(parent_layers[i])
        layer._modules = dict(layer._modules)  # a copy's own child table, so its attention can differ
        layer.self_attn = copy.copy(parent_layers[i].self_attn)
        layer.self_attn.layer_idx = j
        stack.append(layer)
    hf.model.layers = torch.nn.ModuleList(stack)
    hf.config.num_hidden_layers = len(stack)
    if getattr(hf.config, "layer_types", None):
        hf.config.layer_types = [hf.config.layer_types[0]] * len(stack)  # Llama: every layer full attention
    return hf


def run_ours(model, prompts, r, n_new, exit_rule=None):
    """Greedy tokens, prefill s, decode s (n_new - 1 steps), CPU s of the call, generate's stats."""
    stats, c0 = {}, time.process_time()
    crit, thr = exit_rule or (None, None)
    outs = generate(model, prompts, max_new_tokens=n_new, num_steps=r, exit_criterion=crit, exit_threshold=thr,
                    stats=stats)
    return [o.tokens for o in outs], stats["prefill_s"], stats["decode_s"], time.process_time() - c0, stats


def run_hf(hf, prompts, n_new, pad_id):
    """The same through transformers' generate; a logits processor stamps the time of every new token's
    scores, the first right after the prefill."""
    from transformers import LogitsProcessorList

    stamps = []

    def clock(input_ids, scores):
        stamps.append(time.perf_counter())
        return scores

    L = max(len(p) for p in prompts)
    device = hf.model.embed_tokens.weight.device
    x = torch.tensor([[pad_id] * (L - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts], device=device)
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        y = hf.generate(x, attention_mask=mask, max_new_tokens=n_new, do_sample=False, pad_token_id=pad_id,
                        logits_processor=LogitsProcessorList([clock]))
    t1 = time.perf_counter()
    return y[:, L:].tolist(), stamps[0] - t0, t1 - stamps[0], time.process_time() - c0, None


def agreement(got, ref):
    """(rows equal, tokens of the common prefixes, tokens)."""
    prefix = [next((i for i, (a, b) in enumerate(zip(g, f)) if a != b), min(len(g), len(f))) for g, f in zip(got, ref)]
    return sum(g == f for g, f in zip(got, ref)), sum(prefix), sum(len(f) for f in ref)


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--batch", default="8,32", help="batch sizes (the first N GSM8K test problems)")
    p.add_argument("--r", default="1,8", help="core loops per token")
    p.add_argument("--shape", default="4,6,4", help="P,R,C cut of SmolLM2's 30 layers")
    p.add_argument("--max_new_tokens", type=int, default=32, help="tokens every row writes")
    p.add_argument("--shots", type=int, default=0, help="GSM8K exemplars in the prompt (eval_math's default, 1, "
                   "makes prompts ~3.7x longer: 232-316 tokens instead of 39-123)")
    p.add_argument("--data", default=os.path.join(REPO, "..", "shared", "data", "gsm8k"),
                   help="dir with GSM8K test.jsonl and train.jsonl")
    p.add_argument("--exit", default="latent-diff", choices=list(EXIT_THRESHOLDS) + ["none"],
                   help="the adaptive-exit arm's criterion (none: no such arm)")
    p.add_argument("--exit_threshold", type=float, default=0.3,
                   help="of --exit (Huginn's 0.03 for latent-diff never fires on this untrained stack; 0.3 exits "
                        "rows after 4-5 of 8 loops)")
    p.add_argument("--repeats", type=int, default=1, help="timings per arm (medians)")
    p.add_argument("--seed", type=int, default=1337, help="eval_math's exemplar draw")
    p.add_argument("--device", default="cpu", help="torch device (both run fp32)")
    p.add_argument("--threads", type=int, default=default_threads(), help=THREADS_HELP)
    args = p.parse_args(argv)
    try:
        args.batch, args.r = int_list(args.batch, "--batch"), int_list(args.r, "--r")
        args.shape = tuple(int_list(args.shape, "--shape", n=3))
    except ValueError as err:
        p.error(str(err))
    for name in ("max_new_tokens", "repeats", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.shots < 0:
        p.error(f"--shots must be >= 0, got {args.shots}")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    log("config: " + " ".join(f"{k}={v}" for k, v in vars(args).items()) + f" torch={torch.__version__}")
    from transformers import AutoModelForCausalLM

    from plumbing.hub import resolve_checkpoint
    from plumbing.tokenizer import load_tokenizer
    from surgery import retrofit

    gguf = resolve_checkpoint("smollm2")
    if not gguf.endswith(".gguf"):
        raise EvalError(f"smollm2 resolved to {gguf}, not the offline GGUF this benchmark loads in both libraries")
    tok = load_tokenizer(gguf)
    prompts = gsm8k_prompts(args, tok, max(args.batch))
    ours = passthrough(retrofit(gguf, shape=args.shape, state_init="embed")[0]).to(args.device).eval()
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                              dtype=torch.float32).to(args.device).eval()
    hf.generation_config.eos_token_id = None  # EOS is an ordinary token here, as in ours without eos_id
    parent_layers, layers = list(hf.model.layers), ours.config.layers
    P, R, C = args.shape
    exit_rule = None if args.exit == "none" else (args.exit, args.exit_threshold)
    log(f"GSM8K generation, SmolLM2 cut {P},{R},{C} (adapter [I | 0], s_0 = e: r loops = a {P}+rx{R}+{C}-layer stack), "
        f"{args.shots}-shot prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
        f"{args.max_new_tokens} new tokens a row, greedy, fp32, {torch.get_num_threads()} thread(s), "
        f"medians of {args.repeats}; wall clocks on shared cores")
    log("    B    r  arm                      prefill s  decode tok/s  vs hf   CPU s  vs hf   same as  rows equal  tokens equal"
        "  loops run")
    for r in args.r:
        unrolled(hf, parent_layers, layers, r)
        for B in args.batch:
            batch = prompts[:B]
            arms = {"transformers": lambda: run_hf(hf, batch, args.max_new_tokens, tok.eos_id),
                    "ours": lambda: run_ours(ours, batch, r, args.max_new_tokens)}
            if exit_rule and r > 1:
                arms[f"ours --exit {args.exit}"] = lambda: run_ours(ours, batch, r, args.max_new_tokens, exit_rule)
            runs = {name: [] for name in arms}
            for _ in range(args.repeats):
                for name, arm in arms.items():
                    runs[name].append(arm())
            res = {}
            for name, rs in runs.items():
                med = lambda k: statistics.median(x[k] for x in rs)
                res[name] = (rs[-1][0], med(1), B * (args.max_new_tokens - 1) / med(2), med(3), rs[-1][4])
            hf_rate, hf_cpu = res["transformers"][2], res["transformers"][3]
            for name, (toks, prefill, rate, cpu, stats) in res.items():
                ref = "ours" if "exit" in name else "transformers"
                rows, same, total = agreement(toks, res[ref][0])
                label = "hf" if ref == "transformers" else "ours"
                agree = "" if name == "transformers" else f"{label:>7s}  {rows:5d}/{B:<4d} {same:7d}/{total:<6d}"
                loops = ""
                if "exit" in name:
                    run, fixed = stats["loops_run"], stats["loops_run_max"]
                    loops = f"{run}/{fixed} ({run / fixed:.0%})"
                log(f"  {B:3d}  {r:3d}  {name:24s} {prefill:9.2f}  {rate:12.1f}  {rate / hf_rate:4.2f}x  {cpu:6.1f}"
                    f"  {hf_cpu / cpu:4.2f}x  {agree}  {loops}")
    log("  decode tok/s: rows x (new tokens - 1) / decode wall time (prefill left out); CPU s: of the whole call, this "
        "process only; vs hf: ratios to transformers, > 1 is faster. Same as: the arm whose tokens are compared (the "
        "--exit arm against ours at fixed r); tokens equal: each row's common prefix. Loops run: the core loops the "
        "decode steps ran, summed over rows, of rows x r x steps (a fixed r)")


if __name__ == "__main__":
    try:
        main()
    except EvalError as err:
        print(f"bench_eval.py: error: {err}", file=sys.stderr)
        sys.exit(1)
