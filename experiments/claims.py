"""
The papers' claims, tested at CPU scale: one command trains every claim's arms under five seeds, evaluates them
on the depth task's test split, and draws each claim's verdict by the rule experiments/rules.json fixed before
the runs, from paired 95% intervals (experiments/stats.py).

    python -m experiments.claims                        # all eight claims (make claims)
    python -m experiments.claims --claim supervision    # one claim (an arm that several claims share runs once)
    python -m experiments.claims --list                 # the claims, their arms and their rules
    python -m experiments.claims --report               # run nothing: the verdicts of the finished arms

The claims are those of McLeish et al. 2025 (arXiv 2511.07384, retrofitted recurrence), Geiping et al. 2025
(arXiv 2502.05171, Huginn) and arXiv 2608.11233 (per-loop supervision); their figures are quoted in CLAIMS below.
The scale: the S3 running-product depth task (data/depth/prepare.py: train depth 6, dev and test rows to depth
12), models of width 64 (experiments/claim_arms.py has every arm's flags). The retrofit's "pretrained parent" is
a tiny 8-layer static model pretrained here on shallow problems (depth <= 4, one seed), cut to (2,2,2) by
surgery.py: the papers' parents are pretrained LMs, ours knows one skill, composing S3 elements a few times, and
the retrofit must learn to loop it. The text half of claim 2 cuts the real SmolLM2-135M (the offline GGUF).

Each comparison is a paired difference a - b over seeds and test rows with its interval and a one-sided paired
t-test; its verdict is holds / does not hold / inconclusive, or not testable here when the claim's positive
control shows nothing. Beside each verdict: the old rule's (the paper's sign on every seed). Writes
out/claims/<claim>/summary.json (paper, comparisons with per-seed values, verdict, the rules' and the code's
commits, commands, seconds) and <claim>.png, and out/claims/claims.md (the table).
"""

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from experiments import claim_plots, stats
from experiments.claim_arms import REPO, STEPS, arms, paths, prepare, run_arms, sh
from experiments.repeat import stats as spread
from plumbing.cli import git_commit
from plumbing.guards import diverged

RULES_FILE = REPO / "experiments" / "rules.json"
RULES = json.loads(RULES_FILE.read_text())
SEEDS = ",".join(map(str, RULES["seeds"]))
TRAIN_K, TEST_K, EXTRAP_K, LOOP_R = (RULES[k] for k in ("train_depth", "test_depth", "extrapolation_depth", "loop_r"))
EVAL_R = ",".join(map(str, [*range(1, TEST_K + 1), 16, 32]))  # r = d for every depth d: the forced-depth reading

# -----------------------------------------------------------------------------
# reading the arms' results


def depth_range(depth):
    """(lo, hi): the task depths a reading pools: one depth, "trained" (1..TRAIN_K) or "beyond" (TRAIN_K+1..TEST_K)."""
    return {"trained": (1, TRAIN_K), "beyond": (TRAIN_K + 1, TEST_K)}.get(depth, (depth, depth))


