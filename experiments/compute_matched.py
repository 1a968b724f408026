"""
Does the retrofit beat simply continuing to train the original model on the same data, at the same training
compute? The central question of McLeish et al. 2025 (arXiv 2511.07384, "retrofitted recurrence"), asked of
SmolLM2-135M on the depth task in its own tokens (data/depth/prepare.py --tokenizer: train depth 6, dev and test
rows to depth 12, twice the trained depth).

    python -m experiments.compute_matched            # calibrate, plan, train every arm, verdict (make compute_matched)
    python -m experiments.compute_matched --plan     # calibrate and print the step counts, train nothing
    python -m experiments.compute_matched --report   # train nothing: the verdict of the finished arms
    python -m experiments.compute_matched --smoke --out_dir /tmp/cm   # the pipeline at a few steps an arm

The arms (experiments/repeat.py folders under OUT/arms, a baseline's as <arm>_lr<lr>; a finished seed is reused,
a killed one resumes):
  retrofit       SmolLM2 cut to (2,2,2) by surgery.py, both phases of `make retrofit_depth`'s recipe
                 (config/cpu_retrofit_depth.json, then _phase2.json continuing each seed of phase 1)
  uncut_flops    the uncut 30-layer parent (--init smollm2 --shape 1,28,1 --static) trained on the same data with
                 phase 1's recipe to the retrofit's training FLOPs: the paper's baseline
  static6_flops  the retrofit's six layers without the loop (--shape 2,2,2 --static), to its training FLOPs
The matching, fixed before any arm trains (OUT/plan.json): a short calibration run of each model (two at a
time, one thread each, as the arms run) gives a static model's FLOPs and seconds per optimizer step, and the
retrofit's seconds per step as a line in its step's FLOPs. The retrofit's FLOPs are train.py's own count
(model.flops_per_token at each step's r, which train.sample_num_steps draws from the seed and the step alone),
so they are known exactly before it trains; a baseline's step count is the retrofit's mean over seeds divided by
its own per step. That count (the paper's, 6 N1 + 2 N2) leaves out the per-loop readouts' coda passes: the
report gives them beside it. The second matching, wall time (train.py's dt summed over the training steps, on
the calibration's pace), gives each baseline fewer steps than the FLOPs on this CPU (the plan prints both): it is
read along the FLOPs-matched run, which also evaluates at that step, rather than trained as arms of its own
(the budget's cut); its lr is not decayed there yet, as a run stopped at that time would be.
The lr of each baseline arm: Muon's lr from LR_GRID (AdamW's at the recipe's ratio), one run each on the first
seed at the arm's own step count, the highest dev score (mean of the dev accuracy at depth 6 and beyond it) wins,
and the other seeds run at it (the sweep's run is that arm's first seed). A pick at an end of the grid gets one more
run on the first seed, the next LADDER value past it, read on dev and reported beside the pick (the rule's pick
stands): it says whether the baseline could have been tuned further. The retrofit keeps its recipe's lr.
The verdict: experiments/rules.json "compute_matched", written before the runs: the retrofit at its r against
uncut_flops on the test split, at depth 6 and pooled beyond it, paired 95% intervals (experiments/stats.py);
the other baseline by the same rule, beside it; the r dev picks beside the rule's.
The figure: accuracy against training FLOPs, one line per arm, from train.py's own evaluations along each run
(dev rows, the only split a run may look at while it trains), the test split's mean ± std at each run's end.

What the budget cut, against `make retrofit_depth` and claims.py's protocol: the retrofit trains STEPS (half of
the recipe's 400 + 50 optimizer steps: it is far from converged, and the question is asked of that early regime;
a quarter, first planned, left every arm near chance at depth 6 on dev); the wall-time matching is read along the
FLOPs-matched runs, not trained; three lr values a baseline arm; EVAL_LIMIT test and dev rows a seed; CURVE_POINTS
evaluations of CURVE_ITERS batches along each run; phase 1 alone is never evaluated on test. RESULTS.md has the
plan's times.

Writes OUT/plan.json, OUT/summary.json (rule, verdicts, per-arm FLOPs, seconds, inference FLOPs, dev picks,
commits), OUT/compute_matched.md (the table) and OUT/compute_matched.png. Every seed keeps its last checkpoint
(weights and optimizer state): about 13 GB for the whole run, 1.2 GB for each seed of the uncut parent (5 GB
at --smoke).
"""

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from experiments import stats
from experiments.claim_arms import run_arms, smollm2_depth
from experiments.claims import RULES, Arm, compare, line, provenance, reported, rules_commit
from experiments.compute_matched_plots import dev_curve, plot, plot_test
from plumbing.cli import git_commit

