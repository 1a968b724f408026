"""Checkpoint directories load with transformers' trust_remote_code (plumbing/hf_remote.py, plumbing/hf/).

Tiny random models of every block layout are saved as nanorecur saves them, with the modeling code beside them,
loaded with AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True) and compared with nanorecur's own
model (the reference): logits to 1e-5 at r = 1, 4, 32; generate()'s greedy tokens, with the KV cache and without,
equal to sample.generate's (zero initial state on both sides). The raven format (plumbing/raven.py's export) the
same way through our raven_config_minimal.py / raven_modeling_minimal.py, against our loader and against the
published code's own logits in ../shared/fixtures.

    python -m pytest -q tests/test_hf_remote.py
"""

import hashlib
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.dynamic_module_utils import get_imports

import sample
from exit_gate import add_exit_gate
from model import RecurrentConfig, RecurrentGPT
from plumbing.hf_remote import remote_code_files, write_remote_code, written_by_nanorecur
from plumbing.raven import save_raven
from surgery import load_model

TOL = 1e-5
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}  # short, so the tiny model's positions see the scaling
TINY = dict(vocab_size=128, n_embd=32, n_head=4, n_kv_head=4, head_dim=8, intermediate_size=64, block_size=64,
            n_prelude=1, n_core=2, n_coda=1, mean_recurrence=4, adapter_init="random")
LAYOUTS = {  # one per family of families.py, tied and untied, plus the static baseline
    "llama": dict(block_type="prenorm", n_kv_head=2, rope_scaling=LLAMA3_ROPE, rope_theta=500000.0),
    "qwen": dict(block_type="prenorm", n_kv_head=2, attn_bias=True, tie_embeddings=False),
    "olmo2": dict(block_type="olmo2", qk_norm=True, tie_embeddings=False, norm_eps=1e-6),
    "huginn": dict(block_type="sandwich", attn_bias=True, embed_scale=math.sqrt(32), norm_before_coda=True),
    "static": dict(block_type="prenorm", n_kv_head=2, recurrent=False, tie_embeddings=False),
}  # fmt: skip

torch.set_num_threads(1)


def tiny_model(std=0.2, **fields):
    """A random model whose weights are large enough (std 0.2) for greedy decoding not to repeat one token."""
    torch.manual_seed(0)
    model = RecurrentGPT(RecurrentConfig(**{**TINY, **fields})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else std * torch.randn_like(p))
    return model


def save(model, path, extra=None):
    """As nanorecur saves: weights + config.json, with the remote code and its auto_map."""
    model.save_pretrained(str(path), extra_config={**write_remote_code(str(path)), **(extra or {})})
    return path


def load_hf(path, **kwargs):
    model, info = AutoModelForCausalLM.from_pretrained(str(path), trust_remote_code=True, output_loading_info=True,
                                                       **kwargs)
    assert not info["missing_keys"] and not info["unexpected_keys"], info  # our names, as they are
    return model.eval()


@pytest.fixture(scope="module", params=list(LAYOUTS))
def pair(request, tmp_path_factory):
    """(name, ours, theirs): our model saved with state_init normal (as a run saves it), both sides run at zero."""
    ours = tiny_model(**LAYOUTS[request.param])
    path = save(ours, tmp_path_factory.mktemp(request.param), extra={"train": {"step": 7}})  # as checkpoint.save
    ours.config.state_init = "zero"
    return request.param, ours, load_hf(path, state_init="zero")


def prompts(n=2):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, TINY["vocab_size"], (L,), generator=g).tolist() for L in (9, 5, 7)[:n]]


@torch.no_grad()
def test_logits(pair):
    name, ours, theirs = pair
    ids = torch.tensor(prompts(1) * 2)
    ids[1] = ids[1].flip(0)
    for r in (1, 4, 32):
        diff = (theirs(ids, num_steps=r).logits - ours(ids, num_steps=r)[0]).abs().max().item()
        assert diff <= TOL, f"{name} r={r}: max abs diff {diff:.2e}"
    # the config's mean_recurrence by default, and nanorecur's (no-grad loops, grad loops) pair
    assert torch.equal(theirs(ids).logits, theirs(ids, num_steps=TINY["mean_recurrence"]).logits)
    assert torch.equal(theirs(ids, num_steps=(2, 2)).logits, theirs(ids, num_steps=4).logits)