class Arm:
    """One arm's repeat.py folder: its summary table, its seeds' logs and their test rows."""

    def __init__(self, out, name):
        self.name, self.dir = name, out / "arms" / name
        self.summary = json.loads((self.dir / "summary.json").read_text())
        self.table, self.seeds = self.summary["table"], self.summary["seeds"]
        self._records = {}

    def acc(self, k, r):
        """Per-seed accuracies at depth k (or "trained"/"beyond") and r (static arms: their one r)."""
        cells = self.table[str(k)]
        return np.array(cells[str(r)]["values"] if str(r) in cells else next(iter(cells.values()))["values"])

    def rows(self, depth, r):
        """(seeds, rows) 0/1 correctness on the test rows, in row order: at one depth, or each row's mean over the
        trained depths ("trained") or beyond them ("beyond"), read out after r loops (static arms: their one r)."""
        lo, hi = depth_range(depth)
        out = []
        for s in self.seeds:
            if s not in self._records:
                lines = (self.dir / f"seed_{s}" / "eval" / "results.jsonl").read_text().splitlines()
                self._records[s] = [json.loads(line) for line in lines]
            recs = self._records[s]
            here = r if any(x["r"] == r for x in recs) else recs[0]["r"]
            chosen = sorted((x for x in recs if x["r"] == here), key=lambda x: x["index"])
            out.append([np.mean([c for d, c in zip(x["steps"], x["correct"]) if lo <= d <= hi]) for x in chosen])
        return np.array(out)

    def logs(self):
        """[(train records, eval records)] per seed, from log.jsonl."""
        out = []
        for s in self.seeds:
            recs = [json.loads(line) for line in (self.dir / f"seed_{s}" / "log.jsonl").read_text().splitlines()]
            out.append(([r for r in recs if "loss" in r and "val" not in r], [r for r in recs if "val" in r]))
        return out

    def dev_curves(self, r, metric="trained_error"):
        """Per seed: (cumulative FLOPs, metric at r) at each of train.py's dev evaluations: "trained_error" (1 minus the
        accuracy over the trained depths, each depth's labels alike) or "loss" (the loss over every depth's labels)."""
        def value(v):
            return v["loss"] if metric == "loss" else 1 - float(np.mean([v["acc_by_k"][str(d)] for d in range(1, TRAIN_K + 1)]))

        curves = []
        for train, evals in self.logs():
            flops = {0: 0.0, **{t["step"]: t["flops"] for t in train}}  # step 0: the evaluation before training
            curves.append(([flops[e["step"]] for e in evals], [value(e["val"][str(r)]) for e in evals]))
        return curves

    def flops(self):
        return np.array([train[-1]["flops"] for train, _ in self.logs()])

    def train_seconds(self):
        """Wall seconds the seeds' training took (train.py's elapsed; under whatever load the cores had)."""
        return float(sum(train[-1]["elapsed"] for train, _ in self.logs()))

    def eval_summary(self, seed):
        return json.loads((self.dir / f"seed_{seed}" / "eval" / "summary.json").read_text())


def compare(name, a, b, rule=None, kind=None, margin=None):
    """stats.paired of a - b under the claim's rule (kind and margin may be overridden for a reported comparison),
    with the old rule's answer beside it: the difference beyond the bound on every seed."""
    rule = RULES["claims"][name] if rule is None else rule
    kind, margin = kind or rule["kind"], rule["margin"] if margin is None else margin
    res = stats.paired(a, b, kind=kind, margin=margin, confidence=RULES["confidence"])
    bound = margin if kind == "superiority" else -margin
    res["old_rule"] = "yes" if all(d > bound for d in res["per_seed_diff"]) else "no"
    return res


def line(label, res, digits=3):
    return f"{label}: {res['a']:.{digits}f} vs {res['b']:.{digits}f}, diff {stats.text(res, digits)}"


def reported(res):
    """A comparison only reported (no verdict rests on it): its verdict word is dropped."""
    return {**res, "verdict": "reported"}


# -----------------------------------------------------------------------------
# the claims: the measurement of each, by its rule


def loops(A):
    rows = {n: compare("loops", A[n].rows(TRAIN_K, 8), A[n].rows(TRAIN_K, 1)) for n in ("retrofit", "scratch")}
    rows.update({f"{n}_r32_vs_r8": reported(compare("loops", A[n].rows(TRAIN_K, 32), A[n].rows(TRAIN_K, 8), margin=0.0))
                 for n in ("retrofit", "scratch")})
    text = "; ".join(line(f"{n} depth {TRAIN_K} r=8 vs r=1", rows[n]) for n in ("retrofit", "scratch"))
    return rows, stats.combine(rows[n]["verdict"] for n in ("retrofit", "scratch")), text


def text_loss(A, name):
    """(seeds, 1) minus the last dev loss at r = 4 (larger is better, as stats.paired wants)."""
    return -np.array(A[name].table["val_loss"]["4"]["values"])[:, None]


