"""The depth task in English (data/depth/prepare.py --render english, data/depth/english.py): the symbol rows'
problems, row for row, as instructions about the positions of three cards, each label the cards' order.

  python -m pytest -q tests/test_depth_english.py
"""

import itertools
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from data.common import check_tokenizer, load_meta, open_split
from data.depth import english
from data.depth import prepare as depth
from plumbing.eval_data import EvalError

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
FLAGS = ["--train_depth", "4", "--test_depth", "7", "--num_train", "400", "--num_dev", "40", "--num_test", "40",
         "--seed", "5"]
TRAIN_D, TEST_D = 4, 7
SPLITS = ("train", "dev", "test")

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# What each instruction means, written independently of english.py as what it does to a list of cards.
MOVES = {
    "Leave them as they are.": lambda c: list(c),
    "Swap the last two.": lambda c: [c[0], c[2], c[1]],
    "Swap the first two.": lambda c: [c[1], c[0], c[2]],
    "Move the first one to the end.": lambda c: c[1:] + c[:1],
    "Move the last one to the front.": lambda c: c[-1:] + c[:-1],
    "Swap the first and the last.": lambda c: [c[2], c[1], c[0]],
}


def prepare(out, *extra):
    r = subprocess.run([sys.executable, "data/depth/prepare.py", "--out_dir", str(out), *FLAGS, *extra], cwd=REPO,
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def dirs(smol_model_dir, tmp_path_factory):
    """Symbol and English data of the same flags, plain and --final_only; and the English run's stdout."""
    d = {name: tmp_path_factory.mktemp(name) for name in ("symbols", "english", "symbols_final", "english_final",
                                                            "symbols_cot", "english_cot")}
    prepare(d["symbols"])
    prepare(d["symbols_final"], "--final_only")
    prepare(d["symbols_cot"], "--cot")
    stdout = prepare(d["english"], "--render", "english", "--tokenizer", str(smol_model_dir))
    prepare(d["english_final"], "--render", "english", "--tokenizer", str(smol_model_dir), "--final_only")
    prepare(d["english_cot"], "--render", "english", "--tokenizer", str(smol_model_dir), "--cot")
    return d, stdout


@pytest.fixture(scope="module")
def tok(smol_model_dir):
    from plumbing.tokenizer import load_tokenizer
    return load_tokenizer(smol_model_dir)


def rows(data_dir, split):
    meta = load_meta(data_dir)
    return [np.asarray(a).reshape(-1, meta["seq_len"]) for a in open_split(data_dir, split, meta)]


def sentences(tok, meta, row_ids):
    """The instructions of one English row as text, read off its tokens (the header and padding checked)."""
    end = int(np.flatnonzero(row_ids != meta["pad_id"])[-1]) + 1
    assert row_ids[0] == meta["bos_id"] and (row_ids[end:] == meta["pad_id"]).all()
    text = tok.decode(row_ids[1:end].tolist())
    assert tok.encode(text) == row_ids[1:end].tolist()  # the parent's own tokenization of that text
    assert text.startswith(english.HEADER + " ")
    return [s + "." for s in text[len(english.HEADER) + 1:].rstrip(".").split(". ")]


# ---------------------------------------------------------------------------------------------
# the order of composition


def test_positional_instructions_compose_in_the_tasks_order():
    """Moving cards by position: instruction g then h leaves the cards in the order g h (prepare.MUL), so the order
    after g1 .. gt is p_t = g1 g2 ... gt. Named-card instructions would give h g, the reversed task."""
    identity = [0, 1, 2]
    for g in depth.ELEMENTS:  # instruction g puts at position i the card that was at position g(i)
        assert tuple(MOVES[english.INSTRUCTIONS[g].strip() + english.END](identity)) == g
    for a, b in itertools.product(range(6), repeat=2):
        moved = MOVES[english.INSTRUCTIONS[depth.ELEMENTS[b]].strip() + "."](
            MOVES[english.INSTRUCTIONS[depth.ELEMENTS[a]].strip() + "."](identity))
        assert tuple(moved) == depth.ELEMENTS[depth.MUL[a][b]]
    assert any(depth.MUL[a][b] != depth.MUL[b][a] for a in range(6) for b in range(6))  # the order matters
    assert [english.answer_word(p) for p in depth.ELEMENTS] == [" AB", " AC", " BA", " BC", " CA", " CB"]


# ---------------------------------------------------------------------------------------------
# the rows


def test_english_rows_are_the_symbol_problems(dirs, tok):
    """Decoded back to elements, every English row is its symbol row, in all three splits; every label is the
    symbol row's answer at the same depth, and it is what moving cards by the row's sentences leaves."""
    d, _ = dirs
    meta, ref = load_meta(d["english"]), load_meta(d["symbols"])
    assert meta["fingerprint"] == tok.fingerprint and meta["render"] == "english"
    check_tokenizer(meta, tok.fingerprint)  # what train.py and eval_math.py check for a SmolLM2 cut
    for key in ("seen_in_train", "dev_redrawn", "test_redrawn", "train_max_k", "test_max_k", "splits"):
        assert meta[key] == ref[key], key
    answers = {a: i for i, a in enumerate(meta["answer_ids"])}
    reversed_differs = False
    for split in SPLITS:
        ids, targets, steps = rows(d["english"], split)
        sids, stargets, ssteps = rows(d["symbols"], split)
        assert len(ids) == len(sids) == meta[f"{split}_docs"]
        for k in range(len(ids)):
            said = sentences(tok, meta, ids[k])
            elems = [depth.ELEMENTS.index(tuple(MOVES[s]([0, 1, 2]))) for s in said]
            assert elems == [int(i) - depth.ELEM_IDS[0] for i in sids[k, 1:]
                             if i in depth.ELEM_IDS]  # the same problem
            lab, slab = targets[k] >= 0, stargets[k] >= 0
            assert steps[k][lab].tolist() == ssteps[k][slab].tolist() == list(range(1, len(elems) + 1))
            got = [answers[int(t)] for t in targets[k][lab]]
            assert got == [int(t) - depth.ANSWER_IDS[0] for t in stargets[k][slab]]  # the same labels
            cards = ["A", "B", "C"]  # the simulation: follow the sentences, read the order after each
            for t, s in enumerate(said):
                cards = MOVES[s](cards)
                assert tok.decode([int(targets[k][lab][t])]) == " " + cards[0] + cards[1]
                backwards = list(depth.ELEMENTS[depth.running_product(elems[:t + 1][::-1])[-1]])
                reversed_differs |= backwards != [ord(c) - ord("A") for c in cards]
    assert reversed_differs  # the reversed product is another task, so the simulation tells the two apart


def test_answers_are_targets_only_and_read_at_each_end(dirs, tok):
    d, stdout = dirs
    meta = load_meta(d["english"])
    assert [tok.decode([a]) for a in meta["answer_ids"]] == [" AB", " AC", " BA", " BC", " CA", " CB"]
    assert [tok.decode(ins) + "." for ins in meta["instruction_ids"]] == meta["tokens"]["instructions"]
    header = len(tok.encode(english.HEADER))
    assert meta["seq_len"] == 1 + header + TEST_D * (1 + max(map(len, meta["instruction_ids"])))
    for split in SPLITS:
        ids, targets, steps = rows(d["english"], split)
        assert not np.isin(ids, meta["answer_ids"]).any()  # no answer is ever input
        assert np.isin(targets[targets >= 0], meta["answer_ids"]).all()
        ends = (ids == meta["end_id"]) & (np.arange(ids.shape[1]) > header)  # each instruction's "."
        assert ((targets >= 0) == ends).all() and ((steps > 0) == ends).all()
        assert (ends.sum(1) == (TRAIN_D if split == "train" else TEST_D)).all()
        written = (ids != meta["pad_id"]).sum(1) + 1  # + the start token (the padding token too)
        assert meta["tokens_per_row"][split] == {"mean": pytest.approx(written.mean()), "max": int(written.max())}
    assert f"English rows of seq_len {meta['seq_len']}" in stdout and "[" in stdout


def test_english_final_only_cuts_the_same_rows(dirs):
    """--final_only: each train row cut at the symbol --final_only row's depth, labeled at that depth's "." with
    the same answer; dev and test as without it."""
    d, _ = dirs
    meta = load_meta(d["english_final"])
    ids, targets, steps = rows(d["english_final"], "train")
    full_ids, full_targets, full_steps = rows(d["english"], "train")
    _, stargets, ssteps = rows(d["symbols_final"], "train")
    assert meta["train_depth_counts"] == load_meta(d["symbols_final"])["train_depth_counts"]
    assert meta["seen_in_train"] == load_meta(d["symbols_final"])["seen_in_train"]
    assert ((targets >= 0).sum(1) == 1).all() and (steps.max(1) == ssteps.max(1)).all()
    answers = {a: i for i, a in enumerate(meta["answer_ids"])}
    for k in range(len(ids)):
        at = int(np.flatnonzero(targets[k] >= 0)[0])
        assert (ids[k, :at + 1] == full_ids[k, :at + 1]).all() and (ids[k, at + 1:] == meta["pad_id"]).all()
        assert targets[k, at] == full_targets[k, at] and steps[k, at] == full_steps[k, at]
        assert answers[int(targets[k, at])] == int(stargets[k][stargets[k] >= 0][0]) - depth.ANSWER_IDS[0]
    for split in ("dev", "test"):
        for a, b in zip(rows(d["english_final"], split), rows(d["english"], split)):
            assert (a == b).all()


def test_english_without_a_tokenizer_is_refused_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "data/depth/prepare.py", "--out_dir", str(tmp_path), "--render", "english"],
                       cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    err = r.stderr.strip().splitlines()
    needle = "--render english writes words of a parent's vocabulary: add --tokenizer (e.g. --tokenizer smollm2)"
    assert r.returncode == 1 and len(err) == 1 and err[0].startswith("error: " + needle), r.stderr
    assert not (tmp_path / "meta.json").exists()


