"""
The model card of a checkpoint directory: README.md with the Hugging Face hub's YAML front matter.

A retrofitted recurrent model (McLeish et al. 2025, arXiv 2511.07384) is only as useful as what is said
about its cut: which parent, at which revision, which of its layers became the prelude, the recurrent
core and the coda, which were dropped, how the adapter and s_0 start, and for a trained run what data it
saw. All of that is in config.json already ("layers", "parent", "train"); the card says it in prose. It is
a function of the saved config and the command (no timestamps, no file listing), so the same checkpoint
always gets the same bytes.

The parent's license (the card's `license:`) comes from, in order: what surgery recorded in
config["parent"]["license"]; the parent's own files when they are on this machine (a local dir's
README.md front matter, a GGUF's general.license); the table LICENSES of the hub ids this project
supports; else "unknown: see the parent's model card".

    python -m plumbing.model_card out/smollm2                 # print the card of a checkpoint dir
    python -m plumbing.model_card out/smollm2 --write         # write out/smollm2/README.md
    python -m pytest -q tests/test_model_card.py
"""

import argparse
import json
import math
import os
import re
import shlex
import sys
from pathlib import Path

from plumbing.hub import HUB_ID, SHORT_NAMES

HF = "https://huggingface.co"
# hub id (full match) -> (license id, license_name, license_link); license_name/link only for "other".
# Checked against each repo's model card for the families of plumbing/hub.py; anything else is "unknown".
LICENSES = [
    (r"HuggingFaceTB/SmolLM2-.+", ("apache-2.0", None, None)),
    (r"meta-llama/Llama-3\.2-(1B|3B)(-Instruct)?", ("llama3.2", None, None)),  # gated: accept it on the hub
    (r"TinyLlama/TinyLlama.+", ("apache-2.0", None, None)),
    (r"allenai/OLMo-2-.+", ("apache-2.0", None, None)),
    (r"Qwen/Qwen2\.5-(0\.5B|1\.5B|7B|14B|32B)(-Instruct)?", ("apache-2.0", None, None)),
    (r"Qwen/Qwen2\.5-3B(-Instruct)?", ("other", "qwen-research", f"{HF}/Qwen/Qwen2.5-3B/blob/main/LICENSE")),
    (r"Qwen/Qwen2\.5-72B(-Instruct)?", ("other", "qwen", f"{HF}/Qwen/Qwen2.5-72B/blob/main/LICENSE")),
]
LICENSE_NOTES = {  # what a license asks of whoever shares a derivative
    "llama3.2": "the Llama 3.2 Community License: a derivative must ship a copy of it (LICENSE beside the weights), "
                "say \"Built with Llama\", and keep Meta's Acceptable Use Policy; the parent is gated on the hub",
    "qwen-research": "the Qwen Research License: research and non-commercial use only",
    "qwen": "the Qwen License: commercial use above 100M monthly active users needs a license from Alibaba Cloud",
}
UNKNOWN = "unknown: see the parent's model card"
TOKEN = re.compile(r"((?:--|-)\w*token\w*[= ])\S+|hf_[A-Za-z0-9]{16,}", re.IGNORECASE)


# -----------------------------------------------------------------------------
# the parent: its hub id and its license


def parent_hub_id(parent):
    """The parent's hub id, when it has one: from the hub cache path (checkpoint_revision's hub_id), a short
    name, or an --init that is a hub id. None for a local dir or a user's own .gguf."""
    parent = parent or {}
    init = str(parent.get("init", ""))
    if parent.get("hub_id"):
        return parent["hub_id"]
    if init in SHORT_NAMES:
        return SHORT_NAMES[init]  # also the offline SmolLM2 GGUF: a quantization of that hub model
    if HUB_ID.match(init) and not os.path.exists(os.path.expanduser(init)) and not init.endswith(".gguf"):
        return init
    return None


