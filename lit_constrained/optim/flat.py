"""The flat-vector layout shared by the constrained optimizers and the Jacobian helper.

Parameters are taken in ``param_groups`` order, each flattened in row-major order; a complex
parameter contributes ``torch.view_as_real(p)`` (real and imaginary parts interleaved), so every
parameter is a block of real numbers of a single vector x in R^n.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor


def real_view(t: Tensor) -> Tensor:
    """The tensor as real numbers: ``view_as_real`` for complex tensors, itself otherwise."""
    return torch.view_as_real(t) if t.is_complex() else t


def group_params(param_groups: Sequence[dict]) -> list[Tensor]:
    """All parameters of an optimizer, in ``param_groups`` order (the flat layout's order)."""
    return [p for group in param_groups for p in group["params"]]


def numel_real(params: Iterable[Tensor]) -> int:
    """n: the number of real entries of the parameters (complex entries count twice)."""
    return sum(real_view(p).numel() for p in params)


def gather(tensors: Sequence[Tensor | None], like: Sequence[Tensor], dtype: torch.dtype) -> Tensor:
    """Concatenate ``tensors`` (e.g. gradients) into one flat real vector of ``dtype``.

    ``None`` entries (a parameter without gradient) are zeros of the size of the matching
    entry of ``like``.
    """
    pieces = []
    for t, p in zip(tensors, like, strict=True):
        if t is None:
            pieces.append(torch.zeros(real_view(p).numel(), dtype=dtype, device=p.device))
        else:
            pieces.append(real_view(t).reshape(-1).to(dtype))
    if not pieces:
        return torch.zeros(0, dtype=dtype)
    return torch.cat(pieces)


def block_sizes(params: Sequence[Tensor]) -> list[int]:
    """Sizes of each parameter's block in the flat vector."""
    return [real_view(p).numel() for p in params]


def add_flat_(params: Sequence[Tensor], flat: Tensor) -> None:
    """x <- x + flat, block by block, casting each block to its parameter's dtype."""
    offset = 0
    with torch.no_grad():
        for p in params:
            view = real_view(p)
            size = view.numel()
            view.add_(flat[offset:offset + size].view_as(view).to(view.dtype))
            offset += size
