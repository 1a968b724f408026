"""--compile (plumbing/device.py compile_blocks: torch.compile of every block, inductor, dynamic shapes) on the CPU,
against the eager model it was copied from, on tiny random models in fp32:
- the training forward (logits, loss, every gradient) at several r, with and without a no-grad prefix;
- KV-cache decoding: the logits of every step, and generate()'s greedy tokens with left padding and adaptive exit;
- the graphs dynamo makes while r, the sequence length, the batch and the cache's length change from call to call:
  a few for the modes (grad, no grad, inference; a decode step; a mask), none for a new r or a new length;
- train.py --compile through train.main: the losses of the run without it.
Compiling takes seconds a graph on the CPU (each test is slow: ~1 min from a cold inductor cache on 2 shared cores,
seconds from a warm one), so one compiled model serves the module.

    python -m pytest -q tests/test_compile.py
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

import train
from model import RecurrentConfig, RecurrentGPT
from plumbing.device import compile_blocks
from kv_cache import KVCache
from sample import CachedForward, generate

REPO = Path(__file__).resolve().parents[1]

TOL = 1e-4  # max abs difference of fp32 logits, losses and gradients: inductor's fused kernels round differently
# the blocks of train.py's tiny scratch model below (h 32, 2 heads of 16, MLP 128): train.main reuses the graphs
CFG = dict(vocab_size=97, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, intermediate_size=128, n_prelude=1,
           n_core=2, n_coda=1, adapter_init="random", state_init="zero")


def graphs():
    return counters["stats"]["unique_graphs"]


def fell_back():
    """True once dynamo gave up on a function (its recompile limit): from then on it runs eagerly, silently."""
    return any("recompile limit" in k for k in counters["unimplemented"])


@pytest.fixture(scope="module")
def models():
    """(eager, compiled): the same weights, large enough that greedy tokens vary from step to step."""
    torch.manual_seed(0)
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes gain nothing from a second thread on shared cores
    eager = RecurrentGPT(RecurrentConfig(**CFG))
    with torch.no_grad():
        for name, p in eager.named_parameters():
            if p.dim() == 2 and not name.startswith("adapter"):
                p.normal_(0, 0.1)
    compiled = compile_blocks(copy.deepcopy(eager))
    yield eager, compiled
    torch._dynamo.reset()  # the compiled graphs go with the module
    torch.set_num_threads(n)


def forward_backward(model, x, num_steps):
    logits, loss = model(x, x, num_steps=num_steps)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logits.detach(), loss.detach(), grads


@pytest.mark.slow
def test_train_forward_matches_eager_and_r_never_recompiles(models):
    eager, compiled = models
    torch._dynamo.reset()  # count this test's graphs from none
    counters.clear()
    gen = torch.Generator().manual_seed(1)

    def step(r, T):  # train.py's split: the loops beyond backprop depth 4 run without gradient
        x = torch.randint(0, CFG["vocab_size"], (2, T), generator=gen)
        num_steps = (max(r - 4, 0), min(r, 4))
        (lc, Lc, gc), (le, Le, ge) = forward_backward(compiled, x, num_steps), forward_backward(eager, x, num_steps)
        assert 1 < le.abs().max() and (lc - le).abs().max().item() <= TOL, r
        assert abs(Lc.item() - Le.item()) <= TOL and all((gc[n] - ge[n]).abs().max() <= TOL for n in ge), r

    for r, T in [(3, 12), (1, 12), (8, 12), (2, 9), (6, 7)]:  # r as a run draws it, rows cut to their labels
        step(r, T)
    first = graphs()
    assert first <= 2, f"{first} graphs: one with gradient, one for the no-grad prefix, whatever r and T"
    for r, T in [(4, 12), (7, 5), (5, 11), (12, 12), (1, 3)]:  # r and lengths not seen yet
        step(r, T)
    assert graphs() == first, "a new r or sequence length recompiled the blocks"
    assert not fell_back()


def decode_logits(model, prompts, tail, r):
    """Prefill the left-padded prompts, then feed tail (B, n) one token a step through the KV cache, as generate()
    does: the logits of every step (B, 1 + n, V)."""
    L = max(map(len, prompts))
    pads = [L - len(p) for p in prompts]
    idx = torch.tensor([[0] * n + p for n, p in zip(pads, prompts)])
    fwd = CachedForward(model, pads, L + tail.shape[1], r, KVCache(model.config, len(prompts), L + tail.shape[1], r))
    with torch.inference_mode():
        outs = [fwd.run(idx)[0][:, -1:]]
        outs += [fwd.run(tail[:, t:t + 1])[0] for t in range(tail.shape[1])]
    return torch.cat(outs, dim=1)


@pytest.mark.slow
def test_cached_decode_matches_eager_and_the_cache_length_never_recompiles(models):
    eager, compiled = models
    prompts = [[5, 6, 7, 8, 9], [1, 2, 3], [40]]  # left padding: an explicit attention mask
    exit_ = dict(exit_criterion="argmax", exit_threshold=1)  # a row leaves the loop once its argmax repeats
    tail = torch.randint(0, CFG["vocab_size"], (3, 8), generator=torch.Generator().manual_seed(2))

    def decode(r, n_new):
        got, ref = (decode_logits(m, prompts, tail[:, :n_new], r) for m in (compiled, eager))
        assert (got - ref).abs().max().item() <= TOL, r
        for kw in ({}, exit_):
            a = generate(compiled, prompts, max_new_tokens=n_new, num_steps=r, **kw)
            b = generate(eager, prompts, max_new_tokens=n_new, num_steps=r, **kw)
            assert [c.tokens for c in a] == [c.tokens for c in b], (r, kw)
            assert [c.loops for c in a] == [c.loops for c in b], (r, kw)
        return a

    before = graphs()
    decode(3, 4)
    out = decode(6, 6)
    assert len({n for c in out for n in c.loops}) > 2 and len({t for c in out for t in c.tokens}) > 3  # exits vary
    warm = graphs()
    # a block call in decoding is two graphs, before and after the eager model.attend_cached, per mode: the
    # prefill, one-token steps of the batch and of fewer rows (adaptive exit: WriteRows), one row (a size of 1)
    assert warm - before <= 16, f"{warm - before} graphs for decoding"
    decode(4, 8)  # a new r, and a cache 2 positions longer
    decode(8, 3)
    assert graphs() == warm, "a new r or a longer cache recompiled the blocks"
    assert not fell_back()


# bf16 autocast rounds every matmul's output to 8 bits of mantissa, and inductor fuses (and so rounds) at other
# points than eager: the losses part by ~1e-4 of 2.7 (measured 1.7e-4), well inside bf16's 2**-8 relative step
BF16_TOL = 1e-3


@pytest.mark.slow  # alone it compiles its graphs; after the tests above it reuses theirs (the same block shapes)
@pytest.mark.parametrize("precision,tol", [("off", TOL), ("bf16", BF16_TOL)])
def test_train_py_compile_gives_the_eager_losses(models, depth_dir, tmp_path, monkeypatch, precision, tol):
    # train.py's own path (start() compiles the blocks): a few steps at the r it draws, evals at r = 1 and 3
    built = []
    monkeypatch.setattr(train, "compile_blocks", lambda model: built.append(compile_blocks(model)) or model)
    args = ["--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2", "--batch_size=8", "--eval_iters=1",
            "--eval_r=1,3", "--mean_recurrence=3", "--backprop_depth=2", "--max_iters=4", "--eval_interval=4",
            "--warmup_iters=2", "--device=cpu", f"--data={depth_dir}", f"--autocast={precision}"]
    logs = {}
    for flag in ("false", "true"):
        train.main(args + [f"--out_dir={tmp_path / flag}", f"--compile={flag}"])
        logs[flag] = [json.loads(line) for line in open(tmp_path / flag / "log.jsonl")]
    blocks = [b for m in built for b in (*m.prelude, *m.core, *m.coda)]
    assert len(built) == 1 and all(b._compiled_call_impl is not None for b in blocks)  # --compile=true only
    # (step, r, train loss) of every step and (step, r, val loss) of both evals (steps 0 and 4)
    losses = {flag: [(d["step"], d["r"], d["loss"]) for d in log if "loss" in d]
              + [(d["step"], r, v["loss"]) for d in log if "val" in d for r, v in d["val"].items()]
              for flag, log in logs.items()}
    assert len(losses["true"]) == len(losses["false"]) == 4 + 2 * 2
    assert len({r for _, r, _ in losses["true"][:4]}) > 1  # the steps drew more than one r
    for (s, r, a), (s2, r2, b) in zip(losses["true"], losses["false"]):
        assert (s, r) == (s2, r2) and abs(a - b) <= tol, (s, r, a, b)
    assert not fell_back()


def test_only_a_compiled_run_imports_dynamo():
    """compile_blocks wraps model.attend_cached in torch.compiler.disable itself: a decorator in model.py would
    import torch._dynamo at every train.py / sample.py / eval_math.py start (~2.5 s of a few-second process)."""
    code = ("import sys, train, sample, eval_math; assert 'torch._dynamo' not in sys.modules, 'imported at start'; "
            "from plumbing.device import compile_blocks; import model; "
            "compile_blocks(model.RecurrentGPT(model.RecurrentConfig())); "
            "assert model.attend_cached._torchdynamo_disable")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