# ---------------------------------------------------------------------------------------------
# evaluation: eval_math.py reads accuracy by depth from the English rows unchanged


def test_eval_math_reads_english_rows_by_depth(dirs, smol_model_dir, tmp_path):
    import eval_math
    from model import RecurrentGPT

    d, _ = dirs
    summary = eval_math.main(["--init", str(smol_model_dir), "--task", "depth", "--data", str(d["english"]), "--split",
                              "test", "--limit", "5", "--r", "1,2", "--threads", "1", "--out_dir", str(tmp_path)])
    assert summary["train_max_k"] == TRAIN_D and summary["split"] == "test"
    ids, targets, steps = (a[:5] for a in rows(d["english"], "test"))
    model = RecurrentGPT.from_pretrained(smol_model_dir).eval()
    for row in summary["results"]:
        assert sorted(row["by_k"], key=int) == [str(k) for k in range(1, TEST_D + 1)]
        with torch.no_grad():
            pred = model(torch.from_numpy(ids.astype(np.int64)), num_steps=row["r"])[0].argmax(-1).numpy()
        for k in range(1, TEST_D + 1):
            assert row["by_k"][str(k)]["n"] == 5
            assert row["by_k"][str(k)]["accuracy"] == pytest.approx(float((pred[steps == k] == targets[steps == k]).mean()))


