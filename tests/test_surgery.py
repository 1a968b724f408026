"""Surgery and model exactness against the parents' own implementation (transformers).

For each family a tiny random parent is built with transformers and saved in the hub's layout; the
retrofit (identity adapter) must reproduce its logits at r=1 with all layers kept, and the
transformers model with the same layers removed when layers are dropped.

    python -m pytest -q tests/test_surgery.py
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import RecurrentGPT  # noqa: E402
from surgery import SurgeryError, load_model, parse_layers, retrofit, select_layers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
SMALL = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4)

# name -> (config class, model class, config kwargs): the five parent families of the project
FAMILIES = {
    "llama32": ("LlamaConfig", "LlamaForCausalLM",
                dict(num_key_value_heads=2, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=True)),
    "tinyllama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=1, tie_word_embeddings=False)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(num_key_value_heads=4, rope_theta=500000.0, tie_word_embeddings=False)),
    "qwen25": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=True)),
    "smollm2": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, rope_theta=100000.0, tie_word_embeddings=True)),
}  # fmt: skip


def make_parent(family, path):
    cfg_cls, model_cls, kw = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, cfg_cls)(**SMALL, **kw)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # random norm weights and biases, so that a norm or bias left out would show
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    save_tiny_tokenizer(path)
    if family == "llama32":  # the hub's Llama-3.2 config.json uses the transformers 4 layout: keep both covered
        cfg = json.loads((path / "config.json").read_text())
        rope = cfg.pop("rope_parameters")
        cfg["rope_theta"] = rope.pop("rope_theta")
        cfg["rope_scaling"] = rope
        (path / "config.json").write_text(json.dumps(cfg))
    return model


def save_tiny_tokenizer(path):
    """A byte-level BPE tokenizer.json (300 ids) so the parent dir is a complete hub-layout checkpoint."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(["the recurrent block loops, and loops again"] * 20, trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}))


@pytest.fixture(scope="module", params=list(FAMILIES))
def parent(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, make_parent(request.param, path), path


def test_all_layers_equal_parent(parent):
    family, hf, path = parent
    idx = torch.randint(0, 320, (2, 40), generator=torch.Generator().manual_seed(1))
    ref = hf(idx).logits
    model, _ = retrofit(str(path), shape=(2, 2, 2))  # 6 layers: nothing dropped
    for r in (1, 3):  # the [0 | I] adapter ignores the state, so every r is the parent
        logits, _ = model.eval()(idx, num_steps=r)
        assert (logits - ref).abs().max().item() <= TOL, family


def pruned_logits(hf, kept, idx):
    """Logits of the transformers parent with only the layers `kept` (it is changed in place): the
    reference of every cut."""
    hf.model.layers = torch.nn.ModuleList(hf.model.layers[i] for i in kept)
    hf.config.num_hidden_layers = len(kept)
    if getattr(hf.config, "layer_types", None):
        hf.config.layer_types = [hf.config.layer_types[i] for i in kept]
    with torch.no_grad():
        return hf(idx, use_cache=False).logits


def test_dropped_layers_equal_pruned_parent(parent):
    family, hf, path = parent
    model, _ = retrofit(str(path), shape=(1, 2, 1))  # keeps 0 | 3,4 | 5: layers 1 and 2 dropped
    assert model.config.layers == {"prelude": [0], "core": [3, 4], "coda": [5]}
    idx = torch.randint(0, 320, (1, 24), generator=torch.Generator().manual_seed(2))
    ref = pruned_logits(hf, [0, 3, 4, 5], idx)
    logits, _ = model.eval()(idx, num_steps=1)
    assert (logits - ref).abs().max().item() <= TOL, family


def test_families_table_decides_the_parent_config():
    # families.FAMILIES is the one place the layouts differ; parent_config must read it, not decide itself
    from families import FAMILIES, HF_MODEL_TYPES
    from plumbing.parents import parent_config

    base = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4)
    for model_type, name in HF_MODEL_TYPES.items():
        fields, n_layers = parent_config({**base, "model_type": model_type})
        f = FAMILIES[name]
        assert (fields["block_type"], fields["attn_bias"], fields["qk_norm"]) == (f["block_type"], f["attn_bias"], f["qk_norm"])
        assert n_layers == 6 and fields["head_dim"] == 16
    assert parent_config({**base, "model_type": "llama", "attention_bias": True})[0]["attn_bias"]
    with pytest.raises(SurgeryError, match=r"unsupported parent model_type 'gpt2': supported are \['llama', 'mistral', 'olmo2', 'qwen2'\]"):
        parent_config({**base, "model_type": "gpt2"})
    with pytest.raises(SurgeryError, match="MLP biases"):
        parent_config({**base, "model_type": "llama", "mlp_bias": True})


