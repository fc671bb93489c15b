"""SQP-MoMo and SQP-MoMo-Adam against independent dense computations (numpy pinv / KKT solves), their
reduction to MoMo / MoMo-Adam without constraints, and Hock-Schittkowski problems at large lrs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers.hock_schittkowski import PROBLEMS, Problem
from lit_constrained.callbacks.step_size import step_size_values
from lit_constrained.optim import MoMo, MoMoAdam, SQPHeavyBall, constraint_jacobian
from lit_constrained.optim.experimental import SQPMoMo, SQPMoMoAdam

F64 = torch.float64
N = 7


# ---------------------------------------------------------------------------- a small nonlinear problem


def objective(x: torch.Tensor, k: int) -> torch.Tensor:
    """f_k(x) = sum 0.5 (x - t_k)^2 + 0.05 x^4, t_k = 0.3 sin(k + 1): a different 'batch' each step."""
    t = 0.3 * math.sin(k + 1)
    return (0.5 * (x - t) ** 2 + 0.05 * x**4).sum()


def constraints(x: torch.Tensor) -> torch.Tensor:
    a = torch.cos(torch.arange(x.numel(), dtype=x.dtype))
    return torch.stack([0.5 * (x @ x - 0.25 * x.numel()), a @ x + 0.1 * (x**3).sum() - 0.2])


def x0() -> torch.Tensor:
    return torch.linspace(-1.0, 1.2, N, dtype=F64)


def evaluate(x: np.ndarray, k: int) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """f, g, c, J at x (numpy), by autograd on a fresh tensor."""
    t = torch.tensor(x, dtype=F64, requires_grad=True)
    f = objective(t, k)
    (g,) = torch.autograd.grad(f, t)
    c = constraints(t)
    J = torch.stack([torch.autograd.grad(c[i], t, retain_graph=True)[0] for i in range(c.numel())])
    return float(f.detach()), g.numpy(), c.detach().numpy(), J.numpy()


def uncapped(kwargs: dict) -> dict:
    """The dense references take the full normal step: no safeguard unless a test asks for one."""
    return {"max_normal_step": None, **kwargs}


def reference(
    adam: bool, lrs: list[float], lower_bound: float, estimate: bool, steps: int, eps: float = 1e-8,
    geometry: str = "adam",
) -> tuple[list[np.ndarray], list[float], list[float]]:
    """The update of the module docstring, written densely in numpy float64: the Euclidean flavour with
    pinv(J) (P = I - J^+ J, n = -J^+ c), the Adam flavour with KKT solves of [[D, J^T], [J, 0]]; Adam's
    ``geometry="euclidean"`` with the explicit projector P = I - J^+ J, D from the second moment of P g,
    n = -J^+ c and the direction P D^-1 P d. Returns the iterates, the step sizes tau_k and the
    lower-bound estimates after each step."""
    beta, beta2 = 0.9, 0.999
    x = x0().numpy().copy()
    fbar = gamma = 0.0
    d = np.zeros(N)
    v = np.zeros(N)
    fstar = lower_bound
    xs, taus, fstars = [], [], []
    for k in range(1, steps + 1):
        f, g, c, J = evaluate(x, k - 1)
        m = len(c)
        weight = 1.0 if (k == 1 and not adam) else 1.0 - beta
        fbar += weight * (f - fbar)
        gamma += weight * (g @ x - gamma)
        d += weight * (g - d)
        rho = 1.0 - beta**k if adam else 1.0
        if adam and geometry == "euclidean":
            P = np.eye(N) - np.linalg.pinv(J) @ J
            v = beta2 * v + (1 - beta2) * (P @ g) ** 2
            Dinv = 1.0 / (eps + np.sqrt(v / (1 - beta2**k)))
            normal = -np.linalg.pinv(J) @ c
            direction = P @ (Dinv * (P @ d))  # P D^-1 P d
        elif adam:
            v = beta2 * v + (1 - beta2) * g * g
            D = np.diag(eps + np.sqrt(v / (1 - beta2**k)))
            K = np.block([[D, J.T], [J, np.zeros((m, m))]])
            normal = np.linalg.solve(K, -np.concatenate([np.zeros(N), c]))[:N]  # J n = -c, D-orthogonal
            direction = -np.linalg.solve(K, -np.concatenate([d, np.zeros(m)]))[:N]  # P_D D^-1 d
        else:
            pinv = np.linalg.pinv(J)
            normal = -pinv @ c
            direction = (np.eye(N) - pinv @ J) @ d  # P d
        slope_sq = d @ direction  # ||P d||^2, d^T P_D D^-1 d = ||P~ D^-1/2 d||^2, or ||D^-1/2 P d||^2
        constant = fbar + d @ x - gamma + d @ normal
        if estimate and rho * fstar >= constant:
            fstar = max(constant / (2 * rho), lower_bound)
        zeta = max(constant - rho * fstar, 0.0) / slope_sq
        tau = min(lrs[k - 1] / rho, zeta)
        x = x + normal - tau * direction
        if estimate:
            fstar = max((constant - 0.5 * tau * slope_sq) / rho, lower_bound)
        xs.append(x.copy())
        taus.append(tau)
        fstars.append(fstar)
    return xs, taus, fstars


def run(cls: type, lrs: list[float], record: bool = True, **kwargs) -> tuple[list[torch.Tensor], list[dict], object]:
    x = torch.nn.Parameter(x0())
    opt = cls([x], lr=lrs[0], **uncapped(kwargs))
    xs, diagnostics = [], []
    for k, lr in enumerate(lrs):
        opt.param_groups[0]["lr"] = lr
        opt.zero_grad()
        loss = objective(x, k)
        loss.backward()
        c = constraints(x.detach())
        J = constraint_jacobian(constraints(x), [x])
        opt.step(lambda: loss, constraints=c, jacobian=J, diagnostics=record)
        xs.append(x.detach().clone())
        diagnostics.append({key: float(v) for key, v in opt.diagnostics.items()})
    return xs, diagnostics, opt


CLASSES = [(SQPMoMo, False, {}), (SQPMoMoAdam, True, {}), (SQPMoMoAdam, True, {"geometry": "euclidean"})]
CLASS_IDS = ["SQPMoMo", "SQPMoMoAdam", "SQPMoMoAdam-euclidean"]
FLAVOURS = [(SQPMoMo, {}), (SQPMoMoAdam, {}), (SQPMoMoAdam, {"geometry": "euclidean"})]
LRS = [1e-3, 2.0, 1e-3, 2.0, 0.5, 2.0, 1e-3, 2.0]  # the cap and the adaptive branch both occur


# ---------------------------------------------------------------------------- against the dense reference


@pytest.mark.parametrize("cls,adam,options", CLASSES, ids=CLASS_IDS)
@pytest.mark.parametrize("lower_bound,estimate", [(0.0, False), (-1.0, True)], ids=["fixed", "estimated"])
def test_matches_the_dense_reference(cls: type, adam: bool, options: dict, lower_bound: float, estimate: bool) -> None:
    xs_ref, taus_ref, fstars_ref = reference(adam, LRS, lower_bound, estimate, len(LRS), **options)
    xs, diagnostics, opt = run(cls, LRS, lower_bound=lower_bound, estimate_lower_bound=estimate, **options)
    for k, (x, x_ref, r, tau) in enumerate(zip(xs, xs_ref, diagnostics, taus_ref)):
        np.testing.assert_allclose(x.numpy(), x_ref, rtol=1e-10, atol=1e-12, err_msg=f"step {k + 1}")
        assert r["tau"] == pytest.approx(tau, rel=1e-9)
    assert float(opt.state["global"]["lower_bound"]) == pytest.approx(fstars_ref[-1], rel=1e-9, abs=1e-12)
    rho = [1 - 0.9 ** (k + 1) if adam else 1.0 for k in range(len(LRS))]
    adaptive = [r["tau"] < lr / q * (1 - 1e-12) for r, lr, q in zip(diagnostics, LRS, rho)]
    assert any(adaptive) and not all(adaptive)  # both branches of the min were taken


@pytest.mark.parametrize("cls,adam,options", CLASSES, ids=CLASS_IDS)
def test_without_a_lower_bound_it_is_the_projected_momentum_step_with_tau_equal_lr(
    cls: type, adam: bool, options: dict
) -> None:
    # f* = -1e30 (in effect -inf): zeta is astronomically large and tau = lr / rho_k at every step; the step is
    # x + n - lr P d (Euclidean, pinv), resp. the KKT step of [[D, J^T], [J, 0]] with right side
    # -[(lr / rho_k) d; c] (Adam), resp. x - J^+ c - (lr / rho_k) P D^-1 P d (Adam, Euclidean geometry: SQP-Adam's
    # projected step with MoMo's momentum), computed densely in `reference`.
    lrs = [0.05] * 8
    xs_ref, taus_ref, _ = reference(adam, lrs, -1e30, False, len(lrs), **options)
    xs, diagnostics, _ = run(cls, lrs, lower_bound=-1e30, **options)
    for k, (x, x_ref, r) in enumerate(zip(xs, xs_ref, diagnostics)):
        rho = 1 - 0.9 ** (k + 1) if adam else 1.0
        assert r["tau"] == pytest.approx(0.05 / rho, rel=1e-15)
        np.testing.assert_allclose(x.numpy(), x_ref, rtol=1e-10, atol=1e-12, err_msg=f"step {k + 1}")


@pytest.mark.parametrize("cls,options", FLAVOURS, ids=CLASS_IDS)
def test_the_step_satisfies_the_linearized_constraints_at_every_step(cls: type, options: dict) -> None:
    # J_k (x_{k+1} - x_k) = J_k n_k = -c_k (rho = "full", J of full row rank) to 1e-10, float64
    x = torch.nn.Parameter(x0())
    opt = cls([x], lr=2.0, **uncapped(options))
    for k in range(30):
        opt.zero_grad()
        loss = objective(x, k)
        loss.backward()
        c = constraints(x.detach())
        J = constraint_jacobian(constraints(x), [x])
        before = x.detach().clone()
        opt.step(lambda: loss, constraints=c, jacobian=J, diagnostics=True)
        residual = J @ (x.detach() - before) + c
        assert residual.norm() <= 1e-10 * max(c.norm(), 1e-300) + 1e-15, (k, residual)
        assert opt.diagnostics["linearized_feasibility_error"] < 1e-10


def test_the_euclidean_geometry_is_the_prox_in_its_metric() -> None:
    # geometry="euclidean" solves min_y <d, y - x> / rho + ||y - x||_M^2 / (2 lr) s.t. J (y - x) = -c (the cap
    # binds: f* = -1e30), with M = (I - P) + pinv(P D^-1 P) (sqp_momo.py): a dense KKT solve with that M, first
    # step (d = (1 - beta1) g, rho = 1 - beta1, D = eps + sqrt(v / (1 - beta2)), v = (1 - beta2) (P g)^2).
    lr, beta1, beta2, eps = 0.05, 0.9, 0.999, 1e-8
    x = torch.nn.Parameter(x0())
    opt = SQPMoMoAdam([x], lr=lr, lower_bound=-1e30, geometry="euclidean", max_normal_step=None)
    loss = objective(x, 0)
    loss.backward()
    c, J = constraints(x.detach()), constraint_jacobian(constraints(x), [x])
    opt.step(lambda: loss, constraints=c, jacobian=J)
    _, g, c_np, J_np = evaluate(x0().numpy(), 0)
    P = np.eye(N) - np.linalg.pinv(J_np) @ J_np
    D = eps + np.sqrt((1 - beta2) * (P @ g) ** 2 / (1 - beta2))
    M = (np.eye(N) - P) + np.linalg.pinv(P @ np.diag(1 / D) @ P, rcond=1e-12, hermitian=True)
    m = len(c_np)
    K = np.block([[M / lr, J_np.T], [J_np, np.zeros((m, m))]])
    dx = np.linalg.solve(K, np.concatenate([-(1 - beta1) * g / (1 - beta1), -c_np]))[:N]
    np.testing.assert_allclose(x.detach().numpy() - x0().numpy(), dx, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------- m = 0: MoMo and MoMo-Adam


MOMO_CASES = [
    dict(),
    dict(estimate_lower_bound=True, lower_bound=-1.0),
    dict(bias_correction=True),
]


@pytest.mark.parametrize("two_groups", [False, True], ids=["one_group", "two_groups"])
@pytest.mark.parametrize(
    "ours,theirs,kwargs",
    [(SQPMoMo, MoMo, case) for case in MOMO_CASES]
    + [(SQPMoMoAdam, MoMoAdam, case) for case in MOMO_CASES[:2]]
    + [(SQPMoMoAdam, MoMoAdam, dict(geometry="euclidean"))],
    ids=["MoMo", "MoMo-estimate", "MoMo-bias", "MoMoAdam", "MoMoAdam-estimate", "MoMoAdam-euclidean"],
)
def test_without_constraints_it_is_momo(ours: type, theirs: type, kwargs: dict, two_groups: bool) -> None:
    # m = 0: n = 0, P = I, so SQP-MoMo is MoMo and SQP-MoMo-Adam is MoMo-Adam (no weight decay): the same
    # trajectory to 1e-12 in float64, the lr alternating so both branches of tau occur.
    def make(cls: type, xs: list[torch.Tensor]):
        groups = [{"params": xs[:1]}, {"params": xs[1:], "lr": 0.3}] if two_groups else [{"params": xs}]
        return cls(groups, lr=1.0, **(uncapped(kwargs) if cls is ours else {k: v for k, v in kwargs.items() if k != "geometry"}))

    a = [torch.nn.Parameter(x0()[:4].clone()), torch.nn.Parameter(x0()[4:].clone())]
    b = [torch.nn.Parameter(x0()[:4].clone()), torch.nn.Parameter(x0()[4:].clone())]
    oa, ob = make(ours, a), make(theirs, b)
    for k, lr in enumerate(LRS * 3):
        for params, opt in ((a, oa), (b, ob)):
            opt.param_groups[0]["lr"] = lr
            opt.zero_grad()
            loss = objective(torch.cat(params), k)
            loss.backward()
            if opt is oa:
                opt.step(lambda: loss, constraints=None, jacobian=None)
            else:
                opt.step(lambda: loss)
        torch.testing.assert_close(torch.cat(a), torch.cat(b), rtol=1e-12, atol=1e-12)
    assert float(oa.state["global"]["lower_bound"]) == pytest.approx(float(ob.state["global"]["lower_bound"]), rel=1e-12)


# ---------------------------------------------------------------------------- Hock-Schittkowski, large lrs


def run_hs(problem: Problem, cls: type, lr: float, steps: int, **kwargs) -> tuple[float, float]:
    """Constant lr, no schedule: (max |x - x*|, max |c|) at the end; inf where the run broke down."""
    x = torch.nn.Parameter(torch.tensor(problem.x0, dtype=F64))
    opt = cls([x], lr=lr, **uncapped(kwargs))
    try:
        for _ in range(steps):
            opt.zero_grad()
            c = problem.constraints(x)
            J = constraint_jacobian(c, [x])
            f = problem.objective(x)
            f.backward()
            opt.step(lambda: f, constraints=c.detach(), jacobian=J)
            if not bool(torch.isfinite(x).all()):
                return math.inf, math.inf
    except ValueError:  # a non-finite step (overflow)
        return math.inf, math.inf
    error = (x.detach() - torch.tensor(problem.solution, dtype=F64)).abs().max().item()
    return error, problem.constraints(x.detach()).abs().max().item()


@pytest.mark.parametrize("lr", [pytest.param(1.0, marks=pytest.mark.slow), pytest.param(10.0, marks=pytest.mark.slow), 100.0])
@pytest.mark.parametrize("cls,options", FLAVOURS, ids=CLASS_IDS)
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_hock_schittkowski_converges_at_large_lrs(problem: Problem, cls: type, options: dict, lr: float) -> None:
    # f* = 0 is the optimal value of HS6, HS28 and HS48: the model's truncation caps the step by itself,
    # so the lr (a cap) can be 1, 10 or 100 with no schedule (measured after 500 steps: max |x - x*| 3.5e-8
    # to 1.8e-7, |c| <= 1e-15, for all 27 cases; lr = 10 and 100 give the same trajectory: the cap never binds).
    error, violation = run_hs(problem, cls, lr, steps=500, **options)
    assert error < 1e-5 and violation < 1e-10, (error, violation)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_sqp_heavyball_diverges_at_the_same_large_lrs(problem: Problem) -> None:
    # the contrast: SQP-HeavyBall with the same constant lr = 10 and 100 (momentum 0.9, rho = "full") fails
    # (measured after 100 steps: max |x - x*| 8.8e3 / 9.1e4 on HS6, > 1e140 on HS28 and HS48, overflow later);
    # on HS48 it diverges at lr = 1 already.
    for lr in (10.0, 100.0):
        error, _ = run_hs(problem, SQPHeavyBall, lr, steps=100, momentum=0.9)
        assert not error < 1.0, (problem.name, lr, error)


# ---------------------------------------------------------------------------- conventions


@pytest.mark.parametrize("cls", [SQPMoMo, SQPMoMoAdam])
def test_the_step_size_monitor_reads_tau_zeta_and_the_lower_bound(cls: type) -> None:
    _, _, opt = run(cls, [0.5, 0.5], estimate_lower_bound=True, lower_bound=-1.0)
    values = step_size_values(opt)
    assert {"tau", "zeta", "lower_bound", "lr"} <= set(values)
    assert torch.equal(values["tau"], opt.diagnostics["tau"]) and torch.equal(values["zeta"], opt.diagnostics["zeta"])
    assert float(values["lower_bound"]) == float(opt.state["global"]["lower_bound"])  # the current estimate


@pytest.mark.parametrize("cls", [SQPMoMo, SQPMoMoAdam])
def test_a_zero_direction_gives_only_the_normal_step(cls: type) -> None:
    x = torch.nn.Parameter(torch.zeros(4, dtype=F64))
    opt = cls([x], lr=1.0, max_normal_step=None)
    J = torch.tensor([[1.0, 2.0, 0.0, 0.0]], dtype=F64)
    c = torch.tensor([0.5], dtype=F64)
    x.grad = torch.zeros(4, dtype=F64)
    opt.step(lambda: torch.tensor(1.0, dtype=F64), constraints=c, jacobian=J, diagnostics=True)
    assert float(opt.diagnostics["tau"]) == 0.0 and bool(torch.isfinite(x).all())
    if cls is SQPMoMo:
        torch.testing.assert_close(x.detach(), -torch.linalg.pinv(J) @ c, rtol=1e-14, atol=1e-15)
    else:
        torch.testing.assert_close(J @ x.detach(), -c, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: SQPMoMo(p, lr=-1.0), "learning rate"),
        (lambda p: SQPMoMo(p, momentum=1.0), "momentum"),
        (lambda p: SQPMoMo(p, rho=0.0), "rho"),
        (lambda p: SQPMoMo(p, lower_bound=math.inf), "lower_bound"),
        (lambda p: SQPMoMo(p, max_normal_step=-1.0), "max_normal_step"),
        (lambda p: SQPMoMoAdam(p, betas=(0.9, 1.0)), "betas"),
        (lambda p: SQPMoMoAdam(p, eps=0.0), "eps"),
        (lambda p: SQPMoMoAdam(p, precision="half"), "precision"),
        (lambda p: SQPMoMoAdam(p, geometry="diagonal"), "geometry"),
    ],
)
def test_bad_hyperparameters_raise(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make([torch.nn.Parameter(torch.zeros(2))])


def test_the_loss_is_required_and_bad_inputs_are_named() -> None:
    x = torch.nn.Parameter(torch.zeros(3, dtype=F64))
    x.grad = torch.ones(3, dtype=F64)
    opt = SQPMoMo([x])
    with pytest.raises(ValueError, match="loss"):
        opt.step(constraints=torch.zeros(1, dtype=F64), jacobian=torch.ones(1, 3, dtype=F64))
    with pytest.raises(ValueError, match="jacobian has shape"):
        opt.step(lambda: 1.0, constraints=torch.zeros(1, dtype=F64), jacobian=torch.ones(2, 3, dtype=F64))
    with pytest.raises(ValueError, match="jacobian J"):
        opt.step(lambda: 1.0, constraints=torch.zeros(1, dtype=F64),
                 jacobian=torch.tensor([[1.0, math.nan, 0.0]], dtype=F64))
    with pytest.raises(ValueError, match="the loss contains 1 non-finite"):
        opt.step(lambda: math.inf, constraints=torch.zeros(1, dtype=F64), jacobian=torch.ones(1, 3, dtype=F64))
    # nothing changed: no step was taken, so no state was kept
    assert torch.equal(x.detach(), torch.zeros(3, dtype=F64))
    assert not opt.state.get("global") and not opt.state.get(x)


@pytest.mark.parametrize("cls,options", FLAVOURS, ids=CLASS_IDS)
def test_groups_with_different_lrs_keep_the_linearized_constraints(cls: type, options: dict) -> None:
    # each group has its own tau_i = min(lr_i / rho, zeta); -diag(tau) P d is projected again, so J dx = -c
    a, b = torch.nn.Parameter(x0()[:3].clone()), torch.nn.Parameter(x0()[3:].clone())
    opt = cls([{"params": [a], "lr": 1e-3}, {"params": [b], "lr": 2.0}], **uncapped(options))
    differed = False
    for k in range(5):
        opt.zero_grad()
        x = torch.cat([a, b])
        loss = objective(x, k)
        loss.backward()
        c = constraints(x.detach())
        J = constraint_jacobian(constraints(torch.cat([a, b])), [a, b])
        before = torch.cat([a, b]).detach()
        opt.step(lambda: loss, constraints=c, jacobian=J, diagnostics=True)
        differed |= float(opt.diagnostics["tau/group0"]) != float(opt.diagnostics["tau/group1"])
        torch.testing.assert_close(J @ (torch.cat([a, b]).detach() - before), -c, rtol=1e-10, atol=1e-12)
    assert differed


@pytest.mark.parametrize("cls,options", FLAVOURS, ids=CLASS_IDS)
def test_rank_deficient_jacobian_and_the_normal_step_cap(cls: type, options: dict) -> None:
    # a duplicated constraint row: the numerical rank is 1, the step stays finite and J dx = -c (c consistent);
    # max_normal_step = r caps ||n|| <= r ||x||
    x = torch.nn.Parameter(torch.ones(4, dtype=F64))
    row = torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=F64)
    J, c = torch.stack([row, row]), torch.tensor([3.0, 3.0], dtype=F64)
    x.grad = torch.tensor([0.3, -0.2, 0.1, 0.4], dtype=F64)
    opt = cls([x], lr=0.1, **uncapped(options))
    opt.step(lambda: torch.tensor(0.5, dtype=F64), constraints=c, jacobian=J, diagnostics=True)
    assert int(opt.diagnostics["rank"]) == 1
    torch.testing.assert_close(J @ (x.detach() - 1.0), -c, rtol=1e-12, atol=1e-12)

    capped = torch.nn.Parameter(torch.ones(4, dtype=F64))
    capped.grad = torch.zeros(4, dtype=F64)
    opt = cls([capped], lr=0.1, max_normal_step=0.1, **options)
    opt.step(lambda: torch.tensor(0.5, dtype=F64), constraints=c[:1], jacobian=J[:1], diagnostics=True)
    assert float((torch.linalg.pinv(J[:1]) @ c[:1]).norm()) > 0.2  # the full normal step is longer than the cap
    assert float(opt.diagnostics["normal_step_norm"]) == pytest.approx(0.2, rel=1e-12)  # 0.1 ||x||, ||x|| = 2
    assert float((capped.detach() - 1.0).norm()) == pytest.approx(0.2, rel=1e-12)  # g = 0: only the normal step


# ---------------------------------------------------------------------------- the kernel's safeguard and corrections


@pytest.mark.parametrize("cls", [SQPMoMo, SQPMoMoAdam])
def test_the_kernels_safeguard_caps_a_far_normal_step(cls: type) -> None:
    """Built on the kernel, SQP-MoMo has the adaptive trust radius (``max_normal_step="adaptive"``): far
    from feasibility the first normal step is capped at 0.02 max(||x_1||, 1); its default is the full
    normal step, -J^+ c, of norm 10."""
    x = torch.nn.Parameter(torch.zeros(4, dtype=F64))
    x.grad = torch.ones(4, dtype=F64)
    J = torch.eye(2, 4, dtype=F64)
    c = torch.tensor([10.0, 0.0], dtype=F64)
    opt = cls([x], max_normal_step="adaptive")
    opt.step(lambda: torch.tensor(1.0, dtype=F64), constraints=c, jacobian=J, diagnostics=True)
    assert float(opt.diagnostics["normal_step_capped"]) == 1.0
    assert float(opt.diagnostics["normal_step_norm"]) == pytest.approx(0.02, rel=1e-12)
    uncapped_opt = cls([torch.nn.Parameter(torch.zeros(4, dtype=F64))])  # the default: None
    uncapped_opt.param_groups[0]["params"][0].grad = torch.ones(4, dtype=F64)
    uncapped_opt.step(lambda: torch.tensor(1.0, dtype=F64), constraints=c, jacobian=J, diagnostics=True)
    assert float(uncapped_opt.diagnostics["normal_step_norm"]) == pytest.approx(10.0, rel=1e-12)


@pytest.mark.parametrize("cls", [SQPMoMo, SQPMoMoAdam])
def test_the_corrections_hold_a_curved_constraint(cls: type) -> None:
    """c(x) = x_0^2 + x_1^2 - 1 (a circle) from a feasible point: a tangential step leaves the circle by
    O(step^2); the kernel's Gauss-Newton corrections (constraint_closure; with J of the step's start they
    converge linearly, hence more than the default 3 for SQP-MoMo-Adam's large first steps) bring max |c|
    below the tolerance."""

    def circle(x: torch.Tensor) -> torch.Tensor:
        return (x[:2].pow(2).sum() - 1.0).reshape(1)

    results = {}
    for corrections in (0, 8):
        x = torch.nn.Parameter(torch.tensor([1.0, 0.0, 0.5], dtype=F64))
        opt = cls([x], lr=0.2, max_corrections=corrections, max_normal_step=None)
        for _ in range(3):
            x.grad = torch.tensor([0.0, -1.0, 0.3], dtype=F64)  # pushes along the tangent (0, 1)
            with torch.no_grad():
                c = circle(x)
                J = torch.cat([2.0 * x[:2], torch.zeros(1, dtype=F64)]).reshape(1, 3)
            opt.step(lambda: torch.tensor(1.0, dtype=F64), constraints=c, jacobian=J,
                     constraint_closure=lambda: circle(x.detach()), diagnostics=True)
        results[corrections] = float(circle(x.detach()).abs())
    assert results[0] > 1e-4  # the tangential steps' curvature
    # tol = constraint_tol * max(max |c_1|, 1) = 1e-6 (c_1 = 0: the start is feasible)
    assert results[8] <= 1e-6


# ---------------------------------------------------------------------------- the experimental namespace


@pytest.mark.parametrize("cls", [SQPMoMo, SQPMoMoAdam])
def test_the_experimental_class_paths_are_trusted_and_resolve(cls: type) -> None:
    """A checkpoint's saved spec (module.QualName) imports back through the trusted-module allowlist, and the
    short path configs use names the same class; the stable namespace no longer exports it."""
    import lit_constrained.optim as stable
    from lit_constrained.class_spec import TRUSTED_MODULES, as_class_spec, import_class

    spec = as_class_spec(cls, "optimizer")
    assert spec is not None and spec["class_path"] == f"lit_constrained.optim.experimental.sqp_momo.{cls.__name__}"
    assert import_class(spec["class_path"], TRUSTED_MODULES) is cls
    assert import_class(f"lit_constrained.optim.experimental.{cls.__name__}", TRUSTED_MODULES) is cls
    assert cls.__name__ not in stable.__all__ and not hasattr(stable, cls.__name__)
