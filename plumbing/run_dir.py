"""
A training run's directory, around train.py's loop: the run's log (log.jsonl) and what it prints at
the start and at the end (loss.png), its saves (one atomic checkpoint.save of weights, config and
optimizer state), --resume (the saved flags must match; the log is trimmed to the save), and the one
line a stopped run prints about what it leaves on disk.

    python train.py --config config/cpu_depth.json --max_iters 40 --out_dir out/x   # writes out/x
    python train.py --config config/cpu_depth.json --max_iters 80 --out_dir out/x --resume
    python -m pytest -q tests/test_train.py -k resume

A log.jsonl line is {"step", "config", "run"} once per start, {"step", "loss", "r", ...} per optimizer
step, {"step", "val", "adapter"} per evaluation.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from plumbing import checkpoint
from plumbing.checkpoint import RunDirError
from plumbing.cli import git_commit, read_json, ready_out_dir
from plumbing.device import cpu_bf16, is_dtensor
from plumbing.finite import check_finite
from plumbing.model_card import write_model_card


def claim(out_dir, master):
    """Before the long work: out_dir must be a writable directory (a file in the way or a read-only disk is
    said now, not at the first checkpoint), and one process owns it: a second refuses; the kernel drops the
    lock when this one ends, killed or not. Returns the master's lock (held while the file is open)."""
    try:
        ready_out_dir(out_dir)
    except ValueError as err:
        raise RunDirError(str(err)) from None
    return checkpoint.lock(out_dir) if master else None


def start_log(args, step, run_info, tok_src):
    """The master's start: print the configuration and the run, copy the tokenizer files into out_dir
    (so the checkpoint dir works as --init for every script), trim the log of a resumed run to its save,
    and append the header line. Returns the open log."""
    print("config:", json.dumps(vars(args)))
    print("run:", json.dumps(run_info))
    os.makedirs(args.out_dir, exist_ok=True)
    if tok_src is not None and os.path.abspath(tok_src) != os.path.abspath(args.out_dir):
        from plumbing.tokenizer import save_tokenizer_files

        save_tokenizer_files(tok_src, args.out_dir)
    if args.resume:
        trim_log(os.path.join(args.out_dir, "log.jsonl"), step)
    log = open(os.path.join(args.out_dir, "log.jsonl"), "a")
    write_log(log, {"step": step, "config": vars(args), "run": run_info})
    return log


def write_log(log, record):
    log.write(json.dumps(record) + "\n")
    log.flush()


def save_checkpoint(model, opts, step, args, fingerprint, flops_seen, levels, run_info, schedule, shards=None):
    """One atomic save of the whole run (checkpoint.save: a complete new ckpt/ directory, then one pointer
    switch) into args.out_dir. config.json records what this process really used: its flags and, under
    "run", the device, world size and gradient accumulation. schedule: where the lr and rbar stood.
    shards: a --fsdp save's directory, whole weights and optimizer shard files (plumbing/fsdp.py).
    Returns the time the save finished (the --ckpt_minutes timer starts again from it)."""
    train_cfg = {**vars(args), "step": step, "data_fingerprint": fingerprint, "run": run_info}
    state = {"step": step, "rng": torch.get_rng_state(),
             # --fsdp: the optimizer states are the shard files beside it (plumbing/fsdp.py)
             "optimizers": [o.state_dict() for o in opts] if shards is None else None,
             "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
             "data": {"seed": args.seed, "next_step": step}, "args": vars(args), "flops": float(flops_seen),
             "levels": levels,  # the divergence check's running levels, so a resumed run keeps them
             # the schedules are functions of the step; stored so a reader can see where the run stood
             "schedule": schedule}
    checkpoint.save(args.out_dir, step, model, state, train_cfg, shards)
    # the card says what the save holds (README.md)
    cfg = read_json(os.path.join(args.out_dir, "config.json"))
    write_model_card(args.out_dir, cfg, ["python", "train.py", *sys.argv[1:]])
    return time.time()


def find_resume(args, fingerprint, keys, may_change, master, precision):
    """--resume: the newest complete save of args.out_dir and its step, after checking that the run was
    trained with these settings and precision (check_resume). The master also removes what a save killed after its
    commit left (the next save would, but there may be none)."""
    ckpt_dir, step = checkpoint.find(args.out_dir)
    if master:
        checkpoint.remove_stale(args.out_dir, keep=ckpt_dir)
    saved = read_json(os.path.join(ckpt_dir, "config.json")).get("train", {})
    check_resume(args, saved, fingerprint, keys, may_change, precision)
    return ckpt_dir, step


