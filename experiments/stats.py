"""
Paired comparisons with an interval and a named test: how every verdict of experiments/claims.py is drawn.

A difference between two arms (or two r of one arm) is measured on the same seeds and the same test rows,
so it is paired twice: by seed (seed s of arm a against seed s of arm b) and by row (row i against row i).
Its 95% interval comes from a two-stage percentile bootstrap: scipy.stats.bootstrap draws the seeds with
replacement (training is what varies most between seeds), and for each drawn seed the statistic draws that
seed's rows with replacement (the rows are a sample of the task's problems too); a pair (a, b) of the same
seed and row always stays together. The p-value is a paired t-test over seeds against the claim's margin
(scipy.stats.ttest_1samp on the per-seed mean differences), one-sided in the claim's direction. Five seeds
at least give a verdict: a sign test cannot go below p = 0.0625 (two-sided) with five, a t-test can.

The verdicts (arXiv 2608.11233's standard), for a difference d = a - b oriented so that larger is better:
  superiority, margin m:     holds if the interval lies above m, does not hold if it lies below m
  non-inferiority, margin m: holds if the interval lies above -m, does not hold if it lies below -m
and inconclusive when the interval contains the boundary. "not testable here" is decided by the claim (no
positive control), never here.

    from experiments.stats import paired
    paired(a, b, kind="superiority", margin=0.0)   # a, b: (seeds, rows) arrays of one metric
    python -m pytest -q tests/test_stats.py         # the interval against hand-computed cases
"""

import numpy as np
from scipy import stats as sps

MIN_SEEDS = 5  # fewer seeds give an interval and a p-value, never a verdict
KINDS = ("superiority", "non-inferiority")


def bootstrap_interval(diffs, confidence=0.95, n_resamples=10_000, seed=0):
    """The two-stage percentile bootstrap interval of the mean of diffs (seeds, rows): scipy.stats.bootstrap
    resamples the seeds, the statistic resamples each drawn seed's rows. Needs two seeds at least."""
    diffs = np.asarray(diffs, dtype=float)
    if diffs.ndim != 2 or diffs.shape[0] < 2:
        raise ValueError(f"a paired interval needs (seeds, rows) values of two seeds or more, got shape {diffs.shape}")
    n_rows = diffs.shape[1]
    rows_rng = np.random.default_rng([seed, 1])

    def mean_over_resampled_rows(seed_idx, axis=-1):  # seed_idx (..., n_seeds): the drawn seeds of each resample
        seed_idx = np.asarray(seed_idx, dtype=np.int64)
        rows = rows_rng.integers(0, n_rows, size=seed_idx.shape + (n_rows,))  # each drawn seed's rows
        return diffs[seed_idx[..., None], rows].mean(axis=(-2, -1))

    # percentile, not BCa: BCa's jackknife calls the statistic on leave-one-out samples, which would draw rows too
    res = sps.bootstrap((np.arange(diffs.shape[0]),), mean_over_resampled_rows, confidence_level=confidence,
                        n_resamples=n_resamples, method="percentile", vectorized=True,
                        batch=max(1, 2_000_000 // diffs.size), rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def verdict(low, high, kind, margin, n_seeds):
    """holds / does not hold / inconclusive from the interval (module docstring); no verdict under MIN_SEEDS."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if n_seeds < MIN_SEEDS:
        return f"no verdict ({n_seeds} seeds, {MIN_SEEDS} needed)"
    bound = margin if kind == "superiority" else -margin
    return "holds" if low > bound else "does not hold" if high < bound else "inconclusive"


def paired(a, b, kind="superiority", margin=0.0, confidence=0.95, n_resamples=10_000, seed=0):
    """a, b: (seeds, rows) values of one metric (larger is better), the same seeds and rows in the same order.
    Returns the mean difference a - b, its interval, the t-test, the per-seed differences and the verdict."""
    a, b = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    if a.shape != b.shape:
        raise ValueError(f"paired arms need the same seeds and rows: shapes {a.shape} and {b.shape}")
    diffs = a - b
    low, high = bootstrap_interval(diffs, confidence, n_resamples, seed)
    per_seed = diffs.mean(axis=1)
    bound = margin if kind == "superiority" else -margin
    t = sps.ttest_1samp(per_seed, bound, alternative="greater")
    return {"a": float(a.mean()), "b": float(b.mean()), "diff": float(diffs.mean()), "low": low, "high": high,
            "confidence": confidence, "kind": kind, "margin": margin, "seeds": int(a.shape[0]), "rows": int(a.shape[1]),
            "per_seed_diff": per_seed.tolist(), "t": float(t.statistic), "p": float(t.pvalue),
            "test": f"paired t-test over seeds, one-sided, H0: mean difference <= {bound:g} (scipy.stats.ttest_1samp)",
            "interval": f"{confidence:.0%} two-stage percentile bootstrap over seeds and rows, paired by seed and row "
                        f"(scipy.stats.bootstrap, {n_resamples} resamples)",
            "verdict": verdict(low, high, kind, margin, a.shape[0])}


def combine(verdicts):
    """One verdict from several that must all hold: any that does not hold decides, then any inconclusive."""
    verdicts = list(verdicts)
    for v in ("not testable here", "does not hold"):
        if v in verdicts:
            return v
    if all(v == "holds" for v in verdicts):
        return "holds"
    return next((v for v in verdicts if v.startswith("no verdict")), "inconclusive")


def text(res, digits=3, unit=""):
    """'+0.123 [+0.045, +0.201], p = 0.004 (holds)': a comparison in one line."""
    f = lambda x: f"{x:+.{digits}f}{unit}"
    return f"{f(res['diff'])} [{f(res['low'])}, {f(res['high'])}], p = {res['p']:.3g} ({res['verdict']})"
