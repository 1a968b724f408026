"""
Train a recurrent-depth model: heal a retrofitted parent, or train a small one from scratch.

The recipe of McLeish et al. 2025 (arXiv 2511.07384, "retrofitted recurrence"): each optimizer step
draws a loop count r from a Poisson-lognormal around a mean rbar (r = Poisson(exp(tau)) + 1,
tau ~ N(log rbar - sigma^2/2, sigma)), seeded by the step so every rank agrees; rbar can follow a
curriculum (linear or 1-sqrt) up to its final value; only the last k loops keep activations for
backprop (truncated backprop through depth, k = 8). Muon trains every 2-D block matrix and the
adapter, AdamW the embeddings, head, norms and biases, under a warmup-stable-decay schedule.
--step_supervision adds the per-loop readout loss of arXiv 2608.11233: after loop i the coda reads
out and is trained on the labels that need <= i steps (data with DIR/{split}_step.bin).

    python train.py                                       # offline default: SmolLM2 (6,8,6) on data/sotu
    python data/depth/prepare.py --out_dir data/depth && python train.py --config config/cpu_depth.json
    python train.py --init=llama --shape 4,6,4 --data data/fineweb_edu --out_dir out/phase1
    python train.py --config config/llama_4_6_4.json      # phase 1; phase 2: see that file's "phase2"
    torchrun --standalone --nproc_per_node=8 train.py --config config/llama_4_6_4.json
    python train.py --resume                              # continue the run in out/ exactly where it stopped
                                                          # (with the same flags: see RESUME_MAY_CHANGE)

Outputs in --out_dir: model.safetensors + config.json (run config under "train"), tokenizer files,
train_state.pt (optimizers, step, RNG), log.jsonl (one line per optimizer step and per eval). The first
three are links into the current save under ckpt/, switched together by one atomic rename
(checkpoint.py); one process at a time owns the directory (.lock); a loss that diverges stops the run
before it is saved (--diverge_factor).
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from plumbing import checkpoint
from plumbing.cli import at_least, git_commit, int_list, ready_out_dir, str2bool
from model import IGNORE_INDEX, RecurrentConfig, RecurrentGPT
from muon import Muon

# -----------------------------------------------------------------------------
# defaults: the offline CPU run. Every key can be set by --config FILE (JSON) or --key=value / --key value.
# One table of (default, what it means): DEFAULTS and the --help texts are both read off it.
FLAGS = dict(
    config=("", "JSON file of defaults; command-line flags override it"),
    # model
    init=("smollm2", 'parent (short name, hub id, dir, .gguf), a checkpoint dir to continue from, or "scratch"'),
    shape=("6,8,6", "P,R,C: prelude, core, coda layers (a mild cut of SmolLM2's 30: reference.md section 5)"),
    layers=("", "explicit parent layer map, e.g. 0-3,6-11,12-15 (overrides --shape)"),
    static=(False, "the non-recurrent baseline: the same layers run once (P+R+C = all layers: the whole parent)"),
    adapter_init=("identity", "identity [0 | I] (r=1 equals the layer-dropped parent) | sum | random"),
    state_init=("", 's_0: normal | zero | embed; "" keeps the model\'s own'),
    untie=(False, "untie the head from the embedding (the published retrofits do)"),
    n_embd=(64, "--init=scratch: width h"),
    n_head=(4, "--init=scratch: attention heads"),
    n_kv_head=(0, "--init=scratch: key/value heads (0: n_head)"),
    intermediate_size=(0, "--init=scratch: MLP width (0: 4 n_embd)"),
    # data
    data=("data/sotu", "a prepared data dir (data/*/prepare.py)"),
    out_dir=("out", "checkpoint, log.jsonl, loss.png (nanoGPT's out/: where sample.py looks by default)"),
    batch_size=(4, "micro-batch rows per rank"),
    block_size=(256, "tokens per row (row data uses its seq_len)"),
    total_batch_tokens=(0, "tokens per optimizer step over all ranks (gradient accumulation); 0 = one micro-batch"),
    # optimization
    max_iters=(100, "optimizer steps"),
    optimizer=("muon", "muon (paper: Muon on block matrices and adapter, AdamW on the rest) | adamw (AdamW on all)"),
    learning_rate=(1e-3, "Muon's peak lr"),
    adam_lr=(5e-5, "AdamW's peak lr (embeddings, head, norms, biases; everything with --optimizer adamw)"),
    weight_decay=(1e-4, "decoupled weight decay of both optimizers"),
    beta1=(0.9, "AdamW beta1"),
    beta2=(0.95, "AdamW beta2"),
    muon_momentum=(0.95, "Muon's momentum"),
    muon_adjust_lr=("original", "torch.optim.Muon's adjust_lr_fn: original | match_rms_adamw"),
    warmup_iters=(10, "warmup-stable-decay: steps of linear warmup"),
    decay_frac=(0.2, "warmup-stable-decay: last fraction of max_iters with linear decay"),
    min_lr_frac=(0.0, "warmup-stable-decay: the lr at the end, as a fraction of the peak"),
    grad_clip=(1.0, "clip the gradient norm to this; 0 = no clipping"),
    freeze=("none", "none | base (only the adapter, and norms with --train_norms, train)"),
    train_norms=(False, "with --freeze base: the RMSNorm weights train too"),
    # recurrence
    mean_recurrence=(4, "rbar: each step draws r = Poisson(exp(tau)) + 1, E[exp(tau)] = rbar"),
    recurrence_sigma=(0.5, "std of tau, tau ~ N(log rbar - sigma^2/2, sigma)"),
    backprop_depth=(8, "k: only the last k loops keep activations (truncated backprop through depth)"),
    curriculum=("constant", "rbar over the first --curriculum_frac of max_iters: constant | linear | 1-sqrt"),
    curriculum_frac=(0.25, "fraction of max_iters that the curriculum takes to reach --mean_recurrence"),
    step_supervision=(False, "per-loop readout loss (arXiv 2608.11233; needs DIR/train_step.bin, e.g. data/depth)"),
    step_supervision_anneal=(0.0, "last fraction of steps fading to outcome-only loss"),
    # evaluation, logging, system
    eval_interval=(50, "evaluate (and save) every N steps, and at the end"),
    eval_iters=(2, "validation batches per r"),
    eval_r=("1,4,8,32", "loop counts to evaluate (an r=32 eval costs 13x a parent forward on CPU)"),
    log_interval=(1, "print a line every N steps"),
    ckpt_minutes=(5.0, "also save between evals once this many minutes passed since the last save; 0 = at evals only"),
    device=("auto", "auto (cuda when available) | cpu | cuda | cuda:N"),
    compile=(False, "torch.compile the blocks (off on CPU)"),
    seed=(1337, "seeds the data order, r and s_0 draws, and a scratch model's init"),
    resume=(False, "continue the run in --out_dir exactly where it stopped, with its flags: only max_iters, eval_*, "
                   "log_interval, ckpt_minutes, device, compile, max_bad_steps, diverge_*, peak_flops may differ"),
    max_bad_steps=(5, "stop after this many NaN/inf steps in a row (each is skipped)"),
    diverge_factor=(4.0, "a train loss over this times its running level and 1 nat above it is a spike (never "
                         "saved); 0 = off"),
    diverge_steps=(3, "stop after this many spikes in a row (one alone is the sampled r: an r=1 step reads out early)"),
    peak_flops=(0.0, "FLOP/s of one device, for MFU (e.g. 989e12 for an H100 in bf16); 0 = no MFU"),
)
DEFAULTS = {key: default for key, (default, _) in FLAGS.items()}
# --resume continues the run as it was: every key must equal the run's saved value (config.json, "train"),
# except these, which change neither the model nor the optimizer (max_iters does move the decay and the
# curriculum that are fractions of it: that is how a run is extended)
RESUME_MAY_CHANGE = ("config", "resume", "out_dir", "max_iters", "eval_interval", "eval_iters", "eval_r",
                     "log_interval", "ckpt_minutes", "device", "compile", "max_bad_steps", "diverge_factor",
                     "diverge_steps", "peak_flops")


class TrainError(Exception):
    """An expected failure (bad flag, missing data, mismatched tokenizer): printed as one line."""


CHOICES = {"optimizer": ("muon", "adamw"), "curriculum": ("constant", "linear", "1-sqrt"), "freeze": ("none", "base"),
           "state_init": ("", "normal", "zero", "embed"), "adapter_init": ("identity", "sum", "random"),
           "muon_adjust_lr": ("original", "match_rms_adamw")}


def parse_args(argv=None):
    """DEFAULTS <- --config FILE <- command line. Unknown keys anywhere are an error; flag values are
    checked here (check_args), before any data or model loads."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    for key, (value, text) in FLAGS.items():
        text = text.replace("%", "%%") + " (default: %(default)r)"  # argparse %-formats help texts
        if isinstance(value, bool):  # --static, --static=true, --static false
            parser.add_argument(f"--{key}", type=str2bool, nargs="?", const=True, default=value, help=text)
        else:
            parser.add_argument(f"--{key}", type=type(value), default=value, help=text)
    first, _ = parser.parse_known_args(argv)
    if first.config:
        try:
            with open(first.config) as f:
                cfg = json.load(f)
        except (OSError, ValueError) as err:
            raise TrainError(f"--config {first.config}: {getattr(err, 'strerror', None) or err}") from None
        cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}  # "_comment", "_phase2": documentation
        unknown = sorted(set(cfg) - set(DEFAULTS))
        if unknown:
            parser.error(f"{first.config}: unknown keys {unknown}")
        parser.set_defaults(**cfg)
    return check_args(parser.parse_args(argv))


