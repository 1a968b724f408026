"""experiments/compute_matched.py: the FLOP matching against train.py's own count on a real tiny run, the wall-time
line and the step counts of a plan from hand-made calibration records, the dev picks (lr, r) and the verdict with
its costs on hand-made arm folders, and the whole pipeline at --smoke scale (plan, summary, table, figure, reuse).

    python -m pytest -q tests/test_compute_matched.py -m "not slow"
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from experiments import compute_matched as cm
from experiments.repeat import stats as spread
from model import RecurrentConfig, RecurrentGPT

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def tiny_model():
    cfg = RecurrentConfig(vocab_size=40, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, intermediate_size=64,
                          n_prelude=1, n_core=1, n_coda=1)
    return RecurrentGPT(cfg)


# -----------------------------------------------------------------------------
# the matching


def test_phase_flops_is_what_train_py_logs(depth_dir, tmp_path):
    """The plan's count of a phase, from the seed alone, equals log.jsonl's last "flops" of the real run."""
    out = tmp_path / "run"
    args = ["--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2", "--batch_size=8", "--eval_iters=1",
            "--eval_r=1", "--mean_recurrence=3", "--backprop_depth=2", "--max_iters=7", "--eval_interval=7",
            "--step_supervision", "--seed=5", "--data", str(depth_dir), "--out_dir", str(out)]
    p = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    model = RecurrentGPT.from_pretrained(str(out))
    counted, readouts = cm.phase_flops(model, 7, 3, 0.5, 2, 5, step_tokens=8 * (4 + 1))  # depth_dir: train depth 4
    assert counted == [r for r in log if "loss" in r][-1]["flops"]
    steps = cm.step_records(log)
    assert len(steps) == 6 and all(f == model.flops_per_token(r, 2) * 40 for r, f, _ in steps)  # the first dropped
    coda = model.param_counts()["coda"]
    assert 0 < readouts <= 6 * coda * 40 * 7  # at most one coda pass a step (two grad loops)


def test_wall_line_and_step_counts():
    a, b = cm.fit_seconds([1e9, 2e9, 4e9], [3.0, 4.0, 6.0])  # seconds = 2 + 1e-9 FLOPs
    assert a == pytest.approx(2.0) and b == pytest.approx(1e-9)
    assert cm.matched_steps(1000.0, 300.0) == 3 and cm.matched_steps(1000.0, 450.0) == 2
    assert cm.matched_steps(10.0, 1e6) == 1  # never zero steps
    # the FLOPs-matched run evaluates at the wall-matched step: a divisor of it near the run's quarter
    assert cm.wall_every(242, 153) == 51 and cm.wall_every(48, 38) == 19 and cm.wall_every(48, 37) == 37
    assert cm.wall_every(40, 50) == 10  # past the run: the plain quarter


def fake_calibration(model, cfg, step_tokens):
    """Calibration records as step_records gives them: the retrofit's steps at train.py's count, seconds = 1 +
    1e-9 FLOPs; a static model's FLOPs and seconds constant."""
    rec = lambda rs: [(r, float(model.flops_per_token(r, cfg.backprop_depth) * step_tokens),
                       1.0 + 1e-9 * model.flops_per_token(r, cfg.backprop_depth) * step_tokens) for r in rs]
    return {"retrofit_phase1": rec([3, 4, 5, 9]), "retrofit_phase2": rec([12, 17]),
            "uncut": [(1, 5e7, 10.0)] * 3, "static6": [(1, 1e7, 2.0), (1, 1e7, 2.5), (1, 1e7, 3.0)]}


