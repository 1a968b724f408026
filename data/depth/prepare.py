"""
Synthetic depth task: the running product of a sequence of elements of the permutation group S3.

Why: the recipe's claim (McLeish et al. 2025, arXiv 2511.07384; Geiping et al. 2025,
arXiv 2502.05171) is that more loops of the recurrent core buy more accuracy on problems that
need more sequential steps. This task makes the depth of a problem exact and controllable, so the
claim can be tested on a CPU with a tiny model trained from scratch, including extrapolation beyond
the trained depth (train rows have depth train_depth, dev and test rows go to test_depth).

Row layout (seq_len = test_depth + 1 tokens, one row per problem):
  input   BOS  g1   g2      ...  gd        PAD ...
  target  -1   p1   p2      ...  pd        -1  ...     p_t = g1 g2 ... g_t  (an answer token)
  depth   0    1    2       ...  d         0   ...     the sequential steps label t needs (DIR/*_step.bin)
The answer tokens only ever appear as targets, never in the input: with plain next-token teacher
forcing the input would show p_{t-1}, and each label would be a single composition p_{t-1} g_t,
needing no depth at all. Here the model must compose all t elements itself. S3 is non-abelian,
so the order matters (no counting shortcut); calibrated on a 2-core CPU: an h=64 model learns it within
minutes, and accuracy rises with test-time loops. Pointer chasing and mod-10 arithmetic did not learn
at that budget.

Splits (arXiv 2608.11233's protocol: everything that chooses reads dev, the report reads test):
- train: num_train rows of depth exactly train_depth. Attention is causal, so a row of depth D already
  holds every shallower problem as a prefix (its label at depth t), and shallower rows would only add
  padding.
- dev: num_dev rows of depth test_depth, drawn after train from the same generator; steps, learning rates,
  r and thresholds are chosen on it (train.py evaluates on it). A dev row whose first train_depth elements
  occur in a train row is redrawn, and so is one whose prefix another dev row has.
- test: num_test rows of depth test_depth from a generator of its own (seeded by [seed, 1]: the train and
  dev bytes do not depend on it), redrawn when its first train_depth elements occur in train or dev or
  earlier in test. Read once, for the report.
So at depths >= train_depth no dev or test problem occurs in training. At a depth below it they mostly do:
there are only 6^d problems of depth d (7,776 at d = 5) against num_train rows, each of which holds one
of them as its prefix. meta.json's "seen_in_train" gives, per split and depth, the fraction of rows whose
problem of that depth occurs in training with its answer as a label; "unseen" is said only where it is 0.

In a parent's own vocabulary (--tokenizer, for a retrofitted model such as SmolLM2): the same
rows, each element and each answer one token of that vocabulary (WORDS below: element i is the
word " a".." f", its product the capital " A".." F"), the row's first token the parent's document
start (tokenizer.document_separator: <|endoftext|> for SmolLM2, BOS for Llama-3), padding the same
token (it only ever follows the last label, so causal attention never reads it for a label), and
meta.json carrying the tokenizer's fingerprint, so train.py and eval_math.py accept the data for
models of that parent only.

Final answers only (--final_only, a true outcome-only loss): the same train problems, each row cut to a
depth d uniform in 1..train_depth (seeded, drawn after dev) and labeled at its final answer p_d only, so
no intermediate product of a problem is ever a label. Dev and test rows stay fully labeled (accuracy is
still read at every depth). Against per-loop supervision (train.py --step_supervision) it tests whether
extrapolation needs the intermediate labels.

Chain of thought (--cot), the token baseline the loop is compared with (arXiv 2608.11233: "the loop
beats writing the steps out as tokens beyond the trained range"): the same train, dev and test problems,
each written out as its chain, trained by plain next-token prediction on the chain
(seq_len = 2 test_depth + 2):
  input   BOS  g1 .. gd  SEP  p1   ..  p_{d-1}  pd   PAD ...
  target  -1   -1 .. -1  p1   p2   ..  pd       -1   -1  ...
  depth   0    0  .. 0   1    2    ..  d        0    0   ...
Here the answers do appear in the input: each label is one composition p_{t-1} g_t of what is written,
and the depth comes from generating the chain at test time (eval_math.py --task depth generates it
greedily on this data, plumbing/depth_cot.py). Train rows are cut to depths uniform in 1..train_depth
(the draws of --final_only): with causal attention a loop row of depth D holds every shallower problem
as a prefix, a CoT row does not (problem d's chain starts at the SEP after g_d, which only a row cut at d
has), so each trained depth needs rows of its own. Dev and test rows keep depth test_depth; the
evaluation cuts the prompt BOS g1..gd SEP per depth. SEP is the PAD token in the task's own vocabulary and
the parent's " =" with --tokenizer.

In English (--render english, with a parent's --tokenizer; data/depth/english.py): the same train, dev and test
problems, row for row, each element an instruction about the positions of three cards (" Swap the first two.",
" Move the last one to the front.", ...) and each answer one word naming the cards' order (" AB" .. " CB": the
first two cards, which fix the third; chance 1/6), read at the "." ending instruction t, with the same depth in
{split}_step.bin. Rows are 14 + 7 d tokens on average in SmolLM2 (56 at depth 6, 98 at depth 12) in a
seq_len of 110 at test_depth 12: about eight times the symbol rows. With --final_only too, the train rows are cut
and labeled as above. With --cot the instructions are followed by SEP and the answer words p1 .. pd (the chain
written out; english.py has the layout), train rows cut as above.

The reversed rule (--rule reversed), the second task of arXiv 2608.11233's interference test: the same problems
composed in the other order, p_t = g_t ... g_2 g_1 = g_t p_{t-1}, each row starting with a marker (REVERSE_WORD,
PAD in the task's own vocabulary) instead of BOS so that a model can tell the rules apart; --rule both draws each
row's rule by a fair coin (a mix of the two tasks; every split).

Run:
  python data/depth/prepare.py --out_dir data/depth          # 50k train rows, 1k dev rows, 1k test rows
  python data/depth/prepare.py --out_dir /tmp/depth --train_depth 6 --test_depth 12 --num_train 20000
  python data/depth/prepare.py --tokenizer smollm2 --out_dir data/depth_smollm2   # SmolLM2's tokens
  python data/depth/prepare.py --cot --out_dir data/depth_cot   # the same problems as chains of thought
  python data/depth/prepare.py --final_only --out_dir data/depth_final   # final answers only
  python data/depth/prepare.py --rule reversed --out_dir data/depth_reversed   # the products in the other order
  python data/depth/prepare.py --render english --tokenizer smollm2 --out_dir data/depth_english  # in English
  python data/depth/prepare.py --render english --tokenizer smollm2 --cot --out_dir data/depth_english_cot
Writes DIR/{train,dev,test}.bin (uint16 ids), DIR/{split}_targets.bin (int32, -1 = ignore),
DIR/{split}_step.bin (uint8: the depth of each label) and DIR/meta.json (format: data/common.py).
The old flag names --train_k, --test_k and --num_val still work.
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
from data.depth import english

# -----------------------------------------------------------------------------
# The group S3: the 6 permutations of (0, 1, 2), in lexicographic order (index 0 = identity).
ELEMENTS = tuple(itertools.permutations(range(3)))
IDENTITY = 0


def compose(a, b):
    """(a b)(i) = a(b(i)): apply b first, then a (function composition)."""
    return tuple(a[b[i]] for i in range(3))


# MUL[i][j] = index of ELEMENTS[i] composed with ELEMENTS[j]
MUL = tuple(tuple(ELEMENTS.index(compose(a, b)) for b in ELEMENTS) for a in ELEMENTS)


def running_product(elems, reverse=False):
    """Pure-Python reference: [p_1, ..., p_k] with p_t = g_1 g_2 ... g_t (element indices); reverse: the
    other order, p_t = g_t ... g_2 g_1."""
    out, p = [], IDENTITY
    for g in elems:
        p = MUL[g][p] if reverse else MUL[p][g]
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


# --rule reversed: a reversed row's first token, so that one model can be told the two rules apart (the rules
# must be tellable in a mix: the same problem has different labels). In the task's own vocabulary it is PAD
# (free there for the reason above); in a parent's, this word.
REVERSE_WORD = " reverse"


def parent_marker(tok):
    """The id of REVERSE_WORD in `tok`; one-line error if it is not one token there or is a task word."""
    enc = tok.encode(REVERSE_WORD)
    if len(enc) != 1 or REVERSE_WORD in WORDS[0] + WORDS[1]:
        raise DataError(f"{REVERSE_WORD!r} is {len(enc)} tokens in {tok.source}, not one: --rule needs a "
                        f"single-token marker (edit REVERSE_WORD in {__file__})")
    return enc[0]


def vocab_fingerprint():
    """Hash of the vocabulary description: data and model must agree on it like on a tokenizer."""
    desc = {"task": "s3_running_product", "tokens": TOKENS, "composition": "(a b)(i) = a(b(i))"}
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


def products(elems, reverse=None):
    """(N, k) element indices -> (N, k) running products p_t = g1 g2 ... g_t, vectorized over rows; reverse
    (N,) bool: those rows in the other order, p_t = g_t ... g2 g1 (--rule)."""
    mul = np.asarray(MUL, dtype=np.int64)
    prods = np.empty_like(elems)
    p = np.full(len(elems), IDENTITY, dtype=np.int64)
    back = np.zeros(len(elems), dtype=bool) if reverse is None else np.asarray(reverse, dtype=bool)
    for t in range(elems.shape[1]):  # the k sequential steps
        p = np.where(back, mul[elems[:, t], p], mul[p, elems[:, t]])
        prods[:, t] = p
    return prods


def make_rows(elems, seq_len, vocab=(BOS_ID, ELEM_IDS, ANSWER_IDS, PAD_ID), dtype=np.uint16, reverse=None,
              marker=None):
    """(N, k) element indices -> ids, targets, steps arrays of shape (N, seq_len); vocab =
    (bos, element ids, answer ids, pad), the task's own by default; reverse (N,) bool: those rows labeled by
    the reversed rule and starting with `marker` instead of bos (--rule)."""
    bos, elem_ids, answer_ids, pad = (np.asarray(v, dtype=np.int64) for v in vocab)
    n, k = elems.shape
    prods = products(elems, reverse)
    ids = np.full((n, seq_len), pad, dtype=dtype)
    ids[:, 0] = bos if reverse is None else np.where(reverse, marker, bos)
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


def make_final_rows(elems, depths, seq_len, vocab, dtype=np.uint16):
    """(N, D) element indices and each row's own depth d (N,) -> ids, targets, depth arrays (N, seq_len): the
    row cut to BOS g1..gd, labeled at its final answer p_d only (--final_only)."""
    ids, targets, steps = make_rows(elems, seq_len, vocab, dtype)
    col, d = np.arange(seq_len)[None, :], np.asarray(depths)[:, None]
    ids[col > d] = np.asarray(vocab[3], dtype=ids.dtype)  # PAD after g_d
    targets[col != d] = IGNORE_INDEX
    steps[col != d] = 0
    return ids, targets, steps


def prefix_codes(elems):
    """Each row's elements as one base-6 integer (for the disjointness checks)."""
    return elems @ (6 ** np.arange(elems.shape[1], dtype=np.int64))


