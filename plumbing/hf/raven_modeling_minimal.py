"""
nanorecur remote code: a "raven" checkpoint (Huginn-0125 or a retrofitted Llama) as a Hugging Face
transformers (5.x) model, nanorecur's own code (not a copy of the published raven_modeling_minimal.py), reading
the same tensors. The layout comes from config.json (RavenConfig.variant), not from this file, which serves both.
What is common to every recurrent-depth model (RMSNorm, the RoPE frequencies, attention, the KV cache of one
entry per block and loop, the padding mask) it imports from nanorecur's model.py and modeling_nanorecur.py,
written beside it; what is Huginn's is here: the tensor names, the fused Wqkv and MLP, RoPE on interleaved pairs.

The model (Geiping et al. 2025, arXiv 2502.05171; McLeish et al. 2025, arXiv 2511.07384):

    e = P(wte(x) * scale);  s_0 ~ TruncNormal or 0;  s_i = R(adapter(cat[s_{i-1}, e])), i = 1..r;  logits = head(C(s_r))

in one of two layouts (RavenConfig.variant, from config.json):
- huginn:   sandwich blocks (norm_1..norm_4), RoPE on interleaved pairs (x[2i], x[2i+1]) with base rope_base,
            scale sqrt(n_embd), ln_f on s_r before the coda and again after it;
- retrofit: Llama pre-norm blocks (norm_1, norm_2), rotate-half RoPE (x[i], x[i + hd/2]) with base rope_theta
            (llama3 rope_scaling optional), GQA, scale init_values.embed_scale, ln_f once after the coda.

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)
    logits = model(ids, num_steps=4, init_scale=0.0).logits   # r = 4 loops from a zero state (deterministic)
    out = model.generate(ids, num_steps=8, max_new_tokens=20, do_sample=False)

Unlike the published code, an int num_steps keeps gradients through every loop (a pair [n, k]: n loops without,
then k with); the logits are the same.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model import RMSNorm, attend, attend_cached, rope_inv_freq
from .modeling_nanorecur import LoopCache, LoopedCausalLM, attention_inputs
from .raven_config_minimal import RavenConfig


def apply_rope(x, cos, sin, interleaved):
    """x (B, T, nh, hd); cos, sin (B, T, 1, hd/2). Huginn rotates each pair (x[2i], x[2i+1]) as a complex number,
    the Llama retrofit the pair (x[i], x[i + hd/2])."""
    if interleaved:
        x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)  # each (B, T, nh, hd/2)
        return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1).flatten(-2)
    x0, x1 = x.chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    return x * cos + torch.cat([-x1, x0], dim=-1) * sin


class Attention(nn.Module):
    """Fused Wqkv (rows q, k, v, head-major), an optional qk_bias (2, 1, H, hd) added to q and k before RoPE."""

    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_heads, config.num_key_value_heads, config.head_dim
        self.interleaved = config.variant == "huginn"
        self.Wqkv = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=False)
        if config.qk_bias:
            self.qk_bias = nn.Parameter(torch.zeros(2, 1, self.n_head, self.head_dim))
        self.proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=False)

    def forward(self, x, rope, mask, cache, key):
        B, T, _ = x.shape
        H, KV, hd = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.Wqkv(x).split([H * hd, KV * hd, KV * hd], dim=-1)
        q, k, v = q.view(B, T, H, hd), k.view(B, T, KV, hd), v.view(B, T, KV, hd)
        if hasattr(self, "qk_bias"):
            q, k = q + self.qk_bias[0], k + self.qk_bias[1]
        q, k = apply_rope(q, *rope, self.interleaved), apply_rope(k, *rope, self.interleaved)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)
        y = attend(q, k, v, mask) if cache is None else attend_cached(q, k, v, mask, cache, key)  # model.py's
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 2 * config.intermediate_size, bias=False)  # rows: gate, then up
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x):
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(F.silu(gate) * up)


class Block(nn.Module):
    """huginn:   x = norm_2(x + attn(norm_1 x));  x = norm_4(x + mlp(norm_3 x))
    retrofit: x = x + attn(norm_1 x);          x = x + mlp(norm_2 x)"""

    def __init__(self, config):
        super().__init__()
        self.sandwich = config.variant == "huginn"
        norm = lambda: RMSNorm(config.n_embd, config.norm_eps)
        self.norm_1, self.attn, self.norm_2, self.mlp = norm(), Attention(config), norm(), MLP(config)
        if self.sandwich:
            self.norm_3, self.norm_4 = norm(), norm()

    def forward(self, x, rope, mask, cache, key):
        if self.sandwich:
            x = self.norm_2(x + self.attn(self.norm_1(x), rope, mask, cache, key))
            return self.norm_4(x + self.mlp(self.norm_3(x)))
        x = x + self.attn(self.norm_1(x), rope, mask, cache, key)
        return x + self.mlp(self.norm_2(x))


class RavenForCausalLM(LoopedCausalLM):
    """forward(input_ids, num_steps=r) runs the core r times; generate(..., num_steps=r) decodes with a KV cache
    of one entry per (block, loop), r entries per core layer (Huginn §6)."""

    config_class = RavenConfig
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}  # tied when config.tie_embeddings
    # freqs_cis: Huginn's stored RoPE table, derived data (recomputed). norm_3/norm_4 that a retrofit converter
    # left behind are not ignored: transformers names them as unused
    _keys_to_ignore_on_load_unexpected = [r"^freqs_cis$"]

    def __init__(self, config):
        super().__init__(config)
        c, V = config, config.padded_vocab_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, c.n_embd),
            prelude=nn.ModuleList(Block(c) for _ in range(c.n_layers_in_prelude)),
            adapter=nn.Linear(2 * c.n_embd, c.n_embd, bias=False),  # on cat[s, e], state first
            core_block=nn.ModuleList(Block(c) for _ in range(c.n_layers_in_recurrent_block)),
            coda=nn.ModuleList(Block(c) for _ in range(c.n_layers_in_coda)),
            ln_f=RMSNorm(c.n_embd, c.norm_eps),
        ))  # fmt: skip
        self.lm_head = nn.Linear(c.n_embd, V, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.transformer.wte

    def get_output_embeddings(self):
        return self.lm_head

    @property
    def embed_scale(self):
        c = self.config  # Huginn's code computes sqrt(n_embd); the retrofit reads init_values
        return math.sqrt(c.n_embd) if c.variant == "huginn" else float(c.init_values.get("embed_scale", 1.0))

    def loops(self, num_steps):
        """num_steps (int r, a pair / 2-element tensor [n without grad, k with grad], or None) -> (n, k)."""
        num_steps = self.config.mean_recurrence if num_steps is None else num_steps
        num_steps = num_steps.tolist() if torch.is_tensor(num_steps) else num_steps
        n, k = (0, int(num_steps)) if isinstance(num_steps, int) else (int(num_steps[0]), int(num_steps[1]))
        if n < 0 or k < 0 or n + k < 1:
            raise ValueError(f"num_steps must give at least one loop, got {num_steps}")
        return n, k

    def rope(self, position_ids):
        """(cos, sin) (B, T, 1, hd/2) for integer positions (B, T); computed per call (no buffer to load)."""
        c = self.config
        huginn = c.variant == "huginn"
        theta, scaling = (c.rope_base, None) if huginn else (c.rope_theta, c.rope_scaling)
        inv_freq = rope_inv_freq(c.head_dim, theta, scaling).to(position_ids.device)
        freqs = (inv_freq[None, :, None] @ position_ids[:, None, :].float()).transpose(1, 2)  # (B, T, hd/2)
        dtype = self.transformer.wte.weight.dtype
        return freqs.cos().to(dtype)[:, :, None], freqs.sin().to(dtype)[:, :, None]

    def init_state(self, e, init_scale):
        std = float(self.config.init_values["std"]) * init_scale
        if std == 0:  # the zero state, as the reference code makes it
            return torch.zeros_like(e)
        s = torch.empty_like(e, dtype=torch.float32)  # a fresh draw every forward pass, truncated at +-3 std
        nn.init.trunc_normal_(s, mean=0.0, std=std, a=-3 * std, b=3 * std)
        return (s * self.embed_scale).to(e.dtype)

    def parts(self):
        t = self.transformer
        return t.prelude, t.coda, t.core_block

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=None, labels=None,
                num_steps=None, init_scale=1.0, logits_to_keep=0, **kwargs):
        """input_ids (B, T) -> CausalLMOutputWithPast: logits (B, T, V) fp32 (the last logits_to_keep positions if
        > 0), loss when labels (B, T) are given (shifted here, -100 carries none), and the cache. attention_mask
        (B, past + T): 0 on (left) padding. init_scale multiplies s_0's std (0: the zero state). Other
        transformers keywords are ignored."""
        c, t = self.config, self.transformer
        n, k = self.loops(num_steps)
        if kwargs.get("inputs_embeds") is not None:
            raise ValueError("inputs_embeds is not supported: pass input_ids (the prelude starts from the token ids)")
        cache = self.prepare_cache(cache, use_cache, n + k)
        kv = LoopCache(cache, self.slot) if cache is not None else None
        past = cache.get_seq_length() if cache is not None else 0
        position_ids, mask = attention_inputs(attention_mask, position_ids, past, input_ids)
        rope = self.rope(position_ids)
        # 1. embedding + prelude, once: e (B, T, h)
        x = t.wte(input_ids)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        for i, block in enumerate(t.prelude):
            x = block(x, rope, mask, kv, ("prelude", i, 0))
        e = x
        # 2. the initial state s_0 (B, T, h); 3. the loops, the first n without gradient
        s = self.init_state(e, init_scale)
        for i in range(n + k):
            with torch.set_grad_enabled(torch.is_grad_enabled() and i >= n):
                x = t.adapter(torch.cat([s, e], dim=-1))
                for j, block in enumerate(t.core_block):
                    x = block(x, rope, mask, kv, ("core", j, i))
                s = x
        # 4. coda, final norm, head (Huginn: ln_f before the coda too, the same weight twice)
        x = t.ln_f(s) if c.variant == "huginn" else s
        for i, block in enumerate(t.coda):
            x = block(x, rope, mask, kv, ("coda", i, 0))
        x = t.ln_f(x)
        logits = self.lm_head(x[:, -logits_to_keep:] if logits_to_keep else x).float()
        return self.output(logits, labels, cache)


__all__ = ["RavenForCausalLM"]
