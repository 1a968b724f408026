"""
Model surgery: turn a pretrained decoder into a recurrent one (McLeish et al. 2025, arXiv 2511.07384, §3).

The parent's first P layers become the prelude, its last C layers the coda, and the R layers just
before the coda the recurrent core; the layers in between are dropped. A new adapter
Linear(2h -> h) joins the state and the prelude's output before every loop; at [0 | I] it passes
e through, so r=1 (indeed any r) reproduces the layer-dropped parent exactly, which this script
checks after writing. --static keeps the same layers and runs them once (the non-recurrent
baseline; a shape that adds up to the parent's layers, e.g. 4,8,4 of 16, keeps the whole parent).
--first_loop identity feeds loop 1 the prelude's output itself and the adapter acts from loop 2 on
(arXiv 2608.11233's identity-preserving single-loop path): with every layer kept (the last command
below, SmolLM2's 30 layers) the model at r = 1 is the parent, bit for bit, whatever the adapter learns.

    python surgery.py --init=smollm2 --shape 6,8,6 --out out/smollm2          # offline, CPU
    python surgery.py --init=llama --shape 4,6,4 --out out/llama_4_6_4        # Llama-3.2-1B from the hub
    python surgery.py --init=path/to/hf_dir --layers 0-3,6-11,12-15 --out out/x
    python surgery.py --init=smollm2 --layers 0-13,14-15,16-29 --first_loop identity --out out/in_place
    python surgery.py --export-raven out/llama_4_6_4 out/llama_raven          # the published "raven" format

--init takes a short name (tinyllama, llama, olmo, qwen, smollm2), a hub id, a local directory in
the hub's layout, or a .gguf file; plumbing/parents.py reads it, and families.py is the table of what
differs between the parent families. The other scripts' --init goes through load_model below, which
takes our checkpoints and raven ones as well as a parent.
"""

import argparse
import dataclasses
import json
import os
import shutil
import sys

import torch

from plumbing import checkpoint
from plumbing.cli import Parser, int_list, read_json
from plumbing.hub import CheckpointError, checkpoint_revision, resolve_checkpoint
from plumbing.model_card import parent_license, write_model_card
from plumbing.parents import SurgeryError, load_parent
from plumbing.run_dir import tokenizer_source, trained_on
from plumbing.upload import check_push, push_to_hub
from model import RecurrentConfig, RecurrentGPT

TOLERANCE = 1e-4  # max abs logit difference allowed by the self-check (fp32)


# -----------------------------------------------------------------------------
# layer selection


def select_layers(n_layers, shape):
    """The paper's rule: prelude = first P, coda = last C, core = the R layers just before the coda."""
    P, R, C = shape
    if min(shape) < 1:
        raise SurgeryError(f"shape {P},{R},{C} has an empty part: prelude, core and coda need >= 1 layer each")
    if P + R + C > n_layers:
        raise SurgeryError(f"shape {P},{R},{C} needs {P + R + C} layers but the parent has {n_layers}: shrink the shape")
    return {"prelude": list(range(P)), "core": list(range(n_layers - C - R, n_layers - C)),
            "coda": list(range(n_layers - C, n_layers))}  # fmt: skip


def parse_layers(spec, n_layers):
    """'0-3,6-11,12-15' -> the layer map, checked against the parent."""
    parts = spec.split(",")
    if len(parts) != 3:
        raise SurgeryError(f"--layers {spec!r} must give three ranges, prelude,core,coda, like 0-3,6-11,12-15")
    out = {}
    for name, part in zip(("prelude", "core", "coda"), parts):
        try:
            a, _, b = part.partition("-")
            out[name] = list(range(int(a), int(b or a) + 1))
        except ValueError:
            raise SurgeryError(f"--layers: cannot read {part!r} as a layer range like 6-11") from None
        if not out[name]:
            raise SurgeryError(f"--layers: the {name} range {part!r} is empty")
    flat = out["prelude"] + out["core"] + out["coda"]
    if len(set(flat)) != len(flat) or flat != sorted(flat):
        raise SurgeryError(f"--layers {spec!r}: ranges overlap or are out of order")
    if flat[-1] >= n_layers:
        raise SurgeryError(f"--layers {spec!r}: layer {flat[-1]} does not exist, the parent has {n_layers} (0-{n_layers - 1})")
    return out


# -----------------------------------------------------------------------------
# the surgery


