"""
Sample from a recurrent-depth model, with Huginn's inference features (Geiping et al. 2025,
arXiv 2502.05171, §6; the model is McLeish et al. 2025, arXiv 2511.07384).

Every generated token runs the prelude once, the recurrent core r times and the coda once, so a
decode step costs P + r R + C layers. On top of plain sampling (temperature, top-k, top-p, stop at
EOS, batched prompts with left padding):
- a KV cache with one entry per (layer, loop), prefill then one token per step (kv_cache.py);
- KV-cache sharing: a budget of N slots per core layer, loop i uses slot i mod N (--kv_budget);
- adaptive exit per token: stop looping once the state or the prediction stops moving (--exit, exit_gate.py):
  kl, entropy-diff, latent-diff, cosine or argmax, with Huginn's default thresholds, or a learned gate; later tokens
  read an exited token's latest KV entry (policy in kv_cache.py). In a batch, a row that exited
  keeps its state and leaves the batch, the core loops on the other rows only; the step ends when
  every row has exited (or at r);
- warm start ("continuous CoT"): the next token starts from the last token's final state;
- self-speculative decoding: draft a few tokens with few loops, verify them in one pass at r loops
  and keep the agreeing prefix (--draft_r; greedy only);
- the diffusion-forcing sampler (--sampler diffusion, diffusion.py; arXiv 2510.14961): a wave of positions
  refined in parallel, --loops_per_pass loops each per pass, --headway new positions a pass, frozen after
  --freeze_loops loops (default r; once the token before it is final) or once --exit latent-diff says the
  state stopped moving. It combines with --r, --max_new_tokens, --temperature/--top_k/--top_p, --seed,
  --kv_budget, --exit latent-diff and --exit_threshold, the prompt options (one prompt at a time), --chat,
  --bos, --device, --autocast, --threads;
  it refuses the other --exit criteria, --exit_min_loops, --warm_start, --draft_r, --cache false and --compile.

Every mode decodes through kv_cache.py's CachedForward, the one loop over the recurrent core besides
model.forward; without a cache it is the plain forward pass, the reference the cache must match
(tests/test_sample.py).

Standard output carries only the generated text; the configuration and statistics go to stderr.

    python sample.py --init=out/smollm2 --r 4 --prompt "The capital of France is" --max_new_tokens 30
    python sample.py --init=smollm2 --r 1 --chat --prompt "What is 2+3?" --temperature 0   # CPU, offline
    python sample.py --r 32 --exit=kl --kv_budget=4 --warm_start --prompt FILE:prompts.txt
    python sample.py --r 8 --draft_r=2 --temperature 0 --prompt "1, 2, 3,"
    python sample.py --r 32 --sampler diffusion --loops_per_pass 4 --headway 2 --temperature 0 --prompt "The"
"""

import argparse
import math
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from exit_gate import EXIT_THRESHOLDS, ZERO_SHOT, ExitRule  # adaptive exit: its criteria and the learned gate
from diffusion import check_diffusion, generate_diffusion  # the parallel sampler (--sampler diffusion)
from kv_cache import CachedForward, KVCache  # the decoder: its KV cache and the cached forward pass
from plumbing.cli import THREADS_HELP, Parser, at_least, default_threads, str2bool
from plumbing.decode import decode_kernel, kernel_cache_path, matvec_layout
from plumbing.device import AUTOCAST, autocast_context, compile_blocks
from plumbing.tokenizer import prompt_ids, stop_ids

SAMPLERS = ("sequential", "diffusion")


def diffusion_conflicts(exit_criterion, exit_min_loops, warm_start, draft_r, cache):
    """The options the diffusion sampler refuses, as one ValueError (none: returns)."""
    bad = [name for name, on in (("exit other than latent-diff", exit_criterion not in (None, "latent-diff")),
                                 ("exit_min_loops", exit_min_loops != 1), ("warm_start", warm_start),
                                 ("draft_r", draft_r is not None), ("cache off", not cache)) if on]
    if bad:
        raise ValueError(f"the diffusion sampler cannot combine with {', '.join(bad)}: its wave carries each "
                         "position's state itself and freezes by a loop budget or by latent-diff")


