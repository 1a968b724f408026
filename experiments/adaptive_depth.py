"""
Where does adaptive depth spend its loops, and what does it cost in accuracy? Huginn's zero-shot exit (Geiping et
al. 2025, arXiv 2502.05171, section 6.1: a token stops looping once two consecutive loops agree) on the depth task's
test split, five seeds of two models trained by other studies here:
  scratch   the from-scratch depth model: `make claims`' scratch arm (config/cpu_depth.json, 800 steps)
  retrofit  the SmolLM2 (2,2,2) retrofit: `make compute_matched`'s retrofit arm (200 + 25 steps)
Each seed's checkpoint runs one trajectory of 32 loops over the test rows, read out after every loop
(eval_math.py --exit_sweep, plumbing/exit_sweep.py), and every criterion exits each labeled position at its own
loop. The verdict follows experiments/rules.json "adaptive_depth", written before the runs: kl at Huginn's default
threshold (1e-3) against fixed r = 32, non-inferiority by one point, paired by seed and row. Nothing here chooses a
threshold: each criterion is read at Huginn's default.

    python -m experiments.adaptive_depth             # the sweeps (a finished one is reused), then the report
    python -m experiments.adaptive_depth --report    # run nothing: the report of the finished sweeps
    python -m experiments.adaptive_depth --claims out/claims --compute_matched out/compute_matched  # the defaults

Writes OUT/<model>/seed_<S>/ (each sweep's exit_frontier.json, exit_positions.npz, PNGs), OUT/summary.json,
OUT/adaptive_depth.md and OUT/adaptive_depth.png (accuracy against loops: fixed r and each criterion's exit).
"""

import argparse
import json
import math
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from exit_gate import EXIT_THRESHOLDS, ZERO_SHOT
from experiments import stats
from experiments.claim_arms import sh_once
from experiments.claims import RULES, compare, depth_range, line, provenance, reported, rules_commit
from plumbing.cli import git_commit
from plumbing.exit_sweep import spearman
from plumbing.plots import pyplot, save_figures

RULE = RULES["adaptive_depth"]
TRAIN_K, TEST_K = RULES["train_depth"], RULES["test_depth"]
R_MAX = 32
DEPTHS = (TRAIN_K, "beyond")
# model -> (the study that trained it, its arm, the test rows its own evaluation read: 0 = all)
MODELS = {"scratch": ("claims", "scratch", 0), "retrofit": ("compute_matched", "retrofit", 500)}


def sources(args):
    """model -> (arm folder, data dir, test rows)."""
    study = {"claims": Path(args.claims), "compute_matched": Path(args.compute_matched)}
    data = {"claims": study["claims"] / "data" / "depth", "compute_matched": study["compute_matched"] / "data"}
    return {m: (study[s] / "arms" / arm, data[s], limit) for m, (s, arm, limit) in MODELS.items()}


def sweep(out, model, seed, src, log):
    """One seed's exit sweep on test, at its arm's own evaluation's rows and batches (so that fixed r = 32 is the
    number that arm reported); reused when this command's result is there."""
    arm, data, limit = src
    d = out / model / f"seed_{seed}"
    cmd = [sys.executable, "eval_math.py", "--init", str(arm / f"seed_{seed}"), "--task", "depth", "--data", str(data),
           "--split", "test", "--r", str(R_MAX), "--exit_sweep", "--batch_size", "100", "--threads", "1",
           *(["--limit", str(limit)] if limit else []), "--out_dir", str(d)]
    sh_once(cmd, d / "exit_positions.npz", d / "command.json", log)


# -----------------------------------------------------------------------------
# the measurement


def per_row(pos, correct, depth):
    """(rows,) each row's mean correctness over its labels at `depth` (or pooled beyond the trained depth), in row
    order, as the studies' Arm.rows reads an evaluation; correct (N,) per position."""
    lo, hi = depth_range(depth)
    sel = (pos["k"] >= lo) & (pos["k"] <= hi)
    rows, inverse = np.unique(pos["row"][sel], return_inverse=True)
    return np.bincount(inverse, weights=correct[sel].astype(float)) / np.bincount(inverse)


def load(out, model, seeds):
    """Per seed the sweep's positions (row, k, correct (L, N), loops_<criterion>)."""
    return [dict(np.load(out / model / f"seed_{s}" / "exit_positions.npz", allow_pickle=False)) for s in seeds]


