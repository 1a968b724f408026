"""
The batches of a training run, as functions of the optimizer step: which rows (or text windows) a step
reads, the seeds of their s_0 draws, how many columns of row data carry a label, and the dev loss on
fixed batches that train.py's evaluations report (estimate_loss). Each is drawn from a
generator seeded by (seed, step), so a resumed run, a run on more ranks and a run with another
gradient-accumulation split all see the same data and the same noise (train.py's exact resume and its
data-parallel test rest on this).

    from plumbing.batches import open_data, batch_rows, state_seeds, labeled_length, get_batch
    data = open_data("data/depth", "train", block_size=256)       # data/depth/prepare.py writes it
    rows = batch_rows(step, 64, data["n"], seed=1337)            # the step's global batch
    x, y, depths = get_batch(data, rows[:32], "cpu", labeled_length(data, rows))

    python -m pytest -q tests/test_train.py -k "labeled_columns or state_seeds"
"""

import numpy as np
import torch
from tqdm import tqdm

from per_loop import IGNORE_INDEX


def open_data(data_dir, split, block_size):
    """One split of a prepared data dir (data/common.py's format) as a dict: meta, ids, and for row data
    targets and depths (B rows of T = seq_len columns; depths None without {split}_step.bin), T, n (rows,
    or text windows of block_size). A ValueError (FileNotFoundError) says what is missing or truncated."""
    from data.common import load_meta, open_split

    meta = load_meta(data_dir)
    ids, targets, depths = open_split(data_dir, split, meta)  # depths: the {split}_step.bin file
    seq_len = meta.get("seq_len")
    if seq_len:  # rows of seq_len tokens with their own labels: batches take whole rows
        n = len(ids) // seq_len
        return dict(meta=meta, ids=ids.reshape(n, seq_len), targets=targets.reshape(n, seq_len),
                    depths=None if depths is None else depths.reshape(n, seq_len), T=seq_len, n=n)
    n = len(ids) - block_size - 1  # plain text: any window; the target of t is token t+1
    if n < 1:
        raise ValueError(f"{data_dir}/{split}.bin has {len(ids)} tokens, fewer than --block_size {block_size} + 2")
    return dict(meta=meta, ids=ids, targets=None, depths=None, T=block_size, n=n)


def open_splits(data_dir, block_size, per_loop=False):
    """The train and dev splits train.py reads (open_data); per_loop (--step_supervision): the labels' task
    depths must be there (DIR/train_step.bin)."""
    train, dev = open_data(data_dir, "train", block_size), open_data(data_dir, "dev", block_size)
    if per_loop and train["depths"] is None:
        raise ValueError(f"--step_supervision needs per-step labels ({data_dir}/train_step.bin), e.g. data/depth")
    return train, dev


def accumulation(batch_size, T, world, total_batch_tokens=0):
    """Tokens per optimizer step over all ranks (total_batch_tokens, 0: one micro-batch a rank), and the
    micro-batches each rank runs for it (gradient accumulation)."""
    micro_tokens = batch_size * T
    total = total_batch_tokens or micro_tokens * world
    if total % (micro_tokens * world):
        raise ValueError(f"--total_batch_tokens {total} is not a multiple of batch_size*T*world = "
                         f"{micro_tokens * world}")
    return total, total // (micro_tokens * world)


def batch_rows(step, global_rows, n, seed, split="train"):
    """The global batch of an optimizer step: row (or window) indices from a generator seeded by
    (seed, split, step), so the data position is a function of the step (exact resume, same batch
    at any world size)."""
    g = torch.Generator().manual_seed(seed * 7_919 + step * 2 + (split == "val") + 10**9)
    return torch.randint(n, (global_rows,), generator=g)


def state_seeds(step, global_rows, seed):
    """One seed per row of the step's global batch for its s_0 draw (model.init_state(seeds=...)), from
    (seed, step): a row's noise is the same at any world size and gradient-accumulation split."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 8191 + 7)
    return torch.randint(2**62, (global_rows,), generator=g)


def labeled_length(data, rows):
    """Row data: 1 + the last position that carries a label in any of these rows (the step's global
    batch, so every rank cuts alike). Later columns are padding that a causal model never reads for
    a label: cutting them is exact, and halves the work on the depth task's train rows (train_k + 1
    of test_k + 1 columns carry labels)."""
    if data["targets"] is None:
        return data["T"]
    labeled = np.flatnonzero((data["targets"][rows.numpy()] != IGNORE_INDEX).any(0))
    return int(labeled[-1]) + 1 if len(labeled) else data["T"]


def get_batch(data, rows, device, T=None):
    """x, y (B, T) int64 and depths (B, T) or None, for the given rows of the global batch; row data
    cut to its first T columns when T is given."""
    rows = rows.numpy()
    if data["targets"] is not None:
        cut = slice(0, T or data["T"])
        x = torch.from_numpy(data["ids"][rows, cut].astype(np.int64))
        y = torch.from_numpy(data["targets"][rows, cut].astype(np.int64))
        d = None if data["depths"] is None else torch.from_numpy(data["depths"][rows, cut].astype(np.int64))
    else:
        T, ids = data["T"], data["ids"]
        xy = torch.from_numpy(np.stack([ids[i:i + T + 1] for i in rows]).astype(np.int64))
        x, y, d = xy[:, :-1], xy[:, 1:], None
    to = lambda t: None if t is None else t.to(device, non_blocking=True)
    return to(x.contiguous()), to(y.contiguous()), to(d)


@torch.no_grad()
def estimate_loss(model, data, r_values, eval_iters, batch_size, device, seed, autocast, gate=False):
    """Validation loss (and, for labeled data, accuracy overall and per task depth) at each r, on
    the same fixed batches every time; the global RNG is forked so evaluating never changes training.
    gate (--exit_gate): the exit gate's loss on the trajectory of r loops instead (exit_gate.py)."""
    from exit_gate import gate_loss

    model.eval()
    out = {}
    bar = tqdm(total=len(r_values) * eval_iters, desc="eval", unit="batch", leave=False, disable=None,
               dynamic_ncols=True)  # None: off without a TTY
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for r in r_values:
            bar.set_description(f"eval r={r}")
            torch.manual_seed(seed)  # the s_0 draws of the evaluation
            losses, correct, total = [], {}, {}
            for it in range(eval_iters):
                x, y, depths = get_batch(data, batch_rows(it, batch_size, data["n"], seed, "val"), device)
                with autocast:
                    logits, loss = (None, gate_loss(model, x, y, r)) if gate else model(x, y, num_steps=r)
                losses.append(loss.item())
                if data["targets"] is not None and logits is not None:  # labels: accuracy, by depth when known
                    hit = (logits.argmax(-1) == y) & (y != IGNORE_INDEX)
                    group = depths if depths is not None else (y != IGNORE_INDEX).long()
                    for depth in group[y != IGNORE_INDEX].unique().tolist():
                        sel = (group == depth) & (y != IGNORE_INDEX)
                        correct[depth] = correct.get(depth, 0) + hit[sel].sum().item()
                        total[depth] = total.get(depth, 0) + sel.sum().item()
                bar.update(1)
            res = {"loss": sum(losses) / len(losses)}
            if total:
                res["acc"] = sum(correct.values()) / sum(total.values())
                if depths is not None:
                    res["acc_by_k"] = {str(d): correct[d] / total[d] for d in sorted(total)}  # key: by task depth
            out[str(r)] = res
    bar.close()
    model.train()
    return out
