"""
One place decides processes, device and precision for training: torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE) or one process; bf16 autocast with fp32 master weights on CUDA, plain fp32 on
CPU. The same code path runs at world size 1 and on CPU (train.py never asks which one it is in, except
to wrap the model in DistributedDataParallel and to average the loss it prints).

    python train.py --device cpu ...                                     # one process
    torchrun --standalone --nproc_per_node=8 train.py --config config/llama_4_6_4.json
    torchrun --standalone --nproc_per_node=2 train.py --device cpu ...   # gloo, as tests/test_train.py does
"""

import contextlib
import os

import torch
import torch.distributed as dist


def setup(device="auto"):
    """Returns (ddp, rank, world, device, autocast). device: auto (cuda when available) | cpu | cuda | cuda:N;
    under torchrun each rank takes cuda:LOCAL_RANK (nccl), or the CPU (gloo) with --device cpu."""
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
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else contextlib.nullcontext()
    return ddp, rank, world, dev, autocast