def draw_heldout(rng, num, test_depth, train_depth, seen):
    """num rows of test_depth elements whose first train_depth elements are not in `seen` (codes) nor shared
    by two rows: at depths >= train_depth none of their problems occurs in `seen`'s rows. Returns the rows
    and how many candidates were redrawn."""
    total = 6 ** train_depth
    if total - len(seen) < num:
        raise DataError(f"only {total - len(seen)} depth-{train_depth} prefixes are not in train (or dev): "
                        f"lower --num_train, --num_dev or --num_test, or raise --train_depth")
    seen = np.fromiter(seen, dtype=np.int64)
    rows, redrawn, have = [], 0, 0
    while have < num:
        cand = rng.integers(0, 6, size=(2 * num, test_depth), dtype=np.int64)
        codes = prefix_codes(cand[:, :train_depth])
        ok = ~np.isin(codes, seen)
        _, first = np.unique(codes, return_index=True)  # distinct prefixes within these rows, too
        ok &= np.isin(np.arange(len(cand)), first)
        redrawn += int((~ok).sum())
        rows.append(cand[ok])
        seen = np.concatenate([seen, codes[ok]])
        have += int(ok.sum())
    return np.concatenate(rows)[:num], redrawn


def seen_in_train(train, trained_depths, rows):
    """Per depth d = 1..D of `rows` (N, D): the fraction of rows whose depth-d problem g1..gd occurs in training
    with its answer as a label. A full train row labels every prefix up to its depth; a row cut to depth d
    (trained_depths, --cot and --final_only) labels only its depth-d problem."""
    out = []
    for d in range(1, rows.shape[1] + 1):
        if d > train.shape[1]:
            out.append(0.0)
            continue
        have = train[:, :d] if trained_depths is None else train[trained_depths == d, :d]
        out.append(float(np.isin(prefix_codes(rows[:, :d]), prefix_codes(have)).mean()))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out_dir", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--tokenizer", default="", help="render the task in a parent's vocabulary "
                        "(checkpoint dir, .gguf, hub id or short name such as smollm2); "
                        "default: the task's own 14 tokens")
    parser.add_argument("--train_depth", "--train_k", dest="train_depth", type=int, default=6,
                        help="depth of every train row")
    parser.add_argument("--test_depth", "--test_k", dest="test_depth", type=int, default=12,
                        help="depth of the dev and test rows (> train_depth measures extrapolation)")
    parser.add_argument("--num_train", type=int, default=50000)
    parser.add_argument("--num_dev", "--num_val", dest="num_dev", type=int, default=1000)
    parser.add_argument("--num_test", type=int, default=0, help="test rows (default: as many as dev)")
    parser.add_argument("--seed", type=int, default=1337, help="train and dev draws; test draws from [seed, 1]")
    parser.add_argument("--render", choices=("symbols", "english"), default="symbols", help="symbols: one token "
                        "per element and answer; english: each element an instruction about the positions of three "
                        "cards, each answer one word (needs --tokenizer; data/depth/english.py)")
    parser.add_argument("--rule", choices=("forward", "reversed", "both"), default="forward", help="forward: p_t = "
                        "g1 .. gt; reversed: the other order, p_t = gt .. g1, each row starting with a marker token "
                        "instead of BOS; both: each row's rule drawn by a fair coin (symbol rows only)")
    labels = parser.add_mutually_exclusive_group()
    labels.add_argument("--cot", action="store_true", help="the same problems as chains of thought "
                        "(BOS g1..gd SEP p1..pd), train rows cut to depths uniform in 1..train_depth")
    labels.add_argument("--final_only", action="store_true", help="train rows cut to depths uniform in "
                        "1..train_depth and labeled at their final answer only (outcome-only loss)")
    args = parser.parse_args()
    args.num_test = args.num_test or args.num_dev
    print("config:", json.dumps(vars(args)))
    in_english = args.render == "english"
    if in_english and not args.tokenizer:
        raise DataError("--render english writes words of a parent's vocabulary: add --tokenizer (e.g. --tokenizer smollm2)")
    if not 1 <= args.train_depth <= args.test_depth <= 255:  # depths are stored as uint8
        raise DataError(f"need 1 <= train_depth <= test_depth <= 255, got {args.train_depth}, {args.test_depth}")
    if min(args.num_train, args.num_dev, args.num_test) < 1:
        raise DataError("--num_train, --num_dev and --num_test must be >= 1")
    if args.rule != "forward" and (in_english or args.cot or args.final_only):
        raise DataError(f"--rule {args.rule} writes symbol rows with every label: drop --render english, --cot "
                        "and --final_only")

    if args.tokenizer:  # checked first: a bad tokenizer fails before any work
        tok = get_tokenizer(args.tokenizer)
        sep_id = parent_sep(tok) if args.cot else None
        marker_id = parent_marker(tok) if args.rule != "forward" else None
        vocab = english.english_vocab(tok, ELEMENTS, sep_id) if in_english else parent_vocab(tok)
        dtype = token_dtype(tok.vocab_size)
        words = english.words(ELEMENTS) if in_english else {"elements": WORDS[0], "answers": WORDS[1]}
        tokens = dict(tokenizer=args.tokenizer, fingerprint=tok.fingerprint, vocab_size=tok.vocab_size,
                      tokens=words, dtype=np.dtype(dtype).name)
        if args.cot:
            tokens["tokens"]["separator"] = COT_SEP_WORD
    else:
        vocab, dtype = (BOS_ID, ELEM_IDS, ANSWER_IDS, PAD_ID), np.uint16
        sep_id = PAD_ID  # (see COT_SEP_WORD)
        marker_id = PAD_ID  # (see REVERSE_WORD)
        tokens = dict(tokenizer="depth task vocabulary", fingerprint=vocab_fingerprint(),
                      vocab_size=VOCAB_SIZE, tokens=TOKENS, dtype="uint16")
    bos_id, answer_ids, pad_id = vocab[0], vocab[-2], vocab[-1]  # every rendering: (bos, .., answer ids, pad)
    if in_english:  # an instruction is several tokens, the "." after it marks where its answer is read
        element_meta = {"header_ids": [int(i) for i in vocab[1]], "end_id": int(vocab[3]),
                        "instruction_ids": [list(map(int, ins)) for ins in vocab[2]]}
    else:
        element_meta = {"element_ids": [int(i) for i in vocab[1]]}

    rng = np.random.default_rng(args.seed)
    # one seq_len for every split
    if in_english:  # the instructions, and with --cot SEP and the chain after them
        seq_len = english.row_len(vocab, args.test_depth) + (1 + args.test_depth if args.cot else 0)
    else:
        seq_len = 2 * args.test_depth + 2 if args.cot else args.test_depth + 1
    train = rng.integers(0, 6, size=(args.num_train, args.train_depth), dtype=np.int64)
    train_codes = set(prefix_codes(train).tolist())
    dev, dev_redrawn = draw_heldout(rng, args.num_dev, args.test_depth, args.train_depth, train_codes)
    cut = args.cot or args.final_only
    # drawn last from this generator: the problems above are the same whatever the rendering
    train_depths = rng.integers(1, args.train_depth + 1, size=args.num_train) if cut else None
    test, test_redrawn = draw_heldout(np.random.default_rng([args.seed, 1]), args.num_test, args.test_depth,
                                      args.train_depth, train_codes | set(prefix_codes(dev[:, :args.train_depth]).tolist()))
    held_out = {"dev": dev, "test": test}
    full = lambda elems: np.full(len(elems), args.test_depth)
    if args.cot and in_english:
        chains = lambda e, d: english.make_english_cot_rows(e, products(e), d, seq_len, vocab, sep_id, dtype)
        rows = {"train": chains(train, train_depths), **{s: chains(e, full(e)) for s, e in held_out.items()}}
    elif args.cot:
        rows = {"train": make_cot_rows(train, train_depths, seq_len, vocab, sep_id, dtype),
                **{s: make_cot_rows(e, full(e), seq_len, vocab, sep_id, dtype) for s, e in held_out.items()}}
    elif in_english:
        in_words = lambda e, d, final=False: english.make_english_rows(e, products(e), d, seq_len, vocab, final, dtype)
        rows = {"train": in_words(train, train_depths, True) if args.final_only
                else in_words(train, np.full(len(train), args.train_depth)),
                **{s: in_words(e, full(e)) for s, e in held_out.items()}}
    elif args.rule != "forward":  # drawn after every problem (and from generators of their own for dev and test)
        coin = {"train": rng, "dev": np.random.default_rng([args.seed, 2]), "test": np.random.default_rng([args.seed, 3])}
        back = lambda s, e: (np.ones(len(e), dtype=bool) if args.rule == "reversed"
                             else coin[s].random(len(e)) < 0.5)
        rows = {s: make_rows(e, seq_len, vocab, dtype, back(s, e), marker_id)
                for s, e in {"train": train, **held_out}.items()}
    else:
        rows = {"train": make_final_rows(train, train_depths, seq_len, vocab, dtype) if args.final_only
                else make_rows(train, seq_len, vocab, dtype),
                **{s: make_rows(e, seq_len, vocab, dtype) for s, e in held_out.items()}}

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
    for suffix in ("", "_targets", "_step"):  # an older layout's validation split, now dev
        (out_dir / f"val{suffix}.bin").unlink(missing_ok=True)

    seen = {s: seen_in_train(train, train_depths, e) for s, e in held_out.items()}
    meta = {
        "dataset": "depth", "task": "s3_running_product", "script": "data/depth/prepare.py",
        "source": "generated by data/depth/prepare.py (no download)",
        **tokens, "bos_id": int(bos_id), "eos_id": None, "pad_id": int(pad_id),
        **element_meta, "answer_ids": [int(i) for i in answer_ids],
        "elements": [list(e) for e in ELEMENTS], "mul_table": [list(r) for r in MUL],
        "composition": "(a b)(i) = a(b(i)); label at depth t is g1 g2 ... gt",
        "seq_len": seq_len, "train_max_k": args.train_depth, "test_max_k": args.test_depth,
        "targets": True, "steps": True, "targets_dtype": "int32", "steps_dtype": "uint8",
        "ignore_index": IGNORE_INDEX, "seed": args.seed, "test_seed": [args.seed, 1], "splits": list(rows),
        **{f"{s}_tokens": int(len(a[0]) * seq_len) for s, a in rows.items()},
        **{f"{s}_docs": int(len(a[0])) for s, a in rows.items()},
        "heldout_prefix_disjoint": True, "dev_redrawn": dev_redrawn, "test_redrawn": test_redrawn,
        "seen_in_train": {s: {str(d + 1): f for d, f in enumerate(fr)} for s, fr in seen.items()},
    }
    if args.rule != "forward":
        meta.update({"rule": args.rule, "reverse_marker_id": int(marker_id),
                     "reversed_rows": {s: int((a[0][:, 0] == marker_id).sum()) for s, a in rows.items()},
                     "composition": "(a b)(i) = a(b(i)); label at depth t is " + (
                         "gt ... g2 g1; every row starts with the marker" if args.rule == "reversed" else
                         "g1 g2 ... gt after BOS, gt ... g2 g1 after the marker (a fair coin per row)")})
    if cut:
        meta["train_depth_counts"] = np.bincount(train_depths, minlength=args.train_depth + 1)[1:].tolist()
    if args.final_only:
        meta.update({"final_only": True, "layout": "train: BOS g1..gd PAD.., one label p_d at g_d's position, d "
                     "uniform in 1..train_max_k; dev and test: every label, depth test_max_k"})
    if args.cot:
        meta.update({
            "cot": True, "sep_id": int(sep_id),
            "layout": "BOS g1..gd SEP p1..pd PAD..; target p_t at the position before p_t (SEP for p1), "
                      "depth t there; train d uniform in 1..train_max_k, dev and test d = test_max_k",
            "composition": "(a b)(i) = a(b(i)); the chain after SEP is p1 .. pd, p_t = g1 g2 ... gt",
        })
    if in_english:
        written = {s: english.tokens_per_row(a[1], args.cot) for s, a in rows.items()}
        meta.update({
            "render": "english", "tokens_per_row": {s: {"mean": float(w.mean()), "max": int(w.max())}
                                                    for s, w in written.items()},
            "layout": ("BOS header, then instructions g1..gd each ending in END, SEP, p1..pd, PAD..; target p_t at "
                       "the position before p_t (SEP for p1), depth t there; train d uniform in 1..train_max_k, dev "
                       "and test d = test_max_k" if args.cot else
                       "BOS header, then instructions g1..gd each ending in END, PAD..; target p_t at the END of "
                       "instruction t, depth t there" + ("; train: d uniform in 1..train_max_k, labeled at the "
                                                         "last END only" if args.final_only else "")),
            "composition": "(a b)(i) = a(b(i)); label at depth t is g1 g2 ... gt; instruction g puts at position i "
                           "the card that was at position g(i), so the cards' order after instruction t is p_t",
        })
    write_meta(out_dir, meta)
    print(f"redrew {dev_redrawn} dev and {test_redrawn} test candidates whose first {args.train_depth} elements "
          f"were in train or an earlier held-out row")
    print("problems that occur in training, by depth: "
          + "; ".join(f"{s} " + " ".join(f"{f:.2f}" for f in fr) for s, fr in seen.items()))
    if in_english:
        print(f"English rows of seq_len {seq_len} (padding included); tokens written per row: " + ", ".join(
            f"{s} {w.mean():.1f} on average (max {w.max()})" for s, w in written.items()))
        if args.cot:
            row = rows["dev"][0][0]
            print("a dev row, its chain after the separator:\n  " + tok.decode([int(i) for i in row[row != pad_id]]))
        else:
            print("three train rows, each label as [answer] after the \".\" it is read at:\n" + "\n".join(
                english.show_row(tok, rows["train"][0][i], rows["train"][1][i]) for i in range(3)))
    print_summary(out_dir, meta, files + ["meta.json"])


if __name__ == "__main__":
    run_main(main)
