"""The hyperparameters of the one projection shared by every hard-constrained optimizer: their types,
defaults, checks, and the text that documents them (one copy, put into each optimizer's docstring by
:func:`document_projection_args`)."""

from __future__ import annotations

import math
from typing import Any, Literal, TypeVar, Union

from .state import STATE_KEY  # noqa: F401  (the key of the step's shared state; re-exported)

Rho = Union[float, Literal["full"]]
MaxNormalStep = Union[float, None, Literal["adaptive"]]
Precision = Literal["native", "float64"]

PRECISIONS = ("native", "float64")

DEFAULT_LR = 1e-3
DEFAULT_RHO: Rho = "full"
DEFAULT_RCOND = 1e-7
"""Relative cutoff on the singular values of J: a float32 Jacobian carries ~1e-7 relative noise.
(The float64 Gram matrix resolves singular-value ratios down to ~1e-8: a smaller rcond is not meaningful.)"""
DEFAULT_CONSTRAINT_TOL = 1e-6
"""The default of ``constraint_tol``: the post-step corrections stop once
max |c| <= constraint_tol * max(max |c_1|, 1) (c_1: the constraints at the first step)."""
DEFAULT_MAX_CORRECTIONS = 3
"""The default of ``max_corrections`` (0 switches the post-step corrections off: the papers' methods)."""
DEFAULT_MAX_NORMAL_STEP: MaxNormalStep = "adaptive"
"""The default of ``max_normal_step``: ``"adaptive"`` (the trust radius of
:data:`~lit_constrained.optim.safeguard.ADAPTIVE_NORMAL_STEP`), a number (a fixed cap relative to ||x||)
or ``None`` (no cap)."""

PROJECTION_DEFAULTS: dict[str, Any] = {
    "lr": DEFAULT_LR,
    "rho": DEFAULT_RHO,
    "rcond": DEFAULT_RCOND,
    "max_normal_step": DEFAULT_MAX_NORMAL_STEP,
    "precision": "native",
    "constraint_tol": DEFAULT_CONSTRAINT_TOL,
    "max_corrections": DEFAULT_MAX_CORRECTIONS,
}
SHARED_KEYS = ("rho", "rcond", "max_normal_step", "precision", "constraint_tol", "max_corrections")
"""Hyperparameters of the one projection: equal in all param groups (the constraints couple them)."""

PROJECTION_ARGS = """\
        rho: normal-step scale :math:`\\rho > 0`, or ``"full"`` (the default) for :math:`\\rho_k = 1/\\alpha_k`:
            the linearized constraints are then restored in one step. Shared by all groups.
        rcond: relative singular-value cutoff defining the numerical rank of J. Shared.
        max_normal_step: the safeguard on the normal step: ``"adaptive"`` (the default: a trust radius
            on the full normal step, adapted from the actual vs linearized decrease of ||c||), a fixed cap
            relative to ||x||, or ``None``. Shared.
        precision: ``"native"`` (n-vectors in the parameters' dtype, float64 m x m algebra) or
            ``"float64"`` (everything in float64, the reference). Shared.
        constraint_tol, max_corrections: the post-step corrections (not in the papers; 0 corrections is
            the papers' method): at most ``max_corrections`` Gauss-Newton corrections with the step's
            factorization until max |c| <= ``constraint_tol`` * max(max |c_1|, 1). Shared.
    (The projection: :class:`~lit_constrained.optim.constrained.ConstrainedOptimizer`.)"""

Documented = TypeVar("Documented")


def document_projection_args(cls: Documented) -> Documented:
    """Put :data:`PROJECTION_ARGS` where the class docstring says ``{projection_args}``."""
    if cls.__doc__ and "{projection_args}" in cls.__doc__:
        cls.__doc__ = cls.__doc__.replace("{projection_args}", PROJECTION_ARGS)
    return cls


def check_rho(rho: Rho) -> None:
    if rho == "full":
        return
    if isinstance(rho, (str, bool)) or not (isinstance(rho, (int, float)) and math.isfinite(rho) and rho > 0):
        raise ValueError(f"Invalid rho={rho!r}: a number > 0, or 'full' for rho_k = 1 / lr_k.")


def check_max_normal_step(value: MaxNormalStep) -> None:
    if value is None or value == "adaptive":
        return
    if isinstance(value, (str, bool)) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(
            f"Invalid max_normal_step={value!r}: a number > 0 (a fixed cap relative to ||x||), 'adaptive' "
            "(the default trust radius) or None (no cap)."
        )


def check_max_corrections(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"Invalid max_corrections={value!r}: an integer >= 0 (0: no post-step corrections, the papers' "
            "methods)."
        )


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(
            f"Invalid precision={precision!r}: 'native' (the parameters' dtype, float64 only for the m x m "
            "algebra) or 'float64' (everything in float64, the reference path)."
        )


def check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"Invalid {name}={value!r}: it must be True or False.")