def front_matter(text):
    """{key: value} of the flat `key: value` lines of a README's YAML front matter (between --- lines)."""
    m = re.match(r"---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    out = {}
    for line in (m.group(1).splitlines() if m else []):
        k, sep, v = line.partition(":")
        if sep and k.strip() and not k.startswith((" ", "-", "#")) and v.strip():
            out[k.strip()] = v.strip().strip("'\"")
    return out


def parent_license(parent):
    """{"license", "license_name", "license_link", "source"} of the parent described by config["parent"]."""
    parent = parent or {}
    recorded = parent.get("license")
    if isinstance(recorded, dict) and recorded.get("license"):
        return {"license_name": None, "license_link": None, "source": "recorded by surgery", **recorded}
    if isinstance(recorded, str) and recorded:
        return {"license": recorded, "license_name": None, "license_link": None, "source": "recorded by surgery"}
    path = Path(str(parent.get("path", ""))) if parent.get("path") else None
    if path is not None and path.is_dir() and (path / "README.md").is_file():
        fm = front_matter((path / "README.md").read_text(encoding="utf-8", errors="replace"))
        if fm.get("license"):
            return {"license": fm["license"], "license_name": fm.get("license_name"),
                    "license_link": fm.get("license_link"), "source": "the parent's README.md front matter"}
    if path is not None and path.is_file() and path.suffix == ".gguf":
        from plumbing.gguf import GGUFError, read_metadata

        try:
            lic = read_metadata(path).get("general.license")
        except (OSError, GGUFError):
            lic = None
        if isinstance(lic, str) and lic:
            return {"license": lic, "license_name": None, "license_link": None,
                    "source": "the parent GGUF's general.license"}
    hub_id = parent_hub_id(parent)
    for pattern, (lic, name, link) in LICENSES if hub_id else []:
        if re.fullmatch(pattern, hub_id):
            return {"license": lic, "license_name": name, "license_link": link,
                    "source": f"nanorecur's table for {hub_id}"}
    return {"license": "unknown", "license_name": None, "license_link": None, "source": None}


# -----------------------------------------------------------------------------
# the card


def spans(idxs):
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    out, idxs = [], sorted(idxs)
    for i in idxs:
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in out) or "none"


def yaml_value(v):
    """A plain YAML scalar when it is one unambiguously, else a JSON string (valid YAML)."""
    return v if re.fullmatch(r"[A-Za-z0-9][\w./-]*", v) and v not in ("yes", "no", "true", "false", "null") \
        else json.dumps(v)


def shown_command(command):
    """The command as one shell line, with any token value masked (a card is public)."""
    if command is None:
        return None
    text = command if isinstance(command, str) else shlex.join(str(a) for a in command)
    return TOKEN.sub(lambda m: (m.group(1) + "***") if m.group(1) else "hf_***", text)


def adapter_text(c):
    if not c.get("recurrent", True):
        return "none: static model (the core runs once, no loop, no adapter, no s_0)"
    exact = ", so at init r=1 (indeed any r) reproduces the layer-dropped parent exactly" if c.get("parent") else ""
    return {"identity": "Linear(2h -> h) on cat[s, e], initialized as [0 | I]: it passes e through and ignores "
                        f"the state{exact}",
            "sum": "Linear(2h -> h) on cat[s, e], initialized as (1/sqrt 2)[I | I]: (s + e) / sqrt 2",
            "random": "Linear(2h -> h) on cat[s, e], PyTorch's default (random) initialization",
            }.get(c.get("adapter_init"), f"Linear(2h -> h) on cat[s, e], init {c.get('adapter_init')!r}")


def state_text(c):
    if not c.get("recurrent", True):
        return None
    h, init = c.get("n_embd", 0), c.get("state_init")
    if c.get("first_loop") == "identity":  # model.init_state
        return "e, the prelude's output (no loop reads s_0: the first loop feeds the core e itself)"
    if init == "normal":
        std = c.get("state_std") or math.sqrt(2 / (5 * h))
        scale = f", times embed_scale {c['embed_scale']:g}" if c.get("embed_scale", 1.0) != 1.0 else ""
        formula = "" if c.get("state_std") else " = sqrt(2/(5h))"
        return f"random, truncated normal at 3 std, std {std:.4g}{formula}{scale}"
    return {"zero": "zeros", "embed": "e, the prelude's output"}.get(init, repr(init))


