"""
A KL term towards the parent's next-token distribution on text, for a retrofit in place (train.py --kl_parent W).

Why: a retrofit that keeps every layer and whose loop 1 is the parent (surgery.py --first_loop identity) is the
parent at r = 1 before training, and training its core moves that path. Public in-place retrofit forks add a KL
term towards the un-looped parent's distribution while training the loop; arXiv 2608.11233 measures what the
parent keeps. Here, at every optimizer step: --kl_rows windows of --kl_len tokens of the train split of the
plain-text data --kl_data, drawn from (seed, step) alone (a resumed run draws the same); the parent's distribution
from a frozen copy of --kl_init at r = 1; the model's at r = 1; the loss gains W * KL(parent || model), in nats
per token, beside the task's.

    python train.py --config config/cpu_retrofit_depth.json --init out/in_place/cut --data out/in_place/data/forward \
        --freeze outer --kl_parent 1.0 --kl_data out/in_place/data/sotu --kl_init out/in_place/cut
"""

import numpy as np
import torch
import torch.nn.functional as F

from plumbing.batches import state_seeds


class ParentKL:
    """The frozen parent and the text it is read on; loss(model, step) is the term (a differentiable scalar)."""

    def __init__(self, parent, args, task_meta, device):
        from data.common import load_meta, open_split
        from model import RecurrentGPT

        meta = load_meta(args.kl_data)
        ids, targets, _ = open_split(args.kl_data, "train", meta)
        if targets is not None:
            raise ValueError(f"--kl_data {args.kl_data} holds labeled rows: give plain text (e.g. data/sotu)")
        if meta["fingerprint"] != task_meta["fingerprint"]:
            raise ValueError(f"--kl_data {args.kl_data} is tokenized with {meta.get('tokenizer')}, the task data with "
                             f"{task_meta.get('tokenizer')}: prepare it with the model's --tokenizer")
        if len(ids) <= args.kl_len + 1:
            raise ValueError(f"--kl_data {args.kl_data}: {len(ids)} train tokens, fewer than --kl_len {args.kl_len} + 1")
        try:
            self.parent = RecurrentGPT.from_pretrained(parent).to(device).eval()
        except (OSError, ValueError) as err:
            raise ValueError(f"--kl_init {parent}: not a checkpoint of ours ({err}): give the cut surgery.py "
                             "wrote") from None
        self.parent.requires_grad_(False)
        self.ids, self.rows, self.T, self.seed, self.device = ids, args.kl_rows, args.kl_len, args.seed, device

    def batch(self, step):
        starts = np.random.default_rng([self.seed, step, 11]).integers(0, len(self.ids) - self.T, size=self.rows)
        x = torch.from_numpy(np.stack([self.ids[s:s + self.T] for s in starts]).astype(np.int64))
        return x.to(self.device)

    def loss(self, model, step):
        """KL(parent || model) per token at r = 1 on this step's windows (s_0 seeded like the task's rows)."""
        x = self.batch(step)
        seeds = state_seeds(step, self.rows, self.seed + 1)
        with torch.no_grad():
            p = self.parent(x, num_steps=1, seeds=seeds)[0].float().log_softmax(-1)
        q = model(x, num_steps=1, seeds=seeds)[0].float().log_softmax(-1)
        return F.kl_div(q.flatten(0, 1), p.flatten(0, 1), log_target=True, reduction="batchmean")
