"""The raven format (Huginn-0125 and retrofit-Llama checkpoints) against the reference implementations.

../shared/fixtures/{huginn_tiny,retrofit_llama_tiny} hold tiny random checkpoints written by the
published modeling code with its own logits at r = 1, 2, 4, 8 (zero initial state). Importing them must
reproduce those logits to 1e-5 (a wrong convention moves them by >= 2e-4); exporting must write the
reference's own tensors and config; our models must survive export -> import bit for bit.

    python -m pytest -q tests/test_raven.py
"""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from model import RecurrentConfig, RecurrentGPT
from plumbing.raven import RavenError, export_raven, load_raven
from surgery import load_model

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
NAMES = ["huginn_tiny", "retrofit_llama_tiny"]
TOL = 1e-5
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip

torch.set_num_threads(2)


@pytest.fixture(scope="module", params=NAMES)
def fixture(request):
    path = FIXTURES / request.param
    model = load_model(str(path), state_init="zero")[0].eval()
    return request.param, path, model, load_file(str(path / "io.safetensors"))


def logits_at(model, ids, r):
    with torch.no_grad():
        return model(ids, num_steps=r)[0]


def test_fixture_logits(fixture):
    name, _, model, io = fixture
    for r in (1, 2, 4, 8):
        diff = (logits_at(model, io["input_ids"], r) - io[f"logits_r{r}"]).abs().max().item()
        assert diff <= TOL, f"{name} r={r}: max abs diff {diff:.2e}"


def test_fixture_prelude_and_latents(fixture):
    name, _, model, io = fixture
    ids = io["input_ids"]
    with torch.no_grad():
        rope = model.rope(torch.arange(ids.shape[1]))
        e = model.run_prelude(ids, rope)
        assert (e - io["prelude_out"]).abs().max() <= TOL
        s = model.init_state(e)
        assert torch.equal(s, torch.zeros_like(e))
        for step in range(4):
            s = model.iterate(s, e, rope, step)
    if name == "huginn_tiny":  # latent_states is ln_f(s_4); the raw state is given separately
        assert (s - io["state_r4_pre_ln_f"]).abs().max() <= TOL
        assert (model.norm(s) - io["latent_states_r4"]).abs().max() <= TOL
    else:  # the retrofit code returns the raw s_4 (no ln_f before its coda)
        assert (s - io["latent_states_r4"]).abs().max() <= TOL


def test_fixture_config_mapping(fixture):
    name, path, model, _ = fixture
    c, cfg = model.config, json.loads((path / "config.json").read_text())
    assert c.state_std == cfg["init_values"]["std"] and c.mean_recurrence == cfg["mean_recurrence"] == 32
    if name == "huginn_tiny":
        assert (c.block_type, c.rope_theta, c.embed_scale) == ("sandwich", 50000.0, 8.0)
        assert c.norm_before_coda and c.attn_bias and c.tie_embeddings and c.norm_eps == 1e-6
        assert torch.equal(model.coda[0].self_attn.v_proj.bias, torch.zeros(64))  # qk_bias has no v part
        assert model.lm_head.weight is model.embed_tokens.weight  # still one tensor when training
    else:  # rope_theta (10000), never the stale rope_base (500000); embed scale from init_values (1.0)
        assert (c.block_type, c.rope_theta, c.embed_scale) == ("prenorm", 10000.0, 1.0)
        assert not c.norm_before_coda and not c.attn_bias and not c.tie_embeddings
        assert (c.n_head, c.n_kv_head, c.norm_eps) == (4, 2, 1e-5)


def test_imported_model_trains_and_saves_in_our_format(fixture, tmp_path):
    # continue training a published model: gradients reach every tensor, save/load is exact
    name, _, model, io = fixture
    ids = io["input_ids"]
    model.zero_grad()
    model(ids, targets=ids.roll(-1, 1), num_steps=(2, 2))[1].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.zero_grad()
    model.save_pretrained(str(tmp_path))
    again = RecurrentGPT.from_pretrained(str(tmp_path)).eval()
    assert again.config.block_type == model.config.block_type and again.config.state_init == "zero"
    assert torch.equal(logits_at(again, ids, 4), logits_at(model, ids, 4))


