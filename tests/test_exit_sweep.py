"""Tests for plumbing/exit_sweep.py (eval_math.py --task depth --exit_sweep): the per-position exit on hand-made
loops, its agreement with sample.py's ExitRule loop by loop, the best-threshold rule, Spearman's rho, and an end to
end run (exit_frontier.json's schema, its fixed curve equal to run_depth's numbers, the two PNGs).

    python -m pytest -q tests/test_exit_sweep.py
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import eval_math
from plumbing.exit_sweep import best_thresholds, first_exit, frontier, loop_signals, pick, spearman, thresholds
from exit_gate import ExitGate
from sample import EXIT_THRESHOLDS, ZERO_SHOT, ExitRule

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def hand_loops():
    """4 loops of 3 positions: states s_0..s_4 (h = 2; s_0 = 0) and readouts (V = 3), per position:
    0: nothing moves; the argmax is 2 throughout
    1: the state turns, then grows along its new direction (latent-diff sqrt 2, 0.5, 0; 1 - cos 1, 0, 0);
       the readout is nearly uniform (argmax 1), then sharp on 0 from loop 2 on
    2: the state never moves; the readout peaks on 2 for loops 1-2, then on 1 (a permutation: same entropy)."""
    s = torch.tensor([[[0., 0.], [0., 0.], [0., 0.]],
                      [[1., 0.], [1., 0.], [1., 0.]],
                      [[1., 0.], [0., 1.], [1., 0.]],
                      [[1., 0.], [0., 2.], [1., 0.]],
                      [[1., 0.], [0., 2.], [1., 0.]]])  # (L + 1, N, h)
    lg = torch.tensor([[[0., 0., 2.], [0., 1., 0.], [0., 0., 3.]],
                       [[0., 0., 2.], [5., 0., 0.], [0., 0., 3.]],
                       [[0., 0., 2.], [5., 0., 0.], [0., 3., 0.]],
                       [[0., 0., 2.], [5., 0., 0.], [0., 3., 0.]]])  # (L, N, V)
    return s, lg


# criterion, threshold, min_loops -> each position's exit loop (1-based) and its answer there
HAND = [
    ("latent-diff", 0.6, 1, [2, 3, 2], [2, 0, 2]),  # position 1: 0.5 < 0.6 at loop 3
    ("latent-diff", 0.3, 1, [2, 4, 2], [2, 0, 2]),  # position 1: only 0 < 0.3, at loop 4
    ("latent-diff", 0.0, 1, [4, 4, 4], [2, 0, 1]),  # never below 0: all run to r_max = 4
    ("cosine", 0.5, 1, [2, 3, 2], [2, 0, 2]),  # position 1: 1 - cos = 1 at loop 2, 0 at loop 3
    ("cosine", 2.0, 1, [2, 2, 2], [2, 0, 2]),  # the earliest exit is after 2 loops, never after 1
    ("kl", 1e-3, 1, [2, 3, 2], [2, 0, 2]),  # kl(uniform-ish || sharp) is large at loop 2 for position 1
    ("kl", 1e-3, 3, [3, 3, 4], [2, 0, 1]),  # min_loops 3: position 2's kl is large at loop 3, 0 at loop 4
    ("kl", 0.0, 1, [4, 4, 4], [2, 0, 1]),
    ("entropy-diff", 1e-3, 1, [2, 3, 2], [2, 0, 2]),
    ("entropy-diff", 1e-3, 3, [3, 3, 3], [2, 0, 1]),  # position 2's flip keeps the entropy: fires at loop 3
    ("argmax", 0, 1, [1, 1, 1], [2, 1, 2]),  # a streak of 0 is reached after loop 1
    ("argmax", 1, 1, [2, 3, 2], [2, 0, 2]),  # streaks: position 0: 0 1 2 3, 1: 0 0 1 2, 2: 0 1 0 1
    ("argmax", 2, 1, [3, 4, 4], [2, 0, 1]),
    ("argmax", 3, 1, [4, 4, 4], [2, 0, 1]),  # position 0 reaches 3 at loop 4; the others never do (r_max)
    ("argmax", 4, 1, [4, 4, 4], [2, 0, 1]),  # never: r_max
]


@pytest.mark.parametrize("criterion, threshold, min_loops, loops, answers", HAND)
def test_hand_computed_exits(criterion, threshold, min_loops, loops, answers):
    s, lg = hand_loops()
    ans, values = loop_signals(list(s), iter(lg))
    assert ans.tolist() == [[2, 1, 2], [2, 0, 2], [2, 0, 1], [2, 0, 1]]
    got = first_exit(criterion, values[criterion], threshold, min_loops)
    assert got.tolist() == loops
    assert pick(ans, got).tolist() == answers


def test_hand_computed_values():
    s, lg = hand_loops()
    _, v = loop_signals(list(s), iter(lg))
    assert v["latent-diff"][:, 1].tolist()[1:] == pytest.approx([math.sqrt(2), 0.5, 0.0])
    assert v["cosine"][:, 1].tolist()[1:] == pytest.approx([1.0, 0.0, 0.0], abs=1e-7)
    assert all(math.isnan(v[c][0, n]) for c in ("kl", "entropy-diff", "latent-diff", "cosine") for n in range(3))
    assert v["argmax"].T.tolist() == [[0, 1, 2, 3], [0, 0, 1, 2], [0, 1, 0, 1]]
    logp = torch.log_softmax(lg[:2, 1], -1)
    assert v["kl"][1, 1].item() == pytest.approx(float((logp[0].exp() * (logp[0] - logp[1])).sum()))


@pytest.mark.parametrize("criterion", list(EXIT_THRESHOLDS))
def test_first_exit_is_exit_rules_per_token_exit(criterion):
    """The sweep's exit of each position is the loop where sample.py's ExitRule stops that token, fed the same
    states and readouts loop by loop (a row that converged at loop i + 1 < r leaves; the rest run r)."""
    g = torch.Generator().manual_seed(0)
    L, N, h, V = 8, 64, 6, 5
    s = torch.cumsum(torch.randn(L + 1, N, h, generator=g) * 0.5 ** torch.arange(L + 1.)[:, None, None], 0)
    lg = torch.cumsum(torch.randn(L, N, V, generator=g) * 0.6 ** torch.arange(L + 0.)[:, None, None], 0)
    gate = ExitGate(h)  # a learned gate with random weights: its probabilities spread over (0, 1)
    with torch.no_grad():
        gate.proj.weight.normal_(0, 1.0, generator=g)
    _, values = loop_signals(list(s), iter(lg), gate)
    for threshold in thresholds(criterion, L)[::2]:
        for min_loops in (1, 3):
            rule = ExitRule(criterion, threshold, min_loops, gate)
            rule.reset()
            want = torch.full((N,), L)
            for i in range(L):  # all rows stay in the rule (their later decisions are not read)
                done = rule.converged(i, s[i][:, None], s[i + 1][:, None], lg[i][:, None])
                want = torch.where(done & (want == L) & (i + 1 < L), i + 1, want)
            assert first_exit(criterion, values[criterion], threshold, min_loops).tolist() == want.tolist(), threshold


def test_best_threshold_rule():
    counts = {1: 10, 2: 10, 3: 10}  # trained k <= 2
    fixed = {"r": 8, "accuracy": 0.6, "by_k": {"1": {"accuracy": 1.0}, "2": {"accuracy": 0.8}, "3": {"accuracy": 0.0}}}

    def entry(c, thr, loops, a1, a2):
        return {"criterion": c, "threshold": thr, "mean_loops": loops, "accuracy": 0.0,
                "by_k": {str(k): {"accuracy": a, "mean_loops": loops} for k, a in ((1, a1), (2, a2), (3, 0.0))}}

    adaptive = [entry(c, t, loops, a1, a2) for c in ZERO_SHOT for t, loops, a1, a2 in
                ((0.1, 2.0, 1.0, 0.76), (0.01, 3.0, 1.0, 0.785), (0.001, 5.0, 1.0, 0.8))]
    adaptive[-3:] = [entry("argmax", t, loops, 0.9, a2) for t, loops, a2 in ((1, 2.0, 0.7), (2, 3.0, 0.75))]
    best = best_thresholds({"r_max": 8, "fixed": [fixed], "adaptive": adaptive}, counts, 2)
    # fixed r=8 at k <= 2: 0.9; 0.1 is 2 points below it, 0.01 half a point: the fewest loops within 1 point
    assert best["kl"] == (adaptive[1], True)
    assert best["argmax"] == (adaptive[-1], False)  # none within: the most accurate one


def test_spearman():
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 3, 4, 5], [2, 2, 3, 5, 4]) == pytest.approx(8.5 / math.sqrt(95))  # tied ranks 1.5, 1.5
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 2, 3], [2, 2, 2]))


def test_frontier_fixed_and_never_exit():
    g = torch.Generator().manual_seed(1)
    correct = torch.rand(4, 6, generator=g) < 0.5
    steps = np.array([1, 2, 1, 2, 3, 3])
    _, values = loop_signals(list(torch.randn(5, 6, 3, generator=g)), iter(torch.randn(4, 6, 5, generator=g)))
    res = frontier(correct, steps, values)
    assert [e["r"] for e in res["fixed"]] == [1, 2, 3, 4] and res["r_max"] == 4
    assert res["fixed"][1]["by_k"]["3"]["accuracy"] == pytest.approx(float(correct[1, 4:].float().mean()))
    never = [e for e in res["adaptive"] if (e["criterion"], e["threshold"]) in (("argmax", 4), ("latent-diff", 0.0))]
    assert len(never) == 2
    assert all(e["mean_loops"] == 4 and e["accuracy"] == res["fixed"][-1]["accuracy"] for e in never)


# -----------------------------------------------------------------------------
# end to end


@pytest.fixture(scope="module")
def tiny_depth_model(depth_dir, tmp_path_factory):
    """An untrained recurrent model on the depth task's vocabulary, with a random s_0 (the draws must match)."""
    from model import RecurrentConfig, RecurrentGPT

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("exit_sweep_model")
    RecurrentGPT(RecurrentConfig(vocab_size=14, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, intermediate_size=64,
                                 adapter_init="random")).save_pretrained(out)
    return out


