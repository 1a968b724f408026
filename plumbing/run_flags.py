"""
The flags of a training run's machinery (train.py --help lists them last), and the check of train.py's flag
values before anything loads (check_flags). The machinery: saving between evaluations,
device, compilation and sharding, precision, the guards that stop a diverging run, MFU and the upload.
None of them changes what the recipe trains; all but --fsdp (whose optimizer states are shard files) may
differ on --resume (SYSTEM_MAY_CHANGE), autocast as long as the precision it resolves to stays the run's
(plumbing/run_dir.py check_resume).

    python train.py --help    # the recipe's flags first, then the run's, then these
"""

import os

from plumbing.cli import at_least, int_list
from plumbing.device import AUTOCAST
from plumbing.upload import check_push

SYSTEM_FLAGS = dict(
    ckpt_minutes=(5.0, "also save between evals once this many minutes passed since the last save; 0 = at evals only"),
    device=("auto", "auto (cuda when available) | cpu | cuda | cuda:N"),
    compile=(False, "torch.compile the blocks, CPU or CUDA (plumbing/device.py compile_blocks); off by default"),
    fsdp=(False, "under torchrun: shard weights, gradients and optimizer states over the ranks (FSDP2, "
                 "plumbing/fsdp.py) instead of DDP's full copy on each; for parents DDP cannot hold"),
    autocast=("auto", "bf16 autocast, fp32 weights: auto (on CUDA and a CPU with native bf16, plumbing/device.py) | "
                      "bf16 (any CPU too) | off (fp32)", AUTOCAST),
    preempt_timeout=(300.0, "after SIGTERM or SIGUSR1 (a preemption: the step is saved, exit code 75, "
                            "plumbing/preempt.py): seconds to finish the step and save before giving up in one line "
                            "(a rank died or hangs); keep it under the scheduler's grace period"),
    max_bad_steps=(5, "stop after this many NaN/inf steps in a row (each is skipped)"),
    diverge_factor=(4.0, "a train loss over this times its running level and 1 nat above it is a spike (never "
                         "saved); 0 = off"),
    diverge_steps=(3, "stop after this many spikes in a row (one alone is the sampled r: an r=1 step reads out early)"),
    collapse_factor=(10.0, "stop at once when an update multiplies the weights' norm by this much, or a finite loss "
                           "comes with an all-zero gradient (0 = neither; plumbing/guards.py)"),
    peak_flops=(0.0, "FLOP/s of one device, for MFU (e.g. 989e12 for an H100 in bf16); 0 = no MFU"),
    push_to_hub=("", "namespace/name: at the end, upload out_dir (weights, config, tokenizer, model card) there"),
    private=(False, "with --push_to_hub: create the repo private"),
)
SYSTEM_MAY_CHANGE = tuple(key for key in SYSTEM_FLAGS if key != "fsdp")


def check_flags(args, choices):
    """A one-line ValueError for a flag value of train.py that is wrong whatever the data and the model; choices
    {key: allowed values}. Returns args."""
    int_list(args.shape, "--shape", n=3)
    int_list(args.eval_r, "--eval_r")
    at_least(args, 1, "eval_interval", "eval_iters", "batch_size", "block_size", "max_bad_steps", "diverge_steps",
             "log_interval", "mean_recurrence", "backprop_depth")
    at_least(args, 0, "max_iters", "warmup_iters", "total_batch_tokens", "recurrence_sigma", "grad_clip")
    at_least(args, 1, "preempt_timeout")
    if args.fsdp:  # plumbing/fsdp.py only where --fsdp asks for it: its torch.distributed.checkpoint and DTensor
        from plumbing import fsdp  # imports are slow, and a run without --fsdp need not pay for them

        fsdp.check_flags(args)  # --fsdp needs torchrun
    for key, allowed in choices.items():
        if getattr(args, key) not in allowed:
            raise ValueError(f"--{key} must be one of {', '.join(map(repr, allowed))}, not {getattr(args, key)!r}")
    if args.exit_gate and (args.init == "scratch" or args.static or args.fsdp or
                           int(os.environ.get("WORLD_SIZE", 1)) > 1):
        raise ValueError("--exit_gate trains a gate on a trained recurrent model, in one process: pass --init with "
                         "its checkpoint directory, without --static, --fsdp or torchrun")
    if args.kl_parent < 0 or args.kl_parent > 0 and (not args.kl_data or args.fsdp or
                                                    int(os.environ.get("WORLD_SIZE", 1)) > 1):
        raise ValueError("--kl_parent W >= 0 adds W * KL(parent || model) on the text of --kl_data, in one process: "
                         "give --kl_data (e.g. data/sotu) and run it without --fsdp or torchrun")
    if args.init == "scratch" and args.n_embd % args.n_head:
        raise ValueError(f"--n_embd {args.n_embd} is not a multiple of --n_head {args.n_head}")
    if args.push_to_hub:  # a bad repo id, offline or no login: said now, not after the run
        check_push(args.push_to_hub, args.out_dir)
    return args
