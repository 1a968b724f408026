"""
The depth task's chain-of-thought baseline, evaluated by generation: the token side of the comparison
"the loop beats writing the steps out as tokens beyond the trained range" (arXiv 2608.11233).

A looped model answers the S3 running product p_k = g1 g2 ... gk with one token after r loops; a CoT
model (trained on data/depth/prepare.py --cot rows) writes the chain p1 .. pk and answers with its
last token. For each held-out row and each depth k = 1..test_k the prompt is BOS g1..gk SEP (in English,
prepare.py --render english --cot: BOS, the header and instructions 1..k each ending in ".", then SEP) and the
model generates k tokens greedily; the answer is correct when the last one is p_k (the whole chain is scored
too). What it writes is kept for a diagnosis beyond the trained depth: per depth the length of the right
prefix of its chain (where it goes wrong) and how many of its tokens are no answer token at all (a
format failure rather than a wrong product). The records have the depth task's shape (steps, correct per row), so eval_math.py's summary,
table and plots, and experiments/repeat.py's aggregation over seeds, read CoT runs unchanged; the summary adds the
output tokens per answer (mean k here, 1 for the loop) and the whole-chain accuracy.

    python data/depth/prepare.py --cot --out_dir data/depth_cot
    python train.py --config config/cpu_depth.json --static --data data/depth_cot --out_dir out/depth_cot
    python eval_math.py --init out/depth_cot --task depth --data data/depth_cot --out_dir out/eval/depth_cot
    python data/depth/prepare.py --render english --tokenizer smollm2 --cot --out_dir data/depth_english_cot  # in English

eval_math.py dispatches here when the data's meta.json says "cot". Test: python -m pytest -q tests/test_depth_cot.py
"""

import math

import numpy as np
import torch

from plumbing.eval_data import EvalError


def chain_rows(meta, ids):
    """(rows, ends, chains) of the held-out rows: rows (N, T); ends (N, K), the position of the last token of each
    depth's problem (g_k, or in English the "." ending instruction k), so depth k's prompt is rows[i, :ends[i, k-1] + 1]
    then SEP; chains (N, K), the token ids of p1..pK (K = test_max_k). An EvalError when the rows are not the --cot
    layout."""
    K, T = meta["test_max_k"], meta["seq_len"]
    if meta.get("render") == "english":
        return english_chain_rows(meta, ids)
    if T != 2 * K + 2:
        raise EvalError(f"meta.json says cot but seq_len {T} != 2 test_max_k + 2 = {2 * K + 2}: rerun "
                        f"data/depth/prepare.py --cot")
    rows = np.asarray(ids).reshape(-1, T)
    if not ((rows[:, 0] == meta["bos_id"]) & (rows[:, K + 1] == meta["sep_id"])).all():
        raise EvalError(f"the {len(rows)} rows are not BOS g1..g{K} SEP p1..p{K} (meta.json's layout): "
                        f"evaluate full-depth dev or test rows of data/depth/prepare.py --cot")
    ends = np.broadcast_to(np.arange(1, K + 1), (len(rows), K))  # g_k sits at position k
    return rows.astype(np.int64), ends, rows[:, K + 2:].astype(np.int64)


def english_chain_rows(meta, ids):
    """chain_rows of prepare.py --render english --cot rows: BOS, header, K instructions each ending in END, SEP,
    p1..pK; the ends are the instructions' END positions (the header's own "." comes before them)."""
    K, T, H = meta["test_max_k"], meta["seq_len"], len(meta["header_ids"])
    rows = np.asarray(ids).reshape(-1, T).astype(np.int64)
    is_sep = rows == meta["sep_id"]
    sep = is_sep.argmax(1)  # (N,) where each row's chain starts
    ends = [np.flatnonzero(row[1 + H:s] == meta["end_id"]) + 1 + H for row, s in zip(rows, sep)]
    cols = sep[:, None] + 1 + np.arange(K)  # (N, K) the chain's positions
    if (is_sep.sum(1) != 1).any() or any(len(e) != K for e in ends) or (cols >= T).any() or not (
            (rows[:, 0] == meta["bos_id"]) & (rows[:, 1:1 + H] == meta["header_ids"]).all(1)).all():
        raise EvalError(f"the {len(rows)} rows are not BOS, the header, {K} instructions each ending in "
                        f"{meta['end_id']}, SEP, p1..p{K} (meta.json's layout): evaluate full-depth dev or test rows "
                        f"of data/depth/prepare.py --render english --cot")
    return rows, np.stack(ends), np.take_along_axis(rows, cols, axis=1)


@torch.no_grad()
def greedy(model, prompts, n, r):
    """(B, n) greedy tokens after prompts (B, L), all of one length: the whole sequence is re-read for
    every token (no KV cache: a prompt and its chain are at most 2 test_k + 1 tokens)."""
    x = prompts
    for _ in range(n):
        nxt = model(x, num_steps=r)[0][:, -1].argmax(-1)  # (B,) the next token of each row
        x = torch.cat([x, nxt[:, None]], dim=1)
    return x[:, prompts.shape[1]:]


