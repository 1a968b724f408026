"""
Checkpoints of a training run that cannot lie: one directory per save, switched in by one atomic rename,
verified on load, and a lock so that one process at a time owns a run directory.

A run directory (train.py --out_dir) holds

    ckpt/step-000050-3fa2c1/   one complete save: model.safetensors, config.json, train_state.pt, manifest.json
                               (train.py --fsdp: also the optimizer shards, .metadata and __<rank>_0.distcp)
    latest -> ckpt/step-000050-3fa2c1          the pointer: the one save that counts
    model.safetensors -> latest/model.safetensors    what every other script reads (sample.py, eval_math.py,
    config.json -> latest/config.json                analyze.py, RecurrentGPT.from_pretrained(out_dir), --init)
    train_state.pt -> latest/train_state.pt
    .lock                      flock'ed by the training process that owns the directory
    log.jsonl, loss.png, tokenizer files

The three top-level names are fixed relative symlinks through `latest`, so switching `latest` switches
weights, config and train state together: a reader sees one save or the next, never a mix, and the
directory still works when moved or copied (cp -r keeps relative links). train_state.pt is loaded with
torch.load(weights_only=True): tensors and plain data only, a crafted pickle runs nothing.

    python train.py --init=scratch --data data/depth --max_iters 20 --eval_interval 10 --out_dir out/x
    ls -l out/x; cat out/x/latest/manifest.json
    python bench/kill_save.py      # kill a run after every filesystem operation of a save, then resume
"""

import errno
import fcntl
import hashlib
import json
import os
import secrets
import socket
from dataclasses import asdict

import torch

from plumbing.cli import read_json
from plumbing.hf_remote import write_remote_code

POINTER = "latest"
FILES = ("model.safetensors", "config.json", "train_state.pt")  # the three names every reader knows
MANIFEST = "manifest.json"


class RunDirError(Exception):
    """A run directory that cannot be locked, saved to or resumed from; the message says why in one line."""


# -----------------------------------------------------------------------------
# small filesystem steps: what changes the disk is an os.* call or open() here (bench/kill_save.py counts them)


