"""
One place decides processes, device and precision: torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE)
or one process (train.py); bf16 autocast with fp32 master weights on CUDA, plain fp32 on CPU, for
train.py, sample.py and eval_math.py alike (autocast_context; --autocast bf16 forces it on the CPU too,
to rehearse the GPU's numerics; off: fp32 everywhere). The same code path runs at world size 1 and on CPU
(train.py never asks which one it is in, except to wrap the model in DistributedDataParallel and to
average the loss it prints).

    python train.py --device cpu ...                                     # one process
    python train.py --device cpu --autocast bf16 ...                     # bf16 autocast on the CPU
    torchrun --standalone --nproc_per_node=8 train.py --config config/llama_4_6_4.json
    torchrun --standalone --nproc_per_node=2 train.py --device cpu ...   # gloo, as tests/test_train.py does
"""

import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F


AUTOCAST = ("auto", "bf16", "off")  # the --autocast choices of train.py, sample.py and eval_math.py


def autocast_context(device, choice="auto"):
    """The precision a forward pass runs under, as a reusable context: bf16 autocast with the weights left
    fp32 (choice auto: on CUDA only; bf16: on any device, the CPU included), or none (plain fp32: auto on
    the CPU, off everywhere). device: a torch.device or its name ("cpu", "cuda:1")."""
    if choice not in AUTOCAST:
        raise ValueError(f"autocast must be one of {', '.join(AUTOCAST)}, not {choice!r}")
    kind = torch.device(device).type
    if choice == "bf16" or (choice == "auto" and kind == "cuda"):
        return torch.autocast(kind, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def setup(device="auto", autocast="auto"):
    """Returns (ddp, rank, world, device, autocast context). device: auto (cuda when available) | cpu | cuda |
    cuda:N; under torchrun each rank takes cuda:LOCAL_RANK (nccl), or the CPU (gloo) with --device cpu.
    autocast: a choice of AUTOCAST (autocast_context)."""
    ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun
    if ddp:
        use_cuda = torch.cuda.is_available() and device in ("auto", "cuda")
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        dev = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if use_cuda else "cpu")
        if use_cuda:
            torch.cuda.set_device(dev)
    else:
        rank, world = 0, 1
        dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    return ddp, rank, world, dev, autocast_context(dev, autocast)


def is_dtensor(t):
    """isinstance(t, DTensor) (a --fsdp parameter, plumbing/fsdp.py) without importing torch.distributed.tensor,
    ~1.5 s of every process's start: a DTensor exists only once FSDP2 has imported that module."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def compile_blocks(model, backend="inductor"):
    """--compile of train.py, sample.py and eval_math.py: torch.compile every block of the prelude, core and coda,
    in place (inductor: C++ on the CPU, Triton on CUDA). The blocks, not forward: the loop over r has a
    data-dependent length (a new r every step, an exit rule), so it stays Python and every loop calls the same
    compiled code; the blocks of one layout share their graphs (the weights are inputs, not constants).
    dynamic=True makes every size symbolic from the first call: the sequence (train rows cut to their labels,
    prompts), the batch (eval batches, rows leaving an adaptive exit) and the KV cache's length, one longer every
    decode token, would each cost a recompile otherwise, and past torch._dynamo.config.recompile_limit (8) dynamo
    runs eagerly without a word. Sizes of 1 (a decode step, one prompt), grad / no-grad / inference mode and a mask
    or none still get graphs of their own: a bounded few, whatever r (tests/test_compile.py counts them). The
    cache and the attention over it stay eager (model.attend_cached, wrapped here). The state dict keeps its names."""
    import model as recurrent  # here, not at the top: model's users import plumbing

    if not hasattr(recurrent.attend_cached, "_torchdynamo_disable"):  # once, however many models are compiled
        recurrent.attend_cached = torch.compiler.disable(recurrent.attend_cached)
    for block in (*model.prelude, *model.core, *model.coda):
        block.compile(backend=backend, dynamic=True)
    return model


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
    - q, k and v of every attention, and gate and up of every MLP, packed into one matrix each (Attention.qkv,
      MLP.gate_up), so a layer runs 4 matmuls instead of 7: fewer dispatches and longer rows for the kernel. The
      parameters become views into the packed matrix: one storage, no second copy, and whatever writes the
      parameters in place writes the packed matrix too. The model uses it only where no gradient is taken (a
      forward with grad goes through the parameters, so autograd sees them);
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
            if hasattr(mod, "qkv") and mod.qkv is None and not mod.qk_norm:  # OLMo-2 norms q and k before RoPE
                mod.qkv = Matvec(*_pack((mod.q_proj, mod.k_proj, mod.v_proj)))
            if hasattr(mod, "gate_up") and mod.gate_up is None:
                mod.gate_up = Matvec(*_pack((mod.gate_proj, mod.up_proj)))
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