def check_args(args):
    """One-line TrainErrors for flag values that are wrong whatever the data and the model."""
    try:
        int_list(args.shape, "--shape", n=3)
        int_list(args.eval_r, "--eval_r")
        at_least(args, 1, "eval_interval", "eval_iters", "batch_size", "block_size", "max_bad_steps", "diverge_steps",
                 "log_interval", "mean_recurrence", "backprop_depth")
        at_least(args, 0, "max_iters", "warmup_iters", "total_batch_tokens", "recurrence_sigma", "grad_clip")
    except ValueError as err:
        raise TrainError(str(err)) from None
    for key, allowed in CHOICES.items():
        if getattr(args, key) not in allowed:
            raise TrainError(f"--{key} must be one of {', '.join(map(repr, allowed))}, not {getattr(args, key)!r}")
    return args


# -----------------------------------------------------------------------------
# named helpers: recurrence sampling, curriculum, lr schedule, batches, evaluation


def sample_num_steps(step, mean_r, sigma=0.5, seed=0):
    """r = Poisson(exp(tau)) + 1, tau ~ N(log(mean_r) - sigma^2/2, sigma): E[exp(tau)] = mean_r, so
    E[r] = mean_r + 1. Drawn from a generator seeded by the step alone, so all ranks (and a resumed
    run) draw the same r."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    tau = torch.normal(math.log(mean_r) - sigma**2 / 2, sigma, (1,), generator=g)
    return int(torch.poisson(torch.exp(tau), generator=g).item()) + 1


def mean_recurrence_at(step, max_iters, mean_r, curriculum="constant", frac=0.25):
    """Curriculum of the mean: over the first W = frac * max_iters steps rbar(t) = ceil(mean_r f(t/W)),
    at least 1, with f(u) = u (linear) or 1 - sqrt(1 - u) (1-sqrt); mean_r afterwards."""
    W = frac * max_iters
    if curriculum == "constant" or step >= W:
        return mean_r
    u = step / W
    f = u if curriculum == "linear" else 1 - math.sqrt(1 - u)
    return max(1, math.ceil(mean_r * f))


def get_lr(step, max_iters, warmup_iters, decay_frac, min_lr_frac=0.0):
    """Warmup-stable-decay, as a multiple of the peak lr: linear warmup, flat, then linear decay to
    min_lr_frac over the last decay_frac of the run."""
    if step < warmup_iters:
        return (step + 1) / warmup_iters
    decay_start = max_iters * (1 - decay_frac)
    if decay_frac <= 0 or step < decay_start:
        return 1.0
    return 1.0 - (1.0 - min_lr_frac) * (step - decay_start) / (max_iters - decay_start)


def open_data(data_dir, split, block_size):
    from data.common import load_meta, open_split

    meta = load_meta(data_dir)
    ids, targets, steps = open_split(data_dir, split, meta)
    seq_len = meta.get("seq_len")
    if seq_len:  # rows of seq_len tokens with their own labels: batches take whole rows
        n = len(ids) // seq_len
        return dict(meta=meta, ids=ids.reshape(n, seq_len), targets=targets.reshape(n, seq_len),
                    steps=None if steps is None else steps.reshape(n, seq_len), T=seq_len, n=n)
    n = len(ids) - block_size - 1  # plain text: any window; the target of t is token t+1
    if n < 1:
        raise TrainError(f"{data_dir}/{split}.bin has {len(ids)} tokens, fewer than --block_size {block_size} + 2")
    return dict(meta=meta, ids=ids, targets=None, steps=None, T=block_size, n=n)


def batch_rows(step, global_rows, n, seed, split="train"):
    """The global batch of an optimizer step: row (or window) indices from a generator seeded by
    (seed, split, step), so the data position is a function of the step (exact resume, same batch
    at any world size)."""
    g = torch.Generator().manual_seed(seed * 7_919 + step * 2 + (split == "val") + 10**9)
    return torch.randint(n, (global_rows,), generator=g)


def state_seeds(step, global_rows, seed):
    """One seed per row of the step's global batch for its s_0 draw (model.init_state(seeds=...)), from
    (seed, step): a row's noise is the same at any world size and gradient-accumulation split."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 8191 + 7)
    return torch.randint(2**62, (global_rows,), generator=g)


