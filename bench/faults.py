"""
What train.py and sample.py do when the cluster, the disk or the user gets in the way: each case runs a tiny scratch
training on the depth task (data made here), breaks it one way, and prints the exit code, the last line the
process wrote to stderr and what the run directory kept. RESULTS.md ("What survives a preemption, a dead rank or a
bad file?") lists this script's output. Cases: signals (SIGTERM, SIGUSR1 and Ctrl-C mid-run, SIGKILL), torchrun
(SIGTERM to one rank, a rank SIGKILLed under --max-restarts 1), resumes (--resume with nothing to resume, --resume
auto on another run's directory), a second process on one out_dir, a full disk during a save, damaged inputs (a
truncated safetensors, a NaN weight, a config that does not match the weights, a corrupt GGUF, a truncated
train.bin, data of another vocabulary), bad flags and out_dirs, sample.py without a checkpoint.

    python bench/faults.py                        # every case, on 2 cores in a few minutes
    python bench/faults.py --cases sigterm,nan_weights
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from plumbing import checkpoint  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
TINY = ["--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2", "--batch_size=4", "--eval_iters=1",
        "--eval_r=1,2", "--mean_recurrence=3", "--grad_loops=2", "--warmup_iters=3", "--decay_frac=0",
        "--device=cpu", "--eval_interval=10"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def train(*args, launcher=(sys.executable,)):
    return [*launcher, str(REPO / "train.py"), *TINY, *args]


def finish(p, err):
    """(exit code, the last line train.py itself printed to stderr: its error or preemption line, not torchrun's)."""
    lines = [l for l in err.strip().splitlines() if l.strip()]
    ours = [l for l in lines if l.startswith(("error:", "preempted", "usage:", "train.py: error"))]
    return p.returncode, (ours or lines or [""])[-1]


def run(cmd, cwd=REPO):
    p = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=900)
    return finish(p, p.stderr)


def logged_step(out):
    try:
        return max([d["step"] for d in map(json.loads, open(out / "log.jsonl")) if "loss" in d], default=0)
    except (OSError, ValueError):
        return 0


def interrupt(cmd, out, sig, at=15, rank=None):
    """Run cmd, send sig when its log reaches step at (to torchrun's worker of that rank, else the process)."""
    p = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while logged_step(out) < at and p.poll() is None:
        time.sleep(0.01)
    if p.poll() is None:
        target = p.pid
        if rank is not None:  # the agent's child whose environment says RANK=rank
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                    env = open(f"/proc/{pid}/environ").read().split("\0")
                except OSError:
                    continue
                if int(stat[1]) == p.pid and f"RANK={rank}" in env:
                    target = int(pid)
        os.kill(target, sig)
    return finish(p, p.communicate()[1])


def kept(out):
    """What the run directory holds: its committed save's step, and whether that save verifies."""
    path, step = checkpoint.current(out)
    if path is None:
        return "no checkpoint"
    return f"the save of step {step}" + ("" if checkpoint.verify(path) is None else " (does not verify!)")


def then(cmd):
    code, _ = run(cmd)
    return f"; then the same command with --resume auto: exit {code}"


# -----------------------------------------------------------------------------
# the cases: each (work dir, data dir, finished run dir) -> (what was done, exit code, last line, what was kept)

def preempt_case(sig):
    def case(tmp, data, done):
        out = tmp / "run"
        cmd = train("--data", str(data), "--out_dir", str(out), "--max_iters=2000", "--resume", "auto")
        code, line = interrupt(cmd, out, sig)
        return f"{sig.name} at step 15 of 2000", code, line, kept(out) + then(cmd[:-2] + ["--max_iters=40", "--resume", "auto"])
    return case


def ctrl_c(tmp, data, done):
    out = tmp / "run"
    code, line = interrupt(train("--data", str(data), "--out_dir", str(out), "--max_iters=2000"), out, signal.SIGINT)
    return "Ctrl-C (SIGINT) at step 15", code, line, kept(out)


