"""model.py: truncated backprop, the per-loop loss and what forward records, adapter and state init
modes, static depth, FLOPs, checkpoints.

    python -m pytest -q tests/test_model.py
"""

import json
import math

import pytest
import torch

from model import RecurrentConfig, RecurrentGPT


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=64, n_embd=32, n_head=4, n_kv_head=2, head_dim=8, intermediate_size=48,
               n_prelude=1, n_core=2, n_coda=1, adapter_init="random", state_init="zero")  # fmt: skip
    return RecurrentGPT(RecurrentConfig(**{**cfg, **kw}))


def grads(model):
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}


def test_truncated_backprop_matches_hand_unrolled():
    model = tiny()
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    n, k = 3, 2
    _, loss = model(idx, tgt, num_steps=(n, k))
    loss.backward()
    ours = grads(model)

    # by hand: run all n + k iterations with grad, but cut the graph after the first n
    model.zero_grad()
    rope = model.rope(torch.arange(12))
    e = model.run_prelude(idx, rope)
    s = torch.zeros_like(e)
    for i in range(n + k):
        s = model.iterate(s.detach() if i == n else s, e, rope, i)
    logits = model.readout(s, rope)
    torch.nn.functional.cross_entropy(logits.view(-1, 64), tgt.view(-1)).backward()
    hand = grads(model)
    for name in ours:
        assert torch.allclose(ours[name], hand[name], atol=1e-6, rtol=1e-5), name

    # the prelude gets gradient (through e, injected in every grad iteration); full backprop differs
    assert ours["prelude.0.self_attn.q_proj.weight"].abs().sum() > 0
    assert ours["embed_tokens.weight"].abs().sum() > 0
    model.zero_grad()
    model(idx, tgt, num_steps=n + k)[1].backward()
    assert not torch.allclose(grads(model)["adapter.weight"], ours["adapter.weight"], atol=1e-6)


def saved_bytes(model, idx, num_steps):
    """Bytes of the tensors autograd keeps for backward: what a no_grad prefix must not add to."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, idx, num_steps=num_steps)
    return total


def test_no_grad_prefix_keeps_no_activations():
    model = tiny()
    idx = torch.randint(0, 64, (2, 32))
    base, long = saved_bytes(model, idx, (0, 8)), saved_bytes(model, idx, (24, 8))
    assert long <= 1.01 * base, (base, long)
    assert saved_bytes(model, idx, 32) > 3 * base  # backprop through all 32 iterations would keep them


def test_step_supervision_loss_by_hand():
    torch.manual_seed(0)
    model = RecurrentGPT(RecurrentConfig(vocab_size=14, state_init="zero"))
    x = torch.randint(0, 14, (2, 6))
    y = torch.randint(0, 14, (2, 6))
    depths = torch.tensor([[0, 1, 2, 3, 4, 0], [0, 1, 2, 3, 4, 5]])
    y[depths == 0] = -1
    loss_fn = lambda w: model(x, y, num_steps=(1, 2), depths=depths, depth_weight=w, labeled_only=True)[1]
    # the head only at labeled positions: the model's own loss up to float summation order
    torch.testing.assert_close(loss_fn(0.0), model(x, y, num_steps=(1, 2))[1], rtol=0, atol=1e-6)
    # by hand: loops 2 and 3 with grad (one without); loop 2 reads out labels of depth <= 2, loop 3 all
    rope = model.rope(torch.arange(6))
    e = model.run_prelude(x, rope)
    s = model.iterate(model.iterate(torch.zeros_like(e), e, rope, 0), e, rope, 1)
    ce = lambda logits, t: torch.nn.functional.cross_entropy(logits.flatten(0, 1), t.flatten(), ignore_index=-1)
    l2 = ce(model.readout(s, rope), y.masked_fill(depths > 2, -1))
    l3 = ce(model.readout(model.iterate(s, e, rope, 2), rope), y)
    torch.testing.assert_close(loss_fn(0.5), (l3 + 0.5 * l2) / 1.5)
    # the same loss with the head everywhere, and the (N, V) logits of the labeled positions
    full = model(x, y, num_steps=(1, 2), depths=depths, depth_weight=0.5)[1]
    torch.testing.assert_close(full, (l3 + 0.5 * l2) / 1.5)
    logits, _ = model(x, y, num_steps=(1, 2), labeled_only=True)
    assert logits.shape == ((y != -1).sum(), 14)


def test_per_loop_head_reads_out_only_the_labels_each_loop_reaches():
    """train.py's forward (labeled_only, per-loop supervision): the same loss and gradients as the head at every
    position, with the head after loop i only on the labels of depth <= i (the depth task's rows: depth = position)."""
    model = tiny()
    x = torch.randint(0, 64, (3, 7), generator=torch.Generator().manual_seed(4))
    y = torch.randint(0, 64, (3, 7), generator=torch.Generator().manual_seed(5))
    depths = torch.arange(7).expand(3, 7).clone()
    y[:, 0] = -1
    rows = []
    model.lm_head.register_forward_hook(lambda m, inp, out: rows.append(inp[0].reshape(-1, inp[0].shape[-1]).shape[0]))
    ref, cut = {}, {}
    for labeled_only, g in ((False, ref), (True, cut)):
        rows.clear()
        model.zero_grad(set_to_none=True)
        loss = model(x, y, num_steps=(0, 4), depths=depths, depth_weight=0.5, labeled_only=labeled_only)[1]
        loss.backward()
        g.update(grads(model), loss=loss.detach(), rows=list(rows))
    assert ref["rows"] == [21] * 4  # every position, after loops 1, 2, 3 and 4
    assert cut["rows"] == [3, 6, 9, 18]  # depth <= 1, <= 2, <= 3, then all 6 labels of the 3 rows
    for n in ref:
        if n != "rows":
            torch.testing.assert_close(cut[n], ref[n], rtol=0, atol=1e-6, msg=n)


def test_recorded_states_and_loop_logits_are_the_pieces():
    model = tiny()
    idx = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(3))
    plain = model(idx, num_steps=(2, 3))
    assert isinstance(plain, tuple) and len(plain) == 2 and plain[1] is None  # the plain call: (logits, loss)
    out = model(idx, idx, num_steps=(2, 3), return_states=True, return_loop_logits=True)
    rope = model.rope(torch.arange(7))
    e = model.run_prelude(idx, rope)
    s = [torch.zeros_like(e)]  # state_init zero
    for i in range(5):
        s.append(model.iterate(s[-1], e, rope, i))
    assert len(out.states) == 6 and all(torch.equal(a, b) for a, b in zip(out.states, s))
    # loop logits after the grad loops 3, 4 and 5; the last one is the logits
    assert len(out.loop_logits) == 3 and out.loop_logits[-1] is out.logits
    for lg, si in zip(out.loop_logits, s[3:]):
        assert torch.equal(lg, model.readout(si, rope))
    assert torch.equal(out.logits, plain[0]) and out.loss is not None
    assert model(idx, num_steps=2, return_states=True).loop_logits is None