def matches_eval(src, seeds, P):
    """Whether the sweep's fixed r = 32 is, row by row, the arm's own test evaluation at r = 32 (None where that
    evaluation is not at hand)."""
    same = []
    for s, pos in zip(seeds, P):
        f = src[0] / f"seed_{s}" / "eval" / "results.jsonl"
        if not f.is_file():
            return None
        recs = [json.loads(x) for x in f.read_text().splitlines()]
        want = {x["index"]: x["correct"] for x in recs if x["r"] == R_MAX}
        got = {int(i): pos["correct"][R_MAX - 1][pos["row"] == i].astype(int).tolist() for i in np.unique(pos["row"])}
        same.append(got == {i: want.get(i) for i in got})
    return all(same)


def measure(P, src, seeds):
    """The rule's comparison, the reported ones, and the loops of every criterion at its default threshold."""
    crit = [c for c in ZERO_SHOT if f"loops_{c}" in P[0]]
    picked = lambda pos, c: pos["correct"][pos[f"loops_{c}"] - 1, np.arange(len(pos["k"]))]
    rows = lambda corr, depth: np.stack([per_row(pos, corr(pos), depth) for pos in P])  # (seeds, rows)
    fixed = lambda r: (lambda pos: pos["correct"][r - 1])
    res = {"criteria": {}, "fixed": {}, "comparisons": {}}
    for r in range(1, R_MAX + 1):
        res["fixed"][r] = {str(d): float(rows(fixed(r), d).mean()) for d in DEPTHS}
    ks = list(range(1, TEST_K + 1))
    for c in crit:
        loops = np.array([pos[f"loops_{c}"].mean() for pos in P])
        by_k = np.array([[pos[f"loops_{c}"][pos["k"] == k].mean() for k in ks] for pos in P])  # (seeds, depths)
        res["criteria"][c] = {"threshold": EXIT_THRESHOLDS[c], "mean_loops": float(loops.mean()),
                              "mean_loops_std": float(loops.std(ddof=1)) if len(P) > 1 else 0.0,
                              "loops_by_depth": by_k.mean(0).tolist(),
                              "spearman_by_seed": [spearman(ks, b) for b in by_k],
                              **{str(d): rows(lambda pos: picked(pos, c), d).mean(1).tolist() for d in DEPTHS}}
    kl = lambda pos: picked(pos, "kl")
    at = min(R_MAX, math.ceil(res["criteria"]["kl"]["mean_loops"] - 1e-9))  # the whole r at or above kl's loops
    res["r_at_kl_loops"] = at
    for d in DEPTHS:
        res["comparisons"][f"kl_vs_r{R_MAX}@{d}"] = compare(None, rows(kl, d), rows(fixed(R_MAX), d), rule=RULE)
        res["comparisons"][f"kl_vs_r{at}@{d}"] = reported(compare(None, rows(kl, d), rows(fixed(at), d), rule=RULE,
                                                                  kind="superiority", margin=0.0))
    res["verdict"] = stats.combine(res["comparisons"][f"kl_vs_r{R_MAX}@{d}"]["verdict"] for d in DEPTHS)
    res["fixed_r32_is_the_arms_evaluation"] = matches_eval(src, seeds, P)
    return res


# -----------------------------------------------------------------------------
# the report


def plot(results, path):
    plt = pyplot()
    fig, axes = plt.subplots(len(results), 3, figsize=(15, 4.2 * len(results)), squeeze=False)
    for (model, res), row in zip(results.items(), axes):
        rs = list(range(1, R_MAX + 1))
        for ax, d in zip(row, DEPTHS):
            ax.plot(rs, [res["fixed"][r][str(d)] for r in rs], "k.-", lw=1, ms=3, label="fixed r (mean over seeds)")
            for i, (c, v) in enumerate(res["criteria"].items()):
                acc = np.array(v[str(d)])
                ax.errorbar([v["mean_loops"]], [acc.mean()], xerr=[v["mean_loops_std"]], yerr=[acc.std(ddof=1)],
                            marker="os^Dv"[i % 5], color=f"C{i}", capsize=3, ls="none", label=f"{c} @ {v['threshold']:g}")
            ax.axhline(1 / 6, color="grey", lw=0.8, ls=":")  # chance: 6 answers
            name = f"depth {d}" if d != "beyond" else f"depths {TRAIN_K + 1}-{TEST_K} pooled"
            ax.set(xscale="log", xlabel="loops a labeled position (mean)", ylabel="test accuracy", ylim=(0, 1.02),
                   title=f"{model}: {name}")
        row[0].legend(fontsize=7)
        ks = list(range(1, TEST_K + 1))
        for i, (c, v) in enumerate(res["criteria"].items()):
            row[2].plot(ks, v["loops_by_depth"], marker="os^Dv"[i % 5], color=f"C{i}", ms=4, label=c)
        row[2].axvline(TRAIN_K + 0.5, color="grey", lw=0.8, ls="--")  # the trained depths are left of it
        row[2].set(yscale="log", xlabel="depth of the label", ylabel="loops spent (mean over seeds)", xticks=ks,
                   title=f"{model}: loops by depth, Huginn's defaults")
    fig.suptitle("test split, five seeds: each criterion at Huginn's default threshold against fixed r (one "
                 "trajectory of 32 loops per seed); error bars: std over seeds", fontsize=9)
    save_figures([(fig, path.name)], path.parent)