def write_file(path, dump):
    """Create path, let dump(f) write into it, force the bytes to the disk; return the file's sha256.
    A full disk raises OSError here (torch.save turns a failed f.write into a RuntimeError whose context
    is the OSError; safetensors' save_file would raise its own error type, hence bytes for the weights)."""
    try:
        with open(path, "wb") as f:
            try:
                dump(f)
            except RuntimeError as err:
                if not isinstance(err.__context__, OSError):
                    raise
                raise err.__context__ from None
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        err.filename = err.filename or path  # a failed write() does not say which file it was
        raise
    return sha256(path)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path):
    """Make the directory's entries (new files, renames) durable, not only the files' bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link(out_dir, name, target):
    """Make out_dir/name a symlink to target with one atomic rename (a new link, then os.replace)."""
    path = os.path.join(out_dir, name)
    if os.path.islink(path) and os.readlink(path) == target:
        return
    if os.path.lexists(path + ".tmp-link"):  # left by a killed save
        os.unlink(path + ".tmp-link")
    os.symlink(target, path + ".tmp-link")
    os.replace(path + ".tmp-link", path)


def remove_tmp_links(out_dir):
    for name in (POINTER, *FILES):
        if os.path.lexists(os.path.join(out_dir, name + ".tmp-link")):
            os.unlink(os.path.join(out_dir, name + ".tmp-link"))


def remove_dir(path):
    """Remove a save directory (flat by construction: no subdirectories), one file at a time."""
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)


def current(out_dir):
    """(directory, step) of the save `latest` points to, or (None, None)."""
    pointer = os.path.join(out_dir, POINTER)
    if not os.path.islink(pointer):
        return None, None
    target = os.readlink(pointer)
    return os.path.join(out_dir, target), step_of(target)


def step_of(name):
    try:  # ckpt/step-000050-3fa2c1 -> 50
        return int(os.path.basename(name).split("-")[1])
    except (IndexError, ValueError):
        return None


def remove_stale(out_dir, keep=None):
    """Every save directory but the current one (and keep: the one a run resumed from), i.e. older saves
    and partial ones of a killed run, and links half-made by a killed save. Only the lock holder calls this."""
    ckpt = os.path.join(out_dir, "ckpt")
    kept = {os.path.basename(p) for p in (current(out_dir)[0], keep) if p}
    for name in sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []:
        path = os.path.join(ckpt, name)
        if name not in kept:
            remove_dir(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    remove_tmp_links(out_dir)


def mount_of(path):
    """'the disk mounted at /data (/dev/nvme1n1, 0.0 GB free)': which disk a path lives on."""
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    device = ""
    try:
        with open("/proc/mounts") as f:  # Linux: the device behind the mount point
            device = next((line.split()[0] + ", " for line in f if line.split()[1] == path), "")
    except OSError:
        pass
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    free = f"{free / 1e9:.1f} GB" if free > 1e9 else f"{free / 1e6:.1f} MB"
    return f"the disk mounted at {path} ({device}{free} free)"


# -----------------------------------------------------------------------------
# the protocol


def new_save_dir(out_dir, step):
    """Steps 1 and 2's start: remove what a killed save left, then make the empty ckpt/step-<step>-<random>/.
    Returns its path."""
    ckpt = os.path.join(out_dir, "ckpt")
    path = os.path.join(ckpt, f"step-{step:06d}-{secrets.token_hex(3)}")
    os.makedirs(ckpt, exist_ok=True)
    remove_stale(out_dir)
    os.mkdir(path)
    return path


def save(out_dir, step, model, train_state, train_config, shards=None):
    """Save one checkpoint of a run atomically as a whole: weights, config (model config plus
    train_config under "train") and train_state (optimizer states, step, RNG, ...).

    1. remove what a killed save left (every ckpt/ entry but the current one, half-made links);
    2. write ckpt/step-<step>-<random>/: model.safetensors, config.json, train_state.pt, each written
       and fsync'ed, then manifest.json (the step and the sha256 of each file); fsync the directories;
    3. make sure the top-level names are links through `latest` (the first save makes them: until
       step 4 they dangle, which reads as "no checkpoint yet", the truth);
    4. the commit: a new symlink to the new directory, renamed over `latest` (rename(2) is atomic);
    5. fsync out_dir, remove the previous save.

    A kill at any point leaves `latest` at either the previous complete save or the new complete one;
    whatever else it leaves is removed by step 1 of the next save. A failed write (a full disk) removes
    the new directory and raises RunDirError naming the disk and the path; the previous save is untouched.

    shards (train.py --fsdp, plumbing/fsdp.py): (path, weights, sha256 by file name): a directory that
    new_save_dir made and every rank wrote its shard files into, the whole weights gathered on this rank,
    and the shard files' sha256, which the manifest lists with the others (verify checks them all)."""
    from safetensors.torch import save as safetensors_bytes

    path, weights, shard_sha = shards or (None, None, {})
    try:
        path = path or new_save_dir(out_dir, step)
        file = lambda name: os.path.join(path, name)
        # the weights as bytes (one host copy): safetensors' own writer would not report a full disk as OSError
        weights = safetensors_bytes(model.state_dict_to_save() if weights is None else weights,
                                    metadata={"format": "pt"})
        # as save_pretrained: the modeling file (the same bytes every time) is in place before the config naming it
        config = {"model_type": "nanorecur", **asdict(model.config), **write_remote_code(out_dir), "train": train_config}
        sha = {**shard_sha, "model.safetensors": write_file(file("model.safetensors"), lambda f: f.write(weights)),
               "config.json": write_file(file("config.json"), lambda f: f.write(json_bytes(config))),
               "train_state.pt": write_file(file("train_state.pt"), lambda f: torch.save(train_state, f))}
        del weights
        write_file(file(MANIFEST), lambda f: f.write(json_bytes({"step": step, "sha256": sha})))
        fsync_dir(path)
        fsync_dir(os.path.dirname(path))  # ckpt/
        for name in FILES:
            link(out_dir, name, os.path.join(POINTER, name))
        link(out_dir, POINTER, os.path.relpath(path, out_dir))  # the commit
    except OSError as err:  # not committed (the commit is the last call above): leave nothing of it behind
        remove_quietly(path, out_dir)
        raise RunDirError(write_error(err, path, out_dir)) from None
    try:
        fsync_dir(out_dir)
        remove_stale(out_dir)
    except OSError as err:  # harmless for the save; the next one retries the cleanup
        print(f"warning: step {step} is saved in {path}, but cleaning up failed: {err}")


def remove_quietly(path, out_dir):
    """After a failed write: the new directory and any half-made link go (errors here change nothing)."""
    try:
        if path and os.path.isdir(path):  # None: the directory was never made
            remove_dir(path)
        remove_tmp_links(out_dir)
    except OSError:
        pass