def training_lines(t):
    """The "Training" section of a trained run, from config["train"] (train.py's flags, step, fingerprint)."""
    run = t.get("run") or {}
    step, per_step = t.get("step"), run.get("tokens_per_step")
    lines = [f"- data: `{t.get('data')}`, fingerprint `{t.get('data_fingerprint')}`",
             f"- started from: `{t.get('init')}`"]
    if step is not None:
        lines.append(f"- steps: {step}" + (f" of max_iters {t['max_iters']}" if t.get("max_iters") else ""))
    if step is not None and per_step:
        lines.append(f"- tokens seen: {step * per_step:,} ({per_step:,} per step)")
    if t.get("optimizer"):
        lines.append(f"- optimizer: {t['optimizer']}, lr {t.get('learning_rate')} (AdamW part {t.get('adam_lr')}), "
                     f"warmup {t.get('warmup_iters')} steps, decay over the last {t.get('decay_frac')} of the run"
                     + (f", frozen: {t['freeze']}" if t.get("freeze", "none") != "none" else ""))
    if t.get("mean_recurrence") is not None:
        lines.append(f"- loops per step: r = Poisson(exp(tau)) + 1 around rbar {t['mean_recurrence']} (sigma "
                     f"{t.get('recurrence_sigma')}, curriculum {t.get('curriculum')}), backprop through the last "
                     f"{t.get('backprop_depth')} loops" + (", per-loop supervision (arXiv 2608.11233)"
                                                            if t.get("step_supervision") else ""))
    if run:
        lines.append(f"- run: git {run.get('git')}, torch {run.get('torch')}, {run.get('device')} x "
                     f"{run.get('world_size', 1)}, seed {t.get('seed')}")
    lines.append("- log.jsonl and loss.png, when present, hold the run's per-step log and its loss curve; the "
                 "run's full flags are in config.json under \"train\"")
    return lines


