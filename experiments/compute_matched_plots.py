"""
The compute-matched study's two figures (experiments/compute_matched.py writes them with its report):

  compute_matched.png       accuracy against training FLOPs, one line per arm, from train.py's own evaluations along
                            each run (dev), the test split's mean ± std at each run's end, the wall-time point marked
  compute_matched_test.png  the verdict's picture, test only: accuracy against inference FLOPs a token at equal
                            training FLOPs, the retrofit at each r, every baseline at its one r

    python -m experiments.compute_matched --report   # redraws both from the finished arms
"""

import numpy as np

from experiments.claims import RULES
from plumbing.plots import pyplot, save_figures


def dev_curve(arm, r, offset=None):
    """(step, FLOPs, dev accuracy at depth 6, pooled beyond) at each of train.py's evaluations, mean over seeds;
    offset: per seed FLOPs before this run (phase 2 continues phase 1), whose step 0 is then left out."""
    k, pts = RULES["train_depth"], []
    for i, (train, evals) in enumerate(arm.logs()):
        flops = {0: 0.0, **{t["step"]: t["flops"] for t in train}}
        base = 0.0 if offset is None else offset[i]
        acc = lambda e: e["val"].get(str(r), next(iter(e["val"].values())))["acc_by_k"]
        pts.append([(e["step"], base + flops[e["step"]], acc(e)[str(k)],
                     np.mean([v for d, v in acc(e).items() if int(d) > k]))
                    for e in evals if offset is None or e["step"] > 0])
    return np.mean(np.array(pts, dtype=float), axis=0)  # (evaluations, 4)


def plot(A, measured, baselines, path):
    plt = pyplot()
    r, k = measured["r"], RULES["train_depth"]
    curves = {"retrofit": np.concatenate([dev_curve(A["retrofit_phase1"], r),
                                          dev_curve(A["retrofit"], r, A["retrofit_phase1"].flops())])}
    curves.update({b: dev_curve(A[b], 1) for b in baselines})
    style = {"retrofit": "C0", "uncut_flops": "C1", "static6_flops": "C2"}
    wall = measured["wall"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for j, (ax, depth, title) in enumerate(zip(axes, (k, "beyond"), (f"depth {k} (deepest trained)",
                                                                       f"depths {k + 1}-{RULES['test_depth']} pooled"))):
        for name, c in curves.items():
            color = style[name]
            test = A[name].acc(depth, r if name == "retrofit" else 1)
            label = f"{name} (r={r})" if name == "retrofit" else f"{name} (lr {measured['lr'][name]:g})"
            ax.plot(c[:, 1], c[:, 2 + j], color=color, marker=".", label=label)
            point = c[c[:, 0] == wall.get(name.split("_")[0], {}).get("wall_steps", -1)]
            if name != "retrofit" and len(point):  # where the retrofit's wall time of training steps ends
                ax.plot(point[:, 1], point[:, 2 + j], color=color, marker="x", ms=10, ls="none")
            ax.errorbar([measured["cost"][name]["train_flops"]], [test.mean()], yerr=[test.std(ddof=1)], color=color,
                        marker="*", ms=11, capsize=3)
        ax.axvline(measured["cost"]["retrofit"]["train_flops"], color="grey", lw=0.8, ls=":")  # the FLOPs matched
        ax.axhline(1 / 6, color="grey", lw=0.8, ls=":")  # chance: 6 answers
        ax.set(xlabel="training FLOPs (train.py's count)", ylabel="accuracy", ylim=(0, 1.02), title=title)
    axes[0].legend(fontsize=7)
    fig.suptitle("lines: dev accuracy at train.py's evaluations (mean over seeds); x: where the retrofit's wall time "
                 "ends\nstars: test, mean ± std over seeds, at each run's end; dotted: the retrofit's FLOPs, chance (1/6)",
                 fontsize=9)
    save_figures([(fig, path.name)], path.parent)


def plot_test(A, measured, baselines, plan, path):
    """The verdict's picture, test split only: accuracy against inference FLOPs a token, every arm at the retrofit's
    training FLOPs; the retrofit at each evaluated r, each baseline at its one r (mean ± std over seeds)."""
    plt = pyplot()
    k, inf = RULES["train_depth"], plan["inference_flops_per_token"]
    rs = [r for r in A["retrofit"].table[str(k)] if r in inf["retrofit"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, depth, title in zip(axes, (k, "beyond"), (f"depth {k}", f"depths {k + 1}-{RULES['test_depth']}")):
        acc = [A["retrofit"].acc(depth, r) for r in rs]
        x = [inf["retrofit"][r] for r in rs]
        ax.errorbar(x, [a.mean() for a in acc], yerr=[a.std(ddof=1) for a in acc], marker="o", capsize=3,
                    label="retrofit, r = " + ", ".join(rs))
        for r, xi, a in zip(rs, x, acc):
            ax.annotate(f"r={r}", (xi, a.mean()), textcoords="offset points", xytext=(4, -12), fontsize=7)
        for b in baselines:
            a = A[b].acc(depth, 1)
            ax.errorbar([inf[b.split("_")[0]]], [a.mean()], yerr=[a.std(ddof=1)], marker="s", capsize=3, label=b)
        diffs = [(b.split("_")[0], measured["comparisons"][f"{b}@{depth}"]) for b in baselines]
        ax.axhline(1 / 6, color="grey", lw=0.8, ls=":")  # chance: 6 answers
        ax.set(xscale="log", xlabel="inference FLOPs a token", ylabel="test accuracy", ylim=(0, 1.02),
               title=f"{title}, r = {measured['r']} minus\n" + "; ".join(
                   f"{b} {d['diff']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]" for b, d in diffs))
    axes[0].legend(fontsize=7)
    fig.suptitle(f"test split, mean ± std over {len(A['retrofit'].seeds)} seeds; every arm trained to "
                 f"{plan['target']['flops']:.3g} FLOPs; titles: the paired difference, 95% interval", fontsize=9)
    save_figures([(fig, path.name)], path.parent)
