"""
The prelude / recurrent block / coda transformer of retrofitted recurrence; the nanorecur remote code for
transformers runs this file too, from a copy beside every checkpoint (plumbing/hf/modeling_nanorecur.py).

A pretrained decoder is cut into three parts (McLeish et al. 2025, arXiv 2511.07384, on the
architecture of Huginn-0125, Geiping et al. 2025, arXiv 2502.05171):

    e   = P(embed(x))                          # prelude: the first layers
    s_0 ~ init_state(e)                        # TruncNormal, zero, or e itself
    s_i = R(adapter(cat[s_{i-1}, e]))          # recurrent core, i = 1..r
    p   = C(s_r)                               # coda: the last layers, then the LM head

The blocks keep the parent's own layout and tensor names (Llama pre-norm, OLMo-2's norm on the
branch output, or Huginn's sandwich norm), so one loop with the adapter at [0 | I] is exactly the
layer-dropped parent. More loops at test time spend more compute per token. With first_loop
"identity" (arXiv 2608.11233's identity-preserving single-loop path) loop 1 feeds the core e itself,
s_1 = R(e), and the adapter acts from loop 2 on: with every layer kept, r = 1 is the parent whatever
the adapter has learned.

    python -c "from model import RecurrentGPT, RecurrentConfig; m = RecurrentGPT(RecurrentConfig()); print(m.param_counts())"
    python surgery.py --init=smollm2 --shape 6,8,6 --out out/smollm2   # builds one from a real parent
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

try:  # the exit gate and per-loop supervision are the model's modules in files of their own
    from exit_gate import ExitGate
    from per_loop import IGNORE_INDEX, PerLoopReadout, flat_labels
except ImportError:  # in a checkpoint directory, where transformers imports these files as one package
    from .exit_gate import ExitGate
    from .per_loop import IGNORE_INDEX, PerLoopReadout, flat_labels


# -----------------------------------------------------------------------------
# building blocks: RMSNorm and rotary embeddings


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight, with the statistic taken in fp32 (as in Llama)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        if x.dtype == self.weight.dtype == torch.float32:  # the same ops fused in one call, bitwise
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(head_dim, theta, scaling=None):
    """Inverse frequencies of the rotary embedding, with Llama-3's frequency-dependent scaling
    (long wavelengths divided by `factor`, short ones kept, a smooth blend in between)."""
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


def apply_rope(x, cos, sin):
    """Llama's x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2 | x1] for the halves x1, x2 of each head.
    x (B, n_head, T, hd); cos, sin (B or 1, 1, T, hd) from RecurrentGPT.rope, sin with its first half negated,
    so rotate_half(x) * sin is roll(x, hd/2) * that: the same products, bitwise, in one op instead of a
    split, a negation and a concatenation."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


# -----------------------------------------------------------------------------
# attention, MLP, block


def attend(q, k, v, mask=None):
    """softmax(q k^T / sqrt(hd)) v: q (B, nh, T, hd), k and v (B, nkv, S, hd), query head j reading kv head
    j // (nh / nkv); mask (B, 1, T, S) bool, or None: causal, which needs T == S, or one query (T == 1) that sees
    every key. With a cache a caller passes an explicit mask."""
    gqa = q.shape[1] != k.shape[1]
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    # a Python bool, not is_causal=T > 1: under torch.compile T may be symbolic, and T > 1 a SymBool SDPA refuses
    return F.scaled_dot_product_attention(q, k, v, is_causal=True if q.shape[2] > 1 else False, enable_gqa=gqa)


def attend_cached(q, k, v, mask, cache, key):
    """attend() over the past too: k, v of the new positions go into the KV cache at key = (part, layer, loop)
    (kv_cache.py), which hands back every position's. Left eager under --compile (plumbing/device.py
    compile_blocks): the cache's positions change every token, and traced each would be a recompile."""
    k, v = cache.update(key, k, v)  # (B, nkv, S, hd) with the past prepended
    return attend(q, k, v, mask)


