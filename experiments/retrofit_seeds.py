"""
The retrofit's whole recipe under five seeds, on the test split: SmolLM2-135M cut to (2,2,2), trained on the depth
task by both phases of `make retrofit_depth`, read at r = 1..32 on every test depth, with the two readings of
experiments/rules.json ("retrofit", fixed before the runs) drawn from paired 95% intervals.

    python -m experiments.retrofit_seeds            # the five seeds (make retrofit_seeds); finished seeds are reused
    python -m experiments.retrofit_seeds --report   # run nothing: the report of the finished seeds
    python -m experiments.retrofit_seeds --smoke --out_dir /tmp/retrofit_smoke   # the pipeline in a few minutes

The recipe is McLeish et al. 2025 (arXiv 2511.07384) at CPU scale: phase 1 config/cpu_retrofit_depth.json (400 steps
of 32 rows, Muon, mean r 4, per-loop supervision as in arXiv 2608.11233), phase 2 config/cpu_retrofit_depth_phase2.json
(50 steps at mean r 16, lr / 3) from phase 1's checkpoint. Its choices were made on the dev rows (RESULTS.md's "What
makes the retrofit learn"); nothing here reads dev. The arms (repeat.py folders under OUT/arms):
  phase1   400 steps from the cut, read at r = 8 and 32 (how far the loop falls before phase 2)
  phase2   50 more steps from the same seed's phase 1, read at r = 1, 2, 4, 8, 16, 32: the recipe's model
The readings are paired by seed and test row (experiments/stats.py, through claims.compare): r = 8 against r = 1 at
depth 6 (the loop used, claim 1's margin), r = 32 against r = 8 at depth 6 (phase 2 holds to r = 32, non-inferior
within 2 points); the same beyond depth 6 and phase 1 against phase 2 are reported. Writes OUT/summary.json,
OUT/retrofit_seeds.md (the table) and OUT/retrofit_seeds.png.
"""

import json
import time

from experiments.claim_arms import run_arms, run_units, smollm2_depth, study_args
from experiments.claims import RULES, Arm, compare, finished, line, reported, rules_state
from experiments.repeat import depth_panel

RULE = RULES["retrofit"]
SEEDS = ",".join(map(str, RULE["seeds"]))
TRAIN_K, TEST_K = RULES["train_depth"], RULES["test_depth"]
EVAL_R = "1,2,4,8,16,32"
PHASE1_R = "8,32"
STEPS = {"phase1": 400, "phase2": 50}  # make retrofit_depth's (retrofit_depth.sh STEPS, PHASE2_STEPS)
NEEDS = {"phase2": "phase1"}  # a seed's phase 2 starts from its own phase 1


def paths(out):
    return dict(cut=out / "smollm2_cut", data=out / "data")


def sizes(smoke):
    """The run's sizes: the module's, or --smoke's (a few steps of 4 rows, 4 test rows: the pipeline, not the recipe)."""
    if smoke:
        return dict(phase1=4, phase2=2, eval_limit=4, num_train=500, num_dev=50,
                    flags=["--batch_size", "4", "--eval_iters", "1"])
    return dict(phase1=STEPS["phase1"], phase2=STEPS["phase2"], eval_limit=0, num_train=50000, num_dev=1000, flags=[])


def arms(out, p, z):
    """name -> (train.py args, repeat.py args)."""
    data = ["--data", str(p["data"]), *z["flags"]]
    read = lambda r: ["--r", r, "--splits", "test", *(["--eval_limit", str(z["eval_limit"])] if z["eval_limit"] else [])]
    return {
        "phase1": (["--config", "config/cpu_retrofit_depth.json", "--init", str(p["cut"]), *data,
                    "--max_iters", str(z["phase1"])], read(PHASE1_R)),
        "phase2": (["--config", "config/cpu_retrofit_depth_phase2.json", "--init",
                    str(out / "arms" / "phase1" / "seed_{seed}"), *data, "--max_iters", str(z["phase2"])], read(EVAL_R)),
    }


