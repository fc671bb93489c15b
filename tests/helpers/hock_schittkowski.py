"""Hock-Schittkowski test problems with known solutions (f, c as torch functions of x)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor


@dataclass(frozen=True)
class Problem:
    name: str
    objective: Callable[[Tensor], Tensor]
    constraints: Callable[[Tensor], Tensor]
    x0: tuple[float, ...]
    solution: tuple[float, ...]


HS6 = Problem(
    "HS6",
    lambda x: (1 - x[0]) ** 2,
    lambda x: (10 * (x[1] - x[0] ** 2)).reshape(1),
    (-1.2, 1.0),
    (1.0, 1.0),
)
HS28 = Problem(
    "HS28",
    lambda x: (x[0] + x[1]) ** 2 + (x[1] + x[2]) ** 2,
    lambda x: (x[0] + 2 * x[1] + 3 * x[2] - 1).reshape(1),
    (-4.0, 1.0, 1.0),
    (0.5, -0.5, 0.5),
)
HS48 = Problem(
    "HS48",
    lambda x: (x[0] - 1) ** 2 + (x[1] - x[2]) ** 2 + (x[3] - x[4]) ** 2,
    lambda x: torch.stack([x.sum() - 5, x[2] - 2 * (x[3] + x[4]) + 3]),
    (3.0, 5.0, -3.0, 2.0, -2.0),
    (1.0, 1.0, 1.0, 1.0, 1.0),
)
PROBLEMS = (HS6, HS28, HS48)
