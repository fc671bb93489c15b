r"""PINNacle's Poisson2d-C: a square with four circular holes, its finite-difference reference, its points.

.. math::

    -\Delta u = 0 \ \text{in}\ \Omega = [-\tfrac12, \tfrac12]^2 \setminus \textstyle\bigcup_{i=1}^4 D_i,
    \qquad u = 1 \ \text{on the square's sides}, \qquad u = 0 \ \text{on the circles}\ \partial D_i,

:math:`D_i` the disks of radius 0.1 centred at :math:`(\pm 0.3, \pm 0.3)` (PINNacle's
``Poisson2D_Classic``, scale 1; its reference is a COMSOL solve, ours the finite-difference solve below).

**Reference** (:func:`solve_reference`): the Shortley-Weller scheme on the uniform grid
:math:`x_i = -\tfrac12 + i h`, :math:`h = 1/n`. At a grid node P inside :math:`\Omega` with neighbours at
distances :math:`h_W, h_E, h_S, h_N` (h, or the distance along the grid line to a circle where the
neighbour lies in a hole, the circle value 0 taken there),

.. math::

    \frac{2}{h_W + h_E}\Big(\frac{u_E - u_P}{h_E} - \frac{u_P - u_W}{h_W}\Big)
    + \frac{2}{h_S + h_N}\Big(\frac{u_N - u_P}{h_N} - \frac{u_P - u_S}{h_S}\Big) = 0,

an M-matrix whose solution is second-order accurate (h^2) at the nodes; solved by SciPy's sparse LU.
tests/tasks/test_pinnacle_references.py verifies the order by refinement (n, 2n, 4n at the shared nodes).
The test points are the domain's nodes of that grid, every ``test_stride``-th node per axis.

**Points** (seeded, from :data:`DOMAIN`, the square minus the disks in :mod:`lit_constrained.physics`'
constructive geometry): ``x_pde`` inside :math:`\Omega`; ``x_outer`` and ``x_holes`` one sample of the
whole boundary by arc length (the sides' length 4, the circles' :math:`0.8\pi`), split by where each point
fell, as PINNacle samples the boundary and lets each condition take its part. ``_imposed``: seed + 1,
``_check``: seed + 2.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from lit_constrained.physics import Box, Disk, Geometry, SamplingMethod
from lit_constrained.tasks.pinnacle_common import as_float64, check_counts

__all__ = [
    "CENTERS", "DOMAIN", "RADIUS", "SQUARE", "boundary_sets", "in_domain", "on_square_sides",
    "poisson_points", "solve_reference",
]

SQUARE = Box((-0.5, -0.5), (0.5, 0.5))
#: the holes' centres and radius (PINNacle's circ, scale 1)
CENTERS = np.array([[0.3, 0.3], [-0.3, 0.3], [0.3, -0.3], [-0.3, -0.3]])
RADIUS = 0.1
#: the square minus the four disks (:mod:`lit_constrained.physics`' constructive geometry)
DOMAIN: Geometry = functools.reduce(lambda domain, center: domain - Disk(tuple(center), RADIUS), CENTERS, SQUARE)


def in_domain(points: np.ndarray) -> np.ndarray:
    """True where a point (N, 2) lies outside every (closed) disk."""
    distance = np.linalg.norm(points[:, None, :] - CENTERS[None], axis=2)
    return (distance > RADIUS).all(axis=1)


def on_square_sides(points: np.ndarray) -> np.ndarray:
    """True where a boundary point (N, 2) lies on the square's sides (else it lies on a circle)."""
    return (np.abs(np.abs(points) - 0.5) < 1e-12).any(axis=1)


