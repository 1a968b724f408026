"""
eval_math.py's report: accuracy (or loss) per r with its standard error sqrt(p(1-p)/n), by task depth on the
depth task, the printed table and the PNGs. Plumbing a reader of the evaluation may skip.

    python eval_math.py --init out/depth --task depth --data data/depth --r 1,2,4,8,16,32   # prints the table, writes the PNGs
"""

import math
from pathlib import Path

import numpy as np



def acc_se(flags):
    n = len(flags)
    p = sum(flags) / n if n else float("nan")
    return p, math.sqrt(p * (1 - p) / n) if n else float("nan")


def summarize(args, model, records, meta=None):
    rows = []
    for r in args.r:
        recs = [x for x in records if x["r"] == r]
        row = {"r": r, "flops_per_token": model.inference_flops_per_token(r)}
        if args.task == "loss":
            losses = [x["loss"] for x in recs]
            row.update(n=len(recs), loss=sum(x["loss_sum"] for x in recs) / max(sum(x["tokens"] for x in recs), 1),
                       loss_se=float(np.std(losses, ddof=1) / math.sqrt(len(losses))) if len(losses) > 1 else None)
        elif args.task == "depth":  # by_k: by task depth (the key of results files before the split names)
            flags = [c for x in recs for c in x["correct"]]
            depths = [d for x in recs for d in x["steps"]]
            seen = (meta.get("seen_in_train") or {}).get(args.split_name, {})
            by_k = {}
            for d in sorted(set(depths)):
                p, se = acc_se([c for c, dd in zip(flags, depths) if dd == d])
                by_k[str(d)] = {"accuracy": p, "se": se, "n": depths.count(d), "seen_in_train": seen.get(str(d))}
            row.update(n=len(flags), by_k=by_k)
            for name, sel in (("trained", lambda d: d <= meta["train_max_k"]), ("beyond", lambda d: d > meta["train_max_k"])):
                p, se = acc_se([c for c, d in zip(flags, depths) if sel(d)])
                row.update({f"accuracy_{name}_depth": p, f"se_{name}_depth": se})
            if meta.get("cot"):  # the whole chain's accuracy and the tokens written per answer
                from plumbing.depth_cot import chain_summary
                row.update(chain_summary(recs, meta["train_max_k"]))
        else:
            p, se = acc_se([x["correct"] for x in recs])
            row.update(n=len(recs), accuracy=p, se=se, mean_tokens=float(np.mean([x["tokens"] for x in recs])),
                       loops_per_token=float(np.mean([x["loops_per_token"] for x in recs])),
                       answered=sum(x["extracted"] is not None for x in recs) / max(len(recs), 1),
                       seconds_per_problem=recs[0]["seconds_per_problem"] if recs else None)
            if args.task == "gsm8k":
                row["strict_accuracy"], row["strict_se"] = acc_se([x["strict_correct"] for x in recs])
        rows.append(row)
    return rows


def print_table(args, rows, meta=None):
    print(f"\n{args.task} results ({args.init}), +- one standard error:")
    if args.task == "depth":
        depths, dmax = sorted(rows[0]["by_k"], key=int), meta["train_max_k"]
        print(f"accuracy on {args.split_name} by task depth (rows, * = beyond the trained depth {dmax}) and r (columns); "
              f"in train: the fraction of these problems that training labels")
        print(" depth in train" + "".join(f"{'r=' + str(x['r']):>15}" for x in rows))
        for d in depths:
            seen = rows[0]["by_k"][d]["seen_in_train"]
            print(f"{d:>5}{'*' if int(d) > dmax else ' '}{'' if seen is None else f'{seen:.2f}':>9}"
                  + "".join(f"{x['by_k'][d]['accuracy']:>8.3f}+-{x['by_k'][d]['se']:.3f}" for x in rows))
        for name in ("trained", "beyond"):  # (labels of one row are correlated: the se here is a lower bound)
            print(f"{name:>15}" + "".join(f"{x[f'accuracy_{name}_depth']:>8.3f}+-{x[f'se_{name}_depth']:.3f}"
                                          for x in rows))
        if meta.get("cot"):
            from plumbing.depth_cot import chain_table
            print(chain_table(rows))
        return
    cols = [("loss", "loss", "loss_se")] if args.task == "loss" else [("accuracy", "accuracy", "se")]
    cols += [("strict", "strict_accuracy", "strict_se")] if args.task == "gsm8k" else []
    extra = [] if args.task == "loss" else [("tokens", "mean_tokens"), ("loops/tok", "loops_per_token")]
    print(f"{'r':>4} {'GFLOP/tok':>10}" + "".join(f"{c[0]:>17}" for c in cols) + "".join(f"{e[0]:>10}" for e in extra)
          + f"{'n':>7}")
    for x in rows:
        cells = "".join(f"{x[v]:>8.4f} +- {x[e] if x[e] is not None else float('nan'):.4f}" for _, v, e in cols)
        print(f"{x['r']:>4} {x['flops_per_token'] / 1e9:>10.4f}{cells}" + "".join(f"{x[e[1]]:>10.2f}" for e in extra)
              + f"{x['n']:>7}")


def _r_axis(ax, rows):
    ax.set_xscale("log", base=2)
    ax.set(xticks=[x["r"] for x in rows], xticklabels=[x["r"] for x in rows], xlabel="test recurrence r")


def plot(args, rows, out_dir):
    """PNGs: accuracy (or loss) against r and against inference FLOPs per token; depth: (k, r) heatmap + lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = []
    if args.task == "depth":
        depths = sorted(rows[0]["by_k"], key=int)
        fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4.2))
        im = a0.imshow([[x["by_k"][d]["accuracy"] for x in rows] for d in depths], vmin=0, vmax=1, aspect="auto",
                       origin="lower")
        a0.set(xticks=range(len(rows)), xticklabels=[x["r"] for x in rows], yticks=range(len(depths)),
               yticklabels=depths, xlabel="test recurrence r", ylabel="task depth",
               title=f"accuracy by (depth, r), {args.split_name}")
        fig.colorbar(im, ax=a0)
        for d in depths:
            a1.errorbar([x["r"] for x in rows], [x["by_k"][d]["accuracy"] for x in rows],
                        yerr=[x["by_k"][d]["se"] for x in rows], marker="o", label=f"depth {d}")
        _r_axis(a1, rows)
        a1.set(ylim=(-0.02, 1.02), ylabel="accuracy", title=f"accuracy against r (trained depths <= "
               f"{args.train_max_k})")
        a1.legend(fontsize=7, ncol=2)
        figs.append((fig, "depth_accuracy.png"))
    else:
        key, se = ("loss", "loss_se") if args.task == "loss" else ("accuracy", "se")
        for x_key in ("r", "flops_per_token"):
            fig, ax = plt.subplots(figsize=(5.5, 4))
            ax.errorbar([x[x_key] for x in rows], [x[key] for x in rows], yerr=[x[se] or 0 for x in rows],
                        marker="o", capsize=3, label=Path(args.init).name)
            _r_axis(ax, rows) if x_key == "r" else ax.set(xscale="log", xlabel="inference FLOPs per token")
            if key == "accuracy":  # from 0, so small differences do not look like large ones
                ax.set_ylim(0, max(0.05, 1.15 * max(x[key] + x[se] for x in rows)))
            ax.set(ylabel=key, title=f"{args.task}: {key} against {'r' if x_key == 'r' else 'compute'}")
            ax.legend()
            figs.append((fig, f"{key}_vs_{'r' if x_key == 'r' else 'flops'}.png"))
    from plumbing.plots import save_figures

    return save_figures(figs, out_dir)
