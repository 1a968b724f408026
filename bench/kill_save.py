"""
Kill a training run after every single filesystem operation of a checkpoint save, resume it, and check
that the result equals an uninterrupted run exactly: the weights bit for bit and every logged loss.

checkpoint.save (checkpoint.py) writes a complete new ckpt/ directory and commits it by renaming one
symlink. This script runs a tiny scratch training (6 steps, a save every 2) once, counting the operations
that change the disk during each save (mkdir, open for writing, fsync, symlink, rename, unlink, rmdir:
the os.* calls and open() of the checkpoint module). Then, for every operation N of the chosen saves, it
runs the same training in a child process (a fork) that os._exit(9)s right after operation N, resumes it
(train.py --resume, or a fresh start when no save was committed yet), and compares the result with the
uninterrupted run. Writes between a file's open and its fsync are not counted apart: a kill among them
leaves a partial file in an uncommitted directory, as a kill right after the open does.

The same hook can fail an operation with ENOSPC instead (a full disk), for tests/test_train.py.

    python bench/kill_save.py                # the second save (~23 operations)
    python bench/kill_save.py --save 1 2 3   # every save; the first also makes the top-level links
"""

import argparse
import errno
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TINY = ["--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2", "--batch_size=8", "--eval_iters=1",
        "--eval_r=1,2", "--mean_recurrence=3", "--backprop_depth=2", "--learning_rate=0.02", "--adam_lr=3e-3",
        "--warmup_iters=3", "--decay_frac=0", "--max_iters=6", "--eval_interval=2"]
CHANGES = ("mkdir", "makedirs", "fsync", "symlink", "replace", "rename", "unlink", "remove", "rmdir")


# -----------------------------------------------------------------------------
# the hook: stands in for the checkpoint module's `os` and `open` while checkpoint.save runs


class Ops:
    """Counts the disk-changing operations of each save; mode "kill" exits right after operation `op`
    of save number `save`, mode "fail" makes that operation fail with ENOSPC (an open: its first write)."""

    def __init__(self, mode="count", save=0, op=0, record=None):
        self.mode, self.save, self.op, self.record = mode, save, op, record
        self.saves, self.n, self.active = 0, 0, False

    def hit(self, name, path, do):
        if not self.active:
            return do()
        self.n += 1
        if self.record:
            with open(self.record, "a") as f:
                f.write(json.dumps({"save": self.saves, "op": self.n, "name": name, "path": str(path)}) + "\n")
        target = (self.saves, self.n) == (self.save, self.op)
        if target and self.mode == "fail" and name != "open":  # an fsync'ed descriptor is not a file name
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([path] if isinstance(path, str) else []))
        result = do()
        if target and self.mode == "fail":
            return FullDisk(result)
        if target and self.mode == "kill":
            os._exit(9)
        return result


class FullDisk:
    """A file on a disk that is full: created, but every write fails, as a real write() would (no name)."""

    def __init__(self, f):
        self.f = f

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


class OsProxy:
    def __init__(self, ops):
        self._ops = ops

    def __getattr__(self, name):
        real = getattr(os, name)
        if name not in CHANGES:
            return real
        where = lambda a: a[1] if name in ("symlink", "replace", "rename") else a[0]  # the name made or replaced
        return lambda *a, **kw: self._ops.hit(name, where(a), lambda: real(*a, **kw))


def install(ops):
    """Route checkpoint.py's os.* and open() through ops during every checkpoint.save."""
    from plumbing import checkpoint

    real_save = checkpoint.save

    def save(*a, **kw):
        ops.saves, ops.n, ops.active = ops.saves + 1, 0, True
        try:
            return real_save(*a, **kw)
        finally:
            ops.active = False

    def open_(file, mode="r", *a, **kw):
        if not any(c in mode for c in "wax+"):
            return open(file, mode, *a, **kw)
        return ops.hit("open", file, lambda: open(file, mode, *a, **kw))

    def uninstall():
        checkpoint.save, checkpoint.os = real_save, os
        del checkpoint.open

    checkpoint.save, checkpoint.os, checkpoint.open = save, OsProxy(ops), open_
    return uninstall


def child(argv):
    """python bench/kill_save.py --child MODE SAVE OP RECORD -- train.py flags: one run with the hook."""
    mode, save, op, record = argv[:4]
    install(Ops(mode, int(save), int(op), record if record != "-" else None))
    import train

    train.main(argv[5:])


# -----------------------------------------------------------------------------
# the experiment: every run is a fork of this process (torch imported once), its output in a file


