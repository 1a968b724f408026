"""
Accuracy against test-time recurrence: GSM8K, MATH, the synthetic depth task, and loss.

The claim of retrofitted recurrence (McLeish et al. 2025, arXiv 2511.07384) is that a looped
model turns more test-time loops r into more accuracy: their GSM8K 1-shot chain-of-thought
accuracy rises from r=1 to r~8-32. This script sweeps r and reports accuracy (with standard error
sqrt(p(1-p)/n)) against r and against inference FLOPs per token (model.inference_flops_per_token), so
recurrent and static models compare at equal compute (the table and the PNGs: plumbing/eval_report.py).
- gsm8k: "Q: ...\\nA: Let's think step by step." with n train exemplars, greedy; lm-eval's strict
  ("#### N") and flexible (last number) extraction, exact match after removing "$", "," and a final ".".
- math:  the Minerva 4-shot prompt (Lewkowycz et al. 2022, arXiv 2206.14858), \\boxed{} answers,
  graded by plumbing/math_grader.py (normalization, then math-verify's equivalence).
- depth: the S3 running product of data/depth: accuracy by (task depth, r), up to beyond the trained depth,
  with the fraction of the split's problems of each depth that training labels (meta.json's seen_in_train;
  the split is dev by default: --split test only for a report, never to choose anything); on
  chain-of-thought data (prepare.py --cot) by greedy generation of the chain (plumbing/depth_cot.py);
  --choices reads each label among a few words only (the data's six answers, or another rendering's: a model
  trained on the symbol rows answering English rows in its own words, experiments/english.py).
- loss:  mean cross-entropy of fixed, seeded batches of a prepared .bin set at each r.
Problems come from a local jsonl (--data) or the hub, and .bin sets from data/<set>/prepare.py, both
through plumbing/eval_data.py.

    python eval_math.py --init out/smollm2 --task gsm8k --data DIR --limit 20 --r 1,4   # CPU; DIR holds test.jsonl, train.jsonl
    python eval_math.py --init out/ckpt --task math --r 1,2,4,8,16,32
    python eval_math.py --init out/depth --task depth --data data/depth --r 1,2,4,8,16,32 --split test
    python eval_math.py --init out/depth --task depth --data data/depth --r 32 --exit_sweep  # plumbing/exit_sweep.py
    python eval_math.py --init out/retrofit/retrofit_depth --task depth --data data/depth_english --choices answers
    python eval_math.py --init out/ckpt --task loss --data data/sotu --r 1,2,4,8
Writes --out_dir (default out/eval/<task>): results.jsonl (one line per problem and r),
summary.json, and PNG plots.
"""

import json
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from exit_gate import EXIT_THRESHOLDS
from per_loop import IGNORE_INDEX
from plumbing.cli import THREADS_HELP, Parser, at_least, default_threads, git_commit, int_list, os_error, ready_out_dir
from plumbing.device import AUTOCAST, autocast_context, compile_blocks
from plumbing.eval_data import EvalError, load_bin, load_problems
from plumbing.eval_report import plot, print_table, summarize
from plumbing.math_grader import MINERVA_SHOTS, extract_boxed, extract_math, grade_math
from plumbing.tokenizer import prompt_ids, stop_ids

