"""
Does the loop installed on symbols carry over to English? One command trains the symbol retrofit per seed, reads it
zero-shot on the depth task written in English, trains it on English against the same English training from the
fresh cut, and draws the verdict by the rule experiments/rules.json ("english") fixed before the runs.

    python -m experiments.english                  # the whole study (make english); finished seeds are reused
    python -m experiments.english --report         # run nothing: the report of the finished arms
    python -m experiments.english --smoke --out_dir /tmp/english_smoke   # the pipeline in a few minutes, no figures

arXiv 2608.11233 measured this on a Qwen2.5-0.5B retrofit: language fine-tuning of the full-block retrofit reaches
79-86%, zero-shot transfer from the symbol-trained mechanism is minimal, and adapter-only language training that
starts from the installed mechanism beats the same training from a fresh cut by 18.6 points. Here the parent is
SmolLM2-135M (the offline GGUF) cut to (2,2,2) by surgery.py, the task the S3 running product of
data/depth/prepare.py (train depth 6, test rows to depth 12), the same problems row for row in symbols (" a".." f"
in, " A".." F" out) and in English (--render english: instructions about three cards, answers " AB".." CB"; chance
1/6). The arms (repeat.py folders under OUT/arms, a finished seed reused, a killed one resumed):
  symbols_phase1, symbols   the demo's retrofit (retrofit_depth.sh STEPS=260 PHASE2_STEPS=30) on the symbol rows
  zero_shot*                symbols read on the English test rows: among the whole vocabulary, among the six English
                            answer words (_answers), among its own six symbol answer words (_symbols)
  en_installed, en_fresh    the same English training (config/cpu_retrofit_depth.json's recipe, full blocks) from
                            the symbol retrofit of the same seed and from the fresh cut: the verdict
  en_adapter_installed,     the same with --freeze base (the adapter alone trains), fewer seeds
  en_adapter_fresh
  en_cot                    the static cut trained on the English chain of thought (prepare.py --render english
                            --cot: the answer words written out), scored by generation (plumbing/depth_cot.py)
Comparisons are paired by seed and test row (experiments/stats.py, through claims.compare). Writes OUT/summary.json,
OUT/english.md (the table) and OUT/english.png.

What was cut to fit the CPU budget of RESULTS.md's "Does the loop carry over to English?" (with the step times it
was sized on, measured nice'd beside other work and so upper bounds): five symbol retrofits take about half of it,
so an English arm trains 100 steps of 8 rows (STEPS, ENGLISH_BATCH; an English row is ~8x a symbol row, and the
symbol recipe takes 32 rows a step); every evaluation reads the first 200 of the 1000 test rows (EVAL_ROWS); the
adapter arms and the chain of thought run the first seed (ADAPTER_SEEDS, COT_SEEDS: no verdict rests on them); the
chain is the cut's six layers (not the uncut 30-layer parent), scored on the first 40 rows (COT_ROWS); the zero-shot
readings go to r = 8, the rule's r (ZERO_SHOT_R), not 32.
"""

import json
import shlex
import sys
import time

import numpy as np

from experiments.claim_arms import run_arms, run_units, sh_once, smollm2_depth, study_args
from experiments.claims import RULES, Arm, compare, line, reported, rules_state
from experiments.repeat import aggregate, depth_panel, markdown
from plumbing.plots import pyplot

RULE = RULES["english"]
SEEDS = ",".join(map(str, RULE["seeds"]))
TRAIN_K, TEST_K, LOOP_R = RULES["train_depth"], RULES["test_depth"], RULES["loop_r"]  # claims.Arm reads them too
EVAL_R = "1,2,4,8,16,32"
CHANCE = 1 / 6

STEPS = {"symbols": 260, "symbols_phase2": 30, "english": 100}  # the demo's two phases; English: the budget
ENGLISH_BATCH = 8  # rows a step (the recipe's 32 symbol rows are ~220 tokens; 8 English rows ~450)
EVAL_ROWS, COT_ROWS = 200, 40  # test rows per evaluation (each row labels all 12 depths)
ZERO_SHOT_R = "1,2,4,8"  # the zero-shot reading up to the rule's r
ADAPTER_SEEDS, COT_SEEDS = 1, 1  # the first seeds of --seeds

ZERO_SHOT = {"zero_shot": "", "zero_shot_answers": "answers", "zero_shot_symbols": "symbols"}  # arm: eval_math --choices
NEEDS = {"symbols": "symbols_phase1", "en_installed": "symbols", "en_adapter_installed": "symbols",
         **{z: "symbols" for z in ZERO_SHOT}}  # an arm's seed starts once this arm's same seed is done
