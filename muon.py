"""
Muon: momentum, then an approximate orthogonalization of each 2-D update by Newton-Schulz.

The retrofit recipe (McLeish et al. 2025, arXiv 2511.07384) trains every 2-D matrix of the blocks
and the adapter with Muon (lr 1e-3, momentum 0.95 Nesterov, 5 Newton-Schulz steps, wd 1e-4) and
the rest with AdamW; AdamW alone spiked to NaN on the recurrent model. The update rule is Keller
Jordan's (kellerjordan.github.io/posts/muon) and matches torch.optim.Muon step for step:

    B   = mu B + (1 - mu) G                      # momentum buffer (as a lerp, like torch)
    U   = (1 - mu) G + mu B  if nesterov else B
    O   = NS_5(U / ||U||_F)                      # quintic Newton-Schulz, coefficients (a, b, c)
    W  -= lr wd W ;  W -= lr * adjust(shape) O   # decoupled weight decay, then the update

What differs is speed. torch.optim.Muon orthogonalizes one matrix at a time in bfloat16, which on
a CPU without bf16 matrix units is slower than fp32. Here matrices of the same (oriented) shape are
stacked and orthogonalized together with torch.bmm / torch.baddbmm (in cache-sized stacks on CPU), in
bf16 on CUDA and on a CPU with bf16 dot products (avx512_bf16, AMX: there bf16 multiplies ~4x faster than
fp32 and the step is ~3x faster, bench_train, RESULTS.md), in fp32 on any other CPU
(plumbing/device.py cpu_bf16). train.py passes the run's precision as ns_dtype (fp32 under --autocast off).

Under FSDP2 (train.py --fsdp, plumbing/fsdp.py) every parameter is a DTensor holding one rank's rows of
the matrix. Momentum, weight decay and the update are elementwise and run on those rows; Newton-Schulz
needs the whole matrix, so matrix i is gathered onto rank i % world, orthogonalized there, and its rows
scattered back (plumbing/fsdp.py orthogonalize_sharded): the same update, each rank doing 1/world of the work.

    python -m pytest -q tests/test_muon.py          # checks it against torch.optim.Muon and newton_schulz
    python bench/bench_train.py --only muon         # step time vs torch.optim.Muon
    python -m pytest -q tests/test_fsdp.py          # the sharded step, in train.py --fsdp against DDP
"""

import math
from collections import defaultdict

import torch

from plumbing.device import cpu_bf16, is_dtensor

# Keller Jordan's quintic coefficients (the same defaults as torch.optim.Muon)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
CPU_CHUNK_ELEMENTS = 1 << 22  # matrices stacked per bmm on CPU: up to 4M elements (16 MB in fp32)


