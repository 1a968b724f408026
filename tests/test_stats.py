"""experiments/stats.py: the paired interval against cases whose bootstrap distribution is computed by hand (all
resamples enumerated), the t-test against its formula, the verdict rules.

    python -m pytest -q tests/test_stats.py
"""

import itertools
import math

import numpy as np
import pytest

from experiments import stats


def exact_quantiles(diffs, q=(0.025, 0.975)):
    """The two-stage bootstrap distribution of the mean, enumerated: every draw of seeds, then every draw of each
    drawn seed's rows, equally likely. Returns its q-quantiles (the lower value where a quantile falls on a jump)."""
    diffs = np.asarray(diffs, dtype=float)
    S, R = diffs.shape
    row_means = [[np.mean(c) for c in itertools.product(diffs[s], repeat=R)] for s in range(S)]  # one seed's draws
    values = []
    for seeds in itertools.product(range(S), repeat=S):
        for means in itertools.product(*(row_means[s] for s in seeds)):
            values.append(np.mean(means))
    values = np.sort(values)
    cdf = np.arange(1, len(values) + 1) / len(values)
    return [float(values[np.searchsorted(cdf, x)]) for x in q], values


def test_interval_of_hand_computed_cases():
    # two seeds, one all 0 and one all 1: the seed draw alone decides, means 0, 1/2, 1 with p 1/4, 1/2, 1/4
    assert stats.bootstrap_interval([[0, 0, 0], [1, 1, 1]]) == (0.0, 1.0)
    # every pair equal: no spread at all
    assert stats.bootstrap_interval([[0.2, 0.2], [0.2, 0.2]]) == pytest.approx((0.2, 0.2))
    # rows vary within seeds too (3 seeds x 3 rows): the Monte-Carlo interval lands on the exact quantiles,
    # which here fall inside mass points (checked below), not on a jump
    diffs = [[0, 1, 1], [1, 1, 1], [0, 0, 1]]
    (lo, hi), values = exact_quantiles(diffs)
    cdf_at = lambda v: np.mean(values <= v + 1e-12)
    assert cdf_at(lo) - np.mean(values == lo) < 0.02 < cdf_at(lo) and cdf_at(hi) - np.mean(values == hi) < 0.97 < cdf_at(hi)
    assert stats.bootstrap_interval(diffs, n_resamples=20_000) == pytest.approx((lo, hi), abs=1e-9)


def test_t_test_is_the_formula_and_pairs_by_seed():
    a = np.array([[0.6, 0.8], [0.7, 0.7], [0.9, 0.7], [0.5, 0.7], [0.8, 0.8]])
    b = a - np.array([[0.1], [0.2], [0.3], [0.4], [0.5]])  # per-seed differences 0.1 .. 0.5
    res = stats.paired(a, b, kind="superiority", margin=0.0)
    d = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    t = d.mean() / (d.std(ddof=1) / math.sqrt(5))  # = 0.3 / (0.1581 / 2.236) = 4.243
    assert res["t"] == pytest.approx(t) and res["t"] == pytest.approx(4.2426, abs=1e-4)
    assert res["per_seed_diff"] == pytest.approx(d.tolist()) and res["diff"] == pytest.approx(0.3)
    # one-sided p of t = 4.243 with 4 degrees of freedom (Student's t tail: 0.00662)
    assert res["p"] == pytest.approx(0.00662, abs=5e-5)
    assert res["low"] > 0 and res["verdict"] == "holds"
    # against a margin the t-test moves its null: mean 0.3 - 0.25 over the same spread
    assert stats.paired(a, b, margin=0.25)["t"] == pytest.approx((0.3 - 0.25) / (d.std(ddof=1) / math.sqrt(5)))


def test_verdicts():
    v = stats.verdict
    assert v(0.01, 0.2, "superiority", 0.0, 5) == "holds"
    assert v(-0.01, 0.2, "superiority", 0.0, 5) == "inconclusive"
    assert v(-0.3, -0.01, "superiority", 0.0, 5) == "does not hold"
    assert v(0.01, 0.2, "superiority", 0.05, 5) == "inconclusive"  # above 0, not surely above the margin
    assert v(-0.04, 0.02, "non-inferiority", 0.05, 5) == "holds"  # never worse by the margin
    assert v(-0.06, 0.02, "non-inferiority", 0.05, 5) == "inconclusive"  # straddles the margin
    assert v(-0.2, -0.06, "non-inferiority", 0.05, 5) == "does not hold"
    assert v(0.1, 0.2, "superiority", 0.0, 3) == "no verdict (3 seeds, 5 needed)"
    with pytest.raises(ValueError, match="kind must be"):
        v(0, 1, "better", 0.0, 5)
    assert stats.combine(["holds", "holds"]) == "holds"
    assert stats.combine(["holds", "inconclusive"]) == "inconclusive"
    assert stats.combine(["inconclusive", "does not hold"]) == "does not hold"
    assert stats.combine(["holds", "not testable here"]) == "not testable here"
    with pytest.raises(ValueError, match="same seeds and rows"):
        stats.paired(np.zeros((5, 3)), np.zeros((5, 4)))
    with pytest.raises(ValueError, match="two seeds or more"):
        stats.bootstrap_interval([[0.1, 0.2]])


def test_the_rules_file_covers_every_claim():
    """experiments/rules.json: one rule per claim of experiments/claims.py, each with its arms, a known kind and a
    margin; a verdict needs five seeds, read on the test split; every change lists its old rule and reason."""
    import json
    from pathlib import Path

    from experiments.claims import CLAIMS

    rules = json.loads((Path(__file__).resolve().parents[1] / "experiments" / "rules.json").read_text())
    assert set(rules["claims"]) == set(CLAIMS)
    assert rules["split"] == "test" and len(rules["seeds"]) >= rules["min_seeds"] == stats.MIN_SEEDS
    for name, rule in rules["claims"].items():
        assert rule["kind"] in stats.KINDS and rule["margin"] >= 0 and rule["arms"] and rule["holds"], name
        assert set(rule["arms"]) <= set(CLAIMS[name][3]), f"{name}: the rule names arms the claim does not run"
    assert all({"rule", "old", "reason"} <= set(c) for c in rules["changes"])