def sigkill(tmp, data, done):
    out = tmp / "run"
    cmd = train("--data", str(data), "--out_dir", str(out), "--max_iters=2000", "--resume", "auto")
    code, line = interrupt(cmd, out, signal.SIGKILL)
    return "SIGKILL at step 15", code, line or "(nothing: killed)", kept(out) + then(cmd[:-3] + ["--max_iters=40", "--resume", "auto"])


def torchrun_sigterm(tmp, data, done):
    out = tmp / "run"
    cmd = train("--data", str(data), "--out_dir", str(out), "--max_iters=2000", "--resume", "auto", launcher=TORCHRUN)
    code, line = interrupt(cmd, out, signal.SIGTERM, rank=1)
    return "torchrun, 2 ranks: SIGTERM to rank 1 only at step 15", code, line, kept(out)


def torchrun_kill(tmp, data, done):
    out = tmp / "run"
    cmd = train("--data", str(data), "--out_dir", str(out), "--max_iters=60", "--resume", "auto",
                "--preempt_timeout=20", launcher=[*TORCHRUN, "--max-restarts=1"])
    code, line = interrupt(cmd, out, signal.SIGKILL, at=25, rank=1)
    return "torchrun --max-restarts 1, 2 ranks: rank 1 SIGKILLed at step 25 of 60", code, line, \
        kept(out) + f", log through step {logged_step(out)}"


def resume_nothing(tmp, data, done):
    out = tmp / "empty"
    code, line = run(train("--data", str(data), "--out_dir", str(out), "--max_iters=4", "--resume"))
    return "--resume on an empty out_dir", code, line, kept(out)


def resume_other(tmp, data, done):
    code, line = run(train("--data", str(data), "--out_dir", str(done), "--max_iters=30", "--n_embd=64", "--resume",
                           "auto"))
    return "--resume auto on another run's out_dir (--n_embd 64 here, 32 there)", code, line, kept(done)


def second_process(tmp, data, done):
    out = tmp / "run"
    first = subprocess.Popen(train("--data", str(data), "--out_dir", str(out), "--max_iters=2000"), cwd=REPO, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while logged_step(out) < 2:
        time.sleep(0.05)
    code, line = run(train("--data", str(data), "--out_dir", str(out), "--max_iters=4"))
    first.kill()
    first.wait()
    return "a second train.py on a running run's out_dir", code, line, "the first run's directory, untouched"


def full_disk(tmp, data, done):
    out = tmp / "full"
    code, line = run([sys.executable, str(REPO / "bench" / "kill_save.py"), "--child", "fail", "2", "7", "-", "--",
                      *TINY, "--data", str(data), "--out_dir", str(out), "--max_iters=30"])
    return "the disk full during the second save (train_state.pt's first write)", code, line, kept(out)


def damaged(how):
    def case(tmp, data, done):
        bad = tmp / "bad"
        shutil.copytree(done, bad, symlinks=False)
        what = how(bad)
        code, line = run(train("--init", str(bad), "--data", str(data), "--out_dir", str(tmp / "o"), "--max_iters=2"))
        return f"train.py --init a checkpoint {what}", code, line, "nothing written: " + kept(tmp / "o")
    return case


def truncate(bad):
    f = bad / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return "whose model.safetensors is cut in half"


def poison(bad):
    import torch
    from safetensors.torch import load_file, save_file

    w = load_file(bad / "model.safetensors")
    w[sorted(w)[3]][0, 0] = float("nan")
    save_file(w, bad / "model.safetensors", metadata={"format": "pt"})
    return f"with one NaN in {sorted(w)[3]}"


def mismatch(bad):
    cfg = json.loads((bad / "config.json").read_text())
    cfg["n_embd"] = 48
    (bad / "config.json").write_text(json.dumps(cfg))
    return "whose config.json says n_embd 48 (the weights: 32)"


def corrupt_gguf(tmp, data, done):
    gguf = tmp / "parent.gguf"
    gguf.write_bytes(b"GGUF" + os.urandom(4096))
    code, line = run(train("--init", str(gguf), "--shape", "1,1,1", "--data", str(data), "--out_dir", str(tmp / "o")))
    return "train.py --init a .gguf of random bytes after its magic", code, line, kept(tmp / "o")


def truncated_data(tmp, data, done):
    cut = tmp / "cut"
    shutil.copytree(data, cut)
    f = cut / "train.bin"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2 + 1])
    code, line = run(train("--data", str(cut), "--out_dir", str(tmp / "o"), "--max_iters=2"))
    return "train.bin cut to half (and one byte)", code, line, kept(tmp / "o")


