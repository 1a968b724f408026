"""
Adaptive depth on the synthetic depth task: Huginn's five exit criteria, each over a sweep of thresholds,
against fixed test-time recurrence r.

Huginn-0125 (Geiping et al. 2025, arXiv 2502.05171, §6.1, zero-shot adaptive compute) stops a token's loop
once two consecutive loops agree; sample.py's ExitRule implements its kl, entropy-diff, latent-diff, cosine
and argmax criteria for generation. On the S3 running product (data/depth/prepare.py) the label p_k needs
about k sequential steps, and a model trained with per-loop supervision (train.py --step_supervision,
arXiv 2608.11233) answers depth i after loop i, so a good criterion spends more loops on deeper labels. This
file measures what each criterion buys: accuracy against mean loops per labeled position (the exit
frontier), beside fixed r, and the loops it spends at each depth k.

How: one trajectory per batch, as eval_math.py's run_depth runs it (the same seeded s_0 draws): a forward of
r_max = max(--r) loops with the states s_0..s_rmax, and the head read out after every loop at the labeled
positions. For each criterion and threshold every labeled position exits after the first loop j where the
criterion fires, with sample.py's per-token semantics and its math (exit_quantity, exit_value, exit_fired):
loop j is compared with loop j-1, so the earliest exit is after 2 loops (argmax: after threshold + 1, a streak
of unchanged answers); never before --exit_min_loops; after r_max when it never fires. The position answers
with loop j's readout. The fixed curve is every r = 1..r_max from the same readouts (at the r of --r, run_depth's
numbers). Accuracy is over labeled positions; by_k groups them by their own step count k (the step array, as
eval_math.py's summarize does): by_k["3"] is the label p_3 of every row, whatever the row's length.

Where this differs from sample.py's cached per-token exit (bench/bench_sample.py section 3 runs that one, one
position per decode step, at Huginn's thresholds):
- One teacher-forced forward runs every position to r_max: at loop i a position's core attends to the earlier
  positions' loop-i states, its coda after loop j to their loop-j states. In cached generation an earlier
  token that exited after m loops is frozen: at loops i > m later tokens read its latest core KV entry, the
  one of loop m (kv_cache.py's policy; Huginn's HuginnDynamicCache "latest-m4" lookup in
  raven_modeling_minimal.py does the same per core layer), and every later coda reads its coda KV, written
  from its exit state. So an adaptive answer here is what the position answers under fixed r = its exit
  loop, and one position's exit never changes another's trajectory. Measured on the CPU depth models (the
  first 200 val rows, 2400 labels, one seed; kl at 1e-3): cached decoding ran 6.0 / 6.9 mean loops at accuracy
  0.672 / 0.764 where this sweep gives 7.4 / 7.7 loops at 0.672 / 0.809 (outcome loss / --step_supervision).
  Read the sweep as each criterion's frontier under teacher forcing, not as what decoding with it reaches.
- sample.py prefills a prompt at fixed r and exits in one-token decode steps only; here every labeled position
  counts as a decode step (the inputs g_t never hold an answer, so teacher forcing feeds what decoding would).
- s_0 is one seeded draw per batch (run_depth's), not generate()'s per-token draws from its generator.

    python data/depth/prepare.py --out_dir data/depth
    python train.py --config config/cpu_depth.json --out_dir out/depth          # CPU, a few minutes
    python eval_math.py --init out/depth --task depth --data data/depth --r 32 --exit_sweep --out_dir out/eval/exits
Writes exit_frontier.json ({"r_max", "fixed": [{r, accuracy, by_k}], "adaptive": [{criterion, threshold,
mean_loops, accuracy, by_k}]}), exit_positions.npz (per labeled position: row, k, correct after each loop (L, N),
loops_<criterion> at Huginn's default thresholds), exit_frontier.png, loops_by_depth.png, and prints each criterion's best
threshold: the fewest mean loops within 1 point of fixed r_max's accuracy over the trained depths, and over all.
Test: python -m pytest -q tests/test_exit_sweep.py
"""

import json
import math
from pathlib import Path

import numpy as np
import torch

from exit_gate import EXIT_THRESHOLDS, ZERO_SHOT, exit_fired, exit_quantity, exit_value
from per_loop import IGNORE_INDEX
from plumbing.cli import os_error
from plumbing.eval_data import EvalError, load_bin

REPO = Path(__file__).resolve().parents[1]