def resolve_resume(args, master):
    """--resume as True or False. auto (what a requeued job or torchrun's restarts run: one command line, again
    and again) is True when out_dir holds a save that may be complete: then --resume's checks apply, and a save
    of another run, or a committed one that is damaged, is refused as --resume refuses it. It is False when out_dir
    holds no committed save and no complete one (none yet, or the first save was killed before its commit): a
    fresh start, whose log drops the lines of the attempt that saved nothing. The master decides for every rank."""
    if args.resume != "auto":
        return bool(args.resume)
    found = [None]
    if master:
        committed = checkpoint.current(args.out_dir)[0] is not None
        legacy = os.path.isfile(os.path.join(args.out_dir, "train_state.pt"))  # an older train.py's: find() names it
        found = [committed or legacy or any(checkpoint.verify(p) is None for p in checkpoint.saves(args.out_dir))]
        if not found[0]:
            trim_log(os.path.join(args.out_dir, "log.jsonl"), -1)
    if dist.is_initialized():
        dist.broadcast_object_list(found, src=0)
    return found[0]


def check_resume(args, saved, fingerprint, keys, may_change, precision):
    """--resume continues the run as it was: a flag that changes the model or the optimization (any of
    keys but may_change) must equal the run's saved value, the data must have its fingerprint, and the run
    must train in the precision it started in (--autocast auto resolves by device and CPU: another machine
    may resolve it otherwise). saved: the "train" section of the checkpoint's config.json."""
    same = lambda k, a, b: a == b or (k in ("data", "init") and os.path.realpath(str(a)) == os.path.realpath(str(b)))
    diff = [f"--{k} {getattr(args, k)!r} here, {saved[k]!r} in the run" for k in keys
            if k not in may_change and k in saved and not same(k, getattr(args, k), saved[k])]
    if saved.get("data_fingerprint") not in (None, fingerprint):
        diff.append(f"--data {args.data} has fingerprint {fingerprint} here, {saved['data_fingerprint']} in the run")
    was = saved_precision(saved)
    if was != precision:
        diff.append(f"this start trains in {precision}, the run in {was} (pass --autocast "
                    f"{'bf16' if was == 'bf16' else 'off'} to keep it)")
    if diff:
        raise RunDirError(f"--resume: {args.out_dir} was trained with other settings: {'; '.join(diff)}. Pass the "
                          f"run's values (its config.json, under \"train\") or train into a new --out_dir")


def saved_precision(saved):
    """The precision a saved run trained in: recorded under "run", or for a run saved before it was recorded,
    what --autocast meant then (bf16 when forced or on CUDA, fp32 on every CPU)."""
    run = saved.get("run", {})
    if "precision" in run:
        return run["precision"]
    on_cuda = str(run.get("device", "cpu")).startswith("cuda")
    return "bf16" if saved.get("autocast") == "bf16" or (saved.get("autocast", "auto") == "auto" and on_cuda) else "fp32"


def load_train_state(ckpt_dir, step, opts):
    """Optimizer states and RNG of a verified save (checkpoint.find), loaded as tensors and plain data only;
    a NaN or inf in a moment is refused (it would poison the weights at the first step)."""
    state = checkpoint.load_state(ckpt_dir)
    if state.get("step") != step:
        raise RunDirError(f"--resume: {ckpt_dir}/train_state.pt is of step {state.get('step')}, its manifest of {step}")
    check_finite({"optimizers": state["optimizers"]}, f"{ckpt_dir}/train_state.pt", RunDirError)
    if len(state["optimizers"]) != len(opts):
        raise RunDirError("--resume: the checkpoint was trained with another --optimizer")
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


def check_vocabulary(meta, data_dir, tok_dir, ckpt_dir):
    """A loaded model must read the data's tokens: the tokenizer in tok_dir (a .gguf file, or a dir with
    tokenizer files) must be the data's, or for a model without one (trained from scratch on a task's own
    vocabulary) the data that ckpt_dir's run was trained on must have this fingerprint. Returns the
    tokenizer source or None; a ValueError says what differs."""
    from data.common import check_tokenizer
    from plumbing.tokenizer import load_tokenizer

    tok_src = tokenizer_source(tok_dir)
    if tok_src is not None:
        check_tokenizer(meta, load_tokenizer(tok_src).fingerprint, data_dir=data_dir, model_tokenizer=tok_src)
        return tok_src
    fp = trained_on(ckpt_dir)
    if fp is not None and fp != meta["fingerprint"]:
        raise ValueError(f"data {data_dir} (fingerprint {meta['fingerprint']}) is not the vocabulary this "
                         f"checkpoint was trained on (fingerprint {fp}): prepare the data with its tokenizer")
    return None


def trained_on(path):
    """The data fingerprint a checkpoint of ours was trained on (config.json, "train"; for a cut of a static
    parent of ours, the parent's), or None (a cut of a pretrained parent, a raven checkpoint, a .gguf file)."""
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        return None
    cfg = read_json(cfg)
    return cfg.get("train", {}).get("data_fingerprint") or (cfg.get("parent") or {}).get("data_fingerprint")


def tokenizer_source(path):
    """path when it holds a tokenizer (a .gguf file, or a dir with tokenizer files), else None (a model
    trained from scratch on a task's own vocabulary)."""
    if os.path.isfile(path):
        return path
    return path if any(os.path.exists(os.path.join(path, n)) for n in ("tokenizer.json", "tokenizer.model", "original")) \
        else None


