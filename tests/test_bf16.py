"""bf16 autocast with fp32 master weights, the precision train.py uses on CUDA and on a CPU with native bf16
products (plumbing/device.py; detection mocked both ways here), run here
under torch.autocast("cpu", dtype=torch.bfloat16): the same autocast code path on the CPU device. Train steps
(the model's, and train.main's own loop), the KV-cache decoder and the exit rules, each against fp32; the dtype
of every piece that must stay fp32 (s_0's draw, the adapter's input, the KV cache, the exit statistics, the
loss, the master weights); and bench/bench_gpu.py's --smoke run, the CPU rehearsal of the GPU benchmark.

Tolerances: bf16 keeps 8 significand bits (unit roundoff u = 2^-8 ~ 4e-3). A matmul with bf16-rounded inputs
and an fp32 accumulator has a relative error of a few u whatever its length (independent rounding errors add
in quadrature, like the terms themselves), and a tiny model applies 4 to 10 layers: logits within 2.5e-2
relative (0.8e-2 to 1.6e-2 measured at r = 1 and 4 over three seeds), losses within 1e-2. Greedy tokens can
only be compared where the fp32 top-2 margin exceeds twice the largest logit error: there the argmax cannot flip.

    python -m pytest -q tests/test_bf16.py
"""

import argparse
import contextlib
import json
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import sample
import train
from model import RecurrentConfig, RecurrentGPT
from plumbing.device import autocast_context
from kv_cache import KVCache
from sample import CachedForward, ExitRule, generate

REPO = Path(__file__).resolve().parents[1]
LOGIT_RTOL = 2.5e-2  # see the docstring: a few u per layer, 4-10 layers (0.8e-2 to 1.6e-2 measured)
BF16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny(seed=0, std=0.1, **kw):
    """A tiny GQA model whose weights are large enough that the state and the outputs move from loop to loop
    (the 0.02 of a scratch init leaves logits near uniform), and small enough that a layer does not amplify
    its input's rounding (at std 0.2 the bf16 error grows with r: 2.5e-2 at r = 1, 5e-2 at r = 4)."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=97, n_embd=32, n_head=4, n_kv_head=2, head_dim=8, intermediate_size=64,
               adapter_init="random", state_init="zero", n_prelude=1, n_core=2, n_coda=1)
    m = RecurrentGPT(RecurrentConfig(**{**cfg, **kw}))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2 and not name.startswith("adapter"):
                p.normal_(0, std)
    return m


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def dtype_spy(model):
    """Records the dtype of the adapter's input cat[s, e] and output at every loop (forward hooks: the real
    module runs unchanged)."""
    seen = []
    model.adapter.register_forward_hook(lambda mod, inp, out: seen.append((inp[0].dtype, out.dtype)))
    return seen


# -----------------------------------------------------------------------------
# forward and the train step


@pytest.mark.parametrize("r", [1, 4])
def test_forward_under_autocast_agrees_with_fp32(r):
    model = tiny(state_init="normal")
    seen = dtype_spy(model)
    idx = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    seeds = torch.tensor([3, 4])  # the same s_0 in both runs (drawn in fp32 in both)
    with torch.no_grad():
        ref = model(idx, idx, num_steps=r, seeds=seeds, return_states=True)
        seen.clear()
        with BF16():
            out = model(idx, idx, num_steps=r, seeds=seeds, return_states=True)
    # the head's output is cast to fp32 (readout) and the loss is taken in fp32
    assert out.logits.dtype == torch.float32 and out.loss.dtype == torch.float32
    # s_0: drawn in fp32 and cast to e's dtype, which stays fp32 (the embedding and the prelude's residual
    # adds are fp32; autocast lowers only the matmuls): the same draw as the fp32 run, exactly
    assert out.states[0].dtype == torch.float32 and torch.equal(out.states[0], ref.states[0])
    # the adapter reads cat[s, e] in fp32 (cat promotes a bf16 state) and autocast runs it in bf16
    assert len(seen) == r and all(i == torch.float32 and o == torch.bfloat16 for i, o in seen)
    err = rel(out.logits, ref.logits)
    assert 1e-4 < err < LOGIT_RTOL, err  # > 1e-4: autocast did lower the matmuls
    assert abs(out.loss.item() - ref.loss.item()) < 1e-2


def test_init_state_draws_in_fp32_then_casts():
    """s_0 of a bf16 stream is the fp32 draw rounded once, with a generator and with per-row seeds: the
    truncated normal is never sampled in bf16, so it does not depend on the stream's dtype."""
    model = tiny(state_init="normal")
    e32 = torch.randn(2, 5, 32)
    draws = (lambda e: model.init_state(e, torch.Generator().manual_seed(0)),
             lambda e: model.init_state(e, seeds=torch.tensor([7, 8])))
    for draw in draws:
        s32, s16 = draw(e32), draw(e32.bfloat16())
        assert s32.dtype == torch.float32 and s16.dtype == torch.bfloat16
        assert torch.equal(s16, s32.bfloat16())
        std = math.sqrt(2 / (5 * 32))
        assert s32.abs().max() <= 3 * std  # truncated at 3 std


