"""
Read and write the "raven" checkpoint format of the published depth-recurrent models.

Huginn-0125 (Geiping et al. 2025, arXiv 2502.05171, tomg-group-umd/huginn-0125) and the retrofitted
models of McLeish et al. 2025 (arXiv 2511.07384, smcleish/Recurrent-Llama-3.2-*, TinyLlama) ship as
`transformer.{prelude,core_block,coda}` blocks with a fused Wqkv and a fused MLP `fc`, an adapter on
cat[s, e] and a final norm `ln_f`. The two variants share key names and config.json but not their
math, which lives in two different modeling files:

- Huginn variant: sandwich blocks (norm_1..norm_4), complex RoPE on interleaved pairs with base
  `rope_base`, e = wte * sqrt(n_embd), ln_f on the state before the coda and again after it.
- retrofit-Llama variant: Llama pre-norm blocks (norm_1, norm_2 only), HF rotate-half RoPE with base
  `rope_theta` (the `rope_base` field is written but never read), optional llama3 `rope_scaling`,
  GQA, e = wte * init_values.embed_scale (1.0), ln_f once after the coda, untied lm_head.

The variant is told by the modeling file config.json names (when it lies beside the weights) or else by
config.json's rope_theta (the retrofit converter writes it, Huginn's config has rope_base only), never
by `block_class_name`, which is "SandwichBlock" in both, nor by the tensors: the retrofit converter
starts from a Huginn snapshot and leaves its norm_3, norm_4 and freqs_cis behind (ignored, said in one line). The two variants are the families "huginn" and "llama" of families.FAMILIES,
which says what differs between them; the names are mapped explicitly by the tables below. What
RecurrentGPT cannot express is refused with one line (RavenError), never approximated.

    python -m plumbing.raven --load tomg-group-umd/huginn-0125            # print the mapped config (hub or local dir)
    python -m plumbing.raven --export out/smollm2 out/smollm2-raven         # same as surgery.py --export-raven
    python -m pytest -q tests/test_raven.py

An exported directory holds model.safetensors, config.json, the tokenizer files and the project's own
raven_config_minimal.py / raven_modeling_minimal.py (plumbing/hf/, both layouts, with the model.py and
modeling_nanorecur.py they import), so it loads with
transformers: AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True). The published modeling
files (tomg-group-umd/huginn-0125, or a smcleish/Recurrent-* repo for pre-norm) may replace them.
"""

import argparse
import json
import math
import os
import shutil
import sys

import torch

from families import FAMILIES, RAVEN_EXPORT, RAVEN_VARIANTS
from plumbing.cli import read_json
from plumbing.finite import check_finite
from plumbing.hf_remote import write_remote_code, written_by_nanorecur
from model import RecurrentConfig, RecurrentGPT
from plumbing.pretrained import write_json_atomic
from plumbing.tokenizer import TOKENIZER_FILES


class RavenError(ValueError):
    """A raven checkpoint we cannot read, or a model the raven format cannot express (one line)."""


# -----------------------------------------------------------------------------
# the mapping tables

