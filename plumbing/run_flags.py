"""
The flags of a training run's machinery (train.py --help lists them last): saving between evaluations,
device, compilation and sharding, precision, the guards that stop a diverging run, MFU and the upload.
None of them changes what the recipe trains; all but --fsdp (whose optimizer states are shard files) may
differ on --resume (SYSTEM_MAY_CHANGE), autocast as long as the precision it resolves to stays the run's
(plumbing/run_dir.py check_resume).

    python train.py --help    # the recipe's flags first, then the run's, then these
"""

from plumbing.device import AUTOCAST

SYSTEM_FLAGS = dict(
    ckpt_minutes=(5.0, "also save between evals once this many minutes passed since the last save; 0 = at evals only"),
    device=("auto", "auto (cuda when available) | cpu | cuda | cuda:N"),
    compile=(False, "torch.compile the blocks, CPU or CUDA (plumbing/device.py compile_blocks); off by default"),
    fsdp=(False, "under torchrun: shard weights, gradients and optimizer states over the ranks (FSDP2, "
                 "plumbing/fsdp.py) instead of DDP's full copy on each; for parents DDP cannot hold"),
    autocast=("auto", "bf16 autocast, fp32 weights: auto (on CUDA and a CPU with native bf16, plumbing/device.py) | "
                      "bf16 (any CPU too) | off (fp32)", AUTOCAST),
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