REPO = Path(__file__).resolve().parent


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--init", required=True, help="checkpoint dir, raven checkpoint, or a parent (what surgery.load_model takes)")
    p.add_argument("--task", required=True, choices=("gsm8k", "math", "depth", "loss"),
                   help="gsm8k, math: generate and grade; depth: accuracy by task depth; loss: cross-entropy")
    p.add_argument("--r", default="1,2,4,8,16,32", help="comma-separated test-time recurrences")
    p.add_argument("--data", default=None, help="gsm8k/math: a jsonl or a dir with test.jsonl (+ train.jsonl); "
                   "depth/loss: a prepared data dir. Default: the hub (gsm8k, math) or data/depth")
    p.add_argument("--math_set", default="math500", choices=("math500", "full"), help="hub MATH set")
    p.add_argument("--limit", type=int, default=0, help="first N problems / rows / batches only (0 = all)")
    p.add_argument("--shots", type=int, default=None, help="exemplars (default: gsm8k 1, math 4)")
    p.add_argument("--chat", action="store_true", help="wrap prompts in the parent's chat template")
    p.add_argument("--max_new_tokens", type=int, default=None, help="default: gsm8k 256, math 512")
    p.add_argument("--chunk", type=int, default=0, help="tokens per generate() call (0: all of --max_new_tokens in one)")
    p.add_argument("--batch_size", type=int, default=8, help="prompts (gsm8k, math) or rows (depth, loss) per forward")
    p.add_argument("--exit_criterion", default=None, choices=list(EXIT_THRESHOLDS),
                   help="adaptive exit (exit_gate.py), e.g. kl")
    p.add_argument("--exit_threshold", type=float, default=None, help="of --exit_criterion (default: Huginn's)")
    p.add_argument("--exit_min_loops", type=int, default=1, help="adaptive exit never before this many loops")
    p.add_argument("--exit_sweep", action="store_true", help="depth: exit criteria vs r (plumbing/exit_sweep.py)")
    p.add_argument("--choices", default="", help="depth: what a label is read among: '' (default) the whole "
                   "vocabulary; 'answers' the data's answer words (meta.json answer_ids: chance 1/6); or comma-separated "
                   "token ids, the i-th standing for the data's i-th answer word (e.g. the symbol task's answer_ids "
                   "read on English rows: a model answering in the words it was trained on)")
    p.add_argument("--num_batches", type=int, default=20, help="loss: batches of --batch_size rows")
    p.add_argument("--seq_len", type=int, default=256, help="loss: tokens per row for plain text data")
    p.add_argument("--split", default="dev", help="depth/loss: the split of the data dir: dev (or val: the split "
                   "choices are made on), test (the depth task's, for a report), train")
    p.add_argument("--seed", type=int, default=1337, help="s_0 draws, exemplar choice and loss batches")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda (bf16 autocast), cuda:1")
    p.add_argument("--autocast", default="auto", choices=AUTOCAST, help="bf16 autocast: auto (on CUDA) | bf16 | off")
    p.add_argument("--compile", action="store_true", help="torch.compile the blocks, CPU or CUDA (plumbing/device.py)")
    p.add_argument("--threads", type=int, default=default_threads(), help=THREADS_HELP)
    p.add_argument("--out_dir", default=None, help="results.jsonl, summary.json, plots (default out/eval/<task>)")
    args = p.parse_args(argv)
    try:
        args.r = int_list(args.r, "--r")
        at_least(args, 0, "limit", "shots", "chunk", "exit_threshold")
        at_least(args, 1, "max_new_tokens", "batch_size", "num_batches", "seq_len", "threads", "exit_min_loops")
    except ValueError as e:
        p.error(str(e))
    if args.exit_criterion and args.task not in ("gsm8k", "math"):
        p.error("--exit_criterion applies to the generation tasks (gsm8k, math)")
    if args.exit_sweep and args.task != "depth":
        p.error(f"--exit_sweep applies to the depth task, not --task {args.task}: pass --task depth")
    if args.choices and (args.task != "depth" or args.exit_sweep):
        p.error("--choices applies to the depth task's accuracy (--task depth, without --exit_sweep)")
    args.shots = {"gsm8k": 1, "math": 4}.get(args.task, 0) if args.shots is None else args.shots
    args.max_new_tokens = args.max_new_tokens or {"gsm8k": 256, "math": 512}.get(args.task, 0)
    args.out_dir = args.out_dir or f"out/eval/{args.task}"
    args.tok_path = args.init  # where the tokenizer is; main() sets it from surgery.load_model
    args.split_name = None  # the data split's own name, once the data is read (eval_data.load_bin)
    return args


# -----------------------------------------------------------------------------
# answers: GSM8K (lm-eval's gsm8k-cot filters); MATH is graded by plumbing/math_grader.py

FLEX_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


