"""
When a token stops looping (adaptive depth): Huginn's zero-shot exit criteria and a learned exit gate (the
nanorecur remote code runs this file too: diffusion.py's latent-diff, beside every checkpoint).

Zero-shot (Huginn-0125, Geiping et al. 2025, arXiv 2502.05171, §6.1): a token exits once two consecutive loops
agree, by its state (latent-diff ||s_i - s_{i-1}|| / ||s_i||, cosine 1 - cos(s_i, s_{i-1})) or by the readout
after each loop (kl(p_{i-1} || p_i), entropy-diff |H_i - H_{i-1}|, argmax: loops in a row with one argmax).
ExitRule applies one of them to a decoding batch row by row (sample.py --exit); exit_quantity, exit_value and
exit_fired are its math, shared with the depth task's exit sweep (plumbing/exit_sweep.py).

Learned: Ouro (arXiv 2510.25741) trains a gate instead, a per-loop exit probability, first with an
entropy-regularized expected loss, then in a gate-only stage on the frozen model. This is the gate-only stage, on
a frozen recurrent checkpoint:

    gate_i    = sigmoid(w . [rmsnorm(s_i), rmsnorm(s_i - s_{i-1}), log(|s_i - s_{i-1}| / |s_i|)] + b)
                one Linear(2h + 1 -> 1) per token, on the state after loop i and the step the loop took
    target_i  = 1 if answer_j == answer_R for every j in i..R, else 0     (R: the trajectory's loops)
    loss      = binary cross-entropy of gate(s_i) against target_i, over the loops i = 1..R and the labeled
                positions (every position of data without labels)

and at test time a token stops after the first loop whose gate reaches --exit_threshold Q (sample.py
`--exit gate`, eval_math.py --exit_criterion gate, the exit sweep): Q trades loops for accuracy, no retraining.

Why the state and not the coda's output: the gate then costs two h-vector products per loop and no
readout, so a token that goes on looping pays nothing for asking; the coda's output would need the coda after
every loop, as kl and entropy do. Why the step too: the state alone does not say how far the loop still moves
it (on the from-scratch depth model a gate on rmsnorm(s_i) alone gives every loop of a depth-6 label about the
same p and exits half of them after loop 1, wrong: RESULTS.md); the step's size is latent-diff's signal
(above), its direction says which way the answer is still moving. rmsnorm without a weight: the state's
scale grows with the loop (Huginn's s_0 is scaled by sqrt(h)), the gate reads directions and the log size.
Why this target and not Ouro's expected loss: with the model frozen the best exit is known exactly, the first
loop from which the answer no longer changes, so the gate learns it as a label (no entropy weight to tune, no
collapse to always-exit or never-exit); it asks for agreement with loop R, not for the right answer, so the gate
goes for fixed r = R's accuracy at fewer loops, which is what adaptive depth promises, and needs no labels. What
it cannot know: depths its training rows never held (RESULTS.md, "Where does adaptive depth spend its loops?").

    python train.py --config config/cpu_exit_gate.json --init out/depth --data data/depth --out_dir out/depth_gate
    python eval_math.py --init out/depth_gate --task depth --data data/depth --r 32 --exit_sweep
    python sample.py --init out/depth_gate --r 32 --exit gate --exit_threshold 0.9 --prompt " c a f b"
    python sample.py --init out/depth --r 32 --exit kl --prompt " c a f b"      # zero-shot, any checkpoint

Test: python -m pytest -q tests/test_exit_gate.py tests/test_exit_sweep.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

try:  # in the repository
    from per_loop import IGNORE_INDEX
except ImportError:  # in a checkpoint directory, where transformers imports these files as one package
    from .per_loop import IGNORE_INDEX

# Huginn's defaults; argmax counts loops, the rest are "value below threshold". The paper's
# figure uses 5e-4 for kl; its code defaults to 1e-3. gate: a learned exit gate's probability (below),
# "value at or above threshold", for checkpoints that have one (train.py --exit_gate)
EXIT_THRESHOLDS = {"kl": 1e-3, "entropy-diff": 1e-3, "latent-diff": 0.03, "cosine": 1e-3, "argmax": 5, "gate": 0.9}
ZERO_SHOT = [c for c in EXIT_THRESHOLDS if c != "gate"]  # what any recurrent checkpoint can exit by


# -----------------------------------------------------------------------------
# zero-shot exit, and the rule decoding applies


def exit_quantity(criterion, s, logits):
    """What `criterion` compares between consecutive loops, in fp32: the state s (..., h) (latent-diff, cosine),
    or of the readout logits (..., V) the log-probs (kl), their entropy (entropy-diff) or the argmax (argmax).
    The argument a criterion does not read may be None."""
    if criterion in ("latent-diff", "cosine"):
        return s.float()
    logp = torch.log_softmax(logits.float(), dim=-1)
    if criterion == "argmax":
        return logp.argmax(-1)
    return -(logp.exp() * logp).sum(-1) if criterion == "entropy-diff" else logp


def exit_value(criterion, prev, cur, streak=None):
    """Loop i's exit_quantity cur against loop i-1's prev -> (...,): ||s_i - s_{i-1}|| / ||s_i|| (latent-diff),
    1 - cos(s_i, s_{i-1}) (cosine), kl(p_{i-1} || p_i) (kl), |H_i - H_{i-1}| (entropy-diff); argmax: the loops in
    a row with an unchanged argmax, streak + 1 or 0 (streak: the count after loop i-1, 0 after the first loop)."""
    if criterion == "latent-diff":
        return (cur - prev).norm(dim=-1) / cur.norm(dim=-1).clamp_min(1e-12)
    if criterion == "cosine":
        return 1 - F.cosine_similarity(cur, prev, dim=-1)
    if criterion == "kl":
        return (prev.exp() * (prev - cur)).sum(-1)
    if criterion == "entropy-diff":
        return (cur - prev).abs()
    return torch.where(cur == prev, streak + 1, 0)


def exit_fired(criterion, value, threshold):
    """Converged: the argmax streak or the gate's probability reached the threshold, any other criterion's value
    fell below it."""
    return value >= threshold if criterion in ("argmax", "gate") else value < threshold


class ExitRule:
    """Per-row convergence test between consecutive loops (Huginn §6.1). Every zero-shot criterion compares
    loop i's output with loop i-1's, so the earliest exit is after 2 loops (argmax: after
    threshold + 1) and never before min_loops. kl, entropy-diff and argmax need a readout after
    every loop (only of the token being decoded). The math is exit_quantity, exit_value and
    exit_fired, shared with the depth task's exit sweep (plumbing/exit_sweep.py). gate: the learned
    gate (below; the model's exit_gate) reads loop i's state alone, and may stop after loop 1."""

    def __init__(self, criterion, threshold=None, min_loops=1, gate=None):
        if criterion not in EXIT_THRESHOLDS:
            raise ValueError(f"unknown exit criterion {criterion!r}: choose from {', '.join(EXIT_THRESHOLDS)}")
        if criterion == "gate" and gate is None:
            raise ValueError("the gate criterion needs the model's exit gate (model.exit_gate)")
        self.criterion, self.min_loops, self.gate = criterion, min_loops, gate
        self.threshold = EXIT_THRESHOLDS[criterion] if threshold is None else threshold
        self.needs_readout = criterion in ("kl", "entropy-diff", "argmax")

    def reset(self):
        self.prev = None  # last loop's log-probs / entropy / argmax
        self.stable = None  # argmax: loops in a row with an unchanged argmax

    def keep(self, rows):
        """Forget the rows that left the loop: rows, (n,) bool over the rows of the last call."""
        self.prev = None if self.prev is None else self.prev[rows]
        self.stable = None if self.stable is None else self.stable[rows]

    def converged(self, i, s_prev, s, logits):
        """i: 0-based loop just run; s_prev, s: (B, 1, h); logits (B, 1, V) or None -> (B,) bool."""
        c = self.criterion
        if c == "gate":
            value = self.gate.probability(s_prev[:, -1], s[:, -1])  # (B,)
        elif c in ("latent-diff", "cosine"):  # s_0 is no loop's output: nothing to compare at i = 0
            q = lambda t: exit_quantity(c, t[:, -1], None)  # (B, h) fp32
            value = None if i == 0 else exit_value(c, q(s_prev), q(s))
        else:
            cur, first = exit_quantity(c, None, logits[:, -1]), self.prev is None  # (B, V) log-probs, or (B,)
            if c == "argmax":
                value = self.stable = torch.zeros_like(cur) if first else exit_value(c, self.prev, cur, self.stable)
            else:
                value = None if first else exit_value(c, self.prev, cur)
            self.prev = cur
        if value is None:
            return torch.zeros(s.shape[0], dtype=torch.bool, device=s.device)
        return exit_fired(c, value, self.threshold) & (i + 1 >= self.min_loops)


# -----------------------------------------------------------------------------
# the learned gate: a module of the model (model.py builds it when config.exit_gate)


class ExitGate(nn.Module):
    """P(stop after loop i) from the state: Linear(2h + 1 -> 1) on [rmsnorm(s_i), rmsnorm(s_i - s_{i-1}),
    log(|s_i - s_{i-1}| / |s_i|)], in fp32; starts at p = 0.5 (zero weights). Why these inputs: the docstring
    above; its target and training: gate_loss below."""

    def __init__(self, n_embd):
        super().__init__()
        self.proj = nn.Linear(2 * n_embd + 1, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, s_prev, s):
        """s_prev, s (..., h): the state before and after a loop -> the exit logit (...,), in fp32."""
        s, d = s.float(), s.float() - s_prev.float()
        size = (d.norm(dim=-1) / s.norm(dim=-1).clamp_min(1e-12)).clamp_min(1e-12).log()  # log latent-diff
        h = (s.shape[-1],)
        x = torch.cat([F.rms_norm(s, h), F.rms_norm(d, h, eps=1e-12), size[..., None]], dim=-1)
        return F.linear(x, self.proj.weight.float(), self.proj.bias.float()).squeeze(-1)

    def probability(self, s_prev, s):
        return torch.sigmoid(self(s_prev, s))

    def trajectory(self, states):
        """states s_0..s_L, each (N, h) -> (L, N): the probability after each loop 1..L."""
        return torch.stack([self.probability(a, b) for a, b in zip(states[:-1], states[1:])])


# -----------------------------------------------------------------------------
# the learned gate's training (train.py --exit_gate)


def add_exit_gate(model):
    """Give a recurrent model a new gate (p = 0.5 everywhere), on its device; config.exit_gate records it, so the
    checkpoint's config.json says "exit_gate": true and every script builds the gate to load exit_gate.*."""
    model.config.exit_gate = True
    model.exit_gate = ExitGate(model.config.n_embd).to(model.embed_tokens.weight.device)
    return model


def stable_answers(answers):
    """answers (L, N): each loop's argmax -> (L, N) bool, True at loop i where loops i..L all answer loop L's."""
    same = answers == answers[-1:]
    return same.flip(0).int().cummin(0).values.flip(0).bool()


def gate_loss(model, idx, targets, r, seeds=None):
    """train.py --exit_gate's loss for one batch: the frozen model runs r loops without grad, each loop read out
    at the labeled positions (text: every position), and the gate learns stable_answers there."""
    with torch.no_grad():
        out = model(idx, targets, num_steps=r, seeds=seeds, labeled_only=True, return_states=True)
        at = targets != IGNORE_INDEX  # (B, T)
        rope = model.rope(torch.arange(idx.shape[1], device=idx.device))
        answers = torch.stack([model.readout(s, rope, positions=at).argmax(-1) for s in out.states[1:-1]]
                              + [out.logits.argmax(-1)])  # (L, N): loop 1..r's answers
        states = torch.stack([s[at] for s in out.states])  # (L + 1, N, h): s_0 .. s_r
    logit = model.exit_gate(states[:-1], states[1:])  # (L, N), with grad: the gate's parameters only
    return F.binary_cross_entropy_with_logits(logit, stable_answers(answers).float())
