"""Every bench/ script and section runs: a smoke run of each (tiny shapes or the fewest steps, seconds), so that a
refactor of what a bench calls cannot break it unseen. The figures are not checked (they are the benches' to
print, side by side); each run must finish and print its table. bench_gpu.py's smoke runs are in test_bf16.py.

    python -m pytest -q tests/test_bench.py
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"


def bench(*args, timeout=300):
    """Run a bench script (or bench/gpu_check.sh) from the repository on one thread; its stdout + stderr."""
    cmd = ["bash", *args] if args[0].endswith(".sh") else [sys.executable, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    return run.stdout + run.stderr


def test_bench_sample_smoke():
    """Sections 1-5 on tiny random stand-ins (a random Llama in the hub's layout, depth-task dirs)."""
    out = bench("bench/bench_sample.py", "--smoke")
    for head in ("1. decode at r=1", "2. decode cost vs r", "3. depth task", "4. KV budget", "5a. speed", "5b. depth",
                 "5c. text", "frontier:"):
        assert head in out, head


@pytest.mark.parametrize("only", ["peak,memory,prefix,muon", "precision,layers,gemm,profile"])
def test_bench_train_smoke(only):
    out = bench("bench/bench_train.py", "--smoke", "--only", only)
    assert out.count("\n| ") >= len(only.split(","))  # a table row per bench at least


def test_gpu_check_smoke(tmp_path):
    """bench/gpu_check.sh --smoke: the GPU script's two benches on CPU, tiny shapes."""
    out = bench("bench/gpu_check.sh", "--smoke", str(tmp_path))
    assert "gpu_check: done" in out and (tmp_path / "bench_gpu.json").exists()
    assert "5a. speed, random (4,6,4) cut" in (tmp_path / "sampler.txt").read_text()


def test_recipe_costs():
    assert "|" in bench("bench/recipe_costs.py")


@pytest.mark.slow
def test_bench_retrofit_depth_smoke():
    bench("bench/bench_retrofit_depth.py", "--shapes", "1,1,1", "--batch", "4", "--repeat", "1")


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "data" / "gsm8k").exists(), reason="needs ../shared/data/gsm8k")
def test_bench_eval_smoke():
    bench("bench/bench_eval.py", "--batch", "2", "--r", "1", "--max_new_tokens", "2", "--shape", "1,1,1",
          "--threads", "1")


@pytest.mark.slow
def test_kill_save_smoke(tmp_path):
    """--work: the runs go under pytest's tmp_path (by default kill_save.py keeps them in a temporary directory)."""
    bench("bench/kill_save.py", "--save", "1", "--ops", "1", "--work", str(tmp_path), timeout=600)


@pytest.mark.slow
def test_bench_compile_smoke():
    """~2 min cold (torch.compile of the tiny blocks), seconds once inductor's cache holds them."""
    bench("bench/bench_compile.py", "--smoke", timeout=900)


def test_bench_finite_smoke(tmp_path):
    torch = pytest.importorskip("torch")
    from model import RecurrentConfig, RecurrentGPT

    torch.manual_seed(0)
    RecurrentGPT(RecurrentConfig(vocab_size=14)).save_pretrained(tmp_path / "ckpt")
    out = bench("bench/bench_finite.py", "--smoke", "--ckpt", str(tmp_path / "ckpt"))
    assert "safetensors warm" in out and "safetensors cold" in out


def test_faults_smoke():
    out = bench("bench/faults.py", "--cases", "bad_flag,sample_nothing")
    assert "(bad_flag" in out and "exit 1; printed `error: --shape '1,1'" in out and "(sample_nothing" in out

