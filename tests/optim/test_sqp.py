"""SQP-HeavyBall, SQP-Adam and Adam(con) against independent dense computations and known solutions."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.hock_schittkowski import PROBLEMS, Problem
from tests.helpers.sync_counting import SyncCounter
from torch.utils._python_dispatch import TorchDispatchMode

from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall, constraint_jacobian

F64 = torch.float64


def random_instance(m: int = 3, n: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    J = torch.randn(m, n, generator=gen, dtype=F64)
    c = torch.randn(m, generator=gen, dtype=F64)
    g = torch.randn(n, generator=gen, dtype=F64)
    return J, c, g


def one_step(opt_cls, J, c, g, **kwargs):
    x = torch.nn.Parameter(torch.zeros(J.shape[1], dtype=F64))
    opt = opt_cls([x], **kwargs)
    x.grad = g.clone()
    opt.step(constraints=c, jacobian=J, diagnostics=True)
    return x.detach().clone(), opt


def kkt_solve(H: torch.Tensor, J: torch.Tensor, g: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """d of [[H, J^T], [J, 0]] [d; y] = -[g; c], by a dense solve of the full system."""
    m, n = J.shape
    K = torch.zeros(n + m, n + m, dtype=F64)
    K[:n, :n] = H
    K[:n, n:] = J.T
    K[n:, :n] = J
    return torch.linalg.solve(K, -torch.cat([g, c]))[:n]


def test_heavyball_beta0_is_the_kkt_direction():
    J, c, g = random_instance()
    x, _ = one_step(SQPHeavyBall, J, c, g, lr=1.0, beta=0.0, rho=1.0)
    torch.testing.assert_close(x, kkt_solve(torch.eye(8, dtype=F64), J, g, c), rtol=1e-12, atol=1e-12)


def test_heavyball_momentum_matches_spec_written_densely():
    J1, c1, g1 = random_instance(seed=1)
    J2, c2, g2 = random_instance(seed=2)
    beta, lr, rho, h = 0.8, 0.1, 0.7, 2.0
    x = torch.nn.Parameter(torch.zeros(8, dtype=F64))
    opt = SQPHeavyBall([x], lr=lr, beta=beta, rho=rho, h=h)
    expected = torch.zeros(8, dtype=F64)
    r = torch.zeros(8, dtype=F64)
    for J, c, g in [(J1, c1, g1), (J2, c2, g2)]:
        P = torch.eye(8, dtype=F64) - J.T @ torch.linalg.inv(J @ J.T) @ J
        v = -rho * J.T @ torch.linalg.solve(J @ J.T, c)
        r = beta * r - P @ g / h
        expected = expected + lr * (v + P @ r)
        x.grad = g.clone()
        opt.step(constraints=c, jacobian=J)
    torch.testing.assert_close(x.detach(), expected, rtol=1e-12, atol=1e-12)


def test_sqp_adam_matches_spec_written_densely():
    (b1, b2), eps, lr, rho, h = (0.9, 0.99), 1e-7, 0.05, 0.5, 1.5
    x = torch.nn.Parameter(torch.zeros(8, dtype=F64))
    opt = SQPAdam([x], lr=lr, betas=(b1, b2), eps=eps, rho=rho, h=h)
    expected = torch.zeros(8, dtype=F64)
    r = torch.zeros(8, dtype=F64)
    s = torch.zeros(8, dtype=F64)
    for k in range(1, 4):
        J, c, g = random_instance(seed=10 + k)
        P = torch.eye(8, dtype=F64) - J.T @ torch.linalg.inv(J @ J.T) @ J
        v = -rho * J.T @ torch.linalg.solve(J @ J.T, c)
        u = -P @ g / h
        r = b1 * r + u
        s = b2 * s + u * u
        eta = (1 - b1) * math.sqrt(1 - b2**k) / math.sqrt(1 - b2)
        expected = expected + lr * (v + eta * P @ (r / torch.sqrt(s + eps)))
        x.grad = g.clone()
        opt.step(constraints=c, jacobian=J)
    torch.testing.assert_close(x.detach(), expected, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("opt_cls", [SQPHeavyBall, SQPAdam, AdamCon])
def test_linearized_constraint_reduction(opt_cls):
    """J d = -rho c to round-off, over several steps with momentum."""
    rho = 0.3 if opt_cls is not AdamCon else 1.0
    x = torch.nn.Parameter(torch.zeros(8, dtype=F64))
    kwargs = {"rho": rho}
    opt = opt_cls([x], lr=0.2, **kwargs)
    for k in range(5):
        J, c, g = random_instance(seed=20 + k)
        before = x.detach().clone()
        x.grad = g
        opt.step(constraints=c, jacobian=J, diagnostics=True)
        d = (x.detach() - before) / 0.2
        torch.testing.assert_close(J @ d, -rho * c, rtol=1e-10, atol=1e-12)
        assert opt.diagnostics["linearized_feasibility_error"] < 1e-10


def test_sqp_adam_warm_up_for_constant_projected_gradient():
    """For a constant u the tangential step is lr (1 - beta1^k) sign(u)."""
    n, lr, (b1, b2) = 6, 0.01, (0.9, 0.999)
    # J's rows are orthogonal to sign(u) and to u, so P u = u and P sign(u) = sign(u)
    g = torch.tensor([1.0, -2.0, 3.0, -1.0, 2.0, -3.0], dtype=F64)
    J = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0, 0.0]], dtype=F64)
    c = torch.zeros(1, dtype=F64)
    x = torch.nn.Parameter(torch.zeros(n, dtype=F64))
    opt = SQPAdam([x], lr=lr, betas=(b1, b2), eps=1e-14)
    for k in range(1, 30):
        before = x.detach().clone()
        x.grad = g.clone()
        opt.step(constraints=c, jacobian=J)
        torch.testing.assert_close(x.detach() - before, -lr * (1 - b1**k) * torch.sign(g), rtol=1e-9, atol=1e-15)


def test_adam_con_is_the_kkt_system_with_adam_scaling():
    (b1, b2), eps, lr = (0.9, 0.999), 1e-7, 0.1
    x = torch.nn.Parameter(torch.zeros(8, dtype=F64))
    opt = AdamCon([x], lr=lr, betas=(b1, b2), eps=eps, rho=1.0)
    m = torch.zeros(8, dtype=F64)
    v = torch.zeros(8, dtype=F64)
    expected = torch.zeros(8, dtype=F64)
    for k in range(1, 4):
        J, c, g = random_instance(seed=30 + k)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        H = torch.diag(torch.sqrt(v / (1 - b2**k) + eps))
        expected = expected + lr * kkt_solve(H, J, m / (1 - b1**k), c)
        x.grad = g.clone()
        opt.step(constraints=c, jacobian=J)
    torch.testing.assert_close(x.detach(), expected, rtol=1e-10, atol=1e-12)


def run(problem: Problem, opt_cls, lr: float, steps: int, rho=1.0, decay: bool = True, **kwargs):
    x = torch.nn.Parameter(torch.tensor(problem.x0, dtype=F64))
    opt = opt_cls([x], lr=lr, rho=rho, **kwargs)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 - k / steps if decay else 1.0)
    violations = []
    for _ in range(steps):
        opt.zero_grad()
        c = problem.constraints(x)
        J = constraint_jacobian(c, [x])
        problem.objective(x).backward()
        violations.append(c.detach().abs().max().item())
        opt.step(constraints=c.detach(), jacobian=J)
        schedule.step()
    return x.detach(), violations, opt


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
@pytest.mark.parametrize("opt_cls,lr", [(SQPHeavyBall, 0.1), (SQPAdam, 0.1), (AdamCon, 0.1)])
def test_converges_on_hock_schittkowski(problem, opt_cls, lr):
    x, _, _ = run(problem, opt_cls, lr, steps=1000)  # at 1 000: within 7e-14 of x* (all nine, measured)
    assert (x - torch.tensor(problem.solution, dtype=F64)).abs().max() < 1e-6
    assert problem.constraints(x).abs().max() < 1e-8


@pytest.mark.parametrize("opt_cls", [SQPHeavyBall, SQPAdam, AdamCon])
def test_rank_deficient_jacobian_duplicate_row(opt_cls):
    J, c, g = random_instance(m=3, n=8, seed=5)
    J = torch.cat([J, J[:1]])
    c = torch.cat([c, c[:1]])
    x, opt = one_step(opt_cls, J, c, g, lr=0.5, rho=1.0)
    assert torch.isfinite(x).all()
    torch.testing.assert_close(J @ x, -0.5 * c, rtol=1e-9, atol=1e-10)
    assert opt.diagnostics["rank"] == 3


def test_zero_jacobian_rows_and_zero_jacobian():
    J, c, g = random_instance(m=2, n=5, seed=6)
    J[1] = 0.0
    c[1] = 0.0  # an insensitive residual that is satisfied
    x, opt = one_step(SQPHeavyBall, J, c, g, lr=1.0, beta=0.0, rho=1.0)
    assert opt.diagnostics["rank"] == 1
    torch.testing.assert_close(J @ x, -c, rtol=1e-10, atol=1e-12)
    x, opt = one_step(SQPHeavyBall, torch.zeros(2, 5, dtype=F64), c, g, lr=1.0, beta=0.0, rho=1.0)
    assert opt.diagnostics["rank"] == 0
    torch.testing.assert_close(x, -g)


def test_no_constraints_heavyball_is_torch_sgd_momentum():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(4, 3))
    b = torch.nn.Parameter(a.detach().clone())
    ours = SQPHeavyBall([a], lr=0.05, beta=0.9)
    ref = torch.optim.SGD([b], lr=0.05, momentum=0.9)
    for k in range(5):
        grad = torch.randn(4, 3)
        a.grad, b.grad = grad.clone(), grad.clone()
        ours.step(constraints=torch.zeros(0), jacobian=torch.zeros(0, 12))
        ref.step()
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_float32_groups_missing_grad_and_complex():
    """Several groups (one lr each), a parameter without grad, a complex parameter."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(3, 2))
    z = torch.nn.Parameter(torch.randn(2, dtype=torch.complex64))
    unused = torch.nn.Parameter(torch.randn(2))
    opt = SQPHeavyBall([{"params": [w, unused]}, {"params": [z], "lr": 0.1}], lr=0.1, momentum=0.0, rho=1.0)

    def constraints():
        return torch.stack([w.sum() + z.real.sum() - 1.0, (w[0] * z.imag[0]).sum()])

    c = constraints()
    J = constraint_jacobian(c, [w, unused, z])
    assert J.shape == (2, 6 + 2 + 4)
    assert (J[:, 6:8] == 0).all()
    loss = (w**2).sum() + (z.abs() ** 2).sum()
    loss.backward()
    before = torch.cat([w.detach().flatten(), unused.detach().flatten(), torch.view_as_real(z.detach()).flatten()])
    opt.step(constraints=c.detach(), jacobian=J)
    after = torch.cat([w.detach().flatten(), unused.detach().flatten(), torch.view_as_real(z.detach()).flatten()])
    assert w.dtype == torch.float32 and z.dtype == torch.complex64
    torch.testing.assert_close(J.double() @ (after - before).double(), -0.1 * c.detach().double(), rtol=1e-5, atol=1e-6)
    assert (after[6:8] == before[6:8]).all()