def clean_number(s):
    s = s.replace(",", "").replace("$", "").strip()
    return s[:-1] if s.endswith(".") else s


def extract_gsm8k(text):
    """Flexible extraction: the last number in text (cleaned), or None."""
    matches = FLEX_RE.findall(text or "")
    if not matches:
        return None
    a, b = matches[-1]
    return clean_number(a or b)


def extract_gsm8k_strict(text):
    """Strict extraction: the number after the first "#### " (cleaned), or None."""
    m = STRICT_RE.search(text or "")
    return clean_number(m.group(1)) if m else None


def gsm8k_gold(answer):
    return clean_number(answer.split("####")[-1])


def math_gold(row):
    """MATH's reference answer: the row's answer (MATH-500), else its solution's last \\boxed{}."""
    return row["answer"] if "answer" in row else extract_boxed(row["solution"])


# -----------------------------------------------------------------------------
# prompts

STOP_RE = {"gsm8k": re.compile(r"(^|\n)Q:"), "math": re.compile(r"(^|\n)Problem:")}


def exemplars(args, train):
    """(question, worked answer) pairs: a seeded draw from the train split (gsm8k) or Minerva's four."""
    if args.task == "math":
        if args.shots > len(MINERVA_SHOTS):
            raise EvalError(f"--shots {args.shots}: the Minerva prompt has {len(MINERVA_SHOTS)} exemplars")
        return MINERVA_SHOTS[:args.shots]
    if args.shots > len(train):
        raise EvalError(f"--shots {args.shots} but the train split has {len(train)} rows")
    # calculator annotations <<48/2=24>> are a tool format of the data set, not part of the reasoning
    return [(r["question"], re.sub(r"<<[^>]*>>", "", r["answer"]))
            for r in random.Random(args.seed).sample(train, args.shots)]


def build_prompt(args, tok, question, shots):
    """The prompt text: plain few-shot ("Q:/A:" or "Problem:/Solution:"), or the parent's chat template."""
    if args.task == "gsm8k":
        q, a = "Q: {}\nA: Let's think step by step.", " {}"
    else:
        q, a = "Problem:\n{}\n\nSolution:", "\n{}"
    if not args.chat:
        return "".join(q.format(x) + a.format(y) + "\n\n" for x, y in shots) + q.format(question)
    messages = []  # chat: the bare question as the user turn, worked exemplars as assistant turns
    ask = "{}" if args.task == "gsm8k" else "{}\nPut the final answer in \\boxed{{}}."
    for x, y in shots + [(question, None)]:
        messages.append({"role": "user", "content": ask.format(x)})
        if y is not None:
            messages.append({"role": "assistant", "content": y})
    return tok.apply_chat_template(messages, add_generation_prompt=True)


def encode_prompt(tok, text):
    return prompt_ids(tok, text)  # the separator the parent saw before every document, then the text


# -----------------------------------------------------------------------------
# generation with stop strings


class StopStrings:
    """generate()'s stop= callback for one batch, and the one place stop strings are searched: True once
    row b's text (done[b], the tokens of earlier chunks, + its new tokens) contains a stop string.
    generate() asks after every new token, so the row ends at the token that completes the stop string
    (kept); text[b] is the completion cut before it."""

    def __init__(self, tok, stop_re, done):
        self.tok, self.stop_re, self.done, self.text = tok, stop_re, done, {}

    def __call__(self, b, new):
        text = self.tok.decode(self.done[b] + new)
        m = self.stop_re.search(text)
        if m:
            self.text[b] = text[:m.start()]
        return m is not None