# each criterion's thresholds, from "exits as early as it can" (the largest: 2.0-2.2 mean loops on the CPU depth
# model, config/cpu_depth.json; argmax 1 waits for two equal answers) to "never exits" (a value below 0; a streak
# of r_max within r_max loops), Huginn's defaults (sample.EXIT_THRESHOLDS) among them
LOG_SWEEP = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6, 0.0)
SWEEPS = {"kl": (3.0, 1.0, 0.3) + LOG_SWEEP, "entropy-diff": (3.0, 1.0, 0.3) + LOG_SWEEP,
          "cosine": (1.0, 0.3) + LOG_SWEEP,
          "latent-diff": (1.0, 0.5, 0.3, 0.1, 0.03, 0.01, 3e-3, 1e-3, 3e-4, 1e-4, 0.0),
          "argmax": (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32),
          # the learned gate's probability: 0 exits after loop 1, above 1 never
          "gate": (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.01)}
WITHIN = 0.01  # "within 1 point" of fixed r_max's accuracy


def thresholds(criterion, r_max):
    """The thresholds swept for `criterion` at r_max loops (argmax: its counts below r_max, then r_max)."""
    if criterion == "argmax":
        return [t for t in SWEEPS[criterion] if t < r_max] + [r_max]
    return list(SWEEPS[criterion])


# -----------------------------------------------------------------------------
# the per-position exit


def loop_signals(states, logits, gate=None):
    """What every criterion sees at N positions over L loops. states: s_0..s_L, the initial state and the loops'
    outputs, each (N, h); logits: the L readouts after the loops, each (N, V), any iterable (a generator holds
    one loop's at a time); gate: the model's learned exit gate (exit_gate.py), or None. Returns answers (L, N),
    each readout's argmax, and {criterion: (L, N)}: row j - 1 is exit_value of loop j against loop j - 1, NaN
    at loop 1 where there is nothing to compare (so no value fires there); argmax's row is its streak, 0 after
    loop 1; the gate's, its probability after loop j (exit_gate.ExitRule.converged, loop by loop)."""
    answers, values, prev = [], {c: [] for c in ZERO_SHOT}, {}
    for j, (s, lg) in enumerate(zip(states[1:], logits)):
        answers.append(lg.argmax(-1))  # the answer eval_math.py's run_depth reads
        for c, vals in values.items():
            cur = exit_quantity(c, s, lg)  # (N, h), (N, V) or (N,)
            if c == "argmax":
                vals.append(torch.zeros_like(cur) if j == 0 else exit_value(c, prev[c], cur, vals[-1]))
            else:
                vals.append(torch.full(cur.shape[:1], math.nan, device=cur.device) if j == 0
                            else exit_value(c, prev[c], cur))
            prev[c] = cur
    values = {c: torch.stack(v) for c, v in values.items()}
    if gate is not None:
        values["gate"] = gate.trajectory(states)
    return torch.stack(answers), values


def first_exit(criterion, value, threshold, min_loops=1):
    """value (L, N) of loop_signals -> (N,) long: the loop (1..L) each position exits after, the first j >=
    min_loops where the criterion fires, or L where it never does (sample.py's step ends at r)."""
    j = torch.arange(1, value.shape[0] + 1, device=value.device)[:, None]
    fire = exit_fired(criterion, value, threshold) & (j >= min_loops)  # (L, N) bool
    fire[-1] = True
    return fire.int().argmax(0) + 1  # argmax: the first of the maxima


def pick(per_loop, loops):
    """per_loop (L, N) at each position's loop (N,) 1..L -> (N,)."""
    return per_loop.gather(0, (loops - 1)[None]).squeeze(0)


# -----------------------------------------------------------------------------
# the trajectories, the frontier, the best thresholds