def test_mixed_group_lrs_keep_the_tangential_step_in_the_null_space():
    J, c, g = random_instance(m=2, n=6, seed=7)
    a = torch.nn.Parameter(torch.zeros(3, dtype=F64))
    b = torch.nn.Parameter(torch.zeros(3, dtype=F64))
    opt = SQPAdam([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.01}], lr=0.1, rho="full",
                 max_normal_step=None)
    a.grad, b.grad = g[:3].clone(), g[3:].clone()
    opt.step(constraints=c, jacobian=J)
    torch.testing.assert_close(J @ torch.cat([a.detach(), b.detach()]), -c, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"lr": -1.0}, "learning rate"),
        ({"lr": 0.1, "rho": 0.0}, "rho"),
        ({"lr": 0.1, "rho": "half"}, "rho"),
        ({"lr": 0.1, "h": -1.0}, "h="),
    ],
)
def test_bad_hyper_parameters(kwargs, message):
    x = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match=message):
        SQPHeavyBall([x], **kwargs)


@pytest.mark.parametrize("betas", [(1.0, 0.9), (0.9, -0.1)])
def test_bad_betas(betas):
    x = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="betas"):
        SQPAdam([x], lr=0.1, betas=betas)


def test_bad_step_inputs_name_what_is_wrong():
    x = torch.nn.Parameter(torch.zeros(3))
    opt = SQPAdam([x], lr=0.1)
    x.grad = torch.ones(3)
    with pytest.raises(ValueError, match="1-D"):
        opt.step(constraints=torch.zeros(2, 1), jacobian=torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"expected \(m, n\) = \(2, 3\)"):
        opt.step(constraints=torch.zeros(2), jacobian=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="constraints c"):
        opt.step(constraints=torch.tensor([0.0, float("nan")]), jacobian=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="jacobian J"):
        opt.step(constraints=torch.zeros(2), jacobian=torch.full((2, 3), float("inf")))
    x.grad = torch.tensor([0.0, float("nan"), 0.0])
    with pytest.raises(ValueError, match="gradient"):
        opt.step(constraints=torch.zeros(2), jacobian=torch.ones(2, 3))
    assert torch.equal(x.detach(), torch.zeros(3))


