"""
Any local folder of text, tokenized with the model's tokenizer: bring your own healing or
fine-tuning corpus (the recipe of McLeish et al. 2025, arXiv 2511.07384, heals the looped model
with ordinary language modelling on generic text; any text works on a CPU).

Input: every *.txt file under --input (recursively, sorted by path) is one document; every line
of every *.jsonl file is one document, its text in --text_field (default "text"). Documents are
separated as the parent model expects (data/common.py) and go wholly to train or val.

Run:
  python data/local/prepare.py --input my_texts/ --tokenizer smollm2      # writes data/local/
  python data/local/prepare.py --input my_texts/ --tokenizer path/to/ckpt --out_dir /tmp/mine
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from data.common import DataError, get_tokenizer, jsonl_rows, print_summary, run_main, write_text_dataset


def find_files(root):
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"--input {root} is not a directory")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".txt", ".jsonl"))
    if not files:
        raise DataError(f"no .txt or .jsonl files under {root}")
    return files


def documents(files, text_field):
    """Yield one string per .txt file and per .jsonl line."""
    for path in files:
        if path.suffix == ".txt":
            yield path.read_text(encoding="utf-8", errors="replace")
            continue
        for lineno, row in jsonl_rows(path):
            if not isinstance(row, dict) or not isinstance(row.get(text_field), str):
                raise DataError(f"{path}:{lineno}: no string field {text_field!r} (pass --text_field)")
            yield row[text_field]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--input", required=True, help="folder of .txt / .jsonl files")
    parser.add_argument("--tokenizer", default="smollm2",
                        help="checkpoint dir, .gguf file, hub id or short name (smollm2, ...)")
    parser.add_argument("--out_dir", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--text_field", default="text", help="field of each .jsonl line")
    parser.add_argument("--val_frac", type=float, default=0.05)
    parser.add_argument("--limit", type=int, default=0, help="first N documents only (0 = all)")
    args = parser.parse_args()
    print("config:", json.dumps(vars(args)))

    files = find_files(args.input)
    print(f"source: {len(files)} files under {args.input}")
    tok = get_tokenizer(args.tokenizer)
    docs = documents(files, args.text_field)
    if args.limit:
        docs = (d for _, d in zip(range(args.limit), docs))
    meta = write_text_dataset(
        docs, tok, args.out_dir, val_frac=args.val_frac,
        meta_extra={"dataset": "local", "source": str(Path(args.input).resolve()),
                    "script": "data/local/prepare.py", "tokenizer": args.tokenizer})
    print_summary(args.out_dir, meta, ["train.bin", "val.bin", "meta.json"])


if __name__ == "__main__":
    run_main(main)
