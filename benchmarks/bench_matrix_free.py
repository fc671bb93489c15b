r"""Forming J against a matrix-free step (J v, J^T z from JVP/VJP, CG on J J^T) and a low-rank sketch of J,
for the linear algebra of ONE SQP-Adam step on real constraint Jacobians (issue 28, part 2).

The step (SQP-Adam, ``rho="full"``, :mod:`lit_constrained.optim.linalg`) needs, with
:math:`G = J J^T`, g the objective's gradient, w the Adam direction, a = lr and s = 1:

.. math::
    P g = g - J^T G^+ (J g), \qquad \delta = a w - J^T z, \quad z = G^+ (s c + a J w)
    \quad (J \delta = -s c),

i.e. two solves with G (three or more with the post-step corrections, :math:`G^+ c(x_{k+1})` each).

* **(a) the package's path**: J by the per-point engine (``ConstrainedModule.constraint_jacobian`` of a
  task that declares ``imposed()``), the blocked Gram (``gram.gram``), its factor
  (``GramFactor.from_gram``: eigh for m <= 64, ``PivotedGramFactor``'s pivoted Cholesky above on the CPU)
  and the step's products (J g, J^T y, and ``merged_step`` with the refinement the optimizer's plan asks
  for: ``RefinementPlan.decode(refinement_counts(...))``; where the plan asks for the exact float64 Gram,
  its Gram and factor are timed too). ``sqp step`` times the package's ``SQPAdam.step`` given c and J: the same algebra as the
  optimizer runs it (a cross-check of Gram + factor + products).
* **(b) matrix-free**: :math:`J^T z` by reverse mode (``torch.autograd.grad(c, params, z,
  retain_graph=True)`` on c's graph, built once a step) and :math:`J v` by forward mode, timed two ways:
  ``torch.func.jvp`` of the constraints w.r.t. the parameters (``functional_call``: a forward and its
  tangent at every call) and the double-backward identity :math:`J v = \partial_z (z^T J) v` (one
  backward of the graph of :math:`J^T z`, built once a step with ``create_graph``); the table uses the
  faster. One CG iteration on :math:`G z = b` is one :math:`J^T p` and one :math:`J (J^T p)` (plus
  m-vector updates): ``cg iteration`` is the median time of 10 real iterations / 10.
  **Iterations needed** (relative residual :math:`\|b - G z_k\| \le 10^{-6}\|b\|`, the step's
  ``TARGET_ERROR``): CG in float64 on :math:`U^T G U = \Lambda` (G's eigenbasis, exact float64 G of
  the float32 J) on the range part of b (:math:`\lambda > 10^{-14}\lambda_{\max}`, the package's
  ``rcond``), capped at ``--max-iterations``: a LOWER bound for the real float32 matrix-free CG (exact
  products, no null-space part), cross-checked against CG with the explicit float64 G at m <= 200.
  The real float32 matrix-free CG is also run for ``--real-iterations`` on the merged step's b, its
  true residual measured with the float64 G.
* **(c) a low-rank sketch of the formed J** (a randomized range finder): :math:`Y = J \Omega` (Omega
  n x l Gaussian), :math:`Q = \mathrm{qr}(Y)`, :math:`B = Q^T J` (l x n), and
  :math:`G^+ \approx Q (B B^T)^+ Q^T` (the package's factor of the l x l Gram): it replaces the m x m
  Gram (:math:`m^2 n`) by two m x n x l products. Its merged step's constraint residual
  :math:`\|J\delta + sc\| / \|sc\|` is measured (float64 products) beside the package's and the floor
  :math:`\min_x \|J x + sc\| / \|sc\|` (the part of sc outside the range of J).

Models: chemistry (``Chemistry()`` + ``ChemistryData(n_constraints=m)``, n = 8 964, full batch of 6 400
rows) and Poisson (``Poisson(hidden=64, depth=3)``, n = 8 577, ``PoissonData(n_pde_imposed=4m/5,
n_boundary_imposed=m/5)``: second-order input derivatives), at initialization (seed 0). Timings:
interleaved rounds (J, gram, factor, products, sqp step, vjp, jvp, cg, sketch, J, ...), medians, one
thread. Usage (from the repository root)::

    python benchmarks/bench_matrix_free.py [--cases chemistry:100,chemistry:1000,chemistry:3000,poisson:200,poisson:1000]
        [--repeats 5] [--out benchmarks/results/matrix_free.json]

(one thread: ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` default to 1 for torch and NumPy alike).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# One BLAS thread unless the caller sets more: the pivoted Cholesky factor of a large Gram (NumPy/SciPy:
# OpenBLAS) and torch alike. (OpenBLAS's default, a thread per core, spins against the other load on a shared
# 2-core machine: the pivoted Cholesky of a 1 000 x 1 000 Gram measured seconds instead of milliseconds.)
# Before NumPy loads.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
THREADS = int(os.environ["OMP_NUM_THREADS"])

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved_medians, quiet, repeated  # noqa: E402  (benchmarks/harness.py)
from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)

from lit_constrained.optim import SQPAdam  # noqa: E402
from lit_constrained.optim.linalg.gram_factor import GramFactor  # noqa: E402
from lit_constrained.optim.hyperparameters import DEFAULT_RCOND  # noqa: E402
from lit_constrained.optim.linalg.gram import exact_gram, gram, gram_partials_shape
from lit_constrained.optim.linalg.merged_step import merged_step
from lit_constrained.optim.linalg.products import add_rmatvec_, chunk_columns, exact_matvec, matvec
from lit_constrained.optim.linalg.refinement import RefinementPlan, TARGET_ERROR, exact_refinements, refinement_counts

LR = 5e-4
DEFAULT_CASES = "chemistry:100,chemistry:1000,chemistry:3000,poisson:200,poisson:1000"
TOLERANCES = (1e-2, 1e-4, TARGET_ERROR)
CG_TIMED_ITERATIONS = 10


# ---------------------------------------------------------------------------- the cases
def make_case(task: str, m: int) -> tuple[nn.Module, dict[str, Tensor]]:
    """(model at initialization, seed 0; its full training batch, prepared) for ``task`` with m constraints."""
    torch.manual_seed(0)
    if task == "chemistry":
        from lit_constrained.tasks.chemistry import Chemistry, ChemistryData

        data = ChemistryData(batch_mode="full", n_ic=100, cache_dir=None, n_constraints=m)
        model = Chemistry()
    elif task == "poisson":
        from lit_constrained.tasks.poisson import Poisson, PoissonData

        pde = m * 4 // 5
        data = PoissonData(batch_mode="full", n_pde_imposed=pde, n_boundary_imposed=m - pde)
        model = Poisson(hidden=64, depth=3)
    else:
        raise ValueError(f"unknown task {task!r}: use chemistry or poisson")
    data.setup("fit")
    return model, model.prepare_batch(next(iter(data.train_dataloader())))


class ConstraintsOf(nn.Module):
    """``module.constraints(batch)`` as a module's forward, so that ``functional_call`` on this wrapper
    evaluates c with the module's parameters swapped (``"module.<name>"``)."""

    def __init__(self, module: nn.Module, batch: dict[str, Tensor]) -> None:
        super().__init__()
        self.module = module
        self.batch = batch

    def forward(self) -> Tensor:
        return self.module.constraints(self.batch)


