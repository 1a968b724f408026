"""first_loop "identity" (model.py), arXiv 2608.11233's identity-preserving single-loop path: loop 1 feeds the core
the prelude's output e itself, the adapter acts from loop 2 on, so a cut that keeps every layer of its parent is
the parent at r = 1 whatever the adapter holds.

References: tiny parents built with transformers (tests/test_surgery.py's make_parent, and a Llama of the depth
task's vocabulary) and their own logits, bit for bit at r = 1, before and after adapter-only training; the plain
forward for the KV-cached decoder's greedy tokens; sequential decoding for the diffusion sampler's limit; our model
for the transformers remote code. Every path that loops (forward's no-grad loops and per-loop readouts, the decoder,
adaptive exit, the diffusion sampler, the remote code) goes through model.iterate, where the bypass is.

    python -m pytest -q tests/test_first_loop.py
"""

import json
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import surgery  # noqa: E402
from diffusion import generate_diffusion  # noqa: E402
from model import RecurrentConfig, RecurrentGPT  # noqa: E402
from plumbing.raven import RavenError, export_raven  # noqa: E402
from sample import generate  # noqa: E402
from test_surgery import FAMILIES, ROOT, make_parent  # noqa: E402
from test_train import ENV, run_train  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
ALL_LAYERS = "0-1,2-3,4-5"  # make_parent's 6 layers, every one kept


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(transformers parent, its directory): SmolLM2's layout, tiny and random (make_parent)."""
    path = tmp_path_factory.mktemp("smollm2")
    return make_parent("smollm2", path), path


def in_place(path):
    """The parent at `path` cut keeping every layer, with the bypass and a random adapter (the bypass, not an
    identity adapter, must make r = 1 the parent)."""
    torch.manual_seed(0)
    return surgery.retrofit(str(path), layers=ALL_LAYERS, first_loop="identity", adapter_init="random")[0].eval()


def ids(n=2, T=24, vocab=320, seed=1):
    return torch.randint(0, vocab, (n, T), generator=torch.Generator().manual_seed(seed))


# -----------------------------------------------------------------------------
# the config field


def test_config_field_is_checked_saved_and_read_back(tmp_path):
    with pytest.raises(ValueError, match="first_loop must be adapter or identity") as err:
        RecurrentConfig(first_loop="bypass")
    assert "\n" not in str(err.value)
    RecurrentGPT(RecurrentConfig(first_loop="identity")).save_pretrained(str(tmp_path / "m"))
    assert json.loads((tmp_path / "m" / "config.json").read_text())["first_loop"] == "identity"
    assert RecurrentGPT.from_pretrained(str(tmp_path / "m")).config.first_loop == "identity"
    # every script's --init, with the overrides train.py passes for a checkpoint, keeps it
    model, _ = surgery.load_model(str(tmp_path / "m"), adapter_init="identity", mean_recurrence=3)
    assert model.config.first_loop == "identity"


def test_config_json_without_the_field_loads_as_before(tmp_path):
    """A config.json written before the field existed: the adapter on loop 1, in our loader and in transformers'."""
    torch.manual_seed(0)
    model = RecurrentGPT(RecurrentConfig(adapter_init="random", state_init="zero")).eval()
    model.save_pretrained(str(tmp_path))  # with the remote code (plumbing/hf_remote.py)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["first_loop"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    x = ids(vocab=256)
    ours = RecurrentGPT.from_pretrained(str(tmp_path)).eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), trust_remote_code=True).eval()
    assert ours.config.first_loop == theirs.config.first_loop == "adapter"
    with torch.no_grad():
        want = model(x, num_steps=3)[0]
        assert torch.equal(ours(x, num_steps=3)[0], want)
        assert torch.equal(theirs(x, num_steps=3).logits, want)


# -----------------------------------------------------------------------------
# r = 1 is the parent


@pytest.mark.parametrize("family", list(FAMILIES))
def test_r1_is_the_parent_bit_for_bit(family, tmp_path):
    """Every layer kept, a random adapter: r = 1 equals transformers' parent exactly (the same fp32 ops in the
    same order: model.py's RMSNorm and apply_rope are bitwise HF's), and r = 4 moves away from it."""
    hf = make_parent(family, tmp_path)
    model = in_place(tmp_path)
    x = ids()
    with torch.no_grad():
        ref = hf(x).logits
        one, four = model(x, num_steps=1)[0], model(x, num_steps=4)[0]
    assert torch.equal(one, ref), (one - ref).abs().max().item()
    assert (four - one).abs().max().item() > 1e-2