def build(fields, sd, layers, recurrent=True, untie=False, **overrides):
    """A RecurrentGPT whose blocks are copies of the parent's layers `layers` (HF names in sd)."""
    config = RecurrentConfig(**{**fields, **overrides}, recurrent=recurrent, layers=layers,
                             n_prelude=len(layers["prelude"]), n_core=len(layers["core"]), n_coda=len(layers["coda"]))  # fmt: skip
    if untie and config.tie_embeddings:
        config.tie_embeddings = False  # the published retrofits untie: lm_head starts as a copy of the embedding
        sd = {**sd, "lm_head.weight": sd["model.embed_tokens.weight"].clone()}
    model = RecurrentGPT(config)
    new = {"embed_tokens.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"]}
    if not config.tie_embeddings:
        new["lm_head.weight"] = sd["lm_head.weight"]
    for part, idxs in layers.items():
        for j, i in enumerate(idxs):
            prefix = f"model.layers.{i}."
            for k, v in sd.items():
                if k.startswith(prefix):
                    new[f"{part}.{j}.{k[len(prefix):]}"] = v
    target = {k: v for k, v in model.state_dict().items() if not k.startswith("adapter.")}
    if config.tie_embeddings:
        target.pop("lm_head.weight")
    missing, extra = sorted(set(target) - set(new)), sorted(set(new) - set(target))
    if missing or extra:
        raise SurgeryError(f"parent weights do not match the model: missing {missing[:4]}, unexpected {extra[:4]}")
    for k, v in new.items():
        if v.shape != target[k].shape:
            raise SurgeryError(f"parent tensor {k} has shape {tuple(v.shape)}, the config says {tuple(target[k].shape)}")
    model.load_state_dict(new, strict=False)  # strict=False: only the adapter keeps its fresh init
    return model


def cut(src, shape=(4, 6, 4), layers=None, static=False, untie=False, init=None, **config_overrides):
    """Load the parent at the local path `src` (a hub-layout dir or a .gguf) and cut it: the layers by
    `layers` ("0-3,6-11,12-15") or else by `shape`; shape=None keeps every layer (prelude 1, core n-2,
    coda 1). static=True takes the same layers (the same rule, the same checks) and runs them once: no
    loop, no adapter. `init` is what the user named, recorded in config.parent."""
    fields, n_layers, sd = load_parent(src)
    shape = shape or (1, n_layers - 2, 1)
    layer_map = parse_layers(layers, n_layers) if layers else select_layers(n_layers, shape)
    model = build(fields, sd, layer_map, recurrent=not static, untie=untie, **config_overrides)
    parent = {"init": init or src, "n_layers": n_layers, **checkpoint_revision(src)}
    fingerprint = trained_on(src)  # a static parent of ours trained on a task's own vocabulary: its data's
    if fingerprint:
        parent["data_fingerprint"] = fingerprint
    lic = parent_license(parent)  # recorded now, while the parent's own files are at hand (the model card reads it)
    if lic["license"] != "unknown":
        parent["license"] = {k: lic[k] for k in ("license", "license_name", "license_link") if lic[k]}
    model.config.parent = parent
    return model


def retrofit(init, shape=(4, 6, 4), layers=None, static=False, untie=False, **config_overrides):
    """Resolve `init` (plumbing.hub: short name, hub id, hub-layout dir or .gguf), load the parent and cut
    it (see cut). Returns (model, src), src being the local parent path."""
    src = resolve_checkpoint(init)
    return cut(src, shape, layers, static, untie, init=init, **config_overrides), src


@torch.no_grad()
def self_check(model, n_tokens=32, r_values=(1, 4)):
    """Max abs logit difference between the recurrent model (identity adapter, r=1 and r=4) and the
    layer-dropped parent: a static model holding the same kept layers in order."""
    c = model.config
    # the static model is built around the same tensors (no copy: a 1B parent fits the memory once)
    shared = {k: v for k, v in model.state_dict().items() if not k.startswith("adapter.")}
    static = RecurrentGPT.from_state_dict(RecurrentConfig(**{**vars(c), "recurrent": False}), shared)
    idx = torch.randint(0, c.vocab_size, (1, n_tokens), generator=torch.Generator().manual_seed(0))
    ref, _ = static.eval()(idx)
    saved = model.adapter.weight.clone()
    model.reset_adapter("identity")  # the check is about the cut, whatever adapter init the user asked for
    try:
        return max((model.eval()(idx, num_steps=r)[0] - ref).abs().max().item() for r in r_values)
    finally:
        model.adapter.weight.copy_(saved)