def run_all(args, out, p, z, table):
    logs = out / "logs"
    smollm2_depth(p["cut"], {p["data"]: []}, logs / "prepare.log", TRAIN_K, TEST_K,
                  ["--num_train", str(z["num_train"]), "--num_dev", str(z["num_dev"])])
    seeds = args.seeds.split(",")

    def run_one(arm, seed):
        print(f"  {arm} seed {seed}", flush=True)
        run_arms(out, [arm], table, 1, logs, seed)

    run_units([(arm, s) for s in seeds for arm in ("phase1", "phase2")], run_one, args.jobs, NEEDS)
    run_arms(out, list(table), table, args.jobs, logs, args.seeds)  # every seed reused: each arm's summary whole


# -----------------------------------------------------------------------------
# the report


def measure(A):
    """The two rule readings (depth 6) and the reported ones (beyond depth 6, phase 1 against phase 2)."""
    p1, p2 = A["phase1"], A["phase2"]
    m = {"loops": compare(None, p2.rows(TRAIN_K, 8), p2.rows(TRAIN_K, 1), rule=RULE["loops"]),
         "holds_to_r32": compare(None, p2.rows(TRAIN_K, 32), p2.rows(TRAIN_K, 8), rule=RULE["holds_to_r32"]),
         "beyond_loops": reported(compare(None, p2.rows("beyond", 8), p2.rows("beyond", 1), rule=RULE["loops"])),
         "beyond_r32": reported(compare(None, p2.rows("beyond", 32), p2.rows("beyond", 8), rule=RULE["holds_to_r32"]))}
    for r in (8, 32):
        m[f"phase2_vs_phase1_r{r}"] = reported(compare(None, p2.rows(TRAIN_K, r), p1.rows(TRAIN_K, r),
                                                       rule=RULE["loops"], margin=0.0))
    m["phase1_r32_vs_r8"] = reported(compare(None, p1.rows(TRAIN_K, 32), p1.rows(TRAIN_K, 8), rule=RULE["holds_to_r32"]))
    text = [line(f"depth {TRAIN_K}, r = 8 vs r = 1", m["loops"]),
            line(f"depth {TRAIN_K}, r = 32 vs r = 8", m["holds_to_r32"]),
            line(f"depths > {TRAIN_K}, r = 8 vs r = 1", m["beyond_loops"]),
            line(f"depths > {TRAIN_K}, r = 32 vs r = 8", m["beyond_r32"]),
            line(f"phase 1 alone, depth {TRAIN_K}, r = 32 vs r = 8", m["phase1_r32_vs_r8"]),
            line(f"depth {TRAIN_K} at r = 32, phase 2 vs phase 1", m["phase2_vs_phase1_r32"])]
    return m, {k: m[k]["verdict"] for k in ("loops", "holds_to_r32")}, text


def table_markdown(table, seen, n_seeds):
    """Accuracy by depth and r: mean ± std over the seeds, with min - max at r = 1, 8, 32 of depth 6."""
    rs = list(table["1"])
    head = (f"| test, mean ± std of {n_seeds} seeds | in train | " + " | ".join(f"r={r}" for r in rs) + " |\n"
            + "|---" * (len(rs) + 2) + "|\n")
    keys = [str(k) for k in range(1, TEST_K + 1)] + ["trained", "beyond"]
    name = lambda k: {"trained": f"all depths <= {TRAIN_K}", "beyond": f"all depths > {TRAIN_K}"}.get(k, k) + (
        " (beyond)" if k.isdigit() and int(k) > TRAIN_K else " (deepest trained)" if k == str(TRAIN_K) else "")
    cell = lambda c, wide: f"{c['mean']:.2f} ± {c['std']:.2f}" + (f" ({c['min']:.2f} - {c['max']:.2f})" if wide else "")
    row = lambda k: (f"| {name(k)} | {seen[k]:.2f} | " if k in seen else f"| {name(k)} | | ") + " | ".join(
        cell(table[k][r], k == str(TRAIN_K) and r in ("1", "8", "32")) for r in rs) + " |"
    return head + "\n".join(row(k) for k in keys)