# ---------------------------------------------------------------------------------------------
# the chain of thought in English (--render english --cot), scored by generation (plumbing/depth_cot.py)


def chain_of(tok, meta, row_ids):
    """(the instructions as text, the words after SEP) of one English chain row, the padding checked."""
    sep = int(np.flatnonzero(row_ids == meta["sep_id"])[0])
    end = int(np.flatnonzero(row_ids != meta["pad_id"])[-1]) + 1
    assert (row_ids[end:] == meta["pad_id"]).all() and not np.isin(row_ids[:sep], meta["answer_ids"]).any()
    return sentences(tok, meta, row_ids[:sep]), [tok.decode([int(i)]) for i in row_ids[sep + 1:end]]


def test_english_chains_are_the_symbol_chains(dirs, tok):
    """Each English chain row is the symbol chain row's problem, cut at the same depth, its words after " =" the
    cards' order after each instruction; targets are next-token on the chain, with its depths."""
    d, _ = dirs
    meta, ref = load_meta(d["english_cot"]), load_meta(d["symbols_cot"])
    assert meta["cot"] and meta["render"] == "english" and [meta["sep_id"]] == tok.encode(" =")
    assert meta["seq_len"] == english.row_len(english.english_vocab(tok, depth.ELEMENTS), TEST_D) + 1 + TEST_D
    for key in ("train_depth_counts", "seen_in_train", "dev_redrawn", "test_redrawn"):
        assert meta[key] == ref[key], key
    for split in SPLITS:
        (ids, targets, steps), (sids, _, ssteps) = rows(d["english_cot"], split), rows(d["symbols_cot"], split)
        for k in range(len(ids)):
            said, words = chain_of(tok, meta, ids[k])
            sep = int(np.flatnonzero(sids[k] == depth.PAD_ID)[0])  # the symbol chain's SEP (PAD in its vocabulary)
            assert [depth.ELEMENTS.index(tuple(MOVES[s]([0, 1, 2]))) for s in said] == \
                   [int(i) - depth.ELEM_IDS[0] for i in sids[k, 1:sep]]
            cards, want = ["A", "B", "C"], []
            for s in said:
                cards = MOVES[s](cards)
                want.append(" " + cards[0] + cards[1])
            assert words == want and (split == "train" or len(words) == TEST_D)
            lab = targets[k] >= 0
            at = int(np.flatnonzero(ids[k] == meta["sep_id"])[0])
            assert np.flatnonzero(lab).tolist() == list(range(at, at + len(words)))
            assert (targets[k][lab] == ids[k][at + 1:at + 1 + len(words)]).all()  # the next word of the chain
            assert steps[k][lab].tolist() == ssteps[k][ssteps[k] > 0].tolist() == list(range(1, len(words) + 1))