PAPER = {"full": "full-block language fine-tuning 79-86%", "zero_shot": "zero-shot transfer minimal",
         "adapter": "adapter only: the installed start 18.6 points ahead of a fresh cut",
         "cot": "the loop beats the token chain beyond the trained range (beyond depth 10: 53% vs 2.5%)"}


def paths(out):
    d = out / "data"
    return dict(symbols=d / "symbols", english=d / "english", english_cot=d / "english_cot", cut=out / "smollm2_cut")


def sizes(smoke):
    """The run's sizes: the module's, or --smoke's (a few steps of 4 rows, 4 test rows: the pipeline, no figures)."""
    if smoke:
        return dict(symbols=4, symbols_phase2=2, english=4, batch=4, eval_rows=4, cot_rows=2, eval_r="1,8,32",
                    zero_shot_r="1,8", adapter_seeds=1, cot_seeds=1, num_train=500, num_dev=50,
                    symbol_flags=["--batch_size", "4", "--eval_iters", "1"])
    return dict(symbols=STEPS["symbols"], symbols_phase2=STEPS["symbols_phase2"], english=STEPS["english"],
                batch=ENGLISH_BATCH, eval_rows=EVAL_ROWS, cot_rows=COT_ROWS, eval_r=EVAL_R, zero_shot_r=ZERO_SHOT_R,
                adapter_seeds=ADAPTER_SEEDS, cot_seeds=COT_SEEDS, num_train=50000, num_dev=1000, symbol_flags=[])


def arms(out, p, z, seeds):
    """name -> (train.py args, repeat.py args). z: sizes(); seeds: the run's seeds (the adapter and chain arms take
    their first few, named in their repeat args, which run_arms keeps)."""
    recipe = ["--config", "config/cpu_retrofit_depth.json"]
    n = str(z["english"])
    english = [*recipe, "--data", str(p["english"]), "--max_iters", n, "--batch_size", str(z["batch"]),
               "--eval_interval", n, "--eval_iters", "2", "--eval_r", "8", "--log_interval", "10"]
    installed = str(out / "arms" / "symbols" / "seed_{seed}")
    looped = ["--r", z["eval_r"], "--splits", "test", "--eval_limit", str(z["eval_rows"])]
    first = lambda k: ["--seeds", ",".join(seeds.split(",")[:k])]
    return {
        "symbols_phase1": ([*recipe, "--init", str(p["cut"]), "--data", str(p["symbols"]),
                            "--max_iters", str(z["symbols"]), *z["symbol_flags"]], ["--eval", "none"]),
        "symbols": (["--config", "config/cpu_retrofit_depth_phase2.json", "--init",
                     str(out / "arms" / "symbols_phase1" / "seed_{seed}"), "--data", str(p["symbols"]),
                     "--max_iters", str(z["symbols_phase2"]), *z["symbol_flags"]], looped),
        "en_installed": ([*english, "--init", installed], looped),
        "en_fresh": ([*english, "--init", str(p["cut"])], looped),
        "en_adapter_installed": ([*english, "--init", installed, "--freeze", "base"],
                                 [*first(z["adapter_seeds"]), *looped]),
        "en_adapter_fresh": ([*english, "--init", str(p["cut"]), "--freeze", "base"],
                             [*first(z["adapter_seeds"]), *looped]),
        # the chain of thought: the cut's six layers run once, trained on the chains (no per-loop labels to supervise)
        "en_cot": ([*english, "--data", str(p["english_cot"]), "--init", "smollm2", "--shape", "2,2,2", "--static",
                    "--step_supervision", "false", "--eval_r", "1"],
                   [*first(z["cot_seeds"]), "--r", "1", "--splits", "test", "--eval_limit", str(z["cot_rows"])]),
    }


def prepare(p, z, log):
    """The cut, then the three data sets (the same problems, row for row), each made once."""
    sets = {p["symbols"]: [], p["english"]: ["--render", "english"], p["english_cot"]: ["--render", "english", "--cot"]}
    smollm2_depth(p["cut"], sets, log, TRAIN_K, TEST_K, ["--num_train", str(z["num_train"]), "--num_dev", str(z["num_dev"])])


# -----------------------------------------------------------------------------
# running: each arm's seed once the seed it starts from is done


