"""
The guards of a training run: what is never saved, and when the run stops. A step with a NaN/inf loss or
gradient is skipped (no update); a finite train loss far above its running level is a spike; an
evaluation far above the best one so far is a divergence. Neither a skipped step's, a spike's nor a
diverged evaluation's weights are saved, and --max_bad_steps skipped steps or --diverge_steps spikes in a
row stop the run with one line that says exactly which checkpoint is on disk (plumbing/run_dir.py).
A collapse stops it at once: an update that multiplies the weights' norm by --collapse_factor or more, or a
finite loss with a gradient of exactly zero (a dead model: e.g. the loss pinned at log(vocab), the uniform
prediction, after a blown-up update). The spike rule cannot see it: such a loss is no higher than before.

    python train.py --config config/cpu_depth.json --diverge_factor 4 --diverge_steps 3 --max_bad_steps 5
    python -m pytest -q tests/test_train.py -k "nan or diverg or spike"
"""

import math

import torch

from plumbing.run_dir import on_disk


class Stopped(Exception):
    """The run stopped on a guard: the message says why and what is on disk, in one line."""


def new_levels():
    """The running levels: an EMA of the good steps' train losses (over `steps` of them), the spikes in a
    row, and the best validation loss so far."""
    return {"loss": None, "steps": 0, "val": None}


def diverged(loss, level, factor):
    """A loss far above its running level: over factor x and over 1 nat above it (the margin keeps
    near-zero losses, whose ratios are noise, e.g. an r=1 step of a solved task, from tripping it)."""
    return factor > 0 and (not math.isfinite(loss) or (loss > factor * level and loss > level + 1.0))


def check_eval(levels, val, step, factor, out_dir):
    """The model about to be saved: its validation loss at its best r (val: {r: {"loss": ...}}) must not be
    far above the best so far; the best so far moves with it."""
    best = min((v["loss"] for v in val.values() if math.isfinite(v["loss"])), default=float("nan"))
    if levels["val"] is not None and diverged(best, levels["val"], factor):
        raise Stopped(f"step {step}: validation loss {best:.4g} (best r) is over {factor:g}x the best so far, "
                      f"{levels['val']:.4g} (--diverge_factor): the run diverged; not saved, {on_disk(out_dir)} "
                      f"(lower the lr?)")
    if math.isfinite(best):  # a model that was never finite has no level to diverge from
        levels["val"] = best if levels["val"] is None else min(levels["val"], best)


def judge(levels, loss, grad_norm, factor):
    """(bad, spike) of a step: bad, a NaN/inf loss or gradient (the step is skipped); spike (spiked)."""
    bad = not (math.isfinite(loss) and math.isfinite(grad_norm))
    return bad, spiked(levels, loss, bad, factor)


def spiked(levels, loss, bad, factor):
    """A finite loss far above its running level, counted in levels["spikes"] (in a row). One alone is the
    r of the step: at r = 1 a model trained with per-loop supervision reads out after one loop, 1.24
    against a running level of 0.07 in a from-scratch depth run."""
    spike = not bad and levels["steps"] >= 5 and diverged(loss, levels["loss"], factor)
    levels["spikes"] = levels.get("spikes", 0) + 1 if spike else 0
    return spike


def track(levels, rec, bad, spike, bad_in_row, args):
    """After a step (rec: its log.jsonl record): stop after --max_bad_steps NaN/inf steps or --diverge_steps
    spikes in a row (nothing of them was saved); else the running level takes in a good step's loss."""
    if bad_in_row >= args.max_bad_steps:
        raise Stopped(f"{bad_in_row} steps in a row had a NaN/inf loss or gradient (step {rec['step']}): stopping; "
                      f"{on_disk(args.out_dir)} (lower the lr?)")
    if levels["spikes"] >= args.diverge_steps:
        raise Stopped(f"step {rec['step']}: loss {rec['loss']:.4g} is over {args.diverge_factor:g}x its running "
                      f"level {levels['loss']:.4g} for {levels['spikes']} steps in a row (--diverge_factor, "
                      f"--diverge_steps): the run diverged, stopping; {on_disk(args.out_dir)} (lower the lr?)")
    if not bad and not spike:  # the running level: an EMA of the good steps' losses
        levels["loss"] = rec["loss"] if levels["steps"] == 0 else 0.9 * levels["loss"] + 0.1 * rec["loss"]
        levels["steps"] += 1


def weight_norm(params):
    """The global L2 norm of a list of tensors, as a float (read only: the numbers of the run do not change)."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.detach() for p in params]))).item()


def check_collapse(step, loss, grad_norm, norm_before, norm_after, factor, out_dir, reached=True):
    """After an update: stop if it blew the weights up (their norm x factor or more in one step), or if the
    loss was finite with an all-zero gradient. factor 0: neither check. Nothing after the last save is kept.
    Weights that start at zero (train.py --exit_gate's new gate) have no norm to multiply: their first step is not
    a blow-up. reached False: no trained weight was on the loss's path (train.py: an r = 1 step of a first_loop
    "identity" model under --freeze base), so no gradient came back, which says nothing of the model."""
    if factor > 0 and norm_before > 0 and norm_after >= factor * norm_before:
        raise Stopped(f"step {step}: the update multiplied the weights' norm by {norm_after / norm_before:.3g} "
                      f"({norm_before:.4g} -> {norm_after:.4g}, --collapse_factor {factor:g}): the run collapsed, "
                      f"stopping; {on_disk(out_dir)} (lower --learning_rate / --adam_lr)")
    if factor > 0 and reached and math.isfinite(loss) and grad_norm == 0.0:
        raise Stopped(f"step {step}: loss {loss:.4g} with a gradient of exactly zero: the model is dead (collapsed), "
                      f"stopping; {on_disk(out_dir)} (lower --learning_rate / --adam_lr)")