def labeled_length(data, rows):
    """Row data: 1 + the last position that carries a label in any of these rows (the step's global
    batch, so every rank cuts alike). Later columns are padding that a causal model never reads for
    a label: cutting them is exact, and halves the work on the depth task's train rows (train_k + 1
    of test_k + 1 columns carry labels)."""
    if data["targets"] is None:
        return data["T"]
    labeled = np.flatnonzero((data["targets"][rows.numpy()] != IGNORE_INDEX).any(0))
    return int(labeled[-1]) + 1 if len(labeled) else data["T"]


def get_batch(data, rows, device, T=None):
    """x, y (B, T) int64 and steps (B, T) or None, for the given rows of the global batch; row data
    cut to its first T columns when T is given."""
    rows = rows.numpy()
    if data["targets"] is not None:
        cut = slice(0, T or data["T"])
        x = torch.from_numpy(data["ids"][rows, cut].astype(np.int64))
        y = torch.from_numpy(data["targets"][rows, cut].astype(np.int64))
        s = None if data["steps"] is None else torch.from_numpy(data["steps"][rows, cut].astype(np.int64))
    else:
        T, ids = data["T"], data["ids"]
        xy = torch.from_numpy(np.stack([ids[i:i + T + 1] for i in rows]).astype(np.int64))
        x, y, s = xy[:, :-1], xy[:, 1:], None
    to = lambda t: None if t is None else t.to(device, non_blocking=True)
    return to(x.contiguous()), to(y.contiguous()), to(s)