class CardOracle(torch.nn.Module):
    """Reads an English chain prompt as text, moves the cards by its instructions and puts all its logit mass on the
    answer word of the next chain position; wrong(k, j) -> True names the next answer in the list instead."""

    def __init__(self, tok, meta, wrong=lambda k, j: False):
        super().__init__()
        self.tok, self.meta, self.wrong, self.calls = tok, meta, wrong, []
        self.config = types.SimpleNamespace(recurrent=True)

    def forward(self, idx, targets=None, num_steps=None):
        self.calls.append((tuple(idx.shape), num_steps))
        logits = torch.zeros(*idx.shape, self.tok.vocab_size)
        for b, row in enumerate(idx.numpy()):
            sep = int(np.flatnonzero(row == self.meta["sep_id"])[0])
            said = sentences(self.tok, self.meta, row[:sep])
            j = len(row) - sep - 1  # chain words written so far
            cards = ["A", "B", "C"]
            for s in said[:j + 1]:
                cards = MOVES[s](cards)
            i = [english.answer_word(p) for p in depth.ELEMENTS].index(" " + cards[0] + cards[1])
            logits[b, -1, self.meta["answer_ids"][(i + self.wrong(len(said), j)) % 6]] = 1.0
        return logits, None

    def inference_flops_per_token(self, r):
        return 0


