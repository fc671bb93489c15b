"""The columns of J: the parameters as one flat vector of real numbers.

Parameters are taken in order, each flattened in row-major order; a complex parameter contributes
``torch.view_as_real(p)`` (real and imaginary parts interleaved), so the n columns of J are the real
entries of the parameters. The optimizers' flat vectors (:class:`~lit_constrained.optim.flat.FlatLayout`)
are laid out the same way: a step is a vector of that R^n.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor


def real_view(t: Tensor) -> Tensor:
    """The tensor as real numbers: ``view_as_real`` for complex tensors, itself otherwise."""
    return torch.view_as_real(t) if t.is_complex() else t


def numel_real(params: Iterable[Tensor]) -> int:
    """n: the number of real entries of the parameters (complex entries count twice)."""
    return sum(real_view(p).numel() for p in params)


def block_sizes(params: Sequence[Tensor]) -> list[int]:
    """Sizes of each parameter's block in the flat vector."""
    return [real_view(p).numel() for p in params]
