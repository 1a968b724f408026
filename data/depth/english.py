"""
The depth task in English: the S3 running product of data/depth/prepare.py, each element written as an
instruction about the positions of three cards, each answer one word naming the cards' order, all in a
parent's own vocabulary. prepare.py --render english writes it; this file holds the words and the rows.

Why: a retrofitted parent (McLeish et al. 2025, arXiv 2511.07384) meets the symbol rows as twelve arbitrary
tokens; here the same problems are sentences of the language it was pretrained on, so the loops are tested on
the parent's own kind of input. The problems, splits and labels are those of the symbol rows, row for row.

The order of composition. prepare.py composes (a b)(i) = a(b(i)) and labels depth t with
p_t = g1 g2 ... g_t = p_{t-1} g_t. Instruction g says where each card comes FROM: after it, position i holds
the card that was at position g(i), new[i] = old[g(i)]. Cards A, B, C (0, 1, 2) start at positions 0, 1, 2, so
after instructions g1 .. g_t
    row_t[i] = row_{t-1}[g_t(i)] = row_{t-2}[g_{t-1}(g_t(i))] = ... = g1(g2(... g_t(i))) = p_t(i):
the cards read left to right are p_t itself, and positional instructions compose in the task's own order.
An instruction about named cards ("swap A and C") acts on the names instead, new[i] = s(old[i]), and the row
after s1 .. s_t is s_t(... s1(i)) = (s_t ... s1)(i): the reversed product, the reversed task. So every
instruction names positions, never cards (tests/test_depth_english.py checks it by moving cards in a list).

  element  g = (g(0), g(1), g(2))  instruction                        A B C becomes
  0        (0, 1, 2)               " Leave them as they are."          A B C
  1        (0, 2, 1)               " Swap the last two."               A C B
  2        (1, 0, 2)               " Swap the first two."              B A C
  3        (1, 2, 0)               " Move the first one to the end."   B C A
  4        (2, 0, 1)               " Move the last one to the front."  C A B
  5        (2, 1, 0)               " Swap the first and the last."     C B A

The answer after instruction t is the cards' order p_t written as its first two cards, which fix the third:
" AB", " AC", " BA", " BC", " CA", " CB" (the order of the rows above). Each is one token of SmolLM2's
vocabulary and none occurs in the header or an instruction (checked for every tokenizer, a one-line error
otherwise). Six answers: chance is 1/6.

Row layout (one problem a row; H = 13 header tokens in SmolLM2; instruction g_t is n(g_t) = 5..7 tokens
and then its "."):
  input   BOS  Three cards lie in a row: A, B, C.  Swap the first two  .   Move the last one to the front  .   .. PAD ..
  target  -1   -1 ..                                -1 ..               p1  -1 ..                           p2  .. -1
  depth   0    0 ..                                 0 ..                1   0 ..                            2   .. 0
The label of depth t is read at the "." that ends instruction t: its target is the answer word of p_t. As in
the symbol rows the answers are only targets, never input: with plain next-token teacher forcing the row would
read ". BA Move the last ..." and each label would be one move of an order written just before it, needing no
depth. Here the model must follow all t moves itself.

Tokens per row (SmolLM2): seq_len = 1 + H + test_depth (7 + 1) = 110 at test_depth 12, the same for every
split; written before the padding 1 + H + sum_t (n(g_t) + 1), on average 14 + 7 d: 56 for a train row of
depth 6, 98 for a dev or test row of depth 12 (the symbol rows: 7 and 13 in a seq_len of 13).

The chain of thought in English (prepare.py --render english --cot): after the instructions the separator SEP
(prepare.COT_SEP_WORD, " =") and the answer words p1 .. pd written out, trained by next-token prediction on them
(seq_len = 110 + 1 + test_depth = 123 at test_depth 12):
  input   BOS  Three cards lie in a row: A, B, C.  Swap the first two.  ..  SEP  p1  ..  p_{d-1}  pd   PAD ..
  target  -1   -1 ..                                -1 ..                    p1   p2  ..  pd       -1   -1 ..
  depth   0    0 ..                                 0 ..                     1    2   ..  d        0    0 ..
Train rows are cut to the depths of the symbol chains (uniform in 1..train_depth), dev and test rows keep
test_depth; plumbing/depth_cot.py prompts each depth k with the row up to the "." ending instruction k, then SEP,
and scores the k words the model writes (prompts of one depth differ in length: it batches rows of one length).

    python data/depth/prepare.py --render english --tokenizer smollm2 --cot --out_dir data/depth_english_cot

    python data/depth/prepare.py --render english --tokenizer smollm2 --out_dir data/depth_english
    python data/depth/prepare.py --render english --tokenizer smollm2 --num_train 2000 --num_dev 100 --out_dir /tmp/de
Test: python -m pytest -q tests/test_depth_english.py
"""

import numpy as np

from data.common import IGNORE_INDEX, DataError, separator

HEADER = "Three cards lie in a row: A, B, C."
CARDS = "ABC"
# permutation g -> the instruction after which position i holds the card that was at position g(i)
INSTRUCTIONS = {
    (0, 1, 2): " Leave them as they are",
    (0, 2, 1): " Swap the last two",
    (1, 0, 2): " Swap the first two",
    (1, 2, 0): " Move the first one to the end",
    (2, 0, 1): " Move the last one to the front",
    (2, 1, 0): " Swap the first and the last",
}
END = "."  # ends every instruction; the answer of that depth is read here


def answer_word(p):
    """The cards' order p (the card at each position) as its first two cards: (1, 2, 0) -> " BC"."""
    return " " + CARDS[p[0]] + CARDS[p[1]]