@dataclass
class Completion:
    tokens: list[int]  # the new tokens (the prompt left out), up to and including EOS
    loops: list[int]  # core loops spent on the forward pass that produced each token


@dataclass
class DecodeOptions:
    """How generate() decodes: its keyword arguments (the defaults are here), checked, in one object
    for the functions below."""
    max_new_tokens: int
    r: int  # core loops per token
    temperature: float = 0.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    eos: frozenset = frozenset()  # token ids that end a row
    cache: bool = True  # False: recompute every position at fixed r (the reference for the cache)
    kv_budget: int | None = None  # KV slots per core layer (loop i -> slot i mod N)
    exit_criterion: str | None = None  # adaptive exit, a key of EXIT_THRESHOLDS
    exit_threshold: float | None = None  # default: Huginn's for the criterion
    exit_min_loops: int = 1  # never exit before this many loops
    warm_start: bool = False  # s_0 of a token = the last token's final state
    draft_r: int | None = None  # self-speculative decoding: draft with this many loops
    draft_k: int = 4  # tokens drafted per verify pass
    stop: Callable | None = None  # (row, new tokens so far) -> True ends the row as EOS would
    sampler: str = "sequential"  # sequential | diffusion (diffusion.py: many positions a few loops per pass)
    loops_per_pass: int = 4  # diffusion: core loops each position of the wave runs per forward pass
    wavefront: int = 128  # diffusion: positions refined at once, at most
    headway: int = 1  # diffusion: new positions joining the wave per pass
    freeze_loops: int | None = -1  # diffusion: loops after which a position freezes (-1: r; None: no budget)

    def check(self, c, prompts):
        """Every bad combination as one ValueError, before the model runs (c: the model's config)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        bad = [t for p in prompts for t in p if not 0 <= t < c.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {c.vocab_size})")
        if self.max_new_tokens < 1 or self.r < 1:
            raise ValueError(f"max_new_tokens and num_steps must be >= 1, got {self.max_new_tokens} and {self.r}")
        top_k, top_p = self.top_k, self.top_p
        if self.temperature < 0 or (top_k is not None and top_k < 1) or (top_p is not None and not 0 < top_p <= 1):
            raise ValueError("need temperature >= 0, top_k >= 1 and 0 < top_p <= 1")
        if self.kv_budget is not None and self.kv_budget < 1:
            raise ValueError(f"kv_budget must be >= 1, got {self.kv_budget}")
        if self.exit_criterion is not None and not c.recurrent:
            raise ValueError("adaptive exit needs a recurrent model; this one has static depth")
        if self.exit_criterion == "gate" and not c.exit_gate:
            raise ValueError("--exit gate needs a checkpoint with a learned exit gate, and this one has none: train "
                             "one (train.py --exit_gate --init CHECKPOINT) or pick a criterion of "
                             + ", ".join(ZERO_SHOT))
        if self.exit_min_loops < 1:
            raise ValueError(f"exit_min_loops must be >= 1, got {self.exit_min_loops}")
        if self.warm_start and c.first_loop == "identity":
            raise ValueError("warm_start replaces s_0, which a first_loop 'identity' model never reads (its first loop "
                             "feeds the core e): decode it without warm_start")
        if not self.cache and (self.kv_budget or self.exit_criterion or self.warm_start or self.draft_r):
            raise ValueError("cache=False recomputes every position at fixed r: it cannot combine with "
                             "kv_budget, exit, warm_start or draft_r")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {self.sampler!r}: choose from {', '.join(SAMPLERS)}")
        if self.sampler == "diffusion":
            diffusion_conflicts(self.exit_criterion, self.exit_min_loops, self.warm_start, self.draft_r, self.cache)
            check_diffusion(self.r, self.loops_per_pass, self.wavefront, self.headway,
                            self.r if self.freeze_loops == -1 else self.freeze_loops, self.diffusion_threshold())
        if self.draft_r is not None:
            if self.draft_r < 1 or self.draft_k < 1:
                raise ValueError(f"draft_r and draft_k must be >= 1, got {self.draft_r} and {self.draft_k}")
            if self.temperature != 0 or self.exit_criterion or self.warm_start:
                raise ValueError("self-speculative decoding is greedy (temperature 0) and runs a fixed r: "
                                 "it cannot combine with exit or warm_start")
            if self.stop is not None:
                raise ValueError("stop= is not supported with draft_r (self-speculative decoding)")

    def diffusion_threshold(self):
        """The diffusion sampler's latent-diff freeze threshold (None: off), --exit latent-diff's."""
        if self.exit_criterion != "latent-diff":
            return None
        return EXIT_THRESHOLDS["latent-diff"] if self.exit_threshold is None else self.exit_threshold


def sample_next(logits, temperature=0.0, top_k=None, top_p=None, generator=None):
    """logits (B, V) -> (B,) token ids; temperature 0 is greedy."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(filter_logits(logits / temperature, top_k, top_p), -1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def filter_logits(logits, top_k=None, top_p=None):
    """Keep the top_k largest logits, then the smallest set whose probability reaches top_p
    (nucleus sampling); the rest become -inf."""
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop = cum - torch.softmax(sorted_logits, -1) >= top_p  # tokens after the nucleus is full
        logits = logits.masked_fill(drop.scatter(1, order, drop), -math.inf)
    return logits


