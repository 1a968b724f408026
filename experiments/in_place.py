"""
What does a retrofit in place keep? SmolLM2-135M keeps all 30 layers (prelude 0-13, core 14-15, coda 16-29) and
loop 1 feeds the core the prelude's output itself (surgery.py --first_loop identity, arXiv 2608.11233's
identity-preserving path), so at r = 1 the model is the parent bit for bit; the adapter re-injects the prelude's
output from loop 2 on. Trained on the depth task, does it gain from its loops, and what happens to the parent's
text loss at r = 1? The verdicts follow experiments/rules.json "in_place", written before the runs.

    python -m experiments.in_place               # the whole study (make in_place); finished seeds are reused
    python -m experiments.in_place --report      # run nothing: the report of the finished arms
    python -m experiments.in_place --smoke --out_dir /tmp/in_place_smoke   # the pipeline at a few steps, no verdict

The arms (experiments/repeat.py folders under OUT/arms; a finished seed is reused, a killed one resumes), each
phase 1 then phase 2 of config/cpu_retrofit_depth*.json at a quarter of their steps (100 + 12: the budget):
  core          --freeze outer: the core's two blocks and the adapter train, everything else is the parent's (5 seeds)
  adapter       --freeze base: the adapter alone (the first seed)
  rev_core      from core's first seed, 50 steps on the reversed rule (prepare.py --rule reversed), core trained
  rev_adapter   the same, the adapter alone
  mix_core      from core's first seed, 50 steps on the two rules mixed by a coin per row (--rule both)
  core_kl       core with a KL term towards the parent on text (train.py --kl_parent, plumbing/kl_parent.py):
                the rule's remedy, trained only when core fails the retention margin (or --kl asks)
  cut222        SmolLM2 cut to (2,2,2) by dropping 24 layers (every other result here), all its weights trained,
                the same steps: the accuracy table's comparison (the first seed)
Beside the training, eval_math.py reads (OUT/evals/<model>/<what>): the text loss at r = 1 of the parent and every
trained model on two corpora no arm trains on (data/sotu's held-out speeches; Python's own documentation,
pydoc_data.topics, which ships with CPython); the other rule's test rows for the interference arms and their start.

Writes OUT/summary.json, OUT/in_place.md (the tables), OUT/in_place.png (accuracy against r beside the (2,2,2)
cut's) and OUT/in_place_retention.png (text loss at r = 1 against the parent's, with the rule's intervals).
"""

import argparse
import json
import os
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from experiments import compute_matched, stats
from experiments.claim_arms import run_arms, run_units, sh, sh_once
from experiments.claims import RULES, Arm, compare, line, provenance, rules_commit
from plumbing.cli import git_commit
from plumbing.plots import pyplot, save_figures

RULE = RULES["in_place"]
TRAIN_K, TEST_K = RULES["train_depth"], RULES["test_depth"]
PHASE1, PHASE2 = compute_matched.PHASE1, compute_matched.PHASE2
STEPS = {"phase1": 100, "phase2": 12, "interference": 50}  # a quarter of make retrofit_depth's 400 + 50: the budget
EVAL_R, READ_R = "1,2,4,8,16,32", 8  # the accuracy table's r; the r the loops and the interference are read at
EVAL_LIMIT = 500  # test rows a seed reads
LOSS = ["--task", "loss", "--r", "1", "--batch_size", "4", "--num_batches", "24", "--seq_len", "256", "--split", "val"]
CORPORA = ("sotu", "pydoc")
FIRST = ("adapter", "rev_core", "rev_adapter", "mix_core", "cut222")  # arms of the first seed only
KL_WEIGHT = 1.0  # train.py --kl_parent of core_kl (rules.json in_place retention if_not)
# an arm's seed starts once this arm's same seed is done (claim_arms.run_units)
NEEDS = {"core": "core_phase1", "adapter": "adapter_phase1", "core_kl": "core_kl_phase1", "cut222": "cut222_phase1",
         "rev_core": "core", "rev_adapter": "core", "mix_core": "core"}
SMOKE = dict(phase1=2, phase2=1, interference=1, limit=20, num_train=2000, num_dev=100,
             loss=["--num_batches", "2", "--seq_len", "64"], flags=["--batch_size", "4", "--eval_iters", "1"])


def paths(out):
    d = out / "data"
    return dict(cut=out / "cut", cut222=out / "cut222", layers=out / "layers", forward=d / "forward", reversed=d / "reversed",
                both=d / "both", sotu=d / "sotu", pydoc=d / "pydoc", pydoc_text=d / "pydoc_text")


