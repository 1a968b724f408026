"""Tests for data/: the on-disk format, the S3 depth task, the text prepare scripts end to end
and the clear offline failures of the hub scripts.

  python -m pytest -q tests/test_data.py
"""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data.common import (DataError, check_tokenizer, is_val_doc, load_meta, open_split,
                         token_dtype)
from data.depth import prepare as depth

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"


def run_script(*args, env=None):
    """Run a prepare script the way a user does, from the repo root, and capture its output."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------------------------------
# the group S3 and the reference labels


def test_s3_table_is_a_nonabelian_group():
    n = len(depth.ELEMENTS)
    mul, e = depth.MUL, depth.IDENTITY
    assert n == 6 and depth.ELEMENTS[e] == (0, 1, 2)
    assert all(mul[a][b] in range(n) for a in range(n) for b in range(n))  # closure
    assert all(mul[e][a] == a == mul[a][e] for a in range(n))  # identity
    assert all(sum(mul[a][b] == e for b in range(n)) == 1 and
               any(mul[a][b] == e == mul[b][a] for b in range(n)) for a in range(n))  # inverses
    for a, b, c in itertools.product(range(n), repeat=3):  # associativity
        assert mul[mul[a][b]][c] == mul[a][mul[b][c]]
    assert any(mul[a][b] != mul[b][a] for a in range(n) for b in range(n))  # non-abelian
    assert all(len(set(row)) == n for row in mul)  # Latin square: each step is a bijection


def test_running_product_matches_brute_force_permutations():
    """Labels equal the composition of the permutations computed independently by sympy."""
    from sympy.combinatorics import Permutation

    rng = np.random.default_rng(0)
    for _ in range(200):
        elems = rng.integers(0, 6, size=int(rng.integers(1, 15))).tolist()
        got = depth.running_product(elems)
        # p_t = g1 g2 ... gt with (a b)(i) = a(b(i)); sympy's p*q applies p first, then q
        ref = Permutation(list(range(3)))
        for t, g in enumerate(elems):
            ref = Permutation(list(depth.ELEMENTS[g])) * ref
            assert depth.ELEMENTS[got[t]] == tuple(ref.array_form)
            # and by applying the permutations to each point, innermost (latest) first
            point_map = []
            for i in range(3):
                for h in reversed(elems[:t + 1]):
                    i = depth.ELEMENTS[h][i]
                point_map.append(i)
            assert depth.ELEMENTS[got[t]] == tuple(point_map)


# ---------------------------------------------------------------------------------------------
# the depth task files


@pytest.fixture(scope="module")
def depth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("depth")
    r = run_script("data/depth/prepare.py", "--out_dir", out, "--train_k", 5, "--test_k", 9,
                   "--num_train", 3000, "--num_val", 300, "--seed", 5)
    assert r.returncode == 0, r.stderr
    return out


def test_depth_format(depth_dir):
    meta = load_meta(depth_dir)
    assert meta["seq_len"] == 10 and meta["train_max_k"] == 5 and meta["test_max_k"] == 9
    assert meta["vocab_size"] == len(meta["tokens"]) == 14 and meta["ignore_index"] == -1
    assert meta["fingerprint"] == depth.vocab_fingerprint() and meta["dtype"] == "uint16"
    for split, n in (("train", 3000), ("val", 300)):
        # raw sizes: uint16 ids, int32 targets, uint8 steps, all n rows of seq_len
        assert (depth_dir / f"{split}.bin").stat().st_size == n * 10 * 2
        assert (depth_dir / f"{split}_targets.bin").stat().st_size == n * 10 * 4
        assert (depth_dir / f"{split}_step.bin").stat().st_size == n * 10
        ids, targets, steps = open_split(depth_dir, split)
        assert ids.dtype == np.uint16 and targets.dtype == np.int32 and steps.dtype == np.uint8
        assert meta[f"{split}_tokens"] == len(ids) == n * 10 and meta[f"{split}_docs"] == n
        ids, targets, steps = (a.reshape(-1, 10) for a in (ids, targets, steps))
        k = meta["train_max_k"] if split == "train" else meta["test_max_k"]
        assert (ids[:, 0] == depth.BOS_ID).all() and (targets[:, 0] == -1).all()
        assert np.isin(ids[:, 1:k + 1], depth.ELEM_IDS).all()
        assert (ids[:, k + 1:] == depth.PAD_ID).all() and (targets[:, k + 1:] == -1).all()
        assert (steps == np.where(targets >= 0, np.arange(10), 0)).all()  # step t at position t
        assert steps.max() == k and ((targets >= 0) == (steps > 0)).all()


def test_depth_labels_and_no_answer_in_input(depth_dir):
    for split in ("train", "val"):
        ids, targets, steps = (a.reshape(-1, 10) for a in open_split(depth_dir, split))
        # the TRAP: no input position may show an answer token (they only appear as targets)
        assert not np.isin(ids, depth.ANSWER_IDS).any()
        assert np.isin(targets[targets >= 0], depth.ANSWER_IDS).all()
        for row_ids, row_t in zip(ids[:50], targets[:50]):
            elems = [int(i) - depth.ELEM_IDS[0] for i in row_ids if i in depth.ELEM_IDS]
            labels = [int(t) - depth.ANSWER_IDS[0] for t in row_t if t >= 0]
            assert labels == depth.running_product(elems)
        # every label from step 2 on needs the whole prefix: given the visible element g_t
        # alone, all 6 answers occur (no one-step shortcut); train has ~500 rows per cell
        for t in range(2, steps.max() + 1 if split == "train" else 2):
            for g in depth.ELEM_IDS:
                assert len(set(targets[ids[:, t] == g, t].tolist())) == 6


def test_depth_split_by_k_and_unseen_val(depth_dir):
    meta = load_meta(depth_dir)
    _, _, train_steps = open_split(depth_dir, "train")
    _, _, val_steps = open_split(depth_dir, "val")
    assert set(np.unique(train_steps)) == set(range(0, 6))
    assert set(np.unique(val_steps)) == set(range(0, 10))
    # every depth 1..test_k is measured equally often in val
    assert (np.bincount(val_steps, minlength=10)[1:] == 300).all()
    # val problems are unseen: their first train_k elements never start a train row
    tr = open_split(depth_dir, "train")[0].reshape(-1, 10)[:, 1:6]
    va = open_split(depth_dir, "val")[0].reshape(-1, 10)[:, 1:6]
    assert not set(map(bytes, tr)) & set(map(bytes, va)) and meta["val_prefix_disjoint"]


def test_depth_deterministic_and_bad_flags(tmp_path, depth_dir):
    r = run_script("data/depth/prepare.py", "--out_dir", tmp_path, "--train_k=5", "--test_k=9",
                   "--num_train=3000", "--num_val=300", "--seed=5")  # --key=value form too
    assert r.returncode == 0, r.stderr
    for name in ("train.bin", "val_targets.bin", "val_step.bin"):
        assert (tmp_path / name).read_bytes() == (depth_dir / name).read_bytes()
    r = run_script("data/depth/prepare.py", "--out_dir", tmp_path, "--train_k", 8, "--test_k", 4)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "error: need 1 <= train_k <= test_k <= 255, got 8, 4"]
    r = run_script("data/depth/prepare.py", "--out_dir", tmp_path, "--num_trian", 5)
    assert r.returncode == 2 and "unrecognized arguments: --num_trian" in r.stderr


# ---------------------------------------------------------------------------------------------
# the shared loader


def test_token_dtype_and_val_split():
    assert token_dtype(49152) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(128256) == np.uint32
    val = [i for i in range(100) if is_val_doc(i, 0.05)]
    assert val == [19, 39, 59, 79, 99]  # exactly floor(n f), evenly spread
    assert sum(is_val_doc(i, 0.1) for i in range(1234)) == 123


def test_check_tokenizer_and_open_split_errors(tmp_path, depth_dir):
    meta = load_meta(depth_dir)
    check_tokenizer(meta, depth.vocab_fingerprint())  # same vocabulary: no error
    with pytest.raises(ValueError) as e:
        check_tokenizer(meta, "0123abcd", data_dir=str(depth_dir), model_tokenizer="smollm2")
    msg = str(e.value)
    assert "\n" not in msg and str(depth_dir) in msg and "0123abcd" in msg
    assert "rerun python data/depth/prepare.py --tokenizer" in msg
    with pytest.raises(FileNotFoundError, match="prepare.py"):
        load_meta(tmp_path)
    # label file of another length (a stale file from another run) is refused
    for name in ("meta.json", "train.bin", "train_step.bin"):
        (tmp_path / name).write_bytes((depth_dir / name).read_bytes())
    (tmp_path / "train_targets.bin").write_bytes((depth_dir / "val_targets.bin").read_bytes())
    with pytest.raises(ValueError, match="different runs"):
        open_split(tmp_path, "train")


# ---------------------------------------------------------------------------------------------
# hub scripts: without the hub they fail with one clear line


@pytest.mark.parametrize("script,needle", [
    ("data/fineweb_edu/prepare.py", "HuggingFaceFW/fineweb-edu"),
    ("data/nemotron_math/prepare.py", "is gated: accept its terms"),
    ("data/gsm8k/prepare.py", "openai/gsm8k"),
])
def test_hub_scripts_offline_fail_with_one_line(tmp_path, script, needle):
    r = run_script(script, "--out_dir", tmp_path, env={"HF_HUB_OFFLINE": "1"})
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and "Traceback" not in r.stderr
    assert err[0].startswith("error: cannot download") and "HF_HUB_OFFLINE" in err[0]
    assert needle in err[0] and not (tmp_path / "meta.json").exists()


def test_missing_pyarrow_message():
    try:
        import pyarrow  # noqa: F401
        pytest.skip("pyarrow is installed here")
    except ImportError:
        pass
    from data.common import require_pyarrow
    with pytest.raises(DataError, match=r"needs pyarrow: pip install pyarrow"):
        require_pyarrow()