def newton_schulz(G, ns_steps=5, ns_coefficients=NS_COEFFICIENTS, eps=1e-7):
    """The iteration of Keller Jordan's Muon, on one matrix G (rows, cols): scale G so that every singular
    value lies in [0, 1], then ns_steps times X <- a X + (b A + c A^2) X with A = X X^T. Each step maps every
    singular value sigma to a sigma + b sigma^3 + c sigma^5, a quintic pushing them all towards 1: the result
    is U S' V^T with S' ~ Uniform(0.5, 1.5) rather than the exact U V^T of G = U S V^T (enough for Muon, and
    5 steps). A is taken on the small side (X transposed when tall)."""
    a, b, c = ns_coefficients
    X = G / G.norm().clamp(min=eps)  # Frobenius norm >= spectral norm: singular values in [0, 1]
    tall = X.shape[0] > X.shape[1]
    X = X.mT if tall else X
    for _ in range(ns_steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X.mT if tall else X


def zeropower_via_newtonschulz(G, ns_coefficients=NS_COEFFICIENTS, ns_steps=5, eps=1e-7, dtype=None):
    """newton_schulz() for a stack of matrices G (n, rows, cols) with rows <= cols, all at once, at speed:
    one torch.bmm / torch.baddbmm per product for the whole stack, in dtype (bf16 where the device multiplies it
    natively), and in fp32 reassociated for wide matrices (below). tests/test_muon.py checks it against
    newton_schulz."""
    a, b, c = ns_coefficients
    X = G.to(dtype or G.dtype)
    # Frobenius norm >= spectral norm, so every singular value starts in [0, 1]
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    rows, cols = X.shape[-2:]
    if X.dtype == torch.float32 and cols > 1.5 * rows:
        # Same iteration, reassociated for wide matrices: X_k = Q_k X_0 with Q_k a product of polynomials
        # P_j = aI + bA_j + cA_j^2 of the Gram matrix, and A_{j+1} = X_{j+1} X_{j+1}^T = P_j A_j P_j. Only
        # (rows x rows) products inside the loop: 4 r^2 c + 34 r^3 FLOPs instead of 20 r^2 c + 10 r^3
        # (-29% for SmolLM2's 576 x 1536 MLP matrices). fp32 only: squaring A is fine in fp32, not in bf16.
        A = torch.bmm(X, X.mT)  # (n, rows, rows)
        Q = None
        for k in range(ns_steps):
            P = torch.baddbmm(A, A, A, beta=b, alpha=c)
            P.diagonal(dim1=-2, dim2=-1).add_(a)  # a I + b A + c A^2
            Q = P if Q is None else torch.bmm(P, Q)
            if k < ns_steps - 1:
                A = torch.bmm(P, torch.bmm(A, P))
        return torch.bmm(Q, X)
    for _ in range(ns_steps):
        A = torch.bmm(X, X.mT)  # (n, rows, rows), the small side
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b A + c A^2
        X = torch.baddbmm(X, B, X, beta=a)  # a X + B X
    return X


def adjusted_lr(lr, adjust_lr_fn, shape):
    """The per-matrix lr scale of torch.optim.Muon: 'original' (Keller) keeps the update's RMS
    independent of the aspect ratio; 'match_rms_adamw' (Moonshot) matches AdamW's update RMS."""
    A, B = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, A / B))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(A, B))
    raise ValueError(f"adjust_lr_fn must be None, 'original' or 'match_rms_adamw', not {adjust_lr_fn!r}")