# -----------------------------------------------------------------------------
# the cut, the data, the arms


def prepare(p, smoke, log):
    """The cut in place, the layer ranking, the depth task under both rules and mixed, and the two text corpora,
    each made once."""
    py = sys.executable
    if not (p["cut"] / "model.safetensors").is_file():
        sh([py, "surgery.py", "--init", "smollm2", "--layers", RULE["layers"], "--first_loop", "identity",
            "--out", str(p["cut"]), "--overwrite"], log)
    if not (p["cut222"] / "model.safetensors").is_file():  # the layer-dropping cut of every other result here
        sh([py, "surgery.py", "--init", "smollm2", "--shape", "2,2,2", "--out", str(p["cut222"]), "--overwrite"], log)
    if not (p["layers"] / "analyze.json").is_file():
        sh([py, "analyze.py", "--layers_of", "smollm2", "--shape", "14,2,14", "--out_dir", str(p["layers"])], log)
    sizes = ["--num_train", str(SMOKE["num_train"]), "--num_dev", str(SMOKE["num_dev"])] if smoke else []
    depth = [py, "data/depth/prepare.py", "--tokenizer", str(p["cut"]), "--train_depth", str(TRAIN_K),
             "--test_depth", str(TEST_K), *sizes]
    for rule in ("forward", "reversed", "both"):
        if not (p[rule] / "meta.json").is_file():
            sh([*depth, "--rule", rule, "--out_dir", str(p[rule])], log)
    if not (p["sotu"] / "meta.json").is_file():
        sh([py, "data/sotu/prepare.py", "--tokenizer", str(p["cut"]), "--out_dir", str(p["sotu"]),
            *(["--limit", "40"] if smoke else [])], log)
    if not (p["pydoc"] / "meta.json").is_file():
        import pydoc_data.topics

        p["pydoc_text"].mkdir(parents=True, exist_ok=True)
        for name, text in sorted(pydoc_data.topics.topics.items()):  # one document a topic
            (p["pydoc_text"] / f"{name}.txt").write_text(text)
        sh([py, "data/local/prepare.py", "--input", str(p["pydoc_text"]), "--tokenizer", str(p["cut"]),
            "--val_frac", "0.5", "--out_dir", str(p["pydoc"])], log)


def arms(out, p, smoke, first):
    """name -> (train.py args, repeat.py args); the arms of FIRST run the seed `first` alone; core_kl is the core
    arm with the KL term towards the parent (the rule's remedy, run when retention fails or --kl asks)."""
    n = SMOKE if smoke else STEPS
    limit = str(SMOKE["limit"] if smoke else EVAL_LIMIT)
    extra = SMOKE["flags"] if smoke else []
    looped = ["--r", EVAL_R, "--splits", "test", "--eval_limit", limit]
    steps = lambda k: ["--max_iters", str(k), "--eval_interval", str(k), "--eval_r", str(READ_R), *extra]
    start = lambda arm: str(out / "arms" / arm) + "/seed_{seed}"
    table = {}
    kl = ["--kl_parent", str(KL_WEIGHT), "--kl_init", str(p["cut"]), "--kl_data", str(p["sotu"])]
    for arm, cut, freeze, more in (("core", "cut", "outer", []), ("adapter", "cut", "base", []),
                                   ("core_kl", "cut", "outer", kl), ("cut222", "cut222", "none", [])):
        table[f"{arm}_phase1"] = (["--config", PHASE1, "--init", str(p[cut]), "--data", str(p["forward"]),
                                   "--freeze", freeze, *steps(n["phase1"]), *more], ["--eval", "none"])
        table[arm] = (["--config", PHASE2, "--init", start(f"{arm}_phase1"), "--data", str(p["forward"]),
                       "--freeze", freeze, *steps(n["phase2"]), *more], looped)
    for arm in ("adapter_phase1", "cut222_phase1"):
        table[arm][1].extend(["--seeds", str(first)])
    for arm, data, freeze in (("rev_core", "reversed", "outer"), ("rev_adapter", "reversed", "base"),
                              ("mix_core", "both", "outer")):
        table[arm] = (["--config", PHASE1, "--init", start("core"), "--data", str(p[data]), "--freeze", freeze,
                       *steps(n["interference"])], looped)
    for arm in FIRST:
        table[arm] = (table[arm][0], ["--seeds", str(first), *table[arm][1]])
    return table