def pretrained(A):
    rows = {"depth": compare("pretrained", A["retrofit"].rows("trained", 8), A["random"].rows("trained", 8)),
            "text": compare("pretrained", text_loss(A, "text_pretrained"), text_loss(A, "text_random")),
            "text_embeddings_vs_random": reported(compare("pretrained", text_loss(A, "text_embeddings"), text_loss(A, "text_random"))),
            "text_pretrained_vs_embeddings": reported(compare("pretrained", text_loss(A, "text_pretrained"), text_loss(A, "text_embeddings")))}
    vocab = json.loads((paths(A["text_pretrained"].dir.parents[1])["sotu"] / "meta.json").read_text())["vocab_size"]
    uniform = float(np.log(vocab))
    rows["uniform_loss"], rows["left_uniform"] = uniform, bool(-rows["text"]["a"] < uniform - 1)
    verdict = stats.combine([rows["depth"]["verdict"], rows["text"]["verdict"]])
    if verdict == "holds" and not rows["left_uniform"]:
        verdict = "inconclusive"  # the rule: a loss still near uniform says little about pretraining
    loss = lambda res: f"{-res['a']:.2f} vs {-res['b']:.2f} nats (lower is better), diff {stats.text(res, 2)}"
    text = (f"{line('depth <= 6 at r=8, cut parent vs random', rows['depth'])}; SmolLM2 (2,2,2) text dev loss after "
            f"{STEPS['text']} steps, pretrained vs random: {loss(rows['text'])}; embeddings only vs random: "
            f"{loss(rows['text_embeddings_vs_random'])} (uniform {uniform:.2f})")
    return rows, verdict, text


def flops_to(curve, target):
    """FLOPs at which a loss curve first reaches target (linear between evaluations), or None."""
    f, l = curve
    for i in range(len(l)):
        if l[i] <= target:
            if i == 0:
                return f[0]
            return f[i - 1] + (f[i] - f[i - 1]) * (l[i - 1] - target) / (l[i - 1] - l[i])
    return None


CURRICULUM_R = 6  # dev figures are read at the mean r of training (E[r] = rbar + 1 with rbar = 5): one r for every arm


TARGET_ERROR = 0.01  # the trained depths' dev error both arms must reach: the constant run's final one is often 0


def savings(A, name, metric, target=None):
    """Per seed log(FLOPs of the constant run / FLOPs of the curriculum) to reach target in metric (None: the constant
    run's final value, at its final FLOPs), None where the curriculum never reaches it; and the seeds where the constant
    run never reaches it or the untrained curriculum model (step 0) already had it."""
    logs, at_start, const_miss = [], 0, 0
    for c, cur in zip(A["scratch"].dev_curves(CURRICULUM_R, metric), A[name].dev_curves(CURRICULUM_R, metric)):
        goal, base = (c[1][-1], c[0][-1]) if target is None else (target, flops_to(c, target))
        reached = flops_to(cur, goal)
        at_start, const_miss = at_start + (reached == 0), const_miss + (base is None)
        logs.append(None if not reached or base is None else float(np.log(base / reached)))
    got = [x for x in logs if x is not None]
    res = compare("curriculum", np.array(got)[:, None], np.zeros((len(got), 1))) if len(got) >= 2 else {}
    never = len(logs) - len(got)
    return {**res, "log_saving_per_seed": logs, "seeds_never_reaching": never - at_start - const_miss,
            "seeds_constant_never_reaching": const_miss, "seeds_reached_at_step_0": at_start,
            "verdict": "inconclusive" if never else res.get("verdict", "inconclusive")}


