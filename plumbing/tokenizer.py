"""
The parents' tokenizers, re-implemented on tiktoken and checked token-for-token against the originals.

A retrofitted model (McLeish et al. 2025, arXiv 2511.07384) keeps its parent's embedding and unembedding, so it
must see exactly the token ids the parent was trained on. Every Llama-3-era parent uses byte-level BPE:
  - Llama-3.2 (original/tokenizer.model is a tiktoken file; tokenizer.json is the same vocabulary),
  - OLMo-2, Qwen2.5, SmolLM2 (tokenizer.json), and the offline SmolLM2 GGUF (vocabulary stored in the GGUF,
    read by plumbing/gguf.py).
tiktoken runs all of them: mergeable ranks derived from the merges list, the pre-tokenizer regex converted from
the tokenizer.json description. TinyLlama (the Llama-2 vocabulary) is SentencePiece BPE with byte fallback, which
tiktoken cannot express: that family alone goes through the sentencepiece package.

Usage:
    from plumbing.tokenizer import load_tokenizer, save_tokenizer_files
    tok = load_tokenizer("path/to/checkpoint_dir_or_model.gguf")
    ids = tok.encode("Hello world")            # never adds BOS; special-token strings in text become special ids
    text = tok.decode(ids)
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    save_tokenizer_files(src, out_dir)         # hub dir -> copies files; .gguf -> writes tokenizer.json & co

CPU one-liner (prints ids for a string with the offline SmolLM2 tokenizer):
    python -m plumbing.tokenizer --path=$(python -m plumbing.hub smollm2) --text="Hello world 123"
Tests: python -m pytest -q tests/test_tokenizer.py
"""

import argparse
import base64
import functools
import hashlib
import json
import re
import shutil
import sys
import unicodedata
from datetime import datetime
from pathlib import Path

import tiktoken

from plumbing import gguf
from plumbing.cli import read_json

# -----------------------------------------------------------------------------
# pre-tokenizer regexes

# GPT-2's regex: what tokenizers' ByteLevel(use_regex=True) splits with.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)] (SmolLM2, StarCoder) as ONE regex: every
# digit is its own piece, then GPT-2's regex runs on the stretches between digits. A whitespace run that ends at
# a digit ends its stretch, so it stays whole: the lookahead allows a digit after it (`(?![^\s\p{N}])`).
DIGITS_GPT2_PATTERN = r"""\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""
# Digits(individual_digits=False): runs of digits instead of single digits.
DIGIT_RUNS_GPT2_PATTERN = DIGITS_GPT2_PATTERN.replace(r"\p{N}|", r"\p{N}+|", 1)
# Llama-3's pattern (Meta's tokenizer.py), needed only for the bare tiktoken file, which carries no regex.
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")

# A GGUF names its pre-tokenizer (llama.cpp's `tokenizer.ggml.pre`) instead of storing it: this maps the names of
# the families we use to the equivalent tokenizer.json pre_tokenizer.
_BYTELEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_BYTES_ONLY = dict(_BYTELEVEL, use_regex=False)
_SPLIT = lambda pat: {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated", "invert": False}
GGUF_PRETOKENIZERS = {
    "default": _BYTELEVEL, "gpt2": _BYTELEVEL,
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTELEVEL]},
    "starcoder": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTELEVEL]},
    "llama-bpe": {"type": "Sequence", "pretokenizers": [_SPLIT(LLAMA3_PATTERN), _BYTES_ONLY]},
    "qwen2": {"type": "Sequence", "pretokenizers": [_SPLIT(QWEN2_PATTERN), _BYTES_ONLY]},
}

# Llama-3.1/3.2 special tokens, ids 128000.. (the tiktoken file stores only the 128000 ordinary tokens).
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
LLAMA3_SPECIALS += [f"<|reserved_special_token_{i}|>" for i in range(3, 3 + 256 - len(LLAMA3_SPECIALS))]


def bytes_to_unicode():
    """GPT-2's byte -> printable char table, how byte-level vocabularies write bytes in tokenizer.json / GGUF."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_ENCODER = bytes_to_unicode()
