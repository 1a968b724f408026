"""experiments/claims.py: the measurements on hand-made arms (known FLOPs saving, spikes, pairing by seed), a static
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


def fake_arm(out, name, curves, seeds=(1337, 2, 3)):
    """An arm folder as repeat.py leaves it: per seed a log.jsonl of train steps, from curves = per seed
    [(flops, train loss)] a step."""
    d = out / "arms" / name
    for seed, curve in zip(seeds, curves):
        (d / f"seed_{seed}").mkdir(parents=True)
        lines = [{"step": i + 1, "loss": loss, "flops": flops, "grad_norm": 1.0} for i, (flops, loss) in enumerate(curve)]
        (d / f"seed_{seed}" / "log.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    (d / "summary.json").write_text(json.dumps({"table": {}, "seeds": list(seeds), "command": "fake"}))
    return claims.Arm(out, name)


def test_flops_to_interpolates_and_curriculum_ratio_is_exact(tmp_path, monkeypatch):
    assert claims.flops_to(([0, 10, 20], [3.0, 2.0, 1.0]), 1.5) == 15.0
    assert claims.flops_to(([0, 10], [3.0, 2.0]), 1.0) is None  # never reached
    monkeypatch.setattr(claims, "LOSS_WINDOW", 2)  # the mean of each step and the one before
    const = [[(100.0, 3.0), (200.0, 1.0), (300.0, 1.0)]] * 3  # means 2.0, 1.0: the target 1.0 after 300 FLOPs
    fast = [[(50.0, 2.0), (100.0, 1.0), (150.0, 0.0)]] * 3  # means 1.5 at 100, 0.5 at 150: 1.0 at 125 -> 300 / 125
    slow = [[(100.0, 3.0), (200.0, 2.0), (300.0, 2.0)]] * 3  # never reaches it
    A = {"scratch": fake_arm(tmp_path, "scratch", const), "curriculum_linear": fake_arm(tmp_path, "curriculum_linear", fast),
         "curriculum_1sqrt": fake_arm(tmp_path, "curriculum_1sqrt", slow)}
    rows, holds, text = claims.curriculum(A)
    assert rows["curriculum_linear"]["flops_saving"]["values"] == pytest.approx([300 / 125] * 3)
    assert rows["curriculum_1sqrt"]["flops_saving"]["values"] == [0.0] * 3
    assert holds is False and "linear 2.40" in text


def test_spikes_counts_jumps_and_non_finite_steps():
    steady = [{"loss": 1.0 + 0.1 * (i % 3)} for i in range(100)]
    assert claims.spikes(steady) == 0
    spiky = [dict(r) for r in steady]
    spiky[60]["loss"], spiky[80]["loss"] = 10.0, float("nan")
    assert claims.spikes(spiky) == 2
    solved = [{"loss": 0.01 if i % 5 else 0.3} for i in range(100)]  # r=1 draws of a solved task: 30x, not 1 nat up
    assert claims.spikes(solved) == 0


def test_every_pairs_by_seed():
    assert claims.every([0.5, 0.6, 0.7], [0.4, 0.5, 0.6])
    assert not claims.every([0.9, 0.6, 0.5], [0.4, 0.5, 0.6])  # the mean is ahead, one seed is not


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


@pytest.mark.slow
def test_smoke_pipeline_writes_summaries_and_reuses(tmp_path):
    cmd = [sys.executable, "-m", "experiments.claims", "--smoke", "--claim", "static", "--seeds", "1,2", "--out_dir", str(tmp_path)]
    p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    s = json.loads((tmp_path / "static" / "summary.json").read_text())
    assert isinstance(s["holds"], bool) and s["git_commit"] is not None and s["seeds"] == "1,2"
    assert (tmp_path / "static" / "static.png").stat().st_size > 0
    m = s["measured"]
    assert len(m["beyond"]["loop"]["values"]) == 2 and m["train_flops"]["loop"]["mean"] > 0
    seed_eval = json.loads((tmp_path / "arms" / "static" / "seed_2" / "eval" / "summary.json").read_text())
    assert m["beyond"]["static"]["values"][1] == seed_eval["results"][0]["accuracy_beyond_depth"]  # read, not made up
    table = (tmp_path / "claims.md").read_text()
    assert "8. The loop beats the static-depth baseline" in table and "python -m experiments.claims --claim static" in table
    again = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0
    assert "seed 2: reusing" in (tmp_path / "logs" / "static.log").read_text()