def curriculum(A):
    rows = {name: savings(A, name, "trained_error", TARGET_ERROR) for name in ("curriculum_linear", "curriculum_1sqrt")}
    # the rule as first committed read the dev loss over every depth: the changed rule's reason is in rules.json
    rows.update({f"{name}_committed_rule": {**savings(A, name, "loss"), "verdict": "reported"}
                 for name in ("curriculum_linear", "curriculum_1sqrt")})
    verdicts = [rows[n]["verdict"] for n in ("curriculum_linear", "curriculum_1sqrt")]
    verdict = "holds" if "holds" in verdicts else stats.combine(verdicts)  # the rule: either curriculum

    def saving(v):
        text = f"{np.exp(v['diff']):.2f}x [{np.exp(v['low']):.2f}, {np.exp(v['high']):.2f}]" if "diff" in v else "-"
        misses = [f"{v[k]} seeds {w}" for k, w in (("seeds_never_reaching", "never reach it"),
                                                   ("seeds_constant_never_reaching", "whose constant run never does"),
                                                   ("seeds_reached_at_step_0", "start below it")) if v[k]]
        return text + (f" ({', '.join(misses)})" if misses else "")

    text = (f"FLOPs saving to a dev error of {TARGET_ERROR} on depths <= {TRAIN_K} (r={CURRICULUM_R}): linear "
            f"{saving(rows['curriculum_linear'])}, 1-sqrt {saving(rows['curriculum_1sqrt'])}; by the committed rule's dev "
            f"loss over depths 1-{TEST_K}: linear {saving(rows['curriculum_linear_committed_rule'])}, 1-sqrt "
            f"{saving(rows['curriculum_1sqrt_committed_rule'])}")
    return rows, verdict, text


def spikes(train):
    """Loss spikes by train.py's spike test (plumbing/guards.diverged at its default factor 4: over 4x and over 1 nat
    above the level; the nat keeps an r=1 draw of a solved task from counting), against the median of the 50 steps
    before (train.py's level is an EMA of the good steps: a spike it skipped would not be in a log), plus non-finite
    steps."""
    loss = np.array([r["loss"] for r in train], dtype=float)
    return int(sum(diverged(loss[i], float(np.nanmedian(loss[max(0, i - 50):i])) if i else loss[0], 4.0)
                   for i in range(len(loss))))


def optimizer(A):
    count = {n: np.array([spikes(tr) for tr, _ in A[n].logs()], dtype=float) for n in ("muon_paper", "adamw_paper", "adamw_control")}
    rows = {"spikes": {n: spread(c.tolist()) for n, c in count.items()},
            "final_train_loss": {n: spread([float(np.mean([r["loss"] for r in tr[-100:]])) for tr, _ in A[n].logs()])
                                 for n in count},
            "adamw_vs_muon": compare("optimizer", count["adamw_paper"][:, None], count["muon_paper"][:, None])}
    control = bool(count["adamw_control"].sum() > 0)
    verdict = rows["adamw_vs_muon"]["verdict"] if control else "not testable here"
    rows["positive_control_spiked"] = control
    text = (f"spikes per run (mean over seeds): AdamW {count['adamw_paper'].mean():.1f}, Muon {count['muon_paper'].mean():.1f} "
            f"at the paper's lrs, diff {stats.text(rows['adamw_vs_muon'], 2)}; positive control (AdamW 1e-2, no clipping) "
            f"{count['adamw_control'].mean():.1f}; train loss (last 100 steps) Muon {rows['final_train_loss']['muon_paper']['mean']:.3f}, "
            f"AdamW {rows['final_train_loss']['adamw_paper']['mean']:.3f}")
    return rows, verdict, text


def adapter(A):
    rows = {"trained": compare("adapter", A["adapter_ss"].rows("trained", 8), A["retrofit_ss"].rows("trained", 8)),
            "beyond": reported(compare("adapter", A["adapter_ss"].rows("beyond", 8), A["retrofit_ss"].rows("beyond", 8),
                                       kind="superiority", margin=0.0)),
            "by_depth_r8": {n: {k: float(A[n].acc(k, 8).mean()) for k in range(1, TEST_K + 1)} for n in ("retrofit_ss", "adapter_ss")}}
    text = f"{line('depth <= 6 at r=8, adapter only vs full', rows['trained'])}; {line('beyond', rows['beyond'])}"
    return rows, rows["trained"]["verdict"], text


