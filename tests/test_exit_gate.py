"""The learned exit gate (exit_gate.py): its target and its probability on hand-made states, train.py --exit_gate on
a frozen checkpoint (only exit_gate.* changes; the model's weights byte-identical), its save and load, the exit
sweep's gate criterion, `--exit gate` in sample.py's cached generation, and the one-line errors.

    python -m pytest -q tests/test_exit_gate.py
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import sample
import train
from exit_gate import ExitGate, add_exit_gate, stable_answers
from model import RecurrentConfig, RecurrentGPT
from plumbing.exit_sweep import first_exit, loop_signals
from sample import generate

REPO = Path(__file__).resolve().parents[1]
TINY = ["--init=scratch", "--shape", "1,1,1", "--n_embd=32", "--n_head=2", "--batch_size=8", "--eval_iters=1",
        "--eval_r=1,2", "--mean_recurrence=3", "--backprop_depth=2", "--learning_rate=0.02", "--adam_lr=3e-3",
        "--warmup_iters=3", "--decay_frac=0", "--device=cpu", "--autocast=off"]

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_stable_answers_by_hand():
    # 4 loops of 3 positions: 0 settles at loop 2, 1 changes at the last loop, 2 never moves
    answers = torch.tensor([[5, 1, 2], [3, 1, 2], [3, 1, 2], [3, 4, 2]])
    assert stable_answers(answers).T.tolist() == [[False, True, True, True], [False, False, False, True],
                                                  [True, True, True, True]]


def test_gate_probability_by_hand():
    """p = sigmoid(w . [rmsnorm(s), rmsnorm(s - s_prev), log(|s - s_prev| / |s|)] + b), checked with a weight on
    the log step size alone: a loop that moves the state less gets the higher probability of stopping."""
    gate = ExitGate(2)
    with torch.no_grad():
        gate.proj.weight.zero_()
        gate.proj.weight[0, -1] = -1.0  # the log step size
        gate.proj.bias.fill_(-1.0)
    s_prev = torch.tensor([[1., 0.], [1., 0.]])
    s = torch.tensor([[0., 1.], [1., 0.1]])  # steps of size sqrt(2) (against |s| 1) and 0.1 (against |s| ~1.005)
    want = [1 / (1 + math.exp(1 + math.log(math.sqrt(2)))), 1 / (1 + math.exp(1 + math.log(0.1 / math.hypot(1, 0.1))))]
    assert gate.probability(s_prev, s).tolist() == pytest.approx(want, rel=1e-6)
    assert ExitGate(2).probability(s_prev, s).tolist() == [0.5, 0.5]  # a new gate: zero weights


def test_sweep_exits_where_the_gate_fires():
    """The exit sweep's gate criterion: each position leaves after the first loop whose probability reaches the
    threshold (never before --exit_min_loops; loop L when none does), loop 1 included."""
    gate = ExitGate(2)
    with torch.no_grad():
        gate.proj.weight.zero_()
        gate.proj.weight[0, -1] = -1.0
    # position 0 moves by 1 then 1e-3 then 1e-3: p after loops 1..3 ~ 0.29, ~1.0, ~1.0; position 1 moves by 1 always
    states = [torch.tensor([[0., 0.], [0., 0.]]), torch.tensor([[1., 0.], [1., 0.]]),
              torch.tensor([[1., 1e-3], [1., 1.]]), torch.tensor([[1., 2e-3], [1., 2.]])]
    lg = torch.zeros(3, 2, 4)
    _, values = loop_signals(states, iter(lg), gate)
    assert values["gate"][0].tolist() == pytest.approx([0.5, 0.5])  # s_0 = 0: the first step is the whole state
    assert first_exit("gate", values["gate"], 0.9).tolist() == [2, 3]
    assert first_exit("gate", values["gate"], 0.5).tolist() == [1, 1]
    assert first_exit("gate", values["gate"], 0.5, min_loops=3).tolist() == [3, 3]


def tiny_gated(seed=0):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=97, n_embd=32, n_head=4, n_kv_head=2, head_dim=8, intermediate_size=64,
               adapter_init="random", state_init="zero", n_prelude=1, n_core=2, n_coda=1)
    model = add_exit_gate(RecurrentGPT(RecurrentConfig(**cfg)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and not name.startswith(("adapter", "exit_gate")):
                p.normal_(0, 0.2)
        model.exit_gate.proj.weight.normal_(0, 1.0)
    return model.eval()


def test_gate_exits_in_cached_generation():
    """sample.generate with exit_criterion="gate": per token through the KV cache, as the other criteria. A
    threshold of 0 stops every decoded token after loop 1, one above 1 never (the tokens of fixed r); between,
    the loops vary per token and a row's exit does not depend on the other rows."""
    model, r = tiny_gated(), 6
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6]]
    fixed = generate(model, prompts, max_new_tokens=6, num_steps=r)
    never = generate(model, prompts, max_new_tokens=6, num_steps=r, exit_criterion="gate", exit_threshold=1.01)
    assert [c.tokens for c in never] == [c.tokens for c in fixed] and all(n == r for c in never for n in c.loops)
    first = generate(model, prompts, max_new_tokens=6, num_steps=r, exit_criterion="gate", exit_threshold=0.0)
    assert all(c.loops == [r] + [1] * 5 for c in first)  # the first token comes from the fixed-r prefill
    mid = generate(model, prompts, max_new_tokens=6, num_steps=r, exit_criterion="gate", exit_threshold=0.7)
    alone = [generate(model, [q], max_new_tokens=6, num_steps=r, exit_criterion="gate", exit_threshold=0.7)[0]
             for q in prompts]
    assert [(c.tokens, c.loops) for c in mid] == [(c.tokens, c.loops) for c in alone]


