"""
The one GGUF reader: a llama.cpp file's header, its tensors (dequantized to fp32) and its tokenizer.

The offline parent of this project is SmolLM2-135M-Instruct as a Q4_1 GGUF (plumbing/hub.py), so the
retrofit (McLeish et al. 2025, arXiv 2511.07384) must read everything from that one file: the config
(`llama.*` keys), the weights, and the vocabulary, merges and chat template (`tokenizer.*` keys). The
header is parsed here directly from the documented layout (magic, version, key/value pairs, tensor
index, aligned data); only the dequantization of the quantized blocks is left to the `gguf` package.
plumbing/parents.py turns the tensors into a parent, plumbing/tokenizer.py the vocabulary into a tokenizer.

    python -m plumbing.gguf $(python -m plumbing.hub smollm2)     # print the header and the tensor index
    python -m pytest -q tests/test_gguf.py tests/test_tokenizer.py
"""

import argparse
import json
import mmap
import os
import struct
import sys

import numpy as np

# GGUF value types 0..12: scalars by struct format; 8 is a string, 9 an array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
PLAIN = {0: np.float32, 1: np.float16, 28: np.float64}  # ggml types stored as plain numbers; the rest are blocks


class GGUFError(ValueError):
    """A file that is not a GGUF we can read (one line)."""


def read(path):
    """-> (metadata, index). metadata: the key/value header as a dict (arrays as lists); index: {tensor name:
    (ggml type, shape in PyTorch order, byte offset in the file)}. Nothing of the tensor data is read.
    gguf.GGUFReader gives the same values, but slowly on a 49k-token vocabulary: it builds an object a field."""
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise GGUFError(f"{path}: not a little-endian GGUF v2/v3 file") from None
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        pos += n
        return buf[pos - n:pos].decode("utf-8")

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(SCALARS[t])

    try:
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
        if magic != b"GGUF" or version not in (2, 3):
            raise GGUFError(f"{path}: not a little-endian GGUF v2/v3 file")
        pos = 24
        meta = {}
        for _ in range(n_kv):
            key = string()
            meta[key] = value(take("<I"))
        index = {}
        for _ in range(n_tensors):
            name, n_dims = string(), take("<I")
            dims = [take("<Q") for _ in range(n_dims)]  # innermost first, as ggml counts them
            index[name] = (take("<I"), tuple(reversed(dims)), take("<Q"))
    except (struct.error, KeyError, UnicodeDecodeError) as err:  # a truncated or damaged header
        raise GGUFError(f"{path}: truncated or damaged GGUF header ({err})") from None
    align = meta.get("general.alignment", 32)
    start = pos + (-pos % align)  # the data section begins at the next multiple of the alignment
    return meta, {name: (t, shape, start + offset) for name, (t, shape, offset) in index.items()}


def read_metadata(path):
    """The key/value header of a GGUF file as a dict."""
    return read(path)[0]


def load_tensors(path, index):
    """{name: fp32 numpy array, shape as in `index`} for every tensor of the index. The raw bytes are handed to
    gguf.quants.dequantize exactly as gguf.GGUFReader lays them out (plain types as numbers, block types
    as rows of bytes), so the values are the gguf package's own."""
    import gguf

    data = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, (t, shape, offset) in index.items():
        qtype = gguf.GGMLQuantizationType(t)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        n_bytes = int(np.prod(shape)) * size // block
        raw = data[offset:offset + n_bytes]
        if raw.size != n_bytes:
            raise GGUFError(f"{path}: tensor {name} runs past the end of the file (truncated download)")
        if t in PLAIN:
            raw = raw.view(PLAIN[t]).reshape(shape)
        else:
            raw = raw.reshape(gguf.quants.quant_shape_to_byte_shape(shape, qtype))
        out[name] = gguf.quants.dequantize(raw, qtype).copy()  # (out, in) for a matrix; a copy, off the file
    return out


def tokenizer_files(path, pretokenizers):
    """-> (tokenizer.json dict, tokenizer_config.json dict) equivalent to the GGUF's tokenizer. A GGUF names
    its pre-tokenizer (`tokenizer.ggml.pre`) instead of storing it: `pretokenizers` maps those names to a
    tokenizer.json pre_tokenizer (plumbing/tokenizer.py keeps that table beside its regexes)."""
    meta = read_metadata(path)
    field = lambda key, default=None: meta.get(key, default)

    if field("tokenizer.ggml.model") != "gpt2":
        raise GGUFError(f"{path}: tokenizer.ggml.model={field('tokenizer.ggml.model')!r}, only byte-level BPE "
                        "(gpt2) GGUF vocabularies are supported")
    pre = field("tokenizer.ggml.pre", "default")
    if pre not in pretokenizers:
        raise GGUFError(f"{path}: GGUF pre-tokenizer {pre!r} is not in GGUF_PRETOKENIZERS "
                        f"({', '.join(pretokenizers)})")
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    merges = [m.split(" ") for m in field("tokenizer.ggml.merges")]
    # token types (llama.cpp): 3 = control (special), 4 = user-defined; both are matched as whole strings
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": types[i] == 3} for i, t in enumerate(tokens) if types[i] in (3, 4)]
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
          "pre_tokenizer": pretokenizers[pre], "post_processor": None,
          "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges}}
    cfg = {"add_bos_token": bool(field("tokenizer.ggml.add_bos_token", False)), "add_eos_token": False,
           "clean_up_tokenization_spaces": False, "tokenizer_class": "PreTrainedTokenizerFast",
           "model_max_length": field(f"{field('general.architecture')}.context_length", 2048)}
    for key in ("bos", "eos", "unknown", "padding"):
        i = field(f"tokenizer.ggml.{key}_token_id")
        if i is not None:
            cfg[{"unknown": "unk", "padding": "pad"}.get(key, key) + "_token"] = tokens[i]
    if field("tokenizer.chat_template"):
        cfg["chat_template"] = field("tokenizer.chat_template")
    return tj, cfg


def write_tokenizer_files(path, out_dir, pretokenizers):
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json for the GGUF's tokenizer into
    out_dir (transformers' AutoTokenizer can load them too), each via temp file + rename. Returns the paths."""
    tj, cfg = tokenizer_files(path, pretokenizers)
    stm = {k: cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if k in cfg}
    written = []
    for name, obj in [("tokenizer.json", tj), ("tokenizer_config.json", cfg), ("special_tokens_map.json", stm)]:
        tmp = os.path.join(out_dir, name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1 if name != "tokenizer.json" else None)
        os.replace(tmp, os.path.join(out_dir, name))
        written.append(os.path.join(out_dir, name))
    return written


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="print a GGUF file's header and tensor index", allow_abbrev=False)
    ap.add_argument("path", help=".gguf file")
    args = ap.parse_args()
    try:
        meta, index = read(args.path)
    except (OSError, GGUFError) as e:
        sys.exit(f"error: {e}")
    for k, v in meta.items():  # arrays (the vocabulary) by their length only
        print(f"{k}: {f'[{len(v)} values]' if isinstance(v, list) else repr(v)}")
    for name, (t, shape, offset) in index.items():
        print(f"{name}: ggml type {t}, shape {shape}, offset {offset}")