def forced_depth(arm):
    """Per depth d: accuracy at r = d and r = d - 1 (mean over seeds): does the model compute one step a loop?"""
    return {d: {"r=d": float(arm.acc(d, d).mean()), "r=d-1": float(arm.acc(d, d - 1).mean())} for d in range(2, TEST_K + 1)}


def supervision(A):
    names = ("retrofit_ss", "retrofit_final_only", "retrofit")
    rows = {"per_loop_vs_final_only": compare("supervision", A["retrofit_ss"].rows(EXTRAP_K, 16),
                                              A["retrofit_final_only"].rows(EXTRAP_K, 16)),
            "per_loop_vs_all_labels": reported(compare("supervision", A["retrofit_ss"].rows(EXTRAP_K, 16),
                                                       A["retrofit"].rows(EXTRAP_K, 16))),
            "trained_r16": {n: float(A[n].acc("trained", 16).mean()) for n in names},
            "by_depth_r16": {n: {k: float(A[n].acc(k, 16).mean()) for k in range(1, TEST_K + 1)} for n in names},
            "forced_depth": {n: forced_depth(A[n]) for n in names}}
    gain = {n: np.mean([v["r=d"] - v["r=d-1"] for v in rows["forced_depth"][n].values()]) for n in names}
    text = (f"{line(f'depth {EXTRAP_K} at r=16, per-loop vs final answer only', rows['per_loop_vs_final_only'])}; "
            f"final-only on the trained depths {rows['trained_r16']['retrofit_final_only']:.2f}; forced depth, "
            f"accuracy at r = d minus r = d-1 (mean over d = 2..{TEST_K}): per-loop {gain['retrofit_ss']:+.3f}, "
            f"final only {gain['retrofit_final_only']:+.3f}, every label {gain['retrofit']:+.3f}")
    return rows, rows["per_loop_vs_final_only"]["verdict"], text


def cot(A):
    loop = A["retrofit_ss"].rows("beyond", LOOP_R)
    rows = {"loop_r": LOOP_R, "vs_cot": compare("cot", loop, A["cot"].rows("beyond", 1)),
            "vs_cot_small": compare("cot", loop, A["cot_small"].rows("beyond", 1)),
            "trained": {n: float(A[n].acc("trained", LOOP_R if n == "retrofit_ss" else 1).mean()) for n in ("retrofit_ss", "cot", "cot_small")}}
    for n in ("cot", "cot_small"):  # what the chains write beyond their trained length (plumbing/depth_cot.py)
        res = [A[n].eval_summary(s)["results"][0] for s in A[n].seeds]
        rows[f"{n}_tokens_per_answer"] = res[0]["output_tokens_per_answer"]
        rows[f"{n}_diagnosis_by_depth"] = {k: {key: float(np.mean([x["chain_diagnosis_by_k"][k][key] for x in res]))
                                               for key in res[0]["chain_diagnosis_by_k"][k]}
                                           for k in res[0]["chain_diagnosis_by_k"]}
    diag = rows["cot_diagnosis_by_depth"]
    beyond = [str(k) for k in range(TRAIN_K + 1, TEST_K + 1)]
    text = (f"beyond depth 6, loop (r={LOOP_R}) vs chain of the parent's size: {stats.text(rows['vs_cot'])}, vs chain "
            f"of the loop's size: {stats.text(rows['vs_cot_small'])} (accuracies {rows['vs_cot']['a']:.2f}, "
            f"{rows['vs_cot']['b']:.2f}, {rows['vs_cot_small']['b']:.2f}); the parent-size chain beyond depth 6 writes "
            f"{np.mean([diag[k]['right_prefix'] for k in beyond]):.1f} right steps before its first wrong one "
            f"({np.mean([diag[k]['wrong_at_trained_depth_plus_1'] for k in beyond]):.0%} go wrong exactly at step 7), "
            f"{np.mean([diag[k]['non_answer_tokens'] for k in beyond]):.1f} non-answer tokens")
    return rows, stats.combine([rows["vs_cot"]["verdict"], rows["vs_cot_small"]["verdict"]]), text


