"""Preemption and restarts (plumbing/preempt.py, train.py --resume auto): a run signalled at a random step saves
that step and exits 75, and resumed it ends bit-identical to a run never signalled (losses and weights), in one
process and on 2 gloo ranks (DDP and --fsdp, the signal reaching one rank only); torchrun --max-restarts 1 with a
rank SIGKILLed mid-run finishes the run with the uninterrupted run's weights; --resume auto starts fresh, resumes
or refuses as the directory says; a second signal is only noted, and a save that never ends gives up in one line.

    python -m pytest -q tests/test_preempt.py            # the torchrun cases are marked slow
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from plumbing import checkpoint, preempt

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
TINY = ["--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2", "--batch_size=4", "--eval_iters=1",
        "--eval_r=1,2", "--mean_recurrence=3", "--grad_loops=2", "--learning_rate=0.02", "--adam_lr=3e-3",
        "--warmup_iters=3", "--decay_frac=0", "--device=cpu", "--eval_interval=10", "--autocast=off"]
STEPS = 40
KEEP = ("step", "loss", "r", "mean_r", "tokens", "flops", "lr_mult", "grad_norm")  # all but wall-clock fields


def command(nproc, *args, restarts=0):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                f"--max-restarts={restarts}"]
    return [*(torchrun if nproc else [sys.executable]), str(REPO / "train.py"), *TINY, *args]


def run(cmd):
    p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def logged_steps(out_dir):
    try:
        return [d["step"] for d in map(json.loads, open(out_dir / "log.jsonl")) if "loss" in d]
    except (OSError, ValueError):  # not there yet, or a line half-written
        return []


def records(out_dir):
    return [{k: d[k] for k in KEEP} for d in map(json.loads, open(out_dir / "log.jsonl")) if "loss" in d]


def workers(agent):
    """{rank: pid} of torchrun's workers (the agent's children, RANK in their environment)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]) != agent:
                continue
            env = dict(e.split("=", 1) for e in open(f"/proc/{pid}/environ").read().split("\0") if "=" in e)
        except (OSError, IndexError, ValueError):
            continue
        if "RANK" in env:
            found[int(env["RANK"])] = int(pid)
    return found


def signal_at(cmd, out_dir, step, sig, rank=None):
    """Start cmd, send sig once the log shows step (to torchrun's worker of that rank, else to the process), and
    wait for the end. Returns (the process's exit code, its stderr)."""
    p = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not any(s >= step for s in logged_steps(out_dir)):
        assert p.poll() is None and time.time() < deadline, f"the run ended before step {step}"
        time.sleep(0.01)
    os.kill(p.pid if rank is None else workers(p.pid)[rank], sig)
    _, err = p.communicate(timeout=600)
    return p.returncode, err


def same_run(a, b):
    assert records(a) == records(b) and len(records(a)) == STEPS
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def reference(depth_dir, tmp_path_factory):
    """out_dir of a run never signalled, by launcher: 1 process, DDP and --fsdp on 2 ranks (made when first asked)."""
    made = {}

    def get(kind):
        if kind not in made:
            made[kind] = tmp_path_factory.mktemp(f"reference_{kind}")
            nproc, extra = {"one": (0, []), "ddp": (2, []), "fsdp": (2, ["--fsdp"])}[kind]
            run(command(nproc, *extra, "--data", str(depth_dir), "--out_dir", str(made[kind]), f"--max_iters={STEPS}"))
        return made[kind]
    return get


