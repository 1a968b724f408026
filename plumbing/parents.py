"""
Read a parent: config and weights, from a directory in the Hugging Face hub's layout or a GGUF file.

The surgery (McLeish et al. 2025, arXiv 2511.07384, §3) copies a pretrained decoder's layers into the
prelude, recurrent core and coda. This file reads that decoder into the three things the cut needs:
RecurrentConfig fields (what families.FAMILIES says about its family, plus its sizes), its layer count,
and its state dict under the Hugging Face names (model.layers.{i}.self_attn.q_proj.weight, ...) in fp32.
The cut itself (which layers go where, the adapter, the self-check) is surgery.py.

    python -m plumbing.parents $(python -m plumbing.hub smollm2)     # print the fields and the tensor count
    python -m pytest -q tests/test_surgery.py tests/test_gguf.py
"""

import argparse
import json
import os
import sys

import torch

from families import FAMILIES, GGUF_ARCHITECTURES, HF_MODEL_TYPES
from plumbing import gguf
from plumbing.cli import read_json
from plumbing.finite import check_finite


class SurgeryError(Exception):
    """Bad input to the surgery: the message says what is wrong and how to fix it."""


# -----------------------------------------------------------------------------
# a directory in the hub's layout: config.json + safetensors


def parent_config(hf):
    """RecurrentConfig fields from a Hugging Face config.json dict (transformers 4 or 5 layout)."""
    if hf.get("model_type") not in HF_MODEL_TYPES:
        raise SurgeryError(f"unsupported parent model_type {hf.get('model_type')!r}: supported are {sorted(HF_MODEL_TYPES)}")
    if hf.get("mlp_bias"):
        raise SurgeryError("parents with MLP biases are not supported")
    family = FAMILIES[HF_MODEL_TYPES[hf["model_type"]]]
    # transformers 5 moved rope_theta and rope_scaling into one rope_parameters dict
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = None if rope_type == "default" else {k: v for k, v in rope.items() if k != "rope_theta"}
    n_head = hf["num_attention_heads"]
    eos = hf.get("eos_token_id")
    return dict(
        vocab_size=hf["vocab_size"],
        n_embd=hf["hidden_size"],
        n_head=n_head,
        n_kv_head=hf.get("num_key_value_heads") or n_head,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_head,
        intermediate_size=hf["intermediate_size"],
        block_size=hf.get("max_position_embeddings", 2048),
        block_type=family["block_type"],
        norm_eps=hf.get("rms_norm_eps", 1e-5),
        rope_theta=float(theta),
        rope_scaling=scaling,
        attn_bias=family["attn_bias"] or bool(hf.get("attention_bias")),
        qk_norm=family["qk_norm"],
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bos_id=hf.get("bos_token_id"),
        eos_id=eos[0] if isinstance(eos, list) else eos,
    ), hf["num_hidden_layers"]