# -----------------------------------------------------------------------------
# generate


def generate(model, prompts, *, max_new_tokens, num_steps, eos_id=None, seed=None, stats=None, **options):
    """Complete each prompt (a list of token ids); batched with left padding. num_steps: core loops per
    token (None: config.mean_recurrence; the word of model.forward). eos_id: an int, a collection of
    ints or None. seed: of the sampling and s_0 draws. stats: an optional dict that receives timings
    and counts; of batched decoding (not draft_r) also loops_run, the core loops the decode steps ran
    summed over the batch's rows (finished rows included: they stay in the batch), against loops_run_max,
    steps x rows x r (what a fixed r runs; adaptive exit lowers the first). options: the other fields of
    DecodeOptions (temperature, top_k, top_p, cache, kv_budget, exit_criterion, exit_threshold,
    exit_min_loops, warm_start, draft_r, draft_k, stop, sampler, loops_per_pass, wavefront, headway, freeze_loops),
    with their defaults there; an unknown one is a
    TypeError. stop: a callable(row, tokens) -> bool, asked after every new token of a row (its new
    tokens so far); True ends that row as EOS would (stop strings).
    Returns one Completion per prompt."""
    c = model.config
    r = (num_steps if num_steps is not None else c.mean_recurrence) if c.recurrent else 1
    eos = () if eos_id is None else [eos_id] if isinstance(eos_id, int) else eos_id
    opt = DecodeOptions(max_new_tokens=max_new_tokens, r=r, eos=frozenset(int(x) for x in eos), **options)
    opt.check(c, prompts)
    device = model.embed_tokens.weight.device
    gen = torch.Generator(device).manual_seed(seed) if seed is not None else None
    stats = {} if stats is None else stats
    stats.update(prefill_s=0.0, decode_s=0.0, decode_tokens=0, decode_loops=0, kv_bytes=0, drafted=0, accepted=0,
                 loops_run=0, loops_run_max=0)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            if opt.draft_r is not None:
                return [_speculative(model, p, opt, gen, stats) for p in prompts]
            if opt.sampler == "diffusion":
                return [_diffusion(model, p, opt, gen, stats) for p in prompts]
            return _batch(model, prompts, opt, gen, stats)
    finally:
        model.train(was_training)