def plot(A, path):
    """Phase 2's accuracy against r per depth (mean ± std), and depth 6 at r = 8 and 32 per seed in both phases."""
    from plumbing.plots import pyplot

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1.6, 1]})
    t = A["phase2"].table
    curves = {k: ([int(r) for r in t[k]], [c["mean"] for c in t[k].values()], [c["std"] for c in t[k].values()])
              for k in t if k.isdigit()}
    depth_panel(ax, curves, TRAIN_K, f"whole recipe (400 + 50 steps), test split, {len(A['phase2'].seeds)} seeds")
    ax.set_ylabel("accuracy (mean ± std over seeds)")
    for i, s in enumerate(A["phase2"].seeds):
        for arm, ls in (("phase1", ":"), ("phase2", "-")):
            a = A[arm]
            bx.plot([8, 32], [a.acc(TRAIN_K, r)[a.seeds.index(s)] for r in (8, 32)], ls, marker="o", color=f"C{i}",
                    label=f"seed {s}" if arm == "phase2" else None)
    bx.set_xscale("log", base=2)
    bx.set(xticks=[8, 32], xticklabels=[8, 32], xlabel="test loops r", ylabel=f"accuracy at depth {TRAIN_K}",
           title="per seed: phase 1 dotted, phase 2 solid")
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(args, out, command, t0):
    if not all(finished(out, n, len(args.seeds.split(","))) for n in ("phase1", "phase2")):
        print("retrofit_seeds: phase1 and phase2 are not both finished: no report (run without --report)")
        return None
    A = {n: Arm(out, n) for n in ("phase1", "phase2")}
    measured, verdicts, text = measure(A)
    table = A["phase2"].table
    seen = json.loads((paths(out)["data"] / "meta.json").read_text())["seen_in_train"]["test"]
    commits = rules_state()
    flops = {n: float(a.flops().mean()) for n, a in A.items()}
    seconds = {n: a.train_seconds() for n, a in A.items()}
    summary = {"question": RULE["question"], "rule": RULE, "verdicts": verdicts, "measured": measured, "text": text,
               "table": table, "phase1_table": A["phase1"].table, "seen_in_train": seen,
               "arms": {n: a.summary["command"] for n, a in A.items()}, "seeds": args.seeds, "command": command,
               "commits": commits, "train_flops": flops, "train_seconds": seconds, "seconds": time.time() - t0}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(A, out / "retrofit_seeds.png")
    warn = " (uncommitted changes in rules.json: commit the rule before the runs it governs)" if commits[
        "rules_uncommitted"] else ""
    md = (f"Rule: experiments/rules.json \"retrofit\" at {commits['rules']}{warn}; code at {commits['code']}; seeds "
          f"{args.seeds}; test split; paired {RULES['confidence']:.0%} intervals (experiments/stats.py).\n\n"
          f"**Loops used (r = 8 vs 1, depth {TRAIN_K}): {verdicts['loops']}. Held to r = 32 (within "
          f"{RULE['holds_to_r32']['margin']:g} of r = 8, depth {TRAIN_K}): {verdicts['holds_to_r32']}.**\n\n"
          + "\n".join(f"- {t}" for t in text)
          + f"\n\nTraining FLOPs a seed (train.py's count, without Newton-Schulz): phase 1 {flops['phase1']:.2e}, "
          f"phase 2 {flops['phase2']:.2e}; train seconds summed over the seeds: phase 1 {seconds['phase1']:.0f}, "
          f"phase 2 {seconds['phase2']:.0f}.\n\nThe recipe's model (phase 2) on test by depth and r (in train: the "
          f"fraction of each depth's test problems that the train split labels):\n\n"
          f"{table_markdown(table, seen, len(A['phase2'].seeds))}\n")
    (out / "retrofit_seeds.md").write_text(md)
    print(f"\n{md}\nwrote {out / 'summary.json'}, {out / 'retrofit_seeds.md'}, {out / 'retrofit_seeds.png'} "
          f"({time.time() - t0:.0f} s)")
    return summary


def main():
    args, out, command = study_args(__doc__, "experiments.retrofit_seeds", "out/retrofit_seeds", SEEDS)
    t0, p, z = time.time(), paths(out), sizes(args.smoke)
    print(f"retrofit_seeds: seeds {args.seeds}, {args.jobs} runs at a time, sizes {json.dumps(z)}; logs in {out / 'logs'}")
    if not args.report:
        run_all(args, out, p, z, arms(out, p, z))
    report(args, out, command, t0)


if __name__ == "__main__":
    main()
