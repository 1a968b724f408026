"""
The arms of experiments/claims.py: the train.py flags of each arm, the data and checkpoints they start from,
and running them under experiments/repeat.py, a few arms (or seeds) at a time.

    python -m experiments.claims --list        # the claims and the arms each one reads

Every tiny arm is config/cpu_depth.json's recipe (Muon 1e-2 + AdamW 2e-3, mean r 5, 4 grad loops, 64 rows a
step) for STEPS steps, with what the arm changes; the text arms cut SmolLM2-135M (the offline GGUF) to (2,2,2).
The runs land in OUT/arms/<arm>/seed_S (repeat.py folders: a finished seed is reused, a killed one resumes,
another command's is refused).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]

# Training steps per arm family, sized so that five seeds of every arm fit about two hours on 2 idle cores
# (RESULTS.md "Do the papers' claims hold" has the times): from scratch (claims 1, 3, 4), the retrofit and the
# arms compared with it at equal steps (claims 1, 2, 5-8), the SmolLM2 text arms (claim 2).
STEPS = {"scratch": 800, "retrofit": 500, "text": 30}


def paths(out):
    d = out / "data"
    return dict(parent_data=d / "parent", depth=d / "depth", final=d / "depth_final", cot=d / "cot",
                sotu=d / "sotu", parent=out / "arms" / "parent" / "seed_1337", cut=out / "cut", cut_static=out / "cut_static",
                smollm2_cut=out / "smollm2_cut", smollm2_random=out / "smollm2_random")


def arms(p, eval_r, smoke=False):
    """name -> (train.py args, repeat.py args). eval_r: the loops every looped arm is evaluated at (all depths'
    r = d for the forced-depth reading, and the claims' r). smoke: 8 steps and 30 evaluation rows (the
    pipeline's test; its figures mean nothing)."""
    tiny = ["--config", "config/cpu_depth.json", "--data", str(p["depth"])]
    # from scratch: the dev loss at r = 6 (the mean of the trained r: claim 3's comparable loss) every 50 steps on
    # 512 rows, and the divergence guard off so that an unstable optimizer shows its spikes instead of stopping
    scratch = [*tiny, "--max_iters", str(STEPS["scratch"]), "--eval_interval", "50", "--eval_r", "6",
               "--eval_iters", "8", "--diverge_factor", "0", "--max_bad_steps", "1000", "--collapse_factor", "0"]
    short = ["--max_iters", str(STEPS["retrofit"])]  # the retrofit and every arm compared with it
    retro = [*tiny, *short, "--init", str(p["cut"])]
    # evaluated on test alone: nothing is chosen on these runs (their recipe was chosen before, on dev)
    static, looped = ["--r", "1", "--splits", "test"], ["--r", eval_r, "--splits", "test"]  # static: no loop, one r
    # the text arms all start from a directory of the same (2,2,2) shape, config and RoPE base: the cut, the cut
    # with every weight re-drawn, and with every weight but the embeddings re-drawn (claims.reinit)
    text = ["--data", str(p["sotu"]), "--max_iters", str(STEPS["text"]), "--warmup_iters", "3",
            "--batch_size", "4", "--block_size", "128", "--learning_rate", "1e-3", "--adam_lr", "3e-4",
            "--mean_recurrence", "4", "--grad_loops", "4", "--eval_interval", str(STEPS["text"]), "--eval_iters", "8",
            "--eval_r", "4", "--log_interval", "5"]
    chain = ["--config", "config/cpu_depth.json", "--data", str(p["cot"]), *short, "--init", str(p["parent"])]
    a = {
        "parent": (["--config", "config/cpu_depth.json", "--data", str(p["parent_data"]), "--static", "--shape",
                    "2,4,2", "--max_iters", "400", "--eval_interval", "400", "--eval_r", "1"], ["--seeds", "1337", *static]),
        "retrofit": (retro, looped),
        "retrofit_ss": ([*retro, "--step_supervision"], looped),
        "adapter_ss": ([*retro, "--step_supervision", "--freeze", "base"], looped),
        # one label a row, at its final answer (prepare.py --final_only), same steps and rows
        "retrofit_final_only": ([*retro, "--data", str(p["final"])], looped),
        "random": ([*tiny, *short, "--shape", "2,2,2"], looped),  # the cut's shape, random init
        "static": ([*tiny, *short, "--init", str(p["parent"])], static),  # the uncut parent fine-tuned, no loop
        "cot": (chain, static),  # the chain written by the parent's 8 layers
        "cot_small": ([*chain, "--init", str(p["cut_static"])], static),  # by 6 of them (2,2,2): the loop model's size
        "scratch": (scratch, looped),  # Muon at the tuned 1e-2: claims 1 and 3 (constant rbar)
        "curriculum_linear": ([*scratch, "--curriculum", "linear", "--curriculum_frac", "0.25"], looped),
        "curriculum_1sqrt": ([*scratch, "--curriculum", "1-sqrt", "--curriculum_frac", "0.75"], looped),
        "muon_paper": ([*scratch, "--learning_rate", "1e-3", "--adam_lr", "5e-5"], looped),
        "adamw_paper": ([*scratch, "--optimizer", "adamw", "--adam_lr", "5e-5"], looped),
            # the positive control of claim 4: AdamW made to spike on this model (no clipping, no warmup, a high lr:
        # one spike in 400 steps of a trial on seed 1337; 3e-2 collapsed to a dead model instead)
        "adamw_control": ([*scratch, "--optimizer", "adamw", "--adam_lr", "1e-2", "--grad_clip", "0",
                           "--warmup_iters", "0"], looped),
        "text_pretrained": (["--init", str(p["smollm2_cut"]), *text], ["--eval", "none"]),
        "text_random": (["--init", str(p["smollm2_random"]) + "/seed_{seed}", *text], ["--eval", "none"]),
        "text_embeddings": (["--init", str(p["smollm2_random"]) + "/embeddings_seed_{seed}", *text], ["--eval", "none"]),
    }
    if smoke:  # the last flag wins in train.py's and repeat.py's parsers
        a = {n: ([*t, "--max_iters", "8", "--eval_interval", "4", "--log_interval", "4", "--eval_iters", "1"],
                 [*r, "--eval_limit", "30"] if "none" not in r else r) for n, (t, r) in a.items()}
    return a


def sh(cmd, log=None):
    """Run one command in the repo on one thread (the figures depend on the thread count); its output to log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(log, "a") if log else open(os.devnull, "w") as f:
        if subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT).returncode:
            sys.exit(f"claims.py: error: {shlex.join(cmd[:3])} failed: see {log or 'its output'}, fix it and rerun "
                     "(finished runs are kept)")


def sh_once(cmd, done, stamp, log):
    """sh(cmd) unless `done` (its result) lies beside `stamp` holding this same command, which is then reused; the
    stamp is written first, so that a half-finished result is known as this command's."""
    if done.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == cmd[1:]:
        return
    for d in (done.parent, stamp.parent):
        d.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(cmd[1:]))
    sh(cmd, log)