def boundary_sets(n: int, method: SamplingMethod, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(on the square's sides, on the circles): n points of the domain's boundary by arc length
    (:meth:`~lit_constrained.physics.Geometry.boundary`), split by where they fell."""
    if n == 0:
        return np.zeros((0, 2)), np.zeros((0, 2))
    points = DOMAIN.boundary(n, method, seed).numpy()
    sides = on_square_sides(points)
    return points[sides], points[~sides]


def solve_reference(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Shortley-Weller solution on the (n + 1)^2 grid of the square.

    Returns ``(nodes, u, inside)``: the grid's nodes (n + 1, n + 1, 2) (index [i, j] at
    :math:`(-\\tfrac12 + i h, -\\tfrac12 + j h)`), u there (1 on the sides, NaN in the holes), and the
    mask of the nodes in the closed domain (the sides included, the holes not).
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.linalg import spsolve

    if not isinstance(n, int) or n < 10 or n % 10:
        raise ValueError(f"solve_reference: n must be a multiple of 10 (>= 10, so x = ±0.3 are nodes), got {n!r}.")
    h = 1.0 / n
    axis = -0.5 + h * np.arange(n + 1)
    nodes = np.stack(np.meshgrid(axis, axis, indexing="ij"), axis=-1)
    inside = in_domain(nodes.reshape(-1, 2)).reshape(n + 1, n + 1)
    unknown = inside.copy()
    unknown[[0, -1], :] = False
    unknown[:, [0, -1]] = False
    index = -np.ones((n + 1, n + 1), dtype=np.int64)
    index[unknown] = np.arange(int(unknown.sum()))
    rows, cols, vals = [], [], []
    rhs = np.zeros(int(unknown.sum()))
    ii, jj = np.nonzero(unknown)
    p = index[ii, jj]
    for axis_id in (0, 1):
        arms = []
        for step in (-1, 1):
            ni, nj = (ii + step, jj) if axis_id == 0 else (ii, jj + step)
            arm = np.full(len(p), h)
            into_hole = ~inside[ni, nj]
            if into_hole.any():
                arm[into_hole] = _distance_to_circle(nodes[ii[into_hole], jj[into_hole]], axis_id, step)
            arms.append((ni, nj, arm, into_hole))
        (wi, wj, hw, w_hole), (ei, ej, he, e_hole) = arms
        scale = 2.0 / (hw + he)
        for (ni, nj, arm, hole) in ((wi, wj, hw, w_hole), (ei, ej, he, e_hole)):
            coef = scale / arm
            rows.append(p), cols.append(p), vals.append(-coef)
            neighbour = index[ni, nj]
            known = hole | (neighbour < 0)
            side = known & ~hole  # a neighbour on the square's sides: u = 1
            rhs -= np.where(side, coef * 1.0, 0.0)
            rows.append(p[~known]), cols.append(neighbour[~known]), vals.append(coef[~known])
    m = len(p)
    matrix = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(m, m)).tocsc()
    u = np.full((n + 1, n + 1), np.nan)
    u[inside & ~unknown] = 1.0
    u[unknown] = spsolve(matrix, rhs)
    return nodes, u, inside


def _distance_to_circle(points: np.ndarray, axis_id: int, step: int) -> np.ndarray:
    """The distance from each point (outside the holes) along the grid line (axis ``axis_id``, direction
    ``step``) to the nearest circle it meets within one grid step."""
    direction = np.zeros(2)
    direction[axis_id] = step
    best = np.full(len(points), np.inf)
    for center in CENTERS:
        offset = points - center
        b = offset @ direction
        c = (offset**2).sum(1) - RADIUS**2
        disc = b**2 - c
        ok = disc >= 0
        root = np.where(ok, -b - np.sqrt(np.where(ok, disc, 0.0)), np.inf)
        root = np.where(root >= 0, root, np.inf)
        best = np.minimum(best, root)
    if not np.isfinite(best).all():
        raise RuntimeError("solve_reference: a neighbour in a hole with no circle crossing found (a bug).")
    return np.maximum(best, 1e-12)


def poisson_points(
    n_pde: int = 1024,
    n_boundary: int = 256,
    n_pde_imposed: int = 25,
    n_boundary_imposed: int = 25,
    n_check: int = 256,
    n_reference: int = 400,
    test_stride: int = 4,
    method: SamplingMethod = "lhs",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Every point set of Poisson2d-C and the finite-difference reference at the test nodes (float64).

    The boundary sets ``outer`` / ``holes`` share ``n_boundary`` (and ``n_boundary_imposed``, ``n_check``):
    one sample of the whole boundary by arc length, split by where each point fell (:func:`boundary_sets`).
    """
    check_counts(n_pde=n_pde, n_boundary=n_boundary, n_pde_imposed=n_pde_imposed,
                 n_boundary_imposed=n_boundary_imposed, n_check=n_check, test_stride=test_stride)
    if n_reference % test_stride:
        raise ValueError(f"test_stride ({test_stride}) must divide n_reference ({n_reference}).")

    arrays: dict[str, Any] = {
        "x_pde": DOMAIN.interior(n_pde, method, seed),
        "x_pde_imposed": DOMAIN.interior(n_pde_imposed, method, seed + 1) if n_pde_imposed else np.zeros((0, 2)),
        "x_pde_check": DOMAIN.interior(n_check, method, seed + 2),
    }
    for suffix, n, s in (("", n_boundary, seed), ("_imposed", n_boundary_imposed, seed + 1), ("_check", n_check, seed + 2)):
        arrays[f"x_outer{suffix}"], arrays[f"x_holes{suffix}"] = boundary_sets(n, method, s)
    nodes, u, inside = solve_reference(n_reference)
    keep = np.zeros_like(inside)
    keep[::test_stride, ::test_stride] = True
    keep &= inside
    arrays["x_test"] = nodes[keep]
    arrays["u_test"] = u[keep]
    return as_float64(arrays)