def static(A):
    loop, base = A["retrofit"], A["static"]
    rows = {"loop_r": LOOP_R, "beyond": compare("static", loop.rows("beyond", LOOP_R), base.rows("beyond", 1)),
            "trained": reported(compare("static", loop.rows("trained", LOOP_R), base.rows("trained", 1))),
            "train_flops": {"loop": float(loop.flops().mean()), "static": float(base.flops().mean())},
            "train_seconds_per_seed": {"loop": loop.train_seconds() / len(loop.seeds),
                                       "static": base.train_seconds() / len(base.seeds)}}
    text = (f"{line(f'beyond depth 6, loop at r={LOOP_R} vs the uncut parent fine-tuned', rows['beyond'])}; train FLOPs "
            f"{rows['train_flops']['loop']:.2e} vs {rows['train_flops']['static']:.2e}")
    return rows, rows["beyond"]["verdict"], text


CLAIMS = {  # name: (number, claim, what the paper reports, arms, measure); the rule is rules.json's
    "loops": (1, "More test-time loops, more accuracy", "2511.07384 / 2502.05171: accuracy rises with test "
              "recurrence up to r = 32 (Llama-3.2 (4,6,4): GSM8K 49.4 at r = 32)", ("retrofit", "scratch"), loops),
    "pretrained": (2, "Pretrained init beats random init of the same shape, same steps", "2511.07384: Llama-3.2 "
                   "init reaches lower loss and higher scores than random init (HellaSwag 55.6 vs 48.3)",
                   ("retrofit", "random", "text_pretrained", "text_random", "text_embeddings"), pretrained),
    "curriculum": (3, "A curriculum over mean r reaches the same loss for fewer FLOPs", "2511.07384: about 1.3x "
                   "fewer FLOPs (1-sqrt / linear curricula vs constant mean r)",
                   ("scratch", "curriculum_linear", "curriculum_1sqrt"), curriculum),
    "optimizer": (4, "Muon is more stable than AdamW on the recurrent model", "2511.07384: AdamW at the paper's lr "
                  "(5e-5) spiked and hit NaN; Muon (1e-3) did not", ("muon_paper", "adamw_paper", "adamw_control"), optimizer),
    "adapter": (5, "Adapter-only training of a frozen base reaches about full training", "2608.11233: 83.8% "
                "(adapter only) vs 84.0% (full); the adapter ahead up to depth 11, behind after",
                ("retrofit_ss", "adapter_ss"), adapter),
    "supervision": (6, "Per-loop supervision extrapolates past the trained depth, outcome-only does not",
                    "2608.11233: about 1.5x the supervised depth, 70% held to depth 18",
                    ("retrofit_ss", "retrofit_final_only", "retrofit"), supervision),
    "cot": (7, "The loop beats writing the steps out as tokens beyond the trained range", "2608.11233: 84% vs 72% "
            "overall; beyond depth 10 53% vs 2.5%; 7.6x fewer output tokens", ("retrofit_ss", "cot", "cot_small"), cot),
    "static": (8, "The loop beats the static-depth baseline trained on the same data", "2511.07384: GSM8K 37.1 static "
               "vs 49.4 at r = 32 (Llama-3.2 (4,6,4))", ("retrofit", "static"), static),
}

# -----------------------------------------------------------------------------
# running


def reinit(cut, out, seed, keep_embeddings):
    """A copy of the SmolLM2 cut with every weight drawn anew by the model's own init under seed, or every weight
    but the (tied) embeddings: the same config, RoPE base and tokenizer files as the cut."""
    import torch
    from model import RecurrentGPT

    if (out / "model.safetensors").is_file():
        return
    shutil.copytree(cut, out, dirs_exist_ok=True)
    parent = RecurrentGPT.from_pretrained(str(cut))
    torch.manual_seed(seed)
    model = RecurrentGPT(parent.config)
    if keep_embeddings:
        with torch.no_grad():
            model.embed_tokens.weight.copy_(parent.embed_tokens.weight)
    model.save_pretrained(str(out))