def test_every_loop_path_of_forward_bypasses_loop_1(llama):
    """The no-grad loops of truncated backprop, the per-loop readouts and the recorded states: loop 1 is the
    parent wherever it runs, and s_0 = e (read by no loop)."""
    hf, path = llama
    model = in_place(path)
    x, y = ids(), ids(seed=2)
    with torch.no_grad():
        ref = hf(x).logits
        # (no-grad loops, grad loops): the same logits as r = n + k, loop 1 among the no-grad ones or not
        assert torch.equal(model(x, num_steps=(1, 3))[0], model(x, num_steps=4)[0])
        assert torch.equal(model(x, num_steps=(1, 0))[0], ref)
        out = model(x, y, num_steps=4, depths=torch.ones_like(y), depth_weight=1.0, return_states=True,
                    return_loop_logits=True)
        assert torch.equal(out.loop_logits[0], ref)  # the readout after loop 1 (per-loop supervision) is the parent
        e = model.run_prelude(x, model.rope(torch.arange(x.shape[1])))
        assert torch.equal(out.states[0], e)
        assert torch.equal(model(x, num_steps=4)[0], model(x, num_steps=4)[0])  # nothing is drawn
    # at r = 1 the adapter is on no path of the loss; from loop 2 on it is
    model.train()
    model(x, y, num_steps=1)[1].backward()
    assert model.adapter.weight.grad is None and model.embed_tokens.weight.grad is not None
    model(x, y, num_steps=(1, 1))[1].backward()
    assert model.adapter.weight.grad is not None and model.adapter.weight.grad.abs().sum() > 0


def test_first_mask_decides_per_position():
    """iterate's `first` (diffusion.py's passes): all True is loop 1's bypass, all False the adapter, which is what
    a first_loop "adapter" model with the same weights runs."""
    torch.manual_seed(0)
    model = RecurrentGPT(RecurrentConfig(first_loop="identity", adapter_init="random")).eval()
    plain = RecurrentGPT(RecurrentConfig(adapter_init="random")).eval()
    plain.load_state_dict(model.state_dict())
    e, s = torch.randn(2, 8, 64), torch.randn(2, 8, 64)
    rope = model.rope(torch.arange(8))
    with torch.no_grad():
        bypass, adapter = model.iterate(s, e, rope, 0), plain.iterate(s, e, rope, 0)
        assert torch.equal(model.iterate(s, e, rope, 0, first=torch.ones(2, 8, dtype=torch.bool)), bypass)
        assert torch.equal(model.iterate(s, e, rope, 0, first=torch.zeros(2, 8, dtype=torch.bool)), adapter)
        assert torch.equal(model.iterate(s, e, rope, 1), plain.iterate(s, e, rope, 1))
        assert not torch.equal(bypass, adapter)


# -----------------------------------------------------------------------------
# the checkpoint: surgery.py's flag, adapter-only training, the transformers remote code, raven


