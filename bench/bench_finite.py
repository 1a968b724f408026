"""
What refusing non-finite weights (plumbing/finite.py) costs at load, against the load itself: surgery.load_model
on a safetensors checkpoint of ours and on the offline SmolLM2 GGUF (a parent: read, dequantized, cut), each
timed with the check and with it replaced by a no-op, alternating, the median of --repeats. "warm": the files
are in the page cache; "cold": their pages are dropped first (posix_fadvise DONTNEED, no root needed), so that a
check that touches every byte of a memory-mapped file pays its reading where the load alone would not. The
budget is the larger of 5% of the load and half a second.

    python surgery.py --init=smollm2 --shape 2,2,2 --out out/x     # the safetensors checkpoint
    python bench/bench_finite.py --ckpt out/x
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from plumbing import finite, hub, parents, pretrained  # noqa: E402
import surgery  # noqa: E402


def drop_cache(path):
    """Evict a file's (clean) pages from the page cache, so that the next read comes from the disk."""
    files = [path] if os.path.isfile(path) else [os.path.join(path, n) for n in os.listdir(path)]
    for name in files:
        fd = os.open(os.path.realpath(name), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def load_seconds(init, check, cold, shape):
    """Seconds of one surgery.load_model(init), with the finite check or with a no-op in its place."""
    real = finite.check_finite
    noop = lambda *a, **k: None
    for module in (pretrained, parents):  # where the loaders took their reference to it
        module.check_finite = real if check else noop
    if cold:
        drop_cache(init)
    t0 = time.perf_counter()
    model, _ = surgery.load_model(init, shape=shape)
    seconds = time.perf_counter() - t0
    for module in (pretrained, parents):
        module.check_finite = real
    return seconds, model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--ckpt", default="out/x", help="a checkpoint directory of ours (surgery.py --out)")
    ap.add_argument("--repeats", type=int, default=5, help="loads per case (the median is reported)")
    ap.add_argument("--smoke", action="store_true", help="one load per case, --ckpt only: tests the bench")
    args = ap.parse_args()
    args.repeats = 1 if args.smoke else args.repeats
    if not os.path.isfile(os.path.join(args.ckpt, "model.safetensors")):
        sys.exit(f"error: {args.ckpt} holds no model.safetensors: python surgery.py --init=smollm2 --shape 2,2,2 "
                 f"--out {args.ckpt}")
    gguf = hub.packaged_smollm2_gguf()
    cases = [("safetensors", args.ckpt, None)] + ([("gguf", gguf, (2, 2, 2))] if gguf and not args.smoke else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores")
    for name, init, shape in cases:
        for cold in (False, True):
            times = {True: [], False: []}
            load_seconds(init, True, False, shape)  # once, untimed: imports, and a warm cache for "warm"
            for _ in range(args.repeats):
                for check in (False, True):
                    times[check].append(load_seconds(init, check, cold, shape)[0])
            model = load_seconds(init, True, False, shape)[1]
            t0 = time.perf_counter()
            finite.first_nonfinite(model.state_dict())  # the check alone, on resident tensors
            alone = time.perf_counter() - t0
            off, on = statistics.median(times[False]), statistics.median(times[True])
            budget = max(0.05 * off, 0.5)
            params = sum(p.numel() for p in model.parameters()) / 1e6
            print(f"{name:11s} {'cold' if cold else 'warm'}: load {off:.2f} s without the check, {on:.2f} s with it "
                  f"(+{on - off:.3f} s; the check alone on {params:.0f}M resident values {alone:.3f} s); budget "
                  f"{budget:.2f} s: {'within' if on - off <= budget else 'OVER'}")


if __name__ == "__main__":
    main()
