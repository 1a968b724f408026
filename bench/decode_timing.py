"""
How the decode benchmarks time a decoder (bench_sample.py and its section 5, bench_diffusion.py): tokens/s with
prefill cancelled, and several decoders timed in turn so that load from other jobs on shared cores hits them all.

    python bench/bench_sample.py --smoke      # runs every caller in seconds
"""

import sys
import time

import numpy as np


def log(msg=""):
    print(msg, file=sys.stderr, flush=True)


def decode_rate(run, n_new, repeats):
    """Decode tokens/s from two timings, (n_new - 1) / (t(n_new) - t(1)), so prefill cancels out;
    the best of `repeats` (other jobs share these cores)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(1)
        t1 = time.perf_counter()
        out = run(n_new)
        t2 = time.perf_counter()
        best = min(best, (t2 - t1) - (t1 - t0))
    return (n_new - 1) / best, out


def side_by_side(runs, n_new, repeats, ref, clock=1):
    """Decode tokens/s of each run, timed in turn within every repeat (so a load spike from other jobs hits all of
    them; the order rotates from repeat to repeat, so none is always first after another), as
    (n_new - 1) / (t(n_new) - t(1)) with prefill cancelled. Two clocks: wall (0), and process CPU time (1), which
    leaves out the time other jobs take the core (not their memory traffic) but, on more than one thread, counts
    the time idle OpenMP workers spin. Each repeat gives each run's rate on `clock` over that of `ref` in the same
    repeat. Returns {name: (median wall rate, median CPU rate, median, min and max of the per-repeat ratios to
    ref, tokens)}."""
    times = {k: ([], []) for k in runs}
    out, names = {}, list(runs)
    for i in range(repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            run = runs[name]
            w0, c0 = time.perf_counter(), time.process_time()
            run(1)
            w1, c1 = time.perf_counter(), time.process_time()
            out[name] = run(n_new)
            w2, c2 = time.perf_counter(), time.process_time()
            times[name][0].append((n_new - 1) / ((w2 - w1) - (w1 - w0)))
            times[name][1].append((n_new - 1) / ((c2 - c1) - (c1 - c0)))
    res = {}
    for k, (w, c) in times.items():
        ratios = [a / b for a, b in zip((w, c)[clock], times[ref][clock])]
        res[k] = (float(np.median(w)), float(np.median(c)), float(np.median(ratios)), min(ratios), max(ratios), out[k])
    return res
