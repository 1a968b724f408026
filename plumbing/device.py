"""
One place decides processes, device and precision: torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE)
or one process (train.py), and the dtype the matrix products run in (--autocast of train.py, sample.py and
eval_math.py): bf16 autocast with fp32 master weights, or plain fp32.

- auto, train.py (train_precision): bf16 on CUDA and on a CPU that multiplies bf16 natively (cpu_bf16: the
  avx512_bf16 or AMX instructions, as torch reports them; there a bf16 matmul is ~4x an fp32 one), fp32 on
  any other CPU, where bf16 is emulated and slower. Muon's Newton-Schulz follows the same choice.
- auto, sample.py and eval_math.py (autocast_context): bf16 on CUDA, fp32 on every CPU. Decoding one token
  is a matrix-vector product, bound by memory and run on numpy's fp32 BLAS (plumbing/decode.py), and the
  depth evaluation's figures stay comparable across machines.
- bf16: on any device (the CPU too, to rehearse the GPU's numerics); off: fp32 everywhere.

The same code path runs at world size 1 and on CPU (train.py never asks which one it is in, except to
wrap the model in DistributedDataParallel and to average the loss it prints).

    python train.py --device cpu ...                                     # one process, precision auto
    python train.py --device cpu --autocast off ...                      # fp32, whatever the CPU
    torchrun --standalone --nproc_per_node=8 train.py --config config/llama_4_6_4.json
    torchrun --standalone --nproc_per_node=2 train.py --device cpu ...   # gloo, as tests/test_train.py does
"""

import contextlib
import os
import sys

import torch
import torch.distributed as dist


AUTOCAST = ("auto", "bf16", "off")  # the --autocast choices of train.py, sample.py and eval_math.py


def cpu_bf16():
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 dot products or AMX tiles), as torch's CPU
    dispatch reports it (the same checks that pick oneDNN's bf16 kernels)."""
    cpu = torch.cpu
    return any(getattr(cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def train_precision(device, choice="auto"):
    """(precision, why): what train.py trains in, "bf16" (autocast, fp32 master weights) or "fp32", and the
    reason in words, printed at the start and recorded in the run (config.json and log.jsonl under "run")."""
    if choice not in AUTOCAST:
        raise ValueError(f"autocast must be one of {', '.join(AUTOCAST)}, not {choice!r}")
    kind = torch.device(device).type
    if choice != "auto":
        return ("bf16", "--autocast bf16") if choice == "bf16" else ("fp32", "--autocast off")
    if kind == "cuda":
        return "bf16", "auto: CUDA"
    if kind == "cpu" and cpu_bf16():
        return "bf16", "auto: this CPU multiplies bf16 natively (avx512_bf16 / amx)"
    return "fp32", f"auto: this {kind.upper()} has no native bf16 products"


def precision_context(device, precision):
    """The context a training forward runs under for train_precision's "bf16" (autocast) or "fp32" (none)."""
    return autocast_context(device, "bf16" if precision == "bf16" else "off")


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


def setup(device="auto"):
    """Returns (ddp, rank, world, device). device: auto (cuda when available) | cpu | cuda | cuda:N; under
    torchrun each rank takes cuda:LOCAL_RANK (nccl), or the CPU (gloo) with --device cpu."""
    ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun
    if ddp:
        use_cuda = torch.cuda.is_available() and device in ("auto", "cuda")
        # torchrun's agent keeps one store across the group's restarts (--max-restarts): under a key of its own
        # attempt a restarted rank cannot read the address a rank of the dead attempt published (gloo would try it)
        store, rank, world = next(dist.rendezvous("env://"))
        attempt = dist.PrefixStore(f"attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", store=attempt, rank=rank, world_size=world)
        dev = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if use_cuda else "cpu")
        if use_cuda:
            torch.cuda.set_device(dev)
    else:
        rank, world = 0, 1
        dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    return ddp, rank, world, dev


def is_dtensor(t):
    """isinstance(t, DTensor) (a --fsdp parameter, plumbing/fsdp.py) without importing torch.distributed.tensor,
    a slow import for every process: a DTensor exists only once FSDP2 has imported that module."""
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