_BYTE_DECODER = {c: b for b, c in _BYTE_ENCODER.items()}


def _pattern_from_pretokenizer(pt):
    """Convert a tokenizer.json pre_tokenizer into one tiktoken regex (the splitting steps must compose to one)."""
    steps = pt.get("pretokenizers", []) if pt and pt.get("type") == "Sequence" else [pt]
    splits, byte_level = [], False
    for s in steps:
        kind = s and s.get("type")
        if kind == "ByteLevel":
            byte_level = True
            if s.get("add_prefix_space"):
                raise ValueError("ByteLevel(add_prefix_space=True) is not supported (no parent uses it)")
            if s.get("use_regex", True):
                splits.append(("regex", GPT2_PATTERN))
        elif kind == "Split":
            pat = s["pattern"].get("Regex") or re.escape(s["pattern"]["String"])
            # Isolated keeps matches and the gaps between them, Removed+invert keeps only matches: the same
            # for the patterns in use, which match every character.
            if (s.get("behavior"), bool(s.get("invert"))) not in [("Isolated", False), ("Removed", True)]:
                raise ValueError(f"unsupported Split behaviour {s.get('behavior')} invert={s.get('invert')}")
            splits.append(("regex", pat))
        elif kind == "Digits":
            splits.append(("digits", bool(s.get("individual_digits"))))
        else:
            raise ValueError(f"unsupported pre-tokenizer step {kind!r} in {json.dumps(pt)[:200]}")
    if not byte_level:
        raise ValueError("not a byte-level BPE tokenizer (no ByteLevel pre-tokenizer)")
    if len(splits) == 1 and splits[0][0] == "regex":
        return splits[0][1]
    if len(splits) == 2 and splits[0][0] == "digits" and splits[1] == ("regex", GPT2_PATTERN):
        return DIGITS_GPT2_PATTERN if splits[0][1] else DIGIT_RUNS_GPT2_PATTERN
    raise ValueError(f"cannot express this pre-tokenizer as one regex: {json.dumps(pt)[:300]}")


def _normalize_fn(norm):
    """tokenizer.json normalizer -> str -> str (Qwen2 uses NFC; most parents have none)."""
    if norm is None:
        return None
    forms = [s["type"] for s in (norm["normalizers"] if norm["type"] == "Sequence" else [norm])]
    for f in forms:
        if f not in ("NFC", "NFD", "NFKC", "NFKD"):
            raise ValueError(f"unsupported normalizer {f}")
    return lambda text: functools.reduce(lambda t, f: unicodedata.normalize(f, t), forms, text)


# -----------------------------------------------------------------------------
# chat templates, rendered the way transformers renders them

def render_chat_template(template, messages, add_generation_prompt=True, **variables):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    # same environment options as transformers' render_jinja_template, so whitespace comes out identical
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    variables = {k: v for k, v in variables.items() if v is not None}
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            **variables)


class _Base:
    chat_template = None
    special_strings = {}

    @staticmethod
    def _split_encode(text, special_re, special_id, encode):
        """Matches of special_re become the single token special_id(match); the stretches between them are
        encoded on their own by encode(stretch), as the reference tokenizers do."""
        if special_re is None:
            return encode(text)
        ids, start = [], 0
        for m in special_re.finditer(text):
            if m.start() > start:
                ids += encode(text[start:m.start()])
            ids.append(special_id(m.group()))
            start = m.end()
        if start < len(text):
            ids += encode(text[start:])
        return ids

    def apply_chat_template(self, messages, add_generation_prompt=True, **kwargs):
        if not self.chat_template:
            raise ValueError(f"{self.source} has no chat template")
        return render_chat_template(self.chat_template, messages, add_generation_prompt,
                                    **{**self.special_strings, **kwargs})

    def __repr__(self):
        return (f"{type(self).__name__}(source={self.source!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"eos_id={self.eos_id}, fingerprint={self.fingerprint})")


# -----------------------------------------------------------------------------
# byte-level BPE on tiktoken

