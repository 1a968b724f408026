"""
nanorecur remote code: a nanorecur checkpoint as a Hugging Face transformers (5.x) model, the config and
model classes that `trust_remote_code` loads from the checkpoint directory. Self-contained (torch and
transformers only), so it runs where nanorecur is not installed.

The model is a pretrained decoder cut into prelude / recurrent core / coda (McLeish et al. 2025, arXiv
2511.07384, on the architecture of Huginn-0125, Geiping et al. 2025, arXiv 2502.05171):

    e = P(embed(x));  s_0 ~ init_state(e);  s_i = R(adapter(cat[s_{i-1}, e])), i = 1..r;  logits = head(C(s_r))

The parameter names are nanorecur's own, so the directory's model.safetensors loads as it is, and every
operation is nanorecur's model.py in the same order, so the logits agree with it to 1e-5 in fp32.

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)  # add state_init="zero": deterministic
    logits = model(ids, num_steps=4).logits            # r = 4 loops of the core (default: config.mean_recurrence)
    out = model.generate(ids, num_steps=8, max_new_tokens=20, do_sample=False)
    out = model.generate(ids, num_steps=32, exit_threshold=0.9, max_new_tokens=20)  # a checkpoint with an exit gate

exit_threshold (a checkpoint trained with nanorecur's `train.py --exit_gate`, "exit_gate": true): each generated
token stops looping after the first loop whose gate probability reaches it (never before exit_min_loops), as
nanorecur's `sample.py --exit gate` does: the KV cache then holds, for that token's later loops, the entries of
its last loop. Only one-token steps with the cache exit early; the prompt runs every loop.

nanorecur writes this file into every directory it saves (plumbing/hf_remote.py); its source is
plumbing/hf/modeling_nanorecur.py in the nanorecur repository.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast


class NanorecurConfig(PreTrainedConfig):
    """nanorecur's RecurrentConfig (model.py): the same fields under the same names, as config.json holds them."""

    model_type = "nanorecur"
    # transformers' generic code (generate, tying, device maps) reads these names: point them at ours
    attribute_map = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_key_value_heads": "n_kv_head",
                     "tie_word_embeddings": "tie_embeddings", "bos_token_id": "bos_id", "eos_token_id": "eos_id",
                     "rms_norm_eps": "norm_eps", "max_position_embeddings": "block_size"}  # fmt: skip
    vocab_size: int = 256
    n_embd: int = 64
    n_head: int = 4
    n_kv_head: int = 4
    head_dim: int = 16
    intermediate_size: int = 256
    block_size: int = 2048
    block_type: str = "prenorm"  # prenorm (Llama, Qwen2.5) | olmo2 | sandwich (Huginn)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # llama3 only; a field here, not transformers' rope_parameters alias
    attn_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = True
    embed_scale: float = 1.0
    bos_id: int | None = None
    eos_id: int | None = None
    n_prelude: int = 1
    n_core: int = 2
    n_coda: int = 1
    recurrent: bool = True  # False: the static-depth baseline (core once, no adapter)
    adapter_init: str = "identity"
    state_init: str = "normal"  # normal (truncated at 3 std) | zero | embed (s_0 = e)
    state_std: float | None = None  # None: sqrt(2 / (5 h)) as in Huginn
    norm_before_coda: bool = False
    mean_recurrence: int = 4  # r when num_steps is not given
    exit_gate: bool = False  # a learned exit gate (nanorecur's exit_gate.py) under exit_gate.*
    layers: dict | None = None  # provenance (parent layer indices, source)
    parent: dict | None = None

    def __post_init__(self, **kwargs):
        if self.block_type not in ("prenorm", "olmo2", "sandwich"):
            raise ValueError(f"block_type must be prenorm, olmo2 or sandwich, not {self.block_type!r}")
        if self.state_init not in ("normal", "zero", "embed"):
            raise ValueError(f"state_init must be normal, zero or embed, not {self.state_init!r}")
        super().__post_init__(**kwargs)

    @property
    def num_hidden_layers(self):
        # generate() builds its DynamicCache with this many entries: the blocks one pass runs at mean_recurrence
        return self.n_prelude + self.n_coda + self.n_core * (self.mean_recurrence if self.recurrent else 1)