# config.json field -> RecurrentConfig field, per variant (H = Huginn/sandwich, L = retrofit-Llama/prenorm)
#   n_embd, n_heads, intermediate_size       -> n_embd, n_head, intermediate_size
#   n_embd // n_heads                        -> head_dim (both modeling files derive it; `head_dim` must agree)
#   num_key_value_heads                      -> n_kv_head (H: must equal n_heads, the attention has no GQA)
#   padded_vocab_size (rows of wte/lm_head)  -> vocab_size
#   n_layers_in_prelude/_recurrent_block/_coda -> n_prelude / n_core / n_coda
#   norm_eps, tie_embeddings, mean_recurrence -> same names (mean_recurrence: r when num_steps is None)
#   qk_bias                                  -> attn_bias (q and k bias, v bias held at zero)
#   H: rope_base    L: rope_theta            -> rope_theta   (L never reads rope_base: ~1e-3 if confused)
#   H: none         L: rope_scaling (llama3) -> rope_scaling
#   H: sqrt(n_embd) L: init_values.embed_scale -> embed_scale (s_0 is multiplied by it too)
#   init_values.std                          -> state_std; std == 0 -> state_init "zero" (the code zeroes s_0)
#   H: True         L: False                 -> norm_before_coda (ln_f on s_r before the coda)
#   H: block_size   L: max_position_embeddings -> block_size
#   forward(num_steps=r): the reference runs r steps under no_grad, ours with grad; same logits. A pair
#   [n, k] means n steps without grad then k with grad in both. None: mean_recurrence in eval (both).
RAVEN_PARTS = {"prelude": "prelude", "core_block": "core", "coda": "coda"}  # raven block list -> ours
RAVEN_NORMS = {  # per block; Huginn has all four, the retrofit pre-norm blocks only norm_1, norm_2
    "norm_1": "input_layernorm",
    "norm_2": "post_attention_layernorm",
    "norm_3": "pre_feedforward_layernorm",
    "norm_4": "post_feedforward_layernorm",
}
RAVEN_TOP = {  # whole-model tensors
    "transformer.wte.weight": "embed_tokens.weight",
    "transformer.adapter.weight": "adapter.weight",
    "transformer.ln_f.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",  # stored only when untied
}
# fused tensors, split in code: attn.Wqkv = cat[q, k, v] rows; attn.qk_bias [2, 1, H, hd] = (q bias, k bias);
# attn.proj -> o_proj; mlp.fc = cat[gate, up] rows; mlp.proj -> down_proj. `freqs_cis` is derived and dropped.


def interleave_perm(hd):
    """Huginn rotates pairs (x[2i], x[2i+1]); rotate-half RoPE pairs (x[i], x[i + hd/2]). Reading the
    rows of each head in the order [0, 2, 4, .., 1, 3, 5, ..] turns the first into the second."""
    return torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])


def permute_heads(w, n, hd, perm):
    # w: (n*hd, ...) rows grouped by head -> the same rows reordered inside every head
    return w.reshape(n, hd, *w.shape[1:])[:, perm].reshape(w.shape)


def huginn_freqs_cis(hd, block_size, base):
    """The persistent `freqs_cis` buffer of the Huginn code, [1, block_size, 1, hd/2, (cos, sin)], fp32."""
    inv_freq = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(block_size, dtype=torch.float32), inv_freq)
    return torch.stack([freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]], dim=4)


# -----------------------------------------------------------------------------
# import: raven directory -> RecurrentGPT


def read_raven_tensors(path):
    """All tensors of model.safetensors (or of the shards named in model.safetensors.index.json), fp32."""
    from safetensors.torch import load_file

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        files = sorted(set(read_json(index)["weight_map"].values()))
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise RavenError(f"{path} has no model.safetensors (or index): download the weights of the raven checkpoint")
    sd = {}
    for name in files:
        try:
            shard = load_file(os.path.join(path, name))
        except Exception as err:  # safetensors raises several types for a damaged or missing shard
            raise RavenError(f"cannot read {path}/{name} ({err}): download it again") from None
        check_finite(shard, f"{path}/{name}", RavenError)
        # published weights are bf16; CPU work here is fp32 (a cast up is exact), one shard at a time
        sd.update({k: v.float() for k, v in shard.items()})
    return sd


def raven_variant(cfg, sd, path=None):
    """(variant, why): 'huginn' (sandwich) or 'retrofit' (Llama pre-norm), from what says which modeling code
    runs the checkpoint, never from the tensors or block_class_name ("SandwichBlock" in both). First the
    modeling file config.json's auto_map names, when it lies beside the weights (read as text, never run): the
    retrofit one builds on transformers' Llama RoPE. Else config.json: the retrofit converter writes the
    parent's rope_theta, which Huginn's config lacks (it has rope_base only)."""
    if any(".q_norm." in k or ".k_norm." in k for k in sd):
        raise RavenError("raven checkpoint with q/k norms (an OLMo-2 retrofit): only Huginn and Llama retrofits are supported")
    module = cfg.get("auto_map", {}).get("AutoModelForCausalLM", "").split(".")[0]
    modeling = os.path.join(path, module + ".py") if path and module else None
    if modeling and os.path.isfile(modeling) and not written_by_nanorecur(modeling):  # ours reads rope_theta too
        with open(modeling, encoding="utf-8", errors="replace") as f:
            llama = "LlamaRotaryEmbedding" in f.read()
        variant, why = ("retrofit", f"{module}.py uses Llama's RoPE") if llama else ("huginn", f"{module}.py is Huginn's")
    elif "rope_theta" in cfg:
        variant, why = "retrofit", "config.json has rope_theta"
    else:
        variant, why = "huginn", "config.json has no rope_theta"
    sandwich_norms = any(k.endswith(".norm_3.weight") for k in sd)
    if (variant == "retrofit" and "rope_theta" not in cfg) or (variant == "huginn" and not sandwich_norms):
        raise RavenError("pre-norm raven checkpoint without rope_theta: the retrofit modeling code reads rope_theta, "
                         "not rope_base (add the parent's rope_theta to config.json)")
    return variant, why