def test_load_model_decides_what_init_is(tmp_path):
    from plumbing.hub import CheckpointError

    hf = make_parent("qwen25", tmp_path / "parent")
    parent = str(tmp_path / "parent")
    idx = torch.randint(0, 320, (1, 24), generator=torch.Generator().manual_seed(4))
    ref = hf(idx).logits
    # a parent, shape=None: every layer, identity adapter, equal to the parent at any r
    model, tok_path = load_model(parent)
    assert tok_path == parent and model.config.layers == {"prelude": [0], "core": [1, 2, 3, 4], "coda": [5]}
    assert model.config.parent["init"] == parent
    for r in (1, 3):
        assert (model.eval()(idx, num_steps=r)[0] - ref).abs().max().item() <= TOL
    # a parent cut as retrofit cuts it, with the config overrides passed on
    model, _ = load_model(parent, shape=(1, 2, 1), untie=True, adapter_init="sum", mean_recurrence=3, state_init="zero")
    cut, _ = retrofit(parent, shape=(1, 2, 1), untie=True, adapter_init="sum", mean_recurrence=3, state_init="zero")
    assert model.config == cut.config and not model.config.tie_embeddings and model.config.mean_recurrence == 3
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), cut.state_dict().values()))
    model, _ = load_model(parent, layers="0-0,2-3,5-5", static=True)
    assert not model.config.recurrent and model.config.layers == {"prelude": [0], "core": [2, 3], "coda": [5]}
    # one of ours: read as it is (the cut arguments describe a parent), overrides applied
    cut.save_pretrained(str(tmp_path / "ours"))
    model, tok_path = load_model(str(tmp_path / "ours"), shape=(2, 2, 2), state_init="normal")
    assert tok_path == str(tmp_path / "ours") and model.config.layers == cut.config.layers
    assert model.config.state_init == "normal" and model.config.adapter_init == "sum"
    with pytest.raises(CheckpointError, match="no such file or directory") as err:
        load_model(str(tmp_path / "nowhere"))
    assert "\n" not in str(err.value)


def test_a_cut_asked_of_a_checkpoint_is_named(tmp_path):
    """load_model reads a checkpoint as it is: a --shape, --layers or --static that it did not apply is named in one
    line (train.py prints it), and a cut it did apply, or one equal to the checkpoint's, says nothing."""
    from surgery import cut_not_applied

    make_parent("smollm2", tmp_path / "parent")
    parent, ours = str(tmp_path / "parent"), str(tmp_path / "ours")
    cut, _ = retrofit(parent, shape=(1, 2, 1))
    cut.save_pretrained(ours)
    for init, kw in ((parent, dict(shape=(2, 2, 2))), (parent, dict(layers="0-0,2-3,5-5", static=True)),
                     (ours, dict(shape=(1, 2, 1))), (ours, dict(layers="0-0,3-4,5-5"))):
        model, _ = load_model(init, **kw)
        assert cut_not_applied(model, init, **kw) is None, (init, kw)
    model, _ = load_model(ours, shape=(2, 2, 2), static=True)
    line = cut_not_applied(model, ours, shape=(2, 2, 2), static=True)
    assert line.startswith(f"{ours} is cut already (recurrent, shape 1,2,1)") and "\n" not in line
    assert "--shape 2,2,2 and --static not applied" in line
    line = cut_not_applied(*load_model(ours)[:1], ours, layers="0-0,1-2,5-5")
    assert "--layers 0-0,1-2,5-5 not applied" in line


def test_published_layer_maps():
    # the published retrofits (McLeish et al. 2025): TinyLlama (22) 4,8,4; Llama-3.2 (16) 4,6,4 and 2,4,2; OLMo-2 (16) 4,6,4
    assert select_layers(22, (4, 8, 4)) == {"prelude": [0, 1, 2, 3], "core": list(range(10, 18)), "coda": [18, 19, 20, 21]}
    assert select_layers(16, (4, 6, 4)) == {"prelude": [0, 1, 2, 3], "core": list(range(6, 12)), "coda": [12, 13, 14, 15]}
    assert select_layers(16, (2, 4, 2)) == {"prelude": [0, 1], "core": [10, 11, 12, 13], "coda": [14, 15]}
    assert parse_layers("0-3,6-11,12-15", 16) == select_layers(16, (4, 6, 4))


@pytest.mark.parametrize("shape,msg", [((8, 8, 8), "needs 24 layers"), ((0, 4, 2), "empty part")])
def test_bad_shapes(shape, msg):
    with pytest.raises(SurgeryError, match=msg):
        select_layers(16, shape)


@pytest.mark.parametrize("spec,msg", [("0-3,3-8,12-15", "overlap"), ("0-3,6-11", "three ranges"), ("0-3,6-11,12-16", "does not exist")])
def test_bad_layer_specs(spec, msg):
    with pytest.raises(SurgeryError, match=msg):
        parse_layers(spec, 16)