def zero_shot(out, p, name, seed, z, log):
    """The symbol retrofit of `seed` on the English test rows, read as ZERO_SHOT[name] says, into an arm folder as
    repeat.py leaves one (OUT/arms/<name>/seed_S/eval); reused when it holds this command's result."""
    choices = ZERO_SHOT[name]
    if choices == "symbols":  # its own answer words, the i-th standing for the English i-th (prepare.ELEMENTS' order)
        choices = ",".join(map(str, json.loads((p["symbols"] / "meta.json").read_text())["answer_ids"]))
    ev = out / "arms" / name / f"seed_{seed}" / "eval"
    cmd = [sys.executable, "eval_math.py", "--init", str(out / "arms" / "symbols" / f"seed_{seed}"), "--task", "depth",
           "--data", str(p["english"]), "--split", "test", "--r", z["zero_shot_r"], "--limit", str(z["eval_rows"]),
           "--batch_size", "50", "--threads", "1", "--out_dir", str(ev), *(["--choices", choices] if choices else [])]
    sh_once(cmd, ev / "summary.json", ev.parent / "command.json", log)


def zero_shot_summary(out, name, seeds):
    """OUT/arms/<name>/summary.json over the seeds, as repeat.py writes it (claims.Arm reads it)."""
    d = out / "arms" / name
    runs = [json.loads((d / f"seed_{s}" / "eval" / "summary.json").read_text()) for s in seeds]
    table = aggregate(runs)
    cmd = shlex.join(["python", *json.loads((d / f"seed_{seeds[0]}" / "command.json").read_text())])
    (d / "summary.json").write_text(json.dumps({"command": cmd, "seeds": seeds, "split": "test", "train_max_k": TRAIN_K,
                                                "table": table, "markdown": markdown(table, TRAIN_K, len(seeds))},
                                               indent=2))


def schedule(seeds, z):
    """The units (arm, seeds) in the order they start among the ready ones: seed by seed, the two arms of the rule
    (the chain symbols_phase1 -> symbols -> zero-shot -> en_installed, and en_fresh, which is ready at once and so
    runs beside it), so that a study stopped early holds whole pairs; the arms no verdict rests on after."""
    first = lambda k: ",".join(seeds[:k])
    order = []
    for s in seeds:
        order += [("symbols_phase1", s), ("en_fresh", s), ("symbols", s), *[(n, s) for n in ZERO_SHOT],
                  ("en_installed", s)]
    return order + [("en_adapter_installed", first(z["adapter_seeds"])), ("en_adapter_fresh", first(z["adapter_seeds"])),
                    ("en_cot", first(z["cot_seeds"]))]


def run_all(args, out, p, z, table):
    logs = out / "logs"
    prepare(p, z, logs / "prepare.log")
    seeds = args.seeds.split(",")

    def run_one(arm, unit_seeds):
        print(f"  {arm} seed {unit_seeds}", flush=True)
        if arm in ZERO_SHOT:
            zero_shot(out, p, arm, unit_seeds, z, logs / f"{arm}.log")
        else:
            run_arms(out, [arm], table, 1, logs, unit_seeds)

    run_units(schedule(seeds, z), run_one, args.jobs, NEEDS)
    run_arms(out, list(table), table, args.jobs, logs, args.seeds)  # every seed reused: each arm's summary whole
    for name in ZERO_SHOT:
        zero_shot_summary(out, name, [int(s) for s in seeds])


# -----------------------------------------------------------------------------
# the report: the verdict by the rule, the reported comparisons, the table and the figure


def shared(a, b, depth, r):
    """(seeds, rows) of two arms on the seeds both ran, in a's order (claims.Arm.rows reads its own seeds), and on
    the test rows both read: every data set here holds the same problems in the same order, so the first n rows of
    one are the first n of the other (the chain of thought reads fewer)."""
    both = [s for s in a.seeds if s in b.seeds]
    x, y = (arm.rows(depth, r)[[arm.seeds.index(s) for s in both]] for arm in (a, b))
    n = min(x.shape[1], y.shape[1])
    return x[:, :n], y[:, :n]


def versus(a, b, depth, r):
    """A reported comparison a - b (superiority, margin 0): an interval from two shared seeds on, with one seed the
    means and their difference only."""
    x, y = shared(a, b, depth, r)
    if len(x) >= 2:
        return reported(compare(None, x, y, rule=RULE, kind="superiority", margin=0.0))
    return {"a": float(x.mean()), "b": float(y.mean()), "diff": float((x - y).mean()), "seeds": len(x),
            "rows": x.shape[1], "verdict": "reported (one seed: no interval)"}


def says(label, res):
    if "low" in res:
        return line(label, res)
    return f"{label}: {res['a']:.3f} vs {res['b']:.3f}, diff {res['diff']:+.3f} (one seed, no interval)"