def write_checkpoint(model, src, out_dir, command=None):
    """Weights + config.json + the parent's tokenizer files, so every script can load out_dir, and the
    model card (README.md) that says what it is."""
    from plumbing.tokenizer import save_tokenizer_files

    model.save_pretrained(out_dir)
    if tokenizer_source(src) is not None:  # a parent trained on a task's own vocabulary has none
        save_tokenizer_files(src, out_dir)
    with open(os.path.join(out_dir, "config.json")) as f:
        write_model_card(out_dir, json.load(f), command)


def load_model(init, device="cpu", shape=None, layers=None, static=False, untie=False, **config_overrides):
    """What every script's --init goes through. Returns (model, path for load_tokenizer). In order:
      1. a directory with a config.json is read as it is; anything else is resolved by plumbing.hub
         (a short name, a hub id, a .gguf file, a directory holding one .gguf);
      2. config.json model_type "nanorecur": one of ours (RecurrentGPT.from_pretrained);
      3. model_type "huginn_raven": a raven checkpoint, Huginn or a published retrofit (plumbing.raven);
      4. anything else is a parent (hub-layout dir or .gguf), cut by `layers` or `shape`, `static` and
         `untie` as in retrofit. shape=None keeps every layer, and with the default identity adapter
         the model equals the parent at any r.
    shape, layers, static and untie describe a cut and apply to parents only: a checkpoint of cases 2
    and 3 is cut already. config_overrides replace config fields in every case (state_init="zero", ...)."""
    src = init if os.path.isfile(os.path.join(init, "config.json")) else resolve_checkpoint(init)
    if os.path.isdir(src):
        model_type = read_json(os.path.join(src, "config.json")).get("model_type")
        if model_type == "nanorecur":
            return RecurrentGPT.from_pretrained(src, device=device, **config_overrides), src
        if model_type == "huginn_raven":
            from plumbing.raven import load_raven

            return load_raven(src, device=device, **config_overrides), src
    model = cut(src, shape, layers, static, untie, init=init, **config_overrides)
    return model.to(device), src


def cut_not_applied(model, init, shape=None, layers=None, static=False):
    """A line saying which of a cut's flags (--shape, --layers, --static) load_model did not apply because `init`
    was cut already (one of ours or a raven checkpoint), or None when the model has the cut they ask for. A
    config file's shape, meant for a run from scratch, would otherwise pass unseen."""
    c = model.config
    have = (c.n_prelude, c.n_core, c.n_coda)
    asked = []
    if layers:
        n_layers = (c.parent or {}).get("n_layers")
        if not n_layers or c.layers != parse_layers(layers, n_layers):
            asked.append(f"--layers {layers}")
    elif shape and tuple(shape) != have:
        asked.append(f"--shape {','.join(map(str, shape))}")
    if static and c.recurrent:
        asked.append("--static")
    if not asked:
        return None
    kind = "recurrent" if c.recurrent else "static"
    return (f"{init} is cut already ({kind}, shape {','.join(map(str, have))}) and trains as it is: {' and '.join(asked)} "
            f"not applied (a new cut: python surgery.py --init PARENT --shape P,R,C --out DIR, then --init DIR)")


# -----------------------------------------------------------------------------


