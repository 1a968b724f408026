"""
What the data sets share: the on-disk format (nanoGPT-style flat .bin files plus
meta.json) written by data/<set>/prepare.py and read by train.py and the eval scripts.

Format (see notes in each prepare.py):
  DIR/train.bin, DIR/val.bin   flat token ids, dtype meta["dtype"] ("uint16" | "uint32"); the depth task
                               has three splits instead (meta["splits"]): train.bin, dev.bin (what
                               chooses steps, lr, r, thresholds) and test.bin (read for the report)
  DIR/meta.json                tokenizer fingerprint, vocab_size, dtype, token/document counts,
                               bos_id, eos_id, separator ("bos" | "eos": the document
                               separator goes before | after each document, see separator())
                               and separator_id, and meta["targets"] / meta["steps"] flags
  DIR/{split}_targets.bin      (only when meta["targets"]) int32 label of the prediction made
                               AT each position, -1 = ignore; the files are then whole rows of
                               meta["seq_len"] tokens
  DIR/{split}_step.bin         (only when meta["steps"], the depth task) uint8: sequential steps
                               the label at that position needs, 0 = unlabeled

Reading, e.g. in train.py:
  from data.common import load_meta, open_split, check_tokenizer
  meta = load_meta("data/sotu")
  check_tokenizer(meta, tok.fingerprint, data_dir="data/sotu")
  ids, targets, steps = open_split("data/sotu", "train")  # memmaps; targets, steps None for text
"""

import json
import os
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
IGNORE_INDEX = -1  # label value that the loss skips (torch cross_entropy ignore_index=-1)
SPLITS = ("train", "val")  # a text set's splits; the depth task's are DEPTH_SPLITS (meta["splits"])
DEPTH_SPLITS = ("train", "dev", "test")


class DataError(Exception):
    """An expected failure (bad input, missing package, hub unreachable): printed as one line."""


def run_main(main):
    """Run a prepare script's main(); expected errors become one line on stderr and exit code 1."""
    try:
        main()
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)


# ----------------------------------------------------------------------------------------------
# reading


def prepare_command(data_dir):
    """The command that writes data_dir: the prepare.py of the set its name mentions (data/fineweb_edu,
    out/demo/data_sotu), else a placeholder and the list of sets."""
    sets = sorted(p.parent.name for p in (REPO_ROOT / "data").glob("*/prepare.py"))
    named = [s for s in sets if s in Path(data_dir).resolve().name]
    which = max(named, key=len) if named else "<set>"
    also = "" if named else f" (<set>: one of {', '.join(sets)})"
    return f"python data/{which}/prepare.py --out_dir {data_dir}{also}"


def load_meta(data_dir):
    """meta.json of a prepared data dir as a dict; one-line error when it is missing."""
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{data_dir} is not prepared ({path} not found): run {prepare_command(data_dir)}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:  # not read_json: what to do is to rerun this data's own prepare command
        raise ValueError(f"{path} is not valid JSON ({err.msg}): run {prepare_command(data_dir)} again") from None


def _memmap(path, dtype, what):
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {what}; rerun prepare.py")
    size, dtype = path.stat().st_size, np.dtype(dtype)  # np.memmap's own errors name no file
    if size == 0 or size % dtype.itemsize:
        problem = "is empty" if size == 0 else f"has {size} bytes, not a whole number of {dtype.name} values"
        raise ValueError(f"{path} {problem}: truncated or from another run; rerun prepare.py")
    return np.memmap(path, dtype=dtype, mode="r")


def splits(meta):
    """The splits a prepared dir holds: ("train", "dev", "test") for the depth task, ("train", "val") else."""
    return tuple(meta.get("splits", SPLITS))


def resolve_split(meta, split):
    """The file name of a split: "val" and "dev" name the held-out split that choices are made on, whichever
    of the two the data has (a text set's val, the depth task's dev); a split the data lacks is a one-line
    ValueError."""
    have = splits(meta)
    if split in ("val", "dev") and split not in have:
        split = "dev" if "dev" in have else "val"
    if split not in have:
        raise ValueError(f"unknown split {split!r}: this data has {', '.join(have)}")
    return split