def measure(A):
    """(measured, verdict, text) from the arms A (name -> claims.Arm); every arm but the two of the rule optional."""
    inst, fresh, r = A["en_installed"], A["en_fresh"], RULE["r"]
    m = {"rule": compare(None, *shared(inst, fresh, RULE["depths"], r), rule=RULE)}
    m["learned"] = bool(max(m["rule"]["a"], m["rule"]["b"]) >= CHANCE + 0.05)
    verdict = m["rule"]["verdict"] if m["learned"] else "not testable here"
    for depth, rr in (("beyond", 8), ("beyond", LOOP_R), ("trained", 1)):
        m[f"{depth}_r{rr}"] = versus(inst, fresh, depth, rr)
    text = [says(f"English, depth <= {TRAIN_K} at r = {r}, installed vs fresh", m["rule"]),
            says(f"beyond at r = {LOOP_R}", m[f"beyond_r{LOOP_R}"]),
            says(f"depth <= {TRAIN_K} at r = 1", m["trained_r1"])]
    for name in [n for n in ZERO_SHOT if n in A]:  # the six-word readings against chance (1/6), on the same rows
        z, six = A[name], ZERO_SHOT[name] != ""
        m[name] = {d: reported(compare(None, z.rows(d, r), np.full_like(z.rows(d, r), CHANCE), rule=RULE))
                   if six and len(z.seeds) >= 2 else {"a": float(z.rows(d, r).mean())} for d in ("trained", "beyond")}
        text.append(f"{name} (r = {r}) {m[name]['trained']['a']:.3f} on depth <= {TRAIN_K}"
                    + (f" (chance {CHANCE:.3f})" if six else " (the whole vocabulary)"))
    if {"en_adapter_installed", "en_adapter_fresh"} <= set(A):
        m["adapter"] = versus(A["en_adapter_installed"], A["en_adapter_fresh"], "trained", r)
        text.append(says(f"adapter only, depth <= {TRAIN_K} at r = {r}, installed vs fresh", m["adapter"]))
    if "en_cot" in A:
        m["cot"] = versus(inst, A["en_cot"], "beyond", LOOP_R)
        m["cot_trained"] = versus(inst, A["en_cot"], "trained", LOOP_R)
        cot = A["en_cot"].eval_summary(A["en_cot"].seeds[0])["results"][0]
        m["cot_tokens_per_answer"] = cot["output_tokens_per_answer"]
        m["cot_diagnosis_by_depth"] = cot.get("chain_diagnosis_by_k")
        text.append(says(f"beyond, installed loop at r = {LOOP_R} vs the English token chain", m["cot"]))
    if "symbols" in A:  # the installed retrofit on the same problems in symbols, before any English
        m["symbols_by_depth_r8"] = {k: float(A["symbols"].acc(k, r).mean()) for k in range(1, TEST_K + 1)}
    return m, verdict, "; ".join(text)


def accuracy_table(A, names, rs):
    """{arm: {depth or trained/beyond: {r: mean over seeds}}} from the arms' repeat.py tables."""
    keys = [str(k) for k in range(1, TEST_K + 1)] + ["trained", "beyond"]
    return {n: {k: {r: float(np.mean(A[n].table[k][r]["values"])) for r in rs if r in A[n].table[k]} for k in keys}
            for n in names if n in A}


def table_markdown(acc, rs, seen):
    """English accuracy by depth (rows) and r (columns), cells installed / fresh (mean over seeds), with the fraction
    of each depth's test problems that the train split labels (seen: meta.json's seen_in_train["test"])."""
    head = "| depth | in train | " + " | ".join(f"r={r}" for r in rs) + " |\n" + "|---" * (len(rs) + 2) + "|\n"
    name = lambda k: {"trained": f"all <= {TRAIN_K}", "beyond": f"all > {TRAIN_K}"}.get(
        k, k + (" (beyond)" if k.isdigit() and int(k) > TRAIN_K else ""))
    cell = lambda k, r: " / ".join(f"{acc[n][k][r]:.2f}" if r in acc[n][k] else "-" for n in ("en_installed", "en_fresh"))
    in_train = lambda k: f"{seen[k]:.2f}" if k in seen else ""
    return head + "\n".join(f"| {name(k)} | {in_train(k)} | " + " | ".join(cell(k, r) for r in rs) + " |"
                            for k in acc["en_installed"])