def test_surgery_flag_writes_the_bypass(llama, tmp_path):
    hf, path = llama
    out = tmp_path / "in_place"
    p = subprocess.run([sys.executable, "surgery.py", "--init", str(path), "--layers", ALL_LAYERS, "--first_loop",
                        "identity", "--adapter_init", "random", "--out", str(out)], cwd=ROOT,
                       env={**ENV, "HF_HUB_OFFLINE": "1"},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["first_loop"] == "identity"
    assert "first loop" in (out / "README.md").read_text()  # the model card says so
    model = RecurrentGPT.from_pretrained(str(out)).eval()
    x = ids()
    with torch.no_grad():
        assert torch.equal(model(x, num_steps=1)[0], hf(x).logits)


def test_adapter_only_training_keeps_r1_the_parent(depth_dir, tmp_path):
    """train.py --first_loop identity --freeze base on a Llama parent cut keeping every layer: only the adapter
    moves, r = 1 stays the parent bit for bit (its steps at r = 1 have nothing to train and no backward), r > 1 does
    not."""
    vocab = json.loads((depth_dir / "meta.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "parent")  # no tokenizer: the depth task's own vocabulary
    out = tmp_path / "adapter_only"
    run_train(["--init", str(tmp_path / "parent"), "--layers", "0-0,1-2,3-3", "--first_loop", "identity",
               "--freeze=base", "--data", str(depth_dir), "--out_dir", str(out), "--batch_size=8", "--eval_iters=1",
               "--eval_r=1,2", "--mean_recurrence=1", "--backprop_depth=2", "--learning_rate=0.02",
               "--warmup_iters=1", "--decay_frac=0", "--max_iters=6", "--eval_interval=6"])
    r = [d["r"] for d in map(json.loads, open(out / "log.jsonl")) if "loss" in d]
    assert 1 in r and max(r) > 1, r  # both kinds of step ran
    model = RecurrentGPT.from_pretrained(str(out)).eval()
    assert model.config.first_loop == "identity"
    assert not torch.equal(model.adapter.weight[:, :32], torch.zeros(32, 32))  # the state half moved from [0 | I]
    x = ids(vocab=vocab)
    with torch.no_grad():
        one = model(x, num_steps=1)[0]
        assert torch.equal(one, hf(x).logits)
        assert not torch.equal(model(x, num_steps=4)[0], one)


def test_transformers_round_trip(llama, tmp_path):
    """save_pretrained -> AutoModelForCausalLM (trust_remote_code): the same logits at r = 1 (the parent's) and
    r = 4, and generate()'s greedy tokens with its cache equal sample.generate's."""
    hf, path = llama
    model = in_place(path)
    model.save_pretrained(str(tmp_path))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), trust_remote_code=True).eval()
    assert theirs.config.first_loop == "identity"
    x = ids()
    with torch.no_grad():
        assert torch.equal(theirs(x, num_steps=1).logits, hf(x).logits)
        assert torch.equal(theirs(x, num_steps=4).logits, model(x, num_steps=4)[0])
        prompt = x[:1, :9]
        out = theirs.generate(prompt, num_steps=4, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out[0, 9:].tolist() == generate(model, [prompt[0].tolist()], max_new_tokens=6, num_steps=4)[0].tokens


def test_raven_export_refuses_the_bypass(llama, tmp_path):
    in_place(llama[1]).save_pretrained(str(tmp_path / "ours"))
    with pytest.raises(RavenError, match="first_loop='identity'") as err:
        export_raven(str(tmp_path / "ours"), str(tmp_path / "raven"))
    assert "\n" not in str(err.value)


# -----------------------------------------------------------------------------
# decoding: the KV cache, adaptive exit, the diffusion sampler


def greedy_by_forward(model, prompt, n, r):
    """Greedy tokens by the plain forward over the whole sequence each step: the reference of every decoder."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq]), num_steps=r)[0][0, -1].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("r", [1, 4])
def test_cached_decoder_equals_forward(llama, r):
    hf, path = llama
    model = in_place(path)
    prompt = ids(1, 9)[0].tolist()
    want = greedy_by_forward(model, prompt, 8, r)
    assert generate(model, [prompt], max_new_tokens=8, num_steps=r)[0].tokens == want  # KV cache
    assert generate(model, [prompt], max_new_tokens=8, num_steps=r, cache=False)[0].tokens == want
    # adaptive exit that never fires runs every loop through the exit path (kv_cache.py _exit_loops)
    assert generate(model, [prompt], max_new_tokens=8, num_steps=r, exit_criterion="kl",
                    exit_threshold=0.0)[0].tokens == want
    if r == 1:  # the parent's own greedy tokens
        assert want == greedy_by_forward(lambda x, num_steps: (hf(x).logits,), prompt, 8, r)


@pytest.mark.parametrize("wavefront", [1, 8])
def test_diffusion_limit_is_sequential_decoding(llama, wavefront):
    """loops_per_pass = r (one pass per position, its loop 0 its first loop): sequential decoding's tokens."""
    model = in_place(llama[1])
    prompt = ids(1, 9)[0].tolist()
    want = generate(model, [prompt], max_new_tokens=8, num_steps=4)[0].tokens
    got = generate(model, [prompt], max_new_tokens=8, num_steps=4, sampler="diffusion", loops_per_pass=4,
                   wavefront=wavefront)[0].tokens
    assert got == want


def test_diffusion_bypasses_only_a_positions_first_loop(llama):
    """With 2 loops a pass at r = 4 a position runs two passes: loop 0 of its second pass must run the adapter. A
    sampler that bypassed every pass's loop 0 would compute the first pass again in the second (the same token, the
    same state fed nowhere), the tokens of freeze_loops 2, one pass a position."""
    model = in_place(llama[1])
    prompt = ids(1, 9)[0].tolist()
    pick = lambda logits: logits.argmax(-1)
    two_passes, _ = generate_diffusion(model, prompt, max_new_tokens=8, r=4, pick=pick, loops_per_pass=2,
                                       wavefront=1, freeze_loops=4)
    restarted, _ = generate_diffusion(model, prompt, max_new_tokens=8, r=4, pick=pick, loops_per_pass=2,
                                      wavefront=1, freeze_loops=2)  # one pass of loops 0-1 per position
    assert two_passes != restarted


def test_warm_start_is_refused(llama):
    with pytest.raises(ValueError, match="warm_start replaces s_0"):
        generate(in_place(llama[1]), [[1, 2, 3]], max_new_tokens=2, num_steps=2, warm_start=True)


def test_kl_towards_the_parent_starts_at_zero_and_keeps_r1(depth_dir, tmp_path):
    """train.py --kl_parent (plumbing/kl_parent.py) on a parent cut in place: the term is KL(parent || model) per
    token at r = 1 (checked by hand), exactly 0 at the first step (the model is the parent there), logged every
    step; with the core trained it grows, and a large weight keeps r = 1 nearer the parent than no term."""
    from plumbing.kl_parent import ParentKL

    meta = json.loads((depth_dir / "meta.json").read_text())
    text = tmp_path / "text"  # plain text in the task's own vocabulary: its fingerprint, no labels
    text.mkdir()
    torch.randint(0, meta["vocab_size"], (4000,), generator=torch.Generator().manual_seed(3)).numpy().astype(
        meta["dtype"]).tofile(text / "train.bin")
    (text / "meta.json").write_text(json.dumps({k: meta[k] for k in ("dtype", "fingerprint", "vocab_size")}))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=meta["vocab_size"], hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                                      tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "parent")
    surgery.retrofit(str(tmp_path / "parent"), layers="0-0,1-2,3-3", first_loop="identity")[0].save_pretrained(
        tmp_path / "cut")
    base = ["--init", str(tmp_path / "cut"), "--freeze=outer", "--data", str(depth_dir), "--batch_size=8",
            "--eval_iters=1", "--eval_r=1", "--mean_recurrence=2", "--backprop_depth=2", "--learning_rate=0.05",
            "--warmup_iters=1", "--decay_frac=0", "--max_iters=8", "--eval_interval=8", "--kl_data", str(text)]
    gaps = {}
    for w in (0.0, 100.0):
        out = tmp_path / f"kl{w:g}"
        run_train([*base, "--kl_parent", str(w), "--out_dir", str(out)])
        log = [d for d in map(json.loads, open(out / "log.jsonl")) if "loss" in d]
        if w:
            assert log[0]["kl"] == 0.0 and log[-1]["kl"] > 0.0 and all("kl" in d for d in log)
        else:
            assert not any("kl" in d for d in log)
        args = type("A", (), {"kl_data": str(text), "kl_len": 64, "kl_rows": 2, "seed": 9})
        kl = ParentKL(str(tmp_path / "cut"), args, meta, torch.device("cpu"))
        model = RecurrentGPT.from_pretrained(str(out)).eval()
        with torch.no_grad():
            got = kl.loss(model, 0).item()
            x = kl.batch(0)
            p, q = (m(x, num_steps=1)[0].log_softmax(-1) for m in (kl.parent, model))
            assert got == pytest.approx((p.exp() * (p - q)).sum(-1).mean().item(), rel=1e-5)
        gaps[w] = got
    assert 0 < gaps[100.0] < gaps[0.0]  # the term holds r = 1 nearer the parent
    p = subprocess.run([sys.executable, "train.py", *base, "--kl_parent", "1", "--kl_data", "", "--out_dir",
                        str(tmp_path / "x")], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert p.returncode != 0 and "give --kl_data" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "train.py", *base, "--kl_parent", "1", "--kl_data", str(depth_dir),
                        "--out_dir", str(tmp_path / "y")], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert p.returncode != 0 and "holds labeled rows" in p.stderr and "Traceback" not in p.stderr