def complete(model, tok, prompts, r, args, eos_ids, seed):
    """Greedy completions of a batch until a stop string, EOS or --max_new_tokens. generate() ends a row
    at EOS or at a stop string (StopStrings); with --chunk the tokens come in chunks, each re-reading
    prompt + tokens so far.

    Returns [(text, n_tokens, loops)]: text cut before the stop string, EOS dropped (its loops counted)."""
    from sample import generate

    gen, loops, text = [[] for _ in prompts], [0] * len(prompts), [None] * len(prompts)
    chunk = args.chunk or args.max_new_tokens
    for c in range(0, args.max_new_tokens, chunk):
        active = [i for i in range(len(prompts)) if text[i] is None]
        if not active:
            break
        stop = StopStrings(tok, STOP_RE[args.task], [gen[i] for i in active])
        outs = generate(model, [prompts[i] + gen[i] for i in active], max_new_tokens=min(chunk,
                        args.max_new_tokens - c), num_steps=r, temperature=0.0, eos_id=eos_ids or None,
                        seed=seed + c, exit_criterion=args.exit_criterion, exit_threshold=args.exit_threshold,
                        exit_min_loops=args.exit_min_loops, stop=stop)
        for b, (i, out) in enumerate(zip(active, outs)):
            eos = out.tokens[-1] in eos_ids
            gen[i] += out.tokens[:-1] if eos else out.tokens
            loops[i] += sum(out.loops)
            if b in stop.text:
                text[i] = stop.text[b]
            elif eos or len(gen[i]) >= args.max_new_tokens:
                text[i] = tok.decode(gen[i])
    return [(text[i] if text[i] is not None else tok.decode(gen[i]), len(gen[i]), loops[i])
            for i in range(len(prompts))]


def run_generation(args, model, tok, problems):
    rows, train = problems
    rows = rows[:args.limit] if args.limit else rows
    shots = exemplars(args, train)
    eos_ids = stop_ids(tok, args.chat)
    prompts = [build_prompt(args, tok, row["question" if args.task == "gsm8k" else "problem"], shots) for row in rows]
    ids = [encode_prompt(tok, p) for p in prompts]
    from sample import context_warning

    warning = context_warning(model.config, ids, args.max_new_tokens)
    if warning:
        print(warning, file=sys.stderr)
    from tqdm import tqdm

    records = []
    for r in args.r:
        t0 = time.time()
        for b in tqdm(range(0, len(rows), args.batch_size), desc=f"{args.task} r={r}", unit="batch"):
            outs = complete(model, tok, ids[b:b + args.batch_size], r, args, eos_ids, args.seed + b)
            for k, (completion, ntok, nloops) in enumerate(outs):
                row = rows[b + k]
                rec = {"index": b + k, "r": r, "prompt": prompts[b + k], "completion": completion}
                if args.task == "gsm8k":
                    gold = gsm8k_gold(row["answer"])
                    rec.update(extracted=extract_gsm8k(completion), strict=extract_gsm8k_strict(completion), gold=gold)
                    rec.update(correct=rec["extracted"] == gold, strict_correct=rec["strict"] == gold)
                else:
                    rec.update(extracted=extract_math(completion), gold=math_gold(row), level=row.get("level"),
                               subject=row.get("subject", row.get("type")))
                    rec["correct"] = grade_math(rec["extracted"], rec["gold"])
                rec.update(tokens=ntok, loops=nloops, loops_per_token=nloops / max(ntok, 1))
                records.append(rec)
        for rec in records[-len(rows):]:
            rec["seconds_per_problem"] = (time.time() - t0) / max(len(rows), 1)
    return records


# -----------------------------------------------------------------------------
# depth task and loss


def answer_choices(choices, meta, vocab_size):
    """None (read among the whole vocabulary), or (token ids a label is read among, the data's answer ids they stand
    for), both (A,) in the data's answer order, from --choices."""
    answers = np.asarray(meta["answer_ids"], dtype=np.int64)
    if not choices:
        return None
    if choices == "answers":
        return answers, answers
    try:
        ids = np.asarray([int(x) for x in choices.split(",")], dtype=np.int64)
    except ValueError:
        raise EvalError(f"--choices {choices!r}: 'answers' or comma-separated token ids") from None
    if len(ids) != len(answers) or len(set(ids.tolist())) != len(ids) or not ((0 <= ids) & (ids < vocab_size)).all():
        raise EvalError(f"--choices needs {len(answers)} distinct token ids below {vocab_size}, one per answer word "
                        f"of the data (meta.json answer_ids), got {choices!r}")
    return ids, answers


