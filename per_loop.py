"""
Per-loop supervision: the coda reads out after each loop and is trained on the labels that loop can have
computed (the nanorecur remote code runs this file too, beside every checkpoint, as model.py imports it).

Shapiro 2026 ("Retrofitting Recurrent Depth into a Pretrained Language Model", arXiv 2608.11233): on a task whose
label at depth k needs k steps, the readout after loop i < r is trained on the labels of depth <= i, weight w each,

    loss = (L_r + w * sum_{i<r} L_i) / (1 + w * (number of per-loop terms))

so each loop learns one step of the task instead of the last loop learning them all. model.py's forward builds one
PerLoopReadout per pass (train.py --step_supervision, which sets w; the depth task's data carries each label's depth).

    python train.py --config config/cpu_depth.json --data data/depth --out_dir out/depth   # step_supervision: true
    python -m pytest -q tests/test_model.py
"""

import torch.nn.functional as F

IGNORE_INDEX = -1  # target value that carries no loss (nanoGPT convention)


class PerLoopReadout:
    """Readouts after the grad loops before the last, for one forward pass. Per-loop supervision (Shapiro 2026,
    "Retrofitting Recurrent Depth into a Pretrained Language Model", arXiv 2608.11233): after loop i the coda
    reads out and is trained on the labels of task depth <= i, the ones i loops can have computed, so that each
    loop learns one step of the task. Also the logits after every loop for analysis (return_loop_logits).

    at (B, T) bool: where the head reads out (labeled_only), or None: everywhere. In training (labeled_only, no
    logits kept) the head reads out only where this loop has a label (exact: the others carry no loss): at r = 4,
    loops 1-3 of a depth-6 row read 1 + 2 + 3 of its 6 labels, a third of the per-loop head's cost."""

    def __init__(self, model, rope, targets, depths, weight, at, keep_logits):
        self.model, self.rope, self.targets, self.at = model, rope, targets, at
        self.depths = depths if depths is not None and weight > 0 else None  # None: no per-loop loss
        self.weight, self.keep_logits = weight, keep_logits
        self.logits, self.losses = [], []

    @property
    def wanted(self):
        return self.depths is not None or self.keep_logits

    def after_loop(self, s, loop):
        """The readout of the state s after `loop` loops (1-based), and its loss on the labels of depth <= loop."""
        reach = self.depths <= loop if self.depths is not None else None
        own = reach is not None and self.at is not None and not self.keep_logits
        logits = self.model.readout(s, self.rope, positions=self.at & reach if own else self.at)  # (B, T, V) or (N, V)
        if self.keep_logits:
            self.logits.append(logits)
        if reach is not None:
            labels = (self.targets[self.at & reach] if own
                      else flat_labels(self.targets.masked_fill(~reach, IGNORE_INDEX), self.at))
            self.losses.append(loop_loss(logits, labels))

    def loss(self, final):
        """(L_r + w sum_i L_i) / (1 + w (k - 1)): the outcome loss and the per-loop losses, weight w each."""
        if not self.losses:
            return final
        return (final + self.weight * sum(self.losses)) / (1 + self.weight * len(self.losses))


def flat_labels(targets, at):
    """The labels of the positions the head read out: those at `at`, or every position (flattened)."""
    return targets[at] if at is not None else targets.reshape(-1)


def loop_loss(logits, labels):
    """Mean cross-entropy over the labels a loop can reach; 0, not NaN, when it reaches none."""
    ce = F.cross_entropy(logits.view(-1, logits.size(-1)), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return ce / (labels != IGNORE_INDEX).sum().clamp(min=1)
