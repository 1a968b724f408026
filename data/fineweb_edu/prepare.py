"""
FineWeb-Edu (Penedo et al. 2024, arXiv 2406.17557): educational web text, the healing data of
the recipe, tokenized with the model's tokenizer.

Why: after surgery the looped model is healed with ordinary language modelling before any task
data; McLeish et al. 2025 (arXiv 2511.07384) use FineWeb-Edu for that phase. This script takes
a sample subset: the first --num_files parquet files of a sample folder of
HuggingFaceFW/fineweb-edu (default sample/10BT; each file holds hundreds of thousands of
documents and is downloaded whole into the huggingface_hub cache), then the first --num_docs
documents of those. Reading parquet needs pyarrow (pip install pyarrow; not a core requirement).
Documents are separated as the parent model expects and go wholly to train or val
(data/common.py). The offline default corpus is data/sotu.

Run (needs the Hugging Face Hub):
  python data/fineweb_edu/prepare.py --tokenizer smollm2 --num_docs 100000   # data/fineweb_edu/
  python data/fineweb_edu/prepare.py --tokenizer ckpt/ --num_files 2 --num_docs 0 --out_dir /tmp/fw
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from data.common import get_tokenizer, hub_parquet_docs, print_summary, run_main, write_text_dataset

REPO_ID = "HuggingFaceFW/fineweb-edu"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--tokenizer", default="smollm2",
                        help="checkpoint dir, .gguf file, hub id or short name (smollm2, ...)")
    parser.add_argument("--out_dir", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--sample", default="sample/10BT",
                        help="folder of the repo to read (sample/10BT, sample/100BT, data/CC-...)")
    parser.add_argument("--num_files", type=int, default=1, help="parquet files to download")
    parser.add_argument("--num_docs", type=int, default=100000, help="documents (0 = all)")
    parser.add_argument("--text_field", default="text")
    parser.add_argument("--val_frac", type=float, default=0.005)
    args = parser.parse_args()
    print("config:", json.dumps(vars(args)))

    files, docs = hub_parquet_docs(REPO_ID, args.sample.rstrip("/") + "/", args.num_files,
                                   args.num_docs, args.text_field)
    tok = get_tokenizer(args.tokenizer)
    print(f"source: https://huggingface.co/datasets/{REPO_ID}: {', '.join(files)}")
    meta = write_text_dataset(
        docs, tok, args.out_dir, val_frac=args.val_frac, total=args.num_docs or None,
        meta_extra={"dataset": "fineweb_edu", "source": f"{REPO_ID}: {', '.join(files)}",
                    "script": "data/fineweb_edu/prepare.py", "tokenizer": args.tokenizer})
    print_summary(args.out_dir, meta, ["train.bin", "val.bin", "meta.json"])


if __name__ == "__main__":
    run_main(main)
