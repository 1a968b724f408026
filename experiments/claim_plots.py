"""
The figures of claims.py: one PNG per claim (accuracy against r or depth per arm, loss against FLOPs,
loss and gradient-norm curves), mean over seeds with the spread as error bars or thin lines.

    python -m experiments.claims --claim loops      # writes out/claims/loops/loops.png among the rest
"""

import numpy as np

from plumbing.plots import pyplot

DEPTHS = range(1, 13)


def by_k(ax, A, arms_r, title, train_k=6):
    """Accuracy against depth k, one line per (arm, r), mean ± std over seeds."""
    for name, r in arms_r:
        acc = [A[name].acc(k, r) for k in DEPTHS]
        ax.errorbar(list(DEPTHS), [a.mean() for a in acc], yerr=[a.std(ddof=1) for a in acc], marker="o", capsize=3,
                    label=f"{name} (r={r})")
    ax.axvline(train_k + 0.5, color="grey", lw=0.8, ls="--")  # the trained depths are left of it
    ax.axhline(1 / 6, color="grey", lw=0.8, ls=":")  # chance: 6 answers
    ax.set(xlabel="depth k (trained k <= 6)", ylabel="accuracy", ylim=(0, 1.02), title=title)
    ax.legend(fontsize=7)


def by_r(ax, A, names, k, title):
    """Accuracy against test loops r at depth k (or "trained"), one line per arm."""
    for name in names:
        rs = sorted(A[name].table[str(k)], key=int)
        acc = [A[name].acc(k, r) for r in rs]
        ax.errorbar([int(r) for r in rs], [a.mean() for a in acc], yerr=[a.std(ddof=1) for a in acc], marker="o",
                    capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.axhline(1 / 6, color="grey", lw=0.8, ls=":")
    ax.set(xticks=[int(r) for r in rs], xticklabels=rs, xlabel="test loops r", ylabel="accuracy", ylim=(0, 1.02), title=title)
    ax.legend(fontsize=7)


def smooth(x, n=25):
    x = np.asarray(x, dtype=float)
    return np.convolve(x, np.ones(n) / n, mode="valid") if len(x) > n else x


def curves(ax, A, names, key, ylabel):
    """A train-log field (loss, grad_norm) against step, smoothed over 25 steps, mean over seeds (thin: each seed)."""
    for i, name in enumerate(names):
        per_seed = [smooth([r[key] for r in train]) for train, _ in A[name].logs()]
        n = min(len(c) for c in per_seed)
        for c in per_seed:
            ax.plot(c[:n], color=f"C{i}", lw=0.4, alpha=0.5)
        ax.plot(np.mean([c[:n] for c in per_seed], axis=0), color=f"C{i}", label=name)
    ax.set(xlabel="step", ylabel=ylabel, yscale="log")
    ax.legend(fontsize=7)


def plot(name, A, measured, path, steps):
    """Claim name's figure to path: A the arms' seed summaries, measured its summary's figures, steps claims.STEPS."""
    plt = pyplot()
    two = name in ("loops", "pretrained", "optimizer", "supervision")
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=(11 if two else 6, 4), squeeze=False)
    ax = axes[0]
    if name == "loops":
        by_r(ax[0], A, ["retrofit", "scratch"], 6, "k=6 (the trained depth)")
        by_r(ax[1], A, ["retrofit", "scratch"], 9, "k=9 (1.5x, beyond)")
    elif name == "pretrained":
        by_r(ax[0], A, ["retrofit", "random"], "trained", "depth task, k <= 6")
        loss = measured["text_val_loss_r4"]
        ax[1].bar(list(loss), [v["mean"] for v in loss.values()], yerr=[v["std"] for v in loss.values()], capsize=4)
        ax[1].set(ylabel=f"val loss at r=4 after {steps['text']} steps", title="SmolLM2 (2,2,2) on data/sotu")
    elif name == "curriculum":
        for i, arm in enumerate(["scratch", "curriculum_linear", "curriculum_1sqrt"]):
            for j, (f, l) in enumerate(A[arm].loss_curves()):
                ax[0].plot(f, l, color=f"C{i}", lw=0.8, label=("constant rbar" if arm == "scratch" else arm)
                           if j == 0 else None)
        ax[0].set(xlabel="training FLOPs", ylabel="train loss (100-step mean)", yscale="log",
                  title="loss against FLOPs (each seed)")
        ax[0].legend(fontsize=7)
    elif name == "optimizer":
        names = list(dict.fromkeys(["muon_paper", "adamw_paper", A["_best_muon"].name, A["_best_adamw"].name]))
        curves(ax[0], A, names, "loss", "train loss (25-step mean)")
        curves(ax[1], A, names, "grad_norm", "gradient norm (25-step mean)")
    elif name == "adapter":
        by_k(ax[0], A, [("retrofit_ss", 8), ("adapter_ss", 8)], "full blocks vs adapter only (frozen base)")
    elif name == "supervision":
        by_k(ax[0], A, [("retrofit_ss", 16), ("retrofit", 16)], "per-loop vs outcome-only supervision")
        by_r(ax[1], A, ["retrofit_ss", "retrofit"], 9, "k=9 (1.5x the trained depth)")
    elif name == "cot":
        by_k(ax[0], A, [("retrofit_ss", measured["loop_r"]), ("cot", 1)], "loop vs token chain of thought")
    elif name == "static":
        by_k(ax[0], A, [("retrofit", measured["loop_r"]), ("static", 1)], "loop vs the uncut parent fine-tuned")
    fig.suptitle(f"claim: {name} (mean ± std over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