RULE = RULES["compute_matched"]
PHASE1, PHASE2 = "config/cpu_retrofit_depth.json", "config/cpu_retrofit_depth_phase2.json"
STEPS = {"retrofit_phase1": 200, "retrofit_phase2": 25}  # the recipe's 400 : 50, halved for the budget
LADDER = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)  # Muon's lr values, half a decade apart
LR_GRID = LADDER[1:4]  # a baseline arm's, around the recipe's 1e-2
SHAPES = {"uncut": "1,28,1", "static6": "2,2,2"}  # the static baselines: the whole parent, the retrofit's six layers
BASELINES = ("uncut_flops", "static6_flops")  # each model trained to the retrofit's training FLOPs
CAL_STEPS = {"retrofit_phase1": 10, "retrofit_phase2": 5, "uncut": 5, "static6": 8}  # the first step of each is dropped
EVAL_LIMIT = 500  # test and dev rows a seed is evaluated on (eval_math.py --limit)
CURVE_POINTS, CURVE_ITERS = 4, 4  # train.py's evaluations along a run (plus step 0), each CURVE_ITERS batches of dev
EVAL_R = "1,2,4,8,16,32"  # the retrofit's test and dev r (one trajectory of 32 loops, read out at each)
SMOKE = dict(steps={"retrofit_phase1": 2, "retrofit_phase2": 1}, cal=2, limit=20, iters=1, lrs=LR_GRID[1:])


# -----------------------------------------------------------------------------
# the matching: training FLOPs and wall time


def phase_flops(model, n_steps, rbar, sigma, grad_loops, seed, step_tokens):
    """train.py's FLOP count of one phase of n_steps (log.jsonl's last "flops"), and the FLOPs it leaves out: the
    per-loop readouts' coda passes (one after each grad loop but the last, forward and backward, on every
    position). step_tokens: the labeled tokens of a step (train.py counts a depth-task step by those)."""
    import train  # here: the plan needs it, the report does not

    counted = readouts = 0
    coda = model.param_counts()["coda"]
    for step in range(n_steps):
        r = train.sample_num_steps(step, rbar, sigma, seed)
        counted += model.flops_per_token(r, grad_loops)
        readouts += 6 * coda * (min(r, grad_loops) - 1)
    return counted * step_tokens, readouts * step_tokens


def fit_seconds(flops, seconds):
    """(a, b) of seconds = a + b * FLOPs over calibration steps: a step's fixed cost (the optimizers) and its
    cost per FLOP (the loops)."""
    b, a = np.polyfit(np.asarray(flops, dtype=float), np.asarray(seconds, dtype=float), 1)
    return float(a), float(b)


def matched_steps(target, per_step):
    """The optimizer steps of a baseline whose cost per step is per_step, to reach target (at least one)."""
    return max(1, int(round(target / per_step)))


def step_records(log):
    """[(r, FLOPs, seconds)] of a run's optimizer steps from its log.jsonl lines, the first (warm-up) dropped."""
    train = [r for r in log if "loss" in r and "val" not in r]
    flops = np.diff([0.0] + [r["flops"] for r in train])
    return [(r["r"], float(f), r["dt"]) for r, f in zip(train, flops)][1:]


