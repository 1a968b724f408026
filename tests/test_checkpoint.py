"""checkpoint.py: a run directory is one unit. No code runs on load, a save is atomic as a whole (killed
after any of its filesystem operations, a run resumes to exactly the uninterrupted result), a full disk
leaves the previous save intact and nothing half-written, and one process at a time owns out_dir.

    python -m pytest -q tests/test_checkpoint.py
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from plumbing import checkpoint
from bench import kill_save
from model import RecurrentConfig, RecurrentGPT
from test_train import ENV, REPO, TINY, run_train


def one_line(p, *needles, code=1):
    err = p.stderr.strip()
    assert p.returncode == code and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert all(n in err for n in needles), err
    return err


@pytest.fixture(scope="module")
def run_dir(depth_dir, tmp_path_factory):
    """A finished 2-step run with its save of step 2; tests work on copies (links kept as links)."""
    out = tmp_path_factory.mktemp("run") / "out"
    run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=2", "--eval_interval=2"])
    return out


def copy_run(run_dir, dest):
    shutil.copytree(run_dir, dest, symlinks=True)
    return dest


class Payload:
    """Unpickled with weights_only=False, this calls os.system: what a crafted train_state.pt does."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_crafted_train_state_runs_nothing(depth_dir, run_dir, tmp_path):
    out = copy_run(run_dir, tmp_path / "downloaded")
    marker = tmp_path / "pwned"
    state = os.path.realpath(out / "train_state.pt")  # the file resume reads, in any layout
    torch.save({"step": 2, "optimizers": [], "rng": torch.get_rng_state(), "x": Payload(marker)}, state)
    manifest = os.path.join(os.path.dirname(state), "manifest.json")
    if os.path.exists(manifest):  # an attacker ships a matching manifest
        m = json.load(open(manifest))
        m["sha256"]["train_state.pt"] = checkpoint.sha256(state)
        json.dump(m, open(manifest, "w"))
    p = run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=4", "--eval_interval=2",
                   "--resume"], check=False)
    one_line(p, "refusing to load", "train_state.pt")
    assert not marker.exists()
    with pytest.raises(checkpoint.RunDirError):
        checkpoint.load_state(os.path.dirname(state))
    assert not marker.exists()


def test_layout_readers_see_one_save(run_dir):
    # the names every script reads are links through `latest` into one verified save
    path, step = checkpoint.find(run_dir)
    assert step == 2 and checkpoint.verify(path) is None
    for name in checkpoint.FILES:
        assert os.path.realpath(run_dir / name) == os.path.realpath(os.path.join(path, name))
    assert json.load(open(run_dir / "config.json"))["train"]["step"] == 2
    RecurrentGPT.from_pretrained(run_dir)
    state = torch.load(run_dir / "train_state.pt", weights_only=True)  # the real state is plain data
    assert state["step"] == 2 and isinstance(state["rng"], torch.ByteTensor) and state["optimizers"]


def run_bench(*flags):
    return subprocess.run([sys.executable, str(REPO / "bench" / "kill_save.py"), *flags], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=1800)


def test_kill_around_the_commit_resumes_exactly(depth_dir, tmp_path):
    # ops 13 and 14 of the second save: the new link made (not yet committed), and the rename that commits
    p = run_bench("--save", "2", "--ops", "13", "14", "--data", str(depth_dir), "--work", str(tmp_path))
    assert p.returncode == 0 and "2/2 kills resumed to the uninterrupted result" in p.stdout, p.stdout + p.stderr


@pytest.mark.slow
def test_kill_after_every_save_operation_resumes_exactly(depth_dir, tmp_path):
    # every filesystem operation of the first save (which also makes the links) and of a later one
    p = run_bench("--save", "1", "2", "--data", str(depth_dir), "--work", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FAIL" not in p.stdout and " kills resumed to the uninterrupted result" in p.stdout, p.stdout


# -----------------------------------------------------------------------------
# a full disk


def tiny_model():
    torch.manual_seed(0)
    return RecurrentGPT(RecurrentConfig(vocab_size=14, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, n_core=1))


def test_disk_full_at_every_save_operation(tmp_path):
    model = tiny_model()
    state = {"step": 2, "optimizers": [{"state": {0: {"momentum_buffer": torch.ones(64, 32)}}}]}
    base = tmp_path / "base"
    base.mkdir()
    checkpoint.save(base, 2, model, state, {"step": 2})
    prev_dir, _ = checkpoint.current(base)
    weights = open(base / "model.safetensors", "rb").read()
    count = kill_save.Ops("count")
    uninstall = kill_save.install(count)
    try:
        checkpoint.save(copy_run(base, tmp_path / "counted"), 4, model, {**state, "step": 4}, {"step": 4})
    finally:
        uninstall()
    assert count.n >= 15
    for op in range(1, count.n + 1):
        out = copy_run(base, tmp_path / f"full{op}")
        uninstall = kill_save.install(kill_save.Ops("fail", 1, op))
        try:
            checkpoint.save(out, 4, model, {**state, "step": 4}, {"step": 4})
            failed = None
        except checkpoint.RunDirError as err:
            failed = str(err)
        finally:
            uninstall()
        path, step = checkpoint.current(out)
        if failed is None:  # the operation came after the commit (the cleanup): step 4 is saved
            assert step == 4 and checkpoint.verify(path) is None, op
            continue
        assert len(failed.splitlines()) == 1 and failed.startswith("disk full: no space left on the disk mounted at")
        assert str(out) in failed and "the checkpoint of step 2" in failed and "intact" in failed, failed
        # the previous save intact, nothing of the failed one left
        assert step == 2 and os.path.basename(path) == os.path.basename(prev_dir) and checkpoint.verify(path) is None
        assert open(out / "model.safetensors", "rb").read() == weights
        assert os.listdir(out / "ckpt") == [os.path.basename(prev_dir)], (op, os.listdir(out / "ckpt"))
        assert not [n for n in os.listdir(out) if n.endswith(".tmp-link")], op


def test_disk_full_during_training_is_one_line(depth_dir, tmp_path):
    # the second save's train_state.pt (op 7, an open: its first write fails), through train.py's main
    out = tmp_path / "full"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "kill_save.py"), "--child", "fail", "2", "7", "-", "--",
                        *TINY, "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=6", "--eval_interval=2"],
                       cwd=REPO, env=ENV, capture_output=True, text=True)
    err = one_line(p, "disk full", "mounted at", "train_state.pt", "the checkpoint of step 2")
    assert err.startswith("error: ")
    path, step = checkpoint.current(out)
    assert step == 2 and checkpoint.verify(path) is None and len(os.listdir(out / "ckpt")) == 1


# -----------------------------------------------------------------------------
# one process per run directory


def test_second_process_on_one_out_dir_refuses(depth_dir, tmp_path):
    out = tmp_path / "shared"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from plumbing import checkpoint; "
                               "f = checkpoint.lock(sys.argv[1]); print('locked', flush=True); time.sleep(600)", str(out)],
                              cwd=REPO, env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        p = run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=1"], check=False)
        one_line(p, f"{out} is in use by another training run (pid {holder.pid}")
    finally:
        holder.send_signal(signal.SIGKILL)  # a killed owner: the kernel drops its lock, nothing stays stuck
        holder.wait()
    checkpoint.lock(out).close()
