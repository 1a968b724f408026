"""
Synthetic depth task: the running product of k elements of the permutation group S3.

Why: the recipe's claim (McLeish et al. 2025, arXiv 2511.07384; Geiping et al. 2025,
arXiv 2502.05171) is that more loops of the recurrent core buy more accuracy on problems that
need more sequential steps. This task makes "steps" exact and controllable, so the claim can be
tested on a CPU with a tiny model trained from scratch, including extrapolation beyond the
trained depth (train rows have k <= train_k steps, val rows go up to test_k).

Row layout (seq_len = test_k + 1 tokens, one row per problem):
  input   BOS  g1   g2      ...  gk        PAD ...
  target  -1   p1   p2      ...  pk        -1  ...     p_t = g1 g2 ... g_t  (an answer token)
  step    0    1    2       ...  k         0   ...     sequential steps label t needs
The answer tokens only ever appear as targets, never in the input: with plain next-token teacher
forcing the input would show p_{t-1}, and each label would be a single composition p_{t-1} g_t,
needing no depth at all. Here the model must compose all t elements itself. S3 is non-abelian,
so the order matters (no counting shortcut); calibrated on a 2-core CPU: an h=64 model learns it within minutes, and accuracy rises with test-time loops.
Pointer chasing, mod-10 arithmetic and answer-only loss did not learn at that budget.

Train rows all have exactly k = train_k: attention is causal, so a row of length K already
contains every shorter problem as a prefix (its label at step t), and shorter rows would only
add padding. Val rows have k = test_k, giving the same number of labels at every depth
1..test_k; group accuracy by the step array. Val rows whose first train_k elements occur in a
train row are redrawn, so accuracy even at trained depths is measured on unseen problems.

In a parent's own vocabulary (--tokenizer, for a retrofitted model such as SmolLM2): the same
rows, each element and each answer one token of that vocabulary (WORDS below: element i is the
word " a".." f", its product the capital " A".." F"), the row's first token the parent's document
start (tokenizer.document_separator: <|endoftext|> for SmolLM2, BOS for Llama-3), padding the same
token (it only ever follows the last label, so causal attention never reads it for a label), and
meta.json carrying the tokenizer's fingerprint, so train.py and eval_math.py accept the data for
models of that parent only.

Chain of thought (--cot), the token baseline the loop is compared with (arXiv 2608.11233: "the loop
beats writing the steps out as tokens beyond the trained range"): the same train and val problems
(same seed, same draws, the same prefix-disjoint val rule), each written out as its chain, trained by
plain next-token prediction on the chain (seq_len = 2 test_k + 2):
  input   BOS  g1 .. gk  SEP  p1   ..  p_{k-1}  pk   PAD ...
  target  -1   -1 .. -1  p1   p2   ..  pk       -1   -1  ...
  step    0    0  .. 0   1    2    ..  k        0    0   ...
Here the answers do appear in the input: each label is one composition p_{t-1} g_t of what is written,
and the depth comes from generating the chain at test time (eval_math.py --task depth generates it
greedily on this data, plumbing/depth_cot.py). The step is still the task depth t of the label.
Train rows are cut to a prefix of k ~ uniform 1..train_k elements (seeded, drawn after the val rows,
so the problems are those of the loop data): with causal attention a loop row of length K holds every
shorter problem as a prefix, a CoT row does not (problem k's chain starts at the SEP after g_k, which
only a row cut at k has), so each trained depth needs rows of its own. Val rows keep k = test_k; the
evaluation cuts the prompt BOS g1..gk SEP per depth. SEP is the PAD token in the task's own vocabulary
and the parent's " =" with --tokenizer.

Run:
  python data/depth/prepare.py --out_dir data/depth          # 50k train rows, 1k val rows
  python data/depth/prepare.py --out_dir /tmp/depth --train_k 6 --test_k 12 --num_train 20000
  python data/depth/prepare.py --tokenizer smollm2 --out_dir data/depth_smollm2   # SmolLM2's tokens
  python data/depth/prepare.py --cot --out_dir data/depth_cot   # the same problems as chains of thought
Writes DIR/{train,val}.bin (uint16 ids), DIR/{train,val}_targets.bin (int32, -1 = ignore),
DIR/{train,val}_step.bin (uint8) and DIR/meta.json (format: data/common.py).
"""