class BPETokenizer(_Base):
    """Byte-level BPE. tiktoken ranks are merge priorities; `rank_to_id` maps them to the parent's ids
    (-1: a byte the vocabulary lacks, which the reference drops)."""

    def __init__(self, *, source, pattern, mergeable_ranks, rank_to_id, added, normalizer=None, bos_token=None,
                 eos_token=None, special_strings=None, chat_template=None):
        self.source, self.pattern, self.chat_template = source, pattern, chat_template
        self.special_strings = special_strings or {}
        self._enc = tiktoken.Encoding(f"nanorecur-{Path(source).name}", pat_str=pattern,
                                      mergeable_ranks=mergeable_ranks, special_tokens={})
        self._rank_to_id = rank_to_id
        self._normalize = _normalize_fn(normalizer)
        self._missing = bytes(b for b in range(256) if rank_to_id[mergeable_ranks[bytes([b])]] < 0)
        self.added = {a["content"]: a["id"] for a in added}  # added/special tokens: content -> id
        self.vocab_size = 1 + max([i for i in rank_to_id] + list(self.added.values()))
        self._id_bytes = [b""] * self.vocab_size  # id -> bytes, for decode and the fingerprint
        for tok, r in mergeable_ranks.items():
            if rank_to_id[r] >= 0:
                self._id_bytes[rank_to_id[r]] = tok
        for content, i in self.added.items():
            self._id_bytes[i] = content.encode("utf-8")
        # added tokens are matched in the raw text before the regex runs, longest first (HF: leftmost-longest);
        # lstrip/rstrip tokens swallow the whitespace beside them
        alts = []
        for a in sorted(added, key=lambda a: -len(a["content"])):
            if a.get("single_word"):
                raise ValueError(f"added token {a['content']!r} uses single_word, which is not supported")
            alts.append(r"\s*" * bool(a.get("lstrip")) + re.escape(a["content"]) + r"\s*" * bool(a.get("rstrip")))
        self._added_re = re.compile("|".join(alts)) if alts else None
        self.bos_id = self.token_to_id(bos_token)
        self.eos_id = self.token_to_id(eos_token)
        # (the "extra" key is kept so fingerprints of data already prepared stay valid)
        h = hashlib.sha256(json.dumps({"pattern": pattern, "normalizer": normalizer, "extra": None,
                                       "added": sorted(self.added.items(), key=lambda kv: kv[1])}).encode())
        for b in self._id_bytes:
            h.update(len(b).to_bytes(4, "little") + b)
        self.fingerprint = h.hexdigest()[:16]

    def token_to_id(self, token):
        if token is None:
            return None
        if token in self.added:
            return self.added[token]
        r = self._enc._encode_single_piece(token.encode("utf-8"))
        if len(r) != 1:
            raise ValueError(f"{token!r} is not a single token of {self.source}")
        return self._rank_to_id[r[0]]

    def _encode_ordinary(self, text):
        if self._normalize:
            text = self._normalize(text)
        ranks = self._enc.encode_ordinary(text)
        if self._missing:
            raw = text.encode("utf-8", "surrogatepass")
            if len(raw.translate(None, self._missing)) != len(raw):
                # a byte with no token: the reference drops it INSIDE its piece and merges across the gap
                import regex  # tiktoken's own dependency; this path only runs on such rare text
                ranks = []
                for piece in regex.findall(self.pattern, text):
                    b = piece.encode("utf-8", "surrogatepass").translate(None, self._missing)
                    if b:
                        ranks += self._enc._encode_single_piece(b)
        r2i = self._rank_to_id
        return [r2i[r] for r in ranks]

    def encode(self, text):
        """Text -> ids. No BOS; added/special token strings in the text are encoded as those tokens."""
        added = lambda t: self.added[t] if t in self.added else self.added[t.strip()]  # lstrip/rstrip ate spaces
        return self._split_encode(text, self._added_re, added, self._encode_ordinary)

    def decode(self, ids):
        return b"".join(self._id_bytes[i] for i in ids).decode("utf-8", errors="replace")


def _token_content(t):
    return t["content"] if isinstance(t, dict) else t


