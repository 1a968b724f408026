"""muon.py against torch.optim.Muon (the reference implementation) on the same gradients.

torch.optim.Muon runs Newton-Schulz in bfloat16; ours runs it in fp32 on CPU. Two comparisons:
- ours forced to bf16 (ns_dtype=torch.bfloat16) against torch: same arithmetic, compared tightly;
- ours in fp32 against torch with the tolerance the bf16 rounding itself sets: both are measured
  against a float64 Newton-Schulz of the same published formula; ours must be ~1000x closer to it
  than torch's bf16 is, and ours-vs-torch must then be no larger than torch's own bf16 error (+10%).
"""

import copy as copy_module

import pytest
import torch

from muon import NS_COEFFICIENTS, Muon, newton_schulz, zeropower_via_newtonschulz

# square, wide and tall matrices, several of each shape, so the batched path stacks them
SHAPES = [(64, 64), (64, 64), (32, 96), (32, 96), (32, 96), (96, 32), (96, 32), (48, 80)]


def ns_float64(G, coefficients=NS_COEFFICIENTS, steps=5, eps=1e-7):
    """Keller Jordan's quintic Newton-Schulz iteration, written out in float64 (the exact reference)."""
    a, b, c = coefficients
    X = G.double()
    tall = X.shape[0] > X.shape[1]
    X = X.T if tall else X
    X = X / X.norm().clamp(min=eps)
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


def run_both(kwargs, ns_dtype, steps=3, seed=0):
    """Apply `steps` steps of ours and torch's to identical parameters with identical gradients."""
    g = torch.Generator().manual_seed(seed)
    init = [torch.randn(*s, generator=g) * 0.05 for s in SHAPES]
    ours = [torch.nn.Parameter(w.clone()) for w in init]
    ref = [torch.nn.Parameter(w.clone()) for w in init]
    opt_ours = Muon(ours, ns_dtype=ns_dtype, **kwargs)
    opt_ref = torch.optim.Muon(ref, **kwargs)
    for _ in range(steps):
        grads = [torch.randn(*s, generator=g) for s in SHAPES]
        for p, q, gr in zip(ours, ref, grads):
            p.grad, q.grad = gr.clone(), gr.clone()
        opt_ours.step()
        opt_ref.step()
    return init, ours, ref


HYPER = [
    dict(lr=1e-2, weight_decay=1e-4),  # the paper's wd, torch's default adjust ("original")
    dict(lr=2e-2, weight_decay=0.1, momentum=0.9, nesterov=False, adjust_lr_fn="match_rms_adamw"),
    dict(lr=1e-2, weight_decay=0.0, ns_coefficients=(3.0, -3.2, 1.2), ns_steps=6, adjust_lr_fn="original"),
]


@pytest.mark.parametrize("kwargs", HYPER)
def test_bf16_matches_torch_muon(kwargs):
    # same bf16 arithmetic: the parameter updates agree to a few bf16 ulps of the update itself
    init, ours, ref = run_both(kwargs, torch.bfloat16)
    for w0, p, q in zip(init, ours, ref):
        d_ours, d_ref = p.detach() - w0, q.detach() - w0
        assert (d_ours - d_ref).norm() <= 1e-3 * d_ref.norm(), p.shape


@pytest.mark.parametrize("kwargs", HYPER)
def test_fp32_matches_torch_muon_within_bf16_error(kwargs):
    init, ours, ref = run_both(kwargs, torch.float32, steps=1)
    lr, wd = kwargs["lr"], kwargs["weight_decay"]
    coeffs, steps = kwargs.get("ns_coefficients", NS_COEFFICIENTS), kwargs.get("ns_steps", 5)
    g = torch.Generator().manual_seed(0)
    [torch.randn(*s, generator=g) for s in SHAPES]  # replay the init draws
    grads = [torch.randn(*s, generator=g) for s in SHAPES]
    for w0, p, q, gr in zip(init, ours, ref, grads):
        mu = kwargs.get("momentum", 0.95)
        buf = (1 - mu) * gr  # first step: buffer = lerp(0, g, 1 - mu)
        u = gr.lerp(buf, mu) if kwargs.get("nesterov", True) else buf
        # the exact update direction, recovered from the parameter change: O = (w0 (1 - lr wd) - w1) / adjusted_lr
        exact = ns_float64(u, coeffs, steps)
        A, B = w0.shape
        alr = lr * (max(1, A / B) ** 0.5 if kwargs.get("adjust_lr_fn") in (None, "original") else 0.2 * max(A, B) ** 0.5)
        O_ours = (w0.double() * (1 - lr * wd) - p.detach().double()) / alr
        O_ref = (w0.double() * (1 - lr * wd) - q.detach().double()) / alr
        err_ref = (O_ref - exact).norm() / exact.norm()  # torch's bf16 rounding error, ~1e-2
        err_ours = (O_ours - exact).norm() / exact.norm()  # ours in fp32, ~1e-5 after the param round trip
        assert err_ref > 1e-3 and err_ours < 1e-3 * err_ref * 100, (err_ours, err_ref)
        assert (O_ours - O_ref).norm() / exact.norm() <= 1.1 * err_ref