def test_train_step_under_autocast_keeps_fp32_master_weights():
    """A train.py step by hand (the model is run the way train.py runs it: labeled_only, per-row seeds, n no-grad
    + k grad loops; train.make_optimizers' Muon + AdamW): fp32 loss and gradients, gradients close to fp32's,
    weights and optimizer states fp32 after the step."""
    model = tiny(state_init="normal")
    args = argparse_defaults()
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(2))
    y = idx.roll(-1, 1)
    y[:, :4] = -1  # unlabeled positions, as in row data
    seeds = torch.tensor([1, 2])

    def grads(autocast):
        model.zero_grad(set_to_none=True)
        with autocast:
            loss = model(idx, y, (2, 2), seeds=seeds, labeled_only=True)[1]
        loss.backward()
        return loss, torch.cat([p.grad.flatten() for p in model.parameters()])

    loss32, g32 = grads(contextlib.nullcontext())
    loss16, g16 = grads(BF16())
    assert loss16.dtype == torch.float32 and abs(loss16.item() - loss32.item()) < 1e-2
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())  # autocast's casts backprop into fp32
    cos = torch.nn.functional.cosine_similarity(g16, g32, dim=0).item()
    assert cos > 0.99, cos  # the same descent direction (a few u of error per element, over every matrix)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opts, _ = train.make_optimizers(model, args)
    torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
    for o in opts:
        o.step()
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32, n
        assert not torch.equal(p, before[n]), f"{n} did not move"
    states = [t for o in opts for s in o.state.values() for t in s.values() if torch.is_tensor(t) and t.is_floating_point()]
    assert states and all(t.dtype == torch.float32 for t in states)


def argparse_defaults(**over):
    return argparse.Namespace(**{**train.DEFAULTS, **over})


TINY = ["--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2", "--batch_size=8", "--eval_iters=1",
        "--eval_r=1,2", "--mean_recurrence=3", "--backprop_depth=2", "--learning_rate=0.02", "--adam_lr=3e-3",
        "--warmup_iters=3", "--decay_frac=0", "--device=cpu", "--max_iters=6", "--eval_interval=6"]


def test_train_main_under_cpu_autocast(depth_dir, tmp_path, monkeypatch):
    """train.main's whole loop (r sampling, truncated backprop, clipping, Muon + AdamW, eval, save) with bf16
    autocast forced on the CPU by --autocast bf16, against --autocast off (fp32 throughout)."""
    calls, forward = [], train.RecurrentGPT.forward

    def spy(self, *a, **kw):  # the real forward; what it ran under and what it returned
        logits, loss = forward(self, *a, **kw)
        calls.append((torch.is_autocast_enabled("cpu"), logits.dtype, loss.dtype, self.lm_head.weight.dtype))
        return logits, loss

    monkeypatch.setattr(train.RecurrentGPT, "forward", spy)
    train.main([*TINY, "--autocast", "off", "--data", str(depth_dir), "--out_dir", str(tmp_path / "fp32")])
    n_fp32 = len(calls)
    train.main([*TINY, "--autocast", "bf16", "--data", str(depth_dir), "--out_dir", str(tmp_path / "bf16")])
    assert all(not c[0] for c in calls[:n_fp32]) and all(c[0] for c in calls[n_fp32:])  # train steps and evals
    assert all(c[1:] == (torch.float32,) * 3 for c in calls)  # fp32 logits, loss and master weights throughout
    log = lambda d: [json.loads(line) for line in open(tmp_path / d / "log.jsonl")]
    loss = lambda d: [x["loss"] for x in log(d) if "loss" in x]
    l32, l16 = loss("fp32"), loss("bf16")
    assert len(l16) == 6 and all(math.isfinite(x) for x in l16)
    assert abs(l16[0] - l32[0]) < 1e-2  # step 1: the same weights, batch, r and s_0
    # later steps: Muon's orthogonalized update hardly feels a few u of gradient error; the curves stay together
    assert max(abs(a - b) for a, b in zip(l16, l32)) < 0.1, (l16, l32)
    val = [x["val"] for x in log("bf16") if "val" in x][-1]
    val32 = [x["val"] for x in log("fp32") if "val" in x][-1]
    assert abs(val["1"]["loss"] - val32["1"]["loss"]) < 0.1
    saved = load_file(tmp_path / "bf16" / "model.safetensors")  # what a bf16 run saves: the fp32 master weights
    assert saved and all(t.dtype == torch.float32 for t in saved.values())