def flat(tensors: tuple[Tensor, ...] | list[Tensor]) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def split_like(v: Tensor, params: list[Tensor]) -> list[Tensor]:
    """The n-vector v as pieces shaped like ``params``."""
    pieces, start = [], 0
    for p in params:
        pieces.append(v[start:start + p.numel()].view_as(p))
        start += p.numel()
    return pieces


# ---------------------------------------------------------------------------- (b) matrix-free operators
@dataclass
class MatrixFree:
    r"""J v and J^T z without J, for c at the model's current parameters (float32, the model's dtype).

    ``rmatvec(z)`` = :math:`J^T z`: one backward of c's graph (kept). ``matvec(v)`` = :math:`J v` by the
    double-backward identity: with :math:`h(z) = J^T z` built once with ``create_graph`` (z a dummy
    leaf), :math:`J v = \partial_z (h(z) \cdot v)`, one backward of h's graph. ``func_matvec(v)``: the
    same by ``torch.func.jvp`` (forward-mode; a forward and its tangent per call)."""

    model: nn.Module
    batch: dict[str, Tensor]
    params: list[Tensor]

    def setup(self) -> None:
        """c's graph and the graph of :math:`J^T z` (once a step)."""
        with torch.enable_grad():
            self.c = self.model.constraints(self.batch)
            self.dummy = torch.zeros_like(self.c, requires_grad=True)
            self.h = torch.autograd.grad(self.c, self.params, self.dummy, create_graph=True, allow_unused=True,
                                         materialize_grads=True)

    def rmatvec(self, z: Tensor) -> Tensor:
        return flat(torch.autograd.grad(self.c, self.params, z, retain_graph=True, allow_unused=True,
                                        materialize_grads=True))

    def matvec(self, v: Tensor) -> Tensor:
        # (pieces of h that do not depend on z -- unused parameters -- get no gradient: allow_unused)
        pieces = split_like(v, self.params)
        used = [(h, p) for h, p in zip(self.h, pieces) if h.requires_grad]
        (out,) = torch.autograd.grad([h for h, _ in used], self.dummy, [p for _, p in used], retain_graph=True)
        return out

    def func_matvec(self, v: Tensor) -> Tensor:
        wrapper = ConstraintsOf(self.model, self.batch)
        names = [f"module.{name}" for name, _ in self.model.named_parameters()]
        theta = {key: p.detach() for key, p in zip(names, self.params)}
        tangent = dict(zip(names, split_like(v, self.params)))
        with torch.no_grad():
            _, out = jvp(lambda th: functional_call(wrapper, th, ()), (theta,), (tangent,))
        return out


