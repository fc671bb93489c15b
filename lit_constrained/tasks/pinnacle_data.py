"""The data of PINNacle's four forward problems, one DataModule: ``PinnacleData(problem="wave", ...)``.

Each problem's points and reference come from its generator (:func:`~.pinnacle_burgers_data.burgers_points`,
:func:`~.pinnacle_poisson_data.poisson_points`, :func:`~.pinnacle_wave_data.wave_points`,
:func:`~.pinnacle_heat_data.heat_points`); :data:`PROBLEMS` says which, with the problem's conditions,
cache name and the names of its test-grid sizes. An argument left None is the problem's own default
(the generator's), so the cache key of a problem's arrays is the same whatever was left out.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from lit_constrained.physics import SamplingMethod
from lit_constrained.tasks.cache import DEFAULT_CACHE_DIR
from lit_constrained.tasks.pinnacle_burgers_data import burgers_points
from lit_constrained.tasks.pinnacle_common import PinnaclePoints
from lit_constrained.tasks.pinnacle_heat_data import heat_points
from lit_constrained.tasks.pinnacle_poisson_data import poisson_points
from lit_constrained.tasks.pinnacle_wave_data import wave_points
from lit_constrained.tasks.sampling import BatchMode

__all__ = ["PROBLEMS", "PinnacleData", "PinnacleProblem", "ProblemData"]

PinnacleProblem = Literal["burgers", "poisson", "wave", "heat"]


@dataclass(frozen=True)
class ProblemData:
    """What :class:`PinnacleData` needs of a problem."""

    generator: Callable[..., dict[str, np.ndarray]]
    """Its point sets and reference as float64 arrays, from the generation arguments."""
    cache_name: str
    conditions: tuple[str, ...]
    """As its task's: ``x_<k>``, ``x_<k>_imposed``, ``x_<k>_check`` for every condition k."""
    test_grid: tuple[str, ...]
    """The generator's arguments that ``test_grid`` gives, in order."""


PROBLEMS: dict[str, ProblemData] = {
    "burgers": ProblemData(burgers_points, "pinnacle_burgers", ("pde", "boundary", "initial"), ("n_test_x", "n_test_t")),
    "poisson": ProblemData(poisson_points, "pinnacle_poisson", ("pde", "outer", "holes"), ("n_reference", "test_stride")),
    "wave": ProblemData(wave_points, "pinnacle_wave", ("pde", "boundary", "initial"), ("n_test",)),
    "heat": ProblemData(heat_points, "pinnacle_heat", ("pde", "boundary", "initial"), ("n_test_x", "n_test_y", "n_test_t")),
}
assert set(PROBLEMS) == set(get_args(PinnacleProblem))


class PinnacleData(PinnaclePoints):
    """A PINNacle forward problem's points and reference solution, cached under ``cache_dir``.

    Args:
        problem: ``"burgers"`` (Burgers1d-C), ``"poisson"`` (Poisson2d-C), ``"wave"`` (Wave1d-C) or
            ``"heat"`` (Heat2d-MS).
        batch_mode, batch_fraction, num_workers: as every task's data (the PDE points are the rows).
        n_pde, n_boundary, n_initial: the objective's points inside, on the boundary (Poisson2d-C: the
            square's sides and the circles together), at t = 0 (Poisson2d-C has none: leave it None).
        n_pde_imposed, n_boundary_imposed, n_initial_imposed: points of a fixed set where each condition
            is imposed (0: none; a task with ``imposed_count`` chooses from the objective's points instead).
        n_check: held-out points per condition (the validation residuals).
        test_grid: the test grid's sizes: Burgers1d-C ``[n_x, n_t]``, Wave1d-C ``[n]`` (n x n),
            Heat2d-MS ``[n_x, n_y, n_t]``; Poisson2d-C ``[intervals, stride]`` (the finite-difference
            reference's intervals per axis, and every stride-th of its nodes a test point).
        method: ``"lhs"``, ``"sobol"``, ``"uniform"``. seed: the objective's points (imposed: + 1, check: + 2).
        cache_dir: where the arrays are cached (None: always regenerate).

    None: the problem's own default (its generator's: :data:`PROBLEMS`).
    """

    def __init__(
        self,
        problem: PinnacleProblem,
        batch_mode: BatchMode = "full",
        batch_fraction: float = 0.5,
        n_pde: int | None = None,
        n_boundary: int | None = None,
        n_initial: int | None = None,
        n_pde_imposed: int | None = None,
        n_boundary_imposed: int | None = None,
        n_initial_imposed: int | None = None,
        n_check: int | None = None,
        test_grid: Sequence[int] | None = None,
        method: SamplingMethod = "lhs",
        seed: int = 0,
        cache_dir: str | None = str(DEFAULT_CACHE_DIR),
        num_workers: int = 0,
    ) -> None:
        if problem not in PROBLEMS:
            raise ValueError(f"problem must be one of {', '.join(map(repr, PROBLEMS))}, got {problem!r}.")
        self.problem_data = PROBLEMS[problem]
        self.cache_name = self.problem_data.cache_name
        self.conditions = self.problem_data.conditions
        super().__init__(batch_mode, batch_fraction, num_workers)
        self.setup()

    def generation_args(self) -> dict[str, Any]:
        """The generator's arguments: its defaults, with those given (not None) in their place; a
        ValueError for one the problem does not have (``n_initial`` of Poisson2d-C) or a ``test_grid``
        of another length."""
        data, given = self.problem_data, dict(self.hparams)
        parameters = inspect.signature(data.generator).parameters
        args = {name: p.default for name, p in parameters.items()}
        grid = given.pop("test_grid")
        if grid is not None:
            if len(grid) != len(data.test_grid):
                raise ValueError(f"test_grid of {given['problem']!r} takes {len(data.test_grid)} sizes "
                                 f"({', '.join(data.test_grid)}), got {list(grid)!r}.")
            args.update(zip(data.test_grid, (int(size) for size in grid)))
        for name in ("n_pde", "n_boundary", "n_initial", "n_pde_imposed", "n_boundary_imposed",
                     "n_initial_imposed", "n_check", "method", "seed"):
            if given.get(name) is None:
                continue
            if name not in parameters:
                raise ValueError(f"{given['problem']!r} has no {name} (its conditions: {', '.join(data.conditions)}); "
                                 f"leave it out.")
            args[name] = given[name]
        return args

    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        return self.problem_data.generator(**args)
