"""
nanorecur remote code: a nanorecur checkpoint as a Hugging Face transformers (5.x) model, the config and
model classes that `trust_remote_code` loads from the checkpoint directory. The model's math is nanorecur's
model.py, which nanorecur copies beside this file: the directory runs where nanorecur is not installed (torch
and transformers only).

The model is a pretrained decoder cut into prelude / recurrent core / coda (McLeish et al. 2025, arXiv
2511.07384, on the architecture of Huginn-0125, Geiping et al. 2025, arXiv 2502.05171):

    e = P(embed(x));  s_0 ~ init_state(e);  s_i = R(adapter(cat[s_{i-1}, e])), i = 1..r;  logits = head(C(s_r))

(with "first_loop": "identity" in config.json, s_1 = R(e): one loop of a cut that kept every layer is the parent.)

The modules and methods are model.py's RecurrentGPT's (its names, so model.safetensors loads as it is, and its
code, so the logits are its logits); this file adds what transformers asks of a model: its config class, the
padding mask and positions of generate(), a DynamicCache in place of nanorecur's KV cache, labels and outputs.

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)  # add state_init="zero": deterministic
    logits = model(ids, num_steps=4).logits            # r = 4 loops of the core (default: config.mean_recurrence)
    out = model.generate(ids, num_steps=8, max_new_tokens=20, do_sample=False)
    out = model.generate(ids, num_steps=32, exit_threshold=0.9, max_new_tokens=20)  # a checkpoint with an exit gate
    out = model.generate(ids, num_steps=32, sampler="diffusion", loops_per_pass=4, max_new_tokens=20)  # diffusion.py

exit_threshold (a checkpoint trained with nanorecur's `train.py --exit_gate`, "exit_gate": true): each generated
token stops looping after the first loop whose gate probability reaches it (never before exit_min_loops), as
nanorecur's `sample.py --exit gate` does: the KV cache then holds, for that token's later loops, the entries of
its last loop. Only one-token steps with the cache exit early; the prompt runs every loop.

sampler="diffusion" (batch 1): nanorecur's diffusion-forcing sampler (its diffusion.py, arXiv 2510.14961, copied
beside this file with the KV cache it decodes through), the tokens of nanorecur's `sample.py --sampler diffusion`;
its keywords loops_per_pass, wavefront, headway, freeze_loops and latent_diff (the freeze threshold), greedy or
do_sample with temperature, top_k, top_p.

nanorecur writes this file, model.py and those into every directory it saves (plumbing/hf_remote.py); the sources are
plumbing/hf/modeling_nanorecur.py and model.py in the nanorecur repository.
"""

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from .exit_gate import ExitGate
from .model import RecurrentConfig, RecurrentGPT, rope_inv_freq


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
    first_loop: str = "adapter"  # identity: loop 1 feeds the core e, the adapter acts from loop 2 (model.iterate)
    state_init: str = "normal"  # normal (truncated at 3 std) | zero | embed (s_0 = e)
    state_std: float | None = None  # None: sqrt(2 / (5 h)) as in Huginn
    norm_before_coda: bool = False
    mean_recurrence: int = 4  # r when num_steps is not given
    exit_gate: bool = False  # a learned exit gate (nanorecur's exit_gate.py) under exit_gate.*
    layers: dict | None = None  # provenance (parent layer indices, source)
    parent: dict | None = None

    def __post_init__(self, **kwargs):
        RecurrentConfig.__post_init__(self)  # model.py's checks of the values
        super().__post_init__(**kwargs)

    @property
    def num_hidden_layers(self):
        # generate() builds its DynamicCache with this many entries: the blocks one pass runs at mean_recurrence
        return self.n_prelude + self.n_coda + self.n_core * (self.mean_recurrence if self.recurrent else 1)


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


class LoopCache:
    """model.py's cache protocol over a transformers DynamicCache: update(key, k, v) with key = (part, layer, loop)
    appends the new positions' k, v (B, nkv, T, hd) to the cache layer slot(*key) and returns all of them."""

    def __init__(self, cache, slot):
        self.cache, self.slot = cache, slot

    def update(self, key, k, v):
        return self.cache.update(k, v, self.slot(*key))


