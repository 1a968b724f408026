"""plumbing/finite.py: weights with a NaN or an inf are refused where they are read, in one line naming the file
and the first such tensor, by every entry point (from_pretrained, surgery's parents, train.py --init, eval_math).

    python -m pytest -q tests/test_finite.py
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from model import RecurrentConfig, RecurrentGPT
from plumbing import parents
from plumbing.finite import first_nonfinite

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def poisoned_ckpt(tmp_path):
    torch.manual_seed(0)
    model = RecurrentGPT(RecurrentConfig(vocab_size=14))
    with torch.no_grad():
        model.core[1].mlp.up_proj.weight[3, 5] = float("nan")
    model.save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_first_nonfinite_names_the_tensor():
    state = {"optimizers": [{"state": {0: {"exp_avg": torch.zeros(3)}, 1: {"exp_avg": torch.tensor([1.0, float("inf")])}}}]}
    assert first_nonfinite(state) == ("optimizers[0].state.1.exp_avg", "0 NaN and 1 inf among its 2 values")
    assert first_nonfinite({"a": torch.ones(4), "step": torch.tensor(3)}) is None  # integers are never poisoned


def test_from_pretrained_refuses_a_nan(poisoned_ckpt):
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor core\.1\.mlp\.up_proj\.weight holds 1 NaN"):
        RecurrentGPT.from_pretrained(poisoned_ckpt)


def test_a_parents_safetensors_with_an_inf_is_a_surgery_error(tmp_path):
    save_file({"model.embed_tokens.weight": torch.tensor([[1.0, float("-inf")]])}, tmp_path / "model.safetensors")
    with pytest.raises(parents.SurgeryError, match="model.embed_tokens.weight holds 0 NaN and 1 inf"):
        parents.read_weights(str(tmp_path / "model.safetensors"), "download it again")


@pytest.mark.parametrize("script", ["train", "eval"])
def test_scripts_stop_in_one_line_before_any_work(poisoned_ckpt, tmp_path, script):
    data = tmp_path / "depth"
    subprocess.run([sys.executable, "data/depth/prepare.py", "--out_dir", str(data), "--num_train", "200",
                    "--num_dev", "20", "--num_test", "20"], cwd=REPO, check=True, capture_output=True)
    cmd = (["train.py", "--init", str(poisoned_ckpt), "--data", str(data), "--out_dir", str(tmp_path / "run"),
            "--max_iters", "2"] if script == "train" else
           ["eval_math.py", "--init", str(poisoned_ckpt), "--task", "depth", "--data", str(data), "--r", "1",
            "--out_dir", str(tmp_path / "eval")])
    p = subprocess.run([sys.executable, *cmd], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert "up_proj.weight holds 1 NaN" in last and "poisoned" in last
    assert not (tmp_path / "eval" / "results.jsonl").exists()  # nothing written as if it were a result
