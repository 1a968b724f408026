"""
Weights that hold a NaN or an inf are refused where they are read, in one line that names the file and the
first such tensor. Used as they are, one poisoned matrix makes every logit NaN: an evaluation prints
accuracy 0.0 and exits 0, a training run takes NaN steps until its guard stops it (plumbing/guards.py).

Every loader calls check_finite on what it read: our model.safetensors (plumbing/pretrained.py), a parent's
safetensors files and its GGUF (plumbing/parents.py), a raven checkpoint (plumbing/raven.py), and a resume's
optimizer states, in train_state.pt or in a --fsdp save's shard files (plumbing/run_dir.py, plumbing/fsdp.py):
a NaN in a moment poisons the weights at the first step.

    python bench/bench_finite.py             # what the check costs against the load itself, on SmolLM2
    python -m pytest -q tests/test_finite.py
"""

import torch


def named_tensors(obj, prefix=""):
    """(name, tensor) for every tensor in obj: a tensor, or dicts and lists of them (an optimizer's state_dict),
    named by their path in it ("optimizers[0].state.3.exp_avg")."""
    if torch.is_tensor(obj):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from named_tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from named_tensors(v, f"{prefix}[{i}]")


def first_nonfinite(obj):
    """(name, what) of the first floating-point tensor of obj (named_tensors' order) that holds a NaN or an inf,
    what saying how many of each; None when there is none. A tensor's min and max are NaN when it holds a NaN
    and +-inf when it holds an inf: one pass over its bytes, without isfinite's boolean copy of the tensor."""
    for name, t in named_tensors(obj):
        t = t.to_local() if hasattr(t, "to_local") else t  # a --fsdp DTensor: this rank's rows
        if not t.is_floating_point() or t.numel() == 0:
            continue
        lo, hi = torch.aminmax(t.detach())
        if not (torch.isfinite(lo) and torch.isfinite(hi)):
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            return name, f"{nan} NaN and {inf} inf among its {t.numel()} values"
    return None


def poisoned(path, name, what):
    """The one line for a tensor `name` of path that is not finite (what: first_nonfinite's count)."""
    return (f"{path}: tensor {name} holds {what}: these weights are poisoned (a diverged run or a damaged file); "
            f"load an earlier checkpoint, or write or download this one again")


def check_finite(obj, path, error=ValueError):
    """Raise error (the loader's own one-line error type) when a tensor of obj, read from path, is not finite."""
    bad = first_nonfinite(obj)
    if bad is not None:
        raise error(poisoned(path, *bad))