def conjugate_gradients(apply: Callable[[Tensor], Tensor], b: Tensor, iterations: int,
                        record: Callable[[int, Tensor], None] | None = None) -> Tensor:
    """``iterations`` CG iterations on G z = b from z = 0 (``apply(p)`` = G p); ``record(k, z)`` after each."""
    z = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = torch.dot(r, r)
    for k in range(1, iterations + 1):
        Gp = apply(p)
        alpha = rr / torch.dot(p, Gp)
        z.add_(p, alpha=float(alpha))
        r.sub_(Gp, alpha=float(alpha))
        rr_new = torch.dot(r, r)
        p.mul_(float(rr_new / rr)).add_(r)
        rr = rr_new
        if record is not None:
            record(k, z)
    return z


def eigenbasis_cg_iterations(eigenvalues: np.ndarray, coefficients: np.ndarray, tolerances: tuple[float, ...],
                             cap: int) -> tuple[list[int | None], float]:
    r"""CG in float64 on :math:`\Lambda y = \beta` (G in its eigenbasis, :math:`\beta = U^T b`): the
    iterations to reach each relative residual :math:`\|\beta - \Lambda y_k\| / \|\beta\|` (None: not
    within ``cap``) and the smallest relative residual reached."""
    y = np.zeros_like(coefficients)
    r = coefficients.copy()
    p = r.copy()
    rr = float(r @ r)
    norm = math.sqrt(rr)
    reached: list[int | None] = [None] * len(tolerances)
    best = 1.0
    for k in range(1, cap + 1):
        Gp = eigenvalues * p
        alpha = rr / float(p @ Gp)
        y += alpha * p
        r -= alpha * Gp
        rr_new = float(r @ r)
        relative = math.sqrt(rr_new) / norm
        best = min(best, relative)
        for i, tol in enumerate(tolerances):
            if reached[i] is None and relative <= tol:
                reached[i] = k
        if reached[-1] is not None:
            break
        p = r + (rr_new / rr) * p
        rr = rr_new
    return reached, best


