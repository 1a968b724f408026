"""
The inputs of eval_math.py: GSM8K and MATH problems from a local jsonl or the Hugging Face hub, and
the prepared .bin splits of the depth task and the loss.

GSM8K (Cobbe et al. 2021, arXiv 2110.14168) rows have question/answer ("... #### 18"); MATH
(Hendrycks et al. 2021, arXiv 2103.03874) rows have problem/solution, and MATH-500 (the subset of
Lightman et al. 2023, arXiv 2305.20050) an answer too (see eval_math.math_gold). Every way a file
can be wrong (missing, bad JSON, a row without a field, the hub offline, data of another tokenizer)
is one EvalError line naming the file (and line); problems load before the model, so a bad row fails
first. Nothing here decides what is evaluated or how: a reader of eval_math.py may skip it.

    from plumbing.eval_data import load_problems
    test, train = load_problems(eval_math.parse_args(["--init", "x", "--task", "gsm8k", "--data", "DIR"]))

Test: python -m pytest -q tests/test_eval_math.py
"""

from pathlib import Path


class EvalError(Exception):
    """An expected failure (bad input, missing file, hub offline): printed as one line, no traceback."""


ROW_KEYS = {"gsm8k": ("question", "answer"), "math": ("problem", "solution")}


def checked_rows(numbered, keys, where):
    """[(line or row number, row)] -> [row]; a one-line EvalError naming the file and line of bad JSON
    (data.common.jsonl_rows) or of the first row without one of keys."""
    from data.common import DataError
    rows = []
    try:
        for n, row in numbered:
            missing = [k for k in keys if not isinstance(row, dict) or k not in row]
            if missing:
                raise EvalError(f"{where}:{n}: the row has no {missing[0]!r} (rows need {' and '.join(keys)}): "
                                "fix the row or pass another --data")
            rows.append(row)
    except (DataError, UnicodeDecodeError) as e:
        raise EvalError(f"{e}: fix the file or pass another --data") from None
    return rows


def local_split(data, split, keys):
    """A jsonl file (the test split; train.jsonl beside it) or a dir with {split}.jsonl."""
    path = Path(data)
    if path.is_dir():
        path = path / f"{split}.jsonl"
    elif split != "test":
        path = path.with_name(f"{split}.jsonl")
    if not path.is_file():
        raise EvalError(f"{path} not found (--data takes a jsonl file or a dir with {split}.jsonl)")
    from data.common import jsonl_rows
    return checked_rows(jsonl_rows(path), keys, path)


def hub_rows(repo_id, want, keys):
    """Rows of the hub files whose names satisfy want(name): jsonl directly, parquet through pyarrow."""
    from data.common import DataError, hub_download, hub_list_files, jsonl_rows, require_pyarrow
    try:
        files = [f for f in hub_list_files(repo_id, "", (".jsonl", ".parquet")) if want(f)]
        if not files:
            raise EvalError(f"no matching data files in {repo_id}")
        rows = []
        for name in files:
            local = hub_download(repo_id, name)
            numbered = jsonl_rows(local) if name.endswith(".jsonl") else \
                enumerate(require_pyarrow().read_table(local).to_pylist(), 1)
            rows += checked_rows(numbered, keys, f"{repo_id}/{name}")
        return rows
    except DataError as e:
        raise EvalError(f"{e} (or pass --data PATH to a local jsonl)") from None


def load_problems(args):
    """(test rows, train rows for exemplars) with fields question/answer (gsm8k) or problem/solution
    (math; MATH-500 rows have an answer too)."""
    keys = ROW_KEYS[args.task]
    if args.task == "gsm8k":
        get = (lambda s: local_split(args.data, s, keys)) if args.data else \
            (lambda s: hub_rows("openai/gsm8k", lambda f: f.startswith(f"main/{s}-"), keys))
        return get("test"), (get("train") if args.shots else [])
    if args.data:
        rows = local_split(args.data, "test", keys)
    elif args.math_set == "math500":
        rows = hub_rows("HuggingFaceH4/MATH-500", lambda f: f == "test.jsonl", keys)
    else:
        rows = hub_rows("EleutherAI/hendrycks_math", lambda f: "/test-" in f, keys)
    return rows, []


def load_bin(args, model):
    """(meta, ids, targets, steps) of --split in --data (data/<set>/prepare.py's format, see
    data/common.py), checked against the model's vocabulary and, for text data, its tokenizer. Sets
    args.split_name: the split's own name ("dev" for --split val on the depth task)."""
    from data.common import check_tokenizer, load_meta, open_split, resolve_split
    if not args.data:
        raise EvalError(f"--task {args.task} needs --data DIR (a dir written by data/<set>/prepare.py)")
    try:
        meta = load_meta(args.data)
        if meta["vocab_size"] > model.config.vocab_size:
            raise ValueError(f"data vocab {meta['vocab_size']} > model vocab {model.config.vocab_size}")
        tok_path = Path(args.tok_path)
        if tok_path.suffix == ".gguf" or any((tok_path / f).exists() for f in ("tokenizer.json", "tokenizer.model", "original")):
            from plumbing.tokenizer import load_tokenizer  # text data: same tokenizer as the model, or the loss is noise
            check_tokenizer(meta, load_tokenizer(args.tok_path).fingerprint, args.data, args.init)
        args.split_name = resolve_split(meta, args.split)
        return (meta,) + open_split(args.data, args.split, meta)
    except (FileNotFoundError, ValueError) as e:
        raise EvalError(str(e)) from None