def make_plan(cal, cut_model, cfg1, cfg2, seeds, steps, n_lrs):
    """Every arm's step count from the calibration runs' records cal {name: step_records}, the retrofit's two
    phases' train.py settings cfg1, cfg2 and its steps; with the targets and the estimate of the training's
    CPU seconds (one thread a run)."""
    step_tokens = cfg1.batch_size * (RULES["train_depth"] + 1)  # train rows are depth 6: 7 labeled columns
    k = cfg1.backprop_depth
    for name in ("retrofit_phase1", "retrofit_phase2"):  # the count below must be train.py's own, step by step
        for r, f, _ in cal[name]:
            if f != cut_model.flops_per_token(r, k) * step_tokens:
                raise ValueError(f"{name}: train.py counted {f:.6g} FLOPs for a step at r = {r}, the plan "
                                 f"{cut_model.flops_per_token(r, k) * step_tokens:.6g}: "
                                 "the plan's count is not train.py's")
    a, b = fit_seconds(*zip(*[(f, s) for n in ("retrofit_phase1", "retrofit_phase2") for _, f, s in cal[n]]))
    per_seed = []
    for seed in seeds:
        p1 = phase_flops(cut_model, steps["retrofit_phase1"], cfg1.mean_recurrence, cfg1.recurrence_sigma, k, seed,
                         step_tokens)
        p2 = phase_flops(cut_model, steps["retrofit_phase2"], cfg2.mean_recurrence, cfg2.recurrence_sigma, k, seed,
                         step_tokens)
        flops = p1[0] + p2[0]
        per_seed.append({"seed": seed, "flops": flops, "loop_readout_flops": p1[1] + p2[1],
                         "seconds": a * (steps["retrofit_phase1"] + steps["retrofit_phase2"]) + b * flops})
    target = {key: float(np.mean([s[key] for s in per_seed])) for key in ("flops", "seconds", "loop_readout_flops")}
    per_step = {m: {"flops": cal[m][0][1], "seconds": float(np.median([s for _, _, s in cal[m]]))} for m in SHAPES}
    all_steps = dict(steps)
    for m in SHAPES:
        all_steps[f"{m}_flops"] = matched_steps(target["flops"], per_step[m]["flops"])
        all_steps[f"{m}_wall"] = matched_steps(target["seconds"], per_step[m]["seconds"])  # read along the flops run
    # one thread a run: the retrofit's seeds, and each baseline arm's lr runs plus its other seeds
    runs = len(seeds) * target["seconds"] + sum(
        (n_lrs + len(seeds) - 1) * all_steps[arm] * per_step[arm.split("_")[0]]["seconds"] for arm in BASELINES)
    return {"steps": all_steps, "target": target, "retrofit_per_seed": per_seed, "per_step": per_step,
            "retrofit_seconds_fit": {"fixed": a, "per_flop": b}, "step_tokens": step_tokens,
            "seeds": list(seeds), "estimated_train_cpu_seconds": runs}


# -----------------------------------------------------------------------------
# the arms: train.py's and repeat.py's flags


def paths(out):
    return {"data": out / "data", "cut": out / "cut", "cal": out / "calibration", "plan": out / "plan.json"}


def arm_name(arm, lr):
    return f"{arm}_lr{lr:g}"


def calibration_arms(p, smoke):
    """The calibration runs: a few steps of each model, evaluated once (evaluations are not timed)."""
    n = lambda name: str(SMOKE["cal"] if smoke else CAL_STEPS[name])
    short = lambda name: ["--max_iters", n(name), "--eval_interval", n(name), "--eval_iters", "1", "--eval_r", "1",
                          "--ckpt_minutes", "0", "--data", str(p["data"])]
    none = ["--eval", "none"]  # no test or dev evaluation: the runs are read for their steps' FLOPs and seconds
    return {"retrofit_phase1": (["--config", PHASE1, "--init", str(p["cut"]), *short("retrofit_phase1")], none),
            "retrofit_phase2": (["--config", PHASE2, "--init", str(p["cut"]), *short("retrofit_phase2")], none),
            **{m: (["--config", PHASE1, "--init", "smollm2", "--shape", shape, "--static", *short(m)], none)
               for m, shape in SHAPES.items()}}