def test_batched_ns_equals_one_at_a_time():
    g = torch.Generator().manual_seed(1)
    G = torch.randn(5, 32, 96, generator=g)
    batched = zeropower_via_newtonschulz(G)
    for i in range(5):
        single = zeropower_via_newtonschulz(G[i:i + 1])[0]
        torch.testing.assert_close(batched[i], single, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(batched[i].double(), ns_float64(G[i]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("shape", [(32, 96), (48, 40), (64, 64)])  # wide (the reassociated fp32 path), near square
def test_the_fast_iteration_is_the_textbook_one(shape):
    """muon.py's first function, newton_schulz, is the iteration as written down; the stacked speed variant
    computes the same in fp32 (both orientations: Muon transposes tall matrices before stacking them)."""
    G = torch.randn(3, *shape, generator=torch.Generator().manual_seed(2))
    for i in range(3):
        textbook = newton_schulz(G[i].double())
        torch.testing.assert_close(textbook, ns_float64(G[i]), rtol=0, atol=1e-12)
        fast = zeropower_via_newtonschulz(G[i:i + 1] if shape[0] <= shape[1] else G[i:i + 1].mT)[0]
        fast = fast if shape[0] <= shape[1] else fast.mT
        torch.testing.assert_close(fast.double(), textbook, rtol=0, atol=2e-5)
        bf16 = zeropower_via_newtonschulz(G[i:i + 1] if shape[0] <= shape[1] else G[i:i + 1].mT, dtype=torch.bfloat16)[0]
        bf16 = bf16 if shape[0] <= shape[1] else bf16.mT
        assert (bf16.double() - textbook).norm() / textbook.norm() < 0.05  # bf16's own rounding, ~1e-2



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_newton_schulz_costs_what_muon_py_says(dtype):
    """The FLOPs torch's FlopCounterMode counts in zeropower_via_newtonschulz (bench_train.py's profile reports them)
    are muon.py's: 5 (4 r^2 c + 2 r^3) for the plain iteration, 4 r^2 c + 34 r^3 for fp32's reassociation of wide
    matrices (c > 1.5 r); square, wide, nearly square."""
    from torch.utils.flop_counter import FlopCounterMode

    for r, c in [(64, 64), (64, 192), (64, 80)]:
        with FlopCounterMode(display=False) as counter:
            zeropower_via_newtonschulz(torch.randn(1, r, c), NS_COEFFICIENTS, 5, 1e-7, dtype)
        wide_fp32 = dtype == torch.float32 and c > 1.5 * r
        want = 4 * r * r * c + 34 * r ** 3 if wide_fp32 else 5 * (4 * r * r * c + 2 * r ** 3)
        assert counter.get_total_flops() == want, (r, c)

def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s)) for s in SHAPES[:3]]
    opt = Muon(params, lr=1e-2)
    grads = [[torch.randn_like(p) for p in params] for _ in range(3)]
    for p, gr in zip(params, grads[0]):
        p.grad = gr
    opt.step()
    copy = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = Muon(copy, lr=1e-2)
    opt2.load_state_dict(copy_module.deepcopy(opt.state_dict()))  # as a torch.save / torch.load round trip
    for step in (1, 2):
        for ps, o in ((params, opt), (copy, opt2)):
            for p, gr in zip(ps, grads[step]):
                p.grad = gr.clone()
            o.step()
    for p, q in zip(params, copy):
        assert torch.equal(p, q)


def test_refuses_non_matrices():
    with pytest.raises(ValueError, match="2-D"):
        Muon([torch.nn.Parameter(torch.ones(4))])
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        Muon([torch.nn.Parameter(torch.ones(4, 4))], adjust_lr_fn="nope")