def context_warning(config, prompts, max_new_tokens):
    """A one-line warning when prompts plus their new tokens run past config.block_size, the context the
    model was trained for (rotary positions need no table, so it runs, on positions it never saw); None
    when everything fits."""
    over = [len(p) for p in prompts if len(p) + max_new_tokens > config.block_size]
    if not over:
        return None
    return (f"warning: {len(over)} of {len(prompts)} prompts (the longest {max(over)} tokens) plus --max_new_tokens "
            f"{max_new_tokens} run past the model's context of {config.block_size} tokens (config.block_size): "
            "shorten the prompt or lower --max_new_tokens")


def _new_cache(model, batch_size, max_len, opt):
    """A KV cache of min(kv_budget, r) slots per core layer, in the model's device and dtype."""
    w = model.embed_tokens.weight
    return KVCache(model.config, batch_size, max_len, min(opt.kv_budget or opt.r, opt.r), w.device, w.dtype)


def _batch(model, prompts, opt, gen, stats):
    device = model.embed_tokens.weight.device
    B, L = len(prompts), max(len(p) for p in prompts)
    pads = [L - len(p) for p in prompts]
    pad_id = min(opt.eos) if opt.eos else 0  # any id: no real token attends to a pad
    idx = torch.tensor([[pad_id] * n + list(p) for n, p in zip(pads, prompts)], device=device)
    max_len = L + opt.max_new_tokens
    kv = _new_cache(model, B, max_len, opt) if opt.cache else None
    gate = getattr(model, "exit_gate", None)
    rule = ExitRule(opt.exit_criterion, opt.exit_threshold, opt.exit_min_loops, gate) if opt.exit_criterion else None
    fwd = CachedForward(model, pads, max_len, opt.r, kv, rule, opt.warm_start, gen)
    stats["kv_bytes"] = kv.nbytes if kv is not None else 0
    t0 = time.perf_counter()
    logits, loops = fwd.run(idx, last_only=True)
    stats["prefill_s"] = time.perf_counter() - t0
    out = [Completion([], []) for _ in prompts]
    done = [False] * B
    t0 = time.perf_counter()
    for t in range(opt.max_new_tokens):
        nxt = sample_next(logits[:, -1], opt.temperature, opt.top_k, opt.top_p, gen)  # (B,)
        for b, (tok, n) in enumerate(zip(nxt.tolist(), loops.tolist())):
            if not done[b]:
                out[b].tokens.append(tok)
                out[b].loops.append(n)
                done[b] = tok in opt.eos or (opt.stop is not None and bool(opt.stop(b, out[b].tokens)))
        if all(done) or t + 1 == opt.max_new_tokens:
            break
        if kv is not None:
            logits, loops = fwd.run(nxt[:, None], adaptive=rule is not None)
        else:  # recompute the whole sequence (the reference the cache must match)
            idx = torch.cat([idx, nxt[:, None]], dim=1)
            logits, loops = fwd.run(idx, last_only=True)
        stats["decode_tokens"] += sum(not d for d in done)
        stats["decode_loops"] += sum(n for n, d in zip(loops.tolist(), done) if not d)
        stats["loops_run"] += int(loops.sum())  # a row's loops are what the core ran for it (_exit_loops)
        stats["loops_run_max"] += B * opt.r
    stats["decode_s"] = time.perf_counter() - t0
    return out