def unread_tensors(sd, variant):
    """Tensors the variant's modeling code never reads: the retrofit converter starts from a Huginn snapshot
    and leaves its sandwich norms (norm_3, norm_4) and RoPE table (freqs_cis) in the weights."""
    if variant != "retrofit":
        return []
    return sorted(k for k in sd if k == "freqs_cis" or k.endswith((".norm_3.weight", ".norm_4.weight")))


def config_from_raven(cfg, variant, source=None, **overrides):
    """RecurrentConfig for a raven config.json (the table above; the variant's family in families.py)."""
    family = FAMILIES[RAVEN_VARIANTS[variant]]
    need = lambda key: cfg[key] if key in cfg else _missing(key)
    h, nh = need("n_embd"), need("n_heads")
    nkv = cfg.get("num_key_value_heads", nh)
    if cfg.get("head_dim", h // nh) != h // nh:
        raise RavenError(f"config.json head_dim={cfg['head_dim']} but the raven code uses n_embd // n_heads = {h // nh}")
    if cfg.get("bias", False):
        raise RavenError("raven checkpoint with bias=true (an adapter bias): not supported")
    if cfg.get("injection_type", "linear") != "linear" or cfg.get("test_time_noise", 0):
        raise RavenError("raven checkpoint with non-linear injection or test-time noise: not supported")
    std = float(need("init_values")["std"])
    common = dict(
        vocab_size=cfg.get("padded_vocab_size", need("vocab_size")), n_embd=h, n_head=nh, n_kv_head=nkv,
        head_dim=h // nh, intermediate_size=need("intermediate_size"), norm_eps=need("norm_eps"),
        n_prelude=need("n_layers_in_prelude"), n_core=need("n_layers_in_recurrent_block"),
        n_coda=need("n_layers_in_coda"), mean_recurrence=need("mean_recurrence"),
        tie_embeddings=need("tie_embeddings"), attn_bias=need("qk_bias"), qk_norm=family["qk_norm"],
        block_type=family["block_type"], norm_before_coda=family["norm_before_coda"],
        recurrent=True, adapter_init="random",
        state_init="zero" if std == 0 else "normal", state_std=std,
        bos_id=cfg.get("bos_token_id") if isinstance(cfg.get("bos_token_id"), int) else None,
        eos_id=cfg.get("eos_token_id") if isinstance(cfg.get("eos_token_id"), int) else None,
    )
    if not family["gqa"] and nkv != nh:
        raise RavenError(f"Huginn raven checkpoint with num_key_value_heads={nkv} != n_heads={nh}: its attention has no GQA")
    if family["scale_embedding"]:
        scale = math.sqrt(h)  # the Huginn code computes sqrt(n_embd); init_values.embed_scale must agree
        if not math.isclose(cfg["init_values"].get("embed_scale", scale), scale, rel_tol=1e-6):
            raise RavenError(f"Huginn raven checkpoint with init_values.embed_scale != sqrt(n_embd) = {scale}: ambiguous scale")
    else:
        scale = float(cfg["init_values"].get("embed_scale", 1.0))
    if variant == "huginn":  # where the two modeling files keep the RoPE base and the context length
        variant_fields = dict(rope_theta=float(need("rope_base")), rope_scaling=None, block_size=need("block_size"))
    else:
        rs = cfg.get("rope_scaling")
        if rs:  # old configs say "type"; HF reads rope_type first
            rs = {**{k: v for k, v in rs.items() if k != "type"}, "rope_type": rs.get("rope_type", rs.get("type"))}
        variant_fields = dict(rope_theta=float(cfg["rope_theta"]), rope_scaling=rs or None,
                              block_size=cfg.get("max_position_embeddings", cfg.get("block_size", 2048)))
    fields = {**common, **variant_fields, "embed_scale": scale,
              "parent": {"format": "raven", "variant": variant, "source": source}}
    names = set(RecurrentConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise RavenError(f"unknown config overrides {unknown}")
    try:
        return RecurrentConfig(**{**fields, **overrides})
    except ValueError as err:
        raise RavenError(str(err)) from None


def _missing(key):
    raise RavenError(f"raven config.json has no {key!r}: not a Huginn or retrofit raven checkpoint")


def state_dict_from_raven(sd, config, variant):
    """Our state dict from raven tensors (consumes `sd`); every raven tensor must find a place."""
    c, out = config, {}
    sd.pop("freqs_cis", None)  # Huginn's RoPE table: derived data, recomputed by the model
    H, KV, hd, I = c.n_head, c.n_kv_head, c.head_dim, c.intermediate_size
    family = FAMILIES[RAVEN_VARIANTS[variant]]
    perm = interleave_perm(hd) if family["rope"] == "interleaved" else None
    norms = [rn for rn, ours in RAVEN_NORMS.items() if ours in family["norms"]]  # Huginn 4, retrofit norm_1, norm_2

    def take(key):  # popped, so a fused tensor is freed once its pieces are copied out
        if key not in sd:
            raise RavenError(f"raven checkpoint lacks {key}: weights do not match config.json")
        return sd.pop(key)

    for raven_part, ours in RAVEN_PARTS.items():
        for i in range(getattr(c, {"prelude": "n_prelude", "core": "n_core", "coda": "n_coda"}[ours])):
            src, dst = f"transformer.{raven_part}.{i}.", f"{ours}.{i}."
            for rn in norms:
                out[f"{dst}{RAVEN_NORMS[rn]}.weight"] = take(f"{src}{rn}.weight")
            # clones: each parameter gets its own storage, not a view into the fused tensor
            q, k, v = take(src + "attn.Wqkv.weight").split([H * hd, KV * hd, KV * hd], dim=0)
            if perm is not None:  # interleaved complex pairs -> rotate-half halves (same perm on q and k)
                q, k = permute_heads(q, H, hd, perm), permute_heads(k, KV, hd, perm)
            q, k, v = q.clone(), k.clone(), v.clone()
            out[dst + "self_attn.q_proj.weight"], out[dst + "self_attn.k_proj.weight"] = q, k
            out[dst + "self_attn.v_proj.weight"] = v
            if c.attn_bias:
                # qk_bias is added to q and k after the projection and before RoPE, which is exactly a
                # q_proj / k_proj bias; v has none, so v_proj.bias is zero (export refuses a nonzero one)
                if KV != H:
                    raise RavenError("raven qk_bias with GQA: the reference adds a per-query-head bias to k, which breaks")
                qb, kb = take(src + "attn.qk_bias")[:, 0]  # each (H, hd)
                if perm is not None:
                    qb, kb = qb[:, perm], kb[:, perm]
                out[dst + "self_attn.q_proj.bias"], out[dst + "self_attn.k_proj.bias"] = qb.flatten().clone(), kb.flatten().clone()
                out[dst + "self_attn.v_proj.bias"] = torch.zeros(KV * hd)
            out[dst + "self_attn.o_proj.weight"] = take(src + "attn.proj.weight")
            gate, up = (w.clone() for w in take(src + "mlp.fc.weight").split([I, I], dim=0))  # first half: SiLU
            out[dst + "mlp.gate_proj.weight"], out[dst + "mlp.up_proj.weight"] = gate, up
            out[dst + "mlp.down_proj.weight"] = take(src + "mlp.proj.weight")
    for rk, ok in RAVEN_TOP.items():
        if rk == "lm_head.weight" and c.tie_embeddings:
            continue
        out[ok] = take(rk)
    if c.tie_embeddings:
        head = sd.pop("lm_head.weight", None)  # save_pretrained drops it; some writers keep a copy
        if head is not None and not torch.equal(head, out["embed_tokens.weight"]):
            raise RavenError("config.json says tie_embeddings but lm_head.weight differs from transformer.wte.weight")
        out["lm_head.weight"] = out["embed_tokens.weight"]
    extra = sorted(sd)  # what is left after popping
    if extra:
        raise RavenError(f"raven checkpoint has tensors this loader does not know: {extra[:4]}")
    return out


def load_raven(path, device="cpu", **overrides):
    """A RecurrentGPT with the weights of a raven checkpoint directory (Huginn or retrofit-Llama)."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise RavenError(f"{path} has no config.json: pass a raven checkpoint directory")
    cfg = read_json(cfg_path)
    if cfg.get("model_type") != "huginn_raven":
        raise RavenError(f"{path}/config.json has model_type {cfg.get('model_type')!r}, not 'huginn_raven'")
    sd = read_raven_tensors(path)
    variant, why = raven_variant(cfg, sd, path)
    unread = unread_tensors(sd, variant)
    if unread:  # said in one line: a user should know that part of the file is not used
        print(f"raven: {path}: the Llama pre-norm layout ({why}) never reads {len(unread)} tensors of this file "
              f"({', '.join(sorted({k.split('.')[-2] if k != 'freqs_cis' else k for k in unread}))}): ignoring them",
              file=sys.stderr)
        for k in unread:
            del sd[k]
    config = config_from_raven(cfg, variant, source=os.path.abspath(path), **overrides)
    ours = state_dict_from_raven(sd, config, variant)
    try:
        return RecurrentGPT.from_state_dict(config, ours, device)
    except ValueError as err:
        raise RavenError(f"raven weights do not fit the mapped config: {err}") from None


# -----------------------------------------------------------------------------
# export: RecurrentGPT -> raven directory


def check_exportable(c):
    """The variant for this config, or a one-line RavenError saying what the format cannot express
    (the variant's family in families.FAMILIES says what it holds)."""
    if c.qk_norm or c.block_type not in RAVEN_EXPORT:
        raise RavenError("cannot export: OLMo-2 blocks (qk_norm, norm on the branch output) have no raven variant")
    if not c.recurrent:
        raise RavenError("cannot export: a static-depth model has no adapter, the raven format needs a recurrent core")
    if c.n_head * c.head_dim != c.n_embd:
        raise RavenError(f"cannot export: n_head*head_dim={c.n_head * c.head_dim} != n_embd={c.n_embd} (raven derives head_dim)")
    if c.state_init == "embed":
        raise RavenError("cannot export: state_init='embed' (s_0 = e) has no raven equivalent (normal or zero only)")
    if c.first_loop == "identity":
        raise RavenError("cannot export: first_loop='identity' (loop 1 feeds the core e, no adapter) has no raven "
                         "equivalent: the raven code runs the adapter on cat[s, e] at every loop")
    variant = RAVEN_EXPORT[c.block_type]  # sandwich -> huginn, prenorm -> retrofit
    family = FAMILIES[RAVEN_VARIANTS[variant]]  # what the variant's modeling code hard-wires
    if not family["gqa"] and c.n_kv_head != c.n_head:
        raise RavenError(f"cannot export: GQA (n_kv_head={c.n_kv_head} != n_head={c.n_head}) in a sandwich model; Huginn's attention has no GQA")
    if family["norm_before_coda"] and not c.norm_before_coda:
        raise RavenError("cannot export: a sandwich model without norm_before_coda; Huginn always applies ln_f before the coda")
    if not family["rope_scaling"] and c.rope_scaling:
        raise RavenError("cannot export: rope_scaling in a sandwich model; Huginn's RoPE has no scaling")
    if family["scale_embedding"] and not math.isclose(c.embed_scale, math.sqrt(c.n_embd), rel_tol=1e-6):
        raise RavenError(f"cannot export: embed_scale={c.embed_scale}, but Huginn's code multiplies by sqrt(n_embd)={math.sqrt(c.n_embd):g}")
    if not family["norm_before_coda"] and c.norm_before_coda:
        raise RavenError("cannot export: norm_before_coda in a pre-norm model; the retrofit code applies ln_f once, after the coda")
    if variant == "retrofit" and c.attn_bias and c.n_kv_head != c.n_head:
        raise RavenError("cannot export: q/k bias with GQA; the retrofit code's qk_bias has one bias per query head")
    return variant


def raven_state_dict(model, variant):
    """The raven tensors of our model (inverse of state_dict_from_raven)."""
    c, sd = model.config, {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    H, KV, hd = c.n_head, c.n_kv_head, c.head_dim
    inv = torch.argsort(interleave_perm(hd)) if FAMILIES[RAVEN_VARIANTS[variant]]["rope"] == "interleaved" else None
    out = {}
    for raven_part, ours in RAVEN_PARTS.items():
        for i in range(len(getattr(model, ours))):
            src, dst = f"{ours}.{i}.", f"transformer.{raven_part}.{i}."
            for rn, on in RAVEN_NORMS.items():
                if f"{src}{on}.weight" in sd:
                    out[f"{dst}{rn}.weight"] = sd[f"{src}{on}.weight"]
            q, k = sd[src + "self_attn.q_proj.weight"], sd[src + "self_attn.k_proj.weight"]
            if inv is not None:  # rotate-half halves -> Huginn's interleaved pairs
                q, k = permute_heads(q, H, hd, inv), permute_heads(k, KV, hd, inv)
            out[dst + "attn.Wqkv.weight"] = torch.cat([q, k, sd[src + "self_attn.v_proj.weight"]], dim=0)
            if c.attn_bias:
                if sd[src + "self_attn.v_proj.bias"].abs().max() > 0:
                    raise RavenError(f"cannot export: {src}self_attn.v_proj.bias is nonzero; raven has a q/k bias only")
                qb = sd[src + "self_attn.q_proj.bias"].view(H, hd)
                kb = sd[src + "self_attn.k_proj.bias"].view(KV, hd)
                if inv is not None:
                    qb, kb = qb[:, inv], kb[:, inv]
                out[dst + "attn.qk_bias"] = torch.stack([qb, kb])[:, None]  # (2, 1, H, hd)
            out[dst + "attn.proj.weight"] = sd[src + "self_attn.o_proj.weight"]
            out[dst + "mlp.fc.weight"] = torch.cat([sd[src + "mlp.gate_proj.weight"], sd[src + "mlp.up_proj.weight"]], dim=0)
            out[dst + "mlp.proj.weight"] = sd[src + "mlp.down_proj.weight"]
    for rk, ok in RAVEN_TOP.items():
        if not (rk == "lm_head.weight" and c.tie_embeddings):  # save_pretrained drops a tied head
            out[rk] = sd[ok]
    if variant == "huginn":  # a persistent buffer in Huginn's class: store it so from_pretrained finds it
        out["freqs_cis"] = huginn_freqs_cis(hd, c.block_size, c.rope_theta)
    return {k: v.contiguous() for k, v in out.items()}


def raven_config(c, variant):
    """config.json as RavenConfig.save_pretrained writes it (Huginn-0125 defaults for the rest)."""
    depth = c.n_prelude + c.n_coda + c.n_core * c.mean_recurrence  # effective_expected_depth
    std0 = math.sqrt(2 / (5 * c.n_embd))
    std = 0.0 if c.state_init == "zero" else (c.state_std if c.state_std is not None else std0)
    huginn = variant == "huginn"
    cfg = {
        "activation_checkpoint_impl": "per-iteration", "architecture_class_name": "RecurrentGPT",
        "architectures": ["RavenForCausalLM"],
        "auto_map": {"AutoConfig": "raven_config_minimal.RavenConfig",
                     "AutoModelForCausalLM": "raven_modeling_minimal.RavenForCausalLM"},
        "bias": False, "block_class_name": "SandwichBlock", "block_size": c.block_size,
        "effective_expected_depth": depth, "head_dim": c.head_dim, "init_orthogonal": False,
        "init_strategy": "takase",
        "init_values": {"embed_scale": math.sqrt(c.n_embd) if huginn else float(c.embed_scale),
                        "embedding": std0, "out_proj": std0 / math.sqrt(2 * depth), "std": std},
        "injection_type": "linear", "intermediate_size": c.intermediate_size, "mean_backprop_depth": 8,
        "mean_recurrence": c.mean_recurrence, "mlp_class_name": "GatedMLP", "model_type": "huginn_raven",
        "n_embd": c.n_embd, "n_heads": c.n_head, "n_layers": c.n_prelude + c.n_core + c.n_coda,
        "n_layers_in_coda": c.n_coda, "n_layers_in_prelude": c.n_prelude,
        "n_layers_in_recurrent_block": c.n_core, "nonlin_name": "SiLU", "norm_class_name": "RMSNorm_llama",
        "norm_eps": c.norm_eps, "num_key_value_heads": c.n_kv_head, "padded_vocab_size": c.vocab_size,
        "padding_multiple": 4096, "qk_bias": c.attn_bias,
        # Huginn reads rope_base; the retrofit code reads rope_theta only. Writing the same base in both
        # fields keeps tools that read the wrong one correct (the published retrofits hold a stale 500000)
        "rope_base": c.rope_theta,
        "sampling_scheme": "poisson-lognormal-filling", "state_init": "like-init", "test_time_noise": 0,
        "test_time_noise_type": "fixed", "tie_embeddings": c.tie_embeddings, "torch_dtype": "float32",
        "transformers_version": "4.51.0", "vocab_size": c.vocab_size,
    }
    if not huginn:
        cfg["rope_theta"] = c.rope_theta
        cfg["max_position_embeddings"] = c.block_size
        if c.rope_scaling:
            cfg["rope_scaling"] = dict(c.rope_scaling)
    # no tie_word_embeddings key: with both keys Huginn's RavenConfig raises "got multiple values"
    for ours, theirs in (("bos_id", "bos_token_id"), ("eos_id", "eos_token_id")):
        if getattr(c, ours) is not None:
            cfg[theirs] = getattr(c, ours)
    return dict(sorted(cfg.items()))


def save_raven(model, out_dir):
    """Write model.safetensors + config.json of `model` in the raven format; returns the variant."""
    from safetensors.torch import save_file

    variant = check_exportable(model.config)
    tensors = raven_state_dict(model, variant)  # may still refuse (nonzero v bias) before writing anything
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.safetensors")
    save_file(tensors, path + ".tmp", metadata={"format": "pt"})
    os.replace(path + ".tmp", path)
    write_remote_code(out_dir, "raven")  # our own raven_*_minimal.py, named by the config's auto_map
    write_json_atomic(os.path.join(out_dir, "config.json"), raven_config(model.config, variant))
    return variant


def export_raven(model_dir, out_dir):
    """One of our checkpoint directories (or a raven one) -> out_dir in the raven format, with the
    tokenizer files of model_dir when it has them. Returns the variant written."""
    if not os.path.isdir(model_dir):
        raise RavenError(f"{model_dir} is not a directory: pass a checkpoint written by surgery.py or train.py")
    if os.path.abspath(model_dir) == os.path.abspath(out_dir):
        raise RavenError("export_raven: out_dir must differ from model_dir")
    try:
        raven = read_json(os.path.join(model_dir, "config.json")).get("model_type") == "huginn_raven"
        model = load_raven(model_dir) if raven else RecurrentGPT.from_pretrained(model_dir)
    except (FileNotFoundError, ValueError) as err:
        raise RavenError(str(err).splitlines()[0]) from None
    variant = save_raven(model, out_dir)
    for name in TOKENIZER_FILES:  # the files tokenizer.load_tokenizer reads, those that model_dir has
        if os.path.isfile(os.path.join(model_dir, name)):
            os.makedirs(os.path.dirname(os.path.join(out_dir, name)), exist_ok=True)
            shutil.copyfile(os.path.join(model_dir, name), os.path.join(out_dir, name))
    return variant


def main(argv=None):
    p = argparse.ArgumentParser(description="read or write raven (Huginn / retrofit) checkpoints")
    p.add_argument("--load", metavar="DIR", help="load a raven checkpoint and print the mapped config")
    p.add_argument("--export", nargs=2, metavar=("DIR", "OUT"), help="write checkpoint DIR to OUT as raven")
    args = p.parse_args(argv)
    if not (args.load or args.export):
        p.error("give --load DIR or --export DIR OUT")
    try:
        if args.load:
            model = load_raven(args.load)
            print(json.dumps({k: v for k, v in model.config.__dict__.items()}, indent=2, default=str))
            print(model.param_counts())
        if args.export:
            print(f"wrote {args.export[1]} ({export_raven(*args.export)} variant)")
    except RavenError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
