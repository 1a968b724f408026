"""experiments/in_place.py: the arms' flags (freeze, the chains of inits, the first-seed arms), the readings beside
the training, and the whole pipeline at --smoke scale on SmolLM2 itself (adapter-only exact at r = 1, the report).

    python -m pytest -q tests/test_in_place.py -m "not slow"
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import in_place as ip

REPO = Path(__file__).resolve().parents[1]


def flag(args, name):
    return args[args.index(name) + 1]


def test_arms_chain_their_inits_and_pin_the_first_seed(tmp_path):
    p = ip.paths(tmp_path)
    table = ip.arms(tmp_path, p, smoke=False, first=7)
    assert set(table) == {"core_phase1", "core", "adapter_phase1", "adapter", "rev_core", "rev_adapter", "mix_core",
                          "core_kl_phase1", "core_kl", "cut222_phase1", "cut222"}
    for name in ("core_kl_phase1", "core_kl"):  # the remedy: the core arm with the KL term towards the cut's r = 1
        train = table[name][0]
        assert flag(train, "--kl_parent") == "1.0" and flag(train, "--kl_init") == str(p["cut"])
        assert flag(train, "--kl_data") == str(p["sotu"])
    n = len(table["core_phase1"][0])  # otherwise core's own flags, the KL flags after them
    assert table["core_kl_phase1"][0][:n] == table["core_phase1"][0]
    assert flag(table["core_kl"][0], "--init") == str(tmp_path / "arms" / "core_kl_phase1") + "/seed_{seed}"
    for name, (train, rep) in table.items():
        want = "base" if "adapter" in name else "none" if "cut222" in name else "outer"  # adapter, core + adapter
        assert flag(train, "--freeze") == want
        assert ("--seeds" in rep) == (name.startswith(("adapter", "rev_", "mix_", "cut222")))
        if "--seeds" in rep:
            assert flag(rep, "--seeds") == "7"
    assert flag(table["core_phase1"][0], "--init") == str(p["cut"]) and flag(table["cut222_phase1"][0], "--init") == str(
        p["cut222"])
    assert flag(table["core"][0], "--init") == str(tmp_path / "arms" / "core_phase1") + "/seed_{seed}"
    for arm, data in (("rev_core", "reversed"), ("rev_adapter", "reversed"), ("mix_core", "both")):
        assert flag(table[arm][0], "--init") == str(tmp_path / "arms" / "core") + "/seed_{seed}"
        assert flag(table[arm][0], "--data") == str(p[data]) and flag(table[arm][0], "--max_iters") == "50"
    for arm in ("core", "cut222"):  # the (2,2,2) cut compares at equal steps
        assert flag(table[f"{arm}_phase1"][0], "--max_iters") == "100" and flag(table[arm][0], "--max_iters") == "12"
    assert ip.NEEDS["core"] == "core_phase1" and all(ip.NEEDS[a] == "core" for a in ("rev_core", "mix_core"))


def test_readings_cover_every_model_and_the_other_rule(tmp_path):
    p = ip.paths(tmp_path)
    todo = ip.readings(tmp_path, p, [1337, 2, 3], smoke=False)
    names = {(n, what) for n, _, what, _ in todo}
    for model in ("parent", "core/1337", "core/2", "core/3", "adapter/1337", "rev_core/1337", "mix_core/1337"):
        assert {(model, c) for c in ip.CORPORA} <= names
    assert ("core/1337", "reversed") in names and ("rev_adapter/1337", "forward") in names
    assert ("mix_core/1337", "reversed") in names and ("adapter/2", "sotu") not in names
    loss = next(a for n, _, w, a in todo if (n, w) == ("parent", "sotu"))
    assert flag(loss, "--r") == "1" and flag(loss, "--data") == str(p["sotu"]) and flag(loss, "--split") == "val"


@pytest.mark.slow
def test_smoke_pipeline_adapter_exact_and_report(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "experiments.in_place", "--smoke", "--kl", "--seeds", "1337,2", "--jobs", "2", "--out_dir",
           str(tmp_path)]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    m = s["measured"]
    assert s["verdicts"]["loops"].startswith("no verdict (2 seeds") and s["commits"]["rules"] is not None
    assert "retention_kl" in s["verdicts"] and set(m["retention"]) == {"core", "core_kl"}  # --kl ran the remedy
    assert m["text_loss"]["core_kl/2"] != m["text_loss"]["core/2"]
    # adapter-only keeps r = 1 the parent: not a logit moves, nor the text loss
    assert m["adapter_logit_gap"] == 0.0
    assert m["text_loss"]["adapter/1337"] == m["text_loss"]["parent"]
    assert m["text_loss"]["core/1337"] != m["text_loss"]["parent"]  # the trained core is on the r = 1 path
    assert set(m["interference"]) == {"6", "trained"}  # depth 6 and pooled over 1-6, each arm's both rules
    assert all(set(v) == {"before", "rev_core", "rev_adapter", "mix_core"} for v in m["interference"].values())
    md = (tmp_path / "in_place.md").read_text()
    assert "| (2,2,2) cut, depth 6 (1 seeds) |" in md and all((tmp_path / f).stat().st_size > 0 for f in ("in_place.png", "in_place_retention.png"))
    shutil.rmtree(tmp_path)  # every seed's checkpoint of the 30-layer model: gigabytes pytest would keep
