"""experiments/english.py: the verdict, the reported comparisons and the report on hand-made arm folders (paired by
seed and row whatever order the arms list their seeds in; not testable when neither arm learned; no interval from
one seed), the schedule that starts each run after the one it starts from, and the pipeline end to end at --smoke
scale (summary.json, the table, the PNG, reuse on a rerun).

    python -m pytest -q tests/test_english_study.py
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from arm_folders import ROWS, RS, SEEDS, draws, fake_arm
from experiments import english

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_verdict_holds_paired_by_seed_and_row_whatever_the_seed_order(tmp_path):
    """The fresh arm lists its seeds backwards and is worse on each seed by an amount of its own: the per-seed
    differences must be those of the same seed."""
    base = draws(0.4, seed_shift=0.1)  # seed i: accuracy 0.4 + 0.1 i, so unpaired seeds differ by whole steps
    inst = fake_arm(tmp_path, "en_installed", lambda s, r: np.ones((ROWS, 12)) if r > 1 else base(s, r))
    fresh = fake_arm(tmp_path, "en_fresh", base, seeds=SEEDS[::-1])
    measured, verdict, text = english.measure({"en_installed": inst, "en_fresh": fresh})
    want = [1 - base(s, 8)[:, :6].mean() for s in SEEDS]
    assert measured["rule"]["per_seed_diff"] == pytest.approx(want)
    assert measured["rule"]["seeds"] == 5 and measured["rule"]["rows"] == ROWS
    assert verdict == "holds" and measured["learned"] and "installed vs fresh" in text
    assert measured["trained_r1"]["diff"] == 0.0 and measured["trained_r1"]["verdict"] == "reported"


def test_behind_does_not_hold_and_neither_learning_is_not_testable(tmp_path):
    good, bad = draws(0.9), draws(0.3)
    A = {"en_installed": fake_arm(tmp_path / "a", "en_installed", bad), "en_fresh": fake_arm(tmp_path / "a", "en_fresh", good)}
    assert english.measure(A)[1] == "does not hold"
    chance = draws(0.15)  # both at chance: the rule's clause, whatever the interval says
    A = {"en_installed": fake_arm(tmp_path / "b", "en_installed", chance), "en_fresh": fake_arm(tmp_path / "b", "en_fresh", draws(0.1))}
    measured, verdict, _ = english.measure(A)
    assert not measured["learned"] and verdict == "not testable here"
    three = SEEDS[:3]  # fewer than five seeds: an interval, no verdict
    A = {n: fake_arm(tmp_path / "c", n, p, seeds=three) for n, p in (("en_installed", good), ("en_fresh", bad))}
    measured, verdict, _ = english.measure(A)
    assert verdict == "no verdict (3 seeds, 5 needed)" and measured["rule"]["low"] > 0


def test_arms_with_fewer_seeds_are_reported_on_the_seeds_they_share(tmp_path):
    inst, fresh = draws(0.9), draws(0.5)
    A = {"en_installed": fake_arm(tmp_path, "en_installed", inst), "en_fresh": fake_arm(tmp_path, "en_fresh", fresh),
         "en_adapter_installed": fake_arm(tmp_path, "en_adapter_installed", inst, seeds=SEEDS[:2]),
         "en_adapter_fresh": fake_arm(tmp_path, "en_adapter_fresh", fresh, seeds=SEEDS[:2]),
         "en_cot": fake_arm(tmp_path, "en_cot", draws(0.2), seeds=SEEDS[:1], cot=True),
         "zero_shot_answers": fake_arm(tmp_path, "zero_shot_answers", draws(1 / 6))}
    m, verdict, text = english.measure(A)
    assert verdict == "holds"
    assert m["adapter"]["seeds"] == 2 and m["adapter"]["verdict"] == "reported" and "low" in m["adapter"]
    cot_rows = A["en_installed"].rows("beyond", 32)[:1]  # the loop on the one seed the chain ran
    assert m["cot"] == {"a": pytest.approx(cot_rows.mean()), "b": pytest.approx(A["en_cot"].rows("beyond", 1).mean()),
                        "diff": pytest.approx(cot_rows.mean() - A["en_cot"].rows("beyond", 1).mean()), "seeds": 1,
                        "rows": ROWS, "verdict": "reported (one seed: no interval)"}
    assert m["cot_tokens_per_answer"] == 6.5 and "one seed, no interval" in text
    z = m["zero_shot_answers"]["trained"]  # against chance on the same rows
    assert z["b"] == pytest.approx(1 / 6) and z["low"] < 0 < z["high"]


def test_report_writes_summary_table_and_figure(tmp_path):
    A = {n: fake_arm(tmp_path, n, draws(p)) for n, p in (("en_installed", 0.8), ("en_fresh", 0.4),
                                                          ("zero_shot", 0.1), ("symbols", 0.95))}
    args = SimpleNamespace(seeds=",".join(map(str, SEEDS)))
    z = {**english.sizes(smoke=False), "eval_r": ",".join(map(str, RS))}
    s = english.report(args, tmp_path, z, "python -m experiments.english --report", time.time())
    assert s["verdict"] == "holds" and json.loads((tmp_path / "summary.json").read_text())["verdict"] == "holds"
    assert s["accuracy"]["en_installed"]["6"]["8"] == pytest.approx(A["en_installed"].acc(6, 8).mean())
    assert set(s["accuracy"]) == {"en_installed", "en_fresh", "zero_shot"} and s["train_flops"]["en_fresh"] == 1e12
    md = (tmp_path / "english.md").read_text()
    cell = f"{A['en_installed'].acc(9, 32).mean():.2f} / {A['en_fresh'].acc(9, 32).mean():.2f}"
    assert "**Verdict: holds.**" in md and "| 9 (beyond) |" in md and cell in md and "18.6 points" in md
    assert (tmp_path / "english.png").stat().st_size > 0
    assert english.report(args, tmp_path / "empty", z, "", time.time()) is None  # unfinished arms: no report


def test_each_unit_starts_after_the_one_it_reads(tmp_path):
    seeds = ["1337", "2", "3"]
    z = english.sizes(smoke=True)
    order = english.schedule(seeds, z)
    assert len(order) == len(set(order)) and ("en_adapter_installed", "1337") in order and ("en_cot", "1337") in order
    # seed by seed, the rule's two arms before the next seed's and before every arm no verdict rests on
    last_of = lambda s: max(order.index((arm, s)) for arm in ("en_installed", "en_fresh"))
    assert all(last_of(a) < order.index(("symbols_phase1", b)) for a, b in zip(seeds, seeds[1:]))
    assert last_of(seeds[-1]) < min(order.index(u) for u in order if u[0].startswith(("en_adapter", "en_cot")))
    events, lock = [], threading.Lock()

    def run_one(arm, unit_seeds):
        with lock:
            events.append(("start", arm, unit_seeds))
        time.sleep(0.01)
        with lock:
            events.append(("end", arm, unit_seeds))

    english.run_units(order, run_one, 2, english.NEEDS)
    ended = {}
    for i, (kind, arm, unit_seeds) in enumerate(events):
        if kind == "end":
            ended.update({(arm, s): i for s in unit_seeds.split(",")})
        elif arm in english.NEEDS:  # what it starts from ended before it started
            assert all(ended.get((english.NEEDS[arm], s), len(events)) < i for s in unit_seeds.split(","))
    assert sorted(e[1:] for e in events if e[0] == "end") == sorted(order)
    assert max(sum(1 for e in events[:i] if e[0] == "start") - sum(1 for e in events[:i] if e[0] == "end")
               for i in range(len(events) + 1)) == 2  # two at a time


def test_the_rule_is_in_rules_json_with_what_it_needs():
    rule = english.RULE
    assert {"metric", "depths", "r", "seeds", "kind", "margin", "holds", "not_testable"} <= set(rule)
    assert rule["kind"] in ("superiority", "non-inferiority") and len(rule["seeds"]) >= 5
    assert set(rule["arms"]) <= set(english.arms(Path("o"), english.paths(Path("o")), english.sizes(False), "1,2"))


@pytest.mark.slow
def test_smoke_pipeline_writes_the_report_and_reuses(tmp_path):
    cmd = [sys.executable, "-m", "experiments.english", "--smoke", "--seeds", "1,2", "--out_dir", str(tmp_path)]
    p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["verdict"].startswith("no verdict (2 seeds") or s["verdict"] == "not testable here"
    assert s["measured"]["rule"]["seeds"] == 2 and s["measured"]["rule"]["rows"] == 4
    assert {"zero_shot", "zero_shot_answers", "zero_shot_symbols", "en_cot", "symbols"} <= set(s["arms"])
    assert s["measured"]["cot_tokens_per_answer"] == pytest.approx(6.5)  # depths 1..12: 6.5 words a chain
    assert (tmp_path / "english.png").stat().st_size > 0 and "installed / fresh" in (tmp_path / "english.md").read_text()
    zs = json.loads((tmp_path / "arms" / "zero_shot_symbols" / "seed_2" / "eval" / "summary.json").read_text())
    assert zs["config"]["choices"] == ",".join(map(str, json.loads((tmp_path / "data" / "symbols" / "meta.json")
                                                                   .read_text())["answer_ids"]))
    again = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "seed 2: reusing" in (tmp_path / "logs" / "en_fresh.log").read_text()