def open_split(data_dir, split, meta=None):
    """(ids, targets, steps) of one split as read-only numpy memmaps (flat, same length). split: one of the
    data's splits; "val" and "dev" are one split (resolve_split).

    targets (int32, -1 = ignore) and steps (uint8) are None unless meta says the data has them.
    When meta has seq_len, the arrays are whole rows: reshape(-1, meta["seq_len"]).
    """
    data_dir = Path(data_dir)
    meta = load_meta(data_dir) if meta is None else meta
    split = resolve_split(meta, split)
    ids = _memmap(data_dir / f"{split}.bin", np.dtype(meta["dtype"]), "token ids missing")
    targets = steps = None
    if meta.get("targets"):
        targets = _memmap(data_dir / f"{split}_targets.bin", np.int32, "label file missing")
    if meta.get("steps"):
        steps = _memmap(data_dir / f"{split}_step.bin", np.uint8, "step file missing")
    for name, arr in (("targets", targets), ("steps", steps)):
        if arr is not None and len(arr) != len(ids):
            raise ValueError(f"{data_dir}/{split}: {name} has {len(arr)} entries but ids have "
                             f"{len(ids)}: the files come from different runs; rerun prepare.py")
    seq_len = meta.get("seq_len")
    if seq_len and len(ids) % seq_len:
        raise ValueError(f"{data_dir}/{split}.bin has {len(ids)} tokens, not a multiple of "
                         f"seq_len={seq_len}; rerun prepare.py")
    return ids, targets, steps


def check_tokenizer(meta, tokenizer_fingerprint, data_dir="the data dir", model_tokenizer=None):
    """Raise a one-line ValueError when the data was tokenized with another tokenizer."""
    if meta.get("fingerprint") == tokenizer_fingerprint:
        return
    made_with = f"{meta.get('tokenizer', '?')} (fingerprint {meta.get('fingerprint')})"
    uses = f"{model_tokenizer} " if model_tokenizer else ""
    uses += f"(fingerprint {tokenizer_fingerprint})"
    script = meta.get("script", "prepare.py")
    raise ValueError(f"data {data_dir} was tokenized with {made_with}, model uses {uses}: "
                     f"rerun python {script} --tokenizer <the model's checkpoint>")


# ----------------------------------------------------------------------------------------------
# writing


def token_dtype(vocab_size):
    """uint16 when every id fits (vocab <= 65536, e.g. SmolLM2's 49152), else uint32."""
    return np.uint16 if vocab_size <= 2**16 else np.uint32


class BinWriter:
    """Appends arrays to DIR/name.tmp; close() renames it into place (atomic, no half files)."""

    def __init__(self, path, dtype, flush_every=1 << 20):
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.dtype = np.dtype(dtype)
        self.f = open(self.tmp, "wb")
        self.buf, self.buffered, self.count = [], 0, 0
        self.flush_every = flush_every

    def write(self, arr):
        arr = np.asarray(arr)
        self.buf.append(arr.astype(self.dtype, copy=False))
        self.buffered += arr.size
        self.count += arr.size
        if self.buffered >= self.flush_every:
            self.flush()

    def flush(self):
        if self.buf:
            np.concatenate(self.buf).tofile(self.f)
        self.buf, self.buffered = [], 0

    def close(self):
        self.flush()
        self.f.close()
        os.replace(self.tmp, self.path)

    def abort(self):
        self.f.close()
        self.tmp.unlink(missing_ok=True)