@torch.no_grad()
def run_depth(args, model):
    """Accuracy at the labeled positions, grouped by the steps k each label needs, for every r."""
    args.data = args.data or str(REPO / "data" / "depth")
    meta, ids, targets, steps = load_bin(args, model)
    if targets is None or steps is None or not meta.get("seq_len"):
        raise EvalError(f"{args.data} has no {args.split}_targets.bin/_step.bin: not a depth task dir")
    if meta.get("cot"):  # chains of thought (prepare.py --cot): the model writes p1..pk, scored by generation
        if args.choices:
            raise EvalError("--choices reads one-token answers of loop rows, not chains of thought (prepare.py --cot)")
        from plumbing.depth_cot import run_depth_cot
        return run_depth_cot(args, model, meta, ids)
    read = answer_choices(args.choices, meta, model.config.vocab_size)  # (ids read among, the answers they stand for)
    shape = (-1, meta["seq_len"])
    ids, targets, steps = (np.asarray(a).reshape(shape) for a in (ids, targets, steps))
    if args.limit:
        ids, targets, steps = ids[:args.limit], targets[:args.limit], steps[:args.limit]
    # one trajectory of max(r) loops per batch, read out after each r: s_0 is the same seeded draw for every r, so
    # the states after r loops are those of a run with num_steps=r, and 32 loops cost 32, not 1 + 2 + ... + 32;
    # the head (a parent's 49k vocabulary) reads out at the labeled positions only
    records, r_max = [], max(args.r)
    torch.manual_seed(args.seed)
    for b in range(0, len(ids), args.batch_size):
        x, y = (torch.from_numpy(a[b:b + args.batch_size].astype(np.int64)).to(args.device) for a in (ids, targets))
        tgt, stp = targets[b:b + args.batch_size], steps[b:b + args.batch_size]
        lab = tgt != IGNORE_INDEX  # (B, T): the positions read out
        at = torch.from_numpy(lab).to(x.device)
        out = model(x, y, num_steps=r_max, labeled_only=True, return_states=True)  # s_0 .. s_rmax
        rope = model.rope(torch.arange(x.shape[1], device=x.device))
        for r in args.r:
            logits = out.logits if r == r_max else model.readout(out.states[r], rope, positions=at)
            pred = np.full(tgt.shape, IGNORE_INDEX)
            if read is None:
                pred[lab] = logits.argmax(-1).cpu().numpy()  # logits (N, V) at the N labeled positions, row-major
            else:  # the highest of the chosen words, as the data's answer it stands for
                pred[lab] = read[1][logits[:, read[0]].argmax(-1).cpu().numpy()]
            for k in range(len(x)):
                order = np.argsort(stp[k][lab[k]], kind="stable")
                records.append({"index": b + k, "r": r, "k": int(stp[k].max()),
                                "steps": stp[k][lab[k]][order].tolist(),
                                "correct": (pred[k][lab[k]] == tgt[k][lab[k]])[order].astype(int).tolist()})
    records.sort(key=lambda rec: (args.r.index(rec["r"]), rec["index"]))  # by r, then row: as results.jsonl was
    return records, meta


