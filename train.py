"""
Train a recurrent-depth model: heal a retrofitted parent, or train a small one from scratch.

The recipe of McLeish et al. 2025 (arXiv 2511.07384, "retrofitted recurrence"): each optimizer step
draws a loop count r from a Poisson-lognormal around a mean rbar (r = Poisson(exp(tau)) + 1,
tau ~ N(log rbar - sigma^2/2, sigma)), seeded by the step so every rank agrees; rbar can follow a
curriculum (linear or 1-sqrt) up to its final value; only the last k loops keep activations for
backprop (truncated backprop, k = --grad_loops, 8). Muon trains every 2-D block matrix and the
adapter, AdamW the embeddings, head, norms and biases, under a warmup-stable-decay schedule.
--step_supervision adds the per-loop readout loss of arXiv 2608.11233: after loop i the coda reads
out and is trained on the labels of task depth <= i (data with DIR/{split}_step.bin).

    python train.py                                       # offline default: SmolLM2 (6,8,6) on data/sotu
    python data/depth/prepare.py --out_dir data/depth && python train.py --config config/cpu_depth.json
    python train.py --init=llama --shape 4,6,4 --data data/fineweb_edu --out_dir out/phase1
    torchrun --standalone --nproc_per_node=8 train.py --config config/llama_4_6_4.json [--fsdp]  # phase 1
    python train.py --resume                              # continue out/ where it stopped (RESUME_MAY_CHANGE)
    torchrun --max-restarts 3 ... train.py --resume auto  # resume when out/ holds a save; SIGTERM saves, exits 75

Outputs in --out_dir: model.safetensors + config.json (run config under "train"), tokenizer files,
train_state.pt (optimizers, step, RNG), log.jsonl (one line per optimizer step and per eval). The first
three are links into the current save under ckpt/, switched together by one atomic rename
(plumbing/checkpoint.py); one process at a time owns the directory (.lock); a loss that diverges stops
the run before it is saved (plumbing/guards.py). The batches (plumbing/batches.py) and the run directory
(plumbing/run_dir.py) are functions a reader of the recipe may skip.
"""

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from plumbing import checkpoint, guards, preempt, run_dir
from plumbing.batches import accumulation, batch_rows, estimate_loss, get_batch, labeled_length, open_splits, state_seeds
from plumbing.build_model import build_model
from plumbing.cli import config_defaults, flag_parser, int_list
from plumbing.device import compile_blocks, precision_context, setup, train_precision
from plumbing.kl_parent import ParentKL
from plumbing.run_flags import SYSTEM_FLAGS, SYSTEM_MAY_CHANGE, check_flags
from plumbing.upload import push_to_hub
from model import RecurrentGPT
from exit_gate import gate_loss
from muon import make_optimizers