def run_depth_cot(args, model, meta, ids):
    """records (one per held-out row and r: steps 1..K, correct, chain_correct, right_prefix and non_answer per
    depth, output_tokens) and meta. The prompts of one depth k and one length go in batches of --batch_size (in
    symbols every prompt of depth k has k + 2 tokens; in English the instructions differ in length)."""
    rows, ends, chains = chain_rows(meta, ids)
    if args.limit:
        rows, ends, chains = rows[:args.limit], ends[:args.limit], chains[:args.limit]
    (n, K), bs = chains.shape, args.batch_size
    records = []
    for r in args.r:
        torch.manual_seed(args.seed)  # s_0 of a recurrent model is a random draw: the same draws for every r
        last, whole = np.zeros((n, K), dtype=bool), np.zeros((n, K), dtype=bool)
        prefix, other = np.zeros((n, K), dtype=int), np.zeros((n, K), dtype=int)
        for k in range(1, K + 1):
            for length in np.unique(ends[:, k - 1]):
                at = np.flatnonzero(ends[:, k - 1] == length)  # the rows whose depth-k prompt has this length
                prompts = np.concatenate([rows[at, :length + 1], np.full((len(at), 1), meta["sep_id"])], 1)
                for b in range(0, len(at), bs):
                    i = at[b:b + bs]
                    out = greedy(model, torch.from_numpy(prompts[b:b + bs]).to(args.device), k, r).cpu().numpy()  # (B, k)
                    last[i, k - 1] = out[:, -1] == chains[i, k - 1]  # the answer: the chain's last token
                    right = out == chains[i, :k]
                    whole[i, k - 1] = right.all(1)
                    prefix[i, k - 1] = np.where(right.all(1), k, (~right).argmax(1))  # right tokens before the first wrong
                    other[i, k - 1] = (~np.isin(out, meta["answer_ids"])).sum(1)
        steps = list(range(1, K + 1))
        records += [{"index": i, "r": r, "k": K, "steps": steps, "correct": last[i].astype(int).tolist(),
                     "chain_correct": whole[i].astype(int).tolist(), "right_prefix": prefix[i].tolist(),
                     "non_answer": other[i].tolist(), "output_tokens": steps} for i in range(n)]
    return records, meta


def acc_se(flags):
    """(accuracy, standard error sqrt(p(1-p)/n)) of 0/1 flags; nan when there are none."""
    if not len(flags):
        return float("nan"), float("nan")
    p = float(np.mean(flags))
    return p, math.sqrt(p * (1 - p) / len(flags))


def chain_summary(recs, train_max_k):
    """The CoT extras of one r's summary row: whole-chain accuracy by depth and over the trained depths / beyond
    them, and output_tokens_per_answer (the mean tokens generated per answer; the loop answers with 1)."""
    flags = np.array([c for x in recs for c in x["chain_correct"]])
    ks = np.array([k for x in recs for k in x["steps"]])
    out = {"chain_by_k": {str(k): dict(zip(("accuracy", "se"), acc_se(flags[ks == k])), n=int((ks == k).sum()))
                          for k in sorted(set(ks.tolist()))}}
    for name, sel in (("trained", ks <= train_max_k), ("beyond", ks > train_max_k)):
        out[f"chain_accuracy_{name}_depth"], out[f"chain_se_{name}_depth"] = acc_se(flags[sel])
    out["output_tokens_per_answer"] = float(np.mean([t for x in recs for t in x["output_tokens"]]))
    if recs and "right_prefix" in recs[0]:  # what the chains say beyond the trained depth
        prefix = np.array([p for x in recs for p in x["right_prefix"]])
        other = np.array([o for x in recs for o in x["non_answer"]])
        out["chain_diagnosis_by_k"] = {str(k): {"right_prefix": float(prefix[ks == k].mean()),
                                                "wrong_at_trained_depth_plus_1": float((prefix[ks == k] == train_max_k).mean()),
                                                "non_answer_tokens": float(other[ks == k].mean())}
                                       for k in sorted(set(ks.tolist()))}
    return out


def chain_table(rows):
    """The lines eval_math.py's depth table adds for CoT data (columns: r, as above)."""
    cell = lambda x, name: f"{x[f'chain_accuracy_{name}_depth']:>8.3f}+-{x[f'chain_se_{name}_depth']:.3f}"
    return "\n".join(["whole chain right:"] + [f"{name:>6}" + "".join(cell(x, name) for x in rows)
                                                for name in ("trained", "beyond")]
                     + ["tokens" + "".join(f"{x['output_tokens_per_answer']:>15.2f}" for x in rows)
                        + "   (output tokens per answer; the loop answers with 1)"])