def native_bf16(monkeypatch, native):
    """What torch reports about the CPU (plumbing/device.cpu_bf16 asks it), mocked: native bf16 products or none."""
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: native)


@pytest.mark.parametrize("native", [False, True])
def test_auto_trains_in_bf16_where_the_cpu_multiplies_it_natively(depth_dir, tmp_path, monkeypatch, capsys, native):
    """train.py --autocast auto on a CPU with native bf16 (mocked: avx512_bf16 / AMX) is --autocast bf16, bit for
    bit, Newton-Schulz in bf16 too; on a CPU without, it is --autocast off (fp32, the runs before auto chose
    bf16). The choice is printed and recorded in config.json and log.jsonl; a resume that would train in the
    other precision is refused in one line."""
    from muon import Muon, ns_dtype

    native_bf16(monkeypatch, native)
    default = ns_dtype(Muon([torch.zeros(2, 2)]).param_groups[0], torch.device("cpu"))  # Muon's own rule
    nss = []
    real = Muon.__init__
    monkeypatch.setattr(Muon, "__init__", lambda self, *a, **kw: nss.append(kw["ns_dtype"]) or real(self, *a, **kw))
    same = "bf16" if native else "off"
    for name, choice in (("auto", "auto"), ("same", same)):
        train.main([*TINY, f"--autocast={choice}", "--data", str(depth_dir), "--out_dir", str(tmp_path / name)])
    out = capsys.readouterr().out
    want = "bf16" if native else "fp32"
    assert f"precision: {want} (auto: " in out and f"precision: {want} (--autocast {same})" in out
    assert nss == [torch.bfloat16 if native else torch.float32] * 2 == [default] * 2
    rows = lambda d: [json.loads(line) for line in open(tmp_path / d / "log.jsonl")]
    head = rows("auto")[0]["run"]
    assert head["precision"] == want and head["cpu_bf16"] is native
    cfg = json.load(open(tmp_path / "auto" / "config.json"))["train"]["run"]
    assert cfg["precision"] == want
    keep = lambda d: [(x["loss"], x["grad_norm"]) for x in rows(d) if "loss" in x]
    assert keep("auto") == keep("same") and len(keep("auto")) == 6  # identical, not merely close
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("auto", "same"))
    assert all(torch.equal(a[k], b[k]) for k in a)

    other = "off" if native else "bf16"  # the flag that would change the run's precision
    with pytest.raises(SystemExit):
        train.main([*TINY, f"--autocast={other}", "--data", str(depth_dir), "--out_dir", str(tmp_path / "auto"),
                    "--max_iters=8", "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the run in {want} (pass --autocast {same} to keep it)" in err[0], err
    native_bf16(monkeypatch, not native)  # the run moved to the other kind of CPU: auto would change, so refused
    with pytest.raises(SystemExit):
        train.main([*TINY, "--data", str(depth_dir), "--out_dir", str(tmp_path / "auto"), "--max_iters=8", "--resume"])
    assert f"the run in {want}" in capsys.readouterr().err
    train.main([*TINY, f"--autocast={same}", "--data", str(depth_dir), "--out_dir", str(tmp_path / "auto"),
                "--max_iters=8", "--resume"])  # the run's own precision, named: it resumes


def test_resume_of_a_run_saved_before_precision_was_recorded():
    """A run whose config.json has no "precision" trained as --autocast meant then: bf16 when forced or on CUDA,
    fp32 on every CPU (plumbing/run_dir.saved_precision)."""
    from plumbing.run_dir import saved_precision

    assert saved_precision({"autocast": "auto", "run": {"device": "cpu"}}) == "fp32"
    assert saved_precision({"autocast": "auto", "run": {"device": "cuda:0"}}) == "bf16"
    assert saved_precision({"autocast": "bf16", "run": {"device": "cpu"}}) == "bf16"
    assert saved_precision({"autocast": "off", "run": {"device": "cuda"}}) == "fp32"
    assert saved_precision({"autocast": "off", "run": {"precision": "bf16"}}) == "bf16"  # recorded: as recorded


def test_train_precision_choices(monkeypatch):
    """plumbing/device.train_precision: auto is bf16 on CUDA and on a CPU with native bf16, fp32 on other CPUs."""
    from plumbing.device import train_precision

    for native in (False, True):
        native_bf16(monkeypatch, native)
        assert train_precision("cpu")[0] == ("bf16" if native else "fp32")
        assert train_precision("cuda:1")[0] == "bf16"
        assert train_precision("cpu", "off") == ("fp32", "--autocast off")
        assert train_precision("cuda", "off")[0] == "fp32" and train_precision("cpu", "bf16")[0] == "bf16"
    with pytest.raises(ValueError, match="autocast must be one of"):
        train_precision("cpu", "fp16")


def test_autocast_context_choices():
    """plumbing/device.autocast_context, what sample.py and eval_math.py run under: bf16 on CUDA by default, fp32
    on the CPU unless bf16 forces it there, off anywhere; a bad choice is one line."""
    for device, choice, on in (("cpu", "auto", False), ("cpu", "bf16", True), ("cpu", "off", False),
                               (torch.device("cpu"), "bf16", True)):
        with autocast_context(device, choice):
            assert torch.is_autocast_enabled("cpu") == on
            assert not on or torch.get_autocast_dtype("cpu") == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without a GPU, torch warns and disables the CUDA context it builds
        cuda = autocast_context("cuda:1")
    assert isinstance(cuda, torch.autocast) and (cuda.device, cuda.fast_dtype) == ("cuda", torch.bfloat16)
    assert isinstance(autocast_context("cuda", "off"), contextlib.nullcontext)
    with pytest.raises(ValueError, match="autocast must be one of auto, bf16, off, not 'fp16'"):
        autocast_context("cpu", "fp16")
    with pytest.raises(train.TrainError, match="--autocast must be one of"):
        train.parse_args(["--autocast", "fp16"])


def test_sample_main_decodes_under_the_chosen_autocast(tmp_path, monkeypatch, capsys):
    """sample.py's main decodes under autocast_context (bf16 on CUDA, as eval_math.py): on the CPU in fp32 by
    default, in bf16 with --autocast bf16."""
    from plumbing.hub import packaged_smollm2_gguf
    from plumbing.tokenizer import save_tokenizer_files

    ckpt = tmp_path / "ckpt"
    tiny(vocab_size=49152).save_pretrained(str(ckpt))
    save_tokenizer_files(packaged_smollm2_gguf(), str(ckpt))
    seen, real = [], sample.generate

    def spy(*a, **kw):  # the real generate; whether it ran under CPU autocast
        seen.append(torch.is_autocast_enabled("cpu"))
        return real(*a, **kw)

    monkeypatch.setattr(sample, "generate", spy)
    texts = []
    for choice in ("auto", "bf16", "off"):
        sample.main(["--init", str(ckpt), "--r=2", "--prompt=Hello", "--max_new_tokens=3", "--temperature=0",
                     "--threads=1", f"--autocast={choice}"])
        texts.append(capsys.readouterr().out)
    assert seen == [False, True, False]
    assert texts[0] == texts[2] and texts[0].strip()  # auto on the CPU is fp32, as off
    with pytest.raises(SystemExit):
        sample.parse_args(["--autocast", "fp16"])


# -----------------------------------------------------------------------------
# the KV-cache decoder and the exit rules


def decode_logits(model, seq, n_prompt, r):
    """Prefill seq[:n_prompt], then one token at a time through the KV cache (sample.py's _new_cache: the
    model's dtype); logits for every position, and the cache."""
    w = model.embed_tokens.weight
    cache = KVCache(model.config, 1, seq.shape[1], r, w.device, w.dtype)
    fwd = CachedForward(model, [0], seq.shape[1], r, cache)
    with torch.inference_mode():
        outs = [fwd.run(seq[:, :n_prompt])[0]]
        for t in range(n_prompt, seq.shape[1]):
            outs.append(fwd.run(seq[:, t:t + 1])[0])
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("r", [1, 4])
def test_cached_decoder_under_autocast(r):
    model = tiny().eval()
    prompt = torch.randint(0, 97, (6,), generator=torch.Generator().manual_seed(3)).tolist()
    n_new = 12
    toks32 = generate(model, [prompt], max_new_tokens=n_new, num_steps=r)[0].tokens
    seq = torch.tensor([prompt + toks32])
    with torch.inference_mode():
        ref, _ = model(seq, num_steps=r)  # fp32, no cache
    with BF16():
        cached, cache = decode_logits(model, seq, len(prompt), r)
        toks16 = generate(model, [prompt], max_new_tokens=n_new, num_steps=r)[0].tokens
    # the cache keeps the model's dtype (fp32 here: autocast leaves the weights alone), and fills with real values
    assert cache.core.dtype == cache.prelude.dtype == cache.coda.dtype == torch.float32
    assert cache.core.abs().sum() > 0
    assert cached.dtype == torch.float32
    assert rel(cached, ref) < LOGIT_RTOL
    # greedy tokens. Where fp32's top-2 margin exceeds twice the largest logit error no rounding can flip the
    # argmax: there the bf16 cache picks fp32's token (teacher-forced, every position that qualifies) ...
    eps = (cached - ref).abs().max().item()
    top2 = ref[0].topk(2, dim=-1).values
    safe = (top2[:, 0] - top2[:, 1]) > 2 * eps  # (T,)
    assert safe.sum() >= seq.shape[1] // 3, (eps, top2)
    assert torch.equal(cached[0].argmax(-1)[safe], ref[0].argmax(-1)[safe])
    # ... and generate() under autocast keeps fp32's tokens up to the first step without that margin
    first = next((i for i, ok in enumerate(safe[len(prompt) - 1:-1].tolist()) if not ok), n_new)
    assert toks16[:first] == toks32[:first]
    # generate's own tokens are the argmax of the cached bf16 logits along its sequence (the same passes)
    with BF16():
        own, _ = decode_logits(model, torch.tensor([prompt + toks16]), len(prompt), r)
    assert own[0, len(prompt) - 1:-1].argmax(-1).tolist() == toks16


@pytest.mark.parametrize("criterion", ["kl", "entropy-diff", "latent-diff", "cosine"])
def test_exit_statistics_are_fp32_on_bf16_inputs(criterion):
    """ExitRule.converged on bf16 states and logits takes its statistic in fp32: its decision flips exactly
    at the float64 value of the statistic of the same (upcast) inputs, within fp32's rounding of it (tol). A bf16
    statistic would be off by ~1e-2 relative, and 1 - cos or the kl of two close distributions by over 100%."""
    g = torch.Generator().manual_seed(5)
    s0 = torch.randn(3, 1, 32, generator=g)
    s1 = (s0 + 0.02 * torch.randn(3, 1, 32, generator=g)).bfloat16()
    s2 = (s1.float() + 0.01 * torch.randn(3, 1, 32, generator=g)).bfloat16()
    l1 = torch.randn(3, 1, 97, generator=g).bfloat16()
    l2 = (l1.float() + 0.05 * torch.randn(3, 1, 97, generator=g)).bfloat16()
    a, b = s2[:, -1].double(), s1[:, -1].double()
    p, q = torch.log_softmax(l1[:, -1].double(), -1), torch.log_softmax(l2[:, -1].double(), -1)
    value = {"latent-diff": (a - b).norm(dim=-1) / a.norm(dim=-1),
             "cosine": 1 - torch.nn.functional.cosine_similarity(a, b, dim=-1),
             "kl": (p.exp() * (p - q)).sum(-1),
             "entropy-diff": ((q.exp() * q).sum(-1) - (p.exp() * p).sum(-1)).abs()}[criterion]
    # fp32's own rounding: 1e-7 of the operands against a statistic of ~1e-4 (cosine, kl: differences of nearly
    # equal numbers) or ~1e-2 (latent-diff, entropy-diff); bf16 arithmetic would miss all four by far more
    tol = {"latent-diff": 1e-4, "entropy-diff": 1e-3, "kl": 1e-2, "cosine": 2e-2}[criterion]
    for row in range(3):
        for factor, expect in ((1 + tol, True), (1 - tol, False)):
            rule = ExitRule(criterion, threshold=value[row].item() * factor)
            rule.reset()
            rule.converged(0, s0.bfloat16(), s1, l1)  # loop 0: sets the previous readout
            done = rule.converged(1, s1, s2, l2)
            assert bool(done[row]) == expect, (criterion, row, factor, value[row].item())


@pytest.mark.parametrize("criterion", ["kl", "latent-diff"])
def test_adaptive_exit_under_autocast(criterion):
    """generate() with an exit rule under autocast: a threshold of 0 never exits and gives the fixed-r tokens
    and loops (the per-row exit path, WriteRows and torch.where over the state, is exact in bf16 too); an
    infinite one exits every token at the earliest loop, 2 (every criterion compares two loops)."""
    model = tiny().eval()
    prompts = [[5, 6, 7, 8], [9, 10]]  # a batch with left padding
    r, n_new = 6, 6
    with BF16():
        fixed = generate(model, prompts, max_new_tokens=n_new, num_steps=r)
        never = generate(model, prompts, max_new_tokens=n_new, num_steps=r, exit_criterion=criterion,
                         exit_threshold=0.0)
        always = generate(model, prompts, max_new_tokens=n_new, num_steps=r, exit_criterion=criterion,
                          exit_threshold=math.inf)
    for f, nv, al in zip(fixed, never, always):
        assert nv.tokens == f.tokens and nv.loops == f.loops == [r] * n_new
        assert al.loops[0] == r and al.loops[1:] == [2] * (n_new - 1)  # the prefill runs r; decode steps exit
        assert all(0 <= t < 97 for t in al.tokens)


# -----------------------------------------------------------------------------
# what does not work yet in bf16 (see the report of this file's author): documented, not hidden


def test_bf16_weights_forward_runs():
    model = tiny().to(torch.bfloat16)
    logits, _ = model(torch.tensor([[1, 2, 3]]), num_steps=2)
    assert logits.dtype == torch.float32


def test_recurrent_state_stays_fp32_under_autocast():
    model = tiny()
    with torch.no_grad(), BF16():
        out = model(torch.tensor([[1, 2, 3]]), num_steps=3, return_states=True)
    assert all(s.dtype == torch.float32 for s in out.states)


# -----------------------------------------------------------------------------
# bench/bench_gpu.py --smoke: the GPU benchmark's functions on CPU, tiny shapes


@pytest.fixture(scope="module")
def bench_gpu():
    sys.path.insert(0, str(REPO / "bench"))
    import bench_gpu

    yield bench_gpu
    torch._dynamo.reset()  # the compiled arm's caches go with it


@pytest.mark.parametrize("compiled", ["off", "on"])  # on: torch.compile's dynamo with the eager backend
def test_bench_gpu_smoke_train(bench_gpu, tmp_path, compiled):
    out = tmp_path / "smoke.json"
    res = bench_gpu.main(["--smoke", "--only", "train", "--compile", compiled, "--out", str(out)])
    assert json.loads(out.read_text())["train"] == json.loads(json.dumps(res["train"]))
    arms = {(t["r"], t["compiled"]) for t in res["train"]}
    assert arms == {("4", compiled == "on"), ("(3,2)", compiled == "on")}
    for t in res["train"]:
        assert t["param_dtypes"] == ["torch.float32"]  # fp32 master weights under bf16 autocast
        assert math.isfinite(t["loss"]) and t["tokens_per_s"] > 0 and 0 < t["mfu"] < t["mfu_with_head_attn"]
        assert t["peak_mem_gib"] is None  # no CUDA allocator on the CPU


def test_bench_gpu_smoke_decode(bench_gpu, tmp_path):
    res = bench_gpu.main(["--smoke", "--only", "decode", "--new_tokens", "4", "--out", str(tmp_path / "smoke.json")])
    rows = {(d["impl"], d["cut"], d["r"]) for d in res["decode"]}
    assert rows == {("ours", "1,2,1", 1), ("ours", "1,2,1", 4), ("ours", "1,4,1", 1), ("transformers", "uncut 6", None)}
    assert all(d["tokens_per_s"] > 0 for d in res["decode"])
    assert [d["vs_transformers"] for d in res["decode"] if d["impl"] == "transformers"] == [1.0]
