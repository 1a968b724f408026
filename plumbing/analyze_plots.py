"""
The figures of analyze.py (matplotlib, PNG files): distance of every token's state to its limit, the PCA
paths of the states, path independence over seeds of s_0, iterations to converge per token, and the
layer statistics of a parent. Numbers come in computed; nothing here computes them.

    python analyze.py --init out/smollm2 --r 64      # writes these PNGs into out/analyze
"""

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np


def plot_distance(rel, labels, r_star, path):
    T, n = rel.shape
    fig, ax = plt.subplots(figsize=(min(4 + 0.12 * n, 16), 1.5 + 0.28 * T))
    im = ax.imshow(np.log10(np.maximum(rel, 1e-8)), aspect="auto", cmap="magma", vmin=-8, interpolation="nearest")
    ax.set_yticks(range(T), labels, fontsize=7, family="monospace")
    ax.set_xlabel("iteration i (0 = s_0)")
    ax.set_title(f"log10 ||s_i - s*|| / ||s*|| per token, s* = s_{r_star} (floored at 1e-8)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_pca(proj, evr, labels, start, path):
    T, n, k = proj.shape
    npanel = max(1, k // 2)
    fig, axes = plt.subplots(1, npanel, figsize=(5.2 * npanel, 5), squeeze=False)
    colors = plt.get_cmap("tab20")(np.arange(T) % 20)
    for j, ax in enumerate(axes[0]):
        a, b = 2 * j, min(2 * j + 1, k - 1)
        for t in range(T):
            ax.plot(proj[t, :, a], proj[t, :, b], "-", lw=0.8, color=colors[t], alpha=0.8)
            ax.plot(proj[t, 0, a], proj[t, 0, b], "o", ms=3, color=colors[t])
            ax.plot(proj[t, -1, a], proj[t, -1, b], "*", ms=8, color=colors[t])
            ax.annotate(labels[t], (proj[t, -1, a], proj[t, -1, b]), fontsize=6, family="monospace")
        ax.set_xlabel(f"PC{a + 1} ({evr[a]:.1%})")
        ax.set_ylabel(f"PC{b + 1} ({evr[b]:.1%})")
    fig.suptitle(f"PCA of all tokens' states, iterations {start}..{start + n - 1} (o first, * last)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_path_independence(pi, seeds, path):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    axes[0].semilogy(np.maximum(pi["state_dist_per_iteration"], 1e-12), ".-")
    axes[0].set_xlabel("iteration i")
    axes[0].set_title("||s_i^a - s_i^b|| / (||s_i^a|| + ||s_i^b||), mean over pairs and tokens", fontsize=9)
    for ax, key, title in ((axes[1], "js", "JS divergence of final p (nats)"), (axes[2], "argmax_agreement", "argmax agreement")):
        im = ax.imshow(pi[key], cmap="viridis", vmin=0, vmax=1 if key == "argmax_agreement" else None)
        ax.set_xticks(range(len(seeds)), seeds)
        ax.set_yticks(range(len(seeds)), seeds)
        ax.set_xlabel("seed of s_0")
        ax.set_title(title)
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_convergence(labels, needed, r, kl, path):
    """The prompt's tokens, colored by iterations needed, once per criterion; then the KL heatmap."""
    width = 110  # characters per text line
    cmap, norm = plt.get_cmap("viridis"), matplotlib.colors.LogNorm(vmin=1, vmax=max(r, 2))
    lines = []  # lay the tokens out as monospace text once, reuse for every criterion
    x, y = 0, 0
    for lab in labels:
        if x + len(lab) > width and x > 0:
            x, y = 0, y + 1
        lines.append((x, y))
        x += len(lab) + 1
    nrows = y + 1
    heights = [0.35 * nrows + 0.6] * len(needed) + [1.5 + 0.12 * len(labels)]
    fig, axes = plt.subplots(len(needed) + 1, 1, figsize=(13, sum(heights)), gridspec_kw={"height_ratios": heights})
    for ax, (name, n) in zip(axes, needed.items()):
        ax.set_xlim(-1, width + 1)
        ax.set_ylim(nrows, -1)
        ax.axis("off")
        for lab, (x, y), k in zip(labels, lines, n):
            ax.text(x, y, lab, family="monospace", fontsize=8, va="center",
                    bbox=dict(boxstyle="square,pad=0.15", fc=cmap(norm(k)), ec="none", alpha=0.8))  # fmt: skip
            ax.text(x, y + 0.42, str(k), fontsize=5, color="dimgray", va="center")
        ax.set_title(f"iterations needed, {name} (max {r} = not converged)", fontsize=9)
    sm = matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=list(axes[:-1]), fraction=0.02)
    ax = axes[-1]
    logkl = np.log10(np.maximum(kl.T, 1e-12))
    im = ax.imshow(logkl, aspect="auto", cmap="magma", interpolation="nearest", vmin=-12, vmax=max(1.0, logkl.max()),
                   extent=(0.5, kl.shape[0] + 0.5, len(labels) - 0.5, -0.5))  # fmt: skip
    ax.set_yticks(range(len(labels)), labels, fontsize=6, family="monospace")
    ax.set_xlabel("i")
    ax.set_title("log10 KL(p_i || p_{i+1}) (floored at 1e-12)", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.02)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_layers(bi, D, split, path):
    L = len(bi)
    part = {}
    for name in ("prelude", "core", "coda"):
        a, b = split["layers"][name]
        part.update({i: name for i in range(a, b + 1)})
    colors = {"prelude": "tab:blue", "core": "tab:orange", "coda": "tab:green", None: "lightgray"}
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
    axes[0].bar(range(L), bi, color=[colors[part.get(i)] for i in range(L)])
    axes[0].set_xlabel("layer l (gray: dropped)")
    axes[0].set_title(f"block influence 1 - cos(h_l, h_l+1); split {split['spec']} (blue/orange/green)", fontsize=9)
    im = axes[1].imshow(D, origin="lower", aspect="auto", cmap="viridis", extent=(-0.5, L - 0.5, 0.5, L + 0.5))
    axes[1].set_xlabel("first layer l of the block")
    axes[1].set_ylabel("block size n")
    axes[1].set_title("angular distance arccos(cos(h_l, h_l+n)) / pi", fontsize=9)
    fig.colorbar(im, ax=axes[1])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
