"""
A model directory, the format every script reads and writes (surgery.py, train.py's saves, --init DIR):

    model.safetensors   our tensor names (a tied head left out: safetensors refuses one storage twice)
    config.json         model_type "nanorecur", every RecurrentConfig field, and auto_map for transformers
    modeling_nanorecur.py, model.py   the remote code transformers runs, written by plumbing/hf_remote.py

so that RecurrentGPT.from_pretrained(dir) and AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)
both load it. Nothing here unpickles: safetensors and JSON only.

    python surgery.py --init=smollm2 --shape 4,6,4 --out out/smollm2    # writes one
    python -c "from model import RecurrentGPT; print(RecurrentGPT.from_pretrained('out/smollm2').config)"
"""

import json
import math
import os
from dataclasses import asdict, fields

from plumbing.cli import read_json
from plumbing.finite import check_finite
from plumbing.hf_remote import write_remote_code

# config.json keys that are not model fields: ours ("train": the run) and those transformers reads or writes
HF_KEYS = ("model_type", "train", "auto_map", "architectures", "transformers_version", "dtype", "torch_dtype")


def save(model, out_dir, extra_config=None):
    """RecurrentGPT.save_pretrained: out_dir/model.safetensors and out_dir/config.json, each via temp file + rename,
    so a crash leaves either the old file or the new one, never half of one; the modeling file first, so the
    config never names one that is not there."""
    from safetensors.torch import save_file

    extra_config = {**write_remote_code(out_dir), **(extra_config or {})}  # makes out_dir too
    path = os.path.join(out_dir, "model.safetensors")
    save_file(model.state_dict_to_save(), path + ".tmp", metadata={"format": "pt"})
    os.replace(path + ".tmp", path)
    cfg = {"model_type": "nanorecur", **asdict(model.config), **extra_config}
    write_json_atomic(os.path.join(out_dir, "config.json"), cfg)


def load(cls, path, device="cpu", **overrides):
    """RecurrentGPT.from_pretrained: a directory written by save(), built as `cls` (RecurrentGPT, passed in so
    that this file imports no model); overrides replace config fields. Every problem
    is a one-line FileNotFoundError or ValueError that says what to do."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"{path} has no config.json: pass a directory written by surgery.py or train.py")
    cfg = read_json(cfg_path)
    if cfg.get("model_type") != "nanorecur":
        raise ValueError(f"{path} is a {cfg.get('model_type')!r} checkpoint, not one of ours: load it with "
                         "surgery.load_model (every script's --init does)")
    config = config_from_dict(cls.config_class, cfg, **overrides)
    try:
        sd = load_file(os.path.join(path, "model.safetensors"))
    except (FileNotFoundError, SafetensorError, OSError) as err:
        raise ValueError(f"cannot read {path}/model.safetensors ({err}): rerun surgery.py or restore it") from None
    check_finite(sd, f"{path}/model.safetensors")
    try:
        return cls.from_state_dict(config, sd, device)
    except ValueError as err:
        raise ValueError(f"{path}/model.safetensors: {err}") from None


def config_from_dict(config_class, cfg, **overrides):
    """A config_class (RecurrentConfig) from a config.json dict; keys that are not its fields are an error, except two
    that older saves carry at the values that made them no-ops (state_scale = embed_scale, no iter_norm)."""
    names = {f.name for f in fields(config_class)}
    cfg = {k: v for k, v in {**cfg, **overrides}.items() if k not in HF_KEYS}
    if cfg.get("iter_norm") is False:
        del cfg["iter_norm"]
    if "state_scale" in cfg and math.isclose(cfg["state_scale"], cfg.get("embed_scale", 1.0)):
        del cfg["state_scale"]
    unknown = sorted(set(cfg) - names)
    if unknown:
        raise ValueError(f"unknown config keys {unknown}: this config.json was not written by nanorecur")
    return config_class(**cfg)


def write_json_atomic(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