def export_atomic(src, out, command):
    """--export-raven: the raven files and the model card go to a temp directory beside out, which then replaces
    out in one rename: out appears complete or not at all (as the training saves, plumbing/run_dir.py)."""
    from plumbing.raven import export_raven, load_raven

    tmp, old = out.rstrip("/") + ".export.tmp", out.rstrip("/") + ".export.old"
    shutil.rmtree(tmp, ignore_errors=True)  # a stale one from an export that died
    try:
        export_raven(src, tmp)
        cfg = read_json(os.path.join(src, "config.json"))
        if cfg.get("model_type") == "huginn_raven":  # a raven source: the card reads our config's fields
            cfg = dataclasses.asdict(load_raven(src).config)
            origin = cfg.pop("parent") or {}  # Huginn was trained from scratch; a raven retrofit was cut from src
            cfg.update({"parent": {"init": src}} if origin.get("variant") != "huginn" else {})
        write_model_card(tmp, cfg, command, raven=True)
        if os.path.isdir(out):  # replace an earlier export whole, never mix its files with these
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init", help="short name, hub id, hub-layout directory or .gguf file")
    p.add_argument("--shape", default="4,6,4", help="P,R,C: prelude, recurrent core and coda layer counts")
    p.add_argument("--layers", default=None, help="explicit layer map, e.g. 0-3,6-11,12-15 (overrides --shape)")
    p.add_argument("--out", help="output checkpoint directory")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a checkpoint already in --out (a training run's saves there go with it)")
    p.add_argument("--static", action="store_true",
                   help="no loop: the same layers run once (the non-recurrent baseline; P+R+C = all layers keeps the whole parent)")
    p.add_argument("--adapter_init", default="identity", choices=["identity", "sum", "random"],
                   help="adapter on cat[s, e]: identity [0 | I] (r=1 is the layer-dropped parent), sum, or random")
    p.add_argument("--first_loop", default="adapter", choices=["adapter", "identity"],
                   help="what loop 1 feeds the core: the adapter on cat[s_0, e], or identity: e itself, the adapter "
                        "from loop 2 on (with every layer kept, r=1 is the parent)")
    p.add_argument("--state_init", default="normal", choices=["normal", "zero", "embed"],
                   help="s_0: truncated normal (Huginn), zeros, or the prelude output e")
    p.add_argument("--untie", action="store_true", help="untie the output head (as the published retrofits do)")
    p.add_argument("--mean_recurrence", type=int, default=4, help="default r when a script does not give one")
    p.add_argument("--export-raven", nargs=2, metavar=("DIR", "OUT"), help="write checkpoint DIR in the raven format")
    p.add_argument("--push_to_hub", default="", metavar="REPO_ID", help="then upload --out (or the raven OUT) to this hub repo")
    p.add_argument("--private", action="store_true", help="with --push_to_hub: create the repo private")
    args = p.parse_args(argv)
    command = ["python", "surgery.py", *(sys.argv[1:] if argv is None else argv)]
    try:
        if args.push_to_hub:  # a bad id, offline or no login: said now, before the work
            check_push(args.push_to_hub, args.export_raven[1] if args.export_raven else args.out)
        if args.export_raven:
            export_atomic(*args.export_raven, command)
            print(f"wrote {args.export_raven[1]} (raven format)")
            push(args, args.export_raven[1])
            return 0
        if not args.init or not args.out:
            p.error("--init and --out are required")
        shape = tuple(int_list(args.shape, "--shape", n=3))
        existing = [n for n in ("model.safetensors", "config.json") if os.path.lexists(os.path.join(args.out, n))]
        if existing and not args.overwrite:
            raise SurgeryError(f"--out {args.out} already holds a checkpoint ({' and '.join(existing)}): pass "
                               f"--overwrite to replace it, or choose another --out")
        run_lock = checkpoint.lock(args.out) if existing else None  # noqa: F841 (not while a training run owns it)
        print(f"surgery: init={args.init} shape={args.shape} layers={args.layers} static={args.static}")
        model, src = retrofit(args.init, shape, layers=args.layers, static=args.static, untie=args.untie,
                              adapter_init=args.adapter_init, first_loop=args.first_loop, state_init=args.state_init,
                              mean_recurrence=args.mean_recurrence)  # fmt: skip
        if existing:  # a training run's links would point past the new files at its old saves
            checkpoint.remove_run(args.out)
        write_checkpoint(model, src, args.out, command)
        counts = model.param_counts()
        print(f"layers: {json.dumps(model.config.layers)}")
        print("params: " + ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in counts.items()))
        if model.config.recurrent:
            del model  # check what was written, not what is in memory, holding one copy at a time
            diff = self_check(RecurrentGPT.from_pretrained(args.out))
            print(f"self-check: identity adapter at r=1 and r=4 vs the layer-dropped parent: max abs logit diff {diff:.2e}")
            if not diff <= TOLERANCE:
                raise SurgeryError(f"self-check FAILED: max abs logit diff {diff:.2e} > {TOLERANCE:.0e}; {args.out} is wrong")
        else:  # nothing to compare: a static model is the layer-dropped parent itself
            print("self-check: none for a static model (no loop, no adapter: it is the layer-dropped parent itself)")
        print(f"wrote {args.out}")
        push(args, args.out)
        return 0
    except (SurgeryError, CheckpointError, FileNotFoundError, ValueError, checkpoint.RunDirError) as err:
        print(f"surgery.py: error: {err}", file=sys.stderr)
        return 1


def push(args, out_dir):
    if args.push_to_hub:
        print(f"pushed {out_dir} to {push_to_hub(out_dir, args.push_to_hub, private=args.private)}")


if __name__ == "__main__":
    sys.exit(main())