def wall_every(n, wall):
    """train.py's --eval_interval for a baseline run of n steps that also evaluates at step `wall` (the retrofit's
    wall time): the divisor of wall nearest to n / CURVE_POINTS among those that evaluate at most twice as often.
    A wall point past the run is not read."""
    target = max(1, math.ceil(n / CURVE_POINTS))
    if wall >= n:
        return target
    few = [d for d in range(1, wall + 1) if wall % d == 0 and math.ceil(n / d) <= 2 * CURVE_POINTS] or [wall]
    return min(few, key=lambda d: (abs(d - target), d))


def arms(out, p, plan, smoke, lrs=LR_GRID):
    """name -> (train.py args, repeat.py args) of every arm: the retrofit's two phases, and each baseline arm at
    each lr (its folder is arm_name(arm, lr))."""
    steps, limit = plan["steps"], str(SMOKE["limit"] if smoke else EVAL_LIMIT)
    iters = str(SMOKE["iters"] if smoke else CURVE_ITERS)
    # train.py evaluates at step 0, every CURVE_POINTS-th of the run and at its end: the figure's points
    curve = lambda n, every=None: ["--max_iters", str(n), "--eval_iters", iters, "--data", str(p["data"]),
                                   "--eval_interval", str(every or max(1, math.ceil(n / CURVE_POINTS)))]
    r = str(RULE["r"])
    table = {
        # phase 1 is read through phase 2 alone: no test or dev evaluation of its own, its curve in its log.jsonl
        "retrofit_phase1": (["--config", PHASE1, "--init", str(p["cut"]), *curve(steps["retrofit_phase1"]),
                             "--eval_r", r], ["--eval", "none"]),
        "retrofit": (["--config", PHASE2, "--init", str(out / "arms" / "retrofit_phase1") + "/seed_{seed}",
                      *curve(steps["retrofit_phase2"], every=steps["retrofit_phase2"]), "--eval_r", r],
                     ["--r", EVAL_R, "--eval_limit", limit]),
    }
    adam_ratio = 3e-4 / 1e-2  # the recipe's AdamW lr over its Muon lr (config/cpu_retrofit_depth.json)
    for arm in BASELINES:
        model = arm.split("_")[0]
        every = wall_every(steps[arm], steps[f"{model}_wall"])
        for lr in lrs:
            table[arm_name(arm, lr)] = (
                ["--config", PHASE1, "--init", "smollm2", "--shape", SHAPES[model], "--static", *curve(steps[arm], every),
                 "--learning_rate", f"{lr:g}", "--adam_lr", f"{lr * adam_ratio:g}"], ["--r", "1", "--eval_limit", limit])
    return table


# -----------------------------------------------------------------------------
# reading the finished arms: the dev picks, the verdict


def dev_score(result):
    """The sweep's and the r pick's score of one eval_math.py result row: mean of depth 6 and beyond it."""
    return (result["by_k"][str(RULES["train_depth"])]["accuracy"] + result["accuracy_beyond_depth"]) / 2


def choose_lr(out, arm, seed, lrs=LR_GRID):
    """(lr, {lr: dev score}) of a baseline arm: its runs on `seed` read on dev alone; a tie goes to the lower lr."""
    scores = {}
    for lr in lrs:
        summary = out / "arms" / arm_name(arm, lr) / f"seed_{seed}" / "eval_dev" / "summary.json"
        scores[lr] = dev_score(json.loads(summary.read_text())["results"][0])
    return max(lrs, key=lambda lr: (scores[lr], -lr)), scores


def lr_pick(out, arm, args):
    """choose_lr on the first seed, or None while the arm's lr runs have not all finished."""
    try:
        return choose_lr(out, arm, args.seed_list[0], args.lrs)
    except FileNotFoundError:
        return None


def past_grid(lr, lrs):
    """The LADDER value past the grid's end when the dev pick lr sits there, else None."""
    if lr not in (lrs[0], lrs[-1]) or len(lrs) < 2:
        return None
    i = LADDER.index(lr) + (1 if lr == lrs[-1] else -1)
    return LADDER[i] if 0 <= i < len(LADDER) else None


def pick_r(dev_table):
    """The retrofit's r that dev picks (repeat.py's dev_table, mean over seeds), by the same score."""
    k = str(RULES["train_depth"])
    score = lambda r: (dev_table[k][r]["mean"] + dev_table["beyond"][r]["mean"]) / 2
    return int(max(dev_table[k], key=lambda r: (score(r), -int(r))))