# -----------------------------------------------------------------------------
# the readings beside the training: text loss, the other rule's rows


def model_dirs(out, p, seeds, kl=False):
    """{name: checkpoint dir} of every model the text loss is read on (with kl: core_kl's seeds too)."""
    first = seeds[0]
    dirs = {"parent": p["cut"], **{f"core/{s}": out / "arms" / "core" / f"seed_{s}" for s in seeds}}
    dirs.update({f"{a}/{first}": out / "arms" / a / f"seed_{first}" for a in FIRST})
    dirs.update({f"core_kl/{s}": out / "arms" / "core_kl" / f"seed_{s}" for s in seeds} if kl else {})
    return dirs


def evaluate(out, name, model, what, cmd_tail, log):
    """eval_math.py on `model` into OUT/evals/<name>/<what> (reused when it holds this command's result)."""
    d = out / "evals" / name / what
    cmd = [sys.executable, "eval_math.py", "--init", str(model), *cmd_tail, "--threads", "1", "--out_dir", str(d)]
    sh_once(cmd, d / "summary.json", d / "command.json", log)


def readings(out, p, seeds, smoke, kl=False):
    """[(name, model, what, eval_math args)] of every reading beside the training (with kl: core_kl's)."""
    loss = LOSS + (SMOKE["loss"] if smoke else [])
    limit = ["--limit", str(SMOKE["limit"] if smoke else EVAL_LIMIT)]
    rows = lambda data: ["--task", "depth", "--data", str(p[data]), "--split", "test", "--r", f"1,{READ_R}", *limit]
    todo = [(name, d, c, [*loss, "--data", str(p[c])]) for name, d in model_dirs(out, p, seeds, kl).items()
            for c in CORPORA]
    first = seeds[0]
    todo.append((f"core/{first}", out / "arms" / "core" / f"seed_{first}", "reversed", rows("reversed")))
    todo += [(f"{a}/{first}", out / "arms" / a / f"seed_{first}", "forward", rows("forward"))
             for a in ("rev_core", "rev_adapter", "mix_core")]
    todo.append((f"mix_core/{first}", out / "arms" / "mix_core" / f"seed_{first}", "reversed", rows("reversed")))
    return todo


def run_all(args, out, p, table):
    logs, seeds = out / "logs", args.seed_list
    prepare(p, args.smoke, logs / "prepare.log")
    order = [(a, str(s)) for s in seeds for a in ("core_phase1", "core")]
    order += [(a, str(seeds[0])) for a in ("adapter_phase1", "adapter", "rev_core", "rev_adapter", "mix_core",
                                           "cut222_phase1", "cut222")]
    unit = lambda arm, s: run_arms(out, [arm], table, 1, logs, s)
    run_units(order, unit, args.jobs, NEEDS)
    main = [a for a in table if not a.startswith("core_kl")]
    run_arms(out, main, table, args.jobs, logs, args.seeds)  # each arm's summary over all its seeds (all reused)

    def read(kl):
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda t: evaluate(out, *t, logs / "evals.log"), readings(out, p, seeds, args.smoke, kl)))

    read(False)
    verdict = retention(out, "core", seeds)["verdict"]
    if verdict == "does not hold" or args.kl:  # the rule's remedy: the same arm with the KL term
        print(f"retention: {verdict}: the core arm again with the KL term towards the parent (core_kl)", flush=True)
        run_units([(a, str(s)) for s in seeds for a in ("core_kl_phase1", "core_kl")], unit, args.jobs, NEEDS)
        run_arms(out, ["core_kl_phase1", "core_kl"], table, args.jobs, logs, args.seeds)
        read(True)


# -----------------------------------------------------------------------------
# the report


def losses(out, name, corpus):
    """The per-batch text losses (eval_math.py --task loss: the same seeded windows for every model)."""
    recs = [json.loads(x) for x in (out / "evals" / name / corpus / "results.jsonl").read_text().splitlines()]
    return np.array([x["loss"] for x in sorted(recs, key=lambda x: x["batch"])])


def accuracy(out, name, data, depth):
    """{r: accuracy} of an OUT/evals reading of test rows, at one depth or pooled over the trained depths or beyond."""
    res = json.loads((out / "evals" / name / data / "summary.json").read_text())["results"]
    pooled = {"beyond": "accuracy_beyond_depth", "trained": "accuracy_trained_depth"}
    key = lambda row: row[pooled[depth]] if depth in pooled else row["by_k"][str(depth)]["accuracy"]
    return {row["r"]: key(row) for row in res}