import argparse
import hashlib
import itertools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from data.common import (IGNORE_INDEX, BinWriter, DataError, get_tokenizer, print_summary,
                         remove_stale, run_main, separator, token_dtype, write_meta)

# -----------------------------------------------------------------------------
# The group S3: the 6 permutations of (0, 1, 2), in lexicographic order (index 0 = identity).
ELEMENTS = tuple(itertools.permutations(range(3)))
IDENTITY = 0


def compose(a, b):
    """(a b)(i) = a(b(i)): apply b first, then a (function composition)."""
    return tuple(a[b[i]] for i in range(3))


# MUL[i][j] = index of ELEMENTS[i] composed with ELEMENTS[j]
MUL = tuple(tuple(ELEMENTS.index(compose(a, b)) for b in ELEMENTS) for a in ELEMENTS)


def running_product(elems):
    """Pure-Python reference: [p_1, ..., p_k] with p_t = g_1 g_2 ... g_t (element indices)."""
    out, p = [], IDENTITY
    for g in elems:
        p = MUL[p][g]
        out.append(p)
    return out


# -----------------------------------------------------------------------------
# The vocabulary: its own, tiny; no external tokenizer.
BOS_ID = 0
ELEM_IDS = tuple(range(1, 7))    # input token of element i is 1 + i
ANSWER_IDS = tuple(range(7, 13))  # label token of product p is 7 + p (never an input)
PAD_ID = 13
TOKENS = (["<bos>"] + ["g" + "".join(map(str, e)) for e in ELEMENTS]
          + ["p" + "".join(map(str, e)) for e in ELEMENTS] + ["<pad>"])
VOCAB_SIZE = len(TOKENS)  # 14


# In a parent's vocabulary: element i -> WORDS[0][i], product p -> WORDS[1][p], each one token.
WORDS = ((" a", " b", " c", " d", " e", " f"), (" A", " B", " C", " D", " E", " F"))


def parent_vocab(tok):
    """(bos, element ids, answer ids, pad) in the tokenizer `tok`; one-line error if a word is not
    one token there."""
    ids = []
    for word in WORDS[0] + WORDS[1]:
        enc = tok.encode(word)
        if len(enc) != 1:
            raise DataError(f"{word!r} is {len(enc)} tokens in {tok.source}, not one: "
                            f"the depth task needs single-token words (edit WORDS in {__file__})")
        ids.append(enc[0])
    start = separator(tok)[1]
    return start, tuple(ids[:6]), tuple(ids[6:]), start


# --cot: the token between the problem and its chain. In the task's own vocabulary it is PAD: a new
# token would change VOCAB_SIZE and the fingerprint, and a model trained on the loop data (whose
# vocabulary train.py and eval_math.py check) could not be fine-tuned on the chains. PAD is free for
# it: it is never a label, and where it pads a row no label comes after it.
COT_SEP_WORD = " ="  # in a parent's vocabulary


def parent_sep(tok):
    """The id of COT_SEP_WORD in `tok`; one-line error if it is not one token there."""
    enc = tok.encode(COT_SEP_WORD)
    if len(enc) != 1:
        raise DataError(f"{COT_SEP_WORD!r} is {len(enc)} tokens in {tok.source}, not one: --cot needs a "
                        f"single-token separator (edit COT_SEP_WORD in {__file__})")
    return enc[0]


def vocab_fingerprint():
    """Hash of the vocabulary description: data and model must agree on it like on a tokenizer."""
    desc = {"task": "s3_running_product", "tokens": TOKENS, "composition": "(a b)(i) = a(b(i))"}
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


def make_rows(elems, seq_len, vocab=(BOS_ID, ELEM_IDS, ANSWER_IDS, PAD_ID), dtype=np.uint16):
    """(N, k) element indices -> ids, targets, steps arrays of shape (N, seq_len); vocab =
    (bos, element ids, answer ids, pad), the task's own by default."""
    bos, elem_ids, answer_ids, pad = (np.asarray(v, dtype=np.int64) for v in vocab)
    n, k = elems.shape
    mul = np.asarray(MUL, dtype=np.int64)
    prods = np.empty_like(elems)
    p = np.full(n, IDENTITY, dtype=np.int64)
    for t in range(k):  # the k sequential steps, vectorized over rows
        p = mul[p, elems[:, t]]
        prods[:, t] = p
    ids = np.full((n, seq_len), pad, dtype=dtype)
    ids[:, 0] = bos
    ids[:, 1:k + 1] = elem_ids[elems]
    targets = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int32)
    targets[:, 1:k + 1] = answer_ids[prods]  # prediction AT position t (holding g_t) is p_t
    steps = np.zeros((n, seq_len), dtype=np.uint8)
    steps[:, 1:k + 1] = np.arange(1, k + 1, dtype=np.uint8)
    return ids, targets, steps