def run_cli(*args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # the hub is unreachable here: fail fast instead of waiting on it
    return subprocess.run([sys.executable, "surgery.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_cli_writes_checkpoint_and_checks_itself(tmp_path):
    make_parent("olmo2", tmp_path / "parent")
    out = tmp_path / "rec"
    res = run_cli("--init", str(tmp_path / "parent"), "--shape", "2,2,1", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "self-check" in res.stdout and "max abs logit diff" in res.stdout
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["layers"] == {"prelude": [0, 1], "core": [3, 4], "coda": [5]}
    assert cfg["parent"]["init"] == str(tmp_path / "parent")
    model = RecurrentGPT.from_pretrained(str(out))
    assert model.adapter.weight.shape == (64, 128)
    from plumbing.tokenizer import load_tokenizer

    tok = load_tokenizer(str(out))
    assert tok.decode(tok.encode("loops again")) == "loops again"


def test_cli_bad_input_one_line(tmp_path):
    make_parent("smollm2", tmp_path / "parent")
    cases = [
        ("--init", str(tmp_path / "parent"), "--shape", "4,4,4", "--out", str(tmp_path / "o1")),  # 12 > 6 layers
        ("--init", str(tmp_path / "nowhere"), "--shape", "1,1,1", "--out", str(tmp_path / "o2")),
        ("--init", str(tmp_path / "parent"), "--shape", "1,x,1", "--out", str(tmp_path / "o3")),
        ("--init", "no-such-org/no-such-model", "--shape", "1,1,1", "--out", str(tmp_path / "o5")),  # hub failure
        ("--init", "no_such_short_name", "--shape", "1,1,1", "--out", str(tmp_path / "o6")),
    ]
    # a truncated weights file
    st = tmp_path / "parent" / "model.safetensors"
    trunc = tmp_path / "trunc"
    trunc.mkdir()
    (trunc / "config.json").write_text((tmp_path / "parent" / "config.json").read_text())
    (trunc / "model.safetensors").write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    cases.append(("--init", str(trunc), "--shape", "1,1,1", "--out", str(tmp_path / "o4")))
    for args in cases:
        res = run_cli(*args)
        assert res.returncode != 0, args
        assert "Traceback" not in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert res.stderr.startswith("surgery.py: error:"), res.stderr


def test_cli_refuses_to_overwrite_a_checkpoint(tmp_path):
    from plumbing import checkpoint
    from model import RecurrentConfig

    make_parent("smollm2", tmp_path / "parent")
    tiny = RecurrentGPT(RecurrentConfig(vocab_size=320, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, n_core=1))
    cut = tmp_path / "cut"  # what an earlier surgery wrote
    tiny.save_pretrained(cut)
    run = tmp_path / "run"  # a training run: its names are links into ckpt/ (checkpoint.save)
    checkpoint.save(run, 2, tiny, {"step": 2}, {"step": 2})
    for out in (cut, run):
        res = run_cli("--init", str(tmp_path / "parent"), "--shape", "1,2,1", "--out", str(out))
        assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert f"--out {out} already holds a checkpoint (model.safetensors and config.json)" in res.stderr
        assert "--overwrite" in res.stderr and RecurrentGPT.from_pretrained(str(out)).config.n_embd == 32  # untouched
    res = run_cli("--init", str(tmp_path / "parent"), "--shape", "1,2,1", "--out", str(run), "--overwrite")
    assert res.returncode == 0, res.stderr
    assert RecurrentGPT.from_pretrained(str(run)).config.layers == {"prelude": [0], "core": [3, 4], "coda": [5]}
    # the run's saves went with it: no link or train state left pointing at the old weights
    assert not any(os.path.lexists(run / n) for n in ("latest", "ckpt", "train_state.pt"))


def test_cli_static_takes_the_cuts_layers_and_checks_honestly(tmp_path):
    # --static used to keep "the whole parent" by P and C alone: 4,1,4 on 6 layers made 8 blocks with
    # layers 2-3 twice, and printed a self-check of 0.00e+00 that never ran
    make_parent("smollm2", tmp_path / "parent")
    res = run_cli("--init", str(tmp_path / "parent"), "--static", "--shape", "4,1,4", "--out", str(tmp_path / "bad"))
    assert res.returncode == 1 and "needs 9 layers but the parent has 6" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()
    idx = torch.randint(0, 320, (1, 24), generator=torch.Generator().manual_seed(3))
    for flags, kept in ((("--shape", "2,1,2"), [0, 1, 3, 4, 5]), (("--layers", "0-0,2-3,5-5"), [0, 2, 3, 5])):
        out = tmp_path / flags[1]
        res = run_cli("--init", str(tmp_path / "parent"), "--static", *flags, "--out", str(out))
        assert res.returncode == 0, res.stderr
        assert "max abs logit diff" not in res.stdout and "self-check: none for a static model" in res.stdout
        model = RecurrentGPT.from_pretrained(str(out)).eval()
        layers = model.config.layers
        assert not model.config.recurrent and layers["prelude"] + layers["core"] + layers["coda"] == kept
        ref = pruned_logits(make_parent("smollm2", tmp_path / "ref"), kept, idx)
        assert (model(idx)[0] - ref).abs().max().item() <= TOL


def test_llama3_rope_scaling_matches_transformers():
    # the logits tests above see rope scaling only weakly (short sequences, small weights): check the frequencies
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from model import rope_inv_freq

    config = transformers.LlamaConfig(**SMALL, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, max_position_embeddings=131072)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](config)
    ours = rope_inv_freq(16, 500000.0, LLAMA3_ROPE)
    assert torch.equal(ours, ref)
    assert not torch.allclose(ours, rope_inv_freq(16, 500000.0))  # the scaling does change something
