"""
One trained result is an anecdote: train the same recipe under several seeds, evaluate each on the
depth task, and report every (task depth, test loops r) cell as the mean and spread over the seeds.

The claim under test is test-time depth (McLeish et al. 2025, arXiv 2511.07384; Geiping et al. 2025,
arXiv 2502.05171): accuracy rises with the number of loops r. The seed of train.py sets the random
init (from scratch), the batch order, the sampled r of each step and the s_0 draws; the data and the
evaluation's s_0 draws stay fixed, so the spread is the spread of training.

    python data/depth/prepare.py --out_dir data/depth
    python -m experiments.repeat --out_dir out/seeds/depth --seeds 1337,2,3 -- --config config/cpu_depth.json --data data/depth
    python -m experiments.repeat --out_dir out/seeds/depth_ss --seeds 1337,2,3 -- --config config/cpu_depth.json \\
        --data data/depth --step_supervision
    python -m experiments.repeat --compare out/demo/eval_depth out/demo/eval_retrofit_depth   # two evals side by side
    python -m experiments.repeat --aggregate out/a/eval out/b/eval out/c/eval   # seeds run another way: mean ± std
    python -m experiments.repeat --out_dir out/seeds/text --eval none -- --data data/sotu --max_iters 20   # text: val loss only
Everything after `--` goes to train.py (per seed: --seed S --out_dir OUT/seed_S are added, and {seed} in
an argument becomes S: a second phase continues each seed of the first, `-- --init OUT1/seed_{seed}`). Writes
OUT/seed_S/ (the run, its evaluation on the test split in eval/ and on dev in eval_dev/), OUT/summary.json
(command, seeds, git commit, seconds, the test table and the dev table) and OUT/depth_seeds.png; prints the
test table as markdown. Whatever chooses something from these runs (an r, a step count) reads dev_table;
the report reads table (test). Paired intervals between arms: experiments/stats.py. A seed whose run and evaluation are
already in OUT with the same command is reused, a killed one resumes from its last save (train.py
--resume), and neither is ever mixed with another command's.
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

from plumbing.cli import git_commit, int_list
from plumbing.plots import pyplot

REPO = Path(__file__).resolve().parents[1]


def run(cmd):
    print("+ " + shlex.join(cmd), flush=True)
    if subprocess.run(cmd, cwd=REPO).returncode:
        sys.exit(f"repeat.py: error: {shlex.join(cmd[:2])} failed (its message is above); fix it and rerun")


def trained_on(train_args):
    """The data dir train.py reads for these arguments: --data, else its --config file's, else train.py's default."""
    import train  # here: only a depth evaluation needs it

    try:
        return train.parse_args(train_args).data
    except train.TrainError as err:
        sys.exit(f"repeat.py: error: the train.py arguments after --: {err}")


EVAL_DIRS = {"test": "eval", "dev": "eval_dev"}  # the split each seed is evaluated on -> its folder


def seed_result(seed, out_dir, train_args, eval_r, eval_args, splits=tuple(EVAL_DIRS)):
    """The eval summaries {"test": ..., "dev": ...} of one seed: trained and evaluated now, or reused when
    OUT/seed_S holds the result of exactly this command. eval_args None: no depth evaluation (text data), the
    summary is the run's last validation losses (train.py's log.jsonl), under "test" alone."""
    run_dir = out_dir / f"seed_{seed}"
    train_args = [a.replace("{seed}", str(seed)) for a in train_args]
    train_cmd = [sys.executable, "train.py", *train_args, "--seed", str(seed), "--out_dir", str(run_dir)]
    data = trained_on(train_args)
    eval_cmds = {} if eval_args is None else {split: [
        sys.executable, "eval_math.py", "--init", str(run_dir), "--task", "depth", "--data", data,
        "--r", eval_r, "--split", split, "--out_dir", str(run_dir / folder), *eval_args]
        for split, folder in EVAL_DIRS.items() if split in splits}
    stamp = run_dir / "repeat_command.json"
    want = {"train": train_cmd[1:], "eval": {split: cmd[1:] for split, cmd in eval_cmds.items()} or None}
    summary = run_dir / "eval" / "summary.json"
    done = summary.is_file() and all((run_dir / EVAL_DIRS[s] / "summary.json").is_file() for s in eval_cmds)
    if stamp.is_file() and done and json.loads(stamp.read_text()) == want:
        print(f"seed {seed}: reusing {summary}")
    else:
        if run_dir.exists() and any(run_dir.iterdir()):
            if not stamp.is_file() or json.loads(stamp.read_text()) != want:
                sys.exit(f"repeat.py: error: {run_dir} holds a run of another command: "
                         f"remove it or choose another --out_dir")
            if (run_dir / "config.json").is_file() and (run_dir / "train_state.pt").is_file():
                # a killed seed continues from its last save (train.py --resume checks the flags are the same)
                print(f"seed {seed}: {run_dir} holds an unfinished run of this command: resuming it")
                train_cmd = [*train_cmd, "--resume"]
            else:
                print(f"seed {seed}: {run_dir} holds an unfinished run of this command with no save: starting it again")
                shutil.rmtree(run_dir)  # ours (the stamp says so), and a fresh train.py must not append to it
        run_dir.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(want))  # first: a half-finished seed is recognized as this command's
        run(train_cmd)
        for cmd in eval_cmds.values():
            run(cmd)
        if not eval_cmds:
            evals = [rec for rec in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines()) if "val" in rec]
            summary.parent.mkdir(exist_ok=True)
            summary.write_text(json.dumps({"step": evals[-1]["step"], "val": evals[-1]["val"]}))
    return {split: json.loads((run_dir / EVAL_DIRS[split] / "summary.json").read_text()) for split in eval_cmds or ["test"]}


def covered(summary_path, argv, seeds):
    """True when summary_path holds a summary of this same command over a superset of `seeds`: a run over fewer
    seeds (an lr sweep's first seed, one seed resumed) must not shrink it."""
    if not summary_path.is_file():
        return False
    old = json.loads(summary_path.read_text())
    strip = lambda a: [x for i, x in enumerate(a) if x != "--seeds" and (i == 0 or a[i - 1] != "--seeds")]
    return set(seeds) <= set(old.get("seeds", [])) and strip(shlex.split(old["command"])[3:]) == strip(argv)


def stats(values):
    """mean, sample std (ddof 1), min, max and the values themselves (in seed order)."""
    return dict(mean=float(np.mean(values)), std=float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                min=float(min(values)), max=float(max(values)), values=list(values))


def aggregate(summaries):
    """{depth or trained/beyond: {r: stats}} over the seeds' depth eval summaries; without a depth evaluation
    {"val_loss": {r: stats}} of the last validation."""
    table = {}
    for s in summaries:
        if "val" in s:
            for r, v in s["val"].items():
                table.setdefault("val_loss", {}).setdefault(r, []).append(v["loss"])
            continue
        for row in s["results"]:
            cells = {k: v["accuracy"] for k, v in row["by_k"].items()}
            cells.update(trained=row["accuracy_trained_depth"], beyond=row["accuracy_beyond_depth"])
            for k, acc in cells.items():
                table.setdefault(k, {}).setdefault(str(row["r"]), []).append(acc)
    return {k: {r: stats(v) for r, v in by_r.items()} for k, by_r in table.items()}


def markdown(table, train_max_k, n_seeds):
    rs = list(next(iter(table.values())))
    head = f"| depth (mean ± std over {n_seeds} seeds) | " + " | ".join(f"r={r}" for r in rs) + " |"
    lines = [head, "|---" * (len(rs) + 1) + "|"]
    for k in sorted((k for k in table if k.isdigit()), key=int) + ["trained", "beyond"]:
        name = {"trained": f"all depths <= {train_max_k}", "beyond": f"all depths > {train_max_k}"}.get(k, k)
        if k.isdigit() and int(k) > train_max_k:
            name += " (beyond)"
        lines.append(f"| {name} | " + " | ".join(f"{table[k][r]['mean']:.3f} ± {table[k][r]['std']:.3f}"
                                               for r in rs) + " |")
    return "\n".join(lines)


def depth_panel(ax, curves, train_max_k, title):
    """Accuracy against r, one line per task depth (dashed beyond the trained depth), with chance (1/6) marked.
    curves: {depth: (r values, accuracies, spreads or None)}."""
    from matplotlib import colormaps

    colours = colormaps["viridis"]  # one colour per depth, shallow to deep (the default cycle repeats after ten)
    items = sorted(curves.items(), key=lambda kv: int(kv[0]))
    for i, (k, (rs, acc, err)) in enumerate(items):
        ax.errorbar(rs, acc, yerr=err, marker="o", capsize=3, ls="-" if int(k) <= train_max_k else "--",
                    color=colours(0.9 * i / max(len(items) - 1, 1)), label=f"depth {k}")
    ax.set_xscale("log", base=2)
    ax.set(xticks=rs, xticklabels=rs, xlabel="test loops r", ylim=(0, 1.02), title=title)
    ax.axhline(1 / 6, color="grey", lw=0.8, ls=":")  # chance: 6 answers
    ax.legend(fontsize=7, ncol=2)


def plot(table, train_max_k, path, title):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    curves = {k: ([int(r) for r in by_r], [c["mean"] for c in by_r.values()], [c["std"] for c in by_r.values()])
              for k, by_r in table.items() if k.isdigit()}
    depth_panel(ax, curves, train_max_k, title)
    ax.set_ylabel("accuracy (mean ± std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare(eval_dirs):
    """Print the depth tables of several eval_math.py --task depth runs side by side (cells a / b / ...)
    and plot their accuracy against r, one panel per run, into the first run's folder."""
    runs = [json.loads((Path(d) / "summary.json").read_text()) for d in eval_dirs]
    tables = [{k: {str(row["r"]): row["by_k"][k]["accuracy"] for row in s["results"]} for k in s["results"][0]["by_k"]}
              for s in runs]
    rs = sorted({r for t in tables for cells in t.values() for r in cells}, key=int)
    ks = sorted({k for t in tables for k in t}, key=int)
    print("accuracy by task depth and test loops r; cells: " + " / ".join(str(d) for d in eval_dirs)
          + "  (* beyond that run's trained depth)")
    print("| depth | " + " | ".join(f"r={r}" for r in rs) + " |\n" + "|---" * (len(rs) + 1) + "|")
    for k in ks:
        cell = lambda t, s, r: (f"{t[k][r]:.2f}" + ("*" if int(k) > s["train_max_k"] else "")
                                if k in t and r in t[k] else "-")
        print(f"| {k} | " + " | ".join(" / ".join(cell(t, s, r) for t, s in zip(tables, runs)) for r in rs) + " |")
    plt = pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4), sharey=True, squeeze=False)
    for ax, t, s, d in zip(axes[0], tables, runs, eval_dirs):
        curves = {k: ([int(r) for r in by_r], list(by_r.values()), None) for k, by_r in t.items()}
        depth_panel(ax, curves, s["train_max_k"], f"{Path(d).name} (trained depths <= {s['train_max_k']})")
    axes[0][0].set_ylabel("accuracy")
    fig.tight_layout()
    path = Path(eval_dirs[0]).parent / "depth_compare.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def aggregate_dirs(eval_dirs):
    """The seeds' table (mean ± std per cell) of eval_math.py --task depth runs made outside repeat.py (by hand,
    by retrofit_depth.sh), which must share their evaluation: the same r values, rows and trained depth."""
    runs = [json.loads((Path(d) / "summary.json").read_text()) for d in eval_dirs]
    same = {json.dumps([s["config"]["r"], s["config"]["limit"], s["config"]["split"], s["train_max_k"]]) for s in runs}
    if len(same) > 1:
        sys.exit("repeat.py: error: --aggregate needs evaluations of the same r values, rows and trained depth")
    text = markdown(aggregate(runs), runs[0]["train_max_k"], len(runs))
    split = runs[0].get("split", runs[0]["config"]["split"])
    print(f"accuracy on {split} by task depth and test loops r, mean ± std over {len(runs)} runs "
          f"({' '.join(eval_dirs)}):\n{text}")
    return text