class LoopLoss(torch.nn.Module):
    """The training forward as one module, so DistributedDataParallel sees every parameter use.
    The model's loss after r = n + k loops (n without grad), with the head computed only at the
    positions that carry a label (exact: the coda still sees every position). With step supervision
    (arXiv 2608.11233): the coda also reads out after every grad loop i, trained on the labels of
    positions whose step <= i; the final loop is trained on all labels (the outcome loss), and the
    per-loop losses carry weight w (annealed to 0 for outcome-only training)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y, num_steps, steps=None, w=0.0, seeds=None):
        m = self.model
        n, k = m.split_loops(num_steps)
        rope = m.rope(torch.arange(x.shape[1], device=x.device))
        e = m.run_prelude(x, rope)
        s = m.init_state(e, seeds=seeds)  # seeds (B,): this micro-batch's rows of state_seeds
        with torch.no_grad():
            for i in range(n):
                s = m.iterate(s, e, rope, i)
        labeled = y != IGNORE_INDEX  # (B, T)
        per_loop = []
        for i in range(n, n + k):
            s = m.iterate(s, e, rope, i)
            if i < n + k - 1 and steps is not None and w > 0:
                yi = y.masked_fill(steps > i + 1, IGNORE_INDEX)[labeled]  # labels reachable in i + 1 loops
                ce = F.cross_entropy(m.readout(s, rope, positions=labeled), yi, ignore_index=IGNORE_INDEX,
                                     reduction="sum")
                per_loop.append(ce / (yi != IGNORE_INDEX).sum().clamp(min=1))  # 0, not NaN, when none is reachable
        final = F.cross_entropy(m.readout(s, rope, positions=labeled), y[labeled])
        return (final + w * sum(per_loop)) / (1 + w * len(per_loop))


@torch.no_grad()
def estimate_loss(model, data, r_values, eval_iters, batch_size, device, seed, autocast):
    """Validation loss (and, for labeled data, accuracy overall and per step count k) at each r, on
    the same fixed batches every time; the global RNG is forked so evaluating never changes training."""
    from tqdm import tqdm

    model.eval()
    out = {}
    bar = tqdm(total=len(r_values) * eval_iters, desc="eval", unit="batch", leave=False, disable=None,
               dynamic_ncols=True)  # None: off without a TTY
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for r in r_values:
            bar.set_description(f"eval r={r}")
            torch.manual_seed(seed)  # the s_0 draws of the evaluation
            losses, correct, total = [], {}, {}
            for it in range(eval_iters):
                x, y, steps = get_batch(data, batch_rows(it, batch_size, data["n"], seed, "val"), device)
                with autocast:
                    logits, loss = model(x, y, num_steps=r)
                losses.append(loss.item())
                if data["targets"] is not None:  # per-position labels: accuracy, by depth when known
                    hit = (logits.argmax(-1) == y) & (y != IGNORE_INDEX)
                    group = steps if steps is not None else (y != IGNORE_INDEX).long()
                    for kk in group[y != IGNORE_INDEX].unique().tolist():
                        sel = (group == kk) & (y != IGNORE_INDEX)
                        correct[kk] = correct.get(kk, 0) + hit[sel].sum().item()
                        total[kk] = total.get(kk, 0) + sel.sum().item()
                bar.update(1)
            res = {"loss": sum(losses) / len(losses)}
            if total:
                res["acc"] = sum(correct.values()) / sum(total.values())
                if steps is not None:
                    res["acc_by_k"] = {str(kk): correct[kk] / total[kk] for kk in sorted(total)}
            out[str(r)] = res
    bar.close()
    model.train()
    return out


def adapter_norms(model):
    """Frobenius norms of the adapter's two halves, W = [W_s | W_e] on cat[s, e]: from [0 | I] the state
    half must grow for the loop to matter at all (arXiv 2608.11233 asks to show that the injection path
    receives training signal); None for a static model."""
    if not model.config.recurrent:
        return None
    W, h = model.adapter.weight.detach().float(), model.config.n_embd
    return {"state": W[:, :h].norm().item(), "embed": W[:, h:].norm().item()}


def time_ahead(model, args, step, tokens_per_step, seconds_per_flop, eval_seconds):
    """Seconds the rest of the run takes at the pace so far: the steps left at their mean r (E[r] = rbar + 1,
    by model.flops_per_token) at the seconds per FLOP measured, and the evals left at the last one's time."""
    flops = tokens_per_step * sum(model.flops_per_token(mean_recurrence_at(
        s, args.max_iters, args.mean_recurrence, args.curriculum, args.curriculum_frac) + 1, args.backprop_depth)
        for s in range(step, args.max_iters))
    evals = sum(s % args.eval_interval == 0 or s == args.max_iters for s in range(step + 1, args.max_iters + 1))
    return flops * seconds_per_flop + evals * eval_seconds


# -----------------------------------------------------------------------------
# model, optimizers, checkpoints


def build_model(args, meta, ckpt_dir=None):
    """(model, tokenizer source or None, tokenizer fingerprint or None) from --init, or on --resume from
    ckpt_dir, the verified save checkpoint.find chose (the run's tokenizer files are at the top of out_dir)."""
    init = ckpt_dir or args.init
    shape = tuple(int_list(args.shape, "--shape", n=3))  # checked by check_args
    over = {"state_init": args.state_init} if args.state_init else {}
    if init == "scratch":
        P, R, C = shape
        if args.n_embd % args.n_head:
            raise TrainError(f"--n_embd {args.n_embd} is not a multiple of --n_head {args.n_head}")
        config = RecurrentConfig(
            vocab_size=meta["vocab_size"], n_embd=args.n_embd, n_head=args.n_head,
            n_kv_head=args.n_kv_head or args.n_head, head_dim=args.n_embd // args.n_head,
            intermediate_size=args.intermediate_size or 4 * args.n_embd, block_size=args.block_size,
            n_prelude=P, n_core=R, n_coda=C, recurrent=not args.static, adapter_init=args.adapter_init,
            tie_embeddings=not args.untie, mean_recurrence=args.mean_recurrence,
            bos_id=meta.get("bos_id"), eos_id=meta.get("eos_id"), **over)
        return RecurrentGPT(config), None, None
    if os.path.isfile(os.path.join(init, "config.json")) and os.path.isfile(os.path.join(init, "model.safetensors")):
        model = RecurrentGPT.from_pretrained(init, **over)  # continue from our checkpoint (phase 2, --resume)
        with open(os.path.join(init, "config.json")) as f:
            fp = json.load(f).get("train", {}).get("data_fingerprint")
        tok_dir = args.out_dir if ckpt_dir else init
        has_tok = any(os.path.exists(os.path.join(tok_dir, n)) for n in ("tokenizer.json", "tokenizer.model", "original"))
        return model, (tok_dir if has_tok else None), fp
    if args.resume:
        raise TrainError(f"--resume: {args.out_dir} has no checkpoint (model.safetensors + config.json)")
    from plumbing import hub
    import surgery

    try:
        model, src = surgery.retrofit(init, shape=shape, layers=args.layers or None, static=args.static,
                                      untie=args.untie, adapter_init=args.adapter_init,
                                      mean_recurrence=args.mean_recurrence, **over)
    except (surgery.SurgeryError, hub.CheckpointError) as err:
        raise TrainError(str(err)) from None
    return model, src, None