def run_all(args, out, p, table, names):
    """Data, parents and cuts when needed, then every arm."""
    needed = {"depth"} | {d for n, d in (("static", "parent_data"), ("retrofit_final_only", "final"), ("cot", "cot"),
                                         ("text_pretrained", "sotu")) if n in names}
    if {"retrofit", "retrofit_ss", "adapter_ss", "static", "cot", "cot_small", "retrofit_final_only"} & set(names):
        needed.add("parent_data")
    prepare(p, needed, out / "logs" / "prepare.log", TRAIN_K, TEST_K, args.smoke)
    if "parent_data" in needed:  # the tiny parent, then its cut (surgery's self-check is in the log)
        run_arms(out, ["parent"], table, 1, out / "logs", "1337")
        for d, static in ((p["cut"], []), (p["cut_static"], ["--static"])):  # the loop's cut, and the same 6 layers static
            if not (d / "model.safetensors").is_file():
                sh([sys.executable, "surgery.py", "--init", str(p["parent"]), "--shape", "2,2,2", *static, "--out", str(d),
                    "--overwrite"], out / "logs" / "surgery.log")
    if "sotu" in needed:  # SmolLM2 cut once, and its re-drawn copies per seed
        if not (p["smollm2_cut"] / "model.safetensors").is_file():
            sh([sys.executable, "surgery.py", "--init", "smollm2", "--shape", "2,2,2", "--out", str(p["smollm2_cut"]),
                "--overwrite"], out / "logs" / "surgery.log")
        for s in map(int, args.seeds.split(",")):
            reinit(p["smollm2_cut"], p["smollm2_random"] / f"seed_{s}", s, keep_embeddings=False)
            reinit(p["smollm2_cut"], p["smollm2_random"] / f"embeddings_seed_{s}", s, keep_embeddings=True)
    run_arms(out, names, table, args.jobs, out / "logs", args.seeds)


def finished(out, name, n_seeds):
    s = out / "arms" / name / "summary.json"
    return s.is_file() and len(json.loads(s.read_text())["seeds"]) >= n_seeds


def rules_commit():
    """The commit that last changed rules.json (git log), or None outside git."""
    try:
        cmd = ["git", "log", "-1", "--format=%H", "--", str(RULES_FILE)]
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True).stdout.strip() or None
    except OSError:
        return None