def test_a_signalled_run_saves_and_resumes_exactly(depth_dir, tmp_path, reference, sig=signal.SIGTERM):
    step = random.randint(2, STEPS // 3)
    args = ["--data", str(depth_dir), "--out_dir", str(tmp_path), f"--max_iters={STEPS}", "--resume", "auto"]
    rc, err = signal_at(command(0, *args), tmp_path, step, sig)
    saved = checkpoint.current(tmp_path)[1]
    assert rc == preempt.EXIT_CODE and "Traceback" not in err, (step, err[-2000:])
    assert err.strip().splitlines()[-1] == (
        f"preempted ({sig.name}) at step {saved}: its checkpoint of step {saved} is in {tmp_path}; to continue, run "
        f"the same command with --resume auto (exit code 75: saved, run again)"), (step, err[-2000:])
    assert step <= saved < STEPS and max(logged_steps(tmp_path)) == saved  # the step it stopped at is the one saved
    out = run(command(0, *args)).stdout
    assert f"steps {saved} -> {STEPS}" in out
    same_run(tmp_path, reference("one"))


def test_resume_auto_starts_fresh_resumes_or_refuses(depth_dir, tmp_path):
    args = [*TINY, "--data", str(depth_dir), "--resume", "auto"]
    train = lambda out, *more: subprocess.run([sys.executable, str(REPO / "train.py"), *args, "--out_dir", str(out),
                                               *more], cwd=REPO, env=ENV, capture_output=True, text=True)
    out = tmp_path / "run"
    p = train(out, "--max_iters=4")  # nothing there: a fresh start
    assert p.returncode == 0 and "steps 0 -> 4" in p.stdout, p.stderr[-2000:]
    p = train(out, "--max_iters=8")  # a complete save: resumed
    assert p.returncode == 0 and "steps 4 -> 8" in p.stdout and logged_steps(out) == list(range(1, 9))
    p = train(out, "--max_iters=9", "--n_embd=64")  # another run's save: refused as --resume refuses it
    assert p.returncode == 1 and "was trained with other settings" in p.stderr and "--n_embd 64" in p.stderr
    assert "Traceback" not in p.stderr and checkpoint.current(out)[1] == 8  # and left as it was
    # a first save killed before its commit (no `latest`, its weights missing) and the attempt's log: a fresh start
    torn = tmp_path / "torn"
    shutil.copytree(out, torn, symlinks=True)
    save, _ = checkpoint.current(torn)
    for name in ("latest", *checkpoint.FILES):
        os.unlink(torn / name)
    os.unlink(Path(save) / "model.safetensors")
    p = train(torn, "--max_iters=4")
    assert p.returncode == 0 and "steps 0 -> 4" in p.stdout and logged_steps(torn) == [1, 2, 3, 4], p.stderr[-2000:]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_second_signal_is_only_noted(tmp_path, sig):
    with preempt.handlers(60, tmp_path):
        assert preempt.agreed(torch.device("cpu")) is None
        os.kill(os.getpid(), sig)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one, during the save: noted, nothing more
        assert preempt.agreed(torch.device("cpu")) == sig.name  # the first one's name; the process lives
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the old handlers are back


def test_a_save_that_never_ends_gives_up_in_one_line(tmp_path):
    # the main thread stuck (as in a collective whose peer died): the watchdog gives up after --preempt_timeout
    code = ("import os, signal, sys, time; from plumbing import preempt\n"
            f"with preempt.handlers(1, {str(tmp_path)!r}):\n"
            "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(60)\n")
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == preempt.EXIT_CODE and time.time() - t0 < 30
    assert p.stderr.strip() == (f"error: preempted, and the save or another rank did not finish within "
                                f"--preempt_timeout 1 s (a rank died or hangs): giving up; {tmp_path} holds no "
                                f"checkpoint; run the same command with --resume auto")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_ranks_agree_on_the_step_and_resume_exactly(depth_dir, tmp_path, reference, kind):
    # SIGTERM reaches rank 1 only: both ranks stop at the step of the next all-reduce of the signal, rank 0 saves
    step = random.randint(2, STEPS // 3)
    args = [*(["--fsdp"] if kind == "fsdp" else []), "--data", str(depth_dir), "--out_dir", str(tmp_path),
            f"--max_iters={STEPS}", "--resume", "auto"]
    rc, err = signal_at(command(2, *args), tmp_path, step, signal.SIGTERM, rank=1)
    saved = checkpoint.current(tmp_path)[1]
    assert rc != 0 and err.count(f"preempted (SIGTERM) at step {saved}: its checkpoint of step {saved}") == 1, \
        (step, err[-3000:])
    assert "Traceback" not in err.split("preempted (SIGTERM)")[0] and step <= saved < STEPS
    run(command(2, *args))
    same_run(tmp_path, reference(kind))


@pytest.mark.slow
def test_torchrun_restarts_a_run_whose_rank_was_killed(depth_dir, tmp_path, reference):
    # rank 1 SIGKILLed (no save): torchrun stops rank 0, starts the group again, and --resume auto continues from
    # the last eval's save; DDP on gloo reduces in the same order after the restart, so the result is exact
    step = random.randint(12, STEPS // 2 + 5)
    args = ["--data", str(depth_dir), "--out_dir", str(tmp_path), f"--max_iters={STEPS}", "--resume", "auto",
            "--preempt_timeout=20"]
    rc, err = signal_at(command(2, *args, restarts=1), tmp_path, step, signal.SIGKILL, rank=1)
    assert rc == 0 and "(exitcode: -9) local_rank: 1" in err, (step, err[-3000:])  # killed, restarted, finished
    same_run(tmp_path, reference("ddp"))