def assert_generate_matches(name, ours, theirs, ps, r, **kw):
    """theirs.generate's greedy tokens on the left-padded batch ps, with the KV cache and without, equal
    sample.generate's on our model."""
    want = [c.tokens for c in sample.generate(ours, ps, max_new_tokens=8, num_steps=r)]
    L = max(map(len, ps))
    ids = torch.tensor([[0] * (L - len(p)) + p for p in ps])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in ps])
    for use_cache in (True, False):
        out = theirs.generate(ids, attention_mask=mask, num_steps=r, max_new_tokens=8, do_sample=False,
                              use_cache=use_cache, pad_token_id=0, **kw)
        assert out[:, L:].tolist() == want, f"{name} r={r} use_cache={use_cache}"


@pytest.mark.parametrize("r", [1, 4])
def test_generate_matches_sample(pair, r):
    """Greedy tokens of a left-padded batch, KV cache and recomputation, equal to sample.generate's."""
    name, ours, theirs = pair
    ps = prompts(3)
    assert_generate_matches(name, ours, theirs, ps, r)


def test_generate_more_loops_than_config(pair):
    """num_steps above mean_recurrence: the cache generate() sized by the config grows to r entries per layer."""
    name, ours, theirs = pair
    ps = prompts(1)
    want = sample.generate(ours, ps, max_new_tokens=6, num_steps=7)[0].tokens
    out = theirs.generate(torch.tensor(ps), num_steps=7, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out[0, len(ps[0]):].tolist() == want, name


def test_beam_search_cache(pair):
    """Beam search reorders the cache's (block, loop) entries: the same beams as recomputing without a cache."""
    name, _, theirs = pair
    ids = torch.tensor(prompts(1))
    beams = [theirs.generate(ids, num_steps=3, max_new_tokens=6, num_beams=3, do_sample=False, use_cache=c,
                             pad_token_id=0).tolist() for c in (True, False)]
    assert beams[0] == beams[1], name


def gated_model():
    """A tiny model with a random exit gate (nanorecur's exit_gate.py) whose exits vary by token and loop."""
    model = add_exit_gate(tiny_model(state_init="zero"))
    with torch.no_grad():
        model.exit_gate.proj.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(3))
    return model


def test_diffusion_generate_matches_sample(pair):
    """generate(..., sampler="diffusion"): the tokens of sample.generate(..., sampler="diffusion"), greedy, with the
    loop budget and with a latent-diff threshold."""
    name, ours, theirs = pair
    if not ours.config.recurrent:
        return
    p = prompts(1)[0]
    for kw, hf_kw in (({}, {}), (dict(exit_criterion="latent-diff", exit_threshold=0.2), dict(latent_diff=0.2))):
        want = sample.generate(ours, [p], max_new_tokens=8, num_steps=6, sampler="diffusion", loops_per_pass=2,
                               **kw)[0].tokens
        got = theirs.generate(torch.tensor([p]), sampler="diffusion", num_steps=6, loops_per_pass=2, max_new_tokens=8,
                              **hf_kw)
        assert got[0, len(p):].tolist() == want, (name, kw)


def test_exit_gate_generate_matches_sample(tmp_path):
    """generate(..., exit_threshold=Q) on a gated checkpoint: the tokens of sample.py's --exit gate, whose
    per-token exits (and the cache entries later tokens read for an exited token's skipped loops) shape them."""
    ours = gated_model()
    theirs = load_hf(save(ours, tmp_path))  # exit_gate.* load: no missing or unexpected keys
    ps, r = prompts(3), 6
    fixed = [c.tokens for c in sample.generate(ours, ps, max_new_tokens=8, num_steps=r)]
    for q in (0.0, 0.6, 1.01):
        got = sample.generate(ours, ps, max_new_tokens=8, num_steps=r, exit_criterion="gate", exit_threshold=q)
        if q == 0.6:  # exits vary per token, and they change the tokens: a wrong cache would show
            assert len({n for c in got for n in c.loops[1:]}) > 2 and [c.tokens for c in got] != fixed
        L = max(map(len, ps))
        ids = torch.tensor([[0] * (L - len(p)) + p for p in ps])
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in ps])
        out = theirs.generate(ids, attention_mask=mask, num_steps=r, max_new_tokens=8, do_sample=False,
                              exit_threshold=q, pad_token_id=0)
        assert out[:, L:].tolist() == [c.tokens for c in got], q
    with pytest.raises(ValueError, match="use_cache"):
        theirs.generate(ids, num_steps=r, max_new_tokens=2, exit_threshold=0.5, use_cache=False, pad_token_id=0)
    plain = load_hf(save(tiny_model(), tmp_path / "plain"))
    with pytest.raises(ValueError, match="exit gate"):
        plain.generate(ids, num_steps=r, max_new_tokens=2, exit_threshold=0.5, pad_token_id=0)