def logit_gap(p, parent, model_dir):
    """The largest absolute logit difference at r = 1 between a model and the parent, on a window of held-out text."""
    import torch
    from data.common import open_split
    from model import RecurrentGPT

    x = torch.from_numpy(open_split(p["sotu"], "val")[0][:256].astype(np.int64))[None]
    with torch.no_grad():
        a, b = (m.eval()(x, num_steps=1)[0] for m in (RecurrentGPT.from_pretrained(str(model_dir)), parent))
    return float((a - b).abs().max())


def retention(out, arm, seeds):
    """The rule's retention comparisons of an arm's seeds against the parent on each corpus (larger is better: the
    parent's loss minus the arm's, per seed and batch), and their verdict."""
    res = {}
    for c in CORPORA:
        parent, trained = losses(out, "parent", c), np.stack([losses(out, f"{arm}/{s}", c) for s in seeds])
        res[c] = compare(None, -trained, np.tile(-parent, (len(seeds), 1)), rule=RULE["retention"])
    return {"by_corpus": res, "verdict": stats.combine(res[c]["verdict"] for c in CORPORA)}


def measure(out, p, A, seeds):
    first, kl = seeds[0], "core_kl" in A
    res = {"loops": compare(None, A["core"].rows("trained", READ_R), A["core"].rows("trained", 1), rule=RULE["loops"]),
           "retention": {a: retention(out, a, seeds) for a in ("core", "core_kl")[:1 + kl]}}
    res["verdicts"] = {"loops": res["loops"]["verdict"], "retention": res["retention"]["core"]["verdict"]}
    if kl:
        res["loops_kl"] = compare(None, A["core_kl"].rows("trained", READ_R), A["core_kl"].rows("trained", 1),
                                  rule=RULE["loops"])
        res["verdicts"].update(loops_kl=res["loops_kl"]["verdict"], retention_kl=res["retention"]["core_kl"]["verdict"])
    res["text_loss"] = {name: {c: float(losses(out, name, c).mean()) for c in CORPORA}
                        for name in model_dirs(out, p, seeds, kl)}
    from model import RecurrentGPT

    cut = RecurrentGPT.from_pretrained(str(p["cut"]))  # the parent at r = 1, loaded once
    res["adapter_logit_gap"] = logit_gap(p, cut, out / "arms" / "adapter" / f"seed_{first}")
    # at depth 6 and pooled over depths 1-6 (the loops rule's metric: at this budget depth 6 sits near chance)
    res["interference"] = {depth: interference(out, A, first, depth) for depth in (TRAIN_K, "trained")}
    res["flops_per_token"] = {"parent": cut.inference_flops_per_token(1),
                              "per_loop": cut.inference_flops_per_token(2) - cut.inference_flops_per_token(1)}
    layers = json.loads((p["layers"] / "analyze.json").read_text())["layers"]["block_influence"]
    res["block_influence"] = layers
    return res


def interference(out, A, first, depth):
    """Forward- and reversed-rule test accuracy at READ_R of the first seed's core arm and of the arms trained on
    from it, at one depth or pooled ("trained")."""
    rule = lambda name, data: accuracy(out, f"{name}/{first}", data, depth)[READ_R]  # OUT/evals' readings
    res = {"before": {"forward": A["core"].acc(depth, READ_R)[0], "reversed": rule("core", "reversed")}}
    for a in ("rev_core", "rev_adapter", "mix_core"):
        own = A[a].acc(depth, READ_R)[0]  # the test rows of the data it trained on
        res[a] = {"forward": rule(a, "forward"),
                  **({"reversed": rule(a, "reversed"), "mixed": own} if a == "mix_core" else {"reversed": own})}
    return res


def acc_by_r(arm, depth):
    rs = [int(r) for r in EVAL_R.split(",")]
    return rs, np.array([arm.acc(depth, r) for r in rs])  # (r, seeds)