@pytest.mark.parametrize("row_scale", [1.0, 1e2, 1e3])
def test_projection_accuracy_with_ill_conditioned_jacobian(row_scale):
    """J d = -rho c and the projector against a dense pseudo-inverse, as J's rows are scaled apart
    (refinement switches on above the conditioning threshold)."""
    from lit_constrained.optim import NullSpace

    J, c, g = random_instance(m=4, n=50, seed=9)
    J = J * torch.tensor([1.0, row_scale, 1.0 / row_scale, 1.0], dtype=F64)[:, None]
    ns = NullSpace.from_jacobian(J)
    assert ns.refine == (row_scale > 1.0)
    P = torch.eye(50, dtype=F64) - torch.linalg.pinv(J) @ J
    torch.testing.assert_close(ns.project(g), P @ g, rtol=1e-9, atol=1e-12 * g.norm().item())
    x, opt = one_step(SQPHeavyBall, J, c, g, lr=1.0, beta=0.0, max_normal_step=None)
    residual = (J @ x + c).norm() / c.norm()
    assert residual < 1e-10


def test_singular_values_below_rcond_count_as_rank_deficiency():
    from lit_constrained.optim import NullSpace

    J, _, _ = random_instance(m=4, n=50, seed=9)
    J[2] *= 1e-9  # sigma ratio ~1e-9 < rcond = 1e-7
    assert NullSpace.from_jacobian(J).rank == 3
    assert NullSpace.from_jacobian(J, rcond=1e-6).rank == 3
    J[2] *= 1e3  # sigma ratio ~1e-6 > rcond: kept
    assert NullSpace.from_jacobian(J).rank == 4


