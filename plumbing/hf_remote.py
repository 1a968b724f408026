"""
Checkpoints the ecosystem can load: the modeling code that transformers' `trust_remote_code` runs, written
into every directory nanorecur saves, with the `auto_map` that config.json needs to find it.

    write_remote_code(out_dir)          # modeling_nanorecur.py + model.py; returns {"auto_map": {...}} for config.json
    write_remote_code(out_dir, "raven") # raven_config_minimal.py + raven_modeling_minimal.py, which import the two
                                        # above (plumbing/raven.py's config.json names them in its auto_map already)

Then `AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True)` loads it (transformers 5.x). The files
are plumbing/hf/*.py and model.py, written byte for byte: the same bytes at every save, so a manifest's sha256
stays meaningful.
They are the project's own code: the modeling files import the model's math from model.py, copied beside them,
so a directory loads where nanorecur is not installed (torch and transformers only). Each opens with the
words of MARKER: the raven modeling file serves both raven layouts, so a loader that tells the layout by the
modeling file beside the weights (plumbing/raven.py) must read config.json instead when written_by_nanorecur().

    python -m pytest -q tests/test_hf_remote.py
"""

import os

MARKER = "nanorecur remote code"  # within the first 200 characters of every file written
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# format -> (the files, by their path in the repository; the config.json entries that point transformers at them)
# model.py: the model, which the modeling files import, with the two files it imports; diffusion.py with what it
# imports: generate's diffusion sampler
NANORECUR = ("plumbing/hf/modeling_nanorecur.py", "model.py", "exit_gate.py", "per_loop.py", "diffusion.py",
             "kv_cache.py")
FORMATS = {
    "nanorecur": (NANORECUR, {"auto_map": {
        "AutoConfig": "modeling_nanorecur.NanorecurConfig",
        "AutoModelForCausalLM": "modeling_nanorecur.NanorecurForCausalLM"}}),
    "raven": (("plumbing/hf/raven_config_minimal.py", "plumbing/hf/raven_modeling_minimal.py", *NANORECUR),
              {"auto_map": {
        "AutoConfig": "raven_config_minimal.RavenConfig",
        "AutoModelForCausalLM": "raven_modeling_minimal.RavenForCausalLM"}}),
}  # fmt: skip


def remote_code_files(fmt="nanorecur"):
    """{file name: bytes} of the modeling code for `fmt` ("nanorecur" or "raven"), for a caller that writes and
    hashes the files itself (plumbing/checkpoint.py)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown checkpoint format {fmt!r}: choose from {', '.join(FORMATS)}")
    out = {}
    for path in FORMATS[fmt][0]:
        with open(os.path.join(REPO, path), "rb") as f:
            out[os.path.basename(path)] = f.read()
    return out


def remote_code_config(fmt="nanorecur"):
    """The entries to merge into config.json (a fresh dict: {"auto_map": {...}})."""
    return {k: dict(v) for k, v in FORMATS[fmt][1].items()}


def write_remote_code(out_dir, fmt="nanorecur"):
    """Write the modeling files into out_dir (each via temp file + rename) and return the config.json entries
    ({"auto_map": ...}) to merge into the config; config.json itself is left to the caller."""
    os.makedirs(out_dir, exist_ok=True)
    for name, data in remote_code_files(fmt).items():
        path = os.path.join(out_dir, name)
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
    return remote_code_config(fmt)


def written_by_nanorecur(path):
    """True if the modeling file at `path` is one of ours (it opens with MARKER)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return MARKER in f.read(200)