def _speculative(model, prompt, opt, gen, stats):
    """Self-speculative greedy decoding of one prompt (rows would accept different numbers of tokens,
    so batches run one prompt at a time). Invariant: the cache holds r-loop entries for every
    position before `tok`; draft entries past it are overwritten by the verify pass or later."""
    device, r, eos = model.embed_tokens.weight.device, opt.r, opt.eos
    max_len = len(prompt) + opt.max_new_tokens + opt.draft_k + 1
    kv = _new_cache(model, 1, max_len, opt)
    fwd = CachedForward(model, [0], max_len, r, kv, generator=gen)
    stats["kv_bytes"] = max(stats["kv_bytes"], kv.nbytes)
    t0 = time.perf_counter()
    logits, _ = fwd.run(torch.tensor([prompt], device=device), last_only=True)
    stats["prefill_s"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    tok = int(logits[0, -1].argmax())
    out = [tok]
    while len(out) < opt.max_new_tokens and tok not in eos:
        base, drafts, x = fwd.pos, [], tok
        for _ in range(min(opt.draft_k, opt.max_new_tokens - len(out))):  # draft with few loops
            lg, _ = fwd.run(torch.tensor([[x]], device=device), num_loops=opt.draft_r)
            x = int(lg[0, -1].argmax())
            drafts.append(x)
            if x in eos:
                break
        fwd.pos = base  # verify [tok, drafts] in one pass at r loops, overwriting the draft entries
        lg, _ = fwd.run(torch.tensor([[tok] + drafts], device=device))
        verified = lg[0].argmax(-1).tolist()  # verified[j]: the r-loop prediction after drafts[:j]
        j = 0
        while j < len(drafts) and drafts[j] == verified[j]:
            j += 1
        fwd.pos = base + j + 1  # tok and the j agreeing drafts now hold r-loop entries
        stats["drafted"] += len(drafts)
        stats["accepted"] += j
        stats["decode_loops"] += len(drafts) * opt.draft_r + r
        for t in drafts[:j] + [verified[j]]:
            out.append(t)
            if t in eos or len(out) == opt.max_new_tokens:
                break
        tok = out[-1]
    stats["decode_s"] += time.perf_counter() - t0
    stats["decode_tokens"] += len(out) - 1
    return Completion(out, [r] * len(out))


def _diffusion(model, prompt, opt, gen, stats):
    """One prompt through diffusion.py's sampler (batch 1: each prompt its own wave), its counts added to stats."""
    st = {}
    pick = lambda logits: sample_next(logits, opt.temperature, opt.top_k, opt.top_p, gen)
    tokens, loops = generate_diffusion(model, prompt, max_new_tokens=opt.max_new_tokens, r=opt.r, pick=pick,
                                       loops_per_pass=opt.loops_per_pass, wavefront=opt.wavefront,
                                       headway=opt.headway, freeze_loops=opt.freeze_loops,
                                       threshold=opt.diffusion_threshold(), eos=opt.eos, stop=opt.stop,
                                       kv_budget=opt.kv_budget, generator=gen, stats=st)
    stats["prefill_s"] += st["prefill_s"]
    stats["decode_s"] += st["decode_s"]
    stats["decode_tokens"] += len(tokens) - 1  # the first new token is the prefill's
    stats["decode_loops"] += sum(loops)
    stats["kv_bytes"] = max(stats["kv_bytes"], st["kv_bytes"])
    for k in ("passes", "wave_positions", "loops_run"):
        stats[k] = stats.get(k, 0) + st[k]
    return Completion(tokens, loops)


# -----------------------------------------------------------------------------
# command line


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter)
    flag = dict(type=str2bool, nargs="?", const=True, default=False)
    p.add_argument("--init", default="out", help="checkpoint dir (default out/), short name, hub id or .gguf")
    p.add_argument("--r", type=int, default=None, help="core loops per token (default: config.mean_recurrence)")
    p.add_argument("--prompt", default="\n", help='prompt text, or "FILE:path" for one prompt per line')
    p.add_argument("--prompt_file", default=None, help="one prompt per line, generated as one left-padded batch")
    p.add_argument("--num_samples", type=int, default=1, help="completions per prompt")
    p.add_argument("--max_new_tokens", type=int, default=100, help="tokens to generate per completion")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top_k", type=int, default=200, help="sample among the k most likely tokens")
    p.add_argument("--top_p", type=float, default=None, help="nucleus sampling: the smallest set with this probability")
    p.add_argument("--seed", type=int, default=1337, help="sampling and s_0 draws")
    p.add_argument("--cache", type=str2bool, default=True, help="false: recompute every position, no KV cache")
    p.add_argument("--kv_budget", type=int, default=None, help="KV slots per core layer (loop i -> slot i mod N)")
    p.add_argument("--exit", default=None, choices=list(EXIT_THRESHOLDS), help="adaptive exit criterion")
    p.add_argument("--exit_threshold", type=float, default=None, help="default: Huginn's for the criterion")
    p.add_argument("--exit_min_loops", type=int, default=1, help="never exit before this many loops")
    p.add_argument("--warm_start", **flag, help="start each token's state from the last token's final state")
    p.add_argument("--draft_r", type=int, default=None, help="self-speculative: draft with this many loops")
    p.add_argument("--draft_k", type=int, default=4, help="tokens drafted per verify pass")
    p.add_argument("--sampler", default="sequential", choices=SAMPLERS, help="sequential: a token at a time, r loops "
                   "each; diffusion: a wave of positions, --loops_per_pass loops each per pass (diffusion.py)")
    p.add_argument("--loops_per_pass", type=int, default=4, help="diffusion: loops each wave position runs per pass")
    p.add_argument("--wavefront", type=int, default=128, help="diffusion: positions refined at once, at most")
    p.add_argument("--headway", type=int, default=1, help="diffusion: new positions joining the wave per pass")
    p.add_argument("--freeze_loops", type=int, default=None, help="diffusion: loops after which a position freezes, "
                   "if it read the final token before it (default r; 0: none, --exit latent-diff alone freezes)")
    p.add_argument("--chat", **flag, help="wrap each prompt in the parent's chat template")
    p.add_argument("--bos", type=str2bool, default=True, help="start plain prompts with the parent's document separator (BOS or <|endoftext|>)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1")
    p.add_argument("--autocast", default="auto", choices=AUTOCAST, help="bf16 autocast: auto (on CUDA) | bf16 | off")
    p.add_argument("--compile", **flag, help="torch.compile the blocks, CPU or CUDA (plumbing/device.py); the first "
                   "prefill and decode step then include compiling")
    p.add_argument("--threads", type=int, default=default_threads(), help=THREADS_HELP)
    args = p.parse_args(argv)
    try:  # before the model loads: each wrong flag by name
        at_least(args, 0, "temperature", "exit_threshold")
        at_least(args, 0, "freeze_loops")
        at_least(args, 1, "r", "max_new_tokens", "num_samples", "top_k", "kv_budget", "exit_min_loops", "draft_r", "draft_k",
                 "threads", "loops_per_pass", "wavefront", "headway")
    except ValueError as err:
        p.error(str(err))
    if args.top_p is not None and not 0 < args.top_p <= 1:
        p.error(f"--top_p {args.top_p} must be in (0, 1]")
    if args.sampler == "diffusion":  # what the flags alone decide, before the model loads
        if args.compile:
            p.error("--compile with --sampler diffusion would recompile the blocks for every wave size: leave it off")
        try:
            diffusion_conflicts(args.exit, args.exit_min_loops, args.warm_start, args.draft_r, args.cache)
            threshold = (args.exit_threshold or EXIT_THRESHOLDS["latent-diff"]) if args.exit else None
            freeze = {None: args.r, 0: None}.get(args.freeze_loops, args.freeze_loops)
            check_diffusion(args.r or args.loops_per_pass, args.loops_per_pass, args.wavefront, args.headway,
                            freeze if args.r or args.freeze_loops is not None else args.loops_per_pass, threshold)
        except ValueError as err:
            p.error(str(err))
    return args