def run(args, out_log, ops=None):
    """train.main(args) in a forked child, with the hook when ops is given; returns the exit code."""
    pid = os.fork()
    if pid == 0:
        fd = os.open(out_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1), os.dup2(fd, 2)
        code = 1
        try:
            if ops:
                install(ops)
            import train

            train.main(args)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def records(out_dir):
    """The loss and val records of the run's log (wall-clock fields dropped), from its last fresh start."""
    lines = [json.loads(line) for line in open(Path(out_dir) / "log.jsonl")]
    start = max(i for i, d in enumerate(lines) if "config" in d and d["step"] == 0)
    keep = ("step", "loss", "r", "mean_r", "tokens", "flops", "lr_mult", "grad_norm", "val")
    return [{k: d[k] for k in keep if k in d} for d in lines[start:] if "loss" in d or "val" in d]


def weights(out_dir):
    from model import RecurrentGPT

    return RecurrentGPT.from_pretrained(str(out_dir)).state_dict()


def count_ops(data_dir, work, args=TINY):
    """The uninterrupted run in work/ref, and the operations of each of its saves."""
    record = Path(work) / "ops.jsonl"
    code = run([*args, "--data", str(data_dir), "--out_dir", str(Path(work) / "ref")], Path(work) / "ref.out",
               Ops("count", record=record))
    if code != 0:
        raise RuntimeError(f"the uninterrupted run failed (exit {code}): see {work}/ref.out")
    ops = {}
    for line in open(record):
        d = json.loads(line)
        ops.setdefault(d["save"], []).append(d)
    return ops


def kill_and_resume(data_dir, work, save, op, args=TINY):
    """Kill a run right after operation `op` of save `save`, finish it, compare with work/ref. Returns
    None when all is equal, else what differs."""
    from plumbing import checkpoint
    import torch

    out = Path(work) / f"save{save}_op{op}"
    flags, out_log = [*args, "--data", str(data_dir), "--out_dir", str(out)], f"{out}.out"
    code = run(flags, out_log, Ops("kill", save, op))
    if code != 9:
        return f"the run was not killed (exit {code}, see {out_log})"
    committed = checkpoint.current(out)[1] is not None  # else no save was committed yet: start afresh
    code = run([*flags, "--resume"] if committed else flags, out_log)
    if code != 0:
        return f"{'--resume' if committed else 'the fresh run'} failed (exit {code}, see {out_log})"
    ref = Path(work) / "ref"
    a, b = weights(ref), weights(out)
    if set(a) != set(b) or not all(torch.equal(a[k], b[k]) for k in a):
        return "the final weights differ"
    if records(ref) != records(out):
        return "the logged losses differ"
    left = sorted(os.listdir(out / "ckpt")) + [n for n in os.listdir(out) if n.endswith(".tmp-link")]
    if len(left) != 1 or checkpoint.verify(checkpoint.current(out)[0]) is not None:
        return f"left behind: {left}"
    return None


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", type=int, nargs="+", default=[2], help="which saves of the run to kill (1, 2, 3)")
    ap.add_argument("--ops", type=int, nargs="+", default=None, help="only these operations (default: all)")
    ap.add_argument("--data", default="", help="a prepared depth task dir (default: a tiny one made here)")
    ap.add_argument("--work", default="", help="where the runs go (default: a temporary directory)")
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch loads: every run is a fork of this process, one thread each
    import matplotlib.pyplot  # noqa: F401 (loaded once here, not in every run: summarize plots)
    import train  # noqa: F401

    work = Path(a.work or tempfile.mkdtemp(prefix="kill_save."))
    data = a.data or str(work / "data")
    if not a.data:
        subprocess.run([sys.executable, str(REPO / "data/depth/prepare.py"), "--out_dir", data, "--train_k", "4",
                        "--test_k", "6", "--num_train", "512", "--num_val", "64"], check=True, capture_output=True)
    t0 = time.time()
    ops = count_ops(data, work)
    failed = 0
    for save in a.save:
        for d in [d for d in ops[save] if a.ops is None or d["op"] in a.ops]:
            problem = kill_and_resume(data, work, save, d["op"])
            failed += problem is not None
            where = os.path.relpath(d["path"], work) if d["path"].startswith("/") else f"fd {d['path']}"
            result = "ok" if problem is None else "FAIL: " + problem
            print(f"save {save} op {d['op']:2d} {d['name']:8s} {where:48s} {result}", flush=True)
    total = sum(len([d for d in ops[s] if a.ops is None or d["op"] in a.ops]) for s in a.save)
    print(f"{total - failed}/{total} kills resumed to the uninterrupted result ({time.time() - t0:.0f} s, "
          f"runs in {work})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