def test_plan_matches_flops_and_seconds():
    model = tiny_model()
    cfg1 = SimpleNamespace(batch_size=4, backprop_depth=4, mean_recurrence=4, recurrence_sigma=0.5)
    cfg2 = SimpleNamespace(batch_size=4, backprop_depth=4, mean_recurrence=16, recurrence_sigma=0.5)
    step_tokens = 4 * 7
    cal = fake_calibration(model, cfg1, step_tokens)
    steps = {"retrofit_phase1": 40, "retrofit_phase2": 5}
    plan = cm.make_plan(cal, model, cfg1, cfg2, [1337, 2], steps, n_lrs=3)
    flops = [cm.phase_flops(model, 40, 4, 0.5, 4, s, step_tokens)[0] + cm.phase_flops(model, 5, 16, 0.5, 4, s, step_tokens)[0]
             for s in (1337, 2)]
    target = plan["target"]
    assert target["flops"] == pytest.approx(np.mean(flops))
    assert target["seconds"] == pytest.approx(45 * 1.0 + 1e-9 * np.mean(flops))  # the fitted line, exact here
    assert plan["steps"]["uncut_flops"] == round(target["flops"] / 5e7) > 1
    assert plan["steps"]["static6_flops"] == round(target["flops"] / 1e7)
    assert plan["steps"]["uncut_wall"] == round(target["seconds"] / 10.0) > 1
    assert plan["steps"]["static6_wall"] == round(target["seconds"] / 2.5)  # the median step
    assert plan["steps"]["retrofit_phase1"] == 40 and plan["step_tokens"] == step_tokens
    runs = plan["steps"]["uncut_flops"] * 10.0 + plan["steps"]["static6_flops"] * 2.5  # the wall is read, not run
    assert plan["estimated_train_cpu_seconds"] == pytest.approx(2 * target["seconds"] + 4 * runs)  # 3 lrs + 1 more seed
    cal["retrofit_phase1"][0] = (3, cal["retrofit_phase1"][0][1] + 1.0, 1.0)  # a count that is not train.py's
    with pytest.raises(ValueError, match="not train.py's"):
        cm.make_plan(cal, model, cfg1, cfg2, [1337, 2], steps, n_lrs=3)


# -----------------------------------------------------------------------------
# the verdict on hand-made arms

SEEDS = [1337, 2, 3, 4, 5]


def table_of(results):
    """repeat.py's table {depth, trained, beyond: {r: spread}} from per-seed {r: (rows, 12) 0/1}."""
    table = {}
    for res in results:
        for r, rows in res.items():
            cells = {str(k): rows[:, k - 1].mean() for k in range(1, 13)}
            cells.update(trained=rows[:, :6].mean(), beyond=rows[:, 6:].mean())
            for k, v in cells.items():
                table.setdefault(k, {}).setdefault(str(r), []).append(float(v))
    return {k: {r: spread(v) for r, v in by_r.items()} for k, by_r in table.items()}


