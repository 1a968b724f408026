"""Tests for diffusion.py, the diffusion-forcing sampler (arXiv 2510.14961), through sample.generate and sample.py.

References: sequential decoding (sample.generate) in the sampler's limit, a wavefront of one position or all r
loops in one pass, token for token, greedy and sampled; and the reference implementation's own tokens on the
shared huginn_tiny fixture (../shared/fixtures/huginn_tiny/diffusion_reference.json: seal-rg/recurrent-pretraining's
generate_diffusion_style, unmodified, deterministic settings), the first 12 tokens of each record, and at headway 2
and 4 (tests/fixtures/huginn_tiny_headway.json, made by tests/fixtures/make_headway_reference.py).

    python -m pytest -q tests/test_diffusion.py
"""

import json
from pathlib import Path

import pytest
import torch

from diffusion import generate_diffusion
from model import RecurrentConfig, RecurrentGPT
from sample import generate, main

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "huginn_tiny"

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny(seed=0, **kw):
    """A tiny Huginn-layout model whose random weights are large enough that greedy tokens vary."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=97, n_embd=32, n_head=4, n_kv_head=2, head_dim=8, intermediate_size=64,
               adapter_init="random", state_init="zero", block_type="sandwich", norm_before_coda=True)
    m = RecurrentGPT(RecurrentConfig(**{**cfg, **kw}))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2 and not name.startswith("adapter"):
                p.normal_(0, 0.2)
    return m.eval()


PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6]]


@pytest.mark.parametrize("r", [1, 4, 6])
@pytest.mark.parametrize("wavefront", [1, 8])
@pytest.mark.parametrize("sampled", [False, True])
def test_all_loops_in_one_pass_is_sequential_decoding(r, wavefront, sampled):
    """loops_per_pass = r: each position freezes after its one pass, so the wave is sequential decoding (the same
    KV entries, the same draws of the generator: zero s_0, one multinomial per token; one prompt per call, as the
    sampler runs a batch one prompt at a time)."""
    model = tiny()
    kw = dict(temperature=0.9, top_k=40) if sampled else {}
    for p in PROMPTS:
        want = generate(model, [p], max_new_tokens=10, num_steps=r, seed=5, **kw)[0].tokens
        got = generate(model, [p], max_new_tokens=10, num_steps=r, seed=5, sampler="diffusion", loops_per_pass=r,
                       wavefront=wavefront, **kw)[0]
        assert got.tokens == want and got.loops == [r] * 10


def test_fewer_loops_per_pass_refine_in_parallel():
    """With 2 loops a pass at r = 8 the wave holds several positions, each frozen after its 8 loops: fewer passes
    than tokens x 4, and the tokens are the sampler's own (this model is sensitive enough to differ from
    sequential decoding, so the limit test above can fail)."""
    model, stats = tiny(), {}
    want = generate(model, PROMPTS[:1], max_new_tokens=12, num_steps=8)[0].tokens
    got = generate(model, PROMPTS[:1], max_new_tokens=12, num_steps=8, sampler="diffusion", loops_per_pass=2,
                   stats=stats)[0]
    assert len(got.tokens) == 12 and got.loops[1:] == [8] * 11
    assert stats["passes"] <= 11 + 3 and stats["wave_positions"] / stats["passes"] > 3  # a wave of ~4 positions
    assert got.tokens != want


def test_latent_diff_threshold_trades_loops_for_speed():
    """--exit latent-diff: a high threshold freezes positions before their loop budget, zero never does (then the
    budget alone: the fixed rule's tokens)."""
    model = tiny()
    fixed = generate(model, PROMPTS[:1], max_new_tokens=10, num_steps=8, sampler="diffusion", loops_per_pass=2)[0]
    never = generate(model, PROMPTS[:1], max_new_tokens=10, num_steps=8, sampler="diffusion", loops_per_pass=2,
                     exit_criterion="latent-diff", exit_threshold=0.0)[0]
    early = generate(model, PROMPTS[:1], max_new_tokens=10, num_steps=8, sampler="diffusion", loops_per_pass=2,
                     exit_criterion="latent-diff", exit_threshold=10.0)[0]
    assert never.tokens == fixed.tokens
    assert sum(early.loops[1:]) < sum(fixed.loops[1:])


def test_seeded_sampling_and_kv_budget():
    model = tiny(state_init="normal")
    run = lambda seed, **kw: generate(model, PROMPTS[:1], max_new_tokens=8, num_steps=8, seed=seed, temperature=1.0,
                                      sampler="diffusion", loops_per_pass=2, **kw)[0].tokens
    assert run(1) == run(1) and run(1) != run(2)
    assert len(run(1, kv_budget=2)) == 8


def test_reference_sampler_tokens_on_the_fixture():
    """The reference's generate_diffusion_style and generate_minimal on huginn_tiny: our tokens equal its first 12.
    Its `fixed` strategy starts freezing after pass r // inner_recurrence + 1, so each position runs
    r // inner_recurrence + 2 passes: our freeze_loops says so; its latent-diff has no loop budget
    (freeze_loops None). Settings: zero s_0, full prefill at num_steps, headway 1, the cache's full lookup."""
    from surgery import load_model

    model, _ = load_model(str(FIXTURE), state_init="zero")
    records = json.loads((FIXTURE / "diffusion_reference.json").read_text())
    assert len(records) == 14
    for rec in records:
        k, want = rec["kwargs"], rec["tokens"][:12]
        if rec["call"] == "generate_minimal":
            got = generate(model, [rec["prompt"]], max_new_tokens=12, num_steps=k["num_steps"])[0].tokens
        else:
            ir, r = k["inner_recurrence"], k["num_steps"]
            assert k["headway"] == 1 and k["init_scale"] == 0.0 and k["cache_lookup_strategy"] == "full"
            fixed = k["freeze_strategy"] == "fixed"
            got, _ = generate_diffusion(model, rec["prompt"], max_new_tokens=12, r=r, pick=lambda lg: lg.argmax(-1),
                                        loops_per_pass=ir, wavefront=k["max_wavefront"],
                                        freeze_loops=(r // ir + 2) * ir if fixed else None,
                                        threshold=None if fixed else k["exit_t"])
        assert got == want, (rec["call"], k)


def test_reference_latent_diff_at_headway_2_and_4():
    """tests/fixtures/huginn_tiny_headway.json (tests/fixtures/make_headway_reference.py): the reference's
    latent-diff sampler at headway 2 and 4 on huginn_tiny, its random placeholder ids of the extra new positions
    replaced by copies of the last guess (ours). Our tokens equal its first 12 (fewer where its wave stopped at the
    model's block_size)."""
    from surgery import load_model

    model, _ = load_model(str(FIXTURE), state_init="zero")
    records = json.loads((Path(__file__).parent / "fixtures" / "huginn_tiny_headway.json").read_text())
    assert sorted({r["kwargs"]["headway"] for r in records}) == [2, 4] and len(records) == 8
    for rec in records:
        k, want = rec["kwargs"], rec["tokens"][:12]
        got, _ = generate_diffusion(model, rec["prompt"], max_new_tokens=len(want), r=k["num_steps"],
                                    pick=lambda lg: lg.argmax(-1), loops_per_pass=k["inner_recurrence"],
                                    wavefront=k["max_wavefront"], headway=k["headway"], freeze_loops=None,
                                    threshold=k["exit_t"])
        assert got == want, k


@pytest.mark.parametrize("headway", [2, 4])
def test_a_position_freezes_on_the_token_it_read(monkeypatch, headway):
    """With the loop budget at headway > 1, each output token's position last ran with that token as its input
    (diffusion.py, step 3): the input of every pass is recorded, and the output is checked against it. Without the
    rule this model freezes positions that read a token the pass before them replaced."""
    from kv_cache import CachedForward

    read, refine = {}, CachedForward.refine

    def recording(self, idx, s, num_loops, first):
        for j, t in enumerate(idx[0].tolist()):
            read[self.pos + j] = t
        return refine(self, idx, s, num_loops, first)

    monkeypatch.setattr(CachedForward, "refine", recording)
    model, stats = tiny(), {}
    for p in PROMPTS:
        read.clear()
        got = generate(model, [p], max_new_tokens=12, num_steps=8, sampler="diffusion", loops_per_pass=2,
                       headway=headway, stats=stats)[0]
        assert len(got.tokens) == 12 and min(got.loops[1:]) >= 8
        assert [read[len(p) + i] for i in range(11)] == got.tokens[:11]


@pytest.mark.parametrize("flags, says", [
    (["--exit", "kl"], "exit other than latent-diff"),
    (["--warm_start"], "warm_start"),
    (["--draft_r", "2"], "draft_r"),
    (["--loops_per_pass", "8", "--r", "4"], "loops_per_pass 8 is more than r = 4"),
    (["--freeze_loops", "0", "--wavefront", "1", "--exit", "latent-diff"], "wavefront of one"),
    (["--freeze_loops", "0"], "needs a way to freeze"),
    (["--compile"], "--compile"),
])
def test_refused_combinations_in_one_line(capsys, flags, says):
    """Refused by the flags alone, before the model loads (the checkpoint does not exist)."""
    with pytest.raises(SystemExit) as e:
        main(["--init", "/nonexistent/model", "--sampler", "diffusion", "--threads=1", *flags])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "error: " in err and says in err, err
