"""
The parent families and what makes each one differ from Llama: the one table to read.

Retrofitting (McLeish et al. 2025, arXiv 2511.07384) keeps every parent's own block layout, so that one
loop with the identity adapter is exactly the layer-dropped parent. Across the families that takes a
handful of facts: where the RMSNorms sit, whether q/k/v carry a bias, whether q and k are normalized,
how the embedding is scaled, how RoPE pairs the channels. Huginn-0125 (Geiping et al. 2025,
arXiv 2502.05171) is one more layout, recurrent from the start. This table holds those facts and the
names that lead to each family (a Hugging Face config's model_type, a GGUF's general.architecture, a
raven checkpoint's variant). plumbing/parents.py reads it for a parent, plumbing/raven.py for the raven
format in both directions; the math of each block_type is model.Block's few lines.

    python families.py        # print the table
"""

import json

# the columns
#   differs             what sets the family apart from Llama, in one line
#   hf_model_types      config.json model_type values read as this family (plumbing/parents.py)
#   gguf_architectures  GGUF general.architecture values read as this family (llama only: the GGUF
#                       reader maps no bias or q/k-norm tensors)
#   raven_variant       the raven checkpoint variant that holds this family (plumbing/raven.py)
#   block_type          the layout model.Block runs: prenorm | olmo2 | sandwich
#   norms               the RMSNorms of one block, by their Hugging Face names
#   attn_bias           a bias on q, k, v (Qwen2.5) or on q, k (Huginn); an HF config's attention_bias
#                       adds one to any family, a raven config's qk_bias decides for the raven variants
#   qk_norm             RMSNorm over the full q and k projections, before the head split
#   scale_embedding     e = embed(x) * sqrt(n_embd), and s_0 scaled the same way
#   norm_before_coda    the final norm also on s_r before the coda (then again after it)
#   gqa                 fewer k/v heads than q heads allowed
#   rope                channel pairs RoPE rotates: "halves" (x[i], x[i + hd/2]) or "interleaved"
#                       (x[2i], x[2i+1]); the model runs halves, the raven import permutes the rows
#   rope_scaling        Llama-3's frequency-dependent scaling allowed
FAMILIES = {
    "llama": dict(  # Llama-3.2, TinyLlama, SmolLM2
        differs="the baseline: pre-norm blocks, rotate-half RoPE (llama3 scaling optional), GQA, no biases",
        hf_model_types=("llama", "mistral"), gguf_architectures=("llama",), raven_variant="retrofit",
        block_type="prenorm", norms=("input_layernorm", "post_attention_layernorm"),
        attn_bias=False, qk_norm=False, scale_embedding=False, norm_before_coda=False, gqa=True,
        rope="halves", rope_scaling=True,
    ),
    "qwen2": dict(  # Qwen2.5
        differs="Llama with a bias on the q, k and v projections",
        hf_model_types=("qwen2",), gguf_architectures=(), raven_variant=None,
        block_type="prenorm", norms=("input_layernorm", "post_attention_layernorm"),
        attn_bias=True, qk_norm=False, scale_embedding=False, norm_before_coda=False, gqa=True,
        rope="halves", rope_scaling=True,
    ),
    "olmo2": dict(  # OLMo-2
        differs="norm on each branch's output instead of its input, and RMSNorm over the full q and k",
        hf_model_types=("olmo2",), gguf_architectures=(), raven_variant=None,
        block_type="olmo2", norms=("post_attention_layernorm", "post_feedforward_layernorm"),
        attn_bias=False, qk_norm=True, scale_embedding=False, norm_before_coda=False, gqa=True,
        rope="halves", rope_scaling=True,
    ),
    "huginn": dict(  # Huginn-0125, only ever in the raven format
        differs="sandwich norm (4 per block), embedding * sqrt(h), final norm before the coda too, "
                "no GQA, q/k bias, RoPE on interleaved pairs without scaling",
        hf_model_types=(), gguf_architectures=(), raven_variant="huginn",
        block_type="sandwich", norms=("input_layernorm", "post_attention_layernorm",
                                      "pre_feedforward_layernorm", "post_feedforward_layernorm"),
        attn_bias=True, qk_norm=False, scale_embedding=True, norm_before_coda=True, gqa=False,
        rope="interleaved", rope_scaling=False,
    ),
}  # fmt: skip

# the lookups, each name leading to one family
HF_MODEL_TYPES = {t: name for name, f in FAMILIES.items() for t in f["hf_model_types"]}
GGUF_ARCHITECTURES = {a: name for name, f in FAMILIES.items() for a in f["gguf_architectures"]}
RAVEN_VARIANTS = {f["raven_variant"]: name for name, f in FAMILIES.items() if f["raven_variant"]}
# which raven variant writes a block layout (export): a Qwen2.5-style q/k bias rides in the retrofit one
RAVEN_EXPORT = {FAMILIES[name]["block_type"]: variant for variant, name in RAVEN_VARIANTS.items()}


if __name__ == "__main__":
    for name, f in FAMILIES.items():
        print(f"{name}: {f['differs']}")
        print("    " + json.dumps({k: v for k, v in f.items() if k != "differs"}))
