"""
Share a checkpoint directory on the Hugging Face hub: what a user needs to load it, nothing of the run's history.

A checkpoint directory (surgery.py --out, train.py --out_dir) holds more than a model: a training run keeps
its saves under ckpt/ with the optimizer state, a `latest` pointer, a .lock, and links model.safetensors /
config.json into the current save (plumbing/checkpoint.py). files_to_upload lists the files a user needs:

    model.safetensors (or its shards + index), config.json, generation_config.json   the model
    tokenizer.json, tokenizer_config.json, ... (plumbing.tokenizer.TOKENIZER_FILES)   its tokenizer
    README.md                                   the model card (plumbing/model_card.py; written if absent)
    *.py at the top level                       modeling files (e.g. raven_modeling_minimal.py)
    LICENSE*, NOTICE*, USE_POLICY.md            a parent's license files (Llama's asks to ship a copy)
    log.jsonl, loss.png                         the training log and curve: small, and the evidence of
                                                how the weights were made
and never ckpt/, latest, train_state.pt (optimizer state, 2-3x the weights, only for --resume), .lock, or
temp files. push_to_hub snapshots those files first (hard links into a hidden folder of out_dir, `latest`
read once), so a save landing mid-upload cannot mix the weights of one step with the config of another;
links are uploaded as the files they point to. (A push killed midway may leave a hidden .upload-*/ of hard
links behind: remove it.)

    from plumbing.upload import push_to_hub, check_push, files_to_upload, UploadError
    python -m plumbing.upload out/smollm2 --list                   # what would be uploaded (no network)
    hf auth login && python -m plumbing.upload out/smollm2 you/smollm2-6-8-6 [--private]
    python -m pytest -q tests/test_model_card.py -k upload
"""

import argparse
import fnmatch
import json
import os
import shutil
import sys
import tempfile

from plumbing.hub import HUB_ID
from plumbing.model_card import write_model_card
from plumbing.tokenizer import TOKENIZER_FILES

MODEL_FILES = ["model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json", "config.json",
               "generation_config.json"]
SHARED = [*MODEL_FILES, *TOKENIZER_FILES, "README.md", "*.py", "LICENSE*", "NOTICE*", "USE_POLICY.md", "log.jsonl",
          "loss.png"]
NEVER = ["ckpt/*", "latest/*", "train_state.pt", ".*", "*.tmp", "*.tmp-link"]  # a second guard for upload_folder


class UploadError(ValueError):
    """A checkpoint directory that cannot be pushed; the message is one line: the problem and the fix."""


def files_to_upload(out_dir):
    """The paths (relative to out_dir, sorted) that push_to_hub uploads: SHARED names that are files,
    following links (a dangling link is no file). Raises UploadError when there is no model to share."""
    if not os.path.isdir(out_dir):
        raise UploadError(f"{out_dir} is not a directory: pass a checkpoint dir written by surgery.py or train.py")
    names = []
    for root, dirs, files in os.walk(out_dir):
        dirs[:] = [d for d in dirs if d not in ("ckpt", "latest") and not d.startswith(".")]  # no run history
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), out_dir).replace(os.sep, "/")
            keep = any(fnmatch.fnmatchcase(rel, p) for p in SHARED) and not any(fnmatch.fnmatchcase(rel, p)
                                                                                for p in NEVER)
            if keep and os.path.isfile(os.path.join(out_dir, rel)) and ("/" not in rel or rel in TOKENIZER_FILES):
                names.append(rel)
    names.sort()
    if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
        raise UploadError(f"{out_dir} holds no checkpoint (model.safetensors and config.json): run surgery.py or "
                          f"train.py into it first, or wait for a training run's first save")
    return names


