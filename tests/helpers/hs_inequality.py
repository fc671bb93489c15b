r"""Hock-Schittkowski problems with inequalities and bounds, written for the optimizer's inequality rows.

From W. Hock and K. Schittkowski, *Test Examples for Nonlinear Programming Codes*, Lecture Notes in
Economics and Mathematical Systems 187, Springer 1981 (problems 21, 35, 43, 71, 76): the objective f, the
equality rows :math:`c(x) = 0`, every inequality and bound of the collection rewritten as a row of
:math:`g(x) \le 0` (the collection writes :math:`g(x) \ge 0` and :math:`l \le x \le u`; here a row
:math:`h(x) \ge 0` becomes :math:`-h(x) \le 0`, a bound :math:`x_i \ge l` becomes :math:`l - x_i \le 0`),
the collection's start point (HS21's and HS71's are infeasible or on a bound; that is the test) and its
published solution :math:`x^*`, :math:`f^*`.

Where the published solution is a rational number it is given exactly (HS35: (4/3, 7/9, 4/9), f* = 1/9;
HS76: (3/11, 23/11, 0, 6/11), f* = -103/22: the collection prints 0.2727273, 2.090909, -0.26e-10,
0.5454545 and -4.681818181). HS71's is the collection's 8 digits (1, 4.7429994, 3.8211503, 1.3794082;
f* = 17.0140173): a Newton solve of its KKT system on the active rows (x_1 = 1, x_1 x_2 x_3 x_4 = 25,
|x|^2 = 40) in float64 gives 1, 4.742999637, 3.821149984, 1.379408293, within 3.2e-7 of them
(:func:`refined_hs71`), so the 1e-6 target in x is against the collection's digits, with that margin.

Each problem also names its active inequality rows at x* (``active``): the rows with :math:`g_i(x^*) = 0`
and a positive multiplier, from the KKT conditions (checked by ``tests/optim/test_hock_schittkowski.py``
against a dense solve, not taken from the optimizer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

Rows = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class InequalityProblem:
    """One problem: f, c (m rows = 0; None for m = 0), g (p rows <= 0, bounds included), x0, x*, f*."""

    name: str
    objective: Callable[[Tensor], Tensor]
    equalities: Rows | None
    inequalities: Rows
    x0: tuple[float, ...]
    solution: tuple[float, ...]
    value: float
    active: tuple[int, ...]
    """The inequality rows active at x* (indices into g's rows)."""
    rows: tuple[str, ...]
    """What each inequality row is (for the tables and error messages)."""

    @property
    def n(self) -> int:
        return len(self.x0)


def _lower(x: Tensor, lo: float, indices: range) -> list[Tensor]:
    return [lo - x[i] for i in indices]


def _upper(x: Tensor, hi: float, indices: range) -> list[Tensor]:
    return [x[i] - hi for i in indices]


def _hs21_g(x: Tensor) -> Tensor:
    return torch.stack([-(10 * x[0] - x[1] - 10), 2 - x[0], x[0] - 50, -50 - x[1], x[1] - 50])


HS21 = InequalityProblem(
    "HS21",
    lambda x: 0.01 * x[0] ** 2 + x[1] ** 2 - 100,
    None,
    _hs21_g,
    (-1.0, -1.0),
    (2.0, 0.0),
    -99.96,
    (1,),
    ("10x1 - x2 - 10 >= 0", "x1 >= 2", "x1 <= 50", "x2 >= -50", "x2 <= 50"),
)


def _hs35_f(x: Tensor) -> Tensor:
    x1, x2, x3 = x[0], x[1], x[2]
    return (9 - 8 * x1 - 6 * x2 - 4 * x3 + 2 * x1**2 + 2 * x2**2 + x3**2 + 2 * x1 * x2 + 2 * x1 * x3)


HS35 = InequalityProblem(
    "HS35",
    _hs35_f,
    None,
    lambda x: torch.stack([-(3 - x[0] - x[1] - 2 * x[2]), *_lower(x, 0.0, range(3))]),
    (0.5, 0.5, 0.5),
    (4 / 3, 7 / 9, 4 / 9),
    1 / 9,
    (0,),
    ("3 - x1 - x2 - 2x3 >= 0", "x1 >= 0", "x2 >= 0", "x3 >= 0"),
)


def _hs43_f(x: Tensor) -> Tensor:
    x1, x2, x3, x4 = x[0], x[1], x[2], x[3]
    return x1**2 + x2**2 + 2 * x3**2 + x4**2 - 5 * x1 - 5 * x2 - 21 * x3 + 7 * x4


def _hs43_g(x: Tensor) -> Tensor:
    x1, x2, x3, x4 = x[0], x[1], x[2], x[3]
    return -torch.stack([
        8 - x1**2 - x2**2 - x3**2 - x4**2 - x1 + x2 - x3 + x4,
        10 - x1**2 - 2 * x2**2 - x3**2 - 2 * x4**2 + x1 + x4,
        5 - 2 * x1**2 - x2**2 - x3**2 - 2 * x1 + x2 + x4,
    ])


HS43 = InequalityProblem(
    "HS43",
    _hs43_f,
    None,
    _hs43_g,
    (0.0, 0.0, 0.0, 0.0),
    (0.0, 1.0, 2.0, -1.0),
    -44.0,
    (0, 2),
    ("8 - |x|^2 - x1 + x2 - x3 + x4 >= 0", "10 - x1^2 - 2x2^2 - x3^2 - 2x4^2 + x1 + x4 >= 0",
     "5 - 2x1^2 - x2^2 - x3^2 - 2x1 + x2 + x4 >= 0"),
)


HS71 = InequalityProblem(
    "HS71",
    lambda x: x[0] * x[3] * (x[0] + x[1] + x[2]) + x[2],
    lambda x: (x.pow(2).sum() - 40).reshape(1),
    lambda x: torch.stack([-(x.prod() - 25), *_lower(x, 1.0, range(4)), *_upper(x, 5.0, range(4))]),
    (1.0, 5.0, 5.0, 1.0),
    (1.0, 4.7429994, 3.8211503, 1.3794082),
    17.0140173,
    (0, 1),
    ("x1 x2 x3 x4 >= 25", "x1 >= 1", "x2 >= 1", "x3 >= 1", "x4 >= 1",
     "x1 <= 5", "x2 <= 5", "x3 <= 5", "x4 <= 5"),
)


def _hs76_f(x: Tensor) -> Tensor:
    x1, x2, x3, x4 = x[0], x[1], x[2], x[3]
    return (x1**2 + 0.5 * x2**2 + x3**2 + 0.5 * x4**2 - x1 * x3 + x3 * x4 - x1 - 3 * x2 + x3 - x4)


def _hs76_g(x: Tensor) -> Tensor:
    x1, x2, x3, x4 = x[0], x[1], x[2], x[3]
    return torch.stack([
        -(5 - x1 - 2 * x2 - x3 - x4),
        -(4 - 3 * x1 - x2 - 2 * x3 + x4),
        -(x2 + 4 * x3 - 1.5),
        *_lower(x, 0.0, range(4)),
    ])


HS76 = InequalityProblem(
    "HS76",
    _hs76_f,
    None,
    _hs76_g,
    (0.5, 0.5, 0.5, 0.5),
    (3 / 11, 23 / 11, 0.0, 6 / 11),
    -103 / 22,
    (0, 5),
    ("5 - x1 - 2x2 - x3 - x4 >= 0", "4 - 3x1 - x2 - 2x3 + x4 >= 0", "x2 + 4x3 - 1.5 >= 0",
     "x1 >= 0", "x2 >= 0", "x3 >= 0", "x4 >= 0"),
)

PROBLEMS: tuple[InequalityProblem, ...] = (HS21, HS35, HS43, HS71, HS76)
BY_NAME = {problem.name: problem for problem in PROBLEMS}


def refined_hs71() -> Tensor:
    r"""HS71's solution to float64 accuracy: Newton on the KKT system of its active rows
    (:math:`x_1 = 1`, :math:`x_1x_2x_3x_4 = 25`, :math:`|x|^2 = 40`; 4 unknowns and 3 multipliers),
    started at the published digits."""
    x = torch.tensor(HS71.solution, dtype=torch.float64)

    def rows(z: Tensor) -> Tensor:
        return torch.stack([1 - z[0], 25 - z.prod(), z.pow(2).sum() - 40])

    def kkt(v: Tensor) -> Tensor:
        z, lam = v[:4], v[4:]
        grad = torch.func.grad(HS71.objective)(z) + torch.func.jacrev(rows)(z).T @ lam
        return torch.cat([grad, rows(z)])

    v = torch.cat([x, torch.zeros(3, dtype=torch.float64)])
    jac = torch.func.jacrev(kkt)(v)  # the multipliers: least squares on the stationarity rows first
    v[4:] = torch.linalg.lstsq(jac[:4, 4:], -kkt(v)[:4, None]).solution[:, 0]
    for _ in range(20):
        v = v - torch.linalg.solve(torch.func.jacrev(kkt)(v), kkt(v))
    return v[:4]
