"""
The papers' claims, reproduced at CPU scale: one command trains every claim's arms under 3 seeds,
evaluates them, and says for each claim whether it holds here, with the figures.

    python -m experiments.claims                        # all eight claims (make claims)
    python -m experiments.claims --claim supervision    # one claim (an arm that several claims share runs once)
    python -m experiments.claims --list                 # the claims, their arms and the rule for "holds"

The claims are those of McLeish et al. 2025 (arXiv 2511.07384, retrofitted recurrence), Geiping et al.
2025 (arXiv 2502.05171, Huginn) and arXiv 2608.11233 (per-loop supervision); their figures are quoted in
CLAIMS below. The scale: the S3 running-product depth task (data/depth/prepare.py: train depth k <= 6,
validation k up to 12 on unseen problems), models of width 64, 800 steps of 64 rows from scratch and 500 for the
retrofit and its baselines (config/cpu_depth.json's recipe, fewer steps: see STEPS), on one thread each. The
retrofit's "pretrained parent" is a tiny 8-layer static model pretrained here on shallow problems (k <= 4, one
seed): the paper's parents are pretrained LMs, ours knows one skill, composing S3 elements a few times, and
the retrofit must learn to loop it (a cut (2,2,2) of it by surgery.py, whose [0 | I] adapter makes r = 1 the
layer-dropped parent). The text half of claim 2 cuts the real SmolLM2-135M
(the offline GGUF). A SmolLM2 retrofit on the depth task (make retrofit_depth) is too slow a seed for this
command.

"Holds" is decided per claim by a rule stated with it (usually: the effect has the paper's sign on every
seed, paired by seed); a claim that does not hold is reported with its figures like one that does.
Writes out/claims/<claim>/summary.json (paper, measured figures with per-seed values, holds, command,
seeds, git commit, seconds) and out/claims/<claim>/<claim>.png, and out/claims/claims.md (the table);
the runs are in out/claims/arms/<arm>/seed_S (repeat.py folders: a finished seed is reused, a killed one
resumes, another command's is refused).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from experiments import claim_plots
from plumbing.cli import git_commit
from plumbing.guards import diverged
from experiments.repeat import stats

REPO = Path(__file__).resolve().parents[1]
SEEDS = "1337,2,3"
TRAIN_K, EXTRAP_K = 6, 9  # the trained depth, and 1.5x it (arXiv 2608.11233's extrapolation range)
LOOP_R = 32  # the loop's r against the baselines: the paper's (GSM8K at r = 32), fixed before looking at the results

# -----------------------------------------------------------------------------
# the arms: train.py flags (after the data and parent they need); repeat.py runs each under SEEDS


def paths(out):
    d = out / "data"
    return dict(parent_data=d / "parent", depth=d / "depth", cot=d / "cot", sotu=d / "sotu",
                parent=out / "arms" / "parent" / "seed_1337", cut=out / "cut")


# Training steps per arm family, chosen so that the whole command fits about an hour on 2 idle cores (RESULTS.md
# "Do the papers' claims hold" has its times): from scratch (claims 1, 3, 4), the retrofit and the baselines it
# is compared with at equal steps (claims 1, 2, 5-8), the SmolLM2 text arms (claim 2).
STEPS = {"scratch": 800, "retrofit": 500, "text": 10}


def arms(p, smoke=False):
    """name -> (train.py args, repeat.py args). Every tiny arm is config/cpu_depth.json's recipe (Muon 1e-2
    + AdamW 2e-3, mean r 5, backprop 4, 64 rows a step) for STEPS steps, with what the arm changes. smoke: 8 steps
    and 50 validation rows (the pipeline's test; its figures mean nothing)."""
    tiny = ["--config", "config/cpu_depth.json", "--data", str(p["depth"])]
    # from scratch: validation at the final mean r every 100 steps (claims 3 and 4 plot loss against FLOPs
    # and steps), the divergence guard off so that an unstable optimizer shows its spikes instead of stopping
    scratch = [*tiny, "--max_iters", str(STEPS["scratch"]), "--eval_interval", "100", "--eval_r", "5",
               "--diverge_factor", "0", "--max_bad_steps", "1000"]
    short = ["--max_iters", str(STEPS["retrofit"])]  # the retrofit and every arm compared with it
    retro = [*tiny, *short, "--init", str(p["cut"])]
    static = ["--r", "1"]  # no loop: one evaluation
    text = ["--data", str(p["sotu"]), "--shape", "2,2,2", "--max_iters", str(STEPS["text"]), "--warmup_iters", "3",
            "--batch_size", "4", "--block_size", "128", "--learning_rate", "1e-3", "--adam_lr", "3e-4",
            "--mean_recurrence", "4", "--grad_loops", "4", "--eval_interval", str(STEPS["text"]), "--eval_iters", "4",
            "--eval_r", "4", "--log_interval", "5"]
    a = {
        "parent": (["--config", "config/cpu_depth.json", "--data", str(p["parent_data"]), "--static", "--shape",
                    "2,4,2", "--max_iters", "400", "--eval_interval", "400", "--eval_r", "1"], ["--seeds", "1337", *static]),
        "retrofit": (retro, []),
        "retrofit_ss": ([*retro, "--step_supervision"], []),
        "adapter_ss": ([*retro, "--step_supervision", "--freeze", "base"], []),
        "random": ([*tiny, *short, "--shape", "2,2,2"], []),  # the cut's shape, random init
        "static": ([*tiny, *short, "--init", str(p["parent"])], static),  # the uncut parent fine-tuned, no loop
        "cot": (["--config", "config/cpu_depth.json", "--data", str(p["cot"]), *short, "--init", str(p["parent"])], static),
        "scratch": (scratch, []),  # = Muon at the tuned 1e-2: claims 1, 3 (constant rbar) and 4 share it
        "curriculum_linear": ([*scratch, "--curriculum", "linear", "--curriculum_frac", "0.25"], []),
        "curriculum_1sqrt": ([*scratch, "--curriculum", "1-sqrt", "--curriculum_frac", "0.75"], []),
        "muon_paper": ([*scratch, "--learning_rate", "1e-3", "--adam_lr", "5e-5"], []),
        "adamw_paper": ([*scratch, "--optimizer", "adamw", "--adam_lr", "5e-5"], []),
        "text_pretrained": (["--init", "smollm2", *text], ["--eval", "none"]),
        "text_random": (["--init", "scratch", "--n_embd", "576", "--n_head", "9", "--n_kv_head", "3",
                         "--intermediate_size", "1536", *text], ["--eval", "none"]),
    }
    for lr in SWEEP["muon"]:  # the small sweep of claim 4, one seed each (the best then gets all three)
        a[f"muon_lr{lr}"] = ([*scratch, "--learning_rate", lr], ["--seeds", "1337"])
    for lr in SWEEP["adamw"]:
        a[f"adamw_lr{lr}"] = ([*scratch, "--optimizer", "adamw", "--adam_lr", lr], ["--seeds", "1337"])
    if smoke:  # the last flag wins in train.py's and repeat.py's parsers
        a = {n: ([*t, "--max_iters", "8", "--eval_interval", "4", "--log_interval", "4", "--eval_iters", "1",
                  *([] if n.startswith("text") else ["--eval_r", "5"])],
                 [*r, "--eval_limit", "30"] if "none" not in r else r) for n, (t, r) in a.items()}
    return a


SWEEP = {"muon": ("3e-3", "3e-2"), "adamw": ("1e-3", "3e-3", "1e-2")}  # Muon 1e-2 is the "scratch" arm

# -----------------------------------------------------------------------------
# reading the arms' results


class Arm:
    """One arm's repeat.py folder: its summary table and its seeds' logs."""

    def __init__(self, out, name):
        self.name, self.dir = name, out / "arms" / name
        self.summary = json.loads((self.dir / "summary.json").read_text())
        self.table, self.seeds = self.summary["table"], self.summary["seeds"]

    def acc(self, k, r):
        """Per-seed accuracies at depth k (or "trained"/"beyond") and r (static arms: their one r)."""
        cells = self.table[str(k)]
        return np.array(cells[str(r)]["values"] if str(r) in cells else next(iter(cells.values()))["values"])

    def logs(self):
        """[(train records, eval records)] per seed, from log.jsonl."""
        out = []
        for s in self.seeds:
            recs = [json.loads(line) for line in (self.dir / f"seed_{s}" / "log.jsonl").read_text().splitlines()]
            out.append(([r for r in recs if "loss" in r and "val" not in r], [r for r in recs if "val" in r]))
        return out

    def loss_curves(self):
        """Per seed: (cumulative FLOPs, train loss averaged over the last LOSS_WINDOW steps). The train loss, not the
        validation loss: validation rows go to k = 12, and the loss on the depths nobody trains (the model confidently
        wrong there) swings by ~1 nat between evaluations and seeds, hiding the trained depths' loss."""
        curves, w = [], LOSS_WINDOW
        for train, _ in self.logs():
            loss = np.convolve([r["loss"] for r in train], np.ones(w) / w, mode="valid")
            curves.append(([r["flops"] for r in train][w - 1:], loss.tolist()))
        return curves

    def flops(self):
        return np.array([train[-1]["flops"] for train, _ in self.logs()])

    def train_seconds(self):
        """Wall seconds the seeds' training took (train.py's elapsed; under whatever load the cores had)."""
        return float(sum(train[-1]["elapsed"] for train, _ in self.logs()))


def fig(values):
    """A measured figure: mean ± std over seeds, with the values."""
    return stats(np.asarray(values, dtype=float).tolist())


def every(a, b):
    """The paired comparison the claims use: a > b on every seed (seed i of one arm against seed i of the other)."""
    return bool(np.all(np.asarray(a) > np.asarray(b)))


def fmt(s, digits=2):
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


# -----------------------------------------------------------------------------
# the claims: what each paper reports, the arms, and the measurement


def loops(A):
    rows, holds = {}, True
    for name in ("retrofit", "scratch"):
        a = A[name]
        r1, r8, r32 = a.acc(TRAIN_K, 1), a.acc(TRAIN_K, 8), a.acc(TRAIN_K, 32)
        rows[name] = {"k6_r1": fig(r1), "k6_r8": fig(r8), "k6_r32": fig(r32), "gain_r1_r8": fig(r8 - r1)}
        holds &= every(r8, r1 + 0.05)
    text = "; ".join(f"{n}: k=6 {fmt(v['k6_r1'])} at r=1 -> {fmt(v['k6_r8'])} at r=8 -> {fmt(v['k6_r32'])} at r=32"
                     for n, v in rows.items())
    return rows, holds, text


def pretrained(A):
    depth = {n: A[n].acc("trained", 8) for n in ("retrofit", "random")}
    loss = {n: A[n].table["val_loss"]["4"]["values"] for n in ("text_pretrained", "text_random")}
    rows = {"depth_seen_r8": {n: fig(v) for n, v in depth.items()}, "text_val_loss_r4": {n: fig(v) for n, v in loss.items()}}
    holds = every(depth["retrofit"], depth["random"]) and every(loss["text_random"], loss["text_pretrained"])
    text = (f"depth k<=6 at r=8: cut parent {fmt(rows['depth_seen_r8']['retrofit'])} vs random "
            f"{fmt(rows['depth_seen_r8']['random'])}; SmolLM2 text val loss ({STEPS['text']} steps): cut {fmt(rows['text_val_loss_r4']['text_pretrained'])} "
            f"vs random {fmt(rows['text_val_loss_r4']['text_random'])}")
    return rows, holds, text


LOSS_WINDOW = 100  # steps in the train-loss mean (r is drawn per step: a single step's loss is mostly its r)


def flops_to(curve, target):
    """FLOPs at which a val-loss curve first reaches target (linear between evaluations), or None."""
    f, l = curve
    for i in range(len(l)):
        if l[i] <= target:
            if i == 0:
                return f[0]
            return f[i - 1] + (f[i] - f[i - 1]) * (l[i - 1] - target) / (l[i - 1] - l[i])
    return None


def curriculum(A):
    const = A["scratch"].loss_curves()
    rows, holds = {}, True
    for name in ("curriculum_linear", "curriculum_1sqrt"):
        ratios = []
        for c, cur in zip(const, A[name].loss_curves()):  # seed by seed: the constant run's final loss is the target
            reached = flops_to(cur, c[1][-1])
            ratios.append(c[0][-1] / reached if reached else 0.0)  # 0: never reached it
        rows[name] = {"flops_saving": fig(ratios), "final_train_loss": fig([cur[1][-1] for cur in A[name].loss_curves()])}
        holds &= every(ratios, np.ones(len(ratios)))
    rows["scratch"] = {"final_train_loss": fig([c[1][-1] for c in const])}
    text = (f"FLOPs to the constant-rbar run's final train loss ({fmt(rows['scratch']['final_train_loss'], 3)}, 100-step mean), constant / curriculum: "
            + ", ".join(f"{n.split('_')[1]} {fmt(v['flops_saving'])}x" for n, v in rows.items() if "flops_saving" in v))
    return rows, holds, text


def spikes(train):
    """Loss spikes by train.py's spike test (plumbing/guards.diverged at its default factor 4: over 4x and over 1 nat
    above the level; the nat keeps an r=1 draw of a solved task from counting), against the median of the 50 steps
    before (train.py's level is an EMA of the good steps: a spike it skipped would not be in a log), plus non-finite
    steps."""
    loss = np.array([r["loss"] for r in train], dtype=float)
    return int(sum(diverged(loss[i], float(np.nanmedian(loss[max(0, i - 50):i])) if i else loss[0], 4.0)
                   for i in range(len(loss))))


def best_lr(out, opt):
    """The sweep's arm (one seed) with the lowest final train loss (100-step mean), for optimizer opt; Muon's
    includes "scratch"."""
    names = [f"{opt}_lr{lr}" for lr in SWEEP[opt]] + (["scratch"] if opt == "muon" else [])
    final = {n: Arm(out, n).loss_curves()[0][1][-1] for n in names}
    return min(final, key=lambda n: final[n] if np.isfinite(final[n]) else np.inf), final


def optimizer(A):
    rows = {}
    for name, a in A.items():
        if name.startswith("_"):  # the best swept arms, under their own names already
            continue
        logs = a.logs()
        rows[name] = {"final_train_loss": fig([c[1][-1] for c in a.loss_curves()]),
                      "spikes": fig([spikes(tr) for tr, _ in logs]),
                      "max_grad_norm": fig([max(r["grad_norm"] for r in tr) for tr, _ in logs])}
    spk = lambda n: np.array(rows[n]["spikes"]["values"])
    muon, adamw = A["_best_muon"].name, A["_best_adamw"].name
    holds = every(spk("adamw_paper"), spk("muon_paper")) and every(spk(adamw) + 0.5, spk(muon))
    text = "; ".join(f"{n}: train loss {fmt(v['final_train_loss'], 3)}, spikes {fmt(v['spikes'], 1)}, max grad norm "
                     f"{fmt(v['max_grad_norm'], 1)}" for n, v in rows.items() if n in ("muon_paper", "adamw_paper", muon, adamw))
    return rows, holds, text + f" (best sweep lr: {muon}, {adamw})"


def adapter(A):
    full, only = A["retrofit_ss"].acc("trained", 8), A["adapter_ss"].acc("trained", 8)
    rows = {"seen_r8": {"full": fig(full), "adapter_only": fig(only)},
            "beyond_r8": {"full": fig(A["retrofit_ss"].acc("beyond", 8)), "adapter_only": fig(A["adapter_ss"].acc("beyond", 8))},
            "by_k_r8": {n: {k: fig(A[n].acc(k, 8)) for k in range(1, 13)} for n in ("retrofit_ss", "adapter_ss")}}
    holds = bool(np.mean(only) >= np.mean(full) - 0.05)  # "about what full training reaches": within 5 points
    text = (f"k<=6 at r=8: full blocks {fmt(rows['seen_r8']['full'])} vs adapter only {fmt(rows['seen_r8']['adapter_only'])}; "
            f"k>6: {fmt(rows['beyond_r8']['full'])} vs {fmt(rows['beyond_r8']['adapter_only'])}")
    return rows, holds, text


def supervision(A):
    ss, out = A["retrofit_ss"].acc(EXTRAP_K, 16), A["retrofit"].acc(EXTRAP_K, 16)
    rows = {"k9_r16": {"per_loop": fig(ss), "outcome_only": fig(out)},
            "by_k_r16": {n: {k: fig(A[n].acc(k, 16)) for k in range(1, 13)} for n in ("retrofit_ss", "retrofit")}}
    holds = bool(np.mean(ss) >= 0.7 and np.mean(out) < 0.7 and every(ss, out))
    text = f"k=9 (1.5x the trained depth) at r=16: per-loop {fmt(rows['k9_r16']['per_loop'])} vs outcome-only {fmt(rows['k9_r16']['outcome_only'])}"
    return rows, holds, text


def cot(A):
    loop, chain, r = A["retrofit_ss"], A["cot"], LOOP_R
    rows = {"loop_r": r, "beyond": {"loop": fig(loop.acc("beyond", r)), "cot": fig(chain.acc("beyond", 1))},
            "trained": {"loop": fig(loop.acc("trained", r)), "cot": fig(chain.acc("trained", 1))},
            "by_k": {n: {k: fig(a.acc(k, r if n == "loop" else 1)) for k in range(1, 13)} for n, a in (("loop", loop), ("cot", chain))},
            "output_tokens_per_answer": {"loop": 1.0, "cot": json.loads(  # the mean k of the prompts: the same every seed
                (chain.dir / f"seed_{chain.seeds[0]}" / "eval" / "summary.json").read_text())["results"][0]["output_tokens_per_answer"]}}
    holds = every(loop.acc("beyond", r), chain.acc("beyond", 1))
    text = (f"k>6: loop (r={r}) {fmt(rows['beyond']['loop'])} vs token chain {fmt(rows['beyond']['cot'])}; k<=6: "
            f"{fmt(rows['trained']['loop'])} vs {fmt(rows['trained']['cot'])}; output tokens per answer 1 vs "
            f"{rows['output_tokens_per_answer']['cot']:.1f}")
    return rows, holds, text


def static(A):
    loop, base, r = A["retrofit"], A["static"], LOOP_R
    rows = {"loop_r": r, **{part: {"loop": fig(loop.acc(part, r)), "static": fig(base.acc(part, 1))} for part in ("trained", "beyond")},
            "train_flops": {"loop": fig(loop.flops()), "static": fig(base.flops())}}
    holds = every(loop.acc("beyond", r), base.acc("beyond", 1))
    text = (f"loop at r={r} vs the uncut parent fine-tuned: k<=6 {fmt(rows['trained']['loop'])} vs {fmt(rows['trained']['static'])}, "
            f"k>6 {fmt(rows['beyond']['loop'])} vs {fmt(rows['beyond']['static'])}; train FLOPs "
            f"{rows['train_flops']['loop']['mean']:.2e} vs {rows['train_flops']['static']['mean']:.2e}")
    return rows, holds, text


CLAIMS = {  # name: (number, claim, what the paper reports, arms, rule for "holds", measure)
    "loops": (1, "More test-time loops, more accuracy", "2511.07384 / 2502.05171: accuracy rises with test "
              "recurrence up to r = 32 (Llama-3.2 (4,6,4): GSM8K 49.4 at r = 32)", ("retrofit", "scratch"),
              "on every seed, at the trained depth k=6, r=8 beats r=1 by >= 5 points, for the retrofit and from scratch", loops),
    "pretrained": (2, "Pretrained init beats random init of the same shape, same steps", "2511.07384: Llama-3.2 "
                   "init reaches lower loss and higher scores than random init (HellaSwag 55.6 vs 48.3)",
                   ("retrofit", "random", "text_pretrained", "text_random"),
                   "on every seed: higher k<=6 accuracy at r=8 (depth task) and lower text val loss (SmolLM2, data/sotu)", pretrained),
    "curriculum": (3, "A curriculum over mean r reaches the same loss for fewer FLOPs", "2511.07384: about 1.3x "
                   "fewer FLOPs (1-sqrt / linear curricula vs constant mean r)",
                   ("scratch", "curriculum_linear", "curriculum_1sqrt"),
                   "on every seed, the curriculum reaches the constant run's final train loss (100-step mean) with fewer FLOPs", curriculum),
    "optimizer": (4, "Muon is more stable than AdamW on the recurrent model", "2511.07384: AdamW at the paper's lr "
                  "(5e-5) spiked and hit NaN; Muon (1e-3) did not",
                  ("muon_paper", "adamw_paper", "scratch", *[f"muon_lr{lr}" for lr in SWEEP["muon"]],
                   *[f"adamw_lr{lr}" for lr in SWEEP["adamw"]]),
                  "on every seed AdamW has more loss spikes than Muon, at the paper's lrs and at each one's best swept lr", optimizer),
    "adapter": (5, "Adapter-only training of a frozen base reaches about full training", "2608.11233: 83.8% "
                "(adapter only) vs 84.0% (full); the adapter ahead up to depth 11, behind after",
                ("retrofit_ss", "adapter_ss"), "adapter-only k<=6 accuracy at r=8 within 5 points of full training (mean)", adapter),
    "supervision": (6, "Per-loop supervision extrapolates past the trained depth, outcome-only does not",
                    "2608.11233: about 1.5x the supervised depth, 70% held to depth 18", ("retrofit_ss", "retrofit"),
                    "per-loop >= 0.7 and outcome-only < 0.7 at k=9 (1.5x) and r=16 (means), per-loop ahead on every seed", supervision),
    "cot": (7, "The loop beats writing the steps out as tokens beyond the trained range", "2608.11233: 84% vs 72% "
            "overall; beyond depth 10 53% vs 2.5%; 7.6x fewer output tokens", ("retrofit_ss", "cot"),
            "on every seed the loop (r=32) is ahead of the token chain of thought beyond k=6", cot),
    "static": (8, "The loop beats the static-depth baseline trained on the same data", "2511.07384: GSM8K 37.1 static "
               "vs 49.4 at r = 32 (Llama-3.2 (4,6,4))", ("retrofit", "static"),
               "on every seed the loop at r=32 is ahead of the uncut parent fine-tuned, beyond k=6", static),
}

# -----------------------------------------------------------------------------
# running


def sh(cmd, log=None):
    """Run one command in the repo on one thread (the figures depend on the thread count); its output to log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(log, "a") if log else open(os.devnull, "w") as f:
        if subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT).returncode:
            sys.exit(f"claims.py: error: {shlex.join(cmd[:3])} failed: see {log or 'its output'}, fix it and rerun "
                     "(finished runs are kept)")


def prepare(p, needed, log, smoke=False):
    """The data sets, each made once (a half-made one, without its meta.json, is made again)."""
    py = sys.executable
    depth = ["data/depth/prepare.py", "--train_k", str(TRAIN_K), "--test_k", "12",
             *(["--num_train", "2000", "--num_val", "100"] if smoke else [])]
    steps = [("parent_data", [py, "data/depth/prepare.py", "--train_k", "4", "--test_k", "6", "--num_train", "1000",
                              "--num_val", "200", "--out_dir", str(p["parent_data"])]),
             ("depth", [py, *depth, "--out_dir", str(p["depth"])]),
             ("cot", [py, *depth, "--cot", "--out_dir", str(p["cot"])]),
             ("sotu", [py, "data/sotu/prepare.py", "--tokenizer", "smollm2", "--limit", "3" if smoke else "40", "--out_dir", str(p["sotu"])])]
    for name, cmd in steps:
        if name in needed and not (p[name] / "meta.json").is_file():
            sh(cmd, log)


def run_arms(out, names, table, jobs, log_dir, seeds=SEEDS):
    """repeat.py for each arm, `jobs` at a time (one thread each)."""
    def one(name):
        train_args, rep_args = table[name]
        rep = rep_args if "--seeds" in rep_args else ["--seeds", seeds, *rep_args]
        sh([sys.executable, "-m", "experiments.repeat", "--out_dir", str(out / "arms" / name), *rep, "--", *train_args],
           log_dir / f"{name}.log")
        return name

    with ThreadPoolExecutor(jobs) as pool, tqdm(total=len(names), desc="arms", unit="arm") as bar:
        for name in pool.map(one, names):
            bar.set_postfix_str(name)
            bar.update()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--claim", default="all", help=f"all, or comma-separated of: {', '.join(CLAIMS)}")
    ap.add_argument("--out_dir", default="out/claims")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (2 on a 2-core machine)")
    ap.add_argument("--list", action="store_true", help="print the claims, their arms and rules, and stop")
    ap.add_argument("--smoke", action="store_true", help="8 steps an arm, small data: tests the pipeline, not the claims")
    ap.add_argument("--seeds", default=SEEDS, help="train.py seeds of every arm (3 at least for a figure)")
    ap.add_argument("--report", action="store_true", help="run nothing: summarize the claims whose arms are finished")
    args = ap.parse_args()
    chosen = list(CLAIMS) if args.claim == "all" else args.claim.split(",")
    unknown = [c for c in chosen if c not in CLAIMS]
    if unknown or args.jobs < 1 or len(args.seeds.split(",")) < 2:
        ap.error(f"unknown claim {unknown}: choose from {', '.join(CLAIMS)}" if unknown else
                 "--jobs must be >= 1" if args.jobs < 1 else "--seeds: at least two (a spread needs them; three for a figure)")
    if args.list:
        for name, (num, claim, paper, arm_names, rule, _) in CLAIMS.items():
            print(f"{num}. {name}: {claim}\n   paper: {paper}\n   arms: {', '.join(arm_names)}\n   holds if: {rule}")
        return
    out = Path(args.out_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    p, t0, command = paths(out), time.time(), shlex.join(["python", "-m", "experiments.claims", *sys.argv[1:]])
    table = arms(p, args.smoke)
    names = list(dict.fromkeys(a for c in chosen for a in CLAIMS[c][3]))
    names.sort(key=lambda n: n.startswith("text"))  # the slow SmolLM2 arms last
    retro_needs = {"retrofit", "retrofit_ss", "adapter_ss", "static", "cot"}
    needed = {"depth"} | ({"parent_data"} if retro_needs & set(names) else set()) | (
        {"cot"} if "cot" in names else set()) | ({"sotu"} if "text_pretrained" in names else set())
    print(f"claims: {', '.join(chosen)}; {len(names)} arms, {args.jobs} at a time; logs in {out / 'logs'}")
    if not args.report:
        run_all(args, out, p, table, names, needed, retro_needs & set(names), "optimizer" in chosen)
    report(args, out, chosen, command, t0)


def run_all(args, out, p, table, names, needed, retrofit, sweep):
    """Data, parent and cut when needed, every arm, then the best swept lrs under all seeds."""
    prepare(p, needed, out / "logs" / "prepare.log", args.smoke)
    if retrofit:  # the tiny parent, then its cut (surgery's self-check is in the log)
        run_arms(out, ["parent"], table, 1, out / "logs")
        if not (p["cut"] / "model.safetensors").is_file():
            sh([sys.executable, "surgery.py", "--init", str(p["parent"]), "--shape", "2,2,2", "--out", str(p["cut"]),
                "--overwrite"], out / "logs" / "surgery.log")
    run_arms(out, names, table, args.jobs, out / "logs", args.seeds)
    if sweep:  # the best swept lr of each optimizer, now under all seeds
        again = [n for n in (best_lr(out, opt)[0] for opt in ("muon", "adamw")) if n != "scratch"]
        run_arms(out, again, {n: (table[n][0], []) for n in again}, args.jobs, out / "logs", args.seeds)


def finished(out, name, n_seeds):
    s = out / "arms" / name / "summary.json"
    return s.is_file() and len(json.loads(s.read_text())["seeds"]) >= n_seeds


def report(args, out, chosen, command, t0):
    """summary.json and PNG per claim whose arms are all finished, and claims.md (claims in their order)."""
    git, rows, n = git_commit() or None, [], len(args.seeds.split(","))
    for name in sorted(chosen, key=lambda c: CLAIMS[c][0]):
        num, claim, paper, arm_names, rule, measure = CLAIMS[name]
        best = {}
        if name == "optimizer" and all(finished(out, a, 1) for a in arm_names):
            best = {o: best_lr(out, o)[0] for o in ("muon", "adamw")}
        missing = [a for a in (*arm_names, *best.values()) if not finished(out, a, 1 if "_lr" in a else n)]
        if missing or (name == "optimizer" and not best):
            print(f"claim {name}: not all arms finished ({', '.join(missing)}): not reported")
            rows.append(f"| {num}. {claim} | {paper} | not measured yet (arms {', '.join(missing)} unfinished) | - | "
                        f"`python -m experiments.claims --claim {name}` |")
            continue
        A = {a: Arm(out, a) for a in arm_names}
        if name == "optimizer":
            A["_best_muon"], A["_best_adamw"] = (A[best[o]] if best[o] in A else Arm(out, best[o]) for o in ("muon", "adamw"))
        measured, holds, text = measure(A)
        d = out / name
        d.mkdir(exist_ok=True)
        summary = {"claim": claim, "number": num, "paper": paper, "rule": rule, "holds": holds, "measured": measured,
                   "text": text, "arms": {n: a.summary["command"] for n, a in A.items()}, "seeds": args.seeds,
                   "command": command, "git_commit": git, "seconds": time.time() - t0,
                   "train_seconds": sum(a.train_seconds() for k, a in A.items() if not k.startswith("_"))}
        (d / "summary.json").write_text(json.dumps(summary, indent=2))
        claim_plots.plot(name, A, measured, d / f"{name}.png", STEPS)
        rows.append(f"| {num}. {claim} | {paper} | {text} | {'yes' if holds else 'no'} | `python -m experiments.claims --claim {name}` |")
    md = (f"| claim | paper | measured here (mean ± std over {n} seeds) | holds here | command |\n|---|---|---|---|---|\n"
          + "\n".join(rows))
    (out / "claims.md").write_text(md + "\n")
    print(f"\n{md}\n\nwrote {out}/<claim>/summary.json and .png, {out / 'claims.md'} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