class Attention(nn.Module):
    """Grouped-query attention with rotary embeddings; optional q/k/v bias (Qwen2.5) and q/k RMSNorm
    over the full projection (OLMo-2)."""

    def __init__(self, config):
        super().__init__()
        h, hd = config.n_embd, config.head_dim
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, hd
        self.q_proj = nn.Linear(h, config.n_head * hd, bias=config.attn_bias)
        self.k_proj = nn.Linear(h, config.n_kv_head * hd, bias=config.attn_bias)
        self.v_proj = nn.Linear(h, config.n_kv_head * hd, bias=config.attn_bias)
        self.o_proj = nn.Linear(config.n_head * hd, h, bias=False)
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_norm = RMSNorm(config.n_head * hd, config.norm_eps)
            self.k_norm = RMSNorm(config.n_kv_head * hd, config.norm_eps)

    def project(self, x, rope):
        """x (B, T, h) -> q (B, nh, T, hd), k and v (B, nkv, T, hd), q and k rotated."""
        B, T, _ = x.shape
        nh, nkv, hd = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.qk_norm:  # OLMo-2 normalizes the whole projection, before the head split
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, nh, hd).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
        v = v.view(B, T, nkv, hd).transpose(1, 2)
        return apply_rope(q, *rope), apply_rope(k, *rope), v

    def forward(self, x, rope, mask=None, cache=None, key=None):
        B, T, _ = x.shape
        q, k, v = self.project(x, rope)
        y = attend(q, k, v, mask) if cache is None else attend_cached(q, k, v, mask, cache, key)  # (B, nh, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One transformer layer in the parent's layout. Norm names follow Hugging Face:
    prenorm  (Llama, Qwen2.5, SmolLM2): x += attn(input_ln x);        x += mlp(post_attention_ln x)
    olmo2    (OLMo-2):                   x += post_attention_ln(attn x); x += post_feedforward_ln(mlp x)
    sandwich (Huginn):                   x = post_attention_ln(x + attn(input_ln x));
                                         x = post_feedforward_ln(x + mlp(pre_feedforward_ln x))"""

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

    def forward(self, x, rope, mask=None, cache=None, key=None):
        # self_attn takes its arguments directly, not through a closure: torch.compile guards on the values a
        # closure holds, and key (part, layer, loop) differs from block to block (a recompile each)
        a = (rope, mask, cache, key)
        if self.layout == "prenorm":
            x = x + self.self_attn(self.input_layernorm(x), *a)
            return x + self.mlp(self.post_attention_layernorm(x))
        if self.layout == "olmo2":
            x = x + self.post_attention_layernorm(self.self_attn(x, *a))
            return x + self.post_feedforward_layernorm(self.mlp(x))
        x = self.post_attention_layernorm(x + self.self_attn(self.input_layernorm(x), *a))
        return self.post_feedforward_layernorm(x + self.mlp(self.pre_feedforward_layernorm(x)))


# -----------------------------------------------------------------------------
# the model


@dataclass
class RecurrentConfig:
    # the parent's shape
    vocab_size: int = 256
    n_embd: int = 64
    n_head: int = 4
    n_kv_head: int = 4
    head_dim: int = 16
    intermediate_size: int = 256
    block_size: int = 2048  # longest sequence the model is meant for (informational; rope has no table)
    block_type: str = "prenorm"  # prenorm | olmo2 | sandwich
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # Hugging Face's llama3 dict (rope_type, factor, low/high_freq_factor, ...)
    attn_bias: bool = False  # q/k/v bias (Qwen2.5)
    qk_norm: bool = False  # RMSNorm over the full q and k projections (OLMo-2)
    tie_embeddings: bool = True
    embed_scale: float = 1.0  # Huginn multiplies the embedding, and s_0, by sqrt(h)
    bos_id: int | None = None
    eos_id: int | None = None
    # the cut
    n_prelude: int = 1
    n_core: int = 2
    n_coda: int = 1
    recurrent: bool = True  # False: the static-depth baseline (core runs once, no adapter)
    adapter_init: str = "identity"  # identity [0 | I] | sum (1/sqrt2)[I | I] | random (PyTorch default)
    first_loop: str = "adapter"  # adapter: s_1 = R(adapter(cat[s_0, e])) | identity: s_1 = R(e), adapter from loop 2
    state_init: str = "normal"  # normal (truncated at 3 std) | zero | embed (s_0 = e)
    state_std: float | None = None  # None: sqrt(2 / (5 h)) as in Huginn
    norm_before_coda: bool = False  # Huginn applies the final norm to s_r before the coda, and again after it
    mean_recurrence: int = 4  # the default r at inference (num_steps=None); train.py's sampler mean when it trains
    exit_gate: bool = False  # a learned exit gate on the state (exit_gate.py; train.py --exit_gate)
    # provenance, written by surgery.py / train.py
    layers: dict | None = None  # {"prelude": [...], "core": [...], "coda": [...]} parent layer indices
    parent: dict | None = None  # where the weights came from (id, revision or file hash)

    def __post_init__(self):
        if self.block_type not in ("prenorm", "olmo2", "sandwich"):
            raise ValueError(f"block_type must be prenorm, olmo2 or sandwich, not {self.block_type!r}")
        if self.adapter_init not in ("identity", "sum", "random"):
            raise ValueError(f"adapter_init must be identity, sum or random, not {self.adapter_init!r}")
        if self.state_init not in ("normal", "zero", "embed"):
            raise ValueError(f"state_init must be normal, zero or embed, not {self.state_init!r}")
        if self.first_loop not in ("adapter", "identity"):
            raise ValueError(f"first_loop must be adapter or identity, not {self.first_loop!r}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")


@dataclass
class Trajectory:
    """What forward returns when asked for more than (logits, loss) (analyze.py): the states s_0 .. s_r, each
    (B, T, h) (return_states), and the readouts after the grad loops, the last one being logits
    (return_loop_logits); the field not asked for is None."""

    logits: torch.Tensor
    loss: torch.Tensor | None
    states: list | None
    loop_logits: list | None


class RecurrentGPT(nn.Module):
    config_class = RecurrentConfig  # what from_pretrained builds from config.json

    def __init__(self, config):
        super().__init__()
        self.config = c = config
        self.build(c)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling), persistent=False)
        self.apply(self._init_weights)
        if c.exit_gate:  # P(stop after loop i) from s_i (sample.py --exit gate); zero-initialized, after _init_weights
            self.exit_gate = ExitGate(c.n_embd)
        if c.recurrent:
            self.reset_adapter()

    def build(self, c):
        """The modules, under the names of a checkpoint's tensors (the transformers remote code calls this too)."""
        self.embed_tokens = nn.Embedding(c.vocab_size, c.n_embd)
        self.prelude = nn.ModuleList(Block(c) for _ in range(c.n_prelude))
        self.core = nn.ModuleList(Block(c) for _ in range(c.n_core))
        self.coda = nn.ModuleList(Block(c) for _ in range(c.n_coda))
        if c.recurrent:
            self.adapter = nn.Linear(2 * c.n_embd, c.n_embd, bias=False)  # acts on cat[s, e], state first
        self.norm = RMSNorm(c.n_embd, c.norm_eps)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)

    def _init_weights(self, module):
        # only for models trained from scratch; surgery overwrites everything but the adapter
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def _apply(self, fn, recurse=True):
        # model.to(bf16) would cast the RoPE frequencies too (a dtype error in rope(), and positions off by
        # radians beyond ~1000 tokens): whatever dtype the weights take, they stay fp32, computed afresh
        super()._apply(fn, recurse)
        c = self.config
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling).to(self.inv_freq.device)
        return self

    @torch.no_grad()
    def reset_adapter(self, mode=None):
        """Initialize the adapter W (h, 2h) on cat[s, e] by `mode` (default config.adapter_init); with first_loop
        "identity" it acts from loop 2 on."""
        h, W, mode = self.config.n_embd, self.adapter.weight, mode or self.config.adapter_init
        eye = torch.eye(h, dtype=W.dtype, device=W.device)
        if mode == "identity":  # [0 | I]: output = e, so one loop = the parent
            W.copy_(torch.cat([torch.zeros_like(eye), eye], dim=1))
        elif mode == "sum":  # (s + e) / sqrt 2
            W.copy_(torch.cat([eye, eye], dim=1) / math.sqrt(2))
        else:
            self.adapter.reset_parameters()

    # --- the pieces of the forward pass (forward composes them; so does kv_cache.py's CachedForward)

    def rope(self, position_ids):
        """(cos, sin), each (B or 1, 1, T, hd) to broadcast over the heads, for integer positions (B, T) or (T,):
        the same float32 ops as HF, with sin's first half negated for apply_rope."""
        pos = position_ids if position_ids.dim() == 2 else position_ids[None]
        freqs = (self.inv_freq[None, :, None] @ pos[:, None, :].float()).transpose(1, 2)  # (B, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        sin, half = emb.sin(), freqs.shape[-1]
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        dtype = self.embed_tokens.weight.dtype
        return emb.cos()[:, None].to(dtype), sin[:, None].to(dtype)

    def run_prelude(self, idx, rope, mask=None, cache=None):
        x = self.embed_tokens(idx)  # (B, T, h)
        if self.config.embed_scale != 1.0:
            x = x * self.config.embed_scale
        for i, block in enumerate(self.prelude):
            x = block(x, rope, mask, cache, ("prelude", i, 0))
        return x

    def init_state(self, e, generator=None, seeds=None):
        """s_0 (B, T, h), or e with first_loop "identity". seeds (B,) int: row b is drawn from its own generator
        seeded by seeds[b], so a row's noise does not depend on the batch it sits in (train.py: the same s_0 at any
        world size)."""
        c = self.config
        # first_loop "identity": no loop reads s_0 (loop 1 feeds the core e), whatever state_init says. It is e, what
        # loop 1 does read, so that the states s_0..s_r and the exit gate on s_1 - s_0 see what loop 1 changed
        if c.first_loop == "identity" and c.recurrent:
            return e.clone()
        if c.state_init == "zero" or not c.recurrent:
            return torch.zeros_like(e)
        if c.state_init == "embed":
            return e.clone()
        std = c.state_std if c.state_std is not None else math.sqrt(2 / (5 * c.n_embd))
        s = torch.empty_like(e, dtype=torch.float32)
        # a fresh draw every forward pass (Huginn, arXiv 2502.05171); truncated at +-3 std
        draw = lambda t, g: nn.init.trunc_normal_(t, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=g)
        if seeds is None:
            draw(s, generator)
        else:
            for b, seed in enumerate(seeds.tolist()):
                draw(s[b], torch.Generator(e.device).manual_seed(seed))
        return (s * c.embed_scale).to(e.dtype)

    def iterate(self, s, e, rope, i, mask=None, cache=None, first=None):
        """Loop i (0-based) of the recurrence: s_{i+1} = R(adapter(cat[s_i, e])). With first_loop "identity" a
        position's first loop is R(e) instead (arXiv 2608.11233's identity-preserving single-loop path): loop 0,
        or where first (B, T) bool says so, for a caller whose loop index is not the position's loop count
        (diffusion.py: every pass counts its loops from 0, over positions that joined the wave at different passes).
        Every path (forward, its no-grad loops and per-loop readouts, the decoder, exits, the diffusion sampler,
        the transformers remote code) runs its loops through here, so this is the one place that bypasses."""
        c = self.config
        if not c.recurrent or (c.first_loop == "identity" and i == 0 and first is None):
            x = e  # (B, T, h): no adapter, so with every layer kept one loop is the parent itself
        else:
            # .to(e.dtype): under bf16 autocast the adapter's output is bf16; the state keeps the stream's dtype (fp32)
            x = self.adapter(torch.cat([s, e], dim=-1)).to(e.dtype)  # (B, T, h)
            if c.first_loop == "identity" and first is not None:
                x = torch.where(first[..., None], e, x)
        for j, block in enumerate(self.core):
            x = block(x, rope, mask, cache, ("core", j, i))
        return x

    def readout(self, s, rope, mask=None, cache=None, positions=None):
        """Coda, final norm, head: (B, T, V) logits, or (N, V) at the N positions selected by the
        boolean (B, T) `positions`. The coda runs on every position (attention needs them); the
        head, a 49k-vocabulary matmul for the parents, only where a label is read out."""
        x = self.norm(s) if self.config.norm_before_coda else s
        for i, block in enumerate(self.coda):
            x = block(x, rope, mask, cache, ("coda", i, 0))
        x = self.norm(x)
        return self.lm_head(x if positions is None else x[positions]).float()

    def split_loops(self, num_steps):
        """num_steps (the loops r, a pair (no-grad loops, grad loops), or None) -> (no-grad loops, grad loops).
        None: config.mean_recurrence loops, the model's default r at inference (what the transformers remote
        code and lm-eval's mean_recurrence=... set)."""
        if not self.config.recurrent:
            return 0, 1
        if num_steps is None:
            num_steps = self.config.mean_recurrence
        n, k = (0, int(num_steps)) if isinstance(num_steps, int) else (int(num_steps[0]), int(num_steps[1]))
        if n < 0 or k < 0 or n + k < 1:
            raise ValueError(f"num_steps must give at least one iteration, got {num_steps}")
        return n, k

    def forward(self, idx, targets=None, num_steps=None, *, seeds=None, depths=None, depth_weight=0.0,
                labeled_only=False, return_states=False, return_loop_logits=False):
        """The one forward of training, evaluation and analysis; kv_cache.py's CachedForward, the decoder with a
        KV cache, is the one other loop. idx, targets (B, T); num_steps: the loops r, or a pair (no-grad loops,
        grad loops) (split_loops; the name num_steps is Huginn's, kept for its remote code and lm-eval).
        Returns (logits (B, T, V), loss), or a Trajectory when return_states / return_loop_logits ask for
        the states s_0..s_r / the readouts after the grad loops. Keywords of training (train.py):
          seeds (B,)        s_0 of row b from its own generator (init_state), the same at any world size
          labeled_only      the head only where targets carry a label: logits (N, V) at targets != -1
                            (exact: the coda still sees every position; a parent's 49k-vocabulary head is the
                            cost saved)
          depths (B, T)     the task depth of each position's label: with depth_weight w > 0 the coda also
                            reads out after every grad loop i < r, trained on the labels of depth <= i
                            (per-loop supervision: PerLoopReadout)"""
        no_grad_loops, grad_loops = self.split_loops(num_steps)
        rope = self.rope(torch.arange(idx.shape[1], device=idx.device))
        at = targets != IGNORE_INDEX if labeled_only else None  # (B, T) where the head reads out, or everywhere
        per_loop = PerLoopReadout(self, rope, targets, depths, depth_weight, at, return_loop_logits)
        # 1. embedding + prelude, once: e (B, T, h) is injected again in every loop
        e = self.run_prelude(idx, rope)
        # 2. the initial state s_0 (B, T, h), drawn afresh every forward pass (first_loop "identity": e, never read)
        s = self.init_state(e, seeds=seeds)
        states = [s] if return_states else None  # s_0 .. s_r, kept only when asked
        # 3. truncated backprop (McLeish et al., arXiv 2511.07384): the first loops keep no activations
        with torch.no_grad():
            for i in range(no_grad_loops):
                s = self.iterate(s, e, rope, i)
                if return_states: states.append(s)
        # 4. the last loops with gradient; the prelude still learns through e, which each of them injects
        for i in range(no_grad_loops, no_grad_loops + grad_loops):
            s = self.iterate(s, e, rope, i)
            if return_states: states.append(s)
            if per_loop.wanted and i < no_grad_loops + grad_loops - 1:
                per_loop.after_loop(s, i + 1)  # per-loop supervision, or the readouts analyze.py asks for
        # 5. coda, final norm, head; the loss: the outcome's, with the per-loop losses when supervised
        logits = self.readout(s, rope, positions=at)
        loss = None
        if targets is not None:
            labels = flat_labels(targets, at)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels, ignore_index=IGNORE_INDEX)
            loss = per_loop.loss(loss)
        if return_states or return_loop_logits:
            return Trajectory(logits, loss, states, per_loop.logits + [logits] if return_loop_logits else None)
        return logits, loss

    # --- accounting

    def param_counts(self):
        """Parameters per part; the adapter, embeddings and head are left out of the paper's FLOP count."""
        count = lambda mods: sum(p.numel() for m in mods for p in m.parameters())
        counts = {
            "prelude": count(self.prelude),
            "core": count(self.core),
            "coda": count(self.coda),
            "adapter": self.adapter.weight.numel() if self.config.recurrent else 0,
            "embeddings": self.embed_tokens.weight.numel()
            + (0 if self.config.tie_embeddings else self.lm_head.weight.numel()),
            "norm": sum(p.numel() for n, p in self.named_parameters() if n.startswith("norm.")),
        }
        counts["total"] = sum(p.numel() for p in self.parameters())
        return counts

    def flops_per_token(self, r, grad_loops=8):
        """Training FLOPs per token, McLeish et al.: N1 = P + k R + C, N2 = n R, FLOPs = 6 N1 + 2 N2, with k =
        min(r, grad_loops) loops with gradient (forward and backward) and n the rest (forward only)."""
        pc = self.param_counts()
        r = r if self.config.recurrent else 1
        n, k = max(r - grad_loops, 0), min(r, grad_loops)
        return 6 * (pc["prelude"] + k * pc["core"] + pc["coda"]) + 2 * n * pc["core"]

    def inference_flops_per_token(self, r):
        pc = self.param_counts()
        r = r if self.config.recurrent else 1
        return 2 * (pc["prelude"] + r * pc["core"] + pc["coda"])

    # --- checkpoints

    def state_dict_to_save(self):
        # a tied head shares the embedding's storage, which safetensors refuses to store twice
        sd = self.state_dict()
        if self.config.tie_embeddings:
            sd.pop("lm_head.weight")
        return {k: v.detach().contiguous() for k, v in sd.items()}

    def save_pretrained(self, out_dir, extra_config=None):
        """Write out_dir in the format every script reads (plumbing/pretrained.py), which transformers loads too:
        AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True)."""
        checkpoint_io().save(self, out_dir, extra_config)

    @classmethod
    def from_state_dict(cls, config, sd, device="cpu"):
        """Build the model around existing weights (our names; a tied head may be left out). Built on the
        meta device and filled by assignment: no random init runs and no second copy is made, which
        matters for Huginn-0125's 3.5B parameters."""
        with torch.device("meta"):
            model = cls(config)
        sd = dict(sd)
        if config.tie_embeddings:
            sd.pop("lm_head.weight", None)
        expected = set(model.state_dict()) - ({"lm_head.weight"} if config.tie_embeddings else set())
        missing, unexpected = sorted(expected - set(sd)), sorted(set(sd) - expected)
        if missing or unexpected:
            raise ValueError(f"weights do not match the config: missing {missing[:4]}, unexpected {unexpected[:4]}")
        try:
            model.load_state_dict(sd, strict=False, assign=True)
        except RuntimeError as err:  # shape mismatches
            raise ValueError(f"weights do not match the config: {str(err).strip().splitlines()[-1].strip()}") from None
        if config.tie_embeddings:  # assignment gives each name its own Parameter: tie them again
            model.lm_head.weight = model.embed_tokens.weight
        # the non-persistent RoPE buffer is in no state dict: compute it for real
        model.register_buffer("inv_freq", rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling), persistent=False)
        return model.to(device)

    @classmethod
    def from_pretrained(cls, path, device="cpu", **overrides):
        """Load a directory written by surgery.py or train.py (plumbing/pretrained.py). Keyword overrides replace
        config fields, e.g. state_init="zero". Other formats (raven checkpoints, parents) load with
        surgery.load_model."""
        return checkpoint_io().load(cls, path, device, **overrides)


def checkpoint_io():
    """plumbing/pretrained.py, imported when a checkpoint is saved or loaded: a reader of the model needs no
    checkpoint code. In a try block because transformers' remote-code loader refuses a file with an import it
    cannot find outside one, and a checkpoint's copy of this file has no plumbing/ beside it."""
    try:
        from plumbing import pretrained
    except ImportError:
        raise ImportError("RecurrentGPT.save_pretrained / from_pretrained need nanorecur's plumbing/: run from the "
                          "repository, or load the directory with transformers (trust_remote_code=True)") from None
    return pretrained