def plot(A, res, out):
    """OUT/in_place.png: accuracy against r, in place beside the (2,2,2) cut; OUT/in_place_retention.png: the text
    loss at r = 1 against the parent's, the 5-seed arms with the rule's 95% interval."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, depth, title in ((axes[0], "trained", f"depths 1-{TRAIN_K} pooled (trained; the rule's)"),
                             (axes[1], "beyond", f"depths {TRAIN_K + 1}-{TEST_K} pooled")):
        for name, arm, color in (("in place, core trained", A["core"], "C0"), ("in place, core + KL", A.get("core_kl"), "C3"),
                                 ("in place, adapter only", A["adapter"], "C1"), ("(2,2,2) cut, all trained", A["cut222"], "C2")):
            if arm is None:
                continue
            rs, acc = acc_by_r(arm, depth)
            ax.errorbar(rs, acc.mean(1), yerr=acc.std(1, ddof=1) if acc.shape[1] > 1 else None, color=color,
                        marker="o", capsize=3, label=f"{name} ({acc.shape[1]} seeds)")
        ax.axhline(1 / 6, color="grey", lw=0.8, ls=":")
        ax.set(xscale="log", xlabel="r (loops at test time)", ylabel="test accuracy (mean ± std over seeds)",
               ylim=(0, 1.02), title=title)
    axes[0].legend(fontsize=7)
    fig2, ax = plt.subplots(figsize=(8, 4.2))
    loss, parent = res["text_loss"], res["text_loss"]["parent"]
    order = ["core", "core_kl", "adapter", "rev_core", "rev_adapter", "mix_core"]
    arms = [a for a in order if any(n.split("/")[0] == a for n in loss)]
    top = 0.0
    for i, c in enumerate(CORPORA):
        x = np.arange(len(arms)) + 0.2 * (i - 0.5)
        for j, a in enumerate(arms):
            vals = [v[c] - parent[c] for n, v in loss.items() if n.split("/")[0] == a]
            r = res["retention"].get(a)
            if r:  # the seeds' mean with the rule's interval (parent - arm, negated: a loss increase)
                d = r["by_corpus"][c]
                ax.errorbar(x[j], -d["diff"], yerr=[[d["high"] - d["diff"]], [d["diff"] - d["low"]]], color=f"C{i}",
                            marker="o", capsize=4)
            ax.scatter([x[j]] * len(vals), vals, color=f"C{i}", s=10, alpha=0.5,
                       label=f"{c} (parent {parent[c]:.3f} nats)" if j == 0 else None)
            top = max(top, *vals)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axhline(RULE["retention"]["margin"], color="C3", lw=1, ls=":", label=f"the margin, +{RULE['retention']['margin']}")
    cut = next(v for n, v in loss.items() if n.startswith("cut222"))
    count = lambda a: sum(n.split("/")[0] == a for n in loss)
    ax.set_xticks(range(len(arms)), [f"{a}\n({count(a)} seed{'s' * (count(a) > 1)})" for a in arms], fontsize=8)
    ax.set(ylabel="text loss at r = 1 minus the parent's (nats/token)", ylim=(-0.1, top * 1.15),
           title="What the parent keeps at r = 1 (held-out text; bars: 95% intervals)\n"
                 "the (2,2,2) cut, off the scale: " + ", ".join(f"+{cut[c] - parent[c]:.1f} on {c}" for c in CORPORA))
    ax.legend(fontsize=8)
    save_figures([(fig, "in_place.png"), (fig2, "in_place_retention.png")], out)


def report(args, out, p, command, t0):
    seeds = args.seed_list
    try:
        names = ["core", "adapter", "rev_core", "rev_adapter", "mix_core", "cut222"]
        A = {a: Arm(out, a) for a in names + ["core_kl"] * (out / "arms" / "core_kl" / "summary.json").is_file()}
        res = measure(out, p, A, seeds)
    except FileNotFoundError as err:
        sys.exit(f"in_place.py: error: not every arm and reading has finished ({err.filename} is missing): "
                 "run without --report")
    k, first = TRAIN_K, seeds[0]
    rs = EVAL_R.split(",")
    lines = [f"Rule: experiments/rules.json in_place at {rules_commit()}; code at {git_commit() or None}; seeds {args.seeds}; "
             f"test split; layers {RULE['layers']} (block influence of layers 12-16: "
             + ", ".join(f"{res['block_influence'][i]:.3f}" for i in range(12, 17)) + ").", "",
             f"**Loops (core, r = {READ_R} vs 1 over depths 1-{k}): {res['verdicts']['loops']}. Retention at r = 1 "
             f"(margin {RULE['retention']['margin']} nats): {res['verdicts']['retention']}."
             + (f" With the KL term (core_kl): loops {res['verdicts']['loops_kl']}, retention "
                f"{res['verdicts']['retention_kl']}." if "core_kl" in A else "") + "**", "",
             "| test accuracy | " + " | ".join(f"r={r}" for r in rs) + " |", "|---" * (len(rs) + 1) + "|"]
    for name, arm in (("in place, core", A["core"]), ("in place, core + KL", A.get("core_kl")),
                      ("in place, adapter", A["adapter"]), ("(2,2,2) cut", A["cut222"])):
        for depth, label in (("trained", f"depths 1-{k}"), (k, f"depth {k}"), ("beyond", f"depths {k + 1}-{TEST_K}")):
            if arm is not None:
                _, acc = acc_by_r(arm, depth)
                cells = [f"{m:.3f} ± {s:.3f}" if acc.shape[1] > 1 else f"{m:.3f}"
                         for m, s in zip(acc.mean(1), acc.std(1, ddof=1) if acc.shape[1] > 1 else acc.mean(1))]
                lines.append(f"| {name}, {label} ({acc.shape[1]} seeds) | " + " | ".join(cells) + " |")
    f = res["flops_per_token"]
    lines += ["", line(f"loops: core at r = {READ_R} vs r = 1, depths 1-{k}", res["loops"]),
              f"Each loop past the first costs {f['per_loop']:.3g} FLOPs a token, {f['per_loop'] / f['parent']:.1%} of "
              f"the parent's forward ({f['parent']:.3g}).", "",
              "| text loss at r = 1 (nats/token) | " + " | ".join(CORPORA) + " |", "|---" * (len(CORPORA) + 1) + "|"]
    lines += [f"| {n} | " + " | ".join(f"{v[c]:.4f}" for c in CORPORA) + " |" for n, v in res["text_loss"].items()]
    lines += [""] + [line(f"retention of {a} on {c}: parent - {a} (negated losses)", r["by_corpus"][c], 4)
                     for a, r in res["retention"].items() for c in CORPORA]
    if "loops_kl" in res:
        lines.append(line(f"loops: core_kl at r = {READ_R} vs r = 1, depths 1-{k}", res["loops_kl"]))
    lines += [f"The adapter-only arm at r = 1 against the parent: largest absolute logit difference "
              f"{res['adapter_logit_gap']:.3g}.", "",
              f"| interference (seed {first}, test accuracy at r = {READ_R}) | forward rule, depths 1-{k} | reversed rule, "
              f"depths 1-{k} | forward, depth {k} | reversed, depth {k} |", "|---|---|---|---|---|"]
    pooled, deepest = res["interference"]["trained"], res["interference"][k]
    for name, v in pooled.items():
        w = deepest[name]
        lines.append(f"| {name} | {v['forward']:.3f} | {v['reversed']:.3f} | {w['forward']:.3f} | {w['reversed']:.3f} |")
    md = "\n".join(lines)
    (out / "in_place.md").write_text(md + "\n")
    summary = {"question": RULE["question"], "rule": RULE, "verdicts": res["verdicts"], "measured": res,
               **provenance(A, seeds, command, t0)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    plot(A, res, out)
    print(f"\n{md}\n\nwrote {out / 'summary.json'}, {out / 'in_place.md'}, {out / 'in_place.png'}, "
          f"{out / 'in_place_retention.png'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out_dir", default="out/in_place")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (2 on a 2-core machine)")
    ap.add_argument("--seeds", default=",".join(map(str, RULE["seeds"])),
                    help=f"train.py seeds of the core arm; the first also runs the others ({stats.MIN_SEEDS} for a verdict)")
    ap.add_argument("--smoke", action="store_true", help="a few steps an arm, small data: the pipeline, not the question")
    ap.add_argument("--kl", action="store_true", help="train core_kl (the KL term towards the parent) even if the "
                    "core arm keeps the parent's text loss")
    ap.add_argument("--report", action="store_true", help="train nothing: the report of the finished arms")
    args = ap.parse_args()
    args.seed_list = [int(s) for s in args.seeds.split(",")]
    if args.jobs < 1 or len(args.seed_list) < 2:
        ap.error("--jobs must be >= 1" if args.jobs < 1 else "--seeds: at least two (an interval needs them)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # smollm2 is the GGUF from PyPI
    out, t0 = Path(args.out_dir), time.time()
    command = shlex.join(["python", "-m", "experiments.in_place", *sys.argv[1:]])
    p = paths(out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    if not args.report:
        run_all(args, out, p, arms(out, p, args.smoke, args.seed_list[0]))
    report(args, out, p, command, t0)


if __name__ == "__main__":
    main()
