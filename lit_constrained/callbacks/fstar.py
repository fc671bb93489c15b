"""Deprecated: ``FStarMonitor`` is :class:`~lit_constrained.callbacks.step_size.StepSizeMonitor`.

The old name stays importable (``lit_constrained.callbacks.FStarMonitor`` and
``lit_constrained.callbacks.fstar.FStarMonitor``) so that existing configs keep working; it warns once per
construction and logs under its old default prefix ``fstar`` (``fstar/tau``, ...), so an old config writes
the same metric names as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning.pytorch.utilities import rank_zero_warn

from .step_size import StepSizeMonitor, step_size_values

__all__ = ["FStarMonitor", "step_size_values"]


class FStarMonitor(StepSizeMonitor):
    """Deprecated alias of :class:`~lit_constrained.callbacks.step_size.StepSizeMonitor` (default prefix
    ``fstar``). Use ``lit_constrained.callbacks.StepSizeMonitor`` instead."""

    def __init__(
        self,
        keys: Sequence[str] = ("lower_bound", "tau", "zeta"),
        log_lr: bool = True,
        prefix: str = "fstar",
        prog_bar: bool = False,
    ) -> None:
        rank_zero_warn(
            "FStarMonitor is deprecated: use lit_constrained.callbacks.StepSizeMonitor (it logs tau, zeta, "
            "f* and the lr; its default prefix is 'step_size', pass prefix='fstar' to keep the old metric names).",
            category=FutureWarning,
        )
        super().__init__(keys=keys, log_lr=log_lr, prefix=prefix, prog_bar=prog_bar)