# -----------------------------------------------------------------------------
# RMSNorm, rotary embeddings, attention, MLP, block: model.py's, line for line


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()  # the statistic in fp32, as in Llama
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(head_dim, theta, scaling=None):
    """Inverse frequencies, with Llama-3's scaling: long wavelengths / factor, short ones kept, a blend between."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling or scaling.get("rope_type", "default") == "default":
        return inv_freq
    if scaling["rope_type"] != "llama3":
        raise ValueError(f"unsupported rope scaling {scaling['rope_type']!r}: only 'llama3' is implemented")
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / hi) & ~(wavelen > old_len / lo)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)  # x (B, nh, T, hd); cos, sin (B, T, hd)


class Attention(nn.Module):
    """Grouped-query attention; optional q/k/v bias (Qwen2.5) and RMSNorm over the full q, k projections (OLMo-2)."""

    def __init__(self, config):
        super().__init__()
        h, hd = config.n_embd, config.head_dim
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, hd
        self.q_proj = nn.Linear(h, config.n_head * hd, bias=config.attn_bias)
        self.k_proj = nn.Linear(h, config.n_kv_head * hd, bias=config.attn_bias)
        self.v_proj = nn.Linear(h, config.n_kv_head * hd, bias=config.attn_bias)
        self.o_proj = nn.Linear(config.n_head * hd, h, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(config.n_head * hd, config.norm_eps)
            self.k_norm = RMSNorm(config.n_kv_head * hd, config.norm_eps)

    def forward(self, x, rope, mask, cache, slot):
        B, T, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.update(k, v, slot)  # (B, nkv, S, hd): this (block, loop)'s past, then the new positions
        gqa = self.n_kv_head != self.n_head
        if mask is None:  # no padding, and a whole sequence (causal) or one new token (sees everything)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=gqa)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


class Block(nn.Module):
    """prenorm:  x += attn(input_ln x);          x += mlp(post_attention_ln x)
    olmo2:    x += post_attention_ln(attn x);   x += post_feedforward_ln(mlp x)
    sandwich: x = post_attention_ln(x + attn(input_ln x)); x = post_feedforward_ln(x + mlp(pre_feedforward_ln x))"""

    def __init__(self, config):
        super().__init__()
        self.layout = config.block_type
        norm = lambda: RMSNorm(config.n_embd, config.norm_eps)
        self.self_attn, self.mlp = Attention(config), MLP(config)
        if self.layout in ("prenorm", "sandwich"):
            self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        if self.layout == "sandwich":
            self.pre_feedforward_layernorm = norm()
        if self.layout in ("olmo2", "sandwich"):
            self.post_feedforward_layernorm = norm()

    def forward(self, x, rope, mask, cache, slot):
        attn = lambda z: self.self_attn(z, rope, mask, cache, slot)
        if self.layout == "prenorm":
            x = x + attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))
        if self.layout == "olmo2":
            x = x + self.post_attention_layernorm(attn(x))
            return x + self.post_feedforward_layernorm(self.mlp(x))
        x = self.post_attention_layernorm(x + attn(self.input_layernorm(x)))
        return self.post_feedforward_layernorm(x + self.mlp(self.pre_feedforward_layernorm(x)))


class ExitGate(nn.Module):
    """nanorecur's exit_gate.py: Linear(2h + 1 -> 1) on [rmsnorm(s_i), rmsnorm(s_i - s_{i-1}), log latent-diff],
    the logit that the token's answer after loop i is the one it keeps (in fp32)."""

    def __init__(self, n_embd):
        super().__init__()
        self.proj = nn.Linear(2 * n_embd + 1, 1)

    def forward(self, s_prev, s):
        s, d = s.float(), s.float() - s_prev.float()
        size = (d.norm(dim=-1) / s.norm(dim=-1).clamp_min(1e-12)).clamp_min(1e-12).log()
        h = (s.shape[-1],)
        x = torch.cat([F.rms_norm(s, h), F.rms_norm(d, h, eps=1e-12), size[..., None]], dim=-1)
        return F.linear(x, self.proj.weight.float(), self.proj.bias.float()).squeeze(-1)