def write_error(err, path, out_dir):
    """One line: what failed where, on which disk, and that the previous save (if any) is whole."""
    where = err.filename or path
    _, prev = current(out_dir)
    kept = f"the checkpoint of step {prev} in {out_dir} is intact" if prev is not None else "no checkpoint was written"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"disk full: no space left on {mount_of(out_dir)} while writing {where}; {kept} and nothing of "
                f"this save is left behind: free space, then --resume")
    return f"cannot write {where}: {err.strerror or err}; {kept} and nothing of this save is left behind"


def json_bytes(obj):
    return (json.dumps(obj, indent=2) + "\n").encode()


def verify(path):
    """None if path is a complete save (its manifest, every file's sha256, the shard files of a --fsdp save
    included, and the step as recorded), else what is wrong with it."""
    try:
        manifest = read_json(os.path.join(path, MANIFEST))
        for name in (*FILES, *sorted(set(manifest["sha256"]) - set(FILES))):
            if sha256(os.path.join(path, name)) != manifest["sha256"][name]:
                return f"{name} does not match its sha256 in {MANIFEST}"
        if read_json(os.path.join(path, "config.json")).get("train", {}).get("step") != manifest["step"]:
            return f"config.json is not of step {manifest['step']}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"incomplete ({err})"
    return None


def saves(out_dir):
    """The save directories under out_dir/ckpt, complete or not, the newest step first."""
    ckpt = os.path.join(out_dir, "ckpt")
    names = sorted(os.listdir(ckpt) if os.path.isdir(ckpt) else [], key=lambda n: step_of(n) or -1, reverse=True)
    return [os.path.join(ckpt, n) for n in names]


def find(out_dir):
    """(directory, step) of the save to resume from: the one `latest` points to when it verifies, else the
    newest other complete save (said in a printed note, with what is wrong with `latest`)."""
    first, _ = current(out_dir)
    candidates = ([first] if first else []) + [p for p in saves(out_dir)
                                               if not first or os.path.basename(p) != os.path.basename(first)]
    problems = []
    for path in candidates:
        problem = verify(path)
        if problem is None:
            if path != first:
                why = problems[0] if problems else f"{os.path.join(out_dir, POINTER)} is missing"
                print(f"note: {why}; resuming from {path}, the newest complete save")
            return path, read_json(os.path.join(path, MANIFEST))["step"]
        problems.append(f"{path}: {problem}")
    if not candidates:
        legacy = os.path.isfile(os.path.join(out_dir, "train_state.pt"))
        raise RunDirError(f"--resume: {out_dir} has no checkpoint (no {POINTER} -> ckpt/...)" +
                          (": its train_state.pt was written by an older train.py, which this one cannot resume"
                           if legacy else ""))
    raise RunDirError(f"--resume: no complete checkpoint in {out_dir}: " + "; ".join(problems))


def load_state(path):
    """The train state of a save, tensors and plain data only: a pickle that would build any other
    object (and so could run code) is refused."""
    file = os.path.join(path, "train_state.pt")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError for foreign objects, RuntimeError for a broken zip
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RunDirError(f"refusing to load {file}: not a plain train state (tensors, numbers, strings, "
                          f"lists, dicts): {first}") from None


def remove_run(out_dir):
    """Remove the saves of a training run in out_dir (the top-level links, `latest`, ckpt/, a train_state.pt)
    so that another checkpoint can be written there (surgery.py --overwrite); other files stay. Readers
    see "no checkpoint" from the first unlink on. Call it holding the lock."""
    for name in (*FILES, POINTER):
        path = os.path.join(out_dir, name)
        if os.path.islink(path) or (name == "train_state.pt" and os.path.isfile(path)):
            os.unlink(path)
    remove_stale(out_dir)  # with no `latest`: every save
    if os.path.isdir(os.path.join(out_dir, "ckpt")):
        os.rmdir(os.path.join(out_dir, "ckpt"))


def lock(out_dir):
    """Own out_dir for the life of this process: flock on out_dir/.lock, which the kernel releases when
    the process ends, however it ends (a killed run never leaves it stuck). Keep the returned file open."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        f = open(os.path.join(out_dir, ".lock"), "a+")
    except OSError as err:
        raise RunDirError(f"cannot use --out_dir {out_dir}: {err.strerror or err}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise RunDirError(f"{out_dir} is in use by another training run ({holder}): wait for it to end, "
                          f"or use another directory") from None
    f.truncate(0)
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    return f