# -----------------------------------------------------------------------------
# defaults: the offline CPU run. Every key can be set by --config FILE (JSON) or --key=value / --key value.
# One table of (default, what it means[, the values allowed]): DEFAULTS, the --help texts and the choices are all
# read off it. --help lists the recipe's flags first, then those of the run.
RECIPE_FLAGS = dict(
    # the model: the parent and its cut
    init=("smollm2", 'parent (short name, hub id, dir, .gguf), a checkpoint dir to continue from, or "scratch"'),
    shape=("6,8,6", "P,R,C: prelude, core, coda layers (a mild cut of SmolLM2's 30 layers)"),
    layers=("", "explicit parent layer map, e.g. 0-3,6-11,12-15 (overrides --shape)"),
    static=(False, "the non-recurrent baseline: the same layers run once (P+R+C = all layers: the whole parent)"),
    adapter_init=("identity", "identity [0 | I] (r=1 equals the layer-dropped parent) | sum | random",
                  ("identity", "sum", "random")),
    first_loop=("", 'what loop 1 feeds the core: adapter (on cat[s_0, e]) | identity (e itself, the adapter from '
                    'loop 2: with every layer kept r=1 is the parent, arXiv 2608.11233); "" keeps the model\'s own '
                    '(adapter for a new cut)', ("", "adapter", "identity")),
    state_init=("", 's_0: normal | zero | embed; "" keeps the model\'s own', ("", "normal", "zero", "embed")),
    untie=(False, "untie the head from the embedding (the published retrofits do)"),
    n_embd=(64, "--init=scratch: width h"),
    n_head=(4, "--init=scratch: attention heads"),
    n_kv_head=(0, "--init=scratch: key/value heads (0: n_head)"),
    intermediate_size=(0, "--init=scratch: MLP width (0: 4 n_embd)"),
    # the recipe: recurrence
    mean_recurrence=(4, "rbar: each step draws r = Poisson(exp(tau)) + 1, E[exp(tau)] = rbar (E[r] = rbar + 1); "
                        "saved as the model's default r at inference (config.json mean_recurrence)"),
    recurrence_sigma=(0.5, "std of tau, tau ~ N(log rbar - sigma^2/2, sigma)"),
    backprop_depth=(8, "the grad loops k: only the last k loops of r keep activations (truncated backprop); "
                       "saved under its older name backprop_depth"),
    curriculum=("constant", "rbar over the first --curriculum_frac of max_iters: constant | linear | 1-sqrt",
                ("constant", "linear", "1-sqrt")),
    curriculum_frac=(0.25, "fraction of max_iters that the curriculum takes to reach --mean_recurrence"),
    step_supervision=(False, "per-loop readout loss (arXiv 2608.11233; needs DIR/train_step.bin, e.g. data/depth)"),
    step_supervision_anneal=(0.0, "last fraction of steps fading to outcome-only loss"),
    # the recipe: optimization
    max_iters=(100, "optimizer steps"),
    optimizer=("muon", "muon (paper: Muon on block matrices and adapter, AdamW on the rest) | adamw (AdamW on all)",
               ("muon", "adamw")),
    learning_rate=(1e-3, "Muon's peak lr"),
    adam_lr=(5e-5, "AdamW's peak lr (embeddings, head, norms, biases; everything with --optimizer adamw)"),
    weight_decay=(1e-4, "decoupled weight decay of both optimizers"),
    beta1=(0.9, "AdamW beta1"),
    beta2=(0.95, "AdamW beta2"),
    muon_momentum=(0.95, "Muon's momentum"),
    muon_adjust_lr=("original", "torch.optim.Muon's adjust_lr_fn: original | match_rms_adamw",
                    ("original", "match_rms_adamw")),
    warmup_iters=(10, "warmup-stable-decay: steps of linear warmup"),
    decay_frac=(0.2, "warmup-stable-decay: last fraction of max_iters with linear decay"),
    min_lr_frac=(0.0, "warmup-stable-decay: the lr at the end, as a fraction of the peak"),
    grad_clip=(1.0, "clip the gradient norm to this; 0 = no clipping"),
    freeze=("none", "none | base (only the adapter, and norms with --train_norms, train) | outer (only the core's "
            "blocks and the adapter train: a retrofit in place keeps its prelude, coda and embeddings)",
            ("none", "base", "outer")),
    train_norms=(False, "with --freeze base or outer: the RMSNorm weights train too"),
    kl_parent=(0.0, "W: the loss gains W * KL(parent || model) at r = 1 on text (plumbing/kl_parent.py), for a "
               "retrofit in place"),
    kl_data=("", "with --kl_parent: plain-text data dir in the model's tokens (its train split)"),
    kl_init=("", "with --kl_parent: the parent's checkpoint (default --init)"),
    kl_rows=(2, "with --kl_parent: text windows a step"),
    kl_len=(128, "with --kl_parent: tokens a window"),
    exit_gate=(False, "train only a learned exit gate (exit_gate.py) on the frozen recurrent --init checkpoint"),
    exit_gate_r=(32, "with --exit_gate: the loops of the trajectory the gate learns on"),
)
RUN_FLAGS = dict(
    config=("", "JSON file of defaults; command-line flags override it"),
    # data
    data=("data/sotu", "a prepared data dir (data/*/prepare.py)"),
    out_dir=("out", "checkpoint, log.jsonl, loss.png (nanoGPT's out/: where sample.py looks by default)"),
    batch_size=(4, "micro-batch rows per rank"),
    block_size=(256, "tokens per row (row data uses its seq_len)"),
    total_batch_tokens=(0, "tokens per optimizer step over all ranks (gradient accumulation); 0 = one micro-batch"),
    # evaluation, logging (the run's machinery, plumbing/run_flags.py, below them in --help)
    eval_interval=(50, "evaluate (and save) every N steps, and at the end"),
    eval_iters=(2, "validation batches per r"),
    eval_r=("1,4,8,32", "loop counts to evaluate (an r=32 eval costs 13x a parent forward on CPU)"),
    log_interval=(1, "print a line every N steps"),
    seed=(1337, "seeds the data order, r and s_0 draws, and a scratch model's init"),
    resume=(False, "continue the run in --out_dir exactly where it stopped, with its flags: only max_iters, eval_*, "
                   "log_interval, ckpt_minutes, device, compile, max_bad_steps, diverge_*, peak_flops and autocast "
                   "(keeping the run's precision) may differ; auto: continue when --out_dir holds a complete "
                   "checkpoint, start fresh when it holds none (a requeued job, torchrun's restarts)",
            (False, True, "auto")),
)
FLAGS = {**RECIPE_FLAGS, **RUN_FLAGS, **SYSTEM_FLAGS}
FLAG_NAMES = {"backprop_depth": "grad_loops"}  # the command-line name of a flag saved under an older key
DEFAULTS = {key: default for key, (default, *_) in FLAGS.items()}
CHOICES = {key: entry[2] for key, entry in FLAGS.items() if len(entry) > 2}
# --resume continues the run as it was: every key must equal the run's saved value (config.json, "train"),
# except these, which change neither the model nor the optimizer (max_iters does move the decay and the
# curriculum that are fractions of it: that is how a run is extended)
RESUME_MAY_CHANGE = ("config", "resume", "out_dir", "max_iters", "eval_interval", "eval_iters", "eval_r",
                     "log_interval", *SYSTEM_MAY_CHANGE)