# ---------------------------------------------------------------------------- native precision (issue 13)
def svd_jacobian(m: int, n: int, cond: float, seed: int = 0) -> torch.Tensor:
    """float32 J = U diag(sigma) V^T, sigma log-spaced from 1 to 1 / cond."""
    gen = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=F64))
    V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=F64))
    sigma = torch.logspace(0, -math.log10(cond), m, dtype=F64)
    return ((U * sigma) @ V.T).float()


# Measured over 18 instances (J seeds 0-11 with gradient seeds 1-12; J seed 0 with gradient seeds 1-6), the
# refinement's corrections formed apart from the step and, with exact residuals, from split multipliers
# (refinement.refine_): SQP-Adam / SQP-HeavyBall at most 1.2e-7 / 2.3e-7 (cond(J) = 1e2), 4.7e-8 / 9.6e-8
# (1e3), 8.9e-6 / 9.6e-6 (1e5). Adam(con) solves in the scaled variable H^{1/2} d: the float32 rounding of its
# step is amplified by the spread of H^{-1/2} (~1e3 for a random gradient): at most 4.5e-7 (1e2, residuals
# from 64-column blocks), 1.0e-6 (1e3; rounding the exact float64 step to float32 alone gives up to 4.9e-7)
# and 6.5e-5 (1e5), hence its bounds with a 2-3x margin.
ACCURACY = {SQPHeavyBall: (1e-6, 1e-4), SQPAdam: (1e-6, 1e-4), AdamCon: (2e-6, 2e-4)}