@torch.no_grad()
def trajectories(args, model):
    """Every labeled position's correctness after each loop (L, N) bool, its step k (N,), loop_signals' values
    (L, N) per criterion, the data's meta.json and each position's row (N,); L = max(--r), N positions in
    row-major order."""
    args.data = args.data or str(REPO / "data" / "depth")
    meta, ids, targets, steps = load_bin(args, model)
    if targets is None or steps is None or not meta.get("seq_len"):
        raise EvalError(f"{args.data} has no {args.split}_targets.bin/_step.bin: not a depth task dir")
    if meta.get("cot"):
        raise EvalError(f"{args.data} holds chains of thought (prepare.py --cot), answered by generation: the exit "
                        "sweep reads the loop's answer at every position; pass the plain depth data")
    if meta.get("train_max_k") is None:
        raise EvalError(f"{args.data}/meta.json has no train_max_k: rerun data/depth/prepare.py")
    shape = (-1, meta["seq_len"])
    ids, targets, steps = (np.asarray(a).reshape(shape) for a in (ids, targets, steps))
    if args.limit:
        ids, targets, steps = ids[:args.limit], targets[:args.limit], steps[:args.limit]
    r_max, parts = max(args.r), []
    torch.manual_seed(args.seed)  # run_depth's s_0 draws: the fixed curve at r in --r is its numbers
    for b in range(0, len(ids), args.batch_size):
        x, y = (torch.from_numpy(a[b:b + args.batch_size].astype(np.int64)).to(args.device) for a in (ids, targets))
        at = y != IGNORE_INDEX  # (B, T): the labeled positions
        out = model(x, y, num_steps=r_max, labeled_only=True, return_states=True)  # s_0 .. s_rmax
        rope = model.rope(torch.arange(x.shape[1], device=x.device))
        logits = (out.logits if j == r_max else model.readout(out.states[j], rope, positions=at)
                  for j in range(1, r_max + 1))  # (N, V) after loop j, one loop at a time
        answers, values = loop_signals([s[at] for s in out.states], logits, getattr(model, "exit_gate", None))
        mask = at.cpu().numpy()
        parts.append(((answers == y[at]).cpu(), steps[b:b + args.batch_size][mask],
                      {c: v.cpu() for c, v in values.items()}, b + np.nonzero(mask)[0]))
    correct = torch.cat([p[0] for p in parts], 1)
    values = {c: torch.cat([p[2][c] for p in parts], 1) for c in parts[0][2]}
    rows = np.concatenate([p[3] for p in parts]).astype(int)
    return correct, np.concatenate([p[1] for p in parts]).astype(int), values, meta, rows


def frontier(correct, steps, values, min_loops=1):
    """exit_frontier.json's dict: fixed r = 1..L, and every criterion at each of its thresholds."""
    L, ks = correct.shape[0], sorted(set(steps.tolist()))
    at_k = {k: torch.from_numpy(steps == k) for k in ks}
    mean = lambda t: float(t.double().mean())
    fixed = [{"r": r, "accuracy": mean(correct[r - 1]),
              "by_k": {str(k): {"accuracy": mean(correct[r - 1][at_k[k]])} for k in ks}} for r in range(1, L + 1)]
    adaptive = []
    for c in values:
        for thr in thresholds(c, L):
            loops = first_exit(c, values[c], thr, min_loops)
            ok = pick(correct, loops)
            adaptive.append({"criterion": c, "threshold": thr, "mean_loops": mean(loops), "accuracy": mean(ok),
                             "by_k": {str(k): {"accuracy": mean(ok[at_k[k]]), "mean_loops": mean(loops[at_k[k]])}
                                      for k in ks}})
    return {"r_max": L, "fixed": fixed, "adaptive": adaptive}


def over_depths(entry, counts, kmax, key="accuracy"):
    """An entry's by_k[key] over the labels of depth k <= kmax (counts: {k: labels}, the weights)."""
    ks = [k for k in counts if k <= kmax]
    return sum(entry["by_k"][str(k)][key] * counts[k] for k in ks) / sum(counts[k] for k in ks)


def best_thresholds(result, counts, kmax):
    """{criterion: (entry, within)}: the entry with the fewest mean loops whose accuracy over the trained depths
    (k <= kmax) is within 1 point of fixed r_max's there (the more accurate of a tie), within True; when none
    is, the most accurate one there, within False."""
    target = over_depths(result["fixed"][-1], counts, kmax) - WITHIN - 1e-9  # (1e-9: the rounding of 0.01)
    best = {}
    for c in dict.fromkeys(e["criterion"] for e in result["adaptive"]):  # the criteria swept, in order
        rows = [e for e in result["adaptive"] if e["criterion"] == c]
        seen = {id(e): over_depths(e, counts, kmax) for e in rows}
        ok = [e for e in rows if seen[id(e)] >= target]
        best[c] = ((min(ok, key=lambda e: (e["mean_loops"], -seen[id(e)])), True) if ok
                   else (max(rows, key=lambda e: seen[id(e)]), False))
    return best