@pytest.mark.parametrize("name", NAMES)
def test_state_init_matches_reference_distribution(name):
    # reference: s_0 = trunc_normal(0, std, [-3 std, 3 std]) * embed_scale, std = init_values.std
    cfg = json.loads((FIXTURES / name / "config.json").read_text())
    model = load_raven(str(FIXTURES / name))
    assert model.config.state_init == "normal"
    sigma = cfg["init_values"]["std"] * (math.sqrt(cfg["n_embd"]) if name == "huginn_tiny" else 1.0)
    s = model.init_state(torch.zeros(8, 256, 64), generator=torch.Generator().manual_seed(0))
    # std of a normal truncated at +-3: sqrt(1 - 2*3*phi(3) / (Phi(3) - Phi(-3)))
    phi3 = math.exp(-4.5) / math.sqrt(2 * math.pi)
    expected = sigma * math.sqrt(1 - 6 * phi3 / math.erf(3 / math.sqrt(2)))
    assert abs(s.std().item() / expected - 1) < 0.015
    assert s.abs().max().item() <= 3 * sigma * (1 + 1e-6) and s.abs().max().item() > 2.8 * sigma
    assert abs(s.mean().item()) < 0.01 * sigma


def random_model(kind, **overrides):
    """A tiny random model of one raven variant, every tensor perturbed so each one moves the logits."""
    if kind == "sandwich":  # Huginn's conventions: sqrt(h) scale, ln_f before the coda, q/k bias, tied
        kw = dict(block_type="sandwich", n_kv_head=4, attn_bias=True, embed_scale=8.0,
                  norm_before_coda=True, rope_theta=50000.0, norm_eps=1e-6, tie_embeddings=True)
    else:  # retrofit Llama-3.2: GQA, llama3 rope scaling, untied head
        kw = dict(block_type="prenorm", n_kv_head=2, rope_scaling=LLAMA3_ROPE, tie_embeddings=False)
    kw = {**dict(vocab_size=256, n_embd=64, n_head=4, head_dim=16, intermediate_size=128, n_prelude=1,
                 n_core=2, n_coda=1, block_size=64, adapter_init="random", state_std=0.05), **kw, **overrides}
    torch.manual_seed(0)
    model = RecurrentGPT(RecurrentConfig(**kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("v_proj.bias"):
                continue  # raven has a q/k bias only
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.02 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("kind,fixture_name", [("sandwich", "huginn_tiny"), ("prenorm", "retrofit_llama_tiny")])
def test_export_import_roundtrip_of_our_models(kind, fixture_name, tmp_path):
    model = random_model(kind)
    model.save_pretrained(str(tmp_path / "ours"))
    variant = export_raven(str(tmp_path / "ours"), str(tmp_path / "raven"))
    assert variant == {"sandwich": "huginn", "prenorm": "retrofit"}[kind]
    # the written files have the reference's layout: same tensor names, shapes and config keys
    ours, ref = load_file(str(tmp_path / "raven/model.safetensors")), load_file(str(FIXTURES / fixture_name / "model.safetensors"))
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in ref.items()}
    cfg = json.loads((tmp_path / "raven/config.json").read_text())
    ref_cfg = json.loads((FIXTURES / fixture_name / "config.json").read_text())
    assert set(cfg) == set(ref_cfg) | ({"rope_scaling"} if kind == "prenorm" else set())
    if kind == "sandwich":  # the derived RoPE table, bit for bit as Huginn's code builds it
        assert torch.equal(ours["freqs_cis"], ref["freqs_cis"])
    back = load_model(str(tmp_path / "raven"))[0].eval()
    assert back.config.state_std == 0.05 and back.config.state_init == "normal"
    assert back.config.rope_scaling == model.config.rope_scaling
    sd, sd_back = model.state_dict(), back.state_dict()
    assert sd.keys() == sd_back.keys() and all(torch.equal(sd[k], sd_back[k]) for k in sd)
    for m in (model, back):
        m.config.state_init = "zero"
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    for r in (1, 3):
        assert torch.equal(logits_at(model, ids, r), logits_at(back, ids, r))


@pytest.mark.parametrize("name", NAMES)
def test_fixture_import_export_import(name, tmp_path):
    assert export_raven(str(FIXTURES / name), str(tmp_path)) == ("huginn" if name == "huginn_tiny" else "retrofit")
    ref, ours = load_file(str(FIXTURES / name / "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    assert ref.keys() == ours.keys() and all(torch.equal(ref[k], ours[k]) for k in ref)
    cfg, ref_cfg = json.loads((tmp_path / "config.json").read_text()), json.loads((FIXTURES / name / "config.json").read_text())
    if name == "retrofit_llama_tiny":
        # stale Huginn values in the published configs that no code reads; we write consistent ones
        for d in (cfg, ref_cfg):
            d.pop("rope_base"), d.pop("effective_expected_depth"), d["init_values"].pop("embedding"), d["init_values"].pop("out_proj")
    assert cfg == ref_cfg
    model = load_model(str(tmp_path), state_init="zero")[0].eval()
    io = load_file(str(FIXTURES / name / "io.safetensors"))
    for r in (1, 2, 4, 8):
        assert (logits_at(model, io["input_ids"], r) - io[f"logits_r{r}"]).abs().max() <= TOL


def test_sharded_bf16_checkpoint_like_the_published_huginn(tmp_path):
    # Huginn-0125 on the hub is bf16 and split over several files named by model.safetensors.index.json
    src = FIXTURES / "huginn_tiny"
    sd = {k: v.bfloat16() for k, v in load_file(str(src / "model.safetensors")).items()}
    keys = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for fname, ks in shards.items():
        save_file({k: sd[k] for k in ks}, str(tmp_path / fname), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(src / "config.json", tmp_path / "config.json")
    model = load_raven(str(tmp_path), state_init="zero").eval()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert torch.equal(model.embed_tokens.weight, sd["transformer.wte.weight"].float())
    # the same rounded weights as one fp32 file must give the same model, bit for bit
    (tmp_path / "one").mkdir()
    save_file({k: v.float() for k, v in sd.items()}, str(tmp_path / "one" / "model.safetensors"))
    shutil.copy(src / "config.json", tmp_path / "one" / "config.json")
    ref = load_raven(str(tmp_path / "one"), state_init="zero").eval()
    ids = load_file(str(src / "io.safetensors"))["input_ids"]
    assert torch.equal(logits_at(model, ids, 4), logits_at(ref, ids, 4))
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(RavenError, match="model-00002-of-00002"):
        load_raven(str(tmp_path))


def test_retrofit_llama3_rope_scaling_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for f in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURES / "retrofit_llama_tiny" / f, tmp_path / f)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_scaling"] = {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_type"} | {"type": "llama3"}  # old key
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = load_raven(str(tmp_path))
    hf = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=131072,
                                  rope_parameters={**LLAMA3_ROPE, "rope_theta": 10000.0})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    assert torch.allclose(model.inv_freq, inv_freq.float(), rtol=1e-6, atol=0)


REFUSED = [  # (kind, overrides, words of the one-line error)
    ("prenorm", dict(block_type="olmo2", qk_norm=True), "OLMo-2"),
    ("sandwich", dict(n_kv_head=2), "GQA"),
    ("sandwich", dict(norm_before_coda=False), "norm_before_coda"),
    ("sandwich", dict(embed_scale=1.0), "sqrt(n_embd)"),
    ("prenorm", dict(recurrent=False), "static-depth"),
    ("prenorm", dict(state_init="embed"), "state_init='embed'"),
    ("prenorm", dict(first_loop="identity"), "first_loop='identity'"),
    ("sandwich", dict(first_loop="identity"), "first_loop='identity'"),
    ("prenorm", dict(n_kv_head=4, attn_bias=True), "v_proj.bias"),  # made nonzero below
    ("sandwich", dict(rope_scaling=LLAMA3_ROPE), "Huginn's RoPE has no scaling"),
    ("prenorm", dict(norm_before_coda=True), "norm_before_coda in a pre-norm model"),
    ("prenorm", dict(attn_bias=True), "q/k bias with GQA"),  # n_kv_head=2 < n_head=4
]


@pytest.mark.parametrize("kind,overrides,words", REFUSED)
def test_export_refuses_what_raven_cannot_express(kind, overrides, words, tmp_path):
    model = random_model(kind, **overrides)
    if overrides.get("attn_bias"):
        with torch.no_grad():
            model.core[1].self_attn.v_proj.bias.fill_(0.1)
    model.save_pretrained(str(tmp_path / "ours"))
    with pytest.raises(RavenError) as err:
        export_raven(str(tmp_path / "ours"), str(tmp_path / "raven"))
    assert words in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "raven" / "model.safetensors").exists()