def rules_state():
    """The commit that last changed rules.json, and whether the file holds changes no commit has (then the rule's
    commit cannot vouch for it)."""
    dirty = subprocess.run(["git", "status", "--porcelain", "--", str(RULES_FILE)], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return {"rules": rules_commit(), "rules_uncommitted": bool(dirty), "code": git_commit() or None}


def provenance(A, seeds, command, t0):
    """What a study's summary.json keeps of how it was made: each arm's command, the seeds, the study's command,
    the commits of the code and of the rules, its seconds."""
    return {"arms": {n: a.summary["command"] for n, a in A.items()}, "seeds": seeds, "command": command,
            "commits": {"code": git_commit() or None, "rules": rules_commit()}, "seconds": time.time() - t0}


def report(args, out, chosen, command, t0):
    """summary.json and PNG per claim whose arms are all finished, and claims.md (claims in their order)."""
    rows, n = [], len(args.seeds.split(","))
    commits = {"code": git_commit() or None, "rules": rules_commit()}
    for name in sorted(chosen, key=lambda c: CLAIMS[c][0]):
        num, claim, paper, arm_names, measure = CLAIMS[name]
        missing = [a for a in arm_names if not finished(out, a, n)]
        if missing:
            print(f"claim {name}: not all arms finished ({', '.join(missing)}): not reported")
            rows.append(f"| {num}. {claim} | {paper} | not measured yet (arms {', '.join(missing)} unfinished) | - | - | "
                        f"`python -m experiments.claims --claim {name}` |")
            continue
        A = {a: Arm(out, a) for a in arm_names}
        measured, verdict, text = measure(A)
        old = [v["old_rule"] for v in measured.values() if isinstance(v, dict) and v.get("verdict") not in (None, "reported")
               and "old_rule" in v]
        either = any if name == "curriculum" else all  # the curriculum claim holds for either curriculum
        old_rule = "yes" if old and either(o == "yes" for o in old) else "no"
        d = out / name
        d.mkdir(exist_ok=True)
        summary = {"claim": claim, "number": num, "paper": paper, "rule": RULES["claims"][name], "verdict": verdict,
                   "old_rule_holds": old_rule, "measured": measured, "text": text,
                   "arms": {a: x.summary["command"] for a, x in A.items()}, "seeds": args.seeds, "command": command,
                   "commits": commits, "seconds": time.time() - t0,
                   "train_seconds": sum(x.train_seconds() for x in A.values()),
                   "train_flops": {a: float(x.flops().mean()) for a, x in A.items()}}
        (d / "summary.json").write_text(json.dumps(summary, indent=2))
        claim_plots.plot(name, A, measured, d / f"{name}.png", STEPS, LOOP_R)
        rows.append(f"| {num}. {claim} | {paper} | {text} | **{verdict}** | {old_rule} | "
                    f"`python -m experiments.claims --claim {name}` |")
    md = (f"Rules: experiments/rules.json at {commits['rules']}; code at {commits['code']}; seeds {args.seeds}; "
          f"test split; differences with {RULES['confidence']:.0%} paired intervals (experiments/stats.py).\n\n"
          "| claim | paper | measured here: a vs b, difference [95% interval], p | verdict | old rule (sign on every seed) | command |\n"
          "|---|---|---|---|---|---|\n" + "\n".join(rows))
    (out / "claims.md").write_text(md + "\n")
    print(f"\n{md}\n\nwrote {out}/<claim>/summary.json and .png, {out / 'claims.md'} ({time.time() - t0:.0f} s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--claim", default="all", help=f"all, or comma-separated of: {', '.join(CLAIMS)}")
    ap.add_argument("--out_dir", default="out/claims")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (2 on a 2-core machine)")
    ap.add_argument("--list", action="store_true", help="print the claims, their arms and rules, and stop")
    ap.add_argument("--smoke", action="store_true", help="8 steps an arm, small data: tests the pipeline, not the claims")
    ap.add_argument("--seeds", default=SEEDS, help=f"train.py seeds of every arm ({stats.MIN_SEEDS} for a verdict)")
    ap.add_argument("--report", action="store_true", help="run nothing: the verdicts of the claims whose arms are finished")
    args = ap.parse_args()
    chosen = list(CLAIMS) if args.claim == "all" else args.claim.split(",")
    unknown = [c for c in chosen if c not in CLAIMS]
    if unknown or args.jobs < 1 or len(args.seeds.split(",")) < 2:
        ap.error(f"unknown claim {unknown}: choose from {', '.join(CLAIMS)}" if unknown else
                 "--jobs must be >= 1" if args.jobs < 1 else "--seeds: at least two (an interval needs them; five for a verdict)")
    if args.list:
        for name, (num, claim, paper, arm_names, _) in CLAIMS.items():
            rule = RULES["claims"][name]
            print(f"{num}. {name}: {claim}\n   paper: {paper}\n   arms: {', '.join(arm_names)}\n   metric: {rule['metric']}"
                  f"\n   {rule['kind']}, margin {rule['margin']}: holds if {rule['holds']}")
        return
    out = Path(args.out_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    p, t0, command = paths(out), time.time(), shlex.join(["python", "-m", "experiments.claims", *sys.argv[1:]])
    table = arms(p, EVAL_R, args.smoke)
    names = list(dict.fromkeys(a for c in chosen for a in CLAIMS[c][3]))
    names.sort(key=lambda n: n.startswith("text"))  # the slow SmolLM2 arms last
    print(f"claims: {', '.join(chosen)}; {len(names)} arms, {args.jobs} at a time; logs in {out / 'logs'}")
    if not args.report:
        run_all(args, out, p, table, names)
    report(args, out, chosen, command, t0)


if __name__ == "__main__":
    main()