def make_cot_rows(elems, ks, seq_len, vocab, sep, dtype=np.uint16):
    """(N, K) element indices and each row's own k (N,) -> ids, targets, steps (N, seq_len) in the chain
    layout (module docstring): BOS g1..gk SEP p1..pk PAD.., target p_t AT the position before p_t."""
    bos, elem_ids, answer_ids, pad = (np.asarray(v, dtype=np.int64) for v in vocab)
    n, K = elems.shape
    chain = make_rows(elems, K + 1, vocab)[1][:, 1:].astype(np.int64)  # answer ids of p1..pK, (N, K)
    col, k = np.arange(seq_len)[None, :], np.asarray(ks, dtype=np.int64)[:, None]  # (1, T), (N, 1)
    at = lambda i: np.take_along_axis(chain, np.clip(i, 0, K - 1), axis=1)  # answer ids at chain index i
    ids = np.full((n, seq_len), pad, dtype=np.int64)
    ids[:, 0] = bos
    elem = (col >= 1) & (col <= k)
    ids = np.where(elem, elem_ids[np.take_along_axis(elems, np.clip(col - 1, 0, K - 1), axis=1)], ids)
    ids = np.where(col == k + 1, sep, ids)
    ids = np.where((col >= k + 2) & (col <= 2 * k + 1), at(col - k - 2), ids)  # the chain p1..pk
    lab = (col >= k + 1) & (col <= 2 * k)  # SEP .. p_{k-1}: the positions that predict p1 .. pk
    targets = np.where(lab, at(col - k - 1), IGNORE_INDEX).astype(np.int32)
    steps = np.where(lab, col - k, 0).astype(np.uint8)
    return ids.astype(dtype), targets, steps


def prefix_codes(elems):
    """Each row's elements as one base-6 integer (for the train/val disjointness check)."""
    return elems @ (6 ** np.arange(elems.shape[1], dtype=np.int64))