class LoopedCausalLM(PreTrainedModel, GenerationMixin):
    """What a recurrent-depth model needs of transformers, whatever its tensor names: one DynamicCache layer per
    (block, loop), r per core layer (Huginn §6), grown to the r asked for. A subclass names its blocks (parts)."""

    _supports_sdpa = True

    def slot(self, part, layer, loop=0):
        """The cache entry of a block at a loop: the prelude's, the coda's, then core layer j at loop i, so that no
        index moves with r (nanorecur's KVCache keys its entries by (part, layer, loop) the same way)."""
        P, C, N = (len(blocks) for blocks in self.parts())
        return {"prelude": layer, "coda": P + layer, "core": P + C + loop * N + layer}[part]

    def prepare_cache(self, cache, use_cache, r):
        """The cache this pass reads and writes (None without one), with room for r loops: generate() sizes its
        DynamicCache by config.num_hidden_layers, the blocks of one pass at mean_recurrence."""
        if use_cache is False:
            return None
        if cache is None:
            return DynamicCache() if use_cache else None
        N = len(self.parts()[2])
        past = cache.get_seq_length()
        if past and cache.get_seq_length(self.slot("core", N - 1, r - 1)) != past:
            raise ValueError(f"this cache was filled with fewer than num_steps={r} loops: decode with the same "
                             "num_steps as the prefill")
        while len(cache.layers) < self.slot("core", 0, r):
            cache.layers.append(DynamicLayer())
        return cache

    @staticmethod
    def output(logits, labels, cache):
        """CausalLMOutputWithPast, with the loss of transformers' convention when labels (B, T) are given: shifted
        here, -100 carries none."""
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)