def prepare(p, needed, log, train_k, test_k, smoke=False):
    """The data sets, each made once (a half-made one, without its meta.json, is made again). The depth, final-only
    and chain sets are the same problems with the same dev and test rows."""
    py = sys.executable
    depth = ["data/depth/prepare.py", "--train_depth", str(train_k), "--test_depth", str(test_k),
             *(["--num_train", "2000", "--num_dev", "100"] if smoke else [])]
    steps = [("parent_data", [py, "data/depth/prepare.py", "--train_depth", "4", "--test_depth", "6", "--num_train",
                              "1000", "--num_dev", "200", "--out_dir", str(p["parent_data"])]),
             ("depth", [py, *depth, "--out_dir", str(p["depth"])]),
             ("final", [py, *depth, "--final_only", "--out_dir", str(p["final"])]),
             ("cot", [py, *depth, "--cot", "--out_dir", str(p["cot"])]),
             ("sotu", [py, "data/sotu/prepare.py", "--tokenizer", "smollm2", "--limit", "21" if smoke else "40",
                       "--out_dir", str(p["sotu"])])]
    for name, cmd in steps:
        if name in needed and not (p[name] / "meta.json").is_file():
            sh(cmd, log)


def smollm2_depth(cut, data_sets, log, train_k, test_k, flags=()):
    """SmolLM2-135M (the offline GGUF) cut to (2,2,2) into `cut`, then the depth task in its tokens into each dir of
    data_sets (dir -> prepare.py's extra flags, e.g. the English rendering): the same problems in each, row for row.
    Each made once (a half-made one, without its model.safetensors or meta.json, is made again)."""
    py = sys.executable
    if not (cut / "model.safetensors").is_file():
        sh([py, "surgery.py", "--init", "smollm2", "--shape", "2,2,2", "--out", str(cut), "--overwrite"], log)
    for out_dir, extra in data_sets.items():
        if not (out_dir / "meta.json").is_file():
            sh([py, "data/depth/prepare.py", "--tokenizer", str(cut), "--train_depth", str(train_k), "--test_depth",
                str(test_k), *flags, *extra, "--out_dir", str(out_dir)], log)