def read_weights(path, fix):
    """The tensors of one safetensors file; a missing or damaged one, or one holding a NaN or inf, is a one-line
    SurgeryError naming it (and saying what to do: fix)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        sd = load_file(path)
    except (FileNotFoundError, SafetensorError, OSError) as err:
        raise SurgeryError(f"cannot read {path} ({err}): {fix}") from None
    check_finite(sd, path, SurgeryError)
    return sd


def load_hf_dir(path):
    """(config fields, n_layers, state dict with Hugging Face names) from a hub-layout directory."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise SurgeryError(f"{path} has no config.json: pass a checkpoint directory in the Hugging Face layout")
    fields, n_layers = parent_config(read_json(cfg_path))
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        files = sorted(set(read_json(index)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    sd = {}
    for name in files:
        sd.update(read_weights(os.path.join(path, name), "download it again"))
    return fields, n_layers, {k: v.float() for k, v in sd.items()}


# -----------------------------------------------------------------------------
# a GGUF file: llama.cpp's names, and its interleaved q/k rows

GGUF_NAMES = {  # llama.cpp tensor name -> Hugging Face name (inside model.layers.{i}.)
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}  # fmt: skip
GGUF_TOP = {"token_embd": "model.embed_tokens.weight", "output_norm": "model.norm.weight", "output": "lm_head.weight"}


def load_gguf(path):
    """(config fields, n_layers, state dict with Hugging Face names) from a llama-architecture GGUF,
    dequantized to fp32 by the gguf package (plumbing/gguf.py)."""
    try:
        meta, index = gguf.read(path)
        arch = meta.get("general.architecture")
        if arch not in GGUF_ARCHITECTURES:
            raise SurgeryError(f"{path}: only {'/'.join(GGUF_ARCHITECTURES)}-architecture GGUF files are supported")
        tensors = gguf.load_tensors(path, index)
        check_finite({k: torch.from_numpy(v) for k, v in tensors.items()}, path, SurgeryError)  # llama.cpp's names
    except (gguf.GGUFError, OSError) as err:
        raise SurgeryError(f"cannot read {path} as GGUF ({err}): download it again") from None
    family = FAMILIES[GGUF_ARCHITECTURES[arch]]
    key = lambda name: meta[f"{arch}.{name}"]
    n_head, n_kv, h = key("attention.head_count"), key("attention.head_count_kv"), key("embedding_length")
    sd = {}
    for name in list(tensors):  # popped: a permuted q/k does not keep its unpermuted copy alive
        w, parts = torch.from_numpy(tensors.pop(name)), name.split(".")  # w: (out, in)
        if parts[0] == "blk":
            if parts[2] in ("attn_q", "attn_k"):
                # llama.cpp interleaves each head's rows for its RoPE; undo it for rotate-half
                n = n_head if parts[2] == "attn_q" else n_kv
                w = w.reshape(n, w.shape[0] // n // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)
            sd[f"model.layers.{parts[1]}.{GGUF_NAMES[parts[2]]}.weight"] = w
        else:
            sd[GGUF_TOP[parts[0]]] = w
    fields = dict(
        vocab_size=sd["model.embed_tokens.weight"].shape[0], n_embd=h, n_head=n_head, n_kv_head=n_kv,
        head_dim=h // n_head, intermediate_size=key("feed_forward_length"),
        block_size=meta.get(f"{arch}.context_length", 2048), block_type=family["block_type"],
        norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        tie_embeddings="lm_head.weight" not in sd,
        bos_id=meta["tokenizer.ggml.bos_token_id"], eos_id=meta["tokenizer.ggml.eos_token_id"],
    )  # fmt: skip
    return fields, key("block_count"), sd


# -----------------------------------------------------------------------------
# one of ours, trained without a loop: a parent too (the tiny parent of experiments/claims.py)

SHAPE_FIELDS = ("vocab_size", "n_embd", "n_head", "n_kv_head", "head_dim", "intermediate_size", "block_size",
                "block_type", "norm_eps", "rope_theta", "rope_scaling", "attn_bias", "qk_norm", "tie_embeddings",
                "embed_scale", "bos_id", "eos_id")


def load_static_ours(path, cfg):
    """(config fields, n_layers, HF-named state dict) from a static checkpoint of ours (train.py --static):
    its prelude, core and coda are the parent's layers 0.. in order. A looped one is cut already: no."""
    if cfg.get("recurrent", True):
        raise SurgeryError(f"{path} is a looped checkpoint (cut already): only a static one (train.py --static) "
                           "is a parent; train or fine-tune this one with train.py --init")
    parts = [(part, cfg[f"n_{part}"]) for part in ("prelude", "core", "coda")]
    offsets = dict(zip([p for p, _ in parts], [sum(n for _, n in parts[:i]) for i in range(len(parts))]))
    sd = {}
    for k, v in read_weights(os.path.join(path, "model.safetensors"), "train or copy it again").items():
        part, _, rest = k.partition(".")
        if part in offsets:  # prelude.1.mlp.up_proj.weight -> model.layers.{offset + 1}.mlp.up_proj.weight
            j, _, name = rest.partition(".")
            sd[f"model.layers.{offsets[part] + int(j)}.{name}"] = v.float()
        else:
            sd[k if k == "lm_head.weight" else f"model.{k}"] = v.float()
    fields = {k: cfg[k] for k in SHAPE_FIELDS if k in cfg}
    return fields, sum(n for _, n in parts), sd


def load_parent(src):
    """A resolved parent (plumbing.hub.resolve_checkpoint) -> (config fields, n_layers, HF-named state dict)."""
    if src.endswith(".gguf"):
        return load_gguf(src)
    cfg_path = os.path.join(src, "config.json")
    if os.path.isfile(cfg_path):
        cfg = read_json(cfg_path)
        if cfg.get("model_type") == "nanorecur":
            return load_static_ours(src, cfg)
    return load_hf_dir(src)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="read a parent checkpoint and print its config fields", allow_abbrev=False)
    ap.add_argument("path", help="hub-layout directory or .gguf file (python -m plumbing.hub NAME prints one)")
    args = ap.parse_args()
    try:
        fields, n_layers, sd = load_parent(args.path)
    except SurgeryError as e:
        sys.exit(f"error: {e}")
    print(json.dumps({**fields, "n_layers": n_layers, "tensors": len(sd)}, indent=2))