def test_end_to_end_schema_plots_and_fixed_curve(depth_dir, tiny_depth_model, tmp_path):
    common = ["--init", str(tiny_depth_model), "--task", "depth", "--data", str(depth_dir), "--batch_size", "16"]
    res = eval_math.main(common + ["--r", "4", "--exit_sweep", "--out_dir", str(tmp_path / "sweep")])
    on_disk = json.load(open(tmp_path / "sweep" / "exit_frontier.json"))
    assert on_disk == res and sorted(res) == ["adaptive", "fixed", "r_max"] and res["r_max"] == 4
    ks = [str(k) for k in range(1, 7)]  # depth_dir: val rows of k = 6, so labels of depth 1..6
    for e in res["fixed"]:
        assert sorted(e) == ["accuracy", "by_k", "r"] and list(e["by_k"]) == ks
        assert all(sorted(v) == ["accuracy"] for v in e["by_k"].values())
    assert [e["r"] for e in res["fixed"]] == [1, 2, 3, 4]
    assert [e["criterion"] for e in res["adaptive"]] == [c for c in ZERO_SHOT for _ in thresholds(c, 4)]  # no gate
    for e in res["adaptive"]:
        assert sorted(e) == ["accuracy", "by_k", "criterion", "mean_loops", "threshold"] and list(e["by_k"]) == ks
        assert all(sorted(v) == ["accuracy", "mean_loops"] for v in e["by_k"].values())
        assert 1 <= e["mean_loops"] <= 4 and 0 <= e["accuracy"] <= 1
    for name in ("exit_frontier.png", "loops_by_depth.png"):
        assert (tmp_path / "sweep" / name).stat().st_size > 10_000
    # the fixed curve is run_depth's numbers at the same r (the same seeded s_0 draws, the same readouts)
    summary = eval_math.main(common + ["--r", "1,2,4", "--out_dir", str(tmp_path / "fixed")])
    for row in summary["results"]:
        e = res["fixed"][row["r"] - 1]
        assert {k: v["accuracy"] for k, v in e["by_k"].items()} == pytest.approx(
            {k: v["accuracy"] for k, v in row["by_k"].items()}, rel=1e-12)
    # exit_positions.npz, position by position: the same answers as run_depth's rows, and the exits at Huginn's
    # defaults that give the frontier's entries at those thresholds
    pos = np.load(tmp_path / "sweep" / "exit_positions.npz", allow_pickle=False)
    recs = [json.loads(line) for line in open(tmp_path / "fixed" / "results.jsonl")]
    for r in (1, 2, 4):
        by_row = {x["index"]: x for x in recs if x["r"] == r}
        for i in np.unique(pos["row"]):
            at = pos["row"] == i
            assert pos["correct"][r - 1][at].tolist() == by_row[int(i)]["correct"]
            assert pos["k"][at].tolist() == by_row[int(i)]["steps"]
    assert sorted(k for k in pos if k.startswith("loops_")) == sorted(f"loops_{c}" for c in ZERO_SHOT if c != "argmax")
    for c in (c for c in ZERO_SHOT if c != "argmax"):  # argmax's default, a streak of 5, is past r_max = 4
        e = next(e for e in res["adaptive"] if e["criterion"] == c and e["threshold"] == EXIT_THRESHOLDS[c])
        loops = pos[f"loops_{c}"]
        assert loops.mean() == pytest.approx(e["mean_loops"], rel=1e-12)
        assert pos["correct"][loops - 1, np.arange(len(loops))].mean() == pytest.approx(e["accuracy"], rel=1e-12)


