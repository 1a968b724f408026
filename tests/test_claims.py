"""experiments/claims.py: the measurements on hand-made arms (known FLOPs saving, a seed that never reaches it, spikes
and the positive control, rows pooled and paired by seed and row), a static
checkpoint of ours as a parent (cut whole it is the same model), and the pipeline end to end at --smoke
scale (summary.json, PNG, the table row, reuse on a rerun).

    python -m pytest -q tests/test_claims.py
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments import claims
from model import RecurrentConfig, RecurrentGPT

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def fake_arm(out, name, curves, seeds=(1337, 2, 3, 4, 5), results=None):
    """An arm folder as repeat.py leaves it: per seed a log.jsonl of train steps, from curves = per seed
    [(flops, train loss)] a step, a dev evaluation at r = 6 every second step (its loss the step's, and its error on
    every trained depth too), and
    eval/results.jsonl from results = per seed {r: (rows, depths) 0/1 correctness}."""
    d = out / "arms" / name
    for i, (seed, curve) in enumerate(zip(seeds, curves)):
        (d / f"seed_{seed}" / "eval").mkdir(parents=True)
        lines = []
        for step, (flops, loss) in enumerate(curve, start=1):
            lines.append({"step": step, "loss": loss, "flops": flops, "grad_norm": 1.0, "elapsed": 1.0})
            if step % 2 == 0:
                acc = {str(k): 1 - loss for k in range(1, 13)}
                lines.append({"step": step, "val": {"6": {"loss": loss, "acc_by_k": acc}}})
        (d / f"seed_{seed}" / "log.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
        recs = [{"index": j, "r": r, "k": 12, "steps": list(range(1, 13)), "correct": [int(c) for c in row]}
                for r, table in (results[i] if results else {}).items() for j, row in enumerate(table)]
        (d / f"seed_{seed}" / "eval" / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    (d / "summary.json").write_text(json.dumps({"table": {}, "seeds": list(seeds), "command": "fake"}))
    return claims.Arm(out, name)


def test_flops_to_interpolates_and_a_seed_that_never_reaches_is_reported(tmp_path, monkeypatch):
    assert claims.flops_to(([0, 10, 20], [3.0, 2.0, 1.0]), 1.5) == 15.0
    assert claims.flops_to(([0, 10], [3.0, 2.0]), 1.0) is None  # never reached
    monkeypatch.setattr(claims, "TARGET_ERROR", 0.1)
    # dev error at steps 2, 4, 6 (the second value of each pair): the constant run reaches 0.1 after 300 FLOPs
    const = [[(50.0, 0.9), (100.0, 0.5), (150.0, 0.9), (200.0, 0.3), (250.0, 0.9), (300.0, 0.1)]] * 5
    fast = [[(50.0, 0.9), (100.0, 0.1), (150.0, 0.9), (200.0, 0.0), (250.0, 0.9), (300.0, 0.0)]] * 5  # 0.1 at 100
    slow = [[(50.0, 0.9), (100.0, 0.5), (150.0, 0.9), (200.0, 0.3), (250.0, 0.9), (300.0, 0.2)]] * 4 + [fast[0]]
    A = {"scratch": fake_arm(tmp_path, "scratch", const), "curriculum_linear": fake_arm(tmp_path, "curriculum_linear", fast),
         "curriculum_1sqrt": fake_arm(tmp_path, "curriculum_1sqrt", slow)}
    rows, verdict, text = claims.curriculum(A)
    assert rows["curriculum_linear"]["log_saving_per_seed"] == pytest.approx([np.log(3.0)] * 5)
    assert rows["curriculum_linear"]["verdict"] == "holds"  # the same saving on every seed: a zero-width interval
    assert rows["curriculum_1sqrt"]["log_saving_per_seed"][:4] == [None] * 4  # no sentinel value for a miss
    assert rows["curriculum_1sqrt"]["seeds_never_reaching"] == 4 and rows["curriculum_1sqrt"]["verdict"] == "inconclusive"
    assert verdict == "holds" and "linear 3.00x" in text and "4 seeds never reach it" in text
    # the committed rule's loss (here the same numbers): the constant run's final 0.1, reached at its own 300 FLOPs
    assert rows["curriculum_linear_committed_rule"]["log_saving_per_seed"] == pytest.approx([np.log(3.0)] * 5)


def test_rows_pool_depths_per_row_and_pair_the_arms(tmp_path):
    rng = np.random.default_rng(0)
    tables = [{1: rng.integers(0, 2, (40, 12)), 8: rng.integers(0, 2, (40, 12))} for _ in range(5)]
    arm = fake_arm(tmp_path, "a", [[(1.0, 1.0)]] * 5, results=tables)
    trained, beyond, six = arm.rows("trained", 8), arm.rows("beyond", 8), arm.rows(6, 1)
    assert trained.shape == beyond.shape == (5, 40)
    assert np.array_equal(trained[2], tables[2][8][:, :6].mean(1)) and np.array_equal(beyond[4], tables[4][8][:, 6:].mean(1))
    assert np.array_equal(six[1], tables[1][1][:, 5])
    assert np.array_equal(arm.rows(6, 32), arm.rows(6, 1))  # an r not evaluated (a static arm): its first r
    res = claims.compare("loops", trained, trained)  # the same arm against itself: difference 0, the rule's margin 0.05
    assert res["diff"] == 0.0 and res["verdict"] == "does not hold" and res["old_rule"] == "no"


def test_spikes_counts_jumps_and_non_finite_steps():
    steady = [{"loss": 1.0 + 0.1 * (i % 3)} for i in range(100)]
    assert claims.spikes(steady) == 0
    spiky = [dict(r) for r in steady]
    spiky[60]["loss"], spiky[80]["loss"] = 10.0, float("nan")
    assert claims.spikes(spiky) == 2
    solved = [{"loss": 0.01 if i % 5 else 0.3} for i in range(100)]  # r=1 draws of a solved task: 30x, not 1 nat up
    assert claims.spikes(solved) == 0


def test_optimizer_without_a_spiking_control_is_not_testable(tmp_path):
    flat = [[(float(i), 1.0) for i in range(1, 120)]] * 5
    spiky = [[(float(i), 10.0 if i == 100 else 1.0) for i in range(1, 120)]] * 5
    A = {"muon_paper": fake_arm(tmp_path, "muon_paper", flat), "adamw_paper": fake_arm(tmp_path, "adamw_paper", spiky),
         "adamw_control": fake_arm(tmp_path, "adamw_control", flat)}
    rows, verdict, _ = claims.optimizer(A)
    assert verdict == "not testable here" and rows["adamw_vs_muon"]["diff"] == 1.0
    A["adamw_control"] = fake_arm(tmp_path, "adamw_control2", spiky)
    assert claims.optimizer(A)[1] == "holds"


def test_static_checkpoint_of_ours_is_a_parent(tmp_path):
    """surgery.cut of a static checkpoint of ours, whole and static, is that model (its layers in order)."""
    import surgery

    torch.manual_seed(0)
    cfg = RecurrentConfig(vocab_size=20, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, intermediate_size=64,
                          n_prelude=1, n_core=2, n_coda=1, recurrent=False)
    parent = RecurrentGPT(cfg)
    parent.save_pretrained(tmp_path / "parent")
    whole = surgery.cut(str(tmp_path / "parent"), shape=(1, 2, 1), static=True)
    idx = torch.randint(0, 20, (2, 9))
    assert torch.equal(parent(idx)[0], whole(idx)[0])
    cut = surgery.cut(str(tmp_path / "parent"), shape=(1, 1, 1))  # layers 0, 2, 3: the core is the parent's layer 2
    assert cut.config.layers == {"prelude": [0], "core": [2], "coda": [3]}
    assert torch.equal(cut.core[0].mlp.up_proj.weight, parent.core[1].mlp.up_proj.weight)
    looped = RecurrentGPT(RecurrentConfig(**{**cfg.__dict__, "recurrent": True}))
    looped.save_pretrained(tmp_path / "looped")
    with pytest.raises(surgery.SurgeryError, match="looped checkpoint"):
        surgery.cut(str(tmp_path / "looped"), shape=(1, 1, 1))


def test_run_arms_by_seed_runs_each_seed_then_each_arm_whole(tmp_path, monkeypatch):
    from experiments import claim_arms

    ran, partial = [], []  # partial: the per-seed jobs leave the arm's summary.json to the pass over all its seeds
    monkeypatch.setattr(claim_arms, "sh", lambda cmd, log: (
        ran.append((cmd[cmd.index("--seeds") + 1], log.name, cmd[cmd.index("--") + 1:])),
        partial.append("--no_summary" in cmd)))
    table = {"a": (["--x"], ["--r", "1"]), "b": (["--y"], ["--seeds", "7", "--r", "1"])}
    claim_arms.run_arms(tmp_path, ["a", "b"], table, 1, tmp_path, "1,2", by_seed=True)
    assert ran == [("1", "a_seed1.log", ["--x"]), ("2", "a_seed2.log", ["--x"]), ("7", "b_seed7.log", ["--y"]),
                   ("1,2", "a.log", ["--x"]), ("7", "b.log", ["--y"])]  # an arm's own --seeds win, once each
    assert partial == [True, True, True, False, False]
    ran.clear()
    claim_arms.run_arms(tmp_path, ["a", "b"], table, 2, tmp_path, "1,2")
    assert sorted(ran) == [("1,2", "a.log", ["--x"]), ("7", "b.log", ["--y"])]


def test_sh_once_reuses_only_a_finished_result_of_the_same_command(tmp_path, monkeypatch):
    from experiments import claim_arms

    ran = []
    monkeypatch.setattr(claim_arms, "sh", lambda cmd, log: ran.append(cmd))
    done, stamp = tmp_path / "ev" / "summary.json", tmp_path / "command.json"
    claim_arms.sh_once(["py", "a"], done, stamp, None)  # nothing there: runs
    claim_arms.sh_once(["py", "a"], done, stamp, None)  # stamped but unfinished (killed): runs again
    done.write_text("{}")
    claim_arms.sh_once(["py", "a"], done, stamp, None)  # finished, same command: reused
    claim_arms.sh_once(["py", "b"], done, stamp, None)  # another command: runs
    assert ran == [["py", "a"], ["py", "a"], ["py", "b"]] and json.loads(stamp.read_text()) == ["b"]


@pytest.mark.slow
def test_smoke_pipeline_writes_summaries_and_reuses(tmp_path):
    cmd = [sys.executable, "-m", "experiments.claims", "--smoke", "--claim", "static", "--seeds", "1,2", "--out_dir", str(tmp_path)]
    p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    s = json.loads((tmp_path / "static" / "summary.json").read_text())
    assert s["verdict"].startswith("no verdict (2 seeds") and s["commits"]["rules"] is not None and s["seeds"] == "1,2"
    assert (tmp_path / "static" / "static.png").stat().st_size > 0
    beyond = s["measured"]["beyond"]
    assert beyond["seeds"] == 2 and beyond["low"] <= beyond["diff"] <= beyond["high"] and s["train_flops"]["retrofit"] > 0
    seed_eval = json.loads((tmp_path / "arms" / "static" / "seed_2" / "eval" / "summary.json").read_text())
    assert abs(np.mean([beyond["b"]]) - np.mean([seed_eval["results"][0]["accuracy_beyond_depth"],
               json.loads((tmp_path / "arms" / "static" / "seed_1" / "eval" / "summary.json").read_text())
               ["results"][0]["accuracy_beyond_depth"]])) < 1e-9  # read, not made up
    table = (tmp_path / "claims.md").read_text()
    assert "8. The loop beats the static-depth baseline" in table and "python -m experiments.claims --claim static" in table
    again = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0
    assert "seed 2: reusing" in (tmp_path / "logs" / "static.log").read_text()