def main():
    argv = sys.argv[1:]
    if argv[:1] in (["--compare"], ["--aggregate"]):
        missing = [d for d in argv[1:] if not (Path(d) / "summary.json").is_file()]
        if not argv[1:] or missing:
            sys.exit(f"repeat.py: error: {argv[0]} needs eval_math.py output dirs (no summary.json in {missing})")
        return (compare if argv[0] == "--compare" else aggregate_dirs)(argv[1:])
    train_args = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out_dir", required=True, help="one folder per seed goes inside")
    ap.add_argument("--seeds", default="1337,2,3", help="train.py seeds, comma-separated (at least 3 for a claim)")
    ap.add_argument("--r", default="1,2,4,8,16,32", help="test loops of the evaluation")
    ap.add_argument("--eval_limit", type=int, default=0, help="first N rows of each split only (0 = all)")
    ap.add_argument("--eval_batch_size", type=int, default=100, help="rows per forward")
    ap.add_argument("--splits", default="test,dev", help="the splits each seed is evaluated on: test,dev, or test "
                    "where nothing is chosen on these runs (experiments/claims.py)")
    ap.add_argument("--no_summary", action="store_true",
                    help="train and evaluate the seeds only, leaving OUT/summary.json as it is (a scheduler running "
                         "an arm's seeds side by side writes it once, over all of them)")
    ap.add_argument("--eval", default="depth", choices=["depth", "none"],
                    help="depth: eval_math.py --task depth per seed, on test and dev; none (text data): the last "
                         "validation losses")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if any(flag in train_args for flag in ("--seed", "--out_dir")) or any(
            a.startswith(("--seed=", "--out_dir=")) for a in train_args):
        ap.error("--seed and --out_dir are set per seed by repeat.py; give --seeds and --out_dir before --")
    try:
        args.seeds = int_list(args.seeds, "--seeds", minimum=0)
    except ValueError as err:
        ap.error(str(err))
    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        ap.error(f"--out_dir {out_dir} is a file: give a directory")
    splits = args.splits.split(",")
    if not splits or any(x not in EVAL_DIRS for x in splits) or "test" not in splits:
        ap.error(f"--splits: test, or test,dev (not {args.splits!r})")
    eval_args = ["--batch_size", str(args.eval_batch_size)] + (["--limit", str(args.eval_limit)] if args.eval_limit else [])
    t0 = time.time()
    summaries = [seed_result(s, out_dir, train_args, args.r, eval_args if args.eval == "depth" else None, splits)
                 for s in args.seeds]
    if args.no_summary:
        return
    if covered(out_dir / "summary.json", argv, args.seeds):
        print(f"{out_dir / 'summary.json'} kept: it already summarizes this command over seeds {args.seeds} or more")
        return
    table, train_max_k = aggregate([s["test"] for s in summaries]), summaries[0]["test"].get("train_max_k")
    dev_table = aggregate([s["dev"] for s in summaries]) if args.eval == "depth" and "dev" in splits else None
    if args.eval == "none":
        text = "| r | val loss (mean ± std over {} seeds) |\n|---|---|\n".format(len(args.seeds)) + "\n".join(
            f"| {r} | {c['mean']:.4f} ± {c['std']:.4f} |" for r, c in table["val_loss"].items())
    else:
        text = markdown(table, train_max_k, len(args.seeds))
    git = git_commit()
    out = {"command": shlex.join(["python", "-m", "experiments.repeat", *argv]), "seeds": args.seeds, "git_commit": git or None,
           "seconds": time.time() - t0, "train_max_k": train_max_k, "split": "test" if args.eval == "depth" else None,
           "table": table, "dev_table": dev_table, "markdown": text}
    (out_dir / "summary.json").write_text(json.dumps(out, indent=2))
    if args.eval == "none":
        print(f"\nlast validation loss, mean ± std over seeds {args.seeds}:\n{text}")
        print(f"wrote {out_dir / 'summary.json'} ({out['seconds']:.0f} s)")
        return
    plot(table, train_max_k, out_dir / "depth_seeds.png", f"{out_dir.name}: {len(args.seeds)} seeds")
    print(f"\naccuracy on test by task depth and test loops r, mean ± std over seeds {args.seeds}:\n{text}")
    print(f"wrote {out_dir / 'summary.json'} and {out_dir / 'depth_seeds.png'} ({out['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
