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


def plot(name, A, measured, path, steps, loop_r):
    """Claim name's figure to path: A the arms' seed summaries, measured its summary's figures, steps claim_arms.STEPS,
    loop_r the loop's r against the baselines (rules.json)."""
    plt = pyplot()
    two = name in ("loops", "pretrained", "optimizer", "supervision", "cot")
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=(11 if two else 6, 4), squeeze=False)
    ax = axes[0]
    if name == "loops":
        by_r(ax[0], A, ["retrofit", "scratch"], 6, "k=6 (the trained depth)")
        by_r(ax[1], A, ["retrofit", "scratch"], 9, "k=9 (1.5x, beyond)")
    elif name == "pretrained":
        by_r(ax[0], A, ["retrofit", "random"], "trained", "depth task, k <= 6")
        arms = ["text_pretrained", "text_embeddings", "text_random"]
        loss = [np.array(A[n].table["val_loss"]["4"]["values"]) for n in arms]
        ax[1].bar([n[5:] for n in arms], [v.mean() for v in loss], yerr=[v.std(ddof=1) for v in loss], capsize=4)
        ax[1].axhline(measured["uniform_loss"], color="grey", lw=0.8, ls=":")  # uniform over the vocabulary
        ax[1].set(ylabel=f"dev loss at r=4 after {steps['text']} steps", title="SmolLM2 (2,2,2) on data/sotu")
    elif name == "curriculum":
        for i, arm in enumerate(["scratch", "curriculum_linear", "curriculum_1sqrt"]):
            for j, (f, l) in enumerate(A[arm].dev_curves(6)):
                ax[0].plot(f, l, color=f"C{i}", lw=0.8, label=("constant rbar" if arm == "scratch" else arm)
                           if j == 0 else None)
        ax[0].set(xlabel="training FLOPs", ylabel="dev loss at r=6", yscale="log", title="loss against FLOPs (each seed)")
        ax[0].legend(fontsize=7)
    elif name == "optimizer":
        names = ["muon_paper", "adamw_paper", "adamw_control"]
        curves(ax[0], A, names, "loss", "train loss (25-step mean)")
        curves(ax[1], A, names, "grad_norm", "gradient norm (25-step mean)")
    elif name == "adapter":
        by_k(ax[0], A, [("retrofit_ss", 8), ("adapter_ss", 8)], "full blocks vs adapter only (frozen base)")
    elif name == "supervision":
        by_k(ax[0], A, [("retrofit_ss", 16), ("retrofit_final_only", 16), ("retrofit", 16)],
             "per-loop vs final answer only vs every label")
        for i, n in enumerate(["retrofit_ss", "retrofit_final_only", "retrofit"]):  # forced depth: r = d
            f = measured["forced_depth"][n]
            ax[1].plot([int(d) for d in f], [v["r=d"] for v in f.values()], "o-", color=f"C{i}", label=f"{n}, r = d")
            ax[1].plot([int(d) for d in f], [v["r=d-1"] for v in f.values()], "x:", color=f"C{i}", label=f"{n}, r = d-1")
        ax[1].set(xlabel="depth d", ylabel="accuracy", ylim=(0, 1.02), title="forced depth: d loops for depth d")
        ax[1].legend(fontsize=6)
    elif name == "cot":
        by_k(ax[0], A, [("retrofit_ss", loop_r), ("cot", 1), ("cot_small", 1)], "loop vs token chains of thought")
        for n in ("cot", "cot_small"):
            diag = measured[f"{n}_diagnosis_by_depth"]
            ax[1].plot([int(k) for k in diag], [v["right_prefix"] for v in diag.values()], "o-", label=n)
        ax[1].plot(list(DEPTHS), list(DEPTHS), color="grey", lw=0.8, ls=":", label="the whole chain")
        ax[1].set(xlabel="depth k", ylabel="right chain tokens before the first wrong one", title="what the chains write")
        ax[1].legend(fontsize=7)
    elif name == "static":
        by_k(ax[0], A, [("retrofit", loop_r), ("static", 1)], "loop vs the uncut parent fine-tuned")
    fig.suptitle(f"claim: {name} (mean ± std over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