def read_prompts(args):
    if args.prompt_file is not None or args.prompt.startswith("FILE:"):
        path = args.prompt_file if args.prompt_file is not None else args.prompt[len("FILE:"):]
        try:
            with open(path, encoding="utf-8") as f:
                prompts = [line.rstrip("\n") for line in f if line.strip()]
        except OSError as err:
            raise ValueError(f"cannot read prompts from {path}: {err.strerror}") from None
        if not prompts:
            raise ValueError(f"{path} holds no prompt (one per line)")
        return prompts
    return [args.prompt]


def encode(tok, text, chat, bos):
    if chat:  # the template places BOS itself where the parent wants it
        return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))
    return prompt_ids(tok, text) if bos else tok.encode(text)  # as the start of a fresh document


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print("config: " + " ".join(f"{k}={v}" for k, v in vars(args).items()), file=sys.stderr)
    from plumbing.hub import CheckpointError
    from surgery import SurgeryError, load_model
    from plumbing.tokenizer import load_tokenizer

    try:
        prompts = read_prompts(args) * args.num_samples
        model, tok_path = load_model(args.init, device=args.device)
        if model.embed_tokens.weight.device.type == "cpu":  # the few-row product kernel this CPU runs fastest
            choice = decode_kernel(model)
            times = ", ".join(f"{k} {v:.2f}" for k, v in choice["ms"].items())
            print(f"decode kernel: {choice['kernel']} ({'cached' if choice['cached'] else 'measured'}: ms for a "
                  f"token's products at r = 1 at 1 and 4 rows: {times}; {kernel_cache_path()})", file=sys.stderr)
            matvec_layout(model, choice["kernel"])
        if args.compile:
            compile_blocks(model)
        tok = load_tokenizer(tok_path)
        ids = [encode(tok, p, args.chat, args.bos) for p in prompts]
        warning = context_warning(model.config, ids, args.max_new_tokens)
        if warning:
            print(warning, file=sys.stderr)
        eos = stop_ids(tok, args.chat)
        stats = {}
        with autocast_context(model.embed_tokens.weight.device, args.autocast):  # bf16 on CUDA (plumbing/device.py)
            outs = generate(model, ids, max_new_tokens=args.max_new_tokens, num_steps=args.r,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, eos_id=eos or None,
                            seed=args.seed, cache=args.cache, kv_budget=args.kv_budget, exit_criterion=args.exit,
                            exit_threshold=args.exit_threshold, warm_start=args.warm_start, draft_r=args.draft_r,
                            draft_k=args.draft_k, exit_min_loops=args.exit_min_loops, stats=stats,
                            sampler=args.sampler, loops_per_pass=args.loops_per_pass, wavefront=args.wavefront,
                            headway=args.headway,
                            freeze_loops={None: -1, 0: None}.get(args.freeze_loops, args.freeze_loops))
    except (ValueError, FileNotFoundError, CheckpointError, SurgeryError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    for i, out in enumerate(outs):
        toks = out.tokens[:-1] if out.tokens and out.tokens[-1] in eos else out.tokens
        print(tok.decode(toks))
        if len(outs) > 1 and i + 1 < len(outs):
            print("---------------")
    n_new = sum(len(o.tokens) for o in outs)
    loops = [n for o in outs for n in o.loops]
    dec = stats["decode_tokens"] / stats["decode_s"] if stats["decode_s"] > 0 else float("nan")
    print(f"{len(outs)} prompts, {n_new} new tokens: prefill {stats['prefill_s']:.2f}s, decode {dec:.1f} tok/s, "
          f"mean loops per token {sum(loops) / max(len(loops), 1):.2f}, KV cache "
          f"{stats['kv_bytes'] / 2**20:.1f} MiB", file=sys.stderr)
    if args.sampler == "diffusion":
        print(f"diffusion sampler: {stats['passes']} passes of {args.loops_per_pass} loops over "
              f"{stats['wave_positions'] / max(stats['passes'], 1):.1f} positions on average, "
              f"{n_new / max(stats['passes'], 1):.2f} tokens frozen per pass", file=sys.stderr)
    if args.exit is not None and stats["loops_run_max"]:
        run, fixed = stats["loops_run"], stats["loops_run_max"]
        print(f"adaptive exit: the decode steps ran {run} core loops (summed over rows) of the {fixed} a fixed r "
              f"runs ({run / fixed:.0%})", file=sys.stderr)
    if args.draft_r is not None:
        rate = stats["accepted"] / max(stats["drafted"], 1)
        print(f"self-speculative: {stats['accepted']}/{stats['drafted']} drafts accepted ({rate:.0%}), "
              f"{stats['decode_loops'] / max(stats['decode_tokens'], 1):.2f} core passes per token", file=sys.stderr)


if __name__ == "__main__":
    main()