def other_vocabulary(tmp, data, done):
    other = tmp / "other"
    shutil.copytree(data, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["fingerprint"] = "0123456789abcdef"
    (other / "meta.json").write_text(json.dumps(meta))
    code, line = run(train("--init", str(done), "--data", str(other), "--out_dir", str(tmp / "o"), "--max_iters=2"))
    return "--init a run, --data of another tokenizer (its fingerprint)", code, line, kept(tmp / "o")


def bad_flag(tmp, data, done):
    code, line = run(train("--data", str(data), "--out_dir", str(tmp / "o"), "--shape", "1,1"))
    return "--shape 1,1", code, line, kept(tmp / "o")


def out_dir_file(tmp, data, done):
    (tmp / "afile").write_text("x")
    code, line = run(train("--data", str(data), "--out_dir", str(tmp / "afile")))
    return "--out_dir naming a file", code, line, "the file, untouched"


def sample_nothing(tmp, data, done):
    code, line = run([sys.executable, str(REPO / "sample.py"), "--r", "32"], cwd=tmp)
    return "sample.py --r 32 where there is no out/", code, line, "-"


CASES = {"sigterm": preempt_case(signal.SIGTERM), "sigusr1": preempt_case(signal.SIGUSR1), "ctrl_c": ctrl_c,
         "sigkill": sigkill, "torchrun_sigterm": torchrun_sigterm, "torchrun_kill": torchrun_kill,
         "resume_nothing": resume_nothing, "resume_other": resume_other, "second_process": second_process,
         "full_disk": full_disk, "truncated_safetensors": damaged(truncate), "nan_weights": damaged(poison),
         "config_mismatch": damaged(mismatch), "corrupt_gguf": corrupt_gguf, "truncated_data": truncated_data,
         "other_vocabulary": other_vocabulary, "bad_flag": bad_flag, "out_dir_file": out_dir_file,
         "sample_nothing": sample_nothing}


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    args = parser.parse_args()
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"error: unknown case {unknown[0]!r}: pass --cases from {', '.join(CASES)}")
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        data, done = root / "data", root / "done"
        subprocess.run([sys.executable, str(REPO / "data/depth/prepare.py"), "--out_dir", str(data), "--train_depth",
                        "4", "--test_depth", "6", "--num_train", "512", "--num_dev", "64"], check=True, env=ENV,
                       capture_output=True)
        subprocess.run(train("--data", str(data), "--out_dir", str(done), "--max_iters=20"), check=True, env=ENV,
                       cwd=REPO, capture_output=True)
        for name in names:
            tmp = root / name
            tmp.mkdir()
            t0 = time.time()
            what, code, line, kept_ = CASES[name](tmp, data, done)
            line = line.replace(str(tmp), "DIR").replace(str(done), "RUN").replace(str(data), "DATA")
            print(f"- **{what}** ({name}, {time.time() - t0:.0f} s): exit {code}; printed `{line}`; kept: "
                  f"{kept_.replace(str(tmp), 'DIR').replace(str(done), 'RUN')}", flush=True)


if __name__ == "__main__":
    main()
