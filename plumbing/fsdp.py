"""
Fully sharded data parallel for train.py --fsdp: each rank holds 1/world of the weights, gradients and
optimizer states, where under DDP every rank holds all of them.

DDP keeps on every rank the fp32 weights (4 bytes a parameter), their gradients (4) and the optimizer
states (Muon's momentum 4, AdamW's two moments 8): 12-16 bytes a parameter, ~128 GB for an 8B parent,
more than a GPU holds. ZeRO stage 3 (Rajbhandari et al. 2020, arXiv 1910.02054), here torch's FSDP2
(fully_shard), splits every tensor by rows over the ranks instead: a block's weights are all-gathered
just before its forward (and again for its backward) and freed after it, its gradients are
reduce-scattered so that each rank keeps the average of its own rows, and the optimizers step on those
rows (muon.py gathers each matrix onto one rank for Newton-Schulz). bench/recipe_costs.py prints what
that is in GB per GPU for the paper's recipes and an 8B parent.

    torchrun --standalone --nproc_per_node=8 train.py --config config/llama_4_6_4.json --fsdp
    torchrun --standalone --nproc_per_node=2 train.py --device cpu --fsdp ...   # gloo, as tests/test_fsdp.py
    python -m pytest -q tests/test_fsdp.py

What changes against DDP, for a reader of train.py:
- precision: under bf16 autocast (CUDA) the blocks' weights are gathered in bf16 (MixedPrecisionPolicy),
  and so is an untied head: the dtype autocast casts them to for every matmul anyway. The weights kept, the
  gradients and their reduction stay fp32, and so does the root (embedding, adapter, final norm), so that
  the residual stream starts in fp32 as it does under DDP. The blocks' norm weights are the one thing
  rounded to bf16.
- the looped core: every call of a core block gathers its weights again (r calls in a forward, k more in
  the backward), and each grad loop's share of its gradient is reduce-scattered on its own.
- gradient accumulation reduce-scatters after every micro-batch: DDP's no_sync would leave whole-size
  gradients on every rank, what --fsdp is there to avoid.
- evaluation and saves: every rank takes part (each holds a shard of the weights); the master alone
  logs, and writes the files of one process.
- checkpoints keep the run directory's rules (plumbing/checkpoint.py): a save is one ckpt/ directory,
  switched in by one rename, verified on resume. Its model.safetensors holds the whole fp32 weights,
  gathered onto the master, which every other script reads; the optimizer states stay sharded, written
  by every rank with torch.distributed.checkpoint (.metadata, __<rank>_0.distcp) into the same directory
  and listed with their sha256 in its manifest. A resume reads the weights from model.safetensors and the
  optimizer states with dcp.load, which would also reshard them for another world size.
"""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from plumbing import checkpoint, run_dir
from plumbing.checkpoint import RunDirError
from plumbing.finite import first_nonfinite, poisoned

DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of the shard files, written by rank 0


def check_flags(args):
    """One-line ValueErrors for --fsdp where it cannot run, before anything loads (train.py calls it under --fsdp)."""
    if int(os.environ.get("RANK", -1)) == -1:
        raise ValueError("--fsdp shards the model over the processes torchrun starts: run torchrun --standalone "
                         "--nproc_per_node=N train.py --fsdp ... (N = 1 works too)")
    if args.compile:  # ran once on CPU (2 gloo ranks, inductor), but on no GPU and in no test yet
        raise ValueError("--fsdp with --compile is not supported yet (not tested together): drop one of them")