def float32_linearized_feasibility_error(opt_cls: type, cond: float, seed: int,
                                         ) -> tuple[float, torch.nn.Parameter, torch.optim.Optimizer]:
    """One float32 step (lr 0.1, rho 1) at n = 1e5, m = 10, J from an SVD: ||J d + c|| / ||c|| with
    d = (x_1 - x_0) / lr, against float64 products; and the parameter and optimizer."""
    n = 100_000
    J = svd_jacobian(10, n, cond, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    c, g = torch.randn(10, generator=gen), torch.randn(n, generator=gen)
    x = torch.nn.Parameter(torch.zeros(n))
    opt = opt_cls([x], lr=0.1, rho=1.0)
    x.grad = g
    opt.step(constraints=c, jacobian=J)
    d = x.detach().double() / 0.1
    return ((J.double() @ d + c.double()).norm() / c.double().norm()).item(), x, opt


@pytest.mark.parametrize("opt_cls", [SQPHeavyBall, SQPAdam, AdamCon])
@pytest.mark.parametrize("cond", [1e2, 1e3, 1e5])
@pytest.mark.parametrize("seed", [0, 5])
def test_float32_step_restores_the_linearized_constraints(opt_cls, cond, seed):
    """||J d + rho c|| / (rho ||c||) for float32 parameters, J from an SVD at n = 1e5, m = 10 (at cond(J) =
    1e2 the refinement residual is the blocked float32 one, at 1e3 and 1e5 the float64-product one);
    seed 5: the instance where the refinement stalled at 4e-6 (cond(J) = 1e3) and 2.5e-4 (1e5) while it
    accumulated its corrections into the step (see refinement.refine_)."""
    error, x, opt = float32_linearized_feasibility_error(opt_cls, cond, seed)
    assert error <= ACCURACY[opt_cls][cond > 1e3], error
    assert x.dtype == torch.float32 and all(t.dtype == torch.float32 for t in opt.state[x].values()
                                                 if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("opt_cls", [SQPHeavyBall, SQPAdam, AdamCon])
@pytest.mark.parametrize("cond", [1.0, 1e5])
def test_at_most_two_host_syncs_per_step(opt_cls, cond):
    """One read on the host per step (finiteness, refinement plan and rank together); a second only when J
    is too ill-conditioned for the blocked Gram (the exact one's refinement count)."""
    J = svd_jacobian(6, 20_000, cond) if cond > 1 else torch.randn(6, 20_000)
    x = torch.nn.Parameter(torch.zeros(20_000))
    opt = opt_cls([x], lr=0.01)
    x.grad = torch.randn(20_000)
    opt.step(constraints=torch.randn(6), jacobian=J)
    with SyncCounter() as syncs:
        opt.step(constraints=torch.randn(6), jacobian=J)
    assert syncs.count <= (1 if cond == 1.0 else 2), syncs.calls


@pytest.mark.parametrize("opt_cls", [SQPHeavyBall, SQPAdam, AdamCon])
def test_float64_reference_path_follows_the_float64_trajectory(opt_cls):
    """precision="float64" with float32 parameters does all the algebra in float64: it stays within the
    float32 rounding of x of the float64-parameter run, and float64 parameters are unchanged by it."""
    runs = {}
    for dtype, precision in [(F64, "native"), (F64, "float64"), (torch.float32, "float64")]:
        x = torch.nn.Parameter(torch.zeros(8, dtype=dtype))
        opt = opt_cls([x], lr=0.05, rho=0.5, precision=precision)
        for k in range(4):
            J, c, g = random_instance(seed=40 + k)
            x.grad = g.to(dtype)
            opt.step(constraints=c.to(dtype), jacobian=J.to(dtype))
        runs[dtype, precision] = x.detach().double()
    assert torch.equal(runs[F64, "native"], runs[F64, "float64"])
    torch.testing.assert_close(runs[torch.float32, "float64"], runs[F64, "native"], rtol=1e-6, atol=1e-6)


class LargeAllocations(TorchDispatchMode):
    """Records the ops whose output is a NEW tensor of at least ``n`` entries."""

    def __init__(self, n: int, persistent: set[int]) -> None:
        super().__init__()
        self.n, self.persistent, self.calls = n, persistent, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.numel() >= self.n:
                if t.untyped_storage().data_ptr() not in self.persistent:
                    self.calls.append(str(func))
        return out


@pytest.mark.parametrize("opt_cls", [SQPHeavyBall, SQPAdam, AdamCon])
def test_no_n_sized_allocation_after_the_first_step(opt_cls):
    n = 5_000
    x = torch.nn.Parameter(torch.randn(n))
    opt = opt_cls([x], lr=0.01)
    J = svd_jacobian(4, n, 1e2)
    for _ in range(2):
        x.grad = torch.randn(n)
        opt.step(constraints=torch.randn(4), jacobian=J)
    x.grad = torch.randn(n)
    c = torch.randn(4)
    tensors = [x, x.grad, J, *opt._workspace.buffers.values()] + [t for entry in opt.state.values() for t in entry.values()
                                                                    if isinstance(t, torch.Tensor)]
    persistent = {t.untyped_storage().data_ptr() for t in tensors}
    with LargeAllocations(n, persistent) as allocations:
        opt.step(constraints=c, jacobian=J)
    assert allocations.calls == [], allocations.calls


def test_per_group_hyperparameters_without_constraints_are_independent_optimizers():
    """m = 0: each group is its own SQP-Adam (betas, eps, h, lr per group)."""
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(3))
    a2, b2 = torch.nn.Parameter(a.detach().clone()), torch.nn.Parameter(b.detach().clone())
    together = SQPAdam([{"params": [a]}, {"params": [b], "betas": (0.5, 0.9), "eps": 1e-3, "h": 2.0, "lr": 0.1}],
                       lr=0.01)
    first = SQPAdam([a2], lr=0.01)
    second = SQPAdam([b2], betas=(0.5, 0.9), eps=1e-3, h=2.0, lr=0.1)
    for _ in range(3):
        ga, gb = torch.randn(5), torch.randn(3)
        a.grad, b.grad, a2.grad, b2.grad = ga, gb, ga.clone(), gb.clone()
        together.step()
        first.step()
        second.step()
    torch.testing.assert_close(a, a2, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(b, b2, rtol=1e-6, atol=1e-7)
