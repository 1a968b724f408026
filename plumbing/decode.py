"""
The decode-time layout of a model on the CPU (sample.py calls matvec_layout before decoding): the same weights,
packed and transposed, their products of one or a few rows through the kernel this machine runs fastest. Only the speed of
a decode step changes (bench/bench_sample.py section 1 times it); the model's own code (model.py) knows nothing of it.

Which kernel is fastest depends on the CPU and its libraries (numpy's OpenBLAS beat torch's MKL on one AMD CPU and
lost on an Intel one with AMX), so it is measured, not assumed: decode_kernel times the candidates on the model's
own matrix shapes once per machine (CPU, libraries, threads, shapes) and caches the choice in a JSON file, so that
one machine decodes one way and one seed gives one result there. The candidates, KERNELS:
- "numpy": the packed, transposed layout, each product of up to FEW_ROWS rows through numpy's BLAS (Matvec);
- "torch": the same layout, the products through torch's F.linear;
- "plain": the parameters as loaded, F.linear on each of q, k, v, gate, up apart (no layout at all).

    python bench/bench_sample.py --sections 1     # decode tok/s of every kernel beside transformers' generate
    python -m pytest -q tests/test_sample.py -k "matvec or kernel"
"""

import json
import os
import platform
import time

import torch
import torch.nn.functional as F

import model as recurrent


class PackedAttention(recurrent.Attention):
    """Attention whose projection is q, k and v as one product (qkv, a Matvec), the nh + nkv heads of q and k
    rotated in one pass: the same products as Attention.project in fewer ops. Only where no gradient is taken
    (autograd must see the parameters); OLMo-2's q/k norms come between the projection and the split, so it keeps
    Attention."""

    def project(self, x, rope):
        if torch.is_grad_enabled():
            return super().project(x, rope)
        B, T, _ = x.shape
        nh, nkv, hd = self.n_head, self.n_kv_head, self.head_dim
        qkv = self.qkv(x).view(B, T, nh + 2 * nkv, hd).transpose(1, 2)  # (B, nh + 2 nkv, T, hd)
        qk = recurrent.apply_rope(qkv[:, :nh + nkv], *rope)
        return qk[:, :nh], qk[:, nh:], qkv[:, nh + nkv:]


class PackedMLP(recurrent.MLP):
    """SwiGLU with gate and up as one product (gate_up, a Matvec), where no gradient is taken."""

    def forward(self, x):
        if torch.is_grad_enabled():
            return super().forward(x)
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


FEW_ROWS = 64  # up to this many rows a product is nearly bound by reading W: a decode step, diffusion.py's wave


class Matvec:
    """x W^T + b for decoding on the CPU. One row at a time (a decode step at batch 1) is a matrix-vector product,
    and a few rows (the positions of diffusion.py's wave, a short prompt) nearly one, bound by reading W; with kernel
    "numpy" they go through numpy's BLAS, which reads W faster than torch's on some CPUs (decode_kernel measures
    which). Every other call (more rows, a gradient, autocast, a compiled graph,
    another dtype) goes to F.linear. The numpy array is a view of W's own memory: no copy, and in-place writes to W
    reach it. Plain Python, not a module: nothing in the state dict."""

    def __init__(self, weight, bias=None, kernel="numpy"):
        self.weight, self.bias = weight, bias
        fp32_cpu = weight.dtype == torch.float32 and weight.device.type == "cpu"
        self.wt = weight.detach().t().numpy() if kernel == "numpy" and fp32_cpu else None

    def __call__(self, x):
        # is_compiling first: traced by torch.compile, the size test would guard on a symbolic shape
        if (not torch.compiler.is_compiling() and self.wt is not None and x.numel() <= FEW_ROWS * x.shape[-1]
                and x.dtype == torch.float32 and not x.requires_grad and not torch.is_grad_enabled()
                and not torch.is_autocast_enabled("cpu")):
            rows = x.reshape(-1, x.shape[-1]).numpy()
            y = torch.from_numpy(rows[0] @ self.wt if len(rows) == 1 else rows @ self.wt)  # (out,) or (n, out)
            if self.bias is not None:
                y += self.bias
            return y.view(*x.shape[:-1], -1)
        return F.linear(x, self.weight, self.bias)


