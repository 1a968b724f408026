"""
GSM8K (Cobbe et al. 2021, arXiv 2110.14168) grade-school math word problems as training data,
tokenized with the model's tokenizer, optionally with a loss mask so only answer tokens count.

Why: McLeish et al. 2025 (arXiv 2511.07384) evaluate the retrofitted recurrent models on GSM8K
and train on math data; test-time loops should help most on such multi-step reasoning. Each
problem becomes
  "Q: {question}\nA: Let's think step by step. {answer}"
where answer is the dataset's worked solution ending in "#### <number>". With --answer_only the
prompt is not trained on: every problem is one row of --seq_len tokens (padded), and
DIR/{split}_targets.bin labels only the predictions of answer tokens and the closing EOS
(-1 elsewhere), so the model learns to answer and to stop rather than to write questions.
A row is [BOS] prompt answer EOS pad...: the BOS head only when the parent's pretraining put
BOS before documents (data/common.py separator(): Llama-3, TinyLlama; not SmolLM2, Qwen2.5,
OLMo-2, whose documents ended in <|endoftext|>), and the answer always closes with the
tokenizer's EOS (eos_id, SmolLM2-Instruct's <|im_end|>): the token an instruct model stops on.
Without it the problems are plain documents (next-token loss on everything), separated like
every text set (data/common.py).

Source: the train split of openai/gsm8k on the Hugging Face Hub (parquet; needs pip install
pyarrow), or a local jsonl with fields question/answer via --jsonl. The test split is for
evaluation only; val here is a held-out slice (--val_frac) of train.

Run:
  python data/gsm8k/prepare.py --tokenizer smollm2 --answer_only              # from the hub
  python data/gsm8k/prepare.py --jsonl path/to/gsm8k/train.jsonl --answer_only --limit 500
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from data.common import (IGNORE_INDEX, SPLITS, BinWriter, DataError, get_tokenizer, hub_download,
                         is_val_doc, jsonl_rows, print_summary, remove_stale, require_pyarrow,
                         run_main, separator, token_dtype, write_meta, write_text_dataset)

REPO_ID = "openai/gsm8k"
TRAIN_FILE = "main/train-00000-of-00001.parquet"  # config "main", split "train"
PROMPT = "Q: {question}\nA: Let's think step by step."


def format_example(question, answer):
    """(prompt, completion): the text the model sees and the text it is trained to produce."""
    return PROMPT.format(question=question), " " + answer


def read_jsonl(path):
    rows = []
    for lineno, row in jsonl_rows(path):
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
            raise DataError(f"{path}:{lineno}: needs string fields 'question' and 'answer'")
        rows.append((row["question"], row["answer"]))
    return rows


def read_hub():
    """The train split of openai/gsm8k (config 'main') from the hub."""
    path = hub_download(REPO_ID, TRAIN_FILE)  # 2 MB; served from the cache when offline
    pq = require_pyarrow()
    table = pq.read_table(path, columns=["question", "answer"])
    return list(zip(table.column("question").to_pylist(), table.column("answer").to_pylist()))


def answer_only_row(tok, question, answer, sep):
    """ids and targets of one problem (unpadded): targets[t] = ids[t+1] inside the answer.

    sep = separator(tok): a BOS head only when the parent's documents started with BOS; a row
    of an "eos" parent needs no head (it starts like a document after <|endoftext|>).
    """
    prompt, completion = format_example(question, answer)
    kind, sep_id = sep
    head = [sep_id] if kind == "bos" else []
    p_ids, a_ids = tok.encode(prompt), tok.encode(completion)
    ids = head + p_ids + a_ids + [tok.eos_id]  # EOS closes the answer: the model learns to stop
    targets = [IGNORE_INDEX] * len(ids)
    start = len(head) + len(p_ids)  # index of the first answer token
    for t in range(start - 1, len(ids) - 1):  # the prediction made AT t is token t+1
        targets[t] = ids[t + 1]
    return ids, targets


def write_answer_only(examples, tok, out_dir, seq_len, val_frac, meta_extra):
    from tqdm import tqdm

    if tok.eos_id is None:
        raise DataError("--answer_only needs a tokenizer with an EOS token to end answers")
    sep = separator(tok)
    dtype = token_dtype(tok.vocab_size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids_w = {s: BinWriter(out_dir / f"{s}.bin", dtype) for s in SPLITS}
    tgt_w = {s: BinWriter(out_dir / f"{s}_targets.bin", np.int32) for s in SPLITS}
    rows = {s: 0 for s in SPLITS}
    labels = {s: 0 for s in SPLITS}
    too_long = 0
    writers = list(ids_w.values()) + list(tgt_w.values())
    try:
        for i, (q, a) in enumerate(tqdm(examples, desc="tokenizing", unit="problem")):
            ids, targets = answer_only_row(tok, q, a, sep)
            if len(ids) > seq_len:
                too_long += 1  # dropped, not truncated: a cut answer would teach a wrong ending
                continue
            pad = seq_len - len(ids)
            split = "val" if is_val_doc(i, val_frac) else "train"
            ids_w[split].write(np.asarray(ids + [tok.eos_id] * pad))  # padding is never a target
            tgt_w[split].write(np.asarray(targets + [IGNORE_INDEX] * pad))
            rows[split] += 1
            labels[split] += sum(t != IGNORE_INDEX for t in targets)
        for split in SPLITS:
            if rows[split] == 0:
                raise DataError(f"the {split} split is empty: use more problems or change "
                                f"--val_frac")
    except BaseException:
        for w in writers:
            w.abort()
        raise
    for w in writers:
        w.close()
    remove_stale(out_dir, keep_targets=True, keep_steps=False)
    if too_long:
        print(f"dropped {too_long} problems longer than --seq_len {seq_len}")
    meta = dict(meta_extra)
    meta.update({
        "fingerprint": tok.fingerprint, "vocab_size": tok.vocab_size,
        "dtype": np.dtype(dtype).name, "bos_id": tok.bos_id, "eos_id": tok.eos_id,
        "pad_id": tok.eos_id, "separator": sep[0], "separator_id": sep[1], "val_frac": val_frac,
        "targets": True, "steps": False, "targets_dtype": "int32", "ignore_index": IGNORE_INDEX,
        "seq_len": seq_len, "answer_only": True, "dropped_too_long": too_long,
        "train_tokens": ids_w["train"].count, "val_tokens": ids_w["val"].count,
        "train_docs": rows["train"], "val_docs": rows["val"],
        "train_label_tokens": labels["train"], "val_label_tokens": labels["val"],
    })
    write_meta(out_dir, meta)
    return meta


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--tokenizer", default="smollm2",
                        help="checkpoint dir, .gguf file, hub id or short name (smollm2, ...)")
    parser.add_argument("--out_dir", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--jsonl", default=None, help="local jsonl (question/answer) instead of "
                        "the hub's openai/gsm8k train split")
    parser.add_argument("--answer_only", action="store_true",
                        help="rows of --seq_len with a loss mask on the answer tokens")
    parser.add_argument("--seq_len", type=int, default=512, help="row length for --answer_only")
    parser.add_argument("--val_frac", type=float, default=0.05)
    parser.add_argument("--limit", type=int, default=0, help="first N problems only (0 = all)")
    args = parser.parse_args()
    print("config:", json.dumps(vars(args)))
    if not 0.0 < args.val_frac < 1.0:
        raise DataError(f"--val_frac must be in (0, 1), got {args.val_frac}")

    if args.jsonl:
        if not Path(args.jsonl).is_file():
            raise DataError(f"--jsonl {args.jsonl} not found")
        examples, source = read_jsonl(args.jsonl), str(Path(args.jsonl).resolve())
    else:
        examples, source = read_hub(), f"https://huggingface.co/datasets/{REPO_ID} (train split)"
    if args.limit:
        examples = examples[:args.limit]
    print(f"source: {source}; {len(examples)} problems")
    tok = get_tokenizer(args.tokenizer)
    meta_extra = {"dataset": "gsm8k", "source": source, "script": "data/gsm8k/prepare.py",
                  "tokenizer": args.tokenizer, "prompt": PROMPT}
    if args.answer_only:
        meta = write_answer_only(examples, tok, args.out_dir, args.seq_len, args.val_frac,
                                 meta_extra)
        files = ["train.bin", "train_targets.bin", "val.bin", "val_targets.bin", "meta.json"]
    else:
        docs = ("".join(format_example(q, a)) for q, a in examples)
        meta = write_text_dataset(docs, tok, args.out_dir, val_frac=args.val_frac,
                                  total=len(examples), meta_extra=meta_extra)
        files = ["train.bin", "val.bin", "meta.json"]
    print_summary(args.out_dir, meta, files)


if __name__ == "__main__":
    run_main(main)