def spearman(x, y):
    """Spearman's rank correlation: Pearson's of the ranks, ties sharing their mean rank; NaN if x or y is flat."""
    def ranks(a):
        a = np.asarray(a, dtype=float)
        r = np.empty(len(a))
        r[np.argsort(a, kind="stable")] = np.arange(1, len(a) + 1)
        for v in np.unique(a):
            r[a == v] = r[a == v].mean()
        return r - r.mean()
    rx, ry = ranks(x), ranks(y)
    d = math.sqrt(float((rx ** 2).sum() * (ry ** 2).sum()))
    return float((rx * ry).sum() / d) if d > 0 else float("nan")


# -----------------------------------------------------------------------------
# table, plots, the entry point


def label(c, entry, within):
    return f"{c} @ {entry['threshold']:g}" + ("" if within else " (most accurate; none within 1 pt)")


def summary_rows(result, picked, counts, kmax):
    """One row per criterion of picked {criterion: (entry, within)}: (name, threshold, mean loops, accuracy,
    accuracy at k <= kmax, Spearman of k and the mean loops at k over k = 1..max); fixed r_max's row first."""
    ks, top = sorted(counts), result["fixed"][-1]
    rows = [(f"fixed r={result['r_max']}", "-", float(result["r_max"]), top["accuracy"], over_depths(top, counts, kmax),
             float("nan"))]
    for c, (e, within) in picked.items():
        rho = spearman(ks, [e["by_k"][str(k)]["mean_loops"] for k in ks])
        rows.append((c + ("" if within else " *"), f"{e['threshold']:g}", e["mean_loops"], e["accuracy"],
                     over_depths(e, counts, kmax), rho))
    return rows


def print_summary(result, best, counts, kmax, n):
    """The table at each criterion's best threshold (over the trained depths, then over all), then at Huginn's
    default one (sample.EXIT_THRESHOLDS)."""
    r_max, k_all = result["r_max"], max(counts)
    print(f"\nexit sweep: {n} labeled positions, k = 1..{k_all} (trained k <= {kmax}), r_max {r_max}")
    huginn = {c: (next(e for e in result["adaptive"] if e["criterion"] == c and e["threshold"] == t), True)
              for c, t in EXIT_THRESHOLDS.items() if c in ZERO_SHOT and t in thresholds(c, r_max)}
    best_all = best_thresholds(result, counts, k_all)
    for title, picked in ((f"best threshold: the fewest mean loops within 1 point of fixed r={r_max} at k <= {kmax}",
                           best), (f"best threshold over all depths k <= {k_all}", best_all),
                          ("Huginn's default thresholds", huginn)):
        print(f"{title}\n{'criterion':<16}{'threshold':>10}{'mean loops':>12}{'accuracy':>10}{f'acc k<={kmax}':>10}"
              f"{'spearman(k, loops)':>20}")
        for name, thr, loops, acc, seen, rho in summary_rows(result, picked, counts, kmax):
            print(f"{name:<16}{thr:>10}{loops:>12.2f}{acc:>10.3f}{seen:>10.3f}{rho:>20.3f}")
    if not all(within for _, within in (*best.values(), *best_all.values())):
        print("* no threshold within 1 point: the most accurate one")