def model_card(config_dict, command=None, raven=False):
    """README.md text for a checkpoint with this config.json. command: the command line that made it (a
    string, or an argv list); None: config["train"]["command"] or config["command"] when recorded.
    raven=True: the directory holds the raven export (plumbing/raven.py) of the checkpoint config_dict."""
    c, parent, layers, train = config_dict, config_dict.get("parent") or {}, config_dict.get("layers"), \
        config_dict.get("train")
    command = shown_command(command if command is not None else (train or {}).get("command", c.get("command")))
    P, R, C = c.get("n_prelude"), c.get("n_core"), c.get("n_coda")
    recurrent, rbar = c.get("recurrent", True), c.get("mean_recurrence")
    hub_id, lic = parent_hub_id(parent), parent_license(parent)
    name = hub_id.split("/")[-1] if hub_id else (Path(str(parent["init"])).name if parent else "nanorecur")

    # 1. the front matter: what the hub indexes
    meta = [("license", lic["license"])]
    meta += [(k, lic[k]) for k in ("license_name", "license_link") if lic["license"] == "other" and lic.get(k)]
    if hub_id:
        meta.append(("base_model", hub_id))
    meta += [("library_name", "transformers" if raven or c.get("auto_map") else "nanorecur"),
             ("pipeline_tag", "text-generation")]
    tags = ["nanorecur", "recurrent-depth" if recurrent else "static-depth"] + (["retrofit"] if parent else [])
    out = ["---", *(f"{k}: {yaml_value(str(v))}" for k, v in meta), "tags:", *(f"- {t}" for t in tags), "---", ""]

    # 2. what it is
    kind = f"recurrent-depth model, shape (P,R,C) = ({P},{R},{C})" if recurrent else \
        f"static-depth baseline, layers ({P},{R},{C}) run once"
    out += [f"# {name} {P}-{R}-{C}{'' if recurrent else ' static'}", "",
            f"A {kind}" + (f", cut from {hub_id or parent.get('init')} with nanorecur (retrofitted recurrence, "
                           "McLeish et al. 2025, arXiv 2511.07384)" if parent else
                           ", trained from scratch with nanorecur (recurrent depth, Geiping et al. 2025, arXiv "
                           "2502.05171)") + ". The prelude runs "
            "once, the core" + ((f" r times (default r = {rbar}: {P} + {R}r + {C} = {P + R * rbar + C} layer "
                                 "applications)" if rbar else " r times") if recurrent else " once")
            + ", then the coda."
            + (" Stored in the raven format (config.json model_type huginn_raven)." if raven else ""), ""]

    # 3. the parent and the cut
    if parent:
        out += ["## Parent", "", f"- model: {hub_id or '(local)'}, as `--init {parent.get('init')}`"]
        if parent.get("commit"):
            out.append(f"- revision: commit `{parent['commit']}`")
        if isinstance(parent.get("sha256"), str):
            what = f"the GGUF {Path(str(parent.get('path', ''))).name}" + (f" of {parent['package']}"
                                                                          if parent.get("package") else "")
            out.append(f"- weights: dequantized to fp32 from {what}, sha256 `{parent['sha256']}`")
        elif isinstance(parent.get("sha256"), dict):
            out += [f"- weights: `{k}` sha256 `{v}`" for k, v in sorted(parent["sha256"].items())]
        if parent.get("n_layers"):
            out.append(f"- layers in the parent: {parent['n_layers']}")
        named = lic["license_name"] or lic["license"]
        out += [f"- license: {named if lic['license'] != 'unknown' else UNKNOWN}", ""]
    if layers:
        kept = [i for part in ("prelude", "core", "coda") for i in layers.get(part, [])]
        rows = [(part, layers.get(part, [])) for part in ("prelude", "core", "coda")]
        if parent.get("n_layers"):
            rows.append(("dropped", sorted(set(range(parent["n_layers"])) - set(kept))))
        out += ["## Layer map", "", "| part | parent layers | count |", "|---|---|---|",
                *(f"| {part} | {spans(idxs)} | {len(idxs)} |" for part, idxs in rows), ""]

    # 4. the recurrence
    out += ["## Recurrence", "", f"- shape (P,R,C): ({P},{R},{C}), width h = {c.get('n_embd')}",
            f"- adapter: {adapter_text(c)}"]
    if recurrent and c.get("first_loop") == "identity":
        out.append("- first loop: the core reads the prelude's output e itself, no adapter, which acts from loop 2 on "
                   "(arXiv 2608.11233's identity-preserving single-loop path): r=1 is the kept layers as they are")
    if state_text(c):
        out.append(f"- s_0: {state_text(c)}")
    if recurrent:
        out.append(f"- mean r (the default number of loops): {rbar}")
    out.append("")

    # 5. training, use, provenance, license
    if train:
        out += ["## Training", "", *training_lines(train), ""]
    use = ("Beside the raven_config_minimal.py / raven_modeling_minimal.py of the published code, load it with "
           "`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`; with nanorecur, any script's "
           "`--init dir` reads it.") if raven else \
        ("Clone nanorecur, download this repository into a directory, then `python sample.py --init DIR --r 8 "
         "--prompt \"...\"`, or in Python `RecurrentGPT.from_pretrained(DIR)` (model.py). More loops (--r) "
         "means more compute per token." + (" With transformers: `AutoModelForCausalLM.from_pretrained(repo_id, "
                                             "trust_remote_code=True)` runs the modeling_nanorecur.py and model.py "
                                             "beside the weights." if c.get("auto_map") else ""))
    out += ["## How to use", "", use, "", "## How it was made", ""]
    out += ["```", command, "```", ""] if command else ["The command was not recorded.", ""]
    out += ["## License", ""]
    if not parent:
        out.append("No parent: trained from scratch. Choose a license before sharing (`license: unknown` above).")
    elif lic["license"] == "unknown":
        out.append(f"The parent's license is {UNKNOWN}; this derivative is bound by it.")
    else:
        named = lic["license_name"] or lic["license"]
        note = LICENSE_NOTES.get(named)
        out.append(f"Inherited from the parent: {named}" + (f" ({lic['license_link']})" if lic.get("license_link")
                                                            else "") + f", found in {lic['source']}."
                   + (f" This is {note}." if note else ""))
    return "\n".join(out) + "\n"


def write_model_card(out_dir, config_dict, command=None, raven=False):
    """Write out_dir/README.md (via README.md.tmp + os.replace: a reader sees the old card or the new one).
    Returns its path."""
    path = os.path.join(out_dir, "README.md")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(model_card(config_dict, command, raven=raven))
    os.replace(path + ".tmp", path)
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="print (or write) the model card of a checkpoint dir",
                                 allow_abbrev=False)
    ap.add_argument("dir", help="checkpoint directory (surgery.py --out or train.py --out_dir)")
    ap.add_argument("--write", action="store_true", help="write DIR/README.md instead of printing it")
    ap.add_argument("--command", default=None, help="the command line that made it, for the card")
    args = ap.parse_args()
    try:
        with open(os.path.join(args.dir, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as err:
        sys.exit(f"error: cannot read {args.dir}/config.json: {err}")
    if args.write:
        print(f"wrote {write_model_card(args.dir, cfg, args.command)}")
    else:
        print(model_card(cfg, args.command), end="")
