"""
Nemotron-CC-Math (Karimi Mahabadi et al. 2025, arXiv 2508.15096): high-quality math web text
extracted from Common Crawl, NVIDIA's math pretraining corpus, tokenized with the model's
tokenizer.

Why: McLeish et al. 2025 (arXiv 2511.07384) heal on FineWeb-Edu, then train on a mix in which a
third is NVIDIA Nemotron math data, and the extra loops pay off most on math reasoning (GSM8K,
MATH). The hub repo nvidia/Nemotron-CC-Math-v1 is gated: accept NVIDIA's terms on
https://huggingface.co/datasets/nvidia/Nemotron-CC-Math-v1 with your account, then
`hf auth login` (or set HF_TOKEN). It has three subsets (folders of parquet files): 3, 4plus
(higher quality; the default) and 4plus_MIND (synthetic rewrites). This script downloads the
first --num_files files of --subset and keeps the first --num_docs documents. Reading parquet
needs pyarrow (pip install pyarrow; not a core requirement).

Run (needs the Hugging Face Hub and access to the gated repo):
  python data/nemotron_math/prepare.py --tokenizer smollm2 --num_docs 100000
  python data/nemotron_math/prepare.py --tokenizer path/to/ckpt --subset 3 --out_dir /tmp/math
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from data.common import get_tokenizer, hub_parquet_docs, print_summary, run_main, write_text_dataset

REPO_ID = "nvidia/Nemotron-CC-Math-v1"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--tokenizer", default="smollm2",
                        help="checkpoint dir, .gguf file, hub id or short name (smollm2, ...)")
    parser.add_argument("--out_dir", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--subset", default="4plus", choices=["3", "4plus", "4plus_MIND"])
    parser.add_argument("--num_files", type=int, default=1, help="parquet files to download")
    parser.add_argument("--num_docs", type=int, default=100000, help="documents (0 = all)")
    parser.add_argument("--text_field", default="text")
    parser.add_argument("--val_frac", type=float, default=0.005)
    args = parser.parse_args()
    print("config:", json.dumps(vars(args)))

    files, docs = hub_parquet_docs(REPO_ID, args.subset + "/", args.num_files, args.num_docs,
                                   args.text_field, gated=True)
    tok = get_tokenizer(args.tokenizer)
    print(f"source: https://huggingface.co/datasets/{REPO_ID}: {', '.join(files)}")
    meta = write_text_dataset(
        docs, tok, args.out_dir, val_frac=args.val_frac, total=args.num_docs or None,
        meta_extra={"dataset": "nemotron_math", "source": f"{REPO_ID}: {', '.join(files)}",
                    "script": "data/nemotron_math/prepare.py", "tokenizer": args.tokenizer})
    print_summary(args.out_dir, meta, ["train.bin", "val.bin", "meta.json"])


if __name__ == "__main__":
    run_main(main)