class TrainError(Exception):
    """An expected failure (bad flag, missing data, mismatched tokenizer): printed as one line."""


def parse_args(argv=None):
    """DEFAULTS <- --config FILE <- command line. Unknown keys anywhere are an error; flag values are
    checked here (plumbing/run_flags.py check_flags), before any data or model loads."""
    parser = flag_parser(__doc__.split("\n\n")[0], {"the recipe": RECIPE_FLAGS, "the run": RUN_FLAGS,
                                                   "the run's machinery": SYSTEM_FLAGS}, FLAG_NAMES)
    try:
        config_defaults(parser, argv, DEFAULTS, FLAG_NAMES)
    except ValueError as err:
        raise TrainError(str(err)) from None
    args = parser.parse_args(argv)
    try:
        return check_flags(args, CHOICES)
    except ValueError as err:
        raise TrainError(str(err)) from None


# -----------------------------------------------------------------------------
# small named functions: recurrence sampling, curriculum, lr schedule, per-loop weight


def sample_num_steps(step, mean_r, sigma=0.5, seed=0):
    """r = Poisson(exp(tau)) + 1, tau ~ N(log(mean_r) - sigma^2/2, sigma): E[exp(tau)] = mean_r, so
    E[r] = mean_r + 1. Drawn from a generator seeded by (seed, step) alone, so all ranks (and a resumed
    run) draw the same r."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    tau = torch.normal(math.log(mean_r) - sigma**2 / 2, sigma, (1,), generator=g)
    return int(torch.poisson(torch.exp(tau), generator=g).item()) + 1


def sample_loops(step, args, recurrent=True):
    """This step's loops: r drawn around the curriculum's rbar (sample_num_steps; 1 for a static model, a fixed
    --exit_gate_r for the gate, which learns on whole trajectories), and its split for truncated backprop:
    (no-grad loops, grad loops) = (max(r - k, 0), min(r, k)), k = --backprop_depth."""
    mean_r = schedule_at(step, args)["mean_recurrence"]
    r = sample_num_steps(step, mean_r, args.recurrence_sigma, args.seed) if recurrent else 1
    r = args.exit_gate_r if args.exit_gate else r
    return r, (max(r - args.backprop_depth, 0), min(r, args.backprop_depth))


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


def schedule_at(step, args):
    """Where the schedules stand at a step (both are functions of it): the lr multiple and rbar."""
    return {"lr_mult": get_lr(step, args.max_iters, args.warmup_iters, args.decay_frac, args.min_lr_frac),
            "mean_recurrence": mean_recurrence_at(step, args.max_iters, args.mean_recurrence, args.curriculum,
                                                  args.curriculum_frac)}


def depth_weight_at(step, args):
    """w of the per-loop losses (--step_supervision, arXiv 2608.11233): full weight, then a linear fade to
    outcome-only training over the last --step_supervision_anneal of the run; 0 without it."""
    if not args.step_supervision:
        return 0.0
    fade_start = args.max_iters * (1 - args.step_supervision_anneal)
    return 1.0 if step < fade_start else max(0.0, 1 - (step - fade_start) / (args.max_iters - fade_start))


# -----------------------------------------------------------------------------
# the training loop


@dataclass
class Run:
    """What the training loop reads and changes; start_run builds it once."""

    # where it runs
    device: torch.device
    rank: int  # torchrun's rank (0: the master, which logs and saves) among world processes
    world: int
    ddp: bool  # under torchrun
    autocast: object  # bf16 autocast with fp32 weights, or a null context (plumbing/device.py)
    # what it trains and on what
    model: RecurrentGPT
    kl: object  # plumbing/kl_parent.py's ParentKL under --kl_parent, else None
    ddp_model: torch.nn.Module  # what the forward runs through: DDP's wrap of the model, or the model
    opts: list  # Muon and AdamW (muon.make_optimizers)
    trainable: list  # their parameters
    train_data: dict  # plumbing/batches.py open_splits
    val_data: dict  # the dev split
    T: int  # tokens a row
    tokens_per_step: int  # over all ranks and micro-batches
    grad_accum: int  # micro-batches of each rank a step
    # where it writes
    save: object  # save(step): a complete checkpoint (plumbing/checkpoint.py), returns its time
    log: object  # the master's log.jsonl (None on the other ranks)
    bar: object  # the progress bar
    lock: object  # out_dir's lock, held until the end
    # what moves
    step: int  # the optimizer step about to run
    start_step: int  # where this process started (a --resume's step, else 0)
    tokens: int
    flops: float  # train.py's FLOP count so far (model.flops_per_token)
    levels: dict  # the guards' running levels (plumbing/guards.py)
    bad_in_row: int = 0  # NaN/inf steps in a row (each skipped)
    t_start: float = field(default_factory=time.time)  # the run's clock
    t_saved: float = field(default_factory=time.time)  # the last save's time
    timed_s: float = 0.0  # the pace so far: seconds and FLOPs of the timed steps, the last eval's seconds
    timed_flops: float = 0.0
    eval_s: float = 0.0

    @property
    def master(self):
        return self.rank == 0


def train(args):
    run = start_run(args)  # device, data, model and optimizers (or the --resume's save), the run directory
    saver = run.master or args.fsdp  # who evaluates and saves: the master, or under --fsdp every rank (its shard)
    while True:
        stop = preempt.agreed(run.device)  # SIGTERM/SIGUSR1 on any rank: every rank saves this step and exits
        # evaluate and save; a resumed run's first step was evaluated (and logged) before its save
        evaluating = (run.step % args.eval_interval == 0 or run.step == args.max_iters) and \
            not (args.resume and run.step == run.start_step)
        if evaluating and saver:
            run.eval_s = evaluate(run, args)
        if saver and should_save(run, at_eval=evaluating, due=stop):  # a preemption cannot wait for the next loss
            run.t_saved = run.save(run.step)
        due = not evaluating and save_due(run, args)
        if run.step >= args.max_iters:
            break
        if stop:
            preempt.leave(stop, run.step, args.out_dir)  # the ranks meet after the save; raises preempt.Preempted
        # one optimizer step: r and its split into loops without and with gradient, forward and backward
        t0 = time.time()
        r, num_steps = sample_loops(run.step, args, run.model.config.recurrent)
        out = train_step(run, args, r, num_steps)
        bad, spike = guards.judge(run.levels, out["loss"], out["grad_norm"], args.diverge_factor)
        if saver and should_save(run, at_eval=False, due=due, sound=not bad and not spike):
            run.t_saved = run.save(run.step)  # the weights of this step before its update, their loss now seen
        apply_update(run, out, bad, args)  # the optimizers' step (not for a NaN/inf one), the collapse guard
        rec = log_step(run, out, time.time() - t0, bad, args)
        guards.track(run.levels, rec, bad, spike, run.bad_in_row, args)  # stop on NaNs or a divergence
    run.bar.close()
    if run.master:  # loss.png and the last lines; the lock goes
        run_dir.finish(run.log, run.lock, args.out_dir, run.start_step, run.step, time.time() - run.t_start)
    if run.ddp:
        dist.destroy_process_group()


def train_step(run, args, r, num_steps):
    """Forward and backward of one optimizer step of r loops, num_steps = (no-grad loops, grad loops): the lr
    schedule, gradient accumulation over the micro-batches, clipping. The update itself waits for the guards
    (apply_update). Returns what they and the log need."""
    step, model = run.step, run.model
    sched, w = schedule_at(step, args), depth_weight_at(step, args)
    for g in (g for o in run.opts for g in o.param_groups):
        g["lr"] = g["peak_lr"] * sched["lr_mult"]
    rows = batch_rows(step, args.batch_size * run.world * run.grad_accum, run.train_data["n"], args.seed)
    seeds, T_step = state_seeds(step, len(rows), args.seed), labeled_length(run.train_data, rows)
    loss_sum = torch.zeros((), device=run.device)
    for micro in range(run.grad_accum):
        at = (micro * run.world + run.rank) * args.batch_size
        mine = slice(at, at + args.batch_size)
        x, y, depths = get_batch(run.train_data, rows[mine], run.device, T_step)
        # DDP all-reduces in the last micro-batch's backward only; the head reads out at labeled positions only
        last = micro == run.grad_accum - 1
        sync = run.ddp_model.no_sync() if run.ddp_model is not model and not last else contextlib.nullcontext()
        with sync, run.autocast:
            if args.exit_gate:  # the frozen model's trajectory, the gate's loss (exit_gate.py)
                loss = gate_loss(model, x, y, r, seeds[mine]) / run.grad_accum
            else:
                loss = run.ddp_model(x, y, num_steps, seeds=seeds[mine], depths=depths, depth_weight=w,
                                     labeled_only=True)[1] / run.grad_accum
        # an r = 1 step of a first_loop "identity" model never runs the adapter: under --freeze base nothing that
        # trains is on the loss's path, so there is no backward (and no gradient: not a zero one, no collapse)
        if loss.requires_grad:
            loss.backward()
        loss_sum += loss.detach()
    kl = None
    if run.kl is not None:  # towards the parent's distribution on text, once a step (one process: check_flags)
        with run.autocast:
            kl = run.kl.loss(model, step)
        (args.kl_parent * kl).backward()
        kl = kl.item()
    if run.ddp:
        dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.trainable, args.grad_clip if args.grad_clip > 0 else float("inf"))
    return dict(loss=loss_sum.item(), kl=kl, grad_norm=grad_norm.item(), r=r, mean_r=sched["mean_recurrence"],
                lr_mult=sched["lr_mult"], w=w, T_step=T_step, reached=any(p.grad is not None for p in run.trainable))


def apply_update(run, out, bad, args):
    """The optimizer step, skipped for a NaN/inf step (grads are the same on every rank after the all-reduce);
    then the collapse guard: a blown-up or dead model is never evaluated, saved or trained on."""
    run.bad_in_row = run.bad_in_row + 1 if bad else 0
    norm_before = guards.weight_norm(run.trainable) if not bad and not args.fsdp else None
    for o in run.opts:
        if not bad:
            o.step()
        o.zero_grad(set_to_none=True)
    run.step += 1
    if norm_before is not None:
        guards.check_collapse(run.step, out["loss"], out["grad_norm"], norm_before, guards.weight_norm(run.trainable),
                              args.collapse_factor, args.out_dir, reached=out["reached"])
    if run.device.type == "cuda":  # the step's time, not its launch
        torch.cuda.synchronize()


def log_step(run, out, dt, bad, args):
    """Count the step's tokens and FLOPs (row data cut to its labeled columns counts only those), print and log
    its line, and after the first three steps say how long the rest will take. Returns the log record."""
    per_token, total = run.model.flops_per_token(out["r"], args.backprop_depth), run.tokens_per_step
    step_flops = per_token * total * out["T_step"] // run.T
    run.tokens, run.flops = run.tokens + total, run.flops + step_flops
    run.timed_s, run.timed_flops = run.timed_s + dt, run.timed_flops + per_token * total
    rec = {"step": run.step, "loss": out["loss"], "r": out["r"], "mean_r": out["mean_r"], "tokens": run.tokens,
           "flops": run.flops, "tokens_per_sec": total / dt, "lr_mult": out["lr_mult"], "grad_norm": out["grad_norm"],
           "dt": dt, "elapsed": time.time() - run.t_start,
           **({"step_weight": out["w"]} if args.step_supervision else {}),
           **({"kl": out["kl"]} if out["kl"] is not None else {}),
           **({"mfu": step_flops / dt / (args.peak_flops * run.world)} if args.peak_flops > 0 else {}),
           **({"skipped": True} if bad else {})}
    if run.master:
        run_dir.report(run.log, run.bar, rec, args.log_interval, run.bad_in_row)
        if run.step == run.start_step + 3 and run.step < args.max_iters:  # the first steps set the pace
            run.bar.write(run_dir.pace(run, args, lambda s: schedule_at(s, args)["mean_recurrence"]))
    return rec


def should_save(run, at_eval, due=False, sound=True):
    """The whole saving rule. Never the step just loaded (its save is on disk) nor right after skipped steps
    (bad_in_row): the weights must have trained since. At every eval, whose val loss vouches for the weights
    (evaluate() stops a diverged run before this). Between evals once --ckpt_minutes have passed (due), but only
    when the next step's loss showed the weights sound (no NaN, no spike), so that a long run between evals
    always has a recent checkpoint."""
    return run.step > run.start_step and run.bad_in_row == 0 and (at_eval or (due and sound))


def save_due(run, args):
    """--ckpt_minutes have passed since the last save; under --fsdp by the master's clock (every rank saves)."""
    due = args.ckpt_minutes > 0 and time.time() - run.t_saved >= 60 * args.ckpt_minutes
    if args.fsdp:
        from plumbing import fsdp

        due = fsdp.from_master(due)
    return due