def make_optimizers(model, args):
    """Muon on every 2-D matrix of the blocks and the adapter; AdamW on embeddings, head, norms and
    biases. named_parameters() lists a tied head once. Returns a list of optimizers."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    is_matrix = lambda n, p: p.ndim == 2 and n.startswith(("prelude.", "core.", "coda.", "adapter."))
    if args.optimizer == "adamw":
        groups = {"muon": [], "adamw": params}
    elif args.optimizer == "muon":
        groups = {"muon": [(n, p) for n, p in params if is_matrix(n, p)],
                  "adamw": [(n, p) for n, p in params if not is_matrix(n, p)]}
    else:
        raise TrainError(f"--optimizer must be muon or adamw, not {args.optimizer!r}")
    seen = [id(p) for _, ps in groups.items() for _, p in ps]
    assert sorted(seen) == sorted(id(p) for _, p in params) and len(set(seen)) == len(seen), \
        "optimizer split must cover every trainable parameter exactly once"
    opts = []
    if groups["muon"]:
        opts.append(Muon([p for _, p in groups["muon"]], lr=args.learning_rate, weight_decay=args.weight_decay,
                         momentum=args.muon_momentum, adjust_lr_fn=args.muon_adjust_lr))
    if groups["adamw"]:
        opts.append(torch.optim.AdamW([p for _, p in groups["adamw"]], lr=args.adam_lr, betas=(args.beta1, args.beta2),
                                      weight_decay=args.weight_decay))
    for opt in opts:
        for g in opt.param_groups:
            g["peak_lr"] = g["lr"]
    return opts, {k: [n for n, _ in v] for k, v in groups.items()}


def save_checkpoint(model, opts, step, args, fingerprint, out_dir, flops_seen=0.0, levels=None, run_info=None):
    """One atomic save of the whole run (checkpoint.save: a complete new ckpt/ directory, then one pointer
    switch). config.json records what this process really used: its flags and, under "run", the device,
    world size and gradient accumulation."""
    train_cfg = {**vars(args), "step": step, "data_fingerprint": fingerprint, "run": run_info}
    state = {"step": step, "optimizers": [o.state_dict() for o in opts], "rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
             "data": {"seed": args.seed, "next_step": step}, "args": vars(args), "flops": float(flops_seen),
             "levels": levels,  # the divergence check's running levels, so a resumed run keeps them
             # the schedules are functions of the step; stored so a reader can see where the run stood
             "schedule": {"lr_mult": get_lr(step, args.max_iters, args.warmup_iters, args.decay_frac, args.min_lr_frac),
                          "mean_recurrence": mean_recurrence_at(step, args.max_iters, args.mean_recurrence,
                                                                args.curriculum, args.curriculum_frac)}}
    checkpoint.save(out_dir, step, model, state, train_cfg)


def check_resume(args, saved, fingerprint):
    """--resume continues the run as it was: a flag that changes the model or the optimization (any key
    but RESUME_MAY_CHANGE) must equal the run's saved value, and the data must have its fingerprint.
    saved: the "train" section of the checkpoint's config.json."""
    same = lambda k, a, b: a == b or (k in ("data", "init") and os.path.realpath(str(a)) == os.path.realpath(str(b)))
    diff = [f"--{k} {getattr(args, k)!r} here, {saved[k]!r} in the run" for k in DEFAULTS
            if k not in RESUME_MAY_CHANGE and k in saved and not same(k, getattr(args, k), saved[k])]
    if saved.get("data_fingerprint") not in (None, fingerprint):
        diff.append(f"--data {args.data} has fingerprint {fingerprint} here, {saved['data_fingerprint']} in the run")
    if diff:
        raise TrainError(f"--resume: {args.out_dir} was trained with other settings: {'; '.join(diff)}. Pass the "
                         f"run's values (its config.json, under \"train\") or train into a new --out_dir")


def load_train_state(ckpt_dir, step, opts):
    """Optimizer states and RNG of a verified save (checkpoint.find), loaded as tensors and plain data only."""
    state = checkpoint.load_state(ckpt_dir)
    if state.get("step") != step:
        raise TrainError(f"--resume: {ckpt_dir}/train_state.pt is of step {state.get('step')}, its manifest of {step}")
    if len(state["optimizers"]) != len(opts):
        raise TrainError("--resume: the checkpoint was trained with another --optimizer")
    for o, sd in zip(opts, state["optimizers"]):
        o.load_state_dict(sd)
    torch.set_rng_state(state["rng"])
    return state


def trim_log(path, step):
    """--resume from step: drop what the dead process logged after its last save (and a line torn by the
    kill). Those steps are redone exactly; kept, log.jsonl would hold them twice. One atomic rewrite."""
    if not os.path.isfile(path):
        return
    keep = []
    with open(path) as f:
        for line in f:
            try:
                if json.loads(line)["step"] <= step:
                    keep.append(line)
            except (ValueError, KeyError, TypeError):
                pass
    with open(path + ".tmp", "w") as f:
        f.writelines(keep)
    os.replace(path + ".tmp", path)


