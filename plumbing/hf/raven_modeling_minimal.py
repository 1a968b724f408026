"""
nanorecur remote code: a "raven" checkpoint (Huginn-0125 or a retrofitted Llama) as a Hugging Face
transformers (5.x) model, nanorecur's own code (not a copy of the published raven_modeling_minimal.py), reading
the same tensors. It imports only torch and transformers (and its config beside it). The layout comes from
config.json (RavenConfig.variant), not from this file, which serves both.

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
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from .raven_config_minimal import RavenConfig


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()  # the statistic in fp32
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(head_dim, theta, scaling=None):
    """Inverse frequencies, with Llama-3's scaling (retrofit only): long wavelengths / factor, a blend in between."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))  # old configs say "type"
    if kind == "default":
        return inv_freq
    if kind != "llama3":
        raise ValueError(f"unsupported rope scaling {kind!r}: only 'llama3' is implemented")
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / hi) & ~(wavelen > old_len / lo)
    return torch.where(medium, smoothed, scaled)


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

    def forward(self, x, rope, mask, cache, slot):
        B, T, _ = x.shape
        H, KV, hd = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.Wqkv(x).split([H * hd, KV * hd, KV * hd], dim=-1)
        q, k, v = q.view(B, T, H, hd), k.view(B, T, KV, hd), v.view(B, T, KV, hd)
        if hasattr(self, "qk_bias"):
            q, k = q + self.qk_bias[0], k + self.qk_bias[1]
        q, k = apply_rope(q, *rope, self.interleaved), apply_rope(k, *rope, self.interleaved)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)
        if cache is not None:
            k, v = cache.update(k, v, slot)  # (B, KV, S, hd): this (block, loop)'s past, then the new positions
        gqa = KV != H
        if mask is None:  # no padding, and a whole sequence (causal) or one new token (sees everything)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=gqa)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
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

    def forward(self, x, rope, mask, cache, slot):
        if self.sandwich:
            x = self.norm_2(x + self.attn(self.norm_1(x), rope, mask, cache, slot))
            return self.norm_4(x + self.mlp(self.norm_3(x)))
        x = x + self.attn(self.norm_1(x), rope, mask, cache, slot)
        return x + self.mlp(self.norm_2(x))


def attention_inputs(attention_mask, position_ids, past, input_ids):
    """Position ids (B, T) and the attention mask (B, 1, T, S) or None for T new tokens after `past` cached ones.
    attention_mask (B, S) is 0 on left padding: a padded row counts its positions from its first real token, and no
    real token attends to a pad. None (the causal default) unless there is padding or a block of tokens after a
    past, as in nanorecur's sample.py."""
    (B, T), dev = input_ids.shape, input_ids.device
    S = past + T
    if position_ids is None:
        if attention_mask is not None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)[:, past:S]
        else:
            position_ids = torch.arange(past, S, device=dev)[None].expand(B, T)
    if (attention_mask is None or bool(attention_mask.all())) and not (past and T > 1):
        return position_ids, None
    valid = attention_mask.bool() if attention_mask is not None else torch.ones(B, S, dtype=torch.bool, device=dev)
    q, j = torch.arange(past, S, device=dev)[:, None], torch.arange(S, device=dev)[None]
    return position_ids, ((valid[:, None, :] & (j <= q)) | (j == q))[:, None]  # a pad query sees itself: no NaN


class RavenForCausalLM(PreTrainedModel, GenerationMixin):
    """forward(input_ids, num_steps=r) runs the core r times; generate(..., num_steps=r) decodes with a KV cache
    of one entry per (block, loop), r entries per core layer (Huginn §6)."""

    config_class = RavenConfig
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}  # tied when config.tie_embeddings
    # freqs_cis: Huginn's stored RoPE table, derived data (recomputed). norm_3/norm_4 that a retrofit converter
    # left behind are not ignored: transformers names them as unused
    _keys_to_ignore_on_load_unexpected = [r"^freqs_cis$"]
    _supports_sdpa = True

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

    def slot(self, part, layer, loop=0):
        """The cache entry of a block at a loop: the prelude's, the coda's, then core layer j at loop i, so that no
        index moves with r (nanorecur's KVCache keys its entries by (part, layer, loop) the same way)."""
        t = self.transformer
        P, C, N = len(t.prelude), len(t.coda), len(t.core_block)
        return {"prelude": layer, "coda": P + layer, "core": P + C + loop * N + layer}[part]

    def prepare_cache(self, cache, use_cache, r):
        """The cache this pass reads and writes (None without one), with room for r loops: generate() sizes its
        DynamicCache by config.num_hidden_layers, the blocks of one pass at mean_recurrence."""
        if use_cache is False:
            return None
        if cache is None:
            return DynamicCache() if use_cache else None
        N = len(self.transformer.core_block)
        past = cache.get_seq_length()
        if past and cache.get_seq_length(self.slot("core", N - 1, r - 1)) != past:
            raise ValueError(f"this cache was filled with fewer than num_steps={r} loops: decode with the same "
                             "num_steps as the prefill")
        while len(cache.layers) < self.slot("core", 0, r):
            cache.layers.append(DynamicLayer())
        return cache

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
        past = cache.get_seq_length() if cache is not None else 0
        position_ids, mask = attention_inputs(attention_mask, position_ids, past, input_ids)
        rope = self.rope(position_ids)
        # 1. embedding + prelude, once: e (B, T, h)
        x = t.wte(input_ids)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        for i, block in enumerate(t.prelude):
            x = block(x, rope, mask, cache, self.slot("prelude", i))
        e = x
        # 2. the initial state s_0 (B, T, h); 3. the loops, the first n without gradient
        s = self.init_state(e, init_scale)
        for i in range(n + k):
            with torch.set_grad_enabled(torch.is_grad_enabled() and i >= n):
                x = t.adapter(torch.cat([s, e], dim=-1))
                for j, block in enumerate(t.core_block):
                    x = block(x, rope, mask, cache, self.slot("core", j, i))
                s = x
        # 4. coda, final norm, head (Huginn: ln_f before the coda too, the same weight twice)
        x = t.ln_f(s) if c.variant == "huginn" else s
        for i, block in enumerate(t.coda):
            x = block(x, rope, mask, cache, self.slot("coda", i))
        x = t.ln_f(x)
        logits = self.lm_head(x[:, -logits_to_keep:] if logits_to_keep else x).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)


__all__ = ["RavenForCausalLM"]
