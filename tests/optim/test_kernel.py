"""The projected-step kernel's pieces (projection.py, safeguard.py, corrections.py) against independent
computations: a dense pseudo-inverse, the safeguard's closed form, and where warnings point."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from lit_constrained.optim import SQPAdam
from lit_constrained.optim.linalg.gram_factor import GramFactor
from lit_constrained.optim.linalg.gram import gram
from lit_constrained.optim.linalg.refinement import RefinementPlan
from lit_constrained.optim.projection import Projector
from lit_constrained.optim.safeguard import ADAPTIVE_NORMAL_STEP, normal_step_scale

F64 = torch.float64


def random_jacobian(m: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(m, n, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_projector_operations_against_a_dense_pseudo_inverse():
    J = random_jacobian(4, 40)
    projector = Projector(J, GramFactor.from_gram(gram(J)), RefinementPlan(1, True))
    w = torch.randn(40, dtype=F64, generator=torch.Generator().manual_seed(1))
    c = torch.randn(4, dtype=F64, generator=torch.Generator().manual_seed(2))
    pinv = torch.linalg.pinv(J)
    P = torch.eye(40, dtype=F64) - pinv @ J
    torch.testing.assert_close(projector.project(w, torch.empty_like(w), 0.5), 0.5 * P @ w, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(projector.normal(c, torch.empty_like(w)), -pinv @ c, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(projector.merged(w, 0.5, c, torch.empty_like(w)), 0.5 * P @ w - pinv @ c,
                               rtol=1e-12, atol=1e-12)
    out = projector.unrefined(w, 0.5, torch.empty_like(w)).add_(-pinv @ c)
    torch.testing.assert_close(projector.refine(out, c), 0.5 * P @ w - pinv @ c, rtol=1e-12, atol=1e-12)


def test_the_adaptive_radius_follows_the_trust_region_rule():
    """The first capped step is tau = 0.02 max(||x_1||, 1) / ||J^+ c||; after a capped step whose actual
    decrease of ||c|| matches the linearized one (ratio 1 > 3/4) the radius doubles."""
    J = torch.eye(2, 3, dtype=F64)
    factor = GramFactor.from_gram(gram(J))
    c = torch.tensor([3.0, 4.0], dtype=F64)  # ||J^+ c|| = 5
    state: dict = {}
    x_norm = lambda: torch.tensor(2.0, dtype=F64)  # noqa: E731
    scale, norm = normal_step_scale("adaptive", "full", 1.0, torch.tensor(5.0, dtype=F64), c, factor, x_norm, state)
    rule = ADAPTIVE_NORMAL_STEP
    assert float(norm) == pytest.approx(rule.initial * 2.0)
    assert float(scale) == pytest.approx(rule.initial * 2.0 / 5.0)
    assert bool(state["normal_step_capped"])
    # the predicted violation ||c - tau c||; an actual one equal to it doubles the radius
    c_next = (1.0 - float(scale)) * c
    normal_step_scale("adaptive", "full", 1.0, c_next.norm(), c_next, factor, x_norm, state)
    assert float(state["normal_radius"]) == pytest.approx(rule.initial * rule.grow)
    # a fixed cap relative to ||x||; a numeric rho switches the adaptive radius off
    scale, norm = normal_step_scale(0.1, 2.0, 0.5, torch.tensor(5.0, dtype=F64), c, factor, x_norm, {})
    assert float(norm) == pytest.approx(0.2) and float(scale) == pytest.approx(0.5 * 0.2 / 2.5)
    scale, norm = normal_step_scale("adaptive", 2.0, 0.5, torch.tensor(5.0, dtype=F64), c, factor, x_norm, {})
    assert float(scale) == 0.5 and float(norm) == pytest.approx(2.5)


def test_refinement_plan_decoding():
    assert RefinementPlan.decode((2.0, 1.0), 10) == RefinementPlan(2, True)
    assert RefinementPlan.decode((3.0, 0.0), 10).exact_gram  # more than MAX_REFINEMENTS = 2 at m <= 64
    assert not RefinementPlan.decode((3.0, 0.0), 100).exact_gram  # m > 64: up to 8 with the blocked Gram


def test_the_rank_warning_points_at_the_callers_line():
    x = torch.nn.Parameter(torch.zeros(4))
    x.grad = torch.ones(4)
    opt = SQPAdam([x])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step(constraints=torch.ones(2), jacobian=torch.ones(2, 4))  # two equal rows: rank 1
    [warning] = [w for w in caught if "numerical rank" in str(w.message)]
    assert warning.filename == __file__, warning.filename
    assert not math.isnan(float(x.detach().sum()))


def test_a_step_after_one_that_needed_the_exact_gram_forms_it_at_once(monkeypatch):
    """J too ill-conditioned for the blocked Gram (cond(J) = 1e5, float32): the first step forms the blocked
    Gram, finds it insufficient and forms the exact one; the next steps of that shape go to the exact Gram
    directly. The trajectory is bit-identical to re-deciding at every step (the same exact factor and
    refinements)."""
    import lit_constrained.optim.workspace as factorization_module

    calls = {"blocked": 0}
    blocked = factorization_module.scaled_gram

    def counted(*args, **kwargs):
        calls["blocked"] += 1
        return blocked(*args, **kwargs)

    monkeypatch.setattr(factorization_module, "scaled_gram", counted)
    gen = torch.Generator().manual_seed(5)
    m, n = 6, 4000
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=F64))
    V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=F64))
    J = ((U * torch.logspace(0, -5, m, dtype=F64)) @ V.T).float()
    grads = [torch.randn(n, generator=gen) for _ in range(4)]
    cs = [torch.randn(m, generator=gen) for _ in range(4)]
    runs = []
    for redecide in (False, True):
        x = torch.nn.Parameter(torch.zeros(n))
        opt = SQPAdam([x], lr=1e-2, max_normal_step=None)
        calls["blocked"] = 0
        trajectory = []
        for g, c in zip(grads, cs):
            if redecide:
                opt._workspace.exact_gram_for.clear()
            x.grad = g.clone()
            opt.step(constraints=c, jacobian=J)
            trajectory.append(x.detach().clone())
        runs.append((trajectory, calls["blocked"]))
    (sticky, sticky_calls), (fresh, fresh_calls) = runs
    assert sticky_calls == 1 and fresh_calls == 4
    assert all(torch.equal(a, b) for a, b in zip(sticky, fresh))


def test_an_optimizer_must_give_its_step_function():
    """The class's contract is abstract methods, not a runtime stub: a ConstrainedOptimizer without
    ``_step_function`` (the call of its functional core) cannot be created."""
    from lit_constrained.optim.constrained import ConstrainedOptimizer

    class NoStep(ConstrainedOptimizer):
        def _init_state(self, n, device, dtype):
            return {"step": 0}

    x = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(TypeError, match="_step_function"):
        NoStep([x], {})


def test_a_sparse_gradient_is_refused_by_name_before_anything_changes():
    x = torch.nn.Parameter(torch.zeros(3))
    x.grad = torch.zeros(3).to_sparse()
    opt = SQPAdam([x])
    with pytest.raises(ValueError, match="SQPAdam does not support sparse gradients"):
        opt.step(constraints=torch.ones(1), jacobian=torch.ones(1, 3))
    assert torch.equal(x.detach(), torch.zeros(3)) and not opt.state