def diverged(loss, level, factor):
    """A loss far above its running level: over factor x and over 1 nat above it (the margin keeps
    near-zero losses, whose ratios are noise, e.g. an r=1 step of a solved task, from tripping it)."""
    return factor > 0 and (not math.isfinite(loss) or (loss > factor * level and loss > level + 1.0))


def on_disk(out_dir):
    """What a stopped run leaves: said exactly, never a 'last good checkpoint' that was not written."""
    _, step = checkpoint.current(out_dir)
    return f"the checkpoint of step {step} in {out_dir} is untouched" if step is not None else \
        f"{out_dir} holds no checkpoint"


# -----------------------------------------------------------------------------


def train(args):
    try:  # a file in the way or a read-only disk: say so now, not at the first checkpoint
        ready_out_dir(args.out_dir)
    except ValueError as err:
        raise TrainError(str(err)) from None
    ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun
    if ddp:
        import torch.distributed as dist

        local_rank = int(os.environ["LOCAL_RANK"])
        use_cuda = torch.cuda.is_available() and args.device in ("auto", "cuda")
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
        if use_cuda:
            torch.cuda.set_device(device)
    else:
        rank, world = 0, 1
        device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    master = rank == 0
    # one process owns out_dir: a second refuses; the kernel drops the lock when this one ends, killed or not
    run_lock = checkpoint.lock(args.out_dir) if master else None  # noqa: F841 (held while the file is open)
    # one place decides precision: bf16 autocast with fp32 master weights on CUDA, plain fp32 on CPU
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()

    # data first: its vocabulary sizes a scratch model, and its fingerprint must match the model's tokenizer
    try:
        train_data = open_data(args.data, "train", args.block_size)
        val_data = open_data(args.data, "val", args.block_size)
    except (FileNotFoundError, ValueError) as err:  # not prepared, truncated or mismatched files: the message says which
        raise TrainError(str(err)) from None
    meta = train_data["meta"]
    if args.step_supervision and train_data["steps"] is None:
        raise TrainError(f"--step_supervision needs per-step labels ({args.data}/train_step.bin), e.g. data/depth")

    torch.manual_seed(args.seed)
    ckpt_dir = ckpt_step = None
    if args.resume:  # the newest complete save, and the settings it was trained with
        ckpt_dir, ckpt_step = checkpoint.find(args.out_dir)
        if master:  # what a save killed after its commit left (the next save would, but there may be none)
            checkpoint.remove_stale(args.out_dir, keep=ckpt_dir)
        with open(os.path.join(ckpt_dir, "config.json")) as f:
            check_resume(args, json.load(f).get("train", {}), meta["fingerprint"])
    model, tok_src, ckpt_fp = build_model(args, meta, ckpt_dir)
    if tok_src is not None:
        from data.common import check_tokenizer
        from plumbing.tokenizer import load_tokenizer

        try:
            check_tokenizer(meta, load_tokenizer(tok_src).fingerprint, data_dir=args.data, model_tokenizer=tok_src)
        except ValueError as err:
            raise TrainError(str(err)) from None
    elif ckpt_fp is not None and ckpt_fp != meta["fingerprint"]:
        raise TrainError(f"data {args.data} (fingerprint {meta['fingerprint']}) is not the vocabulary this "
                         f"checkpoint was trained on (fingerprint {ckpt_fp}): prepare the data with its tokenizer")
    if meta["vocab_size"] > model.config.vocab_size:
        raise TrainError(f"data vocab_size {meta['vocab_size']} > model vocab_size {model.config.vocab_size}")
    model.to(device)

    if args.freeze == "base":  # the adapter-only budget: the parent's weights stay as they are
        if not model.config.recurrent:
            raise TrainError("--freeze=base trains only the adapter, which a --static model does not have")
        for n, p in model.named_parameters():
            p.requires_grad = n.startswith("adapter.") or (args.train_norms and p.ndim == 1 and "norm" in n)
    opts, split = make_optimizers(model, args)
    state = load_train_state(ckpt_dir, ckpt_step, opts) if args.resume else {}
    step, flops_seen = state.get("step", 0), state.get("flops", 0.0)
    # running levels of the divergence check: EMA of the train loss over good steps, best eval loss so far
    levels = state.get("levels") or {"loss": None, "steps": 0, "val": None}

    if args.compile:  # the blocks only: the loop over r has a data-dependent length
        for block in (*model.prelude, *model.core, *model.coda):
            block.compile()
    wrapped = LoopLoss(model)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(wrapped, device_ids=[device.index] if device.type == "cuda" else None)

    T = train_data["T"]
    micro_tokens = args.batch_size * T
    total = args.total_batch_tokens or micro_tokens * world
    if total % (micro_tokens * world):
        raise TrainError(f"--total_batch_tokens {total} is not a multiple of batch_size*T*world = {micro_tokens * world}")
    grad_accum = total // (micro_tokens * world)
    eval_r = int_list(args.eval_r, "--eval_r") if model.config.recurrent else [1]
    trainable = [p for p in model.parameters() if p.requires_grad]
    run_info = {"git": git_commit(short=True), "torch": torch.__version__, "world_size": world, "grad_accum": grad_accum,
                "tokens_per_step": total, "device": str(device), "params": model.param_counts(),
                "optimizer_split": {k: len(v) for k, v in split.items()}}
    if master:
        print("config:", json.dumps(vars(args)))
        print("run:", json.dumps(run_info))
        os.makedirs(args.out_dir, exist_ok=True)
        if tok_src is not None and os.path.abspath(tok_src) != os.path.abspath(args.out_dir):
            from plumbing.tokenizer import save_tokenizer_files

            save_tokenizer_files(tok_src, args.out_dir)  # so the checkpoint dir works as --init for every script
        if args.resume:
            trim_log(os.path.join(args.out_dir, "log.jsonl"), step)
        log = open(os.path.join(args.out_dir, "log.jsonl"), "a")
        log.write(json.dumps({"step": step, "config": vars(args), "run": run_info}) + "\n")
    from tqdm import tqdm

    bar = tqdm(total=args.max_iters, initial=step, disable=None if master else True, dynamic_ncols=True)  # None: off without a TTY
    start_step, tokens_seen, bad_in_row, t_start = step, step * total, 0, time.time()
    t_saved, timed_s, timed_flops, eval_s = t_start, 0.0, 0.0, 0.0  # the checkpoint timer; the pace so far
    while True:
        # evaluate and save; a resumed run's first step was evaluated (and logged) before its save
        evaluate = (step % args.eval_interval == 0 or step == args.max_iters) and not (args.resume and step == start_step)
        if evaluate:
            if master:
                t_eval = time.time()
                val = estimate_loss(model, val_data, eval_r, args.eval_iters, args.batch_size, device, args.seed, autocast)
                eval_s = time.time() - t_eval
                adapter = adapter_norms(model)
                log.write(json.dumps({"step": step, "val": val, **({"adapter": adapter} if adapter else {})}) + "\n")
                log.flush()
                bar.write(f"step {step}: " + ", ".join(
                    f"r={r} val {v['loss']:.4f}" + (f" acc {v['acc']:.3f}" if "acc" in v else "") for r, v in val.items())
                    + (f"; adapter |W_s| {adapter['state']:.2f}, |W_e| {adapter['embed']:.2f}" if adapter else ""))
                # the model about to be saved: its loss at its best r must not be far above the best so far
                best = min((v["loss"] for v in val.values() if math.isfinite(v["loss"])), default=float("nan"))
                if levels["val"] is not None and diverged(best, levels["val"], args.diverge_factor):
                    raise TrainError(f"step {step}: validation loss {best:.4g} (best r) is over {args.diverge_factor:g}x "
                                     f"the best so far, {levels['val']:.4g} (--diverge_factor): the run diverged; not "
                                     f"saved, {on_disk(args.out_dir)} (lower the lr?)")
                if math.isfinite(best):  # a model that was never finite has no level to diverge from
                    levels["val"] = best if levels["val"] is None else min(levels["val"], best)
        # save at every eval, and between evals every --ckpt_minutes: the default CPU run (1-3 min a step on 2 shared
        # cores, evals every 50 steps) has a checkpoint within minutes, not after an hour or two. An eval's val loss
        # vouches for the weights it saves; a save between evals waits for the next step's loss (below)
        if master and evaluate and step > start_step and bad_in_row == 0:  # not the step just loaded, nor after skips
            save_checkpoint(model, opts, step, args, meta["fingerprint"], args.out_dir, flops_seen, levels, run_info)
            t_saved = time.time()
        save_due = not evaluate and args.ckpt_minutes > 0 and time.time() - t_saved >= 60 * args.ckpt_minutes
        if step >= args.max_iters:
            break

        # one optimizer step: lr schedule, the step's r (same on every rank), grad accumulation
        t0 = time.time()
        lr_mult = get_lr(step, args.max_iters, args.warmup_iters, args.decay_frac, args.min_lr_frac)
        for o in opts:
            for g in o.param_groups:
                g["lr"] = g["peak_lr"] * lr_mult
        mean_r = mean_recurrence_at(step, args.max_iters, args.mean_recurrence, args.curriculum, args.curriculum_frac)
        r = sample_num_steps(step, mean_r, args.recurrence_sigma, args.seed) if model.config.recurrent else 1
        num_steps = (max(r - args.backprop_depth, 0), min(r, args.backprop_depth))
        w = 0.0
        if args.step_supervision:  # full weight, then linear fade over the last anneal fraction
            fade_start = args.max_iters * (1 - args.step_supervision_anneal)
            w = 1.0 if step < fade_start else max(0.0, 1 - (step - fade_start) / (args.max_iters - fade_start))
        rows = batch_rows(step, args.batch_size * world * grad_accum, train_data["n"], args.seed)
        seeds = state_seeds(step, len(rows), args.seed)
        T_step = labeled_length(train_data, rows)
        loss_sum = torch.zeros((), device=device)
        for micro in range(grad_accum):
            lo = (micro * world + rank) * args.batch_size
            x, y, steps = get_batch(train_data, rows[lo:lo + args.batch_size], device, T_step)
            sync = not ddp or micro == grad_accum - 1
            with (contextlib.nullcontext() if sync else wrapped.no_sync()), autocast:
                loss = wrapped(x, y, num_steps, steps, w, seeds[lo:lo + args.batch_size]) / grad_accum
            loss.backward()
            loss_sum += loss.detach()
        if ddp:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, args.grad_clip if args.grad_clip > 0 else float("inf"))
        bad = not (math.isfinite(loss_sum.item()) and math.isfinite(grad_norm.item()))
        # a finite loss far above its running level: not saved; --diverge_steps of them in a row are a divergence
        # (one alone is the r of the step: at r = 1 a model trained with per-loop supervision reads out after one
        # loop, 1.24 against a running level of 0.07 in a from-scratch depth run)
        spike = not bad and levels["steps"] >= 5 and diverged(loss_sum.item(), levels["loss"], args.diverge_factor)
        levels["spikes"] = levels.get("spikes", 0) + 1 if spike else 0
        if master and save_due and not bad and not spike and step > start_step and bad_in_row == 0:
            # the weights of `step` before this step's update, now that their loss showed they did not diverge
            save_checkpoint(model, opts, step, args, meta["fingerprint"], args.out_dir, flops_seen, levels, run_info)
            t_saved = time.time()
        if bad:  # skip: no update; grads are identical on every rank after the all-reduce, so all ranks agree
            bad_in_row += 1
        else:
            bad_in_row = 0
            for o in opts:
                o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)
        step += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.time() - t0
        # FLOPs of the tokens processed: row data cut to its labeled columns counts only those
        step_flops = model.flops_per_token(r, args.backprop_depth) * total * T_step // T
        tokens_seen += total
        flops_seen += step_flops
        timed_s, timed_flops = timed_s + dt, timed_flops + model.flops_per_token(r, args.backprop_depth) * total
        rec = {"step": step, "loss": loss_sum.item(), "r": r, "mean_r": mean_r, "tokens": tokens_seen,
               "flops": flops_seen, "tokens_per_sec": total / dt, "lr_mult": lr_mult, "grad_norm": grad_norm.item(),
               "dt": dt, "elapsed": time.time() - t_start}
        if args.step_supervision:
            rec["step_weight"] = w
        if args.peak_flops > 0:
            rec["mfu"] = step_flops / dt / (args.peak_flops * world)
        if bad:
            rec["skipped"] = True
        if master:
            log.write(json.dumps(rec) + "\n")
            log.flush()
            bar.update(1)
            bar.set_postfix(loss=f"{rec['loss']:.4f}", r=r, tok_s=f"{rec['tokens_per_sec']:.0f}")
            if bad:
                bar.write(f"step {step}: loss {rec['loss']} grad norm {rec['grad_norm']}: not finite, step skipped "
                          f"({bad_in_row} in a row)")
            elif step % args.log_interval == 0:
                mfu = f", mfu {rec['mfu'] * 100:.1f}%" if "mfu" in rec else ""
                bar.write(f"step {step}: loss {rec['loss']:.4f}, r {r} (mean {mean_r}), {rec['tokens_per_sec']:.0f} tok/s"
                          f", {dt * 1000:.0f} ms{mfu}")
            if step == start_step + 3 and step < args.max_iters:  # the first steps set the pace: say what is ahead
                ahead = time_ahead(model, args, step, total, timed_s / timed_flops, eval_s)
                ahead = f"{ahead / 60:.0f} min" if ahead >= 120 else f"{ahead:.0f} s"
                bar.write(f"~{ahead} for the {args.max_iters - step} steps left at this pace "
                          f"({timed_s / 3:.2g} s a step so far" + (f", {eval_s:.2g} s an eval)" if eval_s else ")"))
        if bad_in_row >= args.max_bad_steps:
            raise TrainError(f"{bad_in_row} steps in a row had a NaN/inf loss or gradient (step {step}): stopping; "
                             f"{on_disk(args.out_dir)} (lower the lr?)")
        if levels["spikes"] >= args.diverge_steps:  # nothing of them was saved
            raise TrainError(f"step {step}: loss {rec['loss']:.4g} is over {args.diverge_factor:g}x its running "
                             f"level {levels['loss']:.4g} for {levels['spikes']} steps in a row (--diverge_factor, "
                             f"--diverge_steps): the run diverged, stopping; {on_disk(args.out_dir)} (lower the lr?)")
        if not bad and not spike:  # the running level: an EMA of the good steps' losses
            levels["loss"] = rec["loss"] if levels["steps"] == 0 else 0.9 * levels["loss"] + 0.1 * rec["loss"]
            levels["steps"] += 1
    bar.close()
    if master:
        log.close()
        summarize(args.out_dir, start_step, step, time.time() - t_start)
    if ddp:
        dist.destroy_process_group()