def test_import_refuses_unknown_or_inconsistent_checkpoints(tmp_path):
    src = FIXTURES / "huginn_tiny"
    cases = {
        "gqa": lambda cfg, sd: cfg.update(num_key_value_heads=2),
        "extra": lambda cfg, sd: sd.update({"transformer.extra.weight": torch.zeros(3)}),
        "kind": lambda cfg, sd: cfg.update(model_type="llama"),
        "notheta": lambda cfg, sd: [sd.pop(k) for k in list(sd) if ".norm_3." in k or ".norm_4." in k],
    }
    words = {"gqa": "GQA", "extra": "transformer.extra.weight", "kind": "huginn_raven", "notheta": "rope_theta"}
    for case, edit in cases.items():
        d = tmp_path / case
        d.mkdir()
        cfg, sd = json.loads((src / "config.json").read_text()), load_file(str(src / "model.safetensors"))
        edit(cfg, sd)
        (d / "config.json").write_text(json.dumps(cfg))
        save_file(sd, str(d / "model.safetensors"))
        with pytest.raises(RavenError, match=words[case].replace("(", r"\(")):
            load_raven(str(d))


def test_export_copies_tokenizer_and_cli_errors_are_one_line(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    random_model("prenorm").save_pretrained(str(tmp_path / "ours"))
    tok.save(str(tmp_path / "ours" / "tokenizer.json"))
    export_raven(str(tmp_path / "ours"), str(tmp_path / "raven"))
    assert tokenizers.Tokenizer.from_file(str(tmp_path / "raven" / "tokenizer.json")).encode("hello world").ids == [1, 2]
    random_model("sandwich", n_kv_head=2).save_pretrained(str(tmp_path / "gqa"))
    run = subprocess.run([sys.executable, "-m", "plumbing.raven", "--export", str(tmp_path / "gqa"), str(tmp_path / "x")],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 1 and "Traceback" not in run.stderr and run.stderr.count("\n") == 1
    assert "GQA" in run.stderr


# -----------------------------------------------------------------------------
# the published retrofits as their converter writes them (convert_llama.py, unmodified: see the fixture's README)


def test_converted_retrofit_loads_with_its_layout_and_matches_its_logits(capfd):
    path = FIXTURES / "retrofit_converted_tiny"
    model = load_model(str(path), state_init="zero")[0].eval()
    note = capfd.readouterr().err.strip().splitlines()
    # the layout comes from config.json (rope_theta), and the 33 leftovers of the Huginn snapshot are named once
    assert len(note) == 1 and "rope_theta" in note[0] and "33 tensors" in note[0]
    assert all(w in note[0] for w in ("norm_3", "norm_4", "freqs_cis"))
    c = model.config
    assert (c.block_type, c.n_kv_head, c.rope_theta, c.tie_embeddings) == ("prenorm", 2, 10000.0, False)
    assert (c.n_prelude, c.n_core, c.n_coda) == (4, 8, 4)
    io = load_file(str(path / "io.safetensors"))
    for r in (1, 4, 8):
        diff = (logits_at(model, io["input_ids"], r) - io[f"logits_r{r}"]).abs().max().item()
        assert diff <= TOL, f"r={r}: max abs diff {diff:.2e}"


def test_the_modeling_file_beside_the_weights_decides_the_layout(tmp_path):
    """auto_map's modeling file, when present, outranks config.json: a Huginn checkpoint whose config
    gained a rope_theta still loads as Huginn next to Huginn's modeling file, and a converted retrofit
    next to a Llama modeling file loads as pre-norm without the rope_theta hint."""
    huginn, conv = tmp_path / "huginn", tmp_path / "conv"
    shutil.copytree(FIXTURES / "huginn_tiny", huginn)
    shutil.copytree(FIXTURES / "retrofit_converted_tiny", conv)
    cfg = json.loads((huginn / "config.json").read_text())
    (huginn / "config.json").write_text(json.dumps({**cfg, "rope_theta": 10000.0}))
    (huginn / "raven_modeling_minimal.py").write_text("class SandwichBlock: pass  # Huginn's own code\n")
    cfg = json.loads((conv / "config.json").read_text())
    cfg.pop("rope_theta")
    (conv / "config.json").write_text(json.dumps({**cfg, "rope_base": 10000.0}))
    (conv / "raven_modeling_minimal.py").write_text(
        "from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb\n")
    m = load_model(str(huginn), state_init="zero")[0].eval()
    io = load_file(str(huginn / "io.safetensors"))
    assert m.config.block_type == "sandwich"
    assert (logits_at(m, io["input_ids"], 4) - io["logits_r4"]).abs().max() <= TOL
    with pytest.raises(RavenError, match="rope_theta"):  # pre-norm, but no rope_theta to build its RoPE from
        load_raven(str(conv))


@pytest.mark.parametrize("name", NAMES)
def test_surgery_exports_raven_sources_with_their_card(name, tmp_path):
    """`surgery.py --export-raven` of a raven checkpoint (Huginn or a retrofit): a model card, the reference logits
    on reload, and nothing left beside OUT."""
    import surgery

    out = tmp_path / "out"
    assert surgery.main(["--export-raven", str(FIXTURES / name), str(out)]) == 0
    assert "the core r times (default r = " in (out / "README.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    model = load_model(str(out), state_init="zero")[0].eval()
    io = load_file(str(FIXTURES / name / "io.safetensors"))
    for r in (1, 4):
        assert (logits_at(model, io["input_ids"], r) - io[f"logits_r{r}"]).abs().max() <= TOL


def test_export_that_fails_midway_leaves_no_out(tmp_path, monkeypatch):
    import surgery

    def broken_card(*args, **kwargs):
        raise OSError("disk full")

    out = tmp_path / "out"
    monkeypatch.setattr(surgery, "write_model_card", broken_card)
    with pytest.raises((OSError, SystemExit)):
        surgery.main(["--export-raven", str(FIXTURES / "huginn_tiny"), str(out)])
    assert list(tmp_path.iterdir()) == []