def report(args, out, src, command, t0):
    seeds = args.seed_list
    try:
        results = {m: measure(load(out, m, seeds), src[m], seeds) for m in MODELS}
    except FileNotFoundError as err:
        sys.exit(f"adaptive_depth.py: error: a sweep has not finished ({err.filename} is missing): run without --report")
    lines = [f"Rule: experiments/rules.json adaptive_depth at {rules_commit()}; code at {git_commit() or None}; seeds "
             f"{args.seeds}; test split; r_max {R_MAX}.", ""]
    for m, res in results.items():
        at = res["r_at_kl_loops"]
        lines += [f"**{m}: kl at 1e-3 against fixed r = {R_MAX}: {res['verdict']}.** Fixed r = {R_MAX} is the arm's own "
                  f"test evaluation row by row: {res['fixed_r32_is_the_arms_evaluation']}.", "",
                  f"| {m} | threshold | mean loops | test depth {TRAIN_K} | test depths {TRAIN_K + 1}-{TEST_K} | "
                  "Spearman (depth, loops) by seed |", "|---|---|---|---|---|---|"]
        for r in sorted({1, 8, at, R_MAX}):
            lines.append(f"| fixed r = {r} | - | {r} | {res['fixed'][r][str(TRAIN_K)]:.3f} | "
                         f"{res['fixed'][r]['beyond']:.3f} | - |")
        for c, v in res["criteria"].items():
            cells = [f"{np.mean(v[str(d)]):.3f} ± {np.std(v[str(d)], ddof=1):.3f}" for d in DEPTHS]
            lines.append(f"| {c} | {v['threshold']:g} | {v['mean_loops']:.2f} ± {v['mean_loops_std']:.2f} | "
                         + " | ".join(cells) + " | " + ", ".join(f"{x:.2f}" for x in v["spearman_by_seed"]) + " |")
        lines += [""] + [line(f"{m}: kl vs fixed r = {r} at {'depth ' + str(d) if d != 'beyond' else 'depths beyond'}",
                              res["comparisons"][f"kl_vs_r{r}@{d}"]) for r in (R_MAX, at) for d in DEPTHS] + [""]
    md = "\n".join(lines)
    (out / "adaptive_depth.md").write_text(md + "\n")
    summary = {"question": RULE["question"], "rule": RULE, "verdicts": {m: r["verdict"] for m, r in results.items()},
               "measured": results, **provenance({}, seeds, command, t0)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    plot(results, out / "adaptive_depth.png")
    print(f"\n{md}\nwrote {out / 'summary.json'}, {out / 'adaptive_depth.md'}, {out / 'adaptive_depth.png'} "
          f"({time.time() - t0:.0f} s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out_dir", default="out/adaptive_depth")
    ap.add_argument("--claims", default="out/claims", help="make claims' folder (its scratch arm and data)")
    ap.add_argument("--compute_matched", default="out/compute_matched", help="make compute_matched's folder")
    ap.add_argument("--seeds", default=",".join(map(str, RULE["seeds"])))
    ap.add_argument("--jobs", type=int, default=2, help="sweeps at a time, one thread each")
    ap.add_argument("--report", action="store_true", help="run nothing: the report of the finished sweeps")
    args = ap.parse_args()
    args.seed_list = [int(s) for s in args.seeds.split(",")]
    out, t0, src = Path(args.out_dir), time.time(), sources(args)
    command = shlex.join(["python", "-m", "experiments.adaptive_depth", *sys.argv[1:]])
    missing = [str(a / f"seed_{s}") for a, _, _ in src.values() for s in args.seed_list
               if not (a / f"seed_{s}" / "model.safetensors").is_file()]
    if missing and not args.report:  # before any sweep runs
        ap.error(f"no trained checkpoint in {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                 + ": run make claims and make compute_matched first, or point --claims / --compute_matched at them")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    if not args.report:
        units = [(m, s) for m in MODELS for s in args.seed_list]
        with ThreadPoolExecutor(args.jobs) as pool, tqdm(total=len(units), unit="sweep") as bar:
            for _ in pool.map(lambda u: sweep(out, *u, src[u[0]], out / "logs" / f"{u[0]}_seed{u[1]}.log"), units):
                bar.update(1)
    report(args, out, src, command, t0)


if __name__ == "__main__":
    main()
