"""
Preemption: a cluster's notice that it will stop a job, turned into a saved step and an exit that says "run me
again", so that a requeued job or torchrun's next start continues exactly (train.py --resume auto).

Schedulers stop a job with a signal and a grace period before SIGKILL: SLURM and Kubernetes send SIGTERM, SLURM's
--signal=USR1@SECONDS sends SIGUSR1 that long before the end, and torchrun's agent forwards the signals it handles
(--signals-to-handle) to its workers and SIGKILLs them --shutdown-timeout seconds later (30 by default). In
train.py the two signals only take note (handlers()). At the top of every step the loop asks agreed(): one MAX
all-reduce of the signal's number, so that every rank stops at the same step even when the signal reached them at
different steps. That step is saved as any other (plumbing/checkpoint.py: a complete new directory, then one
rename, so a second signal or a SIGKILL mid-save leaves the previous save or the new one); leave() waits for
every rank and raises Preempted, and train.py exits with EXIT_CODE. A rank that died or hangs would keep the
others waiting forever: a watchdog thread, woken by the signal itself (the main thread may be stuck inside a
collective, where Python runs no handler), gives up --preempt_timeout seconds after the first signal with one
line, the directory as the last complete save left it. Ctrl-C (SIGINT) is not a preemption: it stops at once.

    python train.py --config config/cpu_depth.json --out_dir out/x & sleep 30; kill -TERM %1; wait  # exit 75
    python train.py --config config/cpu_depth.json --out_dir out/x --resume auto                   # continues
    python -m pytest -q tests/test_preempt.py
"""

import contextlib
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist

from plumbing.checkpoint import current
from plumbing.run_dir import on_disk

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# sysexits.h's EX_TEMPFAIL, "try again later": saved, to be run again. Not 1 (an error), 2 (a bad flag), 130
# (Ctrl-C) or 128 + a signal's number (killed by it)
EXIT_CODE = 75
_received = []  # the preemption signals this process got, in order


class Preempted(Exception):
    """The run stopped on a preemption signal, its step saved; the message is the line the master prints."""


def _note(signum, frame):
    """The handler: only take note; the loop stops at the top of its next step (agreed)."""
    _received.append(signum)


def _watch(fd, timeout, out_dir, done):
    """The watchdog thread: wait for a preemption signal's byte on fd (written by the interpreter's C-level
    handler, whatever the main thread is doing), then give the run timeout seconds to save and exit."""
    signalled = False
    while not signalled:
        data = os.read(fd, 64)
        if not data:  # handlers() ended: the write end is closed
            return os.close(fd)
        signalled = any(b in SIGNALS for b in data)  # other bytes are other signals' (SIGINT's)
    if done.wait(timeout):  # handlers() ended in time: the process lives on (a test that called train.main)
        return os.close(fd)
    print(f"error: preempted, and the save or another rank did not finish within --preempt_timeout {timeout:g} s "
          f"(a rank died or hangs): giving up; {on_disk(out_dir)}; run the same command with --resume auto", file=sys.stderr,
          flush=True)
    os._exit(EXIT_CODE)


@contextlib.contextmanager
def handlers(timeout, out_dir):
    """While train.py runs: SIGTERM and SIGUSR1 take note instead of killing the process, and the watchdog is
    ready. Outside the main thread (where Python sets no handlers) nothing changes. The old handlers come back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    read, write = os.pipe()
    os.set_blocking(write, False)  # the interpreter's C handler must never block on it
    old = {s: signal.signal(s, _note) for s in SIGNALS}
    old_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    done = threading.Event()
    threading.Thread(target=_watch, args=(read, timeout, out_dir, done), daemon=True).start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(old_fd)
        for s, handler in old.items():
            signal.signal(s, handler)
        os.close(write)  # the watchdog's read returns b"", and it ends


def agreed(device):
    """At the top of every step, on every rank: the name of a preemption signal that any rank has received
    ("SIGTERM"), or None. Under torchrun one MAX all-reduce of its number (0: none), so all ranks stop together."""
    sig = _received[0] if _received else 0
    if dist.is_initialized():  # one process needs no tensor (on CUDA its .item() would wait for the GPU)
        both = torch.tensor(sig, device=device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        sig = int(both.item())
    return signal.Signals(sig).name if sig else None


def leave(sig, step, out_dir):
    """After the step's save: every rank waits for the others (the master's save is done when they meet), the
    process group goes, and Preempted carries the line that says where the run is and how to continue."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    _, saved = current(out_dir)
    kept = f"its checkpoint of step {saved} is in {out_dir}" if saved is not None else \
        f"{out_dir} holds no checkpoint (no step had trained)"
    raise Preempted(f"preempted ({sig}) at step {step}: {kept}; to continue, run the same command with --resume auto "
                    f"(exit code {EXIT_CODE}: saved, run again)")


def lost_rank(err, out_dir):
    """The one line for a collective that failed because another rank died (gloo: "Connection closed by peer"),
    or None for any other RuntimeError, whose traceback is wanted. torchrun then stops the group and, with
    --max-restarts, starts it again: --resume auto continues from the last complete save."""
    text = str(err)
    if not dist.is_initialized() or not any(word in text for word in ("gloo", "NCCL", "Connection")):
        return None
    reason = text.split("This is typically")[0].split("] ", 1)[-1].strip().rstrip(".")  # gloo's own words
    return (f"error: another rank of this run died or lost its connection ({reason}): {on_disk(out_dir)}; torchrun --max-restarts "
            f"starts the group again, and --resume auto continues from there")