def step_seconds(arm):
    """Per seed: the seconds of its training steps (train.py's dt summed) and of its whole run (elapsed)."""
    logs = arm.logs()
    return (np.array([sum(r["dt"] for r in train) for train, _ in logs]),
            np.array([train[-1]["elapsed"] for train, _ in logs]))


def finished(A):
    """The baseline arms of A, in BASELINES' order (a report before every arm has finished lacks some)."""
    return [b for b in BASELINES if b in A]


def cost(A, plan):
    """Per arm (the retrofit: both phases): training FLOPs, step and run seconds (mean over seeds), inference FLOPs
    per token at the arm's r."""
    inference, out = plan["inference_flops_per_token"], {}
    for name in ("retrofit", *finished(A)):
        phases = [A["retrofit_phase1"], A["retrofit"]] if name == "retrofit" else [A[name]]
        flops = sum(a.flops() for a in phases)
        steps, run = (sum(x) for x in zip(*(step_seconds(a) for a in phases)))
        out[name] = {"train_flops": float(flops.mean()), "train_flops_per_seed": flops.tolist(),
                     "step_seconds": float(steps.mean()), "run_seconds": float(run.mean()),
                     "inference_flops_per_token": inference["retrofit"][str(RULE["r"])] if name == "retrofit"
                     else inference[name.split("_")[0]]}
    out["retrofit"]["loop_readout_flops"] = plan["target"]["loop_readout_flops"]
    return out


def measure(A, plan, lrs):
    """The rule's comparisons (the retrofit at RULE["r"] against each baseline at depth 6 and beyond), the verdict
    (against uncut_flops), each baseline's verdict, the dev picks, the costs and the wall-time reading."""
    r, k = RULE["r"], RULES["train_depth"]
    rows, verdicts = {}, {}
    for base in finished(A):
        for depth in (k, "beyond"):
            rows[f"{base}@{depth}"] = compare(None, A["retrofit"].rows(depth, r), A[base].rows(depth, 1), rule=RULE)
        verdicts[base] = stats.combine(rows[f"{base}@{d}"]["verdict"] for d in (k, "beyond"))
    dev_r = pick_r(A["retrofit"].summary["dev_table"])
    for depth in (k, "beyond"):  # the r dev picks, against the verdict's baseline: reported, no verdict
        rows[f"dev_r@{depth}"] = reported(compare(None, A["retrofit"].rows(depth, dev_r), A["uncut_flops"].rows(depth, 1),
                                                  rule=RULE))
    return {"r": r, "dev_r": dev_r, "comparisons": rows, "verdicts": verdicts, "lr": lrs, "cost": cost(A, plan),
            "wall": at_wall(A, plan, r)}


def at_wall(A, plan, r):
    """The wall-time matching, read along each FLOPs-matched run: per model the steps the retrofit's training
    seconds buy it and its dev accuracy (depth 6, beyond) at that evaluation, beside the retrofit's at its end
    (dev, train.py's evaluations). The run's lr is not decayed there: a run stopped at the wall time would end on a
    decayed lr; None when the point lies past the run."""
    end = dev_curve(A["retrofit"], r)[-1]
    out = {"retrofit": {"dev_depth": float(end[2]), "dev_beyond": float(end[3])}}
    for arm in finished(A):
        model = arm.split("_")[0]
        wall = plan["steps"][f"{model}_wall"]
        point = [c for c in dev_curve(A[arm], 1) if c[0] == wall]
        out[model] = {"wall_steps": wall, "flops_steps": plan["steps"][arm],
                      "dev_depth": float(point[0][2]) if point else None,
                      "dev_beyond": float(point[0][3]) if point else None}
    return out


# -----------------------------------------------------------------------------
# running