def evaluate(run, args):
    """The master's evaluation at run.step (under --fsdp every rank's): the dev loss at each r and the adapter's
    norms, logged and printed; a diverged model stops the run before it is saved. Returns estimate_loss's seconds."""
    model = run.model
    eval_r = int_list(args.eval_r, "--eval_r") if model.config.recurrent else [1]  # a static model runs its core once
    eval_r = [args.exit_gate_r] if args.exit_gate else eval_r  # the gate's loss; the frozen model's would not move
    t_eval = time.time()
    val = estimate_loss(model, run.val_data, eval_r, args.eval_iters, args.batch_size, run.device, args.seed,
                        run.autocast, args.exit_gate)
    seconds = time.time() - t_eval
    run_dir.report_eval(run.log, run.bar, run.step, val, model)
    guards.check_eval(run.levels, val, run.step, args.diverge_factor, args.out_dir)  # before it is saved
    return seconds


# -----------------------------------------------------------------------------
# the run's start: device, data, model and optimizers, the run directory


def start_run(args):
    """Everything the loop reads (Run): the device and precision, the data, the model and its optimizers (a
    --resume's save where the run stood), DDP's wrap, the run directory (its lock, log and save function)."""
    ddp, rank, world, device = setup(args.device)  # torchrun's ranks or one process
    precision, why = train_precision(device, args.autocast)  # bf16 where the device multiplies it natively
    if rank == 0:
        print(f"precision: {precision} ({why})")
    lock = run_dir.claim(args.out_dir, rank == 0)  # out_dir writable, and this process its only owner
    args.resume = run_dir.resolve_resume(args, rank == 0)  # --resume auto: resume a complete save, else start fresh
    # data first: its vocabulary sizes a scratch model, and its fingerprint must match the model's tokenizer
    try:  # the train and dev splits (plumbing/batches.py); per-loop supervision needs the labels' depths
        train_data, val_data = open_splits(args.data, args.block_size, per_loop=args.step_supervision)
        tokens_per_step, grad_accum = accumulation(args.batch_size, train_data["T"], world, args.total_batch_tokens)
    except (FileNotFoundError, ValueError) as err:  # not prepared, truncated, mismatched: the message says which
        raise TrainError(str(err)) from None
    meta, T = train_data["meta"], train_data["T"]
    model, opts, split, tok_src, (step, flops, levels) = start(args, meta, device, rank == 0, precision)
    try:  # the parent and the text of the KL term (plumbing/kl_parent.py), checked before the first step
        kl = ParentKL(args.kl_init or args.init, args, meta, device) if args.kl_parent > 0 else None
    except (FileNotFoundError, ValueError) as err:
        raise TrainError(str(err)) from None
    # nanoGPT's wrap: the forward runs through DDP, which all-reduces the gradients in backward (a --fsdp model,
    # sharded in start, reduce-scatters them itself)
    wrap = ddp and not args.fsdp
    # a first_loop "identity" model runs no adapter in an r = 1 step: DDP must look for unused parameters
    unused = model.config.first_loop == "identity"
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                    find_unused_parameters=unused) if wrap else model
    info = run_dir.run_info(model, world, grad_accum, tokens_per_step, device, split, precision)
    if args.fsdp:
        from plumbing import fsdp
    save = lambda s: (fsdp.save_checkpoint if args.fsdp else run_dir.save_checkpoint)(
        model, opts, s, args, meta["fingerprint"], run.flops, run.levels, info, schedule_at(s, args))
    run = Run(device=device, rank=rank, world=world, ddp=ddp, autocast=precision_context(device, precision),
              model=model, kl=kl, ddp_model=ddp_model, opts=opts, trainable=[p for p in model.parameters() if p.requires_grad],
              train_data=train_data, val_data=val_data, T=T, tokens_per_step=tokens_per_step, grad_accum=grad_accum,
              save=save, log=run_dir.start_log(args, step, info, tok_src) if rank == 0 else None,
              bar=tqdm(total=args.max_iters, initial=step, disable=None if rank == 0 else True, dynamic_ncols=True),
              lock=lock, step=step, start_step=step, tokens=step * tokens_per_step, flops=flops, levels=levels)
    return run