def fake_arm(out, name, acc, r=1, seeds=SEEDS, flops=100.0, dt=1.0, steps=4, dev=None, dev_table=None, n_rows=30):
    """A repeat.py folder: per seed a log.jsonl (steps train records of flops FLOPs and dt seconds each, a dev
    evaluation at r at step 0, 2 and 4 with accuracy acc at every depth), eval/results.jsonl (each row right at
    every depth with probability acc, drawn by seed) and eval_dev/summary.json (one row at dev accuracy)."""
    d, results = out / "arms" / name, []
    for seed in seeds:
        run = d / f"seed_{seed}"
        (run / "eval").mkdir(parents=True)
        lines = []
        for step in range(steps + 1):
            if step:
                lines.append({"step": step, "loss": 1.0, "r": r, "flops": flops * step, "dt": dt, "elapsed": 2 * dt * step})
            if step % 2 == 0:
                lines.append({"step": step, "val": {str(r): {"loss": 1.0, "acc_by_k": {str(k): acc for k in range(1, 13)}}}})
        (run / "log.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
        rows = (np.random.default_rng(seed).random((n_rows, 12)) < acc).astype(int)
        recs = [{"index": i, "r": r, "k": 12, "steps": list(range(1, 13)), "correct": row.tolist()} for i, row in enumerate(rows)]
        (run / "eval" / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
        results.append({r: rows})
        if dev is not None:
            (run / "eval_dev").mkdir()
            row = {"r": r, "by_k": {"6": {"accuracy": dev}}, "accuracy_beyond_depth": dev}
            (run / "eval_dev" / "summary.json").write_text(json.dumps({"results": [row]}))
    (d / "summary.json").write_text(json.dumps({"table": table_of(results), "dev_table": dev_table, "seeds": list(seeds),
                                                "command": f"fake {name}"}))
    return cm.Arm(out, name)


def fake_plan():
    return {"steps": {"retrofit_phase1": 4, "retrofit_phase2": 4, **{b: 4 for b in cm.BASELINES}, "uncut_wall": 2,
                      "static6_wall": 9},
            "target": {"flops": 300.0, "seconds": 8.0, "loop_readout_flops": 60.0},
            "inference_flops_per_token": {"retrofit": {"8": 10.0, "32": 40.0}, "uncut": 20.0, "static6": 5.0}}


def test_past_grid_is_the_next_ladder_value_at_an_end_of_the_grid():
    assert cm.past_grid(3e-2, cm.LR_GRID) == 1e-1 and cm.past_grid(3e-3, cm.LR_GRID) == 1e-3
    assert cm.past_grid(1e-2, cm.LR_GRID) is None and cm.past_grid(1e-1, (3e-2, 1e-1)) is None  # the ladder's top
    assert cm.past_grid(1e-2, (1e-2, 3e-2)) == 3e-3  # --smoke's two values


def test_dev_picks_lr_and_r_and_the_verdict_with_its_costs(tmp_path):
    dev_table = {"6": {"8": {"mean": 0.9}, "32": {"mean": 0.7}}, "beyond": {"8": {"mean": 0.5}, "32": {"mean": 0.6}}}
    fake_arm(tmp_path, "retrofit_phase1", 0.5, r=32, flops=50.0, dt=1.5)
    fake_arm(tmp_path, "retrofit", 0.9, r=32, dev_table=dev_table)  # phase 2: 4 steps of 100 FLOPs
    fake_arm(tmp_path, "retrofit_r8", 0.9, r=8)  # the same rows read at r = 8, merged below
    for seed in SEEDS:  # the retrofit's results at r = 8 too (dev picks it)
        run = tmp_path / "arms" / "retrofit" / f"seed_{seed}" / "eval" / "results.jsonl"
        run.write_text(run.read_text() + (tmp_path / "arms" / "retrofit_r8" / f"seed_{seed}" / "eval" / "results.jsonl").read_text())
    for base in cm.BASELINES:  # dev: 1e-2 best for the uncut parent; a tie at 3e-3 and 3e-2 for the six layers
        for lr in cm.LR_GRID:
            best = lr == 1e-2 if base.startswith("uncut") else lr != 1e-2
            acc = 0.95 if base == "static6_flops" else 0.2  # the six layers ahead of the retrofit
            fake_arm(tmp_path, cm.arm_name(base, lr), acc, seeds=SEEDS if best else [1337], dev=0.6 if best else 0.3)
    fake_arm(tmp_path, cm.arm_name("static6_flops", 1e-3), 0.95, seeds=[1337], dev=0.5)  # past the grid's end
    assert cm.choose_lr(tmp_path, "uncut_flops", 1337)[0] == 1e-2
    lr, scores = cm.choose_lr(tmp_path, "static6_flops", 1337)
    assert lr == 3e-3 and scores == {3e-3: 0.6, 1e-2: 0.3, 3e-2: 0.6}  # a tie: the lower lr
    assert cm.pick_r(dev_table) == 8  # (0.9 + 0.5) / 2 > (0.7 + 0.6) / 2

    args = SimpleNamespace(seed_list=SEEDS, seeds=",".join(map(str, SEEDS)), lrs=cm.LR_GRID)
    cm.report(args, tmp_path, fake_plan(), "test", 0.0)
    s = json.loads((tmp_path / "summary.json").read_text())
    m = s["measured"]
    assert s["verdict"] == m["verdicts"]["uncut_flops"] == "holds" and m["verdicts"]["static6_flops"] == "does not hold"
    six = m["comparisons"]["uncut_flops@6"]
    assert six["seeds"] == 5 and six["rows"] == 30 and six["low"] <= six["diff"] <= six["high"] and six["diff"] > 0.5
    assert m["dev_r"] == 8 and m["comparisons"]["dev_r@6"]["verdict"] == "reported"
    assert m["lr"] == {"uncut_flops": 1e-2, "static6_flops": 3e-3}
    assert m["lr_past_grid"] == {"static6_flops": {"lr": 1e-3, "dev_score": 0.5}}  # the pick at the grid's end only
    # dt summed over every run read: the retrofit's 5 x 4 steps of each phase (1.5 s, 1 s), each chosen arm's 5 x 4,
    # the lr runs (uncut: two of 1 seed; static6: 1e-2 of 1 seed, the tied 3e-2 of 5) and the run past the grid
    assert m["train_step_seconds_all_runs"] == 30 + 20 + 20 + 8 + 20 + 4 + 20 + 4
    assert (tmp_path / "compute_matched_test.png").stat().st_size > 0
    cost = m["cost"]
    assert cost["retrofit"]["train_flops"] == 4 * 50.0 + 4 * 100.0  # both phases
    assert cost["retrofit"]["step_seconds"] == 4 * 1.5 + 4 * 1.0 and cost["retrofit"]["run_seconds"] == 12.0 + 8.0
    assert cost["retrofit"]["inference_flops_per_token"] == 40.0 and cost["uncut_flops"]["inference_flops_per_token"] == 20.0
    # the wall match read along the runs: uncut's at its evaluation of step 2, static6's past its 4 steps
    assert m["wall"]["uncut"] == {"wall_steps": 2, "flops_steps": 4, "dev_depth": pytest.approx(0.2),
                                  "dev_beyond": pytest.approx(0.2)}
    assert m["wall"]["static6"]["dev_depth"] is None and m["wall"]["retrofit"]["dev_depth"] == pytest.approx(0.9)
    md = (tmp_path / "compute_matched.md").read_text()
    assert "**Verdict (retrofit vs uncut_flops): holds.**" in md and "| static6_flops | 0.003 |" in md
    assert "- uncut: 2 steps (the FLOPs match: 4): depth 6 0.200" in md and "- static6: 9 steps" in md
    assert "one run at 0.001 on the first seed scores 0.500 on dev against the pick's 0.600" in md
    assert (tmp_path / "compute_matched.png").stat().st_size > 0
    curve = cm.dev_curve(cm.Arm(tmp_path, "retrofit"), 32, offset=[200.0] * 5)  # phase 2 after phase 1's FLOPs
    assert curve[:, 1].tolist() == [400.0, 600.0] and curve[0, 2] == pytest.approx(0.9)  # its step 0 left out


def test_report_before_every_arm_has_finished(tmp_path):
    args = SimpleNamespace(seed_list=SEEDS, seeds=",".join(map(str, SEEDS)), lrs=cm.LR_GRID)
    dev_table = {"6": {"32": {"mean": 0.7}}, "beyond": {"32": {"mean": 0.6}}}
    fake_arm(tmp_path, "retrofit_phase1", 0.5, r=32, flops=50.0, dt=1.5)
    fake_arm(tmp_path, "retrofit", 0.9, r=32, dev_table=dev_table)
    for lr in cm.LR_GRID:  # the uncut parent's sweep; its pick 1e-2 has run two seeds of five so far
        fake_arm(tmp_path, cm.arm_name("uncut_flops", lr), 0.2, seeds=SEEDS[:2] if lr == 1e-2 else [1337],
                 dev=0.6 if lr == 1e-2 else 0.3)
    with pytest.raises(SystemExit, match="the verdict needs the retrofit's two phases and uncut_flops"):
        cm.report(args, tmp_path, fake_plan(), "test", 0.0)
    shutil.rmtree(tmp_path / "arms" / "uncut_flops_lr0.01")
    fake_arm(tmp_path, cm.arm_name("uncut_flops", 1e-2), 0.2, seeds=SEEDS, dev=0.6)  # every seed now
    fake_arm(tmp_path, cm.arm_name("static6_flops", 3e-3), 0.9, seeds=[1337], dev=0.6)  # its sweep under way
    cm.report(args, tmp_path, fake_plan(), "test", 0.0)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["verdict"] == "holds" and s["unfinished"] == ["static6_flops"]
    assert list(s["measured"]["verdicts"]) == ["uncut_flops"] and "static6" not in s["measured"]["wall"]
    assert s["measured"]["train_step_seconds_all_runs"] == 30 + 20 + 20 + 4 + 4  # the unfinished arm's runs left out
    md = (tmp_path / "compute_matched.md").read_text()
    assert "| static6_flops |" not in md and "Not finished yet, left out: static6_flops" in md


# -----------------------------------------------------------------------------
# the pipeline


@pytest.mark.slow
def test_smoke_pipeline_writes_its_verdict_and_reuses(tmp_path):
    cmd = [sys.executable, "-m", "experiments.compute_matched", "--smoke", "--seeds", "1337,2", "--out_dir", str(tmp_path)]
    p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["smoke"] and all(n >= 1 for n in plan["steps"].values())
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["verdict"].startswith("no verdict (2 seeds") and s["commits"]["rules"] is not None
    m = s["measured"]
    for base in cm.BASELINES:  # each baseline ran the FLOPs or seconds its plan gave, at its dev-chosen lr
        arm = cm.Arm(tmp_path, cm.arm_name(base, m["lr"][base]))
        assert [len(train) for train, _ in arm.logs()] == [plan["steps"][base]] * 2
    assert m["cost"]["retrofit"]["train_flops"] == pytest.approx(plan["target"]["flops"])  # the plan's count, run
    assert (tmp_path / "compute_matched.png").stat().st_size > 0 and "| uncut_flops |" in (tmp_path / "compute_matched.md").read_text()
    again = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "seed 2: reusing" in (tmp_path / "logs" / "retrofit.log").read_text()
    assert (tmp_path / "logs" / "retrofit_seed2.log").is_file()  # each seed ran as a job of its own
    shutil.rmtree(tmp_path)  # every seed's checkpoint, the uncut parent's among them: gigabytes pytest would keep