def snapshot(out_dir, names, stage):
    """Make stage/<name> the file out_dir/<name> is now: `latest` is read once, so the links through it all
    come from one save. A hard link keeps the bytes even if a later save removes that save directory; where
    a hard link is refused (another disk), a symlink to the resolved file."""
    latest = os.path.realpath(os.path.join(out_dir, "latest")) if os.path.islink(os.path.join(out_dir, "latest")) \
        else None
    for name in names:
        path = os.path.join(out_dir, name)
        target = os.readlink(path) if os.path.islink(path) else ""
        src = os.path.join(latest, target[len("latest/"):]) if latest and target.startswith("latest/") \
            else os.path.realpath(path)
        dst = os.path.join(stage, name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            os.symlink(src, dst)


def offline():
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def check_repo_id(repo_id):
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
        ok = bool(HUB_ID.match(repo_id))
    except HFValidationError:
        ok = False
    if not ok:
        raise UploadError(f"--push_to_hub {repo_id!r} is not a hub repo id: use namespace/name (letters, digits, "
                          f"'-', '_', '.'), e.g. your-name/smollm2-6-8-6")


def hub_error(err, repo_id):
    """One line for what the hub (or the way to it) answered."""
    from huggingface_hub.errors import HFValidationError, HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError

    status = getattr(getattr(err, "response", None), "status_code", None)
    namespace = repo_id.split("/")[0]
    if isinstance(err, OfflineModeIsEnabled):
        return f"cannot push to {repo_id}: the hub is offline (HF_HUB_OFFLINE): unset it, on a machine with network"
    if isinstance(err, HFValidationError):
        return f"{repo_id!r} is not a hub repo id: use namespace/name"
    if isinstance(err, RepositoryNotFoundError) or status == 404:
        return f"{repo_id}: the hub has no such repo or namespace {namespace!r}: check the name (your user or an org)"
    if status == 401:
        return f"{repo_id}: the token was refused (HTTP 401): log in again with `hf auth login`, or fix HF_TOKEN"
    if status == 403:
        return (f"{repo_id}: no write access to {namespace!r} (HTTP 403): use your own namespace or an org you may "
                f"write to, with a token that has write permission (`hf auth login`)")
    if isinstance(err, HfHubHTTPError):
        return f"{repo_id}: the hub answered HTTP {status}: {str(err).splitlines()[0]}; try again later"
    if isinstance(err, FileNotFoundError):
        return f"{err.filename} went away during the upload (a new save of a running training?): push again"
    return (f"cannot reach the Hugging Face hub to push {repo_id} ({type(err).__name__}): check the network, "
            f"or push later with python -m plumbing.upload")


def is_network(err):
    mod = type(err).__module__.split(".")[0]
    return isinstance(err, (ConnectionError, TimeoutError)) or mod in ("httpx", "httpx2", "requests", "urllib3")


def check_push(repo_id, out_dir="DIR", token=None):
    """What can be known without the network: a well-formed repo id, not HF_HUB_OFFLINE, a token. Returns the
    token. train.py calls it at the start, so a run that is to be pushed fails now, not after hours."""
    import huggingface_hub

    check_repo_id(repo_id)
    if offline():
        raise UploadError(f"cannot push {out_dir} to {repo_id}: HF_HUB_OFFLINE=1 (no network): unset HF_HUB_OFFLINE on "
                          f"a machine that reaches huggingface.co, then python -m plumbing.upload {out_dir} {repo_id}")
    token = token or huggingface_hub.get_token()
    if not token:
        raise UploadError(f"cannot push to {repo_id}: not logged in to the Hugging Face hub: run `hf auth login` "
                          f"(a token with write permission) or set HF_TOKEN")
    return token


def push_to_hub(out_dir, repo_id, private=False, token=None):
    """Upload the files_to_upload of out_dir to the model repo repo_id (created if missing; private only
    applies then). Returns the repo's URL. Every expected failure is an UploadError with one line, raised
    before any network access where it can be: a malformed id, no checkpoint, HF_HUB_OFFLINE, no login."""
    check_repo_id(repo_id)
    names = files_to_upload(out_dir)
    token = check_push(repo_id, out_dir, token)
    import huggingface_hub
    from huggingface_hub import errors as hub_errors

    try:
        stage = tempfile.mkdtemp(prefix=".upload-", dir=out_dir)  # on out_dir's disk, so hard links work
    except OSError:
        stage = tempfile.mkdtemp(prefix="nanorecur-upload-")  # a read-only out_dir: symlinks from elsewhere
    try:
        snapshot(out_dir, names, stage)
        with open(os.path.join(stage, "config.json")) as f:
            config = json.load(f)
        if "README.md" not in names:  # the card of the snapshot's config, not of a later save
            write_model_card(stage, config)
            names = sorted([*names, "README.md"])
        step = (config.get("train") or {}).get("step")
        try:
            url = huggingface_hub.create_repo(repo_id, private=private, exist_ok=True, token=token)
            huggingface_hub.upload_folder(repo_id=repo_id, folder_path=stage, allow_patterns=names,
                                          ignore_patterns=NEVER, token=token,
                                          commit_message="nanorecur checkpoint" + (f", step {step}" if step else ""))
        except (hub_errors.HfHubHTTPError, hub_errors.OfflineModeIsEnabled, hub_errors.HFValidationError,
                FileNotFoundError) as err:
            raise UploadError(hub_error(err, repo_id)) from None
        except Exception as err:
            if not is_network(err):
                raise
            raise UploadError(hub_error(err, repo_id)) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # links only: the checkpoint's files stay
    return str(url)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="push a checkpoint dir to the Hugging Face hub", allow_abbrev=False)
    ap.add_argument("dir", help="checkpoint directory (surgery.py --out or train.py --out_dir)")
    ap.add_argument("repo_id", nargs="?", help="namespace/name of the model repo")
    ap.add_argument("--private", action="store_true", help="create the repo private (an existing one keeps its own)")
    ap.add_argument("--list", action="store_true", help="only print the files that would be uploaded")
    args = ap.parse_args()
    try:
        if args.list or not args.repo_id:
            print("\n".join(files_to_upload(args.dir)))
        else:
            print(f"pushed {args.dir} to {push_to_hub(args.dir, args.repo_id, private=args.private)}")
    except UploadError as err:
        sys.exit(f"error: {err}")