def explicit_cg_iterations(G: np.ndarray, b: np.ndarray, tol: float, cap: int) -> int | None:
    """CG in float64 with the explicit G (the cross-check of :func:`eigenbasis_cg_iterations`)."""
    z, r = np.zeros_like(b), b.copy()
    p, rr, norm = r.copy(), float(b @ b), math.sqrt(float(b @ b))
    for k in range(1, cap + 1):
        Gp = G @ p
        alpha = rr / float(p @ Gp)
        z += alpha * p
        r -= alpha * Gp
        rr_new = float(r @ r)
        if math.sqrt(rr_new) <= tol * norm:
            return k
        p = r + (rr_new / rr) * p
        rr = rr_new
    return None


# ---------------------------------------------------------------------------- (c) a low-rank sketch
@dataclass
class Sketch:
    r""":math:`J \approx Q B`, Q (m x l) orthonormal, :math:`B = Q^T J`; :math:`G^+ \approx Q (B B^T)^+ Q^T`."""

    q: Tensor
    factor: GramFactor

    @classmethod
    def of(cls, J: Tensor, width: int, generator: torch.Generator) -> "Sketch":
        omega = torch.randn(J.shape[1], width, generator=generator, dtype=J.dtype)
        q, _ = torch.linalg.qr((J @ omega).to(torch.float64))
        B = q.T.to(J.dtype) @ J
        return cls(q, GramFactor.from_gram(gram(B), DEFAULT_RCOND))

    def solve(self, b: Tensor) -> Tensor:
        """Q (B B^T)^+ Q^T b (float64)."""
        return self.q @ self.factor.solve(self.q.T @ b)


def sketch_step(J: Tensor, sketch: Sketch, w: Tensor, a: float, sc: Tensor, g: Tensor, refinements: int,
                workspace: tuple[Tensor, Tensor]) -> Tensor:
    """The step's products with the sketch's G^+: P g (discarded: its cost), then a w - J^T z and
    ``refinements`` steps of iterative refinement toward J delta = -sc as the package refines (residual
    from float64 products, correction J^T G~^+ r from split multipliers)."""
    y = sketch.solve(matvec(J, g)).to(J.dtype)
    torch.addmv(g, J.T, y, alpha=-1.0)
    z = sketch.solve(sc + a * matvec(J, w)).to(J.dtype)
    delta = torch.addmv(w, J.T, z, beta=a, alpha=-1.0)
    for _ in range(refinements):
        r = -sc - exact_matvec(J, delta, workspace)
        add_rmatvec_(delta, J, sketch.solve(r), split=True)
    return delta