def shard(model, device, precision="fp32"):
    """fully_shard each block and an untied head, then the root (embedding, adapter, final norm; a tied head
    is one parameter with the embedding), in place, over every rank on device's type. Each block moves to the
    device alone, so no rank ever holds the whole model there. precision: the run's, "bf16" (autocast) or
    "fp32" (plumbing/device.py train_precision); the blocks' weights are gathered in the dtype it computes in.
    Returns the model, whose parameters are now DTensors holding this rank's rows."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    dtype = torch.bfloat16 if precision == "bf16" else None
    # cast_forward_inputs=False: the stream enters each block in fp32, as under DDP's autocast
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    for block in (*model.prelude, *model.core, *model.coda):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    if not model.config.tie_embeddings:  # an untied head (vocab x h) is gathered for the readout alone
        fully_shard(model.lm_head, mesh=mesh, mp_policy=policy)
    # the root (embedding, adapter, final norm): gathered in fp32 from the forward's start to the backward's end
    fully_shard(model, mesh=mesh)
    return model


def local_bytes(model, opts):
    """Bytes this rank holds of the parameters, their gradients and the optimizers' states: a DTensor
    counts its local shard, a plain tensor (DDP, one process) all of itself."""
    local = lambda t: t.to_local() if isinstance(t, DTensor) else t
    size = lambda ts: sum(local(t).numel() * local(t).element_size() for t in ts)
    params = list(model.parameters())  # a tied head once
    states = [v for o in opts for s in o.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"params": size(params), "grads": size(p.grad for p in params if p.grad is not None),
            "optimizer": size(states)}


# -----------------------------------------------------------------------------
# checkpoints: the master decides and writes its files, every rank writes its shards


def from_master(value):
    """The master's value on every rank (for what the ranks must agree on: a save the clock made due)."""
    out = [value]
    dist.broadcast_object_list(out, src=0)
    return out[0]


def on_master(fn):
    """fn() on the master; its result on every rank, or its one-line RunDirError raised on every rank."""
    result = (None, None)
    if dist.get_rank() == 0:
        try:
            result = (fn(), None)
        except RunDirError as err:
            result = (None, str(err))
    value, error = from_master(result)
    if error is not None:
        raise RunDirError(error)
    return value


def find_resume(args, fingerprint, keys, may_change, master, precision):
    """run_dir.find_resume on the master alone (verifying a save reads every byte of it, the optimizer
    shards included), and its answer, (directory, step), or its error on every rank."""
    return on_master(lambda: run_dir.find_resume(args, fingerprint, keys, may_change, True, precision))


def full_weights(model):
    """The whole fp32 weights, on the master's CPU, named as model.state_dict_to_save() names them (every
    rank takes part in the gathers; the others get an empty dict)."""
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if model.config.tie_embeddings:
        sd.pop("lm_head.weight", None)  # the embedding's tensor, which safetensors stores once
    return {k: v.contiguous() for k, v in sd.items()}


def save_checkpoint(model, opts, step, args, *run):
    """run_dir.save_checkpoint (the same arguments) for a sharded model, called by every rank:
    1. the master makes the save's directory (checkpoint.new_save_dir) and tells the others where it is;
    2. every rank writes its rows of the optimizer states there (dcp.save, collective);
    3. the ranks hash the shard files in turn, and the whole weights are gathered onto the master;
    4. the master writes model.safetensors, config.json, train_state.pt and the manifest listing every
       file's sha256, and commits the save (checkpoint.save). Returns the time the save finished; a
       failure anywhere is one RunDirError on every rank, and leaves the previous save as it was."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # FSDP2 keeps the root's weights gathered from its forward to its backward, so after an evaluation the
    # model holds them, not the shards the optimizers and state dicts know: register the shards again
    model.reshard()

    def new_dir():
        try:
            return checkpoint.new_save_dir(args.out_dir, step)
        except OSError as err:
            raise RunDirError(checkpoint.write_error(err, err.filename or args.out_dir, args.out_dir)) from None

    path = on_master(new_dir)
    try:
        dcp.save({"optimizers": get_optimizer_state_dict(model, opts)}, checkpoint_id=path)
    except CheckpointException as err:  # raised on every rank, with each failed rank's exception
        causes = [exc for exc, _ in err.failures.values()]
        disk = next((e for e in causes if isinstance(e, OSError)), None)
        if rank == 0:
            checkpoint.remove_quietly(path, args.out_dir)
        raise RunDirError(checkpoint.write_error(disk, path, args.out_dir) if disk else
                          f"cannot write the optimizer shards into {path}: {causes[0]}") from None
    names = sorted(os.listdir(path))  # dcp's files alone so far
    mine = {n: checkpoint.sha256(os.path.join(path, n)) for n in names[rank::world]}
    hashes = [None] * world if rank == 0 else None
    dist.gather_object(mine, hashes, dst=0)
    weights = full_weights(model)
    shards = (path, weights, {k: v for h in hashes or [] for k, v in h.items()})
    return on_master(lambda: run_dir.save_checkpoint(model, opts, step, args, *run, shards=shards))


def load_train_state(ckpt_dir, step, opts, model):
    """run_dir.load_train_state for a sharded model: step, RNG and the run's levels from train_state.pt, the
    optimizer states from the save's shard files (dcp.load: each rank reads its own rows, and checks them: a
    NaN or inf in any rank's rows is one RunDirError on every rank)."""
    if not os.path.isfile(os.path.join(ckpt_dir, DCP_METADATA)):
        raise RunDirError(f"--resume: {ckpt_dir} was saved without --fsdp (it has no optimizer shards): resume "
                          f"it without --fsdp, or train into a new --out_dir")
    state = checkpoint.load_state(ckpt_dir)
    if state.get("step") != step:
        raise RunDirError(f"--resume: {ckpt_dir}/train_state.pt is of step {state.get('step')}, its manifest of {step}")
    osd = get_optimizer_state_dict(model, opts)  # the layout to read into (first steps of zero gradients)
    dcp.load({"optimizers": osd}, checkpoint_id=ckpt_dir)
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, first_nonfinite({"optimizers": osd}))
    bad = next(filter(None, found), None)  # the first rank's, that every rank raises
    if bad is not None:
        raise RunDirError(poisoned(f"{ckpt_dir} (optimizer shards)", *bad))
    set_optimizer_state_dict(model, opts, osd)
    torch.set_rng_state(state["rng"])
    return state


