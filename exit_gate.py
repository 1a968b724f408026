"""
A learned exit gate: after loop i, the probability that a token's answer is already the one it will keep.

Huginn-0125 (Geiping et al. 2025, arXiv 2502.05171, §6.1) exits a token zero-shot, when two consecutive loops
agree (sample.py's kl, entropy-diff, latent-diff, cosine and argmax criteria). Ouro (arXiv 2510.25741)
trains a gate instead: a per-loop exit probability, first with an entropy-regularized expected loss, then in
a gate-only stage on the frozen model. This is the gate-only stage, on a frozen recurrent checkpoint:

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
it (a gate on rmsnorm(s_i) alone, tried first on the from-scratch depth model, gave every loop of a depth-6
label the same p ~ 0.97 and exited half of them after loop 1, wrong); the step's size is latent-diff's signal
(sample.py), its direction says which way the answer is still moving. rmsnorm without a weight: the state's
scale grows with the loop (Huginn's s_0 is scaled by sqrt(h)), the gate reads directions and the log size.
Why this target and not Ouro's expected loss: with the model frozen the best exit is known exactly, the first
loop from which the answer no longer changes, so the gate learns it as a label (no entropy weight to tune, no
collapse to always-exit or never-exit); it asks for agreement with loop R, not for the right answer, so the gate
goes for fixed r = R's accuracy at fewer loops, which is what adaptive depth promises, and needs no labels. What
it cannot know: depths its training rows never held (RESULTS.md, "Where does adaptive depth spend its loops?").

    python train.py --config config/cpu_exit_gate.json --init out/depth --data data/depth --out_dir out/depth_gate
    python eval_math.py --init out/depth_gate --task depth --data data/depth --r 32 --exit_sweep
    python sample.py --init out/depth_gate --r 32 --exit gate --exit_threshold 0.9 --prompt " c a f b"

Test: python -m pytest -q tests/test_exit_gate.py
"""

import torch
import torch.nn.functional as F

from model import IGNORE_INDEX, ExitGate  # the gate is a module of the model; its training objective is here


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