# -----------------------------------------------------------------------------
# the model


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


class NanorecurForCausalLM(PreTrainedModel, GenerationMixin):
    """The recurrent-depth model. forward(input_ids, num_steps=r) runs the core r times; generate(..., num_steps=r)
    decodes with a KV cache of one entry per (block, loop), r entries per core layer (Huginn §6)."""

    config_class = NanorecurConfig
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"lm_head.weight": "embed_tokens.weight"}  # tied when config.tie_embeddings
    _supports_sdpa = True

    def __init__(self, config):
        super().__init__(config)
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.n_embd)
        self.prelude = nn.ModuleList(Block(c) for _ in range(c.n_prelude))
        self.core = nn.ModuleList(Block(c) for _ in range(c.n_core))
        self.coda = nn.ModuleList(Block(c) for _ in range(c.n_coda))
        if c.recurrent:
            self.adapter = nn.Linear(2 * c.n_embd, c.n_embd, bias=False)  # on cat[s, e], state first
        if c.exit_gate:
            self.exit_gate = ExitGate(c.n_embd)
        self.norm = RMSNorm(c.n_embd, c.norm_eps)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def loops(self, num_steps):
        """num_steps (int r, a pair (n without grad, k with grad) as in nanorecur, or None) -> (n, k)."""
        if not self.config.recurrent:
            return 0, 1
        num_steps = self.config.mean_recurrence if num_steps is None else num_steps
        n, k = (0, int(num_steps)) if isinstance(num_steps, int) else (int(num_steps[0]), int(num_steps[1]))
        if n < 0 or k < 0 or n + k < 1:
            raise ValueError(f"num_steps must give at least one loop, got {num_steps}")
        return n, k

    def rope(self, position_ids):
        # (cos, sin) (B, T, hd) from integer positions (B, T); computed per call, so no buffer has to survive
        # transformers' loading on the meta device
        c = self.config
        inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling).to(position_ids.device)
        freqs = (inv_freq[None, :, None] @ position_ids[:, None, :].float()).transpose(1, 2)  # (B, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        dtype = self.embed_tokens.weight.dtype
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def init_state(self, e):
        c = self.config
        if c.state_init == "zero" or not c.recurrent:
            return torch.zeros_like(e)
        if c.state_init == "embed":
            return e.clone()
        std = c.state_std if c.state_std is not None else math.sqrt(2 / (5 * c.n_embd))
        s = torch.empty_like(e, dtype=torch.float32)  # a fresh draw every forward pass, truncated at +-3 std
        nn.init.trunc_normal_(s, mean=0.0, std=std, a=-3 * std, b=3 * std)
        return (s * c.embed_scale).to(e.dtype)

    def slot(self, part, layer, loop=0):
        """The cache entry of a block at a loop: the prelude's, the coda's, then core layer j at loop i, so that no
        index moves with r (nanorecur's KVCache keys its entries by (part, layer, loop) the same way)."""
        P, C, N = len(self.prelude), len(self.coda), len(self.core)
        return {"prelude": layer, "coda": P + layer, "core": P + C + loop * N + layer}[part]

    def prepare_cache(self, cache, use_cache, r):
        """The cache this pass reads and writes (None without one), with room for r loops: generate() sizes its
        DynamicCache by config.num_hidden_layers, the blocks of one pass at mean_recurrence."""
        if use_cache is False:
            return None
        if cache is None:
            return DynamicCache() if use_cache else None
        N = len(self.core)
        past = cache.get_seq_length()
        if past and cache.get_seq_length(self.slot("core", N - 1, r - 1)) != past:
            raise ValueError(f"this cache was filled with fewer than num_steps={r} loops: decode with the same "
                             "num_steps as the prefill")
        while len(cache.layers) < self.slot("core", 0, r):
            cache.layers.append(DynamicLayer())
        return cache

    def exit_rows(self, s_prev, s, exited, i, threshold, min_loops):
        """(B,) bool: the rows of a one-token step whose gate fires after loop i (0-based), of those still looping."""
        p = torch.sigmoid(self.exit_gate(s_prev[:, -1], s[:, -1]))
        return (p >= threshold) & ~exited & (i + 1 >= min_loops)

    def freeze_exited(self, cache, n_run, r):
        """A row that exited after n_run[b] < r loops keeps, in the cache of the current position, the entries of
        its last loop at every later loop (what its later tokens read; nanorecur's KVCache does the same)."""
        for b in (n_run < r).nonzero().flatten().tolist():
            last = int(n_run[b]) - 1
            for j in range(len(self.core)):
                src = cache.layers[self.slot("core", j, last)]
                for i in range(last + 1, r):
                    dst = cache.layers[self.slot("core", j, i)]
                    dst.keys[b, :, -1:], dst.values[b, :, -1:] = src.keys[b, :, -1:], src.values[b, :, -1:]

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=None, labels=None,
                num_steps=None, logits_to_keep=0, exit_threshold=None, exit_min_loops=1, **kwargs):
        """input_ids (B, T) -> CausalLMOutputWithPast: logits (B, T, V) fp32 (the last logits_to_keep positions if
        > 0), loss when labels (B, T) are given (transformers' convention: shifted here, -100 carries none), and the
        cache. attention_mask (B, past + T): 0 on (left) padding. exit_threshold: the exit gate's probability at
        which a token of a one-token cached step stops looping (None: every token runs every loop). Other
        transformers keywords are ignored."""
        c = self.config
        n, k = self.loops(num_steps)
        if kwargs.get("inputs_embeds") is not None:
            raise ValueError("inputs_embeds is not supported: pass input_ids (the prelude starts from the token ids)")
        if exit_threshold is not None and not c.exit_gate:
            raise ValueError("exit_threshold needs a checkpoint with an exit gate (\"exit_gate\": true in config.json; "
                             "nanorecur's train.py --exit_gate trains one)")
        if exit_threshold is not None and use_cache is False:
            raise ValueError("exit_threshold exits tokens one at a time through the KV cache: leave use_cache on")
        cache = self.prepare_cache(cache, use_cache, n + k)
        past = cache.get_seq_length() if cache is not None else 0
        adaptive = exit_threshold is not None and cache is not None and past > 0 and input_ids.shape[1] == 1
        position_ids, mask = attention_inputs(attention_mask, position_ids, past, input_ids)
        rope = self.rope(position_ids)
        # 1. embedding + prelude, once: e (B, T, h)
        x = self.embed_tokens(input_ids)
        if c.embed_scale != 1.0:
            x = x * c.embed_scale
        for i, block in enumerate(self.prelude):
            x = block(x, rope, mask, cache, self.slot("prelude", i))
        e = x
        # 2. the initial state s_0 (B, T, h); 3. the loops, the first n without gradient
        s = self.init_state(e)
        B, r = input_ids.shape[0], n + k
        if adaptive:  # per row: exited yet, and after how many loops
            exited, n_run = torch.zeros(B, dtype=torch.bool, device=s.device), torch.full((B,), r, device=s.device)
        for i in range(r):
            with torch.set_grad_enabled(torch.is_grad_enabled() and i >= n):
                x = self.adapter(torch.cat([s, e], dim=-1)) if c.recurrent else e
                for j, block in enumerate(self.core):
                    x = block(x, rope, mask, cache, self.slot("core", j, i))
                if adaptive:  # a row that exited keeps its state; its later loops' outputs are dropped
                    x = torch.where(exited[:, None, None], s, x)
                    done = self.exit_rows(s, x, exited, i, exit_threshold, exit_min_loops) & (i + 1 < r)
                    n_run[done], exited = i + 1, exited | done
                s = x
        if adaptive:
            self.freeze_exited(cache, n_run, r)
        # 4. coda, final norm, head
        x = self.norm(s) if c.norm_before_coda else s
        for i, block in enumerate(self.coda):
            x = block(x, rope, mask, cache, self.slot("coda", i))
        x = self.norm(x)
        logits = self.lm_head(x[:, -logits_to_keep:] if logits_to_keep else x).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)


__all__ = ["NanorecurConfig", "NanorecurForCausalLM"]
