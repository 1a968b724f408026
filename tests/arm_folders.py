"""Arm folders as experiments/repeat.py leaves them, made by hand from 0/1 correctness per (seed, r, test row, depth):
what the study tests (test_english_study.py, test_retrofit_seeds.py) read their reports from."""

import json

import numpy as np

from experiments import repeat
from experiments.claims import Arm

SEEDS = (1337, 2, 3, 4, 5)
ROWS, RS = 30, (1, 8, 32)


def fake_arm(out, name, correct, seeds=SEEDS, cot=False):
    """An arm folder as repeat.py leaves it: per seed eval/results.jsonl and eval/summary.json from correct(seed, r) ->
    (ROWS, 12) 0/1 by test row and depth, a log.jsonl with one train step, and the arm's summary.json with
    repeat.aggregate's table. A chain of thought (cot) is evaluated at r = 1 only."""
    d = out / "arms" / name
    summaries = []
    for s in seeds:
        ev = d / f"seed_{s}" / "eval"
        ev.mkdir(parents=True)
        recs, results = [], []
        for r in (1,) if cot else RS:
            c = np.asarray(correct(s, r), dtype=int)
            recs += [{"index": j, "r": r, "k": 12, "steps": list(range(1, 13)), "correct": row.tolist()}
                     for j, row in enumerate(c)]
            results.append({"r": r, "by_k": {str(k): {"accuracy": float(c[:, k - 1].mean())} for k in range(1, 13)},
                            "accuracy_trained_depth": float(c[:, :6].mean()),
                            "accuracy_beyond_depth": float(c[:, 6:].mean()),
                            **({"output_tokens_per_answer": 6.5} if cot else {})})
        (ev / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
        (ev / "summary.json").write_text(json.dumps({"results": results}))
        (d / f"seed_{s}" / "log.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0, "flops": 1e12, "elapsed": 9.0}) + "\n")
        summaries.append({"results": results})
    (d / "summary.json").write_text(json.dumps({"table": repeat.aggregate(summaries), "seeds": list(seeds),
                                                "command": f"fake {name}"}))
    return Arm(out, name)


def draws(p, seed_shift=0.0):
    """correct(seed, r): 0/1 with probability p (+ seed_shift * seed index) at every depth, fixed per seed and r."""
    def correct(s, r):
        rng = np.random.default_rng([SEEDS.index(s), r])
        return rng.random((ROWS, 12)) < p + seed_shift * SEEDS.index(s)
    return correct