def calibrate(args, out, p):
    """The calibration runs, then the plan (OUT/plan.json, made once: every arm's folder depends on it)."""
    import train
    from model import RecurrentGPT

    if p["plan"].is_file():
        plan = json.loads(p["plan"].read_text())
        if plan["seeds"] != args.seed_list or plan["smoke"] != args.smoke:
            sys.exit(f"compute_matched.py: error: {p['plan']} was made for seeds {plan['seeds']}, smoke "
                     f"{plan['smoke']}: rerun with those, or give another --out_dir")
        return plan
    table = calibration_arms(p, args.smoke)
    run_arms(p["cal"], list(table), table, args.jobs, out / "logs", str(args.seed_list[0]))
    logs = {n: [json.loads(x) for x in (p["cal"] / "arms" / n / f"seed_{args.seed_list[0]}" / "log.jsonl")
                .read_text().splitlines()] for n in table}
    cal = {n: step_records(log) for n, log in logs.items()}
    cfg = lambda c: train.parse_args(["--config", c])
    steps = SMOKE["steps"] if args.smoke else STEPS
    cut = RecurrentGPT.from_pretrained(str(p["cut"]))
    plan = make_plan(cal, cut, cfg(PHASE1), cfg(PHASE2), args.seed_list, steps, len(args.lrs))
    static = {m: RecurrentGPT.from_pretrained(str(p["cal"] / "arms" / m / f"seed_{args.seed_list[0]}")) for m in SHAPES}
    plan["inference_flops_per_token"] = {"retrofit": {r: cut.inference_flops_per_token(int(r)) for r in EVAL_R.split(",")},
                                         **{m: x.inference_flops_per_token(1) for m, x in static.items()}}
    plan.update(smoke=args.smoke, calibration={n: [dict(zip(("r", "flops", "dt"), x)) for x in c] for n, c in cal.items()})
    if plan["retrofit_seconds_fit"]["per_flop"] < 0:  # noise larger than the loops' cost: the wall match is rough
        print(f"warning: the retrofit's calibration steps took less time at more FLOPs (the line's slope "
              f"{plan['retrofit_seconds_fit']['per_flop']:.3g} s/FLOP): were the cores busy? {p['plan']} keeps them")
    p["plan"].write_text(json.dumps(plan, indent=2))
    return plan


def run_all(args, out, p, plan):
    """The retrofit and the verdict's baseline first, so that the verdict lands before the rest: per baseline arm in
    BASELINES' order, its lr runs on the first seed, then every seed at the lr dev picks (the first reused); each
    seed a job of its own, args.jobs at a time."""
    table, first = arms(out, p, plan, args.smoke, LADDER), str(args.seed_list[0])
    one = lambda b, lrs: {arm_name(b, lr): (table[arm_name(b, lr)][0], ["--seeds", first, *table[arm_name(b, lr)][1]])
                          for lr in lrs if lr is not None}
    sweep = lambda b: one(b, args.lrs)
    pick = lambda b: choose_lr(out, b, args.seed_list[0], args.lrs)[0]
    past = lambda b: one(b, [past_grid(pick(b), args.lrs)])  # reported beside the pick
    run = lambda names, t: run_arms(out, names, t, args.jobs, out / "logs", args.seeds, by_seed=True)
    verdict, other = BASELINES
    run(["retrofit_phase1", *sweep(verdict)], {**table, **sweep(verdict)})
    run(["retrofit", arm_name(verdict, pick(verdict)), *past(verdict), *sweep(other)],
        {**table, **past(verdict), **sweep(other)})
    run([arm_name(other, pick(other)), *past(other)], {**table, **past(other)})