def plot(result, best, counts, kmax, out_dir):
    """exit_frontier.png (accuracy against mean loops, all depths and trained depths) and loops_by_depth.png
    (mean loops and accuracy against k at each criterion's best threshold)."""
    from plumbing.plots import pyplot, save_figures

    plt = pyplot()
    fixed, r_max, ks = result["fixed"], result["r_max"], sorted(counts)
    colors = dict(zip(EXIT_THRESHOLDS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    marks = dict(zip(EXIT_THRESHOLDS, "osD^vP"))  # criteria that coincide stay apart by their markers
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, (title, acc) in zip(axes, ((f"all depths k <= {max(ks)}", lambda e: e["accuracy"]),
                                       (f"trained depths k <= {kmax}", lambda e: over_depths(e, counts, kmax)))):
        ax.plot([e["r"] for e in fixed], [acc(e) for e in fixed], "k.-", lw=1.5, label="fixed r = 1..%d" % r_max)
        for c in best:
            rows = sorted((e for e in result["adaptive"] if e["criterion"] == c), key=lambda e: e["mean_loops"])
            ax.plot([e["mean_loops"] for e in rows], [acc(e) for e in rows], "-", marker=marks[c], ms=3, lw=1,
                    color=colors[c], label=c)
            e = best[c][0]
            ax.plot(e["mean_loops"], acc(e), "*", ms=12, color=colors[c], mec="k", mew=0.5)
        ax.set_xscale("log", base=2)  # y autoscaled: the differences are a few points
        ax.set(xlabel="mean loops per labeled position", ylabel="accuracy", title=title)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="lower right", title="one point per threshold; star: best", title_fontsize=8)
    fig.suptitle("exit criteria, each over its thresholds, against fixed r (one forward, read out after every loop)")
    figs = [(fig, "exit_frontier.png")]

    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4.4))
    for c, (e, within) in best.items():
        style = dict(marker=marks[c], ms=5, mfc="none", color=colors[c], ls="-" if within else "--",
                     label=label(c, e, within))
        a0.plot(ks, [e["by_k"][str(k)]["mean_loops"] for k in ks], **style)
        a1.plot(ks, [e["by_k"][str(k)]["accuracy"] for k in ks], **style)
    for c, t in ((c, EXIT_THRESHOLDS[c]) for c in ZERO_SHOT):  # Huginn's defaults, faint: where the best is loosest
        e = next((e for e in result["adaptive"] if e["criterion"] == c and e["threshold"] == t), None)
        if e is not None:
            a0.plot(ks, [e["by_k"][str(k)]["mean_loops"] for k in ks], ls=":", lw=1, color=colors[c])
    a0.plot([], [], ls=":", lw=1, color="k", label="dotted: Huginn's defaults")
    a0.plot(ks, ks, "-", color="grey", lw=3, alpha=0.3, label="loops = k")
    a1.plot(ks, [fixed[-1]["by_k"][str(k)]["accuracy"] for k in ks], "k--", lw=1, label=f"fixed r={r_max}")
    a1.axhline(1 / 6, color="grey", lw=0.8, ls=":")  # chance: 6 answers
    for ax in (a0, a1):
        ax.axvline(kmax + 0.5, color="grey", lw=0.8, ls="--")  # the trained depths are left of it
        ax.set(xlabel=f"steps k (trained k <= {kmax})", xticks=ks)
        ax.grid(alpha=0.3)
    a0.set(ylim=(0, r_max + 1), ylabel="mean loops", title=f"loops spent at depth k, best thresholds (fixed: {r_max})")
    a1.set(ylim=(0, 1.02), ylabel="accuracy", title="accuracy at depth k, same thresholds")
    a0.legend(fontsize=7)
    a1.legend(fontsize=7)
    figs.append((fig, "loops_by_depth.png"))
    return save_figures(figs, out_dir)


def exit_sweep(args, model, out_dir):
    """eval_math.py --task depth --exit_sweep: the trajectories, exit_frontier.json, its two PNGs and the table.
    Returns exit_frontier.json's dict."""
    if not model.config.recurrent:
        raise EvalError("--exit_sweep needs a recurrent model: a static one runs its layers once")
    correct, steps, values, meta, rows = trajectories(args, model)
    result = frontier(correct, steps, values, args.exit_min_loops)
    # per position, for intervals paired by row (experiments/adaptive_depth.py): correctness after every loop and
    # the exit loop of each criterion at Huginn's default threshold; arrays only, read with allow_pickle=False
    defaults = {f"loops_{c}": first_exit(c, values[c], EXIT_THRESHOLDS[c], args.exit_min_loops).numpy()
                for c in values if c in EXIT_THRESHOLDS and EXIT_THRESHOLDS[c] in thresholds(c, correct.shape[0])}
    counts, kmax = {int(k): int((steps == k).sum()) for k in np.unique(steps)}, meta["train_max_k"]
    best = best_thresholds(result, counts, kmax)
    print_summary(result, best, counts, kmax, len(steps))
    try:  # a full disk: one line that says so
        with open(out_dir / "exit_frontier.json", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        np.savez_compressed(out_dir / "exit_positions.npz", row=rows, k=steps, correct=correct.numpy(), **defaults)
        paths = plot(result, best, counts, kmax, out_dir)
    except OSError as e:
        raise EvalError(os_error(e, out_dir)) from None
    print(f"wrote {out_dir / 'exit_frontier.json'}, {out_dir / 'exit_positions.npz'}, " + ", ".join(str(p) for p in paths))
    return result