def test_adapter_inits():
    for mode in ("identity", "sum", "random"):
        model = tiny(adapter_init=mode)
        mats = [p for p in model.parameters() if p.shape == (32, 64)]
        assert len(mats) == 1 and mats[0] is model.adapter.weight  # the model's only (h, 2h) matrix
    W = tiny(adapter_init="sum").adapter.weight
    assert torch.allclose(W, torch.cat([torch.eye(32), torch.eye(32)], 1) / math.sqrt(2))
    # identity [0 | I]: the state is ignored, so every r gives the same logits
    model = tiny(adapter_init="identity", state_init="normal")
    idx = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        l1, l5 = model(idx, num_steps=1)[0], model(idx, num_steps=5)[0]
    assert torch.equal(l1, l5)


def test_state_inits():
    model = tiny(state_init="normal", n_embd=256, head_dim=64)
    e = torch.randn(4, 64, 256)
    s = model.init_state(e)
    std = math.sqrt(2 / (5 * 256))
    assert abs(s.std().item() - 0.9866 * std) < 0.02 * std  # a normal truncated at +-3 std has std 0.9866 std
    assert s.abs().max().item() <= 3 * std + 1e-7
    assert not torch.equal(s, model.init_state(e))  # a fresh draw every call
    assert torch.equal(tiny(state_init="embed").init_state(e[..., :32]), e[..., :32])
    assert torch.count_nonzero(tiny(state_init="zero").init_state(e)) == 0


def test_static_depth_ignores_loops():
    model = tiny(recurrent=False)
    assert not hasattr(model, "adapter")
    idx = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        assert torch.equal(model(idx, num_steps=1)[0], model(idx, num_steps=7)[0])
    pc = model.param_counts()
    assert model.flops_per_token(32) == 6 * (pc["prelude"] + pc["core"] + pc["coda"])


def test_flops_formula():
    model = tiny()
    pc = model.param_counts()
    P, R, C = pc["prelude"], pc["core"], pc["coda"]
    assert model.flops_per_token(4) == 6 * (P + 4 * R + C)
    assert model.flops_per_token(32) == 6 * (P + 8 * R + C) + 2 * 24 * R  # n = 24 no-grad iterations
    assert model.inference_flops_per_token(16) == 2 * (P + 16 * R + C)
    assert pc["total"] == sum(pc[k] for k in ("prelude", "core", "coda", "adapter", "embeddings", "norm"))


@pytest.mark.parametrize("tied", [True, False])
def test_save_load_roundtrip(tmp_path, tied):
    model = tiny(tie_embeddings=tied, block_type="sandwich", state_init="zero")
    model.save_pretrained(tmp_path)
    loaded = RecurrentGPT.from_pretrained(tmp_path)
    idx = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(idx, num_steps=3)[0], loaded(idx, num_steps=3)[0])
    assert (loaded.lm_head.weight is loaded.embed_tokens.weight) == tied
    assert RecurrentGPT.from_pretrained(tmp_path, state_init="embed").config.state_init == "embed"
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "n_layers_typo": 3}))
    with pytest.raises(ValueError, match="unknown config keys"):
        RecurrentGPT.from_pretrained(tmp_path)


def test_readout_at_positions_equals_the_full_head():
    torch.manual_seed(0)
    model = RecurrentGPT(RecurrentConfig(vocab_size=50))
    s, rope = torch.randn(3, 7, 64), model.rope(torch.arange(7))
    positions = torch.rand(3, 7) > 0.5
    torch.testing.assert_close(model.readout(s, rope, positions=positions), model.readout(s, rope)[positions],
                               rtol=0, atol=1e-6)


def test_bad_num_steps():
    with pytest.raises(ValueError, match="at least one iteration"):
        tiny()(torch.zeros(1, 3, dtype=torch.long), num_steps=(0, 0))