def report(args, out, plan, command, t0):
    """summary.json, compute_matched.md and the PNG, from the finished arms: the retrofit and the verdict's baseline
    at least; a baseline still running is left out and named."""
    def whole(name):  # the arm, finished on every seed, or None
        arm = Arm(out, name) if (out / "arms" / name / "summary.json").is_file() else None
        return arm if arm and arm.seeds == args.seed_list else None

    A = {n: whole(n) for n in ("retrofit_phase1", "retrofit")}
    lrs, past, waiting, sweeps = {}, {}, [], []
    for b in BASELINES:
        pick = lr_pick(out, b, args)
        x = pick and past_grid(pick[0], args.lrs)  # a run past the grid's end, where the pick sits there
        try:
            beyond = x and (x, choose_lr(out, b, args.seed_list[0], [x])[1][x])
        except FileNotFoundError:  # not run yet
            beyond = False
        arm = pick and whole(arm_name(b, pick[0]))
        if not arm or beyond is False:
            waiting.append(b)
            continue
        A[b], lrs[b] = arm, pick
        past.update({b: beyond} if beyond else {})
        sweeps += [arm_name(b, lr) for lr in args.lrs if lr != pick[0]] + ([arm_name(b, x)] if x else [])
    if not (A["retrofit_phase1"] and A["retrofit"]) or BASELINES[0] in waiting:
        sys.exit(f"compute_matched.py: error: the verdict needs the retrofit's two phases and {BASELINES[0]} (its lr "
                 f"runs, then every seed at the pick) finished on seeds {args.seeds}: run without --report")
    m = measure(A, plan, {b: lr for b, (lr, _) in lrs.items()})
    m["lr_dev_scores"] = {b: {f"{lr:g}": s for lr, s in scores.items()} for b, (_, scores) in lrs.items()}
    m["lr_past_grid"] = {b: {"lr": x, "dev_score": score} for b, (x, score) in past.items()}
    # every run the report reads, the lr runs of one seed included: train.py's dt summed (evaluations left out)
    m["train_step_seconds_all_runs"] = float(sum(step_seconds(a)[0].sum()
                                                 for a in [*A.values(), *(Arm(out, n) for n in sweeps)]))
    verdict, k = m["verdicts"]["uncut_flops"], RULES["train_depth"]
    c, rows = m["cost"], m["comparisons"]
    lines = [f"Rule: experiments/rules.json compute_matched at {rules_commit()}; code at {git_commit() or None}; seeds "
             f"{args.seeds}; test split; the retrofit at r = {m['r']} (dev picks r = {m['dev_r']}); paired "
             f"{RULES['confidence']:.0%} intervals (experiments/stats.py).", "",
             f"**Verdict (retrofit vs uncut_flops): {verdict}.**", "",
             f"| arm | lr (dev) | steps | train FLOPs | step seconds | inference FLOPs/token | test depth {k} | test beyond "
             f"| retrofit - arm, depth {k} | retrofit - arm, beyond | verdict |", "|---" * 11 + "|"]
    for name in ("retrofit", *finished(A)):
        r = m["r"] if name == "retrofit" else 1
        steps = (f"{plan['steps']['retrofit_phase1']} + {plan['steps']['retrofit_phase2']}" if name == "retrofit"
                 else str(plan["steps"][name]))
        diff = (["-", "-", "-"] if name == "retrofit" else
                [stats.text(rows[f"{name}@{k}"]), stats.text(rows[f"{name}@beyond"]), m["verdicts"][name]])
        lines.append(f"| {name} | {m['lr'].get(name, 'recipe')} | {steps} | {c[name]['train_flops']:.3g} | "
                     f"{c[name]['step_seconds']:.0f} | {c[name]['inference_flops_per_token']:.3g} | "
                     f"{A[name].acc(k, r).mean():.3f} | {A[name].acc('beyond', r).mean():.3f} | " + " | ".join(diff) + " |")
    lines += ["", line(f"at the r dev picks (r = {m['dev_r']}), depth {k}, vs uncut_flops", rows[f"dev_r@{k}"]),
              line(f"at the r dev picks (r = {m['dev_r']}), beyond, vs uncut_flops", rows["dev_r@beyond"]),
              f"The retrofit's per-loop readouts add {c['retrofit']['loop_readout_flops']:.3g} FLOPs that train.py's "
              f"count leaves out ({c['retrofit']['loop_readout_flops'] / c['retrofit']['train_flops']:.0%} of it).", ""]
    for b, (x, score) in past.items():
        pick, scores = lrs[b]
        lines.append(f"{b}: dev picked lr {pick:g}, an end of the grid {', '.join(f'{v:g}' for v in args.lrs)}; one "
                     f"run at {x:g} on the first seed scores {score:.3f} on dev against the pick's {scores[pick]:.3f} "
                     "(mean of depth 6 and beyond; the rule's pick stands).")
    lines += [""] if past else []
    w = m["wall"]
    lines.append(f"Training steps of every run read here (the lr runs included): "
                 f"{m['train_step_seconds_all_runs'] / 3600:.2f} CPU-hours (train.py's dt summed; evaluations extra).")
    lines.append(f"At the retrofit's wall time of training steps ({plan['target']['seconds']:.0f} s a seed on the "
                 f"calibration's pace), read along each FLOPs-matched run (dev, lr not yet decayed there); the retrofit "
                 f"at its end: depth {k} {w['retrofit']['dev_depth']:.3f}, beyond {w['retrofit']['dev_beyond']:.3f}.")
    for model in (b.split("_")[0] for b in finished(A)):
        x = w[model]
        seen = ("past the run: not read" if x["dev_depth"] is None else
                f"depth {k} {x['dev_depth']:.3f}, beyond {x['dev_beyond']:.3f}")
        lines.append(f"- {model}: {x['wall_steps']} steps (the FLOPs match: {x['flops_steps']}): {seen}")
    if waiting:
        lines += ["", f"Not finished yet, left out: {', '.join(waiting)} (`make compute_matched` continues them)."]
    md = "\n".join(lines)
    (out / "compute_matched.md").write_text(md + "\n")
    summary = {"question": RULE["question"], "rule": RULE, "verdict": verdict, "measured": m, "plan": plan,
               "unfinished": waiting,
               **provenance(A, args.seed_list, command, t0)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(A, m, finished(A), out / "compute_matched.png")
    plot_test(A, m, finished(A), plan, out / "compute_matched_test.png")
    print(f"\n{md}\n\nwrote {out / 'summary.json'}, {out / 'compute_matched.md'}, {out / 'compute_matched.png'}, "
          f"{out / 'compute_matched_test.png'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out_dir", default="out/compute_matched")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (2 on a 2-core machine)")
    ap.add_argument("--seeds", default=",".join(map(str, RULE["seeds"])),
                    help=f"train.py seeds of every arm; the first also runs the lr sweep ({stats.MIN_SEEDS} for a verdict)")
    ap.add_argument("--smoke", action="store_true",
                    help="a few steps an arm, two lr values, small data: tests the pipeline, not the question")
    ap.add_argument("--plan", action="store_true", help="calibrate and print the plan, train no arm")
    ap.add_argument("--report", action="store_true", help="train nothing: the verdict of the finished arms")
    args = ap.parse_args()
    args.seed_list = [int(s) for s in args.seeds.split(",")]
    args.lrs = SMOKE["lrs"] if args.smoke else LR_GRID
    if args.jobs < 1 or len(args.seed_list) < 2:
        ap.error("--jobs must be >= 1" if args.jobs < 1 else "--seeds: at least two (an interval needs them)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # smollm2 is the GGUF from PyPI, as in make retrofit_depth
    out, t0 = Path(args.out_dir), time.time()
    command = shlex.join(["python", "-m", "experiments.compute_matched", *sys.argv[1:]])
    p = paths(out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    if not args.report:  # the cut and the task in its tokens, each made once
        smollm2_depth(p["cut"], {p["data"]: []}, out / "logs" / "prepare.log", RULES["train_depth"], RULES["test_depth"],
                      ["--num_train", "2000", "--num_dev", "100"] if args.smoke else [])
    if args.report and not p["plan"].is_file():
        sys.exit(f"compute_matched.py: error: no {p['plan']}: run without --report first")
    plan = calibrate(args, out, p) if not args.report else json.loads(p["plan"].read_text())
    est = plan["estimated_train_cpu_seconds"]
    print(f"plan ({p['plan']}): steps {plan['steps']}; the retrofit's training FLOPs {plan['target']['flops']:.3g} and "
          f"step seconds {plan['target']['seconds']:.0f} a seed; training steps of every run about {est / 3600:.1f} "
          f"CPU-hours on one thread each ({est / 3600 / args.jobs:.1f} at {args.jobs} a time), evaluations extra")
    if args.plan:
        return
    if not args.report:
        run_all(args, out, p, plan)
    report(args, out, plan, command, t0)


if __name__ == "__main__":
    main()