def write_meta(out_dir, meta):
    """meta.json, written last and atomically: its presence means the .bin files are complete."""
    path = Path(out_dir) / "meta.json"
    tmp = path.with_name("meta.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def remove_stale(out_dir, keep_targets, keep_steps):
    """Delete label files a previous run of another kind left behind in the same dir."""
    for split in dict.fromkeys(SPLITS + DEPTH_SPLITS):
        if not keep_targets:
            (Path(out_dir) / f"{split}_targets.bin").unlink(missing_ok=True)
        if not keep_steps:
            (Path(out_dir) / f"{split}_step.bin").unlink(missing_ok=True)


def is_val_doc(i, val_frac):
    """Deterministic document split: doc i goes to val when floor((i+1)f) > floor(i f).

    Spreads exactly floor(n f) val documents evenly through the stream (every 20th at f=0.05),
    works on streams of unknown length, and never splits a document across train and val.
    """
    return int((i + 1) * val_frac) > int(i * val_frac)


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def print_summary(out_dir, meta, files):
    """The closing table: per file its size, then the token and document counts."""
    print(f"\nwrote {out_dir}:")
    for name in files:
        p = Path(out_dir) / name
        print(f"  {name:<20} {human_bytes(p.stat().st_size):>12}")
    unit = "rows" if meta.get("seq_len") else "documents"  # row data: one problem per row
    for split in splits(meta):
        docs = meta[f"{split}_docs"]
        per = f", {meta[f'{split}_tokens'] / docs:.1f} tokens/doc" if docs else ""
        print(f"  {split}: {meta[f'{split}_tokens']:,} tokens, {docs:,} {unit}{per}")
    print(f"  dtype {meta['dtype']}, vocab_size {meta['vocab_size']}, "
          f"fingerprint {meta['fingerprint']}")


# ----------------------------------------------------------------------------------------------
# tokenizer and documents (text sets)


def jsonl_rows(path):
    """(line number, parsed object) for every non-blank line of a .jsonl file; bad JSON is a one-line DataError."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None


def add_repo_root_to_path():
    """prepare.py runs as `python data/<set>/prepare.py`: make tokenizer.py, hub.py importable."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))


def get_tokenizer(spec):
    """A checkpoint dir, a .gguf file, a hub id or a short name (smollm2, ...) -> tokenizer."""
    add_repo_root_to_path()
    from plumbing.tokenizer import load_tokenizer
    path = spec
    if not Path(spec).exists():  # a name: resolve it (local dirs and .gguf files need no hub.py)
        from plumbing.hub import CheckpointError, resolve_checkpoint
        try:
            path = resolve_checkpoint(spec)
        except CheckpointError as e:
            raise DataError(str(e)) from None
    try:
        return load_tokenizer(path)
    except (FileNotFoundError, ValueError) as e:
        raise DataError(f"--tokenizer {spec}: {e}") from None


def separator(tok):
    """(kind, id): how documents are delimited, the way the parent saw them in pretraining
    (tokenizer.document_separator explains the rule)."""
    add_repo_root_to_path()
    from plumbing.tokenizer import document_separator

    sep = document_separator(tok)
    if sep is None:
        raise DataError("the tokenizer has neither <|endoftext|>, a BOS nor an EOS token to separate documents")
    return sep


def encode_doc(tok, text, sep):
    """ids of one document with its separator; sep = separator(tok)."""
    kind, sep_id = sep
    ids = tok.encode(text)
    return [sep_id] + ids if kind == "bos" else ids + [sep_id]


def write_text_dataset(docs, tok, out_dir, *, val_frac, meta_extra, total=None, desc="tokenizing"):
    """Tokenize a stream of documents into out_dir/{train,val}.bin and meta.json.

    docs: iterable of str (one document each). Documents go wholly to train or val
    (is_val_doc). Returns meta.
    """
    from tqdm import tqdm

    if not 0.0 < val_frac < 1.0:
        raise DataError(f"--val_frac must be in (0, 1), got {val_frac}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tok.vocab_size)
    sep = separator(tok)
    writers = {s: BinWriter(out_dir / f"{s}.bin", dtype) for s in SPLITS}
    ndocs = {s: 0 for s in SPLITS}
    skipped, i = 0, 0
    try:
        for text in tqdm(docs, total=total, desc=desc, unit="doc"):
            if not text or not text.strip():
                skipped += 1  # an empty document would only add a lone separator
                continue
            ids = np.asarray(encode_doc(tok, text, sep), dtype=np.int64)
            if ids.max() >= tok.vocab_size or ids.min() < 0:
                raise DataError(f"tokenizer produced id {ids.max()} outside its vocab_size "
                                f"{tok.vocab_size}")
            split = "val" if is_val_doc(i, val_frac) else "train"
            writers[split].write(ids)
            ndocs[split] += 1
            i += 1
        for split in SPLITS:
            if ndocs[split] == 0:
                raise DataError(f"the {split} split is empty ({i} documents, val_frac {val_frac}): "
                                f"use more documents or change --val_frac")
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    for w in writers.values():
        w.close()
    remove_stale(out_dir, keep_targets=False, keep_steps=False)
    meta = dict(meta_extra)
    meta.update({
        "fingerprint": tok.fingerprint, "vocab_size": tok.vocab_size,
        "dtype": np.dtype(dtype).name, "bos_id": tok.bos_id, "eos_id": tok.eos_id,
        "separator": sep[0], "separator_id": sep[1], "val_frac": val_frac,
        "targets": False, "steps": False,
        "train_tokens": writers["train"].count, "val_tokens": writers["val"].count,
        "train_docs": ndocs["train"], "val_docs": ndocs["val"], "skipped_empty_docs": skipped,
    })
    write_meta(out_dir, meta)
    return meta


# ----------------------------------------------------------------------------------------------
# hub downloads (fineweb_edu, nemotron_math, gsm8k)


def require_pyarrow():
    """pyarrow reads the hub's parquet files; it is optional, so import it only when needed."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("reading the hub's parquet files needs pyarrow: pip install pyarrow") \
            from None
    return pq


def hub_error(e, repo_id, gated=False):
    """One line for a failed hub call: what went wrong and what to do."""
    from huggingface_hub import errors as E

    url = f"https://huggingface.co/datasets/{repo_id}"
    gate = (f" ({repo_id} is gated: accept its terms at {url}, then `hf auth login` or set "
            f"HF_TOKEN)") if gated else ""
    if isinstance(e, E.GatedRepoError):
        return DataError(f"{repo_id} is gated on the Hugging Face Hub: accept its terms at {url}, "
                         f"then log in with `hf auth login` (or set HF_TOKEN) and rerun")
    if isinstance(e, (E.OfflineModeIsEnabled, E.LocalEntryNotFoundError)) or \
            os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return DataError(f"cannot download {repo_id}: the Hugging Face Hub is offline "
                         f"(HF_HUB_OFFLINE=1) or unreachable and the files are not in the local "
                         f"cache; rerun with network access{gate}")
    if isinstance(e, E.RepositoryNotFoundError):
        return DataError(f"{repo_id} not found on the Hugging Face Hub (or no access){gate}")
    if isinstance(e, E.EntryNotFoundError):
        return DataError(f"file not found in {repo_id}: {str(e).splitlines()[0]}")
    first = str(e).splitlines()[0] if str(e) else ""
    return DataError(f"download from {repo_id} failed ({type(e).__name__}: {first}); check the "
                     f"network and rerun{gate}")


def hub_list_files(repo_id, prefix, suffixes, gated=False):
    """Sorted data files of a hub dataset repo under prefix/ ending in one of suffixes."""
    import huggingface_hub
    from huggingface_hub.utils import logging as hf_logging
    hf_logging.set_verbosity_error()  # no retry chatter: a failure is reported as one line
    try:
        files = huggingface_hub.list_repo_files(repo_id, repo_type="dataset")
    except Exception as e:  # any hub/network failure becomes one clear line
        raise hub_error(e, repo_id, gated) from None
    files = sorted(f for f in files if f.startswith(prefix) and f.endswith(tuple(suffixes)))
    if not files:
        raise DataError(f"no {'/'.join(suffixes)} files under {prefix!r} in {repo_id}")
    return files


def hub_download(repo_id, filename, gated=False):
    """Local path of one dataset file (huggingface_hub cache, resumable, honours HF_HUB_OFFLINE)."""
    import huggingface_hub
    from huggingface_hub.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    try:
        return huggingface_hub.hf_hub_download(repo_id, filename, repo_type="dataset")
    except Exception as e:
        raise hub_error(e, repo_id, gated) from None


def parquet_texts(pq, path, column):
    """Yield the strings of one column of a parquet file, one row group at a time (low memory)."""
    pf = pq.ParquetFile(path)
    if column not in pf.schema_arrow.names:
        raise DataError(f"{path} has no column {column!r} (columns: {pf.schema_arrow.names}); "
                        f"pass --text_field")
    for g in range(pf.num_row_groups):
        yield from pf.read_row_group(g, columns=[column]).column(column).to_pylist()


def hub_parquet_docs(repo_id, prefix, num_files, num_docs, text_field, gated=False):
    """(files, docs): the first num_files parquet files under prefix/ of a hub dataset, and a
    generator over the first num_docs of their text_field (0 = all), downloading file by file."""
    files = hub_list_files(repo_id, prefix, (".parquet",), gated)[:num_files]
    pq = require_pyarrow()  # checked before any large download starts

    def docs():
        n = 0
        for name in files:
            path = hub_download(repo_id, name, gated)
            for text in parquet_texts(pq, path, text_field):
                if num_docs and n >= num_docs:
                    return
                yield text
                n += 1
    return files, docs()