def draw_val(rng, num_val, test_k, train_k, seen):
    """num_val rows of test_k elements whose first train_k elements are not in `seen`."""
    total = 6 ** train_k
    if total - len(seen) < num_val:
        raise DataError(f"only {total - len(seen)} length-{train_k} prefixes are not in train: "
                        f"lower --num_train or --num_val, or raise --train_k")
    seen = np.fromiter(seen, dtype=np.int64)
    rows, redrawn, have = [], 0, 0
    while have < num_val:
        cand = rng.integers(0, 6, size=(2 * num_val, test_k), dtype=np.int64)
        codes = prefix_codes(cand[:, :train_k])
        ok = ~np.isin(codes, seen)
        _, first = np.unique(codes, return_index=True)  # distinct prefixes within val, too
        ok &= np.isin(np.arange(len(cand)), first)
        redrawn += int((~ok).sum())
        rows.append(cand[ok])
        seen = np.concatenate([seen, codes[ok]])
        have += int(ok.sum())
    return np.concatenate(rows)[:num_val], redrawn


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out_dir", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--tokenizer", default="", help="render the task in a parent's vocabulary "
                        "(checkpoint dir, .gguf, hub id or short name such as smollm2); "
                        "default: the task's own 14 tokens")
    parser.add_argument("--train_k", type=int, default=6, help="steps per train row")
    parser.add_argument("--test_k", type=int, default=12, help="steps per val row (> train_k "
                        "measures extrapolation)")
    parser.add_argument("--num_train", type=int, default=50000)
    parser.add_argument("--num_val", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--cot", action="store_true", help="the same problems as chains of thought "
                        "(BOS g1..gk SEP p1..pk), train rows cut to k uniform in 1..train_k")
    args = parser.parse_args()
    print("config:", json.dumps(vars(args)))
    if not 1 <= args.train_k <= args.test_k <= 255:  # steps are stored as uint8
        raise DataError(f"need 1 <= train_k <= test_k <= 255, got {args.train_k}, {args.test_k}")
    if args.num_train < 1 or args.num_val < 1:
        raise DataError("--num_train and --num_val must be >= 1")

    if args.tokenizer:  # checked first: a bad tokenizer fails before any work
        tok = get_tokenizer(args.tokenizer)
        vocab, dtype = parent_vocab(tok), token_dtype(tok.vocab_size)
        tokens = dict(tokenizer=args.tokenizer, fingerprint=tok.fingerprint, vocab_size=tok.vocab_size,
                      tokens={"elements": WORDS[0], "answers": WORDS[1]}, dtype=np.dtype(dtype).name)
        sep_id = parent_sep(tok) if args.cot else None
        if args.cot:
            tokens["tokens"]["separator"] = COT_SEP_WORD
    else:
        vocab, dtype = (BOS_ID, ELEM_IDS, ANSWER_IDS, PAD_ID), np.uint16
        sep_id = PAD_ID  # (see COT_SEP_WORD)
        tokens = dict(tokenizer="depth task vocabulary", fingerprint=vocab_fingerprint(),
                      vocab_size=VOCAB_SIZE, tokens=TOKENS, dtype="uint16")
    bos_id, elem_ids, answer_ids, pad_id = vocab

    rng = np.random.default_rng(args.seed)
    seq_len = 2 * args.test_k + 2 if args.cot else args.test_k + 1  # one seq_len for both splits
    train = rng.integers(0, 6, size=(args.num_train, args.train_k), dtype=np.int64)
    val, redrawn = draw_val(rng, args.num_val, args.test_k, args.train_k,
                            set(prefix_codes(train).tolist()))
    if args.cot:  # drawn last: the problems above are those of the loop data
        train_ks = rng.integers(1, args.train_k + 1, size=args.num_train)
        rows = {"train": make_cot_rows(train, train_ks, seq_len, vocab, sep_id, dtype),
                "val": make_cot_rows(val, np.full(len(val), args.test_k), seq_len, vocab, sep_id, dtype)}
    else:
        rows = {split: make_rows(elems, seq_len, vocab, dtype) for split, elems in (("train", train), ("val", val))}

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for split, arrays in rows.items():
        for suffix, arr in zip(("", "_targets", "_step"), arrays):
            w = BinWriter(out_dir / f"{split}{suffix}.bin", arr.dtype)
            w.write(arr.ravel())
            w.close()
            files.append(f"{split}{suffix}.bin")
    remove_stale(out_dir, keep_targets=True, keep_steps=True)

    meta = {
        "dataset": "depth", "task": "s3_running_product", "script": "data/depth/prepare.py",
        "source": "generated by data/depth/prepare.py (no download)",
        **tokens, "bos_id": int(bos_id), "eos_id": None, "pad_id": int(pad_id),
        "element_ids": [int(i) for i in elem_ids], "answer_ids": [int(i) for i in answer_ids],
        "elements": [list(e) for e in ELEMENTS], "mul_table": [list(r) for r in MUL],
        "composition": "(a b)(i) = a(b(i)); label at step t is g1 g2 ... gt",
        "seq_len": seq_len, "train_max_k": args.train_k, "test_max_k": args.test_k,
        "targets": True, "steps": True, "targets_dtype": "int32", "steps_dtype": "uint8",
        "ignore_index": IGNORE_INDEX, "seed": args.seed,
        "train_tokens": int(train.shape[0] * seq_len), "val_tokens": int(val.shape[0] * seq_len),
        "train_docs": int(train.shape[0]), "val_docs": int(val.shape[0]),
        "val_prefix_disjoint": True, "val_redrawn": redrawn,
    }
    if args.cot:  # only then: without --cot meta.json stays byte for byte what it was
        meta.update({
            "cot": True, "sep_id": int(sep_id),
            "layout": "BOS g1..gk SEP p1..pk PAD..; target p_t at the position before p_t (SEP for p1), "
                      "step t there; train k uniform in 1..train_max_k, val k = test_max_k",
            "train_k_counts": np.bincount(train_ks, minlength=args.train_k + 1)[1:].tolist(),
            "composition": "(a b)(i) = a(b(i)); the chain after SEP is p1 .. pk, p_t = g1 g2 ... gt",
        })
    write_meta(out_dir, meta)
    print(f"redrew {redrawn} val candidates whose first {args.train_k} elements were seen in train "
          f"or earlier in val")
    print_summary(out_dir, meta, files + ["meta.json"])


if __name__ == "__main__":
    run_main(main)