# ---------------------------------------------------------------------------- one case
def measure(task: str, m: int, repeats: int, cap: int, real_iterations: int, real_seconds_budget: float,
            widths: list[int]) -> dict[str, Any]:
    model, batch = make_case(task, m)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    with torch.enable_grad():
        g = flat(torch.autograd.grad(model.objective(batch), params, allow_unused=True, materialize_grads=True))
    c = model.constraints(batch).detach()
    J = model.constraint_jacobian(batch, c, params)
    w = -torch.sign(g)  # Adam's first direction r / sqrt(s) = sign(u), u ~ -g
    a = LR
    sc = c.double()  # s = 1 (rho = "full")

    # (a) the package's path, pieces as the optimizer runs them
    workspace = torch.empty(gram_partials_shape(tuple(J.shape)), dtype=J.dtype)
    G = gram(J, workspace)
    factor = GramFactor.from_gram(G, DEFAULT_RCOND)
    plan = RefinementPlan.decode(tuple(refinement_counts(factor, n, J.dtype).tolist()), m)
    exact_residual, refinements = plan.exact_residual, plan.steps
    chunk = min(n, chunk_columns(m))
    exact_ws = (torch.empty(m, chunk, dtype=torch.float64), torch.empty(chunk, dtype=torch.float64))
    exact_path = plan.exact_gram
    step_factor = factor
    if exact_path:  # the plan recomputes the Gram from float64 products (as the optimizer's step does)
        G_exact = exact_gram(J, exact_ws)
        step_factor = GramFactor.from_gram(G_exact, DEFAULT_RCOND)
        refinements, exact_residual = exact_refinements(step_factor, J.dtype), True
    delta = torch.empty_like(g)
    scratch = torch.empty_like(g)

    def products() -> Tensor:
        y = step_factor.solve(matvec(J, g)).to(J.dtype)
        torch.addmv(g, J.T, y, alpha=-1.0)  # P g
        return merged_step(J, step_factor, w, a, sc, refinements, delta, exact_ws if exact_residual else None,
                           None, exact_residual, scratch if exact_residual else None)

    shadow = [nn.Parameter(p.detach().clone()) for p in params]
    for p, piece in zip(shadow, split_like(g, params)):
        p.grad = piece.clone()
    optimizer = SQPAdam(shadow, lr=LR, rho="full")

    # (b) matrix-free
    free = MatrixFree(model, batch, params)
    free.setup()
    z_probe = torch.randn(m, generator=torch.Generator().manual_seed(1))
    b_merged = (sc + a * (J.double() @ w.double())).float()

    def cg_timed() -> None:
        conjugate_gradients(lambda p: free.matvec(free.rmatvec(p)), b_merged, CG_TIMED_ITERATIONS)

    generator = torch.Generator().manual_seed(2)
    widths = [width for width in widths if 2 * width <= m]
    runners: dict[str, Callable[[int], Any]] = {
        "J": repeated(lambda: model.constraint_jacobian(batch, c, params)),
        "gram": repeated(lambda: gram(J, workspace)),
        "factor": repeated(lambda: GramFactor.from_gram(G, DEFAULT_RCOND)),
    }
    if exact_path:
        runners["exact gram"] = repeated(lambda: exact_gram(J, exact_ws))
        runners["exact factor"] = repeated(lambda: GramFactor.from_gram(G_exact, DEFAULT_RCOND))
    runners.update({
        "products": repeated(products),
        "sqp step": repeated(lambda: optimizer.step(constraints=c, jacobian=J)),
        "mf setup": repeated(free.setup),
        "vjp": repeated(lambda: free.rmatvec(z_probe)),
        "jvp double-backward": repeated(lambda: free.matvec(g)),
        "jvp torch.func": repeated(lambda: free.func_matvec(g)),
        "cg x10": repeated(cg_timed),
    })
    for width in widths:
        runners[f"sketch l={width}"] = repeated(lambda width=width: Sketch.of(J, width, generator))
    times = interleaved_medians(runners, repeats=repeats, block=1, warmup=1)
    ms = {name: 1e3 * t for name, t in times.items()}

    # checks of the matrix-free products against the formed J (relative errors)
    Jd = J.double()
    checks = {
        "vjp_vs_J": float((free.rmatvec(z_probe).double() - Jd.T @ z_probe.double()).norm()
                          / (Jd.T @ z_probe.double()).norm()),
        "jvp_double_backward_vs_J": float((free.matvec(g).double() - Jd @ g.double()).norm() / (Jd @ g.double()).norm()),
        "jvp_func_vs_J": float((free.func_matvec(g).double() - Jd @ g.double()).norm() / (Jd @ g.double()).norm()),
    }

    # the spectrum of G (exact float64 products of the float32 J) and CG's iterations
    G64 = (Jd @ Jd.T).numpy()
    eigenvalues, basis = np.linalg.eigh(G64)
    largest = float(eigenvalues[-1])
    kept = eigenvalues > DEFAULT_RCOND**2 * largest
    cond_kept = largest / float(eigenvalues[kept][0])
    rhs = {"J g (projected gradient)": (Jd @ g.double()).numpy(), "s c + a J w (merged step)": b_merged.double().numpy()}
    iterations: dict[str, Any] = {}
    for name, b in rhs.items():
        beta = basis.T @ b
        null_part = float(np.linalg.norm(beta[~kept]) / np.linalg.norm(beta))
        reached, best = eigenbasis_cg_iterations(eigenvalues[kept], beta[kept], TOLERANCES, cap)
        row = {"to": dict(zip([f"{t:g}" for t in TOLERANCES], reached)), "best_relative_residual": best,
               "null_part": null_part}
        if m <= 200:
            b_range = basis[:, kept] @ beta[kept]
            row["explicit_G_to_1e-06"] = explicit_cg_iterations(G64, b_range, TARGET_ERROR, cap)
        iterations[name] = row

    # the real float32 matrix-free CG on the merged step's b: its true residual (float64 G)
    b64 = b_merged.double().numpy()
    history: list[tuple[int, float]] = []

    def record(k: int, z: Tensor) -> None:
        if k % 10 == 0 or k == real_iterations:
            residual = b64 - G64 @ z.double().numpy()
            history.append((k, float(np.linalg.norm(residual) / np.linalg.norm(b64))))

    real_iterations = max(20, min(real_iterations, int(real_seconds_budget / (ms["cg x10"] / CG_TIMED_ITERATIONS / 1e3))))
    start = time.perf_counter()
    conjugate_gradients(lambda p: free.matvec(free.rmatvec(p)), b_merged, real_iterations, record)
    real_seconds = time.perf_counter() - start

    # accuracy of the merged step: the package's, the sketches', and the floor
    def residual(step: Tensor) -> float:
        return float((exact_matvec(J, step) + sc).norm() / sc.norm())

    sc64 = sc.numpy()
    floor = float(np.linalg.norm(basis[:, ~kept] @ (basis[:, ~kept].T @ sc64)) / np.linalg.norm(sc64))
    accuracy = {"floor": floor, "package": residual(products().clone())}
    for width in widths:
        sketch = Sketch.of(J, width, generator)
        accuracy[f"sketch l={width}"] = residual(sketch_step(J, sketch, w, a, sc, g, max(refinements, 0), exact_ws))
        accuracy[f"sketch l={width} rank"] = int(sketch.factor.rank)

    package_ms = {"J": ms["J"], "gram": ms["gram"] + ms.get("exact gram", 0.0),
                  "factor": ms["factor"] + ms.get("exact factor", 0.0), "products": ms["products"]}
    package_total = sum(package_ms.values())
    jvp_ms = min(ms["jvp double-backward"], ms["jvp torch.func"])
    iteration_ms = ms["cg x10"] / CG_TIMED_ITERATIONS
    needed = [row["to"][f"{TARGET_ERROR:g}"] for row in iterations.values()]
    free_total = (None if any(k is None for k in needed)
                  else ms["mf setup"] + iteration_ms * sum(needed))
    return {
        "task": task, "m": m, "n": n, "rank_package": int(factor.rank), "cond_G_package": float(factor.condition),
        "rank_step_factor": int(step_factor.rank), "cond_G_step_factor": float(step_factor.condition),
        "cond_G_kept_eigh": cond_kept, "rank_eigh": int(kept.sum()),
        "cond_G_full_eigh": largest / max(float(eigenvalues[0]), 1e-300) if eigenvalues[0] > 0 else math.inf,
        "plan": {"exact_gram": exact_path, "refinements": refinements, "exact_residual": bool(exact_residual)},
        "ms": ms, "package_ms": package_ms, "package_total_ms": package_total,
        "matrix_free": {"setup_ms": ms["mf setup"], "vjp_ms": ms["vjp"], "jvp_ms": jvp_ms, "cg_iteration_ms": iteration_ms,
                        "total_ms_at_iterations_needed": free_total,
                        "break_even_iterations": (package_total - ms["mf setup"]) / iteration_ms,
                        # against (a) without the exact float64 Gram/factor the plan adds (the blocked Gram alone)
                        "break_even_iterations_blocked_gram": (package_total - ms.get("exact gram", 0.0)
                                                               - ms.get("exact factor", 0.0) - ms["mf setup"])
                                                              / iteration_ms},
        "checks": checks, "cg_iterations": iterations, "cap": cap,
        "real_float32_cg": {"iterations": real_iterations, "seconds": real_seconds, "history": history,
                            "best": min((r for _, r in history), default=math.nan)},
        "merged_step_residual": accuracy,
    }


