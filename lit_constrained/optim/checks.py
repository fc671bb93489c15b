"""Input validation shared by the optimizers: clear ``ValueError``s that say what to fix."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def check_lr(lr: float | None, allow_none: bool = False) -> None:
    if lr is None and allow_none:
        return
    if lr is None or not isinstance(lr, (int, float, Tensor)) or not math.isfinite(float(lr)) or lr < 0:
        raise ValueError(f"Invalid learning rate {lr!r}: it must be a finite number >= 0.")


def check_beta(name: str, beta: float) -> None:
    if not 0.0 <= float(beta) < 1.0:
        raise ValueError(f"Invalid {name}={beta!r}: it must lie in [0, 1).")


def check_betas(betas: tuple[float, float]) -> None:
    if len(betas) != 2:
        raise ValueError(f"Invalid betas={betas!r}: expected a pair (beta1, beta2).")
    check_beta("betas[0]", betas[0])
    check_beta("betas[1]", betas[1])


def check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"Invalid {name}={value!r}: it must be a finite number > 0.")


def all_finite(t: Tensor) -> bool:
    """Whether ``t`` holds no NaN/inf: one reduction (a NaN or inf makes the sum non-finite; an
    overflowing sum of finite values falls back to the elementwise check)."""
    if t.numel() == 0:
        return True
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


def check_finite(name: str, t: Tensor) -> None:
    """Raise if ``t`` holds NaN or inf, naming the quantity."""
    if not all_finite(t):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(
            f"{name} contains {bad} non-finite value(s) (NaN or inf); the step was not taken. "
            "Check the loss/constraints at this point (a diverging run or a bad batch)."
        )