def matvec_layout(model, kernel=None):
    """The decode-time weight layout on the CPU, in place: the same values and shapes, other strides, and the products
    of up to FEW_ROWS rows through `kernel` (one of KERNELS; None: decode_kernel's measured choice). A decode step is
    matrix-vector work, bound by reading the weights:
    - q, k and v of every attention, and gate and up of every MLP, packed into one matrix each (PackedAttention.qkv,
      PackedMLP.gate_up: the model's modules switched to these subclasses), so a layer runs 4 matmuls instead of 7:
      fewer dispatches and longer rows for the kernel. The parameters become views into the packed matrix: one
      storage, no second copy, and whatever writes the parameters in place writes the packed matrix too. Used only
      where no gradient is taken (a forward with grad goes through the parameters, so autograd sees them);
    - every weight stored transposed, strides (1, out): a matrix-vector product reads W^T row-major;
    - every Linear's forward, and the packed matrices, a Matvec, with numpy's BLAS on one thread (threadpoolctl):
      torch's OpenMP workers spin between ops, and OpenBLAS's own threads beside them fight over the cores.
    "plain" leaves the model as it is. Results agree to fp32 rounding whatever the kernel (tests/test_sample.py).
    Explicit, and the last step before decoding (sample.py main() calls it on the CPU): it changes the caller's
    tensors, and the numpy views stay on the memory they were made on (no .to() after it). Returns the model."""
    from threadpoolctl import threadpool_limits  # here: only a CPU decode needs it

    kernel = decode_kernel(model)["kernel"] if kernel is None else kernel
    if kernel not in KERNELS:
        raise ValueError(f"unknown decode kernel {kernel!r}: choose from {', '.join(KERNELS)}")
    if kernel == "plain":
        return model
    threadpool_limits(1, user_api="blas")
    with torch.no_grad():
        for mod in model.modules():
            # the class swap keeps every parameter, buffer and name: the state dict is the same
            if type(mod) is recurrent.Attention and not mod.qk_norm:  # OLMo-2 norms q and k before RoPE
                mod.__class__, mod.qkv = PackedAttention, Matvec(*_pack((mod.q_proj, mod.k_proj, mod.v_proj)), kernel)
            if type(mod) is recurrent.MLP:
                mod.__class__, mod.gate_up = PackedMLP, Matvec(*_pack((mod.gate_proj, mod.up_proj)), kernel)
        for mod in model.modules():  # after packing: packed views are transposed already, a Matvec views them
            if isinstance(mod, torch.nn.Linear):
                if mod.weight.is_contiguous():  # a tied weight is seen twice: transposed once
                    mod.weight.data = mod.weight.data.t().contiguous().t()  # (out, in), stride (1, out)
                mod.forward = Matvec(mod.weight, mod.bias, kernel)  # an instance attribute: nn.Module calls self.forward
    return model


# -----------------------------------------------------------------------------
# which kernel: measured once per machine, cached

KERNELS = ("numpy", "torch", "plain")


def kernel_cache_path():
    """The JSON file of measured choices: $NANORECUR_CACHE/decode_kernel.json, else under ~/.cache/nanorecur."""
    root = os.environ.get("NANORECUR_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "nanorecur")
    return os.path.join(root, "decode_kernel.json")


def machine_key(model):
    """What the choice depends on: the CPU (its name and vector flags), the libraries, the threads, the shapes."""
    cpu, flags = platform.processor(), ""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        cpu = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), cpu)
        flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    except OSError:
        pass
    vec = ",".join(sorted(f for f in flags.split() if f.startswith(("avx", "amx", "fma"))))
    import numpy

    shapes = sorted({tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)})
    return (f"{cpu} [{vec}] torch {torch.__version__} numpy {numpy.__version__} threads {torch.get_num_threads()} "
            f"shapes {shapes}")