def test_english_chain_is_scored_by_generation(dirs, tok):
    import eval_math
    from plumbing.depth_cot import chain_rows, run_depth_cot

    d, _ = dirs
    meta = load_meta(d["english_cot"])
    ids = open_split(d["english_cot"], "dev", meta)[0]
    rows_, ends, chains = chain_rows(meta, ids)
    for row, e in zip(rows_[:5], ends[:5]):  # each depth's prompt ends at the "." of its instruction
        assert (row[e] == meta["end_id"]).all() and (np.diff(e) >= 6).all()
        assert len(sentences(tok, meta, row[:e[2] + 1])) == 3
    args = types.SimpleNamespace(r=[1], limit=12, batch_size=4, seed=0, device="cpu", task="depth", split="dev",
                                 split_name="dev")
    model = CardOracle(tok, meta)
    records, _ = run_depth_cot(args, model, meta, ids)
    [row] = eval_math.summarize(args, model, records, meta)
    assert all(c["accuracy"] == 1.0 and c["n"] == 12 for c in row["by_k"].values())
    assert row["chain_accuracy_beyond_depth"] == 1.0 and row["output_tokens_per_answer"] == (TEST_D + 1) / 2
    # each row's prompt at each depth k, extended k times (prompts of one length to a batch, or no tensor is made)
    assert sum(shape[0] for shape, _ in model.calls) == sum(12 * k for k in range(1, TEST_D + 1))
    # a wrong last word beyond depth 3: the answer right up to depth 3 only, the chain too
    records, _ = run_depth_cot(args, CardOracle(tok, meta, wrong=lambda k, j: k > 3 and j == k - 1), meta, ids)
    [row] = eval_math.summarize(args, model, records, meta)
    assert {k: c["accuracy"] for k, c in row["by_k"].items()} == {str(k): float(k <= 3) for k in range(1, TEST_D + 1)}
    bad = np.asarray(ids).reshape(-1, meta["seq_len"]).copy()
    bad[2, bad[2] == meta["sep_id"]] = meta["end_id"]
    with pytest.raises(EvalError, match="not BOS, the header, 7 instructions"):
        chain_rows(meta, bad)


# ---------------------------------------------------------------------------------------------
# eval_math.py --choices: each label read among a few words


def test_choices_read_labels_among_the_answer_words(dirs, smol_model_dir, tmp_path):
    import eval_math
    from model import RecurrentGPT

    d, _ = dirs
    meta = load_meta(d["english"])
    sym_ids = load_meta(d["symbols"])["answer_ids"]  # the task's own ids here; any six distinct ids stand for the words
    ids, targets, steps = (a[:5] for a in rows(d["english"], "test"))
    model = RecurrentGPT.from_pretrained(smol_model_dir).eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(ids.astype(np.int64)), num_steps=2)[0]
    lab = targets >= 0
    answers = np.asarray(meta["answer_ids"])
    for choices, read in (("answers", answers), (",".join(map(str, sym_ids)), np.asarray(sym_ids))):
        summary = eval_math.main(["--init", str(smol_model_dir), "--task", "depth", "--data", str(d["english"]), "--split",
                                  "test", "--limit", "5", "--r", "2", "--threads", "1", "--choices", choices,
                                  "--out_dir", str(tmp_path / choices[:7])])
        guess = answers[logits[torch.from_numpy(lab)][:, torch.from_numpy(read)].argmax(-1).numpy()]
        right = guess == targets[lab]
        for k in range(1, TEST_D + 1):
            assert summary["results"][0]["by_k"][str(k)]["accuracy"] == pytest.approx(right[steps[lab] == k].mean())
    for bad, needle in (("1,2,3", "needs 6 distinct token ids"), ("answers,x", "'answers' or comma-separated")):
        with pytest.raises(EvalError, match=needle):
            eval_math.main(["--init", str(smol_model_dir), "--task", "depth", "--data", str(d["english"]), "--limit", "2",
                            "--r", "1", "--threads", "1", "--choices", bad, "--out_dir", str(tmp_path / "bad")])
    with pytest.raises(EvalError, match="not chains of thought"):
        eval_math.main(["--init", str(smol_model_dir), "--task", "depth", "--data", str(d["english_cot"]), "--limit", "2",
                        "--r", "1", "--threads", "1", "--choices", "answers", "--out_dir", str(tmp_path / "cot")])