def summarize(out_dir, start_step, step, seconds):
    """The run's end: the loss curve (train loss per step, validation loss at each r) as loss.png, and a
    few printed lines to read without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(out_dir, "log.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    train = [(r["step"], r["loss"]) for r in recs if "loss" in r and not r.get("skipped")]
    evals = [r for r in recs if "val" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), lw=0.8, alpha=0.6, label="train (sampled r)")
    for r in (evals[-1]["val"] if evals else {}):
        pts = [(e["step"], e["val"][r]["loss"]) for e in evals if r in e["val"]]
        ax.plot(*zip(*pts), marker="o", label=f"val, r={r}")
    ax.set(xlabel="step", ylabel="loss", title=os.path.basename(os.path.abspath(out_dir)))
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "loss.png"), dpi=120)
    plt.close(fig)
    print(f"done: steps {start_step} -> {step} in {seconds:.0f} s; checkpoint, log.jsonl and loss.png in {out_dir}")
    if evals:
        first, last = evals[0], evals[-1]
        for r in last["val"]:
            v0, v1 = first["val"].get(r, {}), last["val"][r]
            acc = f", acc {v0.get('acc', float('nan')):.3f} -> {v1['acc']:.3f}" if "acc" in v1 else ""
            print(f"  val r={r}: loss {v0.get('loss', float('nan')):.4f} (step {first['step']}) -> {v1['loss']:.4f} "
                  f"(step {last['step']}){acc}")


def main(argv=None):
    args = None
    try:
        args = parse_args(argv)
        train(args)
    except (TrainError, checkpoint.RunDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C: stop where the run is, without writing a checkpoint mid-step
        where = on_disk(args.out_dir) if args is not None else "nothing was started"
        print(f"error: interrupted (Ctrl-C): {where}", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