def decode_kernel(model, remeasure=False):
    """The kernel for this model's few-row products on this machine: {"kernel", "ms" (a token's products at 1 and
    at 4 rows, per candidate), "cached" (True: read from kernel_cache_path(), no timing)}. Measured by time_kernels the first time a
    machine key is seen, then read back."""
    path, key = kernel_cache_path(), machine_key(model)
    try:
        with open(path) as f:
            known = json.load(f)
    except (OSError, ValueError):
        known = {}
    if key in known and not remeasure:
        return {**known[key], "cached": True}
    ms = time_kernels(model)
    known[key] = {"kernel": min(ms, key=ms.get), "ms": ms}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(known, f, indent=1)
    os.replace(path + ".tmp", path)
    return {**known[key], "cached": False}


def time_kernels(model, rounds=15, rows=(1, 4)):
    """ms for one token's products at r = 1 under each kernel, at one row plus at 4 rows (a decode step and a wave
    of the diffusion sampler), the median of `rounds`, the kernels in turn each round (load from other jobs hits all). Stand-in random weights of the model's shapes, as many layers' worth
    as the model has but not much more than the last-level cache holds twice over (so the weights stream from
    memory, as in decoding, and a 3.5B model does not copy itself); the prelude + core + coda's layers, the head."""
    c = model.config
    h, hd, I = c.n_embd, c.head_dim, c.intermediate_size
    layer = [(c.n_head * hd, h), (c.n_kv_head * hd, h), (c.n_kv_head * hd, h), (h, c.n_head * hd), (I, h), (I, h),
             (h, I)]  # q, k, v, o, gate, up, down: (out, in)
    per_layer = 4 * sum(o * i for o, i in layer)
    n_layers = max(1, min(c.n_prelude + c.n_core + c.n_coda, (2 * last_level_cache() + per_layer - 1) // per_layer))
    g = torch.Generator().manual_seed(0)
    plain = [[torch.randn(o, i, generator=g) for o, i in layer] for _ in range(n_layers)]
    head = torch.randn(c.vocab_size, h, generator=g)
    x = {(n, i): torch.randn(1, n, i, generator=g) for i in {i for _, i in layer} for n in rows}
    runs = {"plain": [(lambda w=w, n=n: F.linear(x[n, w.shape[1]], w)) for ws in plain for w in ws for n in rows]
            + [lambda n=n: F.linear(x[n, h], head) for n in rows]}
    for kernel in ("numpy", "torch"):
        prods = []
        for ws in plain:  # packed q|k|v and gate|up, transposed storage, as matvec_layout lays them out
            for group in (ws[0:3], ws[3:4], ws[4:6], ws[6:7]):
                m = Matvec(torch.cat(group).t().contiguous().t(), None, kernel)
                prods += [lambda m=m, n=n: m(x[n, m.weight.shape[1]]) for n in rows]
        m = Matvec(head.t().contiguous().t(), None, kernel)
        runs[kernel] = prods + [lambda m=m, n=n: m(x[n, h]) for n in rows]
    from threadpoolctl import threadpool_limits

    times = {k: [] for k in runs}
    with torch.inference_mode(), threadpool_limits(1, user_api="blas"):
        for _ in range(rounds):
            for k, prods in runs.items():
                t0 = time.perf_counter()
                for p in prods:
                    p()
                times[k].append(time.perf_counter() - t0)
    scale = (c.n_prelude + c.n_core + c.n_coda) / n_layers  # a token's layers, from the layers timed
    return {k: round(1000 * sorted(t)[len(t) // 2] * scale, 4) for k, t in times.items()}


def last_level_cache():
    """Bytes of the CPU's last-level cache (32 MiB where the system does not say)."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            size = f.read().strip()
        return int(size.rstrip("KMG")) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1], 1)
    except (OSError, ValueError):
        return 32 * 2**20


def _pack(linears):
    """One (sum of outs, in) weight, stored transposed, and the biases' concatenation (or None), for Linears
    on the same input; each Linear's parameters become views into them."""
    weight = torch.cat([lin.weight for lin in linears]).t().contiguous().t()
    bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])
    start = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = weight[start:start + n]
        if bias is not None:
            lin.bias.data = bias[start:start + n]
        start += n
    return weight, bias
