"""
nanorecur remote code: the config of a "raven" checkpoint (model_type huginn_raven) for transformers 5.x,
nanorecur's own code (not a copy of the published raven_config_minimal.py). Huginn-0125 (Geiping et al. 2025, arXiv
2502.05171) and the retrofitted Llama models of McLeish et al. 2025 (arXiv 2511.07384) share this config.json.

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)   # raven_modeling_minimal.py

Which of the two layouts a checkpoint is comes from config.json: the retrofit converter writes the parent's
rope_theta, which Huginn's config does not have (it has rope_base only); see RavenConfig.variant.
"""

import math

from transformers import PreTrainedConfig


class RavenConfig(PreTrainedConfig):
    """The fields raven_modeling_minimal.py reads; every other config.json key is kept as an attribute. The
    defaults are Huginn-0125's."""

    model_type = "huginn_raven"
    # transformers' generic code (generate, tying, device maps) reads these names: point them at raven's
    attribute_map = {"hidden_size": "n_embd", "num_attention_heads": "n_heads", "tie_word_embeddings": "tie_embeddings",
                     "rms_norm_eps": "norm_eps", "max_position_embeddings": "block_size"}  # fmt: skip
    n_embd: int = 5280
    n_heads: int = 55
    num_key_value_heads: int | None = None  # None: n_heads (Huginn has no GQA)
    head_dim: int | None = None  # None: n_embd // n_heads, the only value the layout allows
    intermediate_size: int = 17920
    vocab_size: int = 65536
    padded_vocab_size: int | None = None  # the rows of wte and lm_head; None: vocab_size
    block_size: int = 4096
    n_layers_in_prelude: int = 2
    n_layers_in_recurrent_block: int = 4
    n_layers_in_coda: int = 2
    mean_recurrence: int = 32  # r when num_steps is not given
    norm_eps: float = 1e-6
    qk_bias: bool = True  # a bias on q and k (one per query head), added before RoPE
    bias: bool = False  # an adapter bias: not supported
    tie_embeddings: bool = True
    rope_base: float = 50000.0  # Huginn's RoPE base
    rope_theta: float | None = None  # the retrofit's (Llama's) RoPE base; its presence names the retrofit layout
    rope_scaling: dict | None = None  # retrofit only: Llama-3's scaling (a field here, not transformers' alias)
    init_values: dict | None = None  # {"std": s_0's std, "embed_scale": ...}; None: Huginn's sqrt(2 / (5 h))
    injection_type: str = "linear"
    test_time_noise: float = 0.0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.n_heads
        if self.head_dim is None:
            self.head_dim = self.n_embd // self.n_heads
        if self.padded_vocab_size is None:
            self.padded_vocab_size = self.vocab_size
        if self.init_values is None:
            self.init_values = {"std": math.sqrt(2 / (5 * self.n_embd)), "embed_scale": math.sqrt(self.n_embd)}
        if self.rope_scaling and "rope_type" not in self.rope_scaling:  # old configs say "type"
            self.rope_scaling = {**self.rope_scaling, "rope_type": self.rope_scaling.get("type", "default")}
        # what the two modeling codes never do, refused rather than run differently
        if self.head_dim * self.n_heads != self.n_embd:
            raise ValueError(f"head_dim={self.head_dim} but the raven layout uses n_embd // n_heads")
        if self.bias or self.injection_type != "linear" or self.test_time_noise:
            raise ValueError("raven config with an adapter bias, non-linear injection or test-time noise: not supported")
        if self.qk_bias and self.num_key_value_heads != self.n_heads:
            raise ValueError("raven qk_bias holds one bias per query head: it cannot add to fewer k heads (GQA)")
        if self.variant == "huginn" and self.num_key_value_heads != self.n_heads:
            raise ValueError("Huginn's attention has no GQA: num_key_value_heads must equal n_heads")
        super().__post_init__(**kwargs)

    @property
    def variant(self):
        """'huginn': sandwich blocks, RoPE on interleaved pairs with rope_base, e = wte * sqrt(h), ln_f also before
        the coda. 'retrofit': Llama pre-norm blocks, rotate-half RoPE with rope_theta, e = wte * embed_scale."""
        return "retrofit" if self.rope_theta is not None else "huginn"

    @property
    def num_hidden_layers(self):
        # generate() builds its DynamicCache with this many entries: the blocks one pass runs at mean_recurrence
        return self.n_layers_in_prelude + self.n_layers_in_coda + self.n_layers_in_recurrent_block * self.mean_recurrence


__all__ = ["RavenConfig"]