@torch.no_grad()
def run_loss(args, model):
    """Cross-entropy of the same seeded batches at every r (the paper's multi-recurrence validation)."""
    meta, ids, targets, _ = load_bin(args, model)
    rng = np.random.default_rng(args.seed)
    T = meta.get("seq_len") or args.seq_len
    n_batches = min(args.num_batches, args.limit) if args.limit else args.num_batches
    if meta.get("seq_len"):  # row data: whole rows, labels from the targets file
        starts = rng.integers(0, len(ids) // T, size=(n_batches, args.batch_size)) * T
    else:  # plain text: random windows, target of t is token t+1
        if len(ids) <= T + 1:
            raise EvalError(f"{args.data}/{args.split}.bin has {len(ids)} tokens, fewer than --seq_len {T} + 1")
        starts = rng.integers(0, len(ids) - T - 1, size=(n_batches, args.batch_size))
    records = []
    for r in args.r:
        torch.manual_seed(args.seed)
        for b, row_starts in enumerate(starts):
            x = np.stack([ids[s:s + T] for s in row_starts]).astype(np.int64)
            y = np.stack([targets[s:s + T] if targets is not None else ids[s + 1:s + T + 1]
                          for s in row_starts]).astype(np.int64)
            logits = model(torch.from_numpy(x).to(args.device), num_steps=r)[0]
            ce = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y).to(args.device).flatten(),
                                 ignore_index=IGNORE_INDEX, reduction="sum").item()
            n = int((y != IGNORE_INDEX).sum())
            records.append({"batch": b, "r": r, "loss_sum": ce, "tokens": n, "loss": ce / max(n, 1)})
    return records, meta


def run_task(args, model, problems):
    """records (one dict per problem, row or batch, per r) and the data's meta (depth, loss) or None."""
    if args.task in ("gsm8k", "math"):
        from plumbing.tokenizer import load_tokenizer
        try:
            tok = load_tokenizer(args.tok_path)
        except (FileNotFoundError, ValueError) as e:
            raise EvalError(f"no tokenizer in {args.tok_path} ({e}): copy one there with tokenizer.save_tokenizer_files")
        return run_generation(args, model, tok, problems), None
    return run_depth(args, model) if args.task == "depth" else run_loss(args, model)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print("config:", json.dumps(vars(args)))
    try:  # an out_dir that cannot be written fails now, not after the whole evaluation
        out_dir = ready_out_dir(args.out_dir)
    except ValueError as e:
        raise EvalError(str(e)) from None
    problems = load_problems(args) if args.task in ("gsm8k", "math") else None  # bad rows fail before the model loads
    torch.manual_seed(args.seed)
    from plumbing.hub import CheckpointError
    from surgery import SurgeryError, load_model

    try:  # a checkpoint dir, a raven checkpoint, or a parent (all layers, identity adapter)
        model, args.tok_path = load_model(args.init, device=args.device)
    except (FileNotFoundError, ValueError, SurgeryError, CheckpointError) as e:
        raise EvalError(str(e)) from None
    model.eval()
    if args.compile:
        compile_blocks(model)
    if not model.config.recurrent and args.r != [1]:
        print("static-depth model: num_steps has no effect, evaluating once (r=1)")
        args.r = [1]
    if args.exit_criterion and not model.config.recurrent:
        raise EvalError("--exit_criterion needs a recurrent model: a static one runs its layers once")
    # one place decides the dtype (plumbing/device.py): bf16 autocast on CUDA, plain fp32 on CPU
    with autocast_context(model.embed_tokens.weight.device, args.autocast):
        if args.exit_sweep:  # one trajectory to max(r), each exit criterion over its thresholds
            from plumbing.exit_sweep import exit_sweep
            return exit_sweep(args, model, out_dir)
        records, meta = run_task(args, model, problems)
    args.train_max_k = (meta or {}).get("train_max_k")
    rows = summarize(args, model, records, meta)
    print_table(args, rows, meta)

    summary = {"task": args.task, "results": rows, "config": vars(args), "model_config": model.config.__dict__,
               "train_max_k": args.train_max_k, "split": args.split_name, "git_commit": git_commit(),
               "torch": torch.__version__}
    try:  # a full disk: one line that says so
        with open(out_dir / "results.jsonl", "w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
        with open(out_dir / "summary.json", "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, default=str)
        paths = plot(args, rows, out_dir)
    except OSError as e:
        raise EvalError(os_error(e, out_dir)) from None
    print(f"wrote {out_dir / 'results.jsonl'}, {out_dir / 'summary.json'}, " + ", ".join(str(p) for p in paths))
    return summary


if __name__ == "__main__":
    try:
        main()
    except EvalError as e:
        print(f"eval_math.py: error: {e}", file=sys.stderr)
        sys.exit(1)