def test_no_gate_is_one_line(tmp_path, capsys):
    """--exit gate on a checkpoint without a gate: one line that says so and what to do, for generate and sample.py."""
    from plumbing.hub import packaged_smollm2_gguf
    from plumbing.tokenizer import save_tokenizer_files

    model = RecurrentGPT(RecurrentConfig(vocab_size=49152, n_embd=32, n_head=4, n_kv_head=2, head_dim=8,
                                         intermediate_size=64))
    with pytest.raises(ValueError, match="--exit gate needs a checkpoint with a learned exit gate"):
        generate(model, [[1, 2]], max_new_tokens=2, num_steps=2, exit_criterion="gate")
    model.save_pretrained(str(tmp_path / "ckpt"))
    save_tokenizer_files(packaged_smollm2_gguf(), str(tmp_path / "ckpt"))
    p = subprocess.run([sys.executable, "sample.py", "--init", str(tmp_path / "ckpt"), "--exit", "gate", "--r", "4",
                        "--prompt", "Hi", "--max_new_tokens", "2", "--threads", "1"], cwd=REPO, capture_output=True,
                       text=True)
    err = p.stderr.strip().splitlines()[-1]  # after sample.py's config line
    assert p.returncode != 0 and "Traceback" not in p.stderr and err.startswith("error: --exit gate needs"), p.stderr
    assert "train.py --exit_gate" in err


def test_exit_gate_training_freezes_the_model(depth_dir, tmp_path, capsys):
    """train.py --exit_gate on a trained checkpoint: only exit_gate.* trains (the model's weights byte-identical
    afterwards), the gate's val loss falls, the save says "exit_gate": true and loads with its gate; --exit_gate
    from scratch is refused in one line."""
    base = tmp_path / "base"
    train.main([*TINY, "--data", str(depth_dir), "--out_dir", str(base), "--max_iters=30", "--eval_interval=30"])
    gated = tmp_path / "gate"
    train.main(["--config", str(REPO / "config" / "cpu_exit_gate.json"), "--init", str(base), "--data",
                str(depth_dir), "--out_dir", str(gated), "--max_iters=20", "--eval_interval=20", "--exit_gate_r=6",
                "--batch_size=16"])
    before, after = load_file(base / "model.safetensors"), load_file(gated / "model.safetensors")
    assert sorted(set(after) - set(before)) == ["exit_gate.proj.bias", "exit_gate.proj.weight"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # the frozen model, byte for byte
    assert after["exit_gate.proj.weight"].abs().sum() > 0  # the gate did train (it starts at zero)
    assert json.load(open(gated / "config.json"))["exit_gate"] is True
    val = [x["val"]["6"]["loss"] for x in map(json.loads, open(gated / "log.jsonl")) if "val" in x]
    assert val[0] == pytest.approx(math.log(2)) and val[-1] < val[0]  # p = 0.5 at step 0, then better
    model = RecurrentGPT.from_pretrained(gated)
    assert model.config.exit_gate and torch.equal(model.exit_gate.proj.weight, after["exit_gate.proj.weight"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train.main([*TINY, "--exit_gate", "--data", str(depth_dir), "--out_dir", str(tmp_path / "scratch")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--exit_gate trains a gate on a trained recurrent model" in err[0]