@torch.no_grad()
def test_cache_continuation(pair):
    """A block of several new tokens after a cached past (chunked prefill) gives the logits of one whole pass."""
    name, _, theirs = pair
    ids = torch.tensor(prompts(1))
    whole = theirs(ids, num_steps=3).logits
    first = theirs(ids[:, :4], num_steps=3, use_cache=True)
    rest = theirs(ids[:, 4:], cache=first.cache, num_steps=3).logits
    assert (torch.cat([first.logits, rest], dim=1) - whole).abs().max().item() <= TOL, name


@torch.no_grad()
def test_cache_refuses_other_num_steps(tmp_path):
    theirs = load_hf(save(tiny_model(), tmp_path), state_init="zero")
    out = theirs(torch.tensor(prompts(1)), num_steps=2, use_cache=True)
    with pytest.raises(ValueError, match="fewer than num_steps=4"):
        theirs(torch.tensor([[3]]), cache=out.cache, num_steps=4)


@torch.no_grad()
def test_state_init(tmp_path):
    """s_0 as init_state: the same truncated-normal draw under the same seed, e itself for "embed"."""
    ours = tiny_model(state_init="normal", embed_scale=2.0)
    path = save(ours, tmp_path)
    theirs = load_hf(path)
    ids = torch.tensor(prompts(1))
    torch.manual_seed(5)
    a = ours(ids, num_steps=3)[0]
    torch.manual_seed(5)
    b = theirs(ids, num_steps=3).logits
    assert (a - b).abs().max().item() <= TOL
    assert not torch.equal(theirs(ids, num_steps=3).logits, theirs(ids, num_steps=3).logits)  # a fresh draw
    ours.config.state_init = "embed"
    diff = (load_hf(path, state_init="embed")(ids, num_steps=3).logits - ours(ids, num_steps=3)[0]).abs().max()
    assert diff.item() <= TOL


def test_loss_is_transformers_convention(pair):
    """labels = the inputs, shifted inside (the Trainer's convention) = our forward with targets shifted by one."""
    name, ours, theirs = pair
    ids = torch.tensor(prompts(1))
    targets = torch.cat([ids[:, 1:], torch.full((1, 1), -1)], dim=1)
    with torch.no_grad():
        want = ours(ids, targets, num_steps=2)[1]
    got = theirs(ids, labels=ids, num_steps=2).loss
    assert abs(got.item() - want.item()) <= TOL
    got.backward()  # gradients reach the weights (transformers' fine-tuning works)
    assert theirs.embed_tokens.weight.grad is not None
    theirs.zero_grad(set_to_none=True)


def test_tied_head(pair):
    name, ours, theirs = pair
    assert (theirs.lm_head.weight is theirs.embed_tokens.weight) == ours.config.tie_embeddings


def test_run_directory_links(tmp_path):
    """A run directory's top-level names are links through `latest` (plumbing/checkpoint.py): the modeling file
    loads through its link too."""
    ours = tiny_model(state_init="zero")
    save(ours, tmp_path / "ckpt" / "step-000001-abcdef")
    os.symlink("ckpt/step-000001-abcdef", tmp_path / "latest")
    for name in ("model.safetensors", "config.json", *remote_code_files()):
        os.symlink(f"latest/{name}", tmp_path / name)
    ids = torch.tensor(prompts(1))
    with torch.no_grad():
        assert (load_hf(tmp_path)(ids, num_steps=3).logits - ours(ids, num_steps=3)[0]).abs().max() <= TOL


def test_loads_where_nanorecur_is_not_installed(tmp_path):
    """A fresh interpreter outside the repository (nothing of nanorecur importable) loads and runs the directory."""
    ours = tiny_model(state_init="zero")
    save(ours, tmp_path / "m")
    ids = torch.tensor(prompts(1))
    with torch.no_grad():
        torch.save({"ids": ids, "logits": ours(ids, num_steps=3)[0]}, tmp_path / "io.pt")
    code = ("import sys, torch; from transformers import AutoModelForCausalLM\n"
            "assert 'model' not in sys.modules and not any(m.startswith('plumbing') for m in sys.modules)\n"
            "io = torch.load('io.pt'); m = AutoModelForCausalLM.from_pretrained('m', trust_remote_code=True)\n"
            "m.generate(io['ids'][:1], sampler='diffusion', num_steps=4, loops_per_pass=2, max_new_tokens=3)\n"
            "print((m(io['ids'], num_steps=3).logits - io['logits']).abs().max().item())")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert float(run.stdout.split()[-1]) <= TOL