def start(args, meta, device, master, precision):
    """The model (built, or a --resume's save; its blocks compiled with --compile), its optimizers (and
    their split by name), its tokenizer source, and where a resumed run stood: its step, FLOPs so far and
    the divergence check's running levels (an EMA of the train loss over good steps, the best eval loss)."""
    if args.fsdp:
        from plumbing import fsdp
    torch.manual_seed(args.seed)
    ckpt_dir = ckpt_step = None
    if args.resume:  # the newest complete save, and the settings it was trained with (--fsdp: the master checks)
        find = fsdp.find_resume if args.fsdp else run_dir.find_resume
        ckpt_dir, ckpt_step = find(args, meta["fingerprint"], DEFAULTS, RESUME_MAY_CHANGE, master, precision)
    try:  # --init's model (plumbing/build_model.py); a bad --init, cut or flag is one line
        model, tok_src = build_model(args, meta, ckpt_dir)
    except ValueError as err:
        raise TrainError(str(err)) from None
    if args.fsdp:  # block by block onto the device, this rank's rows only; before the optimizers take them
        fsdp.shard(model, device, precision)
    model.to(device)
    opts, split = make_optimizers(model, args, precision)  # Newton-Schulz in the run's precision
    if args.resume and args.fsdp:  # the optimizer states are shard files (dcp.load)
        state = fsdp.load_train_state(ckpt_dir, ckpt_step, opts, model)
    else:
        state = run_dir.load_train_state(ckpt_dir, ckpt_step, opts) if args.resume else {}
    if args.compile:  # the blocks only: the loop over r has a data-dependent length
        compile_blocks(model)
    levels = state.get("levels") or guards.new_levels()
    return model, opts, split, tok_src, (state.get("step", 0), state.get("flops", 0.0), levels)