def _template_from_config(cfg, d):
    if d is not None and (Path(d) / "chat_template.jinja").exists():
        return (Path(d) / "chat_template.jinja").read_text(encoding="utf-8")
    t = cfg.get("chat_template")
    if isinstance(t, list):  # [{"name": "default", "template": ...}, ...]
        t = next((x["template"] for x in t if x["name"] == "default"), None)
    return t


def _special_strings(cfg):
    return {k: _token_content(cfg.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")
            if cfg.get(k) is not None}


def bpe_from_tokenizer_json(tj, cfg, source, chat_dir=None):
    """tokenizer.json (dict) + tokenizer_config.json (dict) -> BPETokenizer, with ranks derived from the merges."""
    model = tj["model"]
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("continuing_subword_prefix") \
            or model.get("end_of_word_suffix"):
        raise ValueError(f"{source}: not a plain byte-level BPE model")
    pattern = _pattern_from_pretokenizer(tj.get("pre_tokenizer"))
    vocab, added = model["vocab"], tj.get("added_tokens", [])
    added_ids = {a["id"] for a in added}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    to_bytes = lambda tok: bytes(_BYTE_DECODER[c] for c in tok)
    # Ranks: the 256 bytes first (their rank never matters: tiktoken only compares ranks of merged pairs), then
    # every merge result in merge order. Ids are looked up separately, since they need not follow merge order.
    ranks, rank_to_id = {}, []
    for b in range(256):
        ranks[bytes([b])] = b
        tok = _BYTE_ENCODER[b]
        rank_to_id.append(vocab[tok] if tok in vocab and vocab[tok] not in added_ids else -1)
    previous = None
    for i, (a, b) in enumerate(merges):
        if a + b not in vocab or a not in vocab or b not in vocab:
            raise ValueError(f"{source}: merge {i} ({a!r} {b!r}) uses or makes a token not in the vocabulary")
        ab = to_bytes(a + b)
        if ab in ranks:
            # Tokenizers converted from tiktoken (Llama-3) list every split of a token, one after another: tiktoken's
            # rule exactly. A token made again by a merge far later has two priorities, which tiktoken cannot say.
            if ab != previous:
                raise ValueError(f"{source}: merge {i} remakes {a + b!r} long after its first merge; tiktoken needs "
                                 "one rank per token")
            continue
        ranks[ab] = len(rank_to_id)
        rank_to_id.append(vocab[a + b])
        previous = ab
    # Tokens that are neither a byte nor a merge result: HF emits them only with ignore_merges=True, when a whole
    # piece equals one (tiktoken's first step too), so they get the last ranks; without it they are unreachable.
    if model.get("ignore_merges"):
        for t, i in sorted(vocab.items(), key=lambda kv: kv[1]):
            if i not in added_ids and to_bytes(t) not in ranks:
                ranks[to_bytes(t)] = len(rank_to_id)
                rank_to_id.append(i)
    return BPETokenizer(source=source, pattern=pattern, mergeable_ranks=ranks, rank_to_id=rank_to_id, added=added,
                        normalizer=tj.get("normalizer"), bos_token=_token_content(cfg.get("bos_token")),
                        eos_token=_token_content(cfg.get("eos_token")), special_strings=_special_strings(cfg),
                        chat_template=_template_from_config(cfg, chat_dir))


def bpe_from_tiktoken_file(path, cfg=None, chat_dir=None):
    """Llama-3's original/tokenizer.model: lines "base64(token) rank"; ranks are the ids, specials follow them."""
    cfg = cfg or {}
    ranks = {}
    for line in Path(path).read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    n = len(ranks)
    if sorted(ranks.values()) != list(range(n)):
        raise ValueError(f"{path}: ranks are not 0..{n - 1}")
    specials = LLAMA3_SPECIALS
    decoder = cfg.get("added_tokens_decoder")
    if decoder:  # the hub's tokenizer_config.json lists the real special tokens
        specials = [None] * (1 + max(map(int, decoder)) - n)
        for i, t in decoder.items():
            specials[int(i) - n] = t["content"]
    added = [{"id": n + k, "content": c, "special": True} for k, c in enumerate(specials) if c is not None]
    cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", **cfg}
    return BPETokenizer(source=str(path), pattern=LLAMA3_PATTERN, mergeable_ranks=ranks, rank_to_id=list(range(n)),
                        added=added, bos_token=_token_content(cfg["bos_token"]),
                        eos_token=_token_content(cfg["eos_token"]), special_strings=_special_strings(cfg),
                        chat_template=_template_from_config(cfg, chat_dir))


# -----------------------------------------------------------------------------
# GGUF: the vocabulary, merges and chat template live in the file's metadata (read by plumbing/gguf.py)

def gguf_tokenizer_files(path):
    """-> (tokenizer.json dict, tokenizer_config.json dict) equivalent to the GGUF's tokenizer."""
    return gguf.tokenizer_files(path, GGUF_PRETOKENIZERS)


# -----------------------------------------------------------------------------
# SentencePiece (TinyLlama / Llama-2 vocabulary only)

class SentencePieceTokenizer(_Base):
    """TinyLlama's tokenizer.model is SentencePiece BPE with byte fallback, which tiktoken cannot express, so this
    family uses the sentencepiece package. Control tokens (<s>, </s>, <unk>) written in the text are matched as
    those tokens and every stretch between them is encoded on its own, as the hub's tokenizer.json does."""

    def __init__(self, path, cfg=None, chat_dir=None):
        import sentencepiece as spm
        cfg = cfg or {}
        self.source = str(path)
        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        n = self.vocab_size = self.sp.get_piece_size()
        self._control = {self.sp.id_to_piece(i): i for i in range(n) if self.sp.is_control(i) or self.sp.is_unknown(i)}
        alts = sorted(self._control, key=len, reverse=True)
        self._control_re = re.compile("|".join(map(re.escape, alts))) if alts else None
        self._byte = {i: int(self.sp.id_to_piece(i)[3:5], 16) for i in range(n) if self.sp.is_byte(i)}
        self.special_strings = _special_strings(cfg)
        tok_id = lambda t: None if t is None else self.token_to_id(_token_content(t))
        self.bos_id = tok_id(cfg.get("bos_token")) if "bos_token" in cfg else self.sp.bos_id()
        self.eos_id = tok_id(cfg.get("eos_token")) if "eos_token" in cfg else self.sp.eos_id()
        self.chat_template = _template_from_config(cfg, chat_dir)
        self.fingerprint = hashlib.sha256(self.sp.serialized_model_proto()).hexdigest()[:16]

    def token_to_id(self, token):
        i = self.sp.piece_to_id(token)
        if self.sp.id_to_piece(i) != token:
            raise ValueError(f"{token!r} is not a token of {self.source}")
        return i

    def encode(self, text):
        return self._split_encode(text, self._control_re, self._control.__getitem__, self.sp.encode)

    def decode(self, ids):
        # like the hub tokenizer's decoder: "▁" -> " ", runs of <0xNN> -> bytes, control tokens as their text,
        # one leading space stripped
        out, pending = [], []
        for i in list(ids) + [None]:
            if i is not None and i in self._byte:
                pending.append(self._byte[i])
                continue
            if pending:
                try:
                    out.append(bytes(pending).decode("utf-8"))
                except UnicodeDecodeError:
                    out.append("\ufffd" * len(pending))
                pending = []
            if i is not None:
                out.append(self.sp.id_to_piece(i).replace("\u2581", " "))
        text = "".join(out)
        return text[1:] if text.startswith(" ") else text


# -----------------------------------------------------------------------------
# entry points

def _is_tiktoken_file(p):
    with open(p, "rb") as f:
        head = f.read(256)
    return re.fullmatch(rb"[A-Za-z0-9+/=]+ \d+", head.split(b"\n", 1)[0]) is not None


def document_separator(tok):
    """(kind, id): how the parent's pretraining delimited documents, or None when it cannot be told.

    The separator is the pretraining document boundary, not a chat token. In order:
      1. the vocabulary has <|endoftext|>: ("eos", its id), after each document. SmolLM2, Qwen2.5
         and OLMo-2 (and GPT-2) were pretrained on documents ending in <|endoftext|>; their BOS/EOS
         may be chat tokens (SmolLM2-Instruct: <|im_start|>, <|im_end|>) that never delimited documents.
      2. a BOS distinct from EOS: ("bos", bos_id) before each document (Llama-3, TinyLlama).
      3. otherwise ("eos", eos_id) after each document.
    """
    try:
        return "eos", tok.token_to_id("<|endoftext|>")
    except ValueError:
        pass
    if tok.bos_id is not None and tok.bos_id != tok.eos_id:
        return "bos", tok.bos_id
    return ("eos", tok.eos_id) if tok.eos_id is not None else None


def prompt_ids(tok, text):
    """ids of a plain-text prompt as the start of a fresh document: the separator first (BOS, or the
    <|endoftext|> that ended the previous document in pretraining), then the text."""
    sep = document_separator(tok)
    return ([sep[1]] if sep else []) + tok.encode(text)


def stop_ids(tok, chat):
    """Token ids that end a generation: EOS, plus in chat mode the template's end-of-turn token when it
    is a single token (<|im_end|>, <|eot_id|>, <|end|>)."""
    ids = {tok.eos_id} if tok.eos_id is not None else set()
    for marker in ("<|im_end|>", "<|eot_id|>", "<|end|>") if chat else ():
        enc = tok.encode(marker)
        if len(enc) == 1:
            ids.add(enc[0])
    return ids


def load_tokenizer(path):
    """A checkpoint dir (tokenizer.json | original/tokenizer.model | tokenizer.model) or a .gguf file -> tokenizer."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no tokenizer at {p}")
    if p.is_file() and p.suffix == ".gguf":
        tj, cfg = gguf_tokenizer_files(p)
        return bpe_from_tokenizer_json(tj, cfg, str(p))
    if p.is_file():
        p = p.parent if p.name in ("tokenizer.json",) else p
    d = p if p.is_dir() else p.parent
    root = d.parent if d.name == "original" else d
    cfg = read_json(root / "tokenizer_config.json") if (root / "tokenizer_config.json").exists() else {}
    if (root / "tokenizer.json").exists() and not (p.is_file() and p.name == "tokenizer.model"):
        tj = read_json(root / "tokenizer.json")
        if tj["model"].get("type") == "BPE" and not tj["model"].get("byte_fallback"):
            return bpe_from_tokenizer_json(tj, cfg, str(root / "tokenizer.json"), chat_dir=root)
    candidates = [p] if p.is_file() else [root / "original" / "tokenizer.model", root / "tokenizer.model"]
    for c in candidates:
        if c.exists():
            if _is_tiktoken_file(c):
                return bpe_from_tiktoken_file(c, cfg, chat_dir=root)
            return SentencePieceTokenizer(c, cfg, chat_dir=root)
    raise FileNotFoundError(f"no tokenizer.json, original/tokenizer.model or tokenizer.model in {root}")


TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "original/tokenizer.model", "chat_template.jinja"]


def save_tokenizer_files(src, out_dir):
    """Copy a hub dir's tokenizer files to out_dir, or write tokenizer.json/tokenizer_config.json/
    special_tokens_map.json from a GGUF (transformers' AutoTokenizer can load them too). Returns the files written."""
    src, out = Path(src), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if src.is_file() and src.suffix == ".gguf":
        return gguf.write_tokenizer_files(src, out, GGUF_PRETOKENIZERS)
    if not src.is_dir():
        raise FileNotFoundError(f"{src} is neither a checkpoint dir nor a .gguf file")
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, out / name)
            written.append(str(out / name))
    if not written:
        raise FileNotFoundError(f"no tokenizer files in {src}")
    return written


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="encode a string with a parent's tokenizer", allow_abbrev=False)
    ap.add_argument("--path", required=True, help="checkpoint dir or .gguf")
    ap.add_argument("--text", default="Hello world 123")
    args = ap.parse_args()
    print(vars(args))
    try:
        tok = load_tokenizer(args.path)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    ids = tok.encode(args.text)
    print(tok)
    print(ids)
    print(repr(tok.decode(ids)))
