"""Tests for eval_math.py and math_grader.py: answer extraction and grading on the real GSM8K and
MATH-500 gold data, tricky normalizations in both directions, and small end-to-end runs.

    python -m pytest -q tests/test_eval_math.py
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plumbing import math_grader
from eval_math import extract_boxed, extract_gsm8k, extract_gsm8k_strict, extract_math, grade_math, gsm8k_gold, math_gold

SHARED = Path(__file__).resolve().parents[2] / "shared"
GSM8K = SHARED / "data" / "gsm8k"
MATH500 = SHARED / "data" / "math500" / "test.jsonl"


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# -----------------------------------------------------------------------------
# GSM8K extraction


@pytest.mark.parametrize("split", ["test", "train"])
def test_gsm8k_gold_answers_extract_exactly(split):
    rows = read_jsonl(GSM8K / f"{split}.jsonl")
    assert len(rows) == {"test": 1319, "train": 7473}[split]
    for row in rows:
        after = row["answer"].split("####")[-1].strip().replace(",", "")
        assert extract_gsm8k(row["answer"]) == after, row["answer"]
        assert extract_gsm8k_strict(row["answer"]) == after, row["answer"]
        assert gsm8k_gold(row["answer"]) == after


@pytest.mark.parametrize("text, flexible, strict", [
    ("She makes 9 * 2 = $18 every day.\n#### 18", "18", "18"),
    ("The answer is $1,234.", "1234", None),  # "$", "," and the final "." are removed (lm-eval's filters)
    ("It drops to -5 degrees.", "-5", None),
    ("So 3.5 hours.", "3.5", None),
    ("#### 7\nQ: and 12 more", "12", "7"),  # flexible takes the last number, strict the first "#### N"
    ("no digits here", None, None),
    ("a 7", "7", None),  # a single digit only through the second alternative
])
def test_gsm8k_extraction_cases(text, flexible, strict):
    assert extract_gsm8k(text) == flexible
    assert extract_gsm8k_strict(text) == strict


# -----------------------------------------------------------------------------
# MATH extraction and grading


def test_math500_gold_solutions_grade_correct():
    rows = read_jsonl(MATH500)
    assert len(rows) == 500
    failures = [(r["unique_id"], extract_boxed(r["solution"]), r["answer"]) for r in rows
                if not grade_math(extract_boxed(r["solution"]), r["answer"])]
    assert len(failures) <= 5, failures  # >= 99%


def test_math500_different_answers_do_not_match():
    # false positives: pair every answer with another problem's (different) answer
    answers = [r["answer"] for r in read_jsonl(MATH500)]
    pairs = [(answers[i], answers[(37 * i + 11) % 500]) for i in range(500)]
    pairs = [(a, b) for a, b in pairs if a != b]
    assert len(pairs) > 400
    wrong = [(a, b) for a, b in pairs if grade_math(a, b)]
    assert wrong == []


def test_math500_answers_survive_reformatting():
    # the same answers written the way a model might: no spaces, \dfrac, "x = ...", inside \text{} or $...$
    for a in (r["answer"] for r in read_jsonl(MATH500)):
        variants = [a.replace(" ", ""), a.replace("\\frac", "\\dfrac"), "$" + a + "$"]
        if "=" not in a and "\\in" not in a:
            variants += ["x = " + a, "\\text{" + a + "}"]
        for variant in variants:
            assert grade_math(variant, a), (variant, a)


EQUAL = [
    ("0.5", r"\frac{1}{2}"), (r"\frac12", r"\frac{1}{2}"), (r"\dfrac{3}{4}", "3/4"), (r"\tfrac34", "0.75"),
    ("x = 3", "3"), (r"90^\circ", "90"), (r"90^{\circ}", r"90 \text{ degrees}"), ("10,080", r"10,\!080"),
    (r"\$32,\!348", "32348"), (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\pi/2)"), ("6-5i", "6 - 5 i"),
    (r"1 \pm \sqrt{19}", r"1-\sqrt{19}, 1+\sqrt{19}"), (r"\text{(C)}", "C"), ("(C)", r"\text{(C)}"),
    (r"\text{Evelyn}", "Evelyn"), ("3, 5, 7", "7,5,3"), (r"\sqrt{12}", r"2\sqrt3"), (r"x^2+2x+1", "(x+1)^2"),
    (r"1\frac{4}{5}", r"\frac95"), ("1.8", r"1\frac45"), (r"5.4 \text{ cents}", "5.4"),
    (r"\frac{270}7\text{ degrees}", r"\frac{270}{7}"), (r"864 \mbox{ inches}^2", "864"), (r"25\%", "25"),
    (r"\begin{pmatrix} -1/3 \\ 2/3 \\ 5/3 \end{pmatrix}",
     r"\begin{pmatrix} -\frac13 \\ \frac{2}{3} \\ \frac53 \end{pmatrix}"),
    (r"(0,9) \cup (9,36)", r"(0,9)\cup(9,36)"), (r"x \in [-2,7]", "[-2,7]"), (r"\cot x", r"\frac{\cos x}{\sin x}"),
    ("5x - 7y + 11z + 4 = 0", "-5x+7y-11z-4=0"), (r"\{1\pm\sqrt{5},-2\}", r"-2, 1+\sqrt5, 1-\sqrt5"),
    ("3.", "3"), (".5", "0.5"), (r"\frac{\sqrt{3}}{3}", r"\frac{1}{\sqrt{3}}"), (r"(-\infty, 0]", r"(-\infty,0]"),
    ("2.50", "2.5"), ("y = 2x + 3", "2x+3"), (r"\text{East}", "east"), ("2^{10}", "1024"), ("5!", "120"),
    (r"2 \text{ and } 3", "3, 2"), ("2, and 3", "2,3"), (r"\textbf{(C)}", r"\text{(C)}"), ("1{,}000", "1000"),
    (r"1.5 \times 10^{3}", "1500"), (r"\pm 2", "2,-2"), (r"f(x) = x^2", "x^2"), (r"\$1.50", "1.5"),
    (r"\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}", r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}"),
]
NOT_EQUAL = [
    ("1/2", "2"), ("10", "100"), (r"\frac{1}{2}", "0.51"), ("3.14", r"\pi"), ("(1,2)", "[1,2]"), ("(1,2)", "(2,1)"),
    ("1,2", "1,2,3"), ("52_8", "52"), ("x+1", "x-1"), (r"\sqrt{2}", "1.414"), ("2", "-2"), ("0", ""),
    (r"\text{east}", r"\text{west}"), (r"(-\infty,0]", r"(-\infty,0)"), ("5x-7y+11z+4=0", "5x-7y+11z-4=0"),
    ("C", "D"), ("6+9i", "6-9i"), ("1000", "1,000,000"), ("1,000", "1"), (r"\frac{3}{56}", r"\frac{56}{3}"),
    (r"2\sqrt{3}", r"3\sqrt{2}"), ("x^2", "2x"), (r"9^{9^{9}}", "3"), ("10000!", "3"), ("25\\%", "0.25"),
    (r"\frac{\pi}{6}", r"30^\circ"), ("2 and 3", "2,4"), (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix} 2 \\ 1 \end{pmatrix}"),
]


@pytest.mark.parametrize("a, b", EQUAL)
def test_equal_both_directions(a, b):
    assert grade_math(a, b) and grade_math(b, a)


@pytest.mark.parametrize("a, b", NOT_EQUAL)
def test_not_equal_both_directions(a, b):
    assert not grade_math(a, b) and not grade_math(b, a)


def test_grade_none():
    assert not grade_math(None, "3") and not grade_math("3", None)


@pytest.mark.parametrize("text, want", [
    (r"so $x = \boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
    (r"\boxed{a} then \boxed{b}", "b"),  # the last box
    (r"$\boxed 5$", "5"),
    (r"\fbox{7}", "7"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt{2}}{2}"),  # nested braces
    ("no box", None),
    (r"\boxed{\frac{1}{2", None),  # a truncated generation
])
def test_extract_boxed(text, want):
    assert extract_boxed(text) == want


def test_math_gold_is_the_answer_or_the_last_box():
    # MATH-500 rows carry an answer; rows of the full MATH set (hendrycks_math) only a solution
    assert math_gold({"solution": r"so \boxed{2} then \boxed{\frac12}", "answer": "0.5"}) == "0.5"
    assert math_gold({"solution": r"so \boxed{2} then \boxed{\frac12}"}) == r"\frac12"


def test_extract_math_falls_back_to_minerva_sentence():
    assert extract_math("Final Answer: The final answer is $24$. I hope it is correct.") == "24"
    assert extract_math(r"so \boxed{3}. Final Answer: The final answer is $4$. I hope it is correct.") == "3"


def test_symbolic_check_has_a_timeout(monkeypatch):
    # math-verify's compare of this pair runs past 100 s unbounded; with a 1 s limit on each of the two parses and
    # the compare it takes about 2 s on idle cores, and the bound leaves room for cores shared with other jobs
    monkeypatch.setattr(math_grader, "SYMBOLIC_TIMEOUT_S", 1)
    t0 = time.time()
    assert not grade_math(r"\frac{(x+1)^{60}(y+2)^{45}}{(x-y)^{30}}", r"\frac{(x+2)^{60}(y+1)^{45}}{(x+y)^{30}}")
    assert time.time() - t0 < 30


def test_a_tower_of_powers_is_graded_in_time():
    t0 = time.time()
    assert not grade_math(r"9^{9^{9^{9}}}", "3")
    assert time.time() - t0 < 5.0


def test_answers_are_never_run_as_python(tmp_path):
    # answers are model output: parsed by a LaTeX grammar, never run (an eval-based parser would run this one)
    marker = tmp_path / "ran"
    assert not grade_math(f"__import__('os').system('touch {marker}')", "0")
    assert not marker.exists()


def test_math_grading_imports_math_verify_only_when_it_grades():
    code = ("import sys, eval_math; assert 'math_verify' not in sys.modules and 'sympy' not in sys.modules; "
            "from plumbing.math_grader import grade_math; assert grade_math('0.5', '\\\\frac12'); "
            "assert 'math_verify' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


# -----------------------------------------------------------------------------
# end to end on tiny models (model.py, sample.py, tokenizer.py, data/depth)

import numpy as np  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

import eval_math  # noqa: E402
from data.common import open_split  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def greedy_reference(model, ids, r, n):
    """Plain greedy decoding: the whole sequence through model(...) for every token, no cache."""
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            nxt = model(x, num_steps=r)[0][0, -1].argmax()
            x = torch.cat([x, nxt.view(1, 1)], dim=1)
    return x[0, len(ids):].tolist()


def test_stop_strings_end_at_the_completing_token(smol_model_dir):
    from plumbing.tokenizer import load_tokenizer
    tok = load_tokenizer(smol_model_dir)
    ids = tok.encode("Then 3 + 4 = 7.\n#### 7\n\nQ: Next one, 12 apples")
    done = ids[:3]  # kept from an earlier chunk: the stop string is searched in done + new tokens
    stop = eval_math.StopStrings(tok, eval_math.STOP_RE["gsm8k"], [done])
    n = next(n for n in range(1, len(ids) - 2) if stop(0, ids[3:3 + n]))  # asked after every token, as generate() does
    kept = done + ids[3:3 + n]
    assert stop.text[0] == "Then 3 + 4 = 7.\n#### 7\n"
    assert tok.decode(kept).endswith("Q:") and not tok.decode(kept[:-1]).endswith("Q:")
    assert eval_math.extract_gsm8k(stop.text[0]) == "7" and eval_math.extract_gsm8k_strict(stop.text[0]) == "7"
    # "Q:" inside a line is no stop; "Problem:" at a line start stops MATH
    assert not eval_math.StopStrings(tok, eval_math.STOP_RE["gsm8k"], [[]])(0, tok.encode("a Q: b"))
    stop = eval_math.StopStrings(tok, eval_math.STOP_RE["math"], [[]])
    assert stop(0, tok.encode("x\nProblem: y")) and stop.text[0] == "x"


def test_complete_ends_at_eos_and_drops_it(smol_model_dir):
    # the completion ends at EOS (here a token plain greedy decoding produces) inside a later chunk;
    # EOS is dropped from the tokens and the text, and its loops are counted
    from model import RecurrentGPT
    from plumbing.tokenizer import load_tokenizer

    model, tok = RecurrentGPT.from_pretrained(smol_model_dir).eval(), load_tokenizer(smol_model_dir)
    ids = eval_math.encode_prompt(tok, "Q: What is 2 + 3?\nA: Let's think step by step.")
    r = 2
    ref = greedy_reference(model, ids, r, 8)
    assert "Q:" not in tok.decode(ref)  # (else the stop string would cut first)
    j = next(k for k in range(4, 8) if ref[k] not in ref[:k])  # EOS after j kept tokens
    args = eval_math.parse_args(["--init", "x", "--task", "gsm8k", "--max_new_tokens", "8", "--chunk", "3"])
    [(text, n_tokens, loops)] = eval_math.complete(model, tok, [ids], r, args, {ref[j]}, 0)
    assert (text, n_tokens, loops) == (tok.decode(ref[:j]), j, (j + 1) * r)


def test_gsm8k_end_to_end_matches_plain_greedy(smol_model_dir, tmp_path):
    from model import RecurrentGPT
    from plumbing.tokenizer import load_tokenizer

    out = tmp_path / "gsm8k"
    summary = eval_math.main(["--init", str(smol_model_dir), "--task", "gsm8k", "--data", str(GSM8K), "--limit", "2",
                              "--r", "1,2", "--max_new_tokens", "6", "--chunk", "4", "--batch_size", "2",
                              "--out_dir", str(out)])
    recs = [json.loads(line) for line in open(out / "results.jsonl")]
    assert [(x["index"], x["r"]) for x in recs] == [(0, 1), (1, 1), (0, 2), (1, 2)]
    for name in ("summary.json", "accuracy_vs_r.png", "accuracy_vs_flops.png"):
        assert (out / name).stat().st_size > 0
    # the batched, cached, chunked generation equals decoding one prompt at a time without a cache
    model, tok = RecurrentGPT.from_pretrained(smol_model_dir).eval(), load_tokenizer(smol_model_dir)
    test = read_jsonl(GSM8K / "test.jsonl")
    for x in recs:
        assert x["prompt"].endswith("Q: " + test[x["index"]]["question"] + "\nA: Let's think step by step.")
        assert x["prompt"].startswith("Q: ") and x["prompt"].count("\nA: Let's think step by step.") == 2  # 1 shot
        ref = greedy_reference(model, eval_math.encode_prompt(tok, x["prompt"]), x["r"], 6)
        assert 2 not in ref and "Q:" not in tok.decode(ref)  # (else the expected text would be cut)
        assert x["completion"] == tok.decode(ref) and x["tokens"] == 6 and x["loops"] == 6 * x["r"]
        assert x["gold"] == test[x["index"]]["answer"].split("#### ")[-1]
        assert x["correct"] == (eval_math.extract_gsm8k(x["completion"]) == x["gold"])
    for row in summary["results"]:
        flags = [x["correct"] for x in recs if x["r"] == row["r"]]
        assert row["accuracy"] == sum(flags) / 2 and row["se"] == pytest.approx((row["accuracy"] * (1 - row["accuracy"]) / 2) ** 0.5)
        assert row["flops_per_token"] == model.inference_flops_per_token(row["r"])


def test_math_end_to_end_chat(smol_model_dir, tmp_path):
    out = tmp_path / "math"
    summary = eval_math.main(["--init", str(smol_model_dir), "--task", "math", "--data", str(MATH500), "--limit", "2",
                              "--r", "3", "--max_new_tokens", "4", "--chat", "--out_dir", str(out)])
    recs = [json.loads(line) for line in open(out / "results.jsonl")]
    assert len(recs) == 2 and recs[0]["gold"] == read_jsonl(MATH500)[0]["answer"]
    assert recs[0]["prompt"].startswith("<|im_start|>") and recs[0]["prompt"].count("<|im_start|>assistant") == 5
    assert summary["results"][0]["n"] == 2 and (out / "accuracy_vs_flops.png").stat().st_size > 0


def train_briefly(model, data_dir, steps=150):
    ids, targets, _ = (np.asarray(a).reshape(-1, json.load(open(data_dir / "meta.json"))["seq_len"])
                       for a in eval_math.load_bin(eval_math.parse_args(["--init", "x", "--task", "depth", "--data",
                                                                         str(data_dir), "--split", "train"]), model)[1:])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        rows = torch.randint(0, len(ids), (32,), generator=g).numpy()
        loss = model(torch.from_numpy(ids[rows].astype(np.int64)), torch.from_numpy(targets[rows].astype(np.int64)),
                     num_steps=2)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def depth_setup(tmp_path_factory):
    from model import RecurrentConfig, RecurrentGPT

    out = tmp_path_factory.mktemp("depth")
    r = subprocess.run([sys.executable, "data/depth/prepare.py", "--out_dir", str(out), "--train_k", "4", "--test_k",
                        "6", "--num_train", "600", "--num_val", "60", "--seed", "3"], cwd=REPO, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    torch.manual_seed(0)
    model = RecurrentGPT(RecurrentConfig(vocab_size=14, n_embd=32, n_head=2, n_kv_head=2, head_dim=16,
                                         intermediate_size=64, state_init="zero", adapter_init="random"))
    ckpt = out / "ckpt"
    train_briefly(model, out).save_pretrained(ckpt)
    return out, ckpt


def test_depth_end_to_end(depth_setup, tmp_path):
    from model import RecurrentGPT

    data, ckpt = depth_setup
    summary = eval_math.main(["--init", str(ckpt), "--task", "depth", "--data", str(data), "--r", "1,2,4",
                              "--batch_size", "16", "--out_dir", str(tmp_path)])
    assert (tmp_path / "depth_accuracy.png").stat().st_size > 0 and summary["train_max_k"] == 4
    model = RecurrentGPT.from_pretrained(ckpt).eval()
    meta = json.load(open(data / "meta.json"))
    T = meta["seq_len"]
    ids = np.fromfile(data / "dev.bin", dtype=np.uint16).reshape(-1, T).astype(np.int64)  # the default split
    tgt = np.fromfile(data / "dev_targets.bin", dtype=np.int32).reshape(-1, T)
    step = np.fromfile(data / "dev_step.bin", dtype=np.uint8).reshape(-1, T)
    assert summary["split"] == "dev"
    for row in summary["results"]:
        with torch.no_grad():
            pred = model(torch.from_numpy(ids), num_steps=row["r"])[0].argmax(-1).numpy()
        assert sorted(row["by_k"], key=int) == ["1", "2", "3", "4", "5", "6"]
        for k in range(1, 7):
            want = float((pred[step == k] == tgt[step == k]).mean())
            assert row["by_k"][str(k)]["accuracy"] == pytest.approx(want) and row["by_k"][str(k)]["n"] == 60
            assert row["by_k"][str(k)]["seen_in_train"] == meta["seen_in_train"]["dev"][str(k)]
        assert row["accuracy_trained_depth"] == pytest.approx(float((pred == tgt)[(step >= 1) & (step <= 4)].mean()))
    # the brief training taught the first step (p_1 = g_1) far above chance (1/6)
    assert summary["results"][0]["by_k"]["1"]["accuracy"] > 0.5


def test_loss_matches_model_loss(depth_setup, tmp_path):
    from model import RecurrentGPT

    data, ckpt = depth_setup
    text = tmp_path / "text"  # a plain-text style set (no targets file): the target of t is token t+1
    text.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 14, 5000).astype(np.uint16).tofile(text / "val.bin")
    json.dump({"dtype": "uint16", "vocab_size": 14}, open(text / "meta.json", "w"))
    model = RecurrentGPT.from_pretrained(ckpt).eval()
    for d, T in ((data, json.load(open(data / "meta.json"))["seq_len"]), (text, 32)):
        summary = eval_math.main(["--init", str(ckpt), "--task", "loss", "--data", str(d), "--r", "1,4",
                                  "--num_batches", "1", "--batch_size", "4", "--seq_len", "32", "--out_dir",
                                  str(tmp_path / "out")])
        ids, targets, _ = open_split(d, "dev")  # the depth task's dev.bin, the text set's val.bin
        ids = np.asarray(ids).astype(np.int64)
        row_data = d == data
        starts = np.random.default_rng(1337).integers(0, len(ids) // T if row_data else len(ids) - T - 1, size=(1, 4))[0]
        starts = starts * T if row_data else starts
        x = np.stack([ids[s:s + T] for s in starts])
        if row_data:
            y = np.asarray(targets).astype(np.int64)
            y = np.stack([y[s:s + T] for s in starts])
        else:
            y = np.stack([ids[s + 1:s + T + 1] for s in starts])
        for row in summary["results"]:
            with torch.no_grad():
                want = model(torch.from_numpy(x), torch.from_numpy(y), num_steps=row["r"])[1].item()
            assert row["loss"] == pytest.approx(want, rel=1e-5)


def test_cli_errors_are_one_line(smol_model_dir, tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    runs = [(["--init", str(tmp_path / "missing"), "--task", "depth", "--data", str(tmp_path)], "no such file or directory"),
            (["--init", str(smol_model_dir), "--task", "gsm8k", "--limit", "1"], "offline")]
    for argv, needle in runs:
        r = subprocess.run([sys.executable, "eval_math.py", *argv], cwd=REPO, capture_output=True, text=True,
                           env={**env, "PYTHONPATH": str(REPO)})
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("eval_math.py: error:") and needle in last, r.stderr
    with pytest.raises(SystemExit):
        eval_math.parse_args(["--init", "x", "--task", "gsm8k", "--r", "1,0"])
    with pytest.raises(SystemExit):
        eval_math.parse_args(["--init", "x", "--task", "gsm8k", "--bogus", "1"])


def test_loss_refuses_data_of_another_tokenizer(smol_model_dir, tmp_path):
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "val.bin")
    json.dump({"dtype": "uint16", "vocab_size": 14, "fingerprint": "not-smollm2", "tokenizer": "depth"},
              open(tmp_path / "meta.json", "w"))
    with pytest.raises(eval_math.EvalError, match="tokenized with"):
        eval_math.main(["--init", str(smol_model_dir), "--task", "loss", "--data", str(tmp_path), "--r", "1",
                        "--out_dir", str(tmp_path / "out")])


# -----------------------------------------------------------------------------
# one-line errors, before the long work


def test_out_dir_and_bad_rows_fail_before_the_model_loads(tmp_path):
    # --init is missing on purpose: these errors come first, not after a whole evaluation
    missing = str(tmp_path / "no_model")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(eval_math.EvalError, match="a_file is an existing file, not a directory: pass another --out_dir"):
        eval_math.main(["--init", missing, "--task", "depth", "--out_dir", str(tmp_path / "a_file")])
    good = json.dumps({"question": "1 + 1?", "answer": "#### 2"})
    for lines, needle in (([good, '{"question": "2 + 2?", "answer": '], r"test.jsonl:2: not valid JSON"),
                          ([good, "", json.dumps({"question": "3 + 3?"})], r"test.jsonl:3: the row has no 'answer'")):
        (tmp_path / "test.jsonl").write_text("\n".join(lines) + "\n")
        with pytest.raises(eval_math.EvalError, match=needle) as e:
            eval_math.main(["--init", missing, "--task", "gsm8k", "--shots", "0", "--data", str(tmp_path / "test.jsonl"),
                            "--out_dir", str(tmp_path / "out")])
        assert str(tmp_path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("flag,value", [("--limit", "-1"), ("--max_new_tokens", "0"), ("--batch_size", "0"),
                                        ("--r", "1,x")])
def test_bad_flags_name_the_flag_in_one_line(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        eval_math.parse_args(["--init", "x", "--task", "gsm8k", flag, value])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and f"error: {flag} " in err


def test_full_disk_is_one_line(depth_setup, tmp_path, full_disk):
    data, ckpt = depth_setup
    out = tmp_path / "out"
    full_disk(out)
    with pytest.raises(eval_math.EvalError) as e:
        eval_math.main(["--init", str(ckpt), "--task", "depth", "--data", str(data), "--r", "1", "--limit", "4",
                        "--out_dir", str(out)])
    assert str(e.value) == f"{out}: No space left on device: free space on that disk or write elsewhere (--out_dir)"


def test_prompts_past_the_context_are_warned_about(smol_model_dir, tmp_path, capsys):
    from model import RecurrentGPT
    from plumbing.tokenizer import save_tokenizer_files

    short = tmp_path / "short_context"
    model = RecurrentGPT.from_pretrained(smol_model_dir)
    model.config.block_size = 24  # a 1-shot GSM8K prompt is ~150 tokens
    model.save_pretrained(short)
    save_tokenizer_files(smol_model_dir, short)
    eval_math.main(["--init", str(short), "--task", "gsm8k", "--data", str(GSM8K), "--limit", "2", "--r", "1",
                    "--max_new_tokens", "2", "--out_dir", str(tmp_path / "out")])
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "2 of 2 prompts" in warning[0] and "context of 24 tokens" in warning[0]


@pytest.mark.parametrize("name,keep,needle", [("dev.bin", -1, "dev.bin has 839 bytes, not a whole number of uint16"),
                                              ("dev_targets.bin", -4, "targets has 419 entries but ids have 420"),
                                              ("dev.bin", 0, "dev.bin is empty")])
def test_truncated_row_data_is_one_line(depth_setup, tmp_path, name, keep, needle):
    data, ckpt = depth_setup
    broken = tmp_path / "data"
    broken.mkdir()
    for f in ("meta.json", "dev.bin", "dev_targets.bin", "dev_step.bin"):
        raw = (data / f).read_bytes()
        (broken / f).write_bytes(raw[:keep] if f == name else raw)
    with pytest.raises(eval_math.EvalError, match=needle) as e:
        eval_math.main(["--init", str(ckpt), "--task", "depth", "--data", str(broken), "--r", "1",
                        "--out_dir", str(tmp_path / "out")])
    assert "rerun prepare.py" in str(e.value) and "\n" not in str(e.value)