# -----------------------------------------------------------------------------
# Muon on sharded matrices (muon.py): Newton-Schulz needs each matrix whole


def orthogonalize_sharded(params, updates, group, orthogonalize, ns_dtype):
    """muon.orthogonalize() (passed in with muon.ns_dtype, as muon.py imports this file) for DTensor parameters
    that FSDP2 shards by rows (Shard(0)) over a 1-D mesh; updates are this rank's rows of each matrix. Matrix i
    is orthogonalized whole on rank i % world, in rounds of `world` matrices (one each): its rows are gathered
    onto that rank, and the result's rows scattered back. Each rank runs Newton-Schulz on 1/world of the
    matrices and receives about 2/world of their bytes, where an all-gather of every matrix on every rank would
    receive all of them and compute all. Returns this rank's rows of each orthogonalized update, in ns_dtype."""
    mesh = params[0].device_mesh
    if mesh.ndim != 1 or any(p.placements != (Shard(0),) for p in params):
        raise ValueError("Muon takes DTensor parameters sharded by rows over one mesh dimension (FSDP2's default)")
    pg = mesh.get_group()
    world, rank = dist.get_world_size(pg), dist.get_rank(pg)
    ortho = [None] * len(params)
    for base in range(0, len(params), world):
        owned = list(range(base, min(base + world, len(params))))  # matrix owned[j] goes to rank j
        # FSDP2 splits rows as torch.chunk does: ceil(R / world) rows a rank, the last ranks fewer or none;
        # zero rows pad each shard to that size, as gather and scatter need equal pieces
        size = {i: -(-params[i].shape[0] // world) for i in owned}
        pad = lambda t, n: torch.cat([t, t.new_zeros(n - t.shape[0], *t.shape[1:])]) if t.shape[0] < n else t
        # 1. gather: rank j receives every rank's rows of matrix owned[j]
        pieces, works = None, []
        for j, i in enumerate(owned):
            recv = [updates[i].new_empty(size[i], updates[i].shape[1]) for _ in range(world)] if j == rank else None
            works.append(dist.gather(pad(updates[i], size[i]).contiguous(), recv, group=pg, group_dst=j,
                                     async_op=True))
            pieces = recv if j == rank else pieces
        for w in works:
            w.wait()
        # 2. Newton-Schulz on the whole matrix this rank owns in the round
        mine = None
        if rank < len(owned):
            i = owned[rank]
            mine = orthogonalize([torch.cat(pieces)[:params[i].shape[0]]], group)[0]
        # 3. scatter: rank j sends each rank its rows of the orthogonalized owned[j]
        out, works = {}, []
        for j, i in enumerate(owned):
            out[i] = updates[i].new_empty(size[i], updates[i].shape[1], dtype=ns_dtype(group, updates[i].device))
            send = list(pad(mine, size[i] * world).contiguous().chunk(world)) if j == rank else None
            works.append(dist.scatter(out[i], send, group=pg, group_src=j, async_op=True))
        for w in works:
            w.wait()
        for i in owned:
            ortho[i] = out[i][:updates[i].shape[0]]
    return ortho
