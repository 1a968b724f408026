"""experiments/retrofit_seeds.py: the two readings of rules.json "retrofit" on hand-made arm folders (the loop used at
depth 6, the accuracy held from r = 8 to r = 32 or not), the table with each depth's seen fraction, the schedule's
phase 2 after its own seed's phase 1, and the pipeline end to end at --smoke scale (the report, reuse on a rerun).

    python -m pytest -q tests/test_retrofit_seeds.py
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from arm_folders import ROWS, SEEDS, fake_arm
from experiments import retrofit_seeds as rs

REPO = Path(__file__).resolve().parents[1]


def accuracy(by_r):
    """correct(seed, r): 0/1 with probability by_r[r] at every depth; two r of the same probability draw the same rows."""
    return lambda s, r: np.random.default_rng([SEEDS.index(s), round(by_r[r] * 1000)]).random((ROWS, 12)) < by_r[r]


def arms(out, phase2_by_r, phase1_by_r=None):
    phase1_by_r = phase1_by_r or {1: 0.2, 8: 0.9, 32: 0.5}
    return {"phase1": fake_arm(out, "phase1", accuracy(phase1_by_r)), "phase2": fake_arm(out, "phase2", accuracy(phase2_by_r))}


def test_loops_used_and_held_to_r32(tmp_path):
    m, verdicts, text = rs.measure(arms(tmp_path, {1: 0.2, 8: 0.9, 32: 0.9}))
    assert verdicts == {"loops": "holds", "holds_to_r32": "holds"}  # the same draws at r = 8 and 32: a difference of 0
    assert m["holds_to_r32"]["kind"] == "non-inferiority" and m["holds_to_r32"]["margin"] == 0.02
    assert m["loops"]["seeds"] == 5 and m["loops"]["rows"] == ROWS
    assert m["phase2_vs_phase1_r32"]["verdict"] == "reported" and m["phase2_vs_phase1_r32"]["diff"] > 0.2
    assert any("r = 32 vs r = 8" in t for t in text)


def test_a_fall_past_r8_does_not_hold_and_no_loop_gain_does_not_hold(tmp_path):
    _, verdicts, _ = rs.measure(arms(tmp_path, {1: 0.9, 8: 0.9, 32: 0.5}))
    assert verdicts == {"loops": "does not hold", "holds_to_r32": "does not hold"}


def test_report_writes_summary_table_and_figure(tmp_path):
    arms(tmp_path, {1: 0.2, 8: 0.9, 32: 0.85})
    seen = {str(k): (1.0 if k < 6 else 0.0) for k in range(1, 13)}
    data = rs.paths(tmp_path)["data"]
    data.mkdir(parents=True)
    (data / "meta.json").write_text(json.dumps({"seen_in_train": {"test": seen}}))
    s = rs.report(SimpleNamespace(seeds=",".join(map(str, SEEDS))), tmp_path, "cmd", 0.0)
    assert s["verdicts"]["loops"] == "holds" and s["train_flops"]["phase2"] == 1e12
    md = (tmp_path / "retrofit_seeds.md").read_text()
    assert "| 6 (deepest trained) | 0.00 |" in md and "| 5 | 1.00 |" in md and "| 12 (beyond) | 0.00 |" in md
    assert (tmp_path / "retrofit_seeds.png").stat().st_size > 0


def test_phase2_of_a_seed_waits_for_its_own_phase1():
    started, done = [], set()

    def run_one(arm, seed):
        assert arm == "phase1" or ("phase1", seed) in done
        started.append((arm, seed))
        done.add((arm, seed))

    order = [(arm, s) for s in ("1", "2", "3") for arm in ("phase1", "phase2")]
    rs.run_units(order, run_one, 2, rs.NEEDS)
    assert sorted(started) == sorted(order)


def test_the_rule_is_in_rules_json_with_what_it_needs():
    rule = rs.RULE
    assert len(rule["seeds"]) >= 5 and {"question", "metric", "also_reported"} <= set(rule)
    for reading in ("loops", "holds_to_r32"):
        assert {"compare", "kind", "margin", "holds"} <= set(rule[reading])
    table = rs.arms(Path("o"), rs.paths(Path("o")), rs.sizes(False))
    assert table["phase1"][0][table["phase1"][0].index("--max_iters") + 1] == "400"
    assert table["phase2"][0][table["phase2"][0].index("--max_iters") + 1] == "50"
    assert "dev" not in table["phase2"][1][table["phase2"][1].index("--splits") + 1]  # nothing here reads dev


@pytest.mark.slow
def test_smoke_pipeline_writes_the_report_and_reuses(tmp_path):
    cmd = [sys.executable, "-m", "experiments.retrofit_seeds", "--smoke", "--seeds", "1,2", "--out_dir", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["verdicts"]["loops"].startswith("no verdict (2 seeds") and s["measured"]["loops"]["rows"] == 4
    assert set(s["phase1_table"]["6"]) == {"8", "32"} and set(s["table"]["6"]) == {"1", "2", "4", "8", "16", "32"}
    assert (tmp_path / "retrofit_seeds.png").stat().st_size > 0
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "seed 2: reusing" in (tmp_path / "logs" / "phase2.log").read_text()
