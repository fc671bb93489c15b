r"""``Log10/<tag>``: the headline curves as log10 values, readable on TensorBoard's first view.

The objective and the violation of a constrained run fall over many decades (the spring task's
``Violation/train``: 76 at step 0, 5e-6 one step later), which TensorBoard's default linear axes
flatten to a line at 0 (its data table then prints the final values as ``0``). Measured in headless
Chromium on TensorBoard 2.21 (``scripts/tensorboard_screenshots.py``), what its Time Series tab shows
without touching a setting:

* log-scaled charts need a click per card (More line chart options -> Toggle Y-axis log scale);
* log10 values at every step are clipped by the default *Ignore outliers in chart scaling*: the
  y range of a card is the [5 %, 95 %] quantile range of its (smoothed) points, which for a violation
  that reaches round-off within a few steps hides the start entirely;
* even with few points that rule drops the highest and the lowest point of every card with more than
  two points (``sorted[ceil(0.05 (n-1))]`` to ``sorted[floor(0.95 (n-1))]``).

So this callback writes, for each headline tag (:data:`HEADLINE_TAGS`: ``Objective/train``,
``Objective/val``, ``Violation/train``, ``Violation/val``, ``residual/val``), ``Log10/<tag>`` =
:math:`\log_{10}` of its positive values at few, log-spaced steps: the first value logged at or after
each of :data:`GRID_POINTS` steps spaced evenly in log(step) from step 1 to the fit's last step
(:func:`log_spaced_steps`; for a fit of unknown length 1, 2, 5, 10, 20, ..., :func:`decade_grid`),
and the last value of the run. The first and the last points are written :data:`END_COPIES` times
(events at the same step with the same value). The quantile rule works on the *smoothed* points
(TensorBoard's default smoothing 0.6: an exponential moving average over the points, the raw line
drawn lighter behind it), so the copies do two things: the rule drops at most three points at each
end of a card of up to 61 points (the 35 grid points and 2 x 12 copies), fewer than the copies; and
k copies of the last value bring the smoothed line to within 0.6^k of the gap between it and that
value (0.6^9 = 1 % for the 9th copy, the lowest one the rule can keep), so the raw line's end lies
inside the card's y range too. With 3 copies the smoothed line stopped 22 % of that gap short and the
raw ends of ``Log10/Objective/train`` and of the validation cards (few points: one a validation) fell
below the range. About ten points a decade keep the smoothed line within a fraction of a decade of the
values elsewhere. For one run in view, the start of every ``Log10`` card is inside
its y range, and the data table reads e.g. -4.21 (= 6.2e-5) where the raw tag's reads 0.
The group ``Log10`` sorts before ``Objective`` (TensorBoard's natural order, upper case first), so it
is the first group the Time Series tab opens.

The values are taken where every scalar passes: each TensorBoard logger's ``log_metrics`` (the
module's ``self.log`` values and its step-0 values alike), wrapped during ``fit`` and restored at its
end. Zero, negative and non-finite values have no log10 and are not written.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from lit_constrained.module_parts.tags import LOG10, OBJECTIVE, RESIDUAL, VIOLATION, tag

HEADLINE_TAGS: tuple[str, ...] = (
    tag(OBJECTIVE, "train"), tag(OBJECTIVE, "val"), tag(VIOLATION, "train"), tag(VIOLATION, "val"), tag(RESIDUAL, "val"),
)
"""The tags mirrored as ``Log10/<tag>``."""


GRID_POINTS = 35
"""How many log-spaced grid steps a fit of known length gets (fewer after rounding, for short fits)."""

END_COPIES = 12
"""How many times the first and the last point are written: more than the quantile rule drops at an end
(at most 3 of up to 61 points), and enough for the smoothed line to reach the last value (0.6^9 = 1 %)."""


def log10_tag(name: str) -> str:
    """``Log10/<name>``, e.g. ``Log10/Violation/train``."""
    return f"{LOG10}/{name}"


def decade_grid() -> Iterator[int]:
    """0, 1, 2, 5, 10, 20, 50, 100, ...: three steps a decade."""
    yield 0
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            yield mantissa * scale
        scale *= 10


def next_grid_step(step: int) -> int:
    """The smallest step of :func:`decade_grid` greater than ``step``."""
    for grid_step in decade_grid():
        if grid_step > step:
            return grid_step
    raise AssertionError("unreachable: the grid is unbounded")


def log_spaced_steps(last_step: int, count: int = GRID_POINTS) -> list[int]:
    r"""0 and ``count`` steps spaced evenly in log(step) from 1 to ``last_step``, rounded (repeats
    dropped): :math:`s_i = \operatorname{round}(\text{last}^{i / (\text{count} - 1)})`."""
    if last_step < 1:
        return [0]
    return sorted({0, *(round(last_step ** (i / (count - 1))) for i in range(count))})


def _next_due(grid: list[int] | None, step: int) -> int:
    """The smallest grid step greater than ``step`` (past the grid's end: never again until the end)."""
    if grid is None:
        return next_grid_step(step)
    index = bisect.bisect_right(grid, step)
    return grid[index] if index < len(grid) else math.inf  # type: ignore[return-value]


@dataclass
class _Series:
    """What was seen and written of one tag: the next grid step due, the last value seen, and the step
    of the last point written with how many copies it got."""

    due: float = 0
    last_seen: tuple[int, float] | None = None
    last_written: tuple[int, int] | None = None  # (step, copies)


class Log10Headlines(Callback):
    """Writes ``Log10/<tag>`` for the headline tags at log-spaced steps (see the module docstring).

    ConstrainedModule adds it to every Trainer (``configure_callbacks``); it acts only on TensorBoard
    loggers, during ``fit``.
    """

    def __init__(self) -> None:
        self._grid: list[int] | None = None
        self._wrapped: list[tuple[Any, Callable[..., Any], dict[str, _Series]]] = []  # logger, its method, its series

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # not on_fit_start: estimated_stepping_batches builds the training loader, and built before
        # Lightning restores a checkpoint's loop state the loader's saved position is never loaded (a
        # DDP mini-batch resume then repeats the epoch's first batches; tests/test_ddp_cli.py)
        from lightning.pytorch.loggers import TensorBoardLogger

        total = trainer.estimated_stepping_batches  # the fit's optimizer steps (inf: unbounded)
        self._grid = log_spaced_steps(int(total) - 1) if math.isfinite(total) else None
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger) and "log_metrics" not in vars(logger):
                original, series = logger.log_metrics, {}
                # an instance attribute shadows the class's method: every scalar the logger writes
                # passes here first (Lightning's logger connector and the module's direct writes)
                logger.log_metrics = self._mirroring(original, series)  # type: ignore[method-assign]
                self._wrapped.append((logger, original, series))

    def _mirroring(self, original: Callable[..., Any], series: dict[str, _Series]) -> Callable[..., Any]:
        def log_metrics(metrics: Mapping[str, Any], step: int | None = None) -> None:
            original(metrics, step)
            if step is not None:
                self._mirror(original, series, metrics, int(step))

        return log_metrics

    def _mirror(self, write: Callable[..., Any], all_series: dict[str, _Series], metrics: Mapping[str, Any], step: int) -> None:
        for name in HEADLINE_TAGS:
            if name not in metrics:
                continue
            value = float(metrics[name])
            if not (math.isfinite(value) and value > 0):
                continue
            series = all_series.setdefault(name, _Series())
            series.last_seen = (step, value)
            if step >= series.due:
                copies = END_COPIES if series.last_written is None else 1  # the first point (see above)
                self._write(write, name, step, value, copies, series)
                series.due = _next_due(self._grid, step)

    @staticmethod
    def _write(write: Callable[..., Any], name: str, step: int, value: float, copies: int, series: _Series) -> None:
        for _ in range(copies):
            write({log10_tag(name): math.log10(value)}, step)
        previous = series.last_written
        earlier = previous[1] if previous is not None and previous[0] == step else 0
        series.last_written = (step, earlier + copies)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The last value of each tag, written (:data:`END_COPIES` times in all)."""
        for _, original, all_series in self._wrapped:
            for name, series in all_series.items():
                if series.last_seen is None:
                    continue
                step, value = series.last_seen
                written = series.last_written[1] if series.last_written and series.last_written[0] == step else 0
                if written < END_COPIES:
                    self._write(original, name, step, value, END_COPIES - written, series)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for logger, _, _ in self._wrapped:
            vars(logger).pop("log_metrics", None)
        self._wrapped = []
