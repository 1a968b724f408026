"""
Adaptive depth over seeds: each seed's exit sweep (eval_math.py --task depth --exit_sweep, plumbing/exit_sweep.py),
summarized per criterion as mean ± std over the seeds, and how many seeds reach the two targets of adaptive
depth: within 1 point of fixed r_max's accuracy over every depth at no more than a third of its loops, and mean
loops rising with the task depth k (Spearman's correlation of k and the mean loops at k >= 0.9).

Per seed and criterion the threshold is picked on that seed's sweep: the fewest mean loops within 1 point of
fixed r_max over all depths (the sweep's "best threshold over all depths"); Huginn's default thresholds
(sample.EXIT_THRESHOLDS) are a second table, picked by nobody.

    python -m experiments.exit_seeds out/gate_smollm2/seed_*/sweep
    python -m experiments.exit_seeds --kmax 6 out/gate_scratch/seed_*/sweep    # targets over k <= 6 only
"""

import argparse
import json
from pathlib import Path

import numpy as np

from exit_gate import EXIT_THRESHOLDS, ZERO_SHOT
from plumbing.exit_sweep import best_thresholds, spearman


def seed_rows(result, kmax):
    """{criterion: (threshold, mean loops, accuracy, spearman)} at the best threshold over k <= kmax and at
    Huginn's defaults (criterion + " (default)"), plus fixed r_max's accuracy; all over k <= kmax."""
    ks = sorted(int(k) for k in result["fixed"][-1]["by_k"] if int(k) <= kmax)
    # every position of the depth task's val rows holds one label of each k: equal weights per k
    counts = {k: 1 for k in ks}
    over = lambda e, key: float(np.mean([e["by_k"][str(k)][key] for k in ks]))
    rows = {}
    for c, (e, within) in best_thresholds(result, counts, kmax).items():
        rows[c] = (e["threshold"], over(e, "mean_loops"), over(e, "accuracy"),
                   spearman(ks, [e["by_k"][str(k)]["mean_loops"] for k in ks]), within)
    for c in ZERO_SHOT:
        e = next((e for e in result["adaptive"] if e["criterion"] == c and e["threshold"] == EXIT_THRESHOLDS[c]), None)
        if e is not None:
            rows[c + " (default)"] = (e["threshold"], over(e, "mean_loops"), over(e, "accuracy"),
                                      spearman(ks, [e["by_k"][str(k)]["mean_loops"] for k in ks]), True)
    return rows, over(result["fixed"][-1], "accuracy")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="directories holding exit_frontier.json, one per seed")
    ap.add_argument("--kmax", type=int, default=0, help="depths counted (default: every depth of the sweep)")
    args = ap.parse_args(argv)
    results = []
    for d in args.sweeps:
        path = Path(d) / "exit_frontier.json"
        try:
            results.append(json.loads(path.read_text()))
        except (OSError, ValueError) as err:
            ap.error(f"{path}: {getattr(err, 'strerror', None) or err} (run eval_math.py --exit_sweep there first)")
    kmax = args.kmax or max(int(k) for k in results[0]["fixed"][-1]["by_k"])
    r_max = results[0]["r_max"]
    per_seed = [seed_rows(r, kmax) for r in results]
    fixed = [f for _, f in per_seed]
    ms = lambda v: f"{np.mean(v):.3f} ± {np.std(v):.3f}"
    print(f"{len(results)} seeds, depths k <= {kmax}, r_max {r_max}; fixed r={r_max} accuracy {ms(fixed)}")
    print("| criterion | thresholds | mean loops | accuracy | Spearman(k, loops) | seeds within 1 pt at <= "
          f"{r_max / 3:.1f} loops | seeds with Spearman >= 0.9 |\n|---|---|---|---|---|---|---|")
    for c in per_seed[0][0]:
        got = [rows[c] for rows, _ in per_seed if c in rows]
        thr, loops, acc, rho = ([g[i] for g in got] for i in range(4))
        met = sum(a >= f - 0.01 - 1e-9 and lo <= r_max / 3 for (_, lo, a, _, _), f in zip(got, fixed))
        rising = sum(r >= 0.9 for r in rho)
        print(f"| {c} | {', '.join(f'{t:g}' for t in thr)} | {ms(loops)} | {ms(acc)} | "
              f"{np.mean(rho):.3f} (min {np.min(rho):.3f}) | {met}/{len(got)} | {rising}/{len(got)} |")


if __name__ == "__main__":
    main()