def main(argv=None):
    args = None
    try:
        args = parse_args(argv)
        with preempt.handlers(args.preempt_timeout, args.out_dir):  # SIGTERM, SIGUSR1: save the step, then exit
            train(args)
        if args.push_to_hub and int(os.environ.get("RANK", 0)) == 0:  # the finished run, once (rank 0 of torchrun)
            try:
                print(f"pushed {args.out_dir} to {push_to_hub(args.out_dir, args.push_to_hub, private=args.private)}")
            except ValueError as err:
                raise TrainError(f"{err} (the run itself is saved in {args.out_dir})") from None
    except (TrainError, checkpoint.RunDirError, guards.Stopped) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except preempt.Preempted as stop:  # saved: a scheduler requeues on this exit code (README, "On a cluster")
        if int(os.environ.get("RANK", 0)) == 0:
            print(stop, file=sys.stderr)
        sys.exit(preempt.EXIT_CODE)
    except RuntimeError as err:  # under torchrun, a collective whose peer died: one line (others keep the traceback)
        line = preempt.lost_rank(err, args.out_dir) if args is not None else None
        if line is None:
            raise
        print(line, file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C: stop where the run is, without writing a checkpoint mid-step
        where = run_dir.on_disk(args.out_dir) if args is not None else "nothing was started"
        print(f"error: interrupted (Ctrl-C): {where}", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
