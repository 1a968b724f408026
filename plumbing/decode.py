"""
The decode-time layout of a model on the CPU (sample.py calls matvec_layout before decoding): the same weights,
packed and transposed, their products of one row through numpy's BLAS. Only the speed of a decode step changes
(bench/bench_sample.py section 1 times it); the model's own code (model.py) knows nothing of it.

    python bench/bench_sample.py       # decode tok/s with and without this layout
    python -m pytest -q tests/test_sample.py -k matvec
"""

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


class Matvec:
    """x W^T + b for decoding on the CPU. One row at a time (a decode step at batch 1) is a matrix-vector product,
    bound by reading W, and numpy's BLAS (OpenBLAS) reads it faster than torch's MKL does on this AMD CPU: a whole
    SmolLM2 decode 1.20-1.26x faster (bench/bench_sample.py section 1, the row with torch's products). Every other
    call (more rows, a gradient, autocast, a compiled graph, another dtype) goes to F.linear. The numpy array is a
    view of W's own memory: no copy, and in-place writes to W reach it. Plain Python, not a module: nothing in the
    state dict."""

    def __init__(self, weight, bias=None):
        self.weight, self.bias = weight, bias
        self.wt = weight.detach().t().numpy() if weight.dtype == torch.float32 and weight.device.type == "cpu" else None

    def __call__(self, x):
        # is_compiling first: traced by torch.compile, the size test would guard on a symbolic shape
        if (not torch.compiler.is_compiling() and self.wt is not None and x.numel() == x.shape[-1]
                and x.dtype == torch.float32 and not x.requires_grad and not torch.is_grad_enabled()
                and not torch.is_autocast_enabled("cpu")):
            y = torch.from_numpy(x.reshape(-1).numpy() @ self.wt)  # (out,)
            if self.bias is not None:
                y += self.bias
            return y.view(*x.shape[:-1], -1)
        return F.linear(x, self.weight, self.bias)


def matvec_layout(model):
    """The decode-time weight layout on the CPU, in place: the same values and shapes, other strides, and the products
    of one row through numpy's BLAS (Matvec). A decode step is matrix-vector work, bound by reading the weights:
    - q, k and v of every attention, and gate and up of every MLP, packed into one matrix each (PackedAttention.qkv,
      PackedMLP.gate_up: the model's modules switched to these subclasses), so a layer runs 4 matmuls instead of 7:
      fewer dispatches and longer rows for the kernel. The parameters become views into the packed matrix: one
      storage, no second copy, and whatever writes the parameters in place writes the packed matrix too. Used only
      where no gradient is taken (a forward with grad goes through the parameters, so autograd sees them);
    - every weight stored transposed, strides (1, out): OpenBLAS's matrix-vector product reads W^T row-major
      faster than the loaded layout on every shape of SmolLM2 (one thread, 30 cold matrices each);
    - every Linear's forward, and the packed matrices, a Matvec, with numpy's BLAS on one thread (threadpoolctl):
      torch's OpenMP workers spin between ops, and OpenBLAS's own threads beside them fought over the cores
      (2 threads each: a decode step ~10x slower, bench/bench_sample.py --threads 2).
    bench/bench_sample.py section 1 times the decoder with and without it; results agree to fp32 rounding
    (tests/test_sample.py). Explicit, and the last step before decoding (sample.py main() calls it on the CPU): it
    changes the caller's tensors, and the numpy views stay on the memory they were made on (no .to() after it).
    Returns the model."""
    from threadpoolctl import threadpool_limits  # here: only a CPU decode needs it

    threadpool_limits(1, user_api="blas")
    with torch.no_grad():
        for mod in model.modules():
            # the class swap keeps every parameter, buffer and name: the state dict is the same
            if type(mod) is recurrent.Attention and not mod.qk_norm:  # OLMo-2 norms q and k before RoPE
                mod.__class__, mod.qkv = PackedAttention, Matvec(*_pack((mod.q_proj, mod.k_proj, mod.v_proj)))
            if type(mod) is recurrent.MLP:
                mod.__class__, mod.gate_up = PackedMLP, Matvec(*_pack((mod.gate_proj, mod.up_proj)))
        for mod in model.modules():  # after packing: packed views are transposed already, a Matvec views them
            if isinstance(mod, torch.nn.Linear):
                if mod.weight.is_contiguous():  # a tied weight is seen twice: transposed once
                    mod.weight.data = mod.weight.data.t().contiguous().t()  # (out, in), stride (1, out)
                mod.forward = Matvec(mod.weight, mod.bias)  # an instance attribute: nn.Module calls self.forward
    return model


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