def words(elements):
    """What meta.json records of the rendering, elements in prepare.ELEMENTS' order."""
    return {"header": HEADER, "instructions": [INSTRUCTIONS[g] + END for g in elements], "end": END,
            "answers": [answer_word(p) for p in elements]}


def one_token(tok, word):
    enc = tok.encode(word)
    if len(enc) != 1:
        raise DataError(f"{word!r} is {len(enc)} tokens in {tok.source}, not one: --render english needs "
                        f"single-token answers and end mark (edit data/depth/english.py)")
    return enc[0]


def english_vocab(tok, elements, sep=None):
    """(start, header ids, instruction ids per element, end id, answer ids, pad) in the tokenizer `tok`, elements
    in prepare.ELEMENTS' order; a one-line DataError when the answers could be read off the input, or when the chain's
    separator id `sep` (--cot) occurs in the header, an instruction or among the answers."""
    start = separator(tok)[1]  # the parent's document start, also the padding (as in the symbol rows)
    header = tuple(tok.encode(HEADER))
    instructions = tuple(tuple(tok.encode(INSTRUCTIONS[g])) for g in elements)
    end, answers = one_token(tok, END), tuple(one_token(tok, answer_word(p)) for p in elements)
    text = set(header).union(*instructions) | {start}
    if len(set(answers)) != 6 or text & set(answers):
        raise DataError(f"in {tok.source} an answer word is another answer's token or occurs in the header or an "
                        f"instruction: the answers must be targets only (edit data/depth/english.py)")
    if any(end in ins for ins in instructions):
        raise DataError(f"{END!r} occurs inside an instruction in {tok.source}: it must mark the instruction's end only")
    if sep is not None and (sep in text or sep in answers or sep == end):
        raise DataError(f"the chain's separator (id {sep}) occurs in the header, an instruction or the answers in "
                        f"{tok.source}: it must only mark where the chain starts")
    return start, header, instructions, end, answers, start


def row_len(vocab, depth):
    """The longest row of `depth` instructions: BOS, header, each instruction with its end mark."""
    return 1 + len(vocab[1]) + depth * (1 + max(map(len, vocab[2])))


def make_english_rows(elems, prods, depths, seq_len, vocab, final_only=False, dtype=np.uint16):
    """(N, D) element indices, their running products p_t (N, D) and each row's own depth d (N,) -> ids, targets,
    steps (N, seq_len) in the layout of the docstring: instructions g1..gd, target p_t at the "." ending
    instruction t (only at the last one when final_only, prepare.py --final_only)."""
    start, header, instructions, end, answers, pad = vocab
    answers = np.asarray(answers, dtype=np.int64)
    pieces = [np.asarray(ins + (end,), dtype=np.int64) for ins in instructions]  # each instruction with its "."
    n = len(elems)
    ids = np.full((n, seq_len), pad, dtype=np.int64)
    targets = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int32)
    steps = np.zeros((n, seq_len), dtype=np.uint8)
    for i, d in enumerate(depths):
        row = np.concatenate([[start], header, *(pieces[g] for g in elems[i, :d])])
        ends = len(header) + np.cumsum([len(pieces[g]) for g in elems[i, :d]])  # (d,): where each "." is
        ids[i, :len(row)] = row
        t = np.arange(d - 1 if final_only else 0, d)  # the labeled depths, 0-based
        targets[i, ends[t]] = answers[prods[i, t]]
        steps[i, ends[t]] = t + 1
    return ids.astype(dtype), targets, steps


def make_english_cot_rows(elems, prods, depths, seq_len, vocab, sep, dtype=np.uint16):
    """(N, D) element indices, their running products (N, D) and each row's own depth d (N,) -> ids, targets, steps
    (N, seq_len) in the chain layout of the docstring: instructions g1..gd, SEP, the answer words p1..pd; the target
    of the position before p_t (SEP for p1) is p_t, its depth t."""
    start, header, instructions, end, answers, pad = vocab
    answers = np.asarray(answers, dtype=np.int64)
    pieces = [np.asarray(ins + (end,), dtype=np.int64) for ins in instructions]
    n = len(elems)
    ids = np.full((n, seq_len), pad, dtype=np.int64)
    targets = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int32)
    steps = np.zeros((n, seq_len), dtype=np.uint8)
    for i, d in enumerate(depths):
        chain = answers[prods[i, :d]]  # (d,) the answer words p1..pd
        row = np.concatenate([[start], header, *(pieces[g] for g in elems[i, :d]), [sep], chain])
        ids[i, :len(row)] = row
        at = len(row) - d - 1  # the SEP: it predicts p1, p_t predicts p_{t+1}
        targets[i, at:at + d] = chain
        steps[i, at:at + d] = np.arange(1, d + 1)
    return ids.astype(dtype), targets, steps


def tokens_per_row(targets, cot=False):
    """Tokens written before the padding, per row: a row ends with the "." of its last (labeled) instruction, or
    (cot) with the answer word after its last label."""
    lab = np.asarray(targets) != IGNORE_INDEX
    return lab.shape[1] - np.argmax(lab[:, ::-1], axis=1) + int(cot)


def show_row(tok, ids, targets):
    """One row as text, each label written as [answer] after the "." it is read at, the padding left out."""
    out, lab = [], np.flatnonzero(np.asarray(targets) != IGNORE_INDEX)
    for a, b in zip(np.r_[0, lab[:-1] + 1], lab + 1):
        out.append(tok.decode([int(i) for i in ids[a:b]]) + f" [{tok.decode([int(targets[b - 1])]).strip()}]")
    return "".join(out)