def report(log, bar, rec, log_interval, bad_in_row):
    """The master's record of an optimizer step: its log.jsonl line, the progress bar, and a printed line
    every log_interval steps and for every skipped one."""
    write_log(log, rec)
    bar.update(1)
    bar.set_postfix(loss=f"{rec['loss']:.4f}", r=rec["r"], tok_s=f"{rec['tokens_per_sec']:.0f}")
    if rec.get("skipped"):
        bar.write(f"step {rec['step']}: loss {rec['loss']} grad norm {rec['grad_norm']}: not finite, step skipped "
                  f"({bad_in_row} in a row)")
    elif rec["step"] % log_interval == 0:
        mfu = f", mfu {rec['mfu'] * 100:.1f}%" if "mfu" in rec else ""
        bar.write(f"step {rec['step']}: loss {rec['loss']:.4f}, r {rec['r']} (mean {rec['mean_r']}), "
                  f"{rec['tokens_per_sec']:.0f} tok/s, {rec['dt'] * 1000:.0f} ms{mfu}")


def adapter_norms(model):
    """Frobenius norms of the adapter's two halves, W = [W_s | W_e] on cat[s, e]: from [0 | I] the state
    half must grow for the loop to matter at all (arXiv 2608.11233 asks to show that the injection path
    receives training signal); None for a static model."""
    if not model.config.recurrent:
        return None
    W, h = model.adapter.weight.detach(), model.config.n_embd
    W = (W.full_tensor() if is_dtensor(W) else W).float()  # --fsdp: every rank gathers its rows
    return {"state": W[:, :h].norm().item(), "embed": W[:, h:].norm().item()}


def report_eval(log, bar, step, val, model):
    """The master's record of an evaluation: its log.jsonl line (val: {r: loss, acc...}, and the adapter's
    norms) and one printed line. Under --fsdp every rank calls it (the norms gather the adapter), with
    log None on all but the master."""
    adapter = adapter_norms(model)
    if log is None:
        return
    write_log(log, {"step": step, "val": val, **({"adapter": adapter} if adapter else {})})
    bar.write(f"step {step}: " + ", ".join(
        f"r={r} val {v['loss']:.4f}" + (f" acc {v['acc']:.3f}" if "acc" in v else "") for r, v in val.items())
        + (f"; adapter |W_s| {adapter['state']:.2f}, |W_e| {adapter['embed']:.2f}" if adapter else ""))


def pace(run, args, mean_r_at):
    """The line after the first three steps of train.py's run (a Run), which set the pace: the time the steps left
    will take (time_ahead), from the seconds per FLOP so far and the last eval's seconds."""
    seconds = time_ahead(run.model, args, run.step, run.tokens_per_step, run.timed_s / run.timed_flops, run.eval_s,
                         mean_r_at)
    ahead = f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
    return (f"~{ahead} for the {args.max_iters - run.step} steps left at this pace ({run.timed_s / 3:.2g} s a step so "
            "far" + (f", {run.eval_s:.2g} s an eval)" if run.eval_s else ")"))


def on_disk(out_dir):
    """What a stopped run leaves: said exactly, never a 'last good checkpoint' that was not written."""
    _, step = checkpoint.current(out_dir)
    return f"the checkpoint of step {step} in {out_dir} is untouched" if step is not None else \
        f"{out_dir} holds no checkpoint"


def finish(log, lock, out_dir, start_step, step, seconds):
    """The master's end of a run: close the log, summarize it, let the directory go."""
    log.close()
    summarize(out_dir, start_step, step, seconds)
    lock.close()


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


def run_info(model, world, grad_accum, tokens_per_step, device, split, precision):
    """train.py's run record in log.jsonl. What a seed does not fix: the same seed and command give the same numbers
    only on the same kind of CPU, torch build and thread count (BLAS kernels differ in their rounding by
    instruction set; --autocast auto trains in bf16 only where the CPU has native bf16), so the run records them."""
    return {"git": git_commit(short=True), "torch": torch.__version__, "world_size": world, "grad_accum": grad_accum,
            "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "precision": precision, "cpu_bf16": cpu_bf16(),
            "tokens_per_step": tokens_per_step, "device": str(device), "params": model.param_counts(),
            "optimizer_split": {k: len(v) for k, v in split.items()}}


def time_ahead(model, args, step, tokens_per_step, seconds_per_flop, eval_seconds, mean_r_at):
    """Seconds the rest of train.py's run takes at the pace so far: the steps left at their mean r (E[r] = rbar + 1,
    rbar = mean_r_at(step), by model.flops_per_token) at the seconds per FLOP measured, and the evals left at the
    last one's time."""
    flops = tokens_per_step * sum(model.flops_per_token(mean_r_at(s) + 1, args.backprop_depth)
                                  for s in range(step, args.max_iters))
    evals = sum(s % args.eval_interval == 0 or s == args.max_iters for s in range(step + 1, args.max_iters + 1))
    return flops * seconds_per_flop + evals * eval_seconds