def run_arms(out, names, table, jobs, log_dir, seeds, by_seed=False):
    """repeat.py for each arm, `jobs` at a time (one thread each). by_seed: each seed of each arm is a job of its own
    (log <arm>_seed<S>.log, repeat.py --no_summary), so that an arm's seeds run side by side and a few long arms do
    not leave a core idle; then one pass per arm over all its seeds (every one reused) writes the arm's summary.json."""
    def arm_seeds(name):
        rep = table[name][1]
        return rep[rep.index("--seeds") + 1] if "--seeds" in rep else seeds

    def one(job):
        name, only = job
        train_args, rep_args = table[name]
        if "--seeds" in rep_args:
            i = rep_args.index("--seeds")
            rep_args = rep_args[:i] + rep_args[i + 2:]
        log = log_dir / (f"{name}_seed{only}.log" if only else f"{name}.log")
        sh([sys.executable, "-m", "experiments.repeat", "--out_dir", str(out / "arms" / name), "--seeds",
            only or arm_seeds(name), *(["--no_summary"] if only else []), *rep_args, "--", *train_args], log)
        return name if not only else f"{name} seed {only}"

    stages = [("runs", [(n, s) for n in names for s in arm_seeds(n).split(",")])] if by_seed else []
    stages.append(("arms", [(n, None) for n in names]))
    with ThreadPoolExecutor(jobs) as pool:
        for desc, todo in stages:
            with tqdm(total=len(todo), desc=desc, unit=desc[:-1]) as bar:
                for done in pool.map(one, todo):
                    bar.set_postfix_str(done)
                    bar.update()


def run_units(order, run_one, jobs, needs):
    """run_one(arm, seeds) for every unit (arm, comma-separated seeds), `jobs` at a time, in order among the ready ones;
    a unit is ready once the arm needs[arm] is done for all its seeds (a second phase after its own first)."""
    done, running, todo = set(), {}, list(order)
    ready = lambda u: u[0] not in needs or all((needs[u[0]], s) in done for s in u[1].split(","))
    with ThreadPoolExecutor(jobs) as pool:
        while todo or running:
            for u in [u for u in todo if ready(u)][:jobs - len(running)]:
                todo.remove(u)
                running[pool.submit(run_one, *u)] = u
            if not running:
                raise RuntimeError(f"units wait on arms that never run: {todo}")
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                f.result()  # a failed run has stopped the study (sh names its log)
                arm, unit_seeds = running.pop(f)
                done.update((arm, s) for s in unit_seeds.split(","))


def study_args(doc, module, out_dir, seeds):
    """The command line the studies share (--out_dir, --seeds, --jobs, --smoke, --report), parsed and checked before
    anything runs. Returns (args, OUT with its logs/ made, the command as one string)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out_dir", default=out_dir)
    ap.add_argument("--seeds", default=seeds, help="train.py seeds, comma-separated (five for a verdict)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (2 on a 2-core machine)")
    ap.add_argument("--smoke", action="store_true", help="a few steps of 4 rows, 4 test rows: the pipeline, not the question")
    ap.add_argument("--report", action="store_true", help="run nothing: the report of the finished arms")
    args = ap.parse_args()
    if args.jobs < 1 or len(args.seeds.split(",")) < 2:
        ap.error("--jobs must be >= 1" if args.jobs < 1 else "--seeds: at least two (an interval needs them)")
    out = Path(args.out_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    return args, out, shlex.join(["python", "-m", module, *sys.argv[1:]])
