"""A damaged JSON file in a checkpoint directory or a --config: the scripts' one-line error names the file and
what to do. A tiny run of train.py (seconds) makes the checkpoint directory.

    python -m pytest -q tests/test_files.py
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
BROKEN = '{"a": 1\n"b"'


def run(script, *args, cwd=REPO):
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True)


@pytest.fixture(scope="module")
def ckpt(depth_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("files") / "run"
    p = run("train.py", "--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2", "--batch_size=8",
            "--eval_iters=1", "--eval_r=1,2", "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=2",
            "--eval_interval=2")
    assert p.returncode == 0, p.stderr[-2000:]
    return out


def one_line(p):
    err = p.stderr.strip()  # sample.py prints its configuration first: the error is the last line, alone
    assert p.returncode != 0 and "Traceback" not in err and err.splitlines()[-1].startswith("error: "), err
    return err.splitlines()[-1]


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_damaged_checkpoint_file_is_named(ckpt, tmp_path, name):
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    (bad / name).write_text(BROKEN)
    err = one_line(run("sample.py", "--init", str(bad), "--r", "2", "--max_new_tokens", "2", "--prompt", " a b"))
    assert f"{bad / name} is not valid JSON" in err and "repair it" in err


def test_damaged_config_file_is_named(depth_dir, tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(BROKEN)
    err = one_line(run("train.py", "--config", str(cfg), "--data", str(depth_dir), "--out_dir", str(tmp_path / "o")))
    assert f"{cfg} is not valid JSON" in err


def test_no_checkpoint_says_how_to_get_one(tmp_path):
    (tmp_path / "out").mkdir()
    err = one_line(run("sample.py", "--r", "32", cwd=tmp_path))
    assert "not a checkpoint directory" in err and "train.py" in err and "--init" in err


def test_damaged_meta_json_is_named(depth_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(depth_dir, data)
    (data / "meta.json").write_text(BROKEN)
    err = one_line(run("train.py", "--init=scratch", "--data", str(data), "--out_dir", str(tmp_path / "o")))
    assert f"{data / 'meta.json'} is not valid JSON" in err and "prepare.py" in err


def test_damaged_parent_config_is_named(tmp_path):
    parent = tmp_path / "parent"  # a directory in the Hugging Face layout whose config.json is cut short
    parent.mkdir()
    (parent / "config.json").write_text(BROKEN)
    p = run("surgery.py", "--init", str(parent), "--shape", "1,1,1", "--out", str(tmp_path / "o"))
    err = p.stderr.strip()
    assert p.returncode != 0 and len(err.splitlines()) == 1 and err.startswith("surgery.py: error: "), err
    assert f"{parent / 'config.json'} is not valid JSON" in err


def test_damaged_manifest_is_named_and_resume_says_what_to_do(ckpt, tmp_path, depth_dir):
    from plumbing import checkpoint

    bad = tmp_path / "run"
    shutil.copytree(ckpt, bad, symlinks=True)
    save = Path(os.path.realpath(bad / "config.json")).parent
    (save / checkpoint.MANIFEST).write_text(BROKEN)
    assert f"{checkpoint.MANIFEST} is not valid JSON" in checkpoint.verify(str(save))
    err = one_line(run("train.py", "--resume", "--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2",
                       "--batch_size=8", "--eval_iters=1", "--eval_r=1,2", "--data", str(depth_dir),
                       "--out_dir", str(bad), "--max_iters=3", "--eval_interval=2"))
    assert checkpoint.MANIFEST in err and "is not valid JSON" in err