def test_exit_min_loops_holds_every_position(depth_dir, tiny_depth_model, tmp_path):
    res = eval_math.main(["--init", str(tiny_depth_model), "--task", "depth", "--data", str(depth_dir), "--r", "5",
                          "--exit_sweep", "--exit_min_loops", "3", "--limit", "8", "--out_dir", str(tmp_path)])
    assert min(e["mean_loops"] for e in res["adaptive"]) >= 3
    assert all(v["mean_loops"] >= 3 for e in res["adaptive"] for v in e["by_k"].values())


@pytest.mark.parametrize("task", ["gsm8k", "math", "loss"])
def test_exit_sweep_off_the_depth_task_is_one_line(task, capsys):
    with pytest.raises(SystemExit) as e:
        eval_math.parse_args(["--init", "x", "--task", task, "--exit_sweep"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "--exit_sweep" in err and "--task depth" in err


def test_exit_sweep_on_chain_of_thought_data_is_one_line(tiny_depth_model, tmp_path):
    prepare = Path(__file__).resolve().parents[1] / "data/depth/prepare.py"
    subprocess.run([sys.executable, str(prepare), "--cot", "--out_dir", str(tmp_path / "cot"), "--train_k", "2",
                    "--test_k", "3", "--num_train", "16", "--num_val", "4"], check=True, capture_output=True)
    with pytest.raises(eval_math.EvalError, match="chains of thought") as e:
        eval_math.main(["--init", str(tiny_depth_model), "--task", "depth", "--data", str(tmp_path / "cot"),
                        "--exit_sweep", "--out_dir", str(tmp_path / "out")])
    assert "\n" not in str(e.value)
