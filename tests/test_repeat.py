"""experiments/repeat.py: seeds trained and evaluated through the project's own scripts, the table equal to the mean
and spread of the seeds' own eval summaries, reuse of finished seeds, and no mixing of commands.

    python -m pytest -q tests/test_repeat.py
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TINY = ["--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2", "--batch_size=8", "--eval_iters=1",
        "--eval_r=1", "--mean_recurrence=2", "--backprop_depth=2", "--max_iters=3", "--warmup_iters=1",
        "--eval_interval=3"]


def repeat(*args):
    return subprocess.run([sys.executable, "-m", "experiments.repeat", *map(str, args)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_seeds_table_reuse_and_refusal(tmp_path):
    data = tmp_path / "data"
    subprocess.run([sys.executable, "data/depth/prepare.py", "--out_dir", data, "--train_k", "3", "--test_k", "4",
                    "--num_train", "256", "--num_val", "32"], cwd=REPO, env=ENV, check=True, capture_output=True)
    out = tmp_path / "seeds"
    p = repeat("--out_dir", out, "--seeds", "1,2", "--r", "1,2", "--", *TINY, "--data", data)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [1, 2] and (out / "depth_seeds.png").stat().st_size > 0
    per_seed = [json.loads((out / f"seed_{s}" / "eval" / "summary.json").read_text()) for s in (1, 2)]
    for r_index, r in enumerate(("1", "2")):
        for k in ("1", "4"):
            accs = [s["results"][r_index]["by_k"][k]["accuracy"] for s in per_seed]
            cell = summary["table"][k][r]
            assert cell["values"] == accs and cell["mean"] == pytest.approx(np.mean(accs))
            assert cell["std"] == pytest.approx(np.std(accs, ddof=1))
    assert "| 4 (beyond) |" in summary["markdown"] and "| all depths <= 3 |" in summary["markdown"]
    dev = [json.loads((out / f"seed_{s}" / "eval_dev" / "summary.json").read_text()) for s in (1, 2)]
    assert summary["dev_table"]["4"]["1"]["values"] == [s["results"][0]["by_k"]["4"]["accuracy"] for s in dev]
    assert [s["split"] for s in per_seed + dev] == ["test", "test", "dev", "dev"]
    # --aggregate: the same table from the seeds' eval dirs, as for seeds trained outside repeat.py
    p = repeat("--aggregate", *(out / f"seed_{s}" / "eval" for s in (1, 2)))
    assert p.returncode == 0 and summary["markdown"] in p.stdout, p.stderr[-2000:]
    p = repeat("--aggregate", out / "seed_1" / "eval", tmp_path)
    assert p.returncode != 0 and "no summary.json" in p.stderr
    # the two seeds trained differently (the seed reaches init, batches and r)
    w = [(out / f"seed_{s}" / "model.safetensors").read_bytes() for s in (1, 2)]
    assert w[0] != w[1]
    # rerun: finished seeds are reused, not retrained
    mtime = (out / "seed_1" / "model.safetensors").stat().st_mtime_ns
    p = repeat("--out_dir", out, "--seeds", "1,2", "--r", "1,2", "--", *TINY, "--data", data)
    assert p.returncode == 0 and "seed 1: reusing" in p.stdout
    assert (out / "seed_1" / "model.safetensors").stat().st_mtime_ns == mtime
    # an unfinished seed of this command (killed before its evaluation) resumes from its last save
    steps = lambda: [ln for ln in (out / "seed_2" / "log.jsonl").read_text().splitlines() if '"loss"' in ln]
    log = steps()  # the step and eval records (a resume adds only its own header line)
    (out / "seed_2" / "eval" / "summary.json").unlink()
    p = repeat("--out_dir", out, "--seeds", "1,2", "--r", "1,2", "--", *TINY, "--data", data)
    assert p.returncode == 0 and "seed 2: " in p.stdout and "resuming it" in p.stdout, p.stdout[-2000:]
    assert (out / "seed_2" / "model.safetensors").read_bytes() == w[1]  # the same run, not appended to
    assert steps() == log and (out / "seed_2" / "eval" / "summary.json").is_file()
    # ... and one killed before its first save is trained again from the start
    for f in (out / "seed_2").iterdir():
        if f.name != "repeat_command.json":
            (f.unlink if f.is_file() or f.is_symlink() else shutil.rmtree)(f)
    p = repeat("--out_dir", out, "--seeds", "1,2", "--r", "1,2", "--", *TINY, "--data", data)
    assert p.returncode == 0 and "starting it again" in p.stdout
    assert (out / "seed_2" / "model.safetensors").read_bytes() == w[1]
    # another command into the same folder is refused, in one line, before it trains
    p = repeat("--out_dir", out, "--seeds", "1", "--r", "1,2", "--", *TINY, "--data", data, "--adam_lr=1e-3")
    assert p.returncode != 0 and p.stderr.strip().splitlines()[-1].startswith("repeat.py: error:")
    assert "another command" in p.stderr
    p = repeat("--out_dir", out, "--", *TINY, "--seed", "3")
    assert p.returncode == 2 and "set per seed" in p.stderr
    # a second phase: {seed} becomes each seed's number, so seed S continues from the first phase's seed S
    phase2 = tmp_path / "phase2"
    p = repeat("--out_dir", phase2, "--seeds", "1,2", "--eval", "none", "--", "--init", out / "seed_{seed}", "--data", data,
               "--batch_size=8", "--eval_iters=1", "--eval_r=1", "--mean_recurrence=2", "--backprop_depth=2",
               "--max_iters=2", "--warmup_iters=1", "--eval_interval=2")
    assert p.returncode == 0, p.stderr[-2000:]
    for s in (1, 2):
        train = json.loads((phase2 / f"seed_{s}" / "repeat_command.json").read_text())["train"]
        assert train[train.index("--init") + 1] == str(out / f"seed_{s}")
        assert (phase2 / f"seed_{s}" / "model.safetensors").read_bytes() != w[s - 1]  # trained on from there


def test_each_seed_is_evaluated_on_the_data_it_trained_on(tmp_path):
    """The depth evaluation reads the data dir train.py reads: --data, else the --config file's."""
    from experiments.repeat import trained_on

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"data": "data/depth_smollm2", "max_iters": 3}))
    assert trained_on(["--config", str(cfg)]) == "data/depth_smollm2"
    assert trained_on(["--config", str(cfg), "--data", "elsewhere"]) == "elsewhere"
    assert trained_on(["--max_iters", "3"]) == "data/sotu"  # train.py's own default
    with pytest.raises(SystemExit, match="repeat.py: error: the train.py arguments after --"):
        trained_on(["--batch_size", "0"])


def test_a_summary_over_more_seeds_of_the_same_command_is_kept(tmp_path):
    from experiments.repeat import covered

    path, argv = tmp_path / "summary.json", ["--out_dir", "o", "--seeds", "1337,2,3", "--r", "1", "--", "--x"]
    assert not covered(path, argv, [1337])  # nothing there yet
    path.write_text(json.dumps({"command": "python -m experiments.repeat " + " ".join(argv), "seeds": [1337, 2, 3]}))
    assert covered(path, ["--out_dir", "o", "--seeds", "1337", "--r", "1", "--", "--x"], [1337])  # a sweep's seed
    assert not covered(path, ["--out_dir", "o", "--seeds", "4", "--r", "1", "--", "--x"], [4])  # a new seed
    assert not covered(path, ["--out_dir", "o", "--seeds", "1337", "--r", "8", "--", "--x"], [1337])  # another command