class Muon(torch.optim.Optimizer):
    """Same arguments and defaults as torch.optim.Muon, plus ns_dtype (None: bf16 on CUDA and on a CPU with
    native bf16 products, fp32 otherwise)."""

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=NS_COEFFICIENTS, eps=1e-7, ns_steps=5, adjust_lr_fn=None, ns_dtype=None):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"lr, momentum and weight_decay must be >= 0, got {lr}, {momentum}, {weight_decay}")
        adjusted_lr(1.0, adjust_lr_fn, (1, 1))  # validates the name early
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon only takes 2-D parameters, got one of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            # under FSDP2 (train.py --fsdp) each parameter is a DTensor whose local tensor is this rank's rows:
            # momentum, weight decay and the update are elementwise and run on those rows alone
            sharded = is_dtensor(params[0])
            local = (lambda t: t.to_local()) if sharded else (lambda t: t)
            weights, grads = [local(p) for p in params], [local(p.grad) for p in params]
            bufs = []
            for p in params:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)  # sharded like p under FSDP2
                bufs.append(local(state["momentum_buffer"]))
            mu = group["momentum"]
            # momentum for all matrices in two fused calls (same arithmetic as torch's lerp)
            torch._foreach_lerp_(bufs, grads, 1 - mu)
            updates = [g.lerp(b, mu) for g, b in zip(grads, bufs)] if group["nesterov"] else bufs
            if sharded:  # only --fsdp imports plumbing/fsdp.py (its torch.distributed imports are slow)
                from plumbing.fsdp import orthogonalize_sharded
            ortho = (orthogonalize_sharded(params, updates, group, orthogonalize, ns_dtype) if sharded
                     else orthogonalize(updates, group))

            lr, wd = group["lr"], group["weight_decay"]
            if wd != 0:
                torch._foreach_mul_(weights, 1 - lr * wd)
            for p, w, o in zip(params, weights, ortho):  # p.shape: the whole matrix's, also under FSDP2
                w.add_(o.to(w.dtype), alpha=-adjusted_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss


def ns_dtype(group, device):
    """The dtype Newton-Schulz runs in: ns_dtype, or bf16 on CUDA and on a CPU with native bf16, else fp32."""
    native = device.type == "cuda" or (device.type == "cpu" and cpu_bf16())
    return group["ns_dtype"] or (torch.bfloat16 if native else torch.float32)


def orthogonalize(updates, group):
    """NS_5 of each 2-D update, stacking same-shape matrices, wide side last (rows <= cols keeps the Gram
    matrix small). Returns the orthogonalized updates in the same order, in ns_dtype."""
    batches = defaultdict(list)
    for i, u in enumerate(updates):
        tall = u.shape[0] > u.shape[1]
        batches[(tuple(u.shape), tall, u.dtype, u.device)].append(i)
    ortho = [None] * len(updates)
    for (shape, tall, _, device), same in batches.items():
        dtype = ns_dtype(group, device)
        # on CPU, stacks of ~16 MB keep the working set near the caches: measured on 2 cores, 4 SmolLM2
        # MLP matrices per bmm beat both one at a time and all 60 at once; a GPU takes everything at once
        chunk = len(same) if device.type == "cuda" else max(1, CPU_CHUNK_ELEMENTS // (shape[0] * shape[1]))
        for c in range(0, len(same), chunk):
            idx = same[c:c + chunk]
            G = torch.stack([updates[i].mT if tall else updates[i] for i in idx])  # (n, rows, cols)
            O = zeropower_via_newtonschulz(G, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype)
            for j, i in enumerate(idx):
                ortho[i] = O[j].mT if tall else O[j]
    return ortho


# -----------------------------------------------------------------------------
# the recipe's split: which parameters Muon trains


def make_optimizers(model, args, precision=None):
    """The recipe's optimizers for train.py's flags (args): Muon on every 2-D matrix of the blocks and the
    adapter; AdamW on embeddings, head, norms and biases (--optimizer adamw: AdamW on everything).
    named_parameters() lists a tied head once. --freeze=base first leaves only the adapter (and with
    --train_norms the norms) trainable, --freeze=outer the core's blocks and the adapter, --exit_gate only the
    gate. Newton-Schulz runs in precision ("bf16", "fp32"; None: Muon's own rule). Returns a list of optimizers
    and the split by name."""
    if args.exit_gate:  # the gate-only stage: every weight of the model stays as it is
        for n, p in model.named_parameters():
            p.requires_grad = n.startswith("exit_gate.")
    if args.freeze != "none":  # base: the adapter-only budget, the parent's weights stay as they are; outer: the
        # core's blocks train too (a retrofit in place, arXiv 2608.11233: everything outside the loop is the parent's)
        train = ("adapter.",) + (("core.",) if args.freeze == "outer" else ())
        for n, p in model.named_parameters():
            p.requires_grad = n.startswith(train) or (args.train_norms and p.ndim == 1 and "norm" in n)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    is_matrix = lambda n, p: p.ndim == 2 and n.startswith(("prelude.", "core.", "coda.", "adapter."))
    if args.optimizer == "adamw":
        groups = {"muon": [], "adamw": params}
    else:  # muon (check_args allows no other)
        groups = {"muon": [(n, p) for n, p in params if is_matrix(n, p)],
                  "adamw": [(n, p) for n, p in params if not is_matrix(n, p)]}
    seen = [id(p) for _, ps in groups.items() for _, p in ps]
    assert sorted(seen) == sorted(id(p) for _, p in params) and len(set(seen)) == len(seen), \
        "optimizer split must cover every trainable parameter exactly once"
    opts = []
    if groups["muon"]:
        opts.append(Muon([p for _, p in groups["muon"]], lr=args.learning_rate, weight_decay=args.weight_decay,
                         momentum=args.muon_momentum, adjust_lr_fn=args.muon_adjust_lr,
                         ns_dtype={"bf16": torch.bfloat16, "fp32": torch.float32}.get(precision)))
    if groups["adamw"]:
        # fused: one kernel for the whole update instead of a loop over tensors (SmolLM2's 28M-entry embedding
        # dominates it on CPU), the same math within fp32 rounding; FSDP2's DTensor shards keep the default
        opts.append(torch.optim.AdamW([p for _, p in groups["adamw"]], lr=args.adam_lr, betas=(args.beta1, args.beta2),
                                      weight_decay=args.weight_decay, fused=not args.fsdp))
    for opt in opts:
        for g in opt.param_groups:
            g["peak_lr"] = g["lr"]
    return opts, {k: [n for n, _ in v] for k, v in groups.items()}