def fmt_iterations(value: int | None, cap: int) -> str:
    return f">{cap}" if value is None else str(value)


def report(row: dict[str, Any]) -> None:
    p, f = row["package_ms"], row["matrix_free"]
    its = ["/".join(fmt_iterations(r["to"][f"{t:g}"], row["cap"]) for t in TOLERANCES)
           for r in row["cg_iterations"].values()]
    best = [f"{r['best_relative_residual']:.1e}" for r in row["cg_iterations"].values()]
    total = f["total_ms_at_iterations_needed"]
    print(f"{row['task']:9s} m={row['m']:5d} n={row['n']}  rank {row['rank_package']} (eigh {row['rank_eigh']})  "
          f"cond(G) kept {row['cond_G_package']:.2g} (eigh {row['cond_G_kept_eigh']:.2g}), full {row['cond_G_full_eigh']:.2g}  "
          f"plan {row['plan']}: rank {row['rank_step_factor']}, cond {row['cond_G_step_factor']:.2g}", flush=True)
    print(f"   (a) J {p['J']:.1f} + Gram {p['gram']:.1f} + factor {p['factor']:.1f} + products {p['products']:.1f} "
          f"= {row['package_total_ms']:.1f} ms   (SQPAdam.step given J: {row['ms']['sqp step']:.1f} ms)", flush=True)
    print(f"   (b) setup {f['setup_ms']:.1f} ms, VJP {f['vjp_ms']:.2f}, JVP {f['jvp_ms']:.2f} (double-backward "
          f"{row['ms']['jvp double-backward']:.2f}, torch.func {row['ms']['jvp torch.func']:.2f}), CG iteration "
          f"{f['cg_iteration_ms']:.2f} ms; iterations to 1e-2/1e-4/1e-6 (Jg; merged): {'; '.join(its)} (best "
          f"{', '.join(best)}); total {'n/a (not reached)' if total is None else f'{total:.0f} ms'}; break-even "
          f"{f['break_even_iterations']:.0f} iterations ({f['break_even_iterations_blocked_gram']:.0f} without the exact "
          f"Gram); real float32 CG best {row['real_float32_cg']['best']:.1e} in {row['real_float32_cg']['iterations']}",
          flush=True)
    sketches = [name for name in row["ms"] if name.startswith("sketch")]
    acc = row["merged_step_residual"]
    print(f"   (c) merged-step residual: package {acc['package']:.1e}, floor {acc['floor']:.1e}; "
          + "; ".join(f"{s} {row['ms'][s]:.1f} ms (vs Gram+factor {p['gram'] + p['factor']:.1f}), rank "
                      f"{acc[s + ' rank']}, residual {acc[s]:.1e}" for s in sketches), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=DEFAULT_CASES, help="task:m pairs, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-iterations", type=int, default=20000, help="cap of the counted CG iterations")
    parser.add_argument("--real-iterations", type=int, default=2000, help="most iterations of the real float32 CG")
    parser.add_argument("--real-seconds", type=float, default=8.0, help="time budget of the real float32 CG")
    parser.add_argument("--widths", default="128,256,512", help="columns l of the low-rank sketches")
    parser.add_argument("--out", default=None)
    options = parser.parse_args()
    quiet()
    torch.set_num_threads(THREADS)
    widths = [int(x) for x in options.widths.split(",") if x]
    rows = []
    start = time.perf_counter()
    for case in options.cases.split(","):
        task, m = case.split(":")
        row = measure(task, int(m), options.repeats, options.max_iterations, options.real_iterations,
                      options.real_seconds, widths)
        rows.append(row)
        report(row)
    print(f"CPU: {cpu_model()}, {THREADS} thread(s); {time.perf_counter() - start:.0f} s in all")
    if options.out:
        result = {"cpu": cpu_model(), "threads": THREADS, "torch": torch.__version__,
                  "repeats": options.repeats, "rows": rows}
        Path(options.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