def test_remote_code_files(tmp_path):
    """Byte for byte the same files at every save (a manifest's sha256 stays meaningful), model.py among them as it
    is, and no import that transformers would require beyond torch, transformers and the standard library (they run
    where nanorecur is not installed; transformers' own scan, which skips imports in try blocks)."""
    assert write_remote_code(str(tmp_path / "x")) == {"auto_map": {
        "AutoConfig": "modeling_nanorecur.NanorecurConfig",
        "AutoModelForCausalLM": "modeling_nanorecur.NanorecurForCausalLM"}}
    assert remote_code_files()["model.py"] == (Path(__file__).parents[1] / "model.py").read_bytes()
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()
    for fmt in ("nanorecur", "raven"):
        a, b = tmp_path / fmt / "a", tmp_path / fmt / "b"
        write_remote_code(str(a), fmt), write_remote_code(str(b), fmt)
        for name, data in remote_code_files(fmt).items():
            assert digest(a / name) == digest(b / name) == hashlib.sha256(data).hexdigest()
            assert set(get_imports(a / name)) <= {"math", "dataclasses", "time", "torch", "transformers"}, name
            assert written_by_nanorecur(a / name)


# -----------------------------------------------------------------------------
# the raven format (plumbing/raven.py's export) through raven_config_minimal.py / raven_modeling_minimal.py of
# our own, against our loader (surgery.load_model) and against the published code's logits (the fixtures)

RAVEN = {  # save_raven writes sandwich models as Huginn, pre-norm ones as retrofits
    "huginn": dict(block_type="sandwich", attn_bias=True, embed_scale=math.sqrt(32), norm_before_coda=True),
    "retrofit": dict(block_type="prenorm", n_kv_head=2, rope_scaling=LLAMA3_ROPE, tie_embeddings=False),
    "retrofit_qk_bias": dict(block_type="prenorm", attn_bias=True),
}  # fmt: skip


@pytest.fixture(scope="module", params=list(RAVEN))
def raven_pair(request, tmp_path_factory):
    """(name, ours as our loader reads the export, theirs). Weights of std 0.1, not 0.2: Huginn's RoPE on
    interleaved pairs and the fused Wqkv round differently from our permuted rows, and at std 0.2 32 loops
    amplify that to 4e-3 (in float64 the two agree exactly)."""
    ours = tiny_model(std=0.1, **RAVEN[request.param])
    with torch.no_grad():  # raven has a q/k bias only
        for block in [*ours.prelude, *ours.core, *ours.coda]:
            if block.self_attn.v_proj.bias is not None:
                block.self_attn.v_proj.bias.zero_()
    path = tmp_path_factory.mktemp(request.param)
    save_raven(ours, str(path))
    ref = load_model(str(path), state_init="zero")[0].eval()
    write_remote_code(str(path), "raven")
    return request.param, ref, load_hf(path)


@torch.no_grad()
def test_raven_logits(raven_pair):
    name, ours, theirs = raven_pair
    assert theirs.config.variant == name.split("_")[0]
    ids = torch.tensor(prompts(1) * 2)
    ids[1] = ids[1].flip(0)
    for r in (1, 4, 32):
        diff = (theirs(ids, num_steps=r, init_scale=0.0).logits - ours(ids, num_steps=r)[0]).abs().max().item()
        assert diff <= TOL, f"{name} r={r}: max abs diff {diff:.2e}"


@pytest.mark.parametrize("r", [1, 4])
def test_raven_generate_matches_sample(raven_pair, r):
    name, ours, theirs = raven_pair
    ps = prompts(3)
    assert_generate_matches(name, ours, theirs, ps, r, init_scale=0.0)


@pytest.mark.parametrize("name", ["huginn_tiny", "retrofit_llama_tiny", "retrofit_converted_tiny"])
def test_raven_published_logits(name, tmp_path):
    """The fixtures' logits, computed by the published modeling code (their READMEs), from our files."""
    path = tmp_path / name
    shutil.copytree(FIXTURES / name, path)
    path.chmod(0o755)
    write_remote_code(str(path), "raven")
    model, info = AutoModelForCausalLM.from_pretrained(str(path), trust_remote_code=True, output_loading_info=True)
    # the converter's Huginn leftovers are reported as unused, as the published retrofit code does; nothing missing
    unused = {k.split(".")[-2] for k in info["unexpected_keys"]}
    assert not info["missing_keys"] and unused == ({"norm_3", "norm_4"} if name == "retrofit_converted_tiny" else set())
    io = load_file(str(path / "io.safetensors"))
    for r in (1, 4, 8):
        with torch.no_grad():
            logits = model.eval()(io["input_ids"], num_steps=r, init_scale=0.0).logits
        diff = (logits - io[f"logits_r{r}"]).abs().max().item()
        assert diff <= TOL, f"{name} r={r}: max abs diff {diff:.2e}"
