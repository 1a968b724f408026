"""experiments/adaptive_depth.py: per-row accuracy from the sweep's positions against a hand-made case, and the whole
study on two tiny untrained models standing in for the two studies' arms (sweeps, reuse, the rule's comparisons, the
check against each arm's own evaluation, table and figure).

    python -m pytest -q tests/test_adaptive_depth.py   # the whole study: marked slow, about a minute
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments import adaptive_depth as ad
from model import RecurrentConfig, RecurrentGPT

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def test_per_row_reads_a_depth_and_pools_beyond():
    # two rows of labels at depths 1..8 (train depth 6): row 0 right at 6 and at 7, row 1 right at 8 only
    k = np.tile(np.arange(1, 9), 2)
    row = np.repeat([0, 1], 8)
    correct = np.zeros(16, bool)
    correct[[5, 6, 15]] = True
    pos = {"k": k, "row": row}
    assert ad.per_row(pos, correct, 6).tolist() == [1.0, 0.0]
    assert ad.per_row(pos, correct, "beyond").tolist() == [0.5, 0.5]


def run(args):
    return subprocess.run([sys.executable, "-m", "experiments.adaptive_depth", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True)


@pytest.mark.slow
def test_the_study_on_tiny_arms(tmp_path):
    data = tmp_path / "data"
    subprocess.run([sys.executable, "data/depth/prepare.py", "--out_dir", str(data), "--train_depth", "6",
                    "--test_depth", "12", "--num_train", "256", "--num_dev", "40"], cwd=REPO, env=ENV, check=True,
                   capture_output=True)
    seeds = ["1", "2"]
    for study, arm in (("claims", "scratch"), ("cm", "retrofit")):
        (tmp_path / study / "data").mkdir(parents=True)
        target = tmp_path / study / "data" / ("depth" if study == "claims" else "")
        if study == "claims":
            target.symlink_to(data)
        else:
            for f in data.iterdir():
                (target / f.name).symlink_to(f)
        for s in seeds:
            cfg = RecurrentConfig(vocab_size=14, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, intermediate_size=64,
                                  adapter_init="random")
            RecurrentGPT(cfg).save_pretrained(tmp_path / study / "arms" / arm / f"seed_{s}")
    # the scratch arm's own test evaluation at r = 32, as make claims leaves it (the sweep must agree row by row)
    for s in seeds:
        d = tmp_path / "claims" / "arms" / "scratch" / f"seed_{s}"
        subprocess.run([sys.executable, "eval_math.py", "--init", str(d), "--task", "depth", "--data", str(data),
                        "--split", "test", "--r", "1,32", "--batch_size", "100", "--out_dir", str(d / "eval")],
                       cwd=REPO, env=ENV, check=True, capture_output=True)
    out = tmp_path / "out"
    common = ["--out_dir", str(out), "--claims", str(tmp_path / "claims"), "--compute_matched", str(tmp_path / "cm"),
              "--seeds", ",".join(seeds)]
    p = run(common)
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert set(s["verdicts"]) == {"scratch", "retrofit"}
    assert all(v.startswith("no verdict") for v in s["verdicts"].values())  # two seeds: intervals, no verdict
    scratch = s["measured"]["scratch"]
    assert scratch["fixed_r32_is_the_arms_evaluation"] is True
    assert s["measured"]["retrofit"]["fixed_r32_is_the_arms_evaluation"] is None  # no evaluation at hand
    kl = scratch["criteria"]["kl"]
    assert 1 <= kl["mean_loops"] <= 32 and len(kl["loops_by_depth"]) == 12 and len(kl["6"]) == 2
    c = scratch["comparisons"]["kl_vs_r32@6"]
    assert c["kind"] == "non-inferiority" and c["margin"] == 0.01 and c["seeds"] == 2 and c["rows"] == 40
    at = scratch["r_at_kl_loops"]
    assert at == int(np.ceil(kl["mean_loops"] - 1e-9)) and scratch["comparisons"][f"kl_vs_r{at}@beyond"]["verdict"] == "reported"
    assert (out / "adaptive_depth.png").stat().st_size > 10_000 and "kl vs fixed r = 32" in (out / "adaptive_depth.md").read_text()
    # finished sweeps are reused: the second run runs no eval_math.py
    stamps = {f: f.stat().st_mtime_ns for f in out.glob("*/seed_*/exit_positions.npz")}
    p = run(common)
    assert p.returncode == 0 and {f: f.stat().st_mtime_ns for f in stamps} == stamps


def test_missing_arms_are_one_line(tmp_path):
    p = run(["--out_dir", str(tmp_path / "o"), "--claims", str(tmp_path / "none"), "--compute_matched", str(tmp_path)])
    assert p.returncode == 2 and "no trained checkpoint in" in p.stderr and "Traceback" not in p.stderr
    assert "make claims and make compute_matched first" in p.stderr