class NanorecurForCausalLM(LoopedCausalLM):
    """The recurrent-depth model. forward(input_ids, num_steps=r) runs the core r times; generate(..., num_steps=r)
    decodes with a KV cache of one entry per (block, loop)."""

    config_class = NanorecurConfig
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"lm_head.weight": "embed_tokens.weight"}  # tied when config.tie_embeddings

    # model.py's RecurrentGPT, method for method: the same modules under the same names, the same forward pieces
    build, rope, run_prelude, init_state, iterate, readout, split_loops = (
        RecurrentGPT.build, RecurrentGPT.rope, RecurrentGPT.run_prelude, RecurrentGPT.init_state,
        RecurrentGPT.iterate, RecurrentGPT.readout, RecurrentGPT.split_loops)

    def __init__(self, config):
        super().__init__(config)
        self.build(config)
        if config.exit_gate:
            self.exit_gate = ExitGate(config.n_embd)
        self.post_init()

    @property
    def inv_freq(self):
        # RecurrentGPT.rope reads a buffer; here it is computed per call, so nothing has to survive transformers'
        # loading on the meta device
        c = self.config
        return rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling).to(self.embed_tokens.weight.device)

    def parts(self):
        return self.prelude, self.coda, self.core

    def get_input_embeddings(self):
        return self.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def exit_rows(self, s_prev, s, exited, i, threshold, min_loops):
        """(B,) bool: the rows of a one-token step whose gate fires after loop i (0-based), of those still looping."""
        p = self.exit_gate.probability(s_prev[:, -1], s[:, -1])
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
        > 0), loss when labels (B, T) are given, and the cache. attention_mask (B, past + T): 0 on (left) padding.
        num_steps: r, or nanorecur's pair (n loops without grad, k with). exit_threshold: the exit gate's
        probability at which a token of a one-token cached step stops looping (None: every token runs every loop).
        Other transformers keywords are ignored."""
        n, k = self.split_loops(num_steps)
        if kwargs.get("inputs_embeds") is not None:
            raise ValueError("inputs_embeds is not supported: pass input_ids (the prelude starts from the token ids)")
        if exit_threshold is not None and not self.config.exit_gate:
            raise ValueError("exit_threshold needs a checkpoint with an exit gate (\"exit_gate\": true in config.json; "
                             "nanorecur's train.py --exit_gate trains one)")
        if exit_threshold is not None and use_cache is False:
            raise ValueError("exit_threshold exits tokens one at a time through the KV cache: leave use_cache on")
        cache = self.prepare_cache(cache, use_cache, n + k)
        kv = LoopCache(cache, self.slot) if cache is not None else None
        past = cache.get_seq_length() if cache is not None else 0
        (B, T), r = input_ids.shape, n + k
        adaptive = exit_threshold is not None and past > 0 and T == 1
        position_ids, mask = attention_inputs(attention_mask, position_ids, past, input_ids)
        rope = self.rope(position_ids)
        # 1. embedding + prelude, once: e (B, T, h); 2. the initial state s_0 (B, T, h)
        e = self.run_prelude(input_ids, rope, mask, kv)
        s = self.init_state(e)
        if adaptive:  # per row: exited yet, and after how many loops
            exited, n_run = torch.zeros(B, dtype=torch.bool, device=s.device), torch.full((B,), r, device=s.device)
        # 3. the loops, the first n without gradient
        for i in range(r):
            with torch.set_grad_enabled(torch.is_grad_enabled() and i >= n):
                x = self.iterate(s, e, rope, i, mask, kv)
                if adaptive:  # a row that exited keeps its state; its later loops' outputs are dropped
                    x = torch.where(exited[:, None, None], s, x)
                    done = self.exit_rows(s, x, exited, i, exit_threshold, exit_min_loops) & (i + 1 < r)
                    n_run[done], exited = i + 1, exited | done
                s = x
        if adaptive:
            self.freeze_exited(cache, n_run, r)
        # 4. coda, final norm, head: the head only at the positions kept
        keep = min(logits_to_keep, T) if logits_to_keep else T
        at = torch.arange(T, device=s.device)[None].expand(B, T) >= T - keep if keep < T else None  # (B, T)
        logits = self.readout(s, rope, mask, kv, positions=at).view(B, keep, -1)
        return self.output(logits, labels, cache)

    def generate(self, inputs=None, *args, sampler=None, **kwargs):
        """transformers' generate, or with sampler="diffusion" the diffusion-forcing sampler (generate_diffusion)."""
        if sampler is None or sampler == "sequential":
            return super().generate(inputs, *args, **kwargs)
        if sampler != "diffusion":
            raise ValueError(f"unknown sampler {sampler!r}: sequential (transformers' generate) or diffusion")
        return self.generate_diffusion(inputs, *args, **kwargs)

    @torch.no_grad()
    def generate_diffusion(self, input_ids, max_new_tokens=20, num_steps=None, loops_per_pass=4, wavefront=128,
                           headway=1, freeze_loops=-1, latent_diff=None, do_sample=False, temperature=1.0, top_k=None,
                           top_p=None, eos_token_id=None, seed=None, attention_mask=None, pad_token_id=None):
        """input_ids (1, L) -> (1, L + new tokens): nanorecur's diffusion.generate_diffusion on this model, r =
        num_steps (default config.mean_recurrence), freeze_loops -1: r, None: latent_diff alone freezes. One prompt,
        so attention_mask (all ones) and pad_token_id are read by no one."""
        from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

        from .diffusion import generate_diffusion

        if input_ids.shape[0] != 1:
            raise ValueError(f"the diffusion sampler decodes one prompt at a time, got a batch of {input_ids.shape[0]}")
        gen = torch.Generator(input_ids.device).manual_seed(seed) if seed is not None else None

        def pick(logits):  # (T, V) -> (T,): greedy, or a draw among the top_k / top_p tokens at temperature
            if not do_sample:
                return logits.argmax(-1)
            logits = logits / temperature
            for warp in ([TopKLogitsWarper(top_k)] if top_k else []) + ([TopPLogitsWarper(top_p)] if top_p else []):
                logits = warp(None, logits)
            return torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(1)

        eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
        was_training = self.training
        self.eval()
        try:
            tokens, _ = generate_diffusion(self, input_ids[0].tolist(), max_new_tokens=max_new_tokens,
                                           r=num_steps or self.config.mean_recurrence, pick=pick,
                                           loops_per_pass=loops_per_pass, wavefront=wavefront, headway=headway,
                                           freeze_loops=freeze_loops, threshold=latent_diff, eos=frozenset(eos),
                                           generator=gen)
        finally:
            self.train(was_training)
        return torch.cat([input_ids, torch.tensor([tokens], device=input_ids.device)], dim=1)


__all__ = ["NanorecurConfig", "NanorecurForCausalLM"]