def plot(acc, path, rs):
    """Accuracy against r per depth for the two arms of the rule, and every arm's mean over the trained depths."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for ax, n in zip(axes, ("en_installed", "en_fresh")):
        curves = {k: ([int(r) for r in by_r], list(by_r.values()), None) for k, by_r in acc[n].items() if k.isdigit()}
        depth_panel(ax, curves, TRAIN_K, f"{n}: English test rows")
    for n, by_k in acc.items():
        if n == "en_cot":  # no loop: the chain's one accuracy as a line
            axes[2].axhline(by_k["trained"]["1"], color="black", ls="--", lw=1, label="en_cot (token chain)")
            continue
        xs = [int(r) for r in by_k["trained"]]
        axes[2].plot(xs, list(by_k["trained"].values()), marker="o", label=n)
    axes[2].set_xscale("log", base=2)
    xs = [int(r) for r in rs]
    axes[2].set(xticks=xs, xticklabels=xs, xlabel="test loops r", ylim=(0, 1.02), title=f"every arm, depths <= {TRAIN_K}")
    axes[2].axhline(CHANCE, color="grey", lw=0.8, ls=":")
    axes[2].legend(fontsize=7)
    axes[0].set_ylabel("accuracy (mean over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def finished(out, name):
    return (out / "arms" / name / "summary.json").is_file()


def report(args, out, z, command, t0):
    read = ["en_installed", "en_fresh", *ZERO_SHOT, "en_adapter_installed", "en_adapter_fresh", "en_cot"]  # English rows
    names = [*read, "symbols_phase1", "symbols"]
    if not all(finished(out, n) for n in ("en_installed", "en_fresh")):
        print("english: en_installed and en_fresh are not both finished: no report (run without --report)")
        return None
    A = {n: Arm(out, n) for n in names if finished(out, n)}
    measured, verdict, text = measure(A)
    rs = z["eval_r"].split(",")
    acc = accuracy_table(A, read, rs)
    meta = paths(out)["english"] / "meta.json"
    seen = json.loads(meta.read_text())["seen_in_train"]["test"] if meta.is_file() else {}
    commits = rules_state()
    flops = {n: float(a.flops().mean()) for n, a in A.items() if n not in ZERO_SHOT}
    installing = flops.get("symbols_phase1", 0.0) + flops.get("symbols", 0.0)
    cost = (f"Training FLOPs a seed (train.py's count): installed {installing + flops['en_installed']:.2e} (the symbol "
            f"retrofit {installing:.2e}, then English {flops['en_installed']:.2e}), fresh {flops['en_fresh']:.2e}; the "
            f"same model, so the same inference FLOPs a token at each r.")
    summary = {"question": "Does the loop installed on symbols carry over to English?", "paper": PAPER, "rule": RULE,
               "verdict": verdict, "measured": measured, "text": text, "accuracy": acc,
               "arms": {n: a.summary["command"] for n, a in A.items()}, "seeds": args.seeds, "sizes": z,
               "command": command, "commits": commits, "seconds": time.time() - t0,
               "train_flops": flops, "cost": cost,
               "train_seconds": {n: a.train_seconds() for n, a in A.items() if n not in ZERO_SHOT}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(acc, out / "english.png", rs)
    warn = " (uncommitted changes in rules.json: commit the rule before the runs it governs)" if commits[
        "rules_uncommitted"] else ""
    md = (f"Rule: experiments/rules.json \"english\" at {commits['rules']}{warn}; code at {commits['code']}; seeds "
          f"{args.seeds}; the first {z['eval_rows']} English test rows; paired {RULES['confidence']:.0%} intervals "
          f"(experiments/stats.py).\n\n**Verdict: {verdict}.** {text}. {cost}\n\nPaper (arXiv 2608.11233, Qwen2.5-0.5B): "
          + "; ".join(PAPER.values()) + ".\n\nEnglish accuracy on test by depth and r, installed / fresh (mean over "
          f"seeds; in train: the fraction of each depth's test problems that the train split labels):\n\n"
          f"{table_markdown(acc, rs, seen)}\n")
    (out / "english.md").write_text(md)
    print(f"\n{md}\nwrote {out / 'summary.json'}, {out / 'english.md'}, {out / 'english.png'} ({time.time() - t0:.0f} s)")
    return summary


def main():
    args, out, command = study_args(__doc__, "experiments.english", "out/english", SEEDS)
    t0, p, z = time.time(), paths(out), sizes(args.smoke)
    print(f"english: seeds {args.seeds}, {args.jobs} runs at a time, sizes {json.dumps(z)}; logs in {out / 'logs'}")
    if not args.report:
        run_all(args, out, p, z, arms(out, p, z, args.seeds))
    report(args, out, z, command, t0)


if __name__ == "__main__":
    main()
