"""In-place symmetrization of an m x m matrix by blocks: no m x m temporary.

At m = 3 000 an m x m float64 matrix is 72 MB, two thirds of a float32 J's bytes (m x 8 964): the usual
``0.5 * (S + S.T)`` or ``S.tril() + S.tril(-1).T`` made two or three of them at once, a peak the memory
target of a step counts (docs/optim_measurements.md, "At scale"). Both functions walk ``BLOCK`` x ``BLOCK`` blocks and return S.
"""

from __future__ import annotations

from torch import Tensor

BLOCK = 256


def symmetrize_(S: Tensor) -> Tensor:
    """S <- (S + S^T) / 2 in place (bit-identical to ``0.5 * (S + S.T)``)."""
    m = S.shape[0]
    for top in range(0, m, BLOCK):
        bottom = min(top + BLOCK, m)
        for left in range(top, m, BLOCK):
            right = min(left + BLOCK, m)
            upper, lower = S[top:bottom, left:right], S[left:right, top:bottom]
            mean = (upper + lower.T).mul_(0.5)
            upper.copy_(mean)
            lower.copy_(mean.T)
    return S


def mirror_lower_(S: Tensor) -> Tensor:
    """The strict upper triangle of S <- the transpose of its strict lower triangle, in place (the lower
    triangle is S's; the upper one's entries are ignored)."""
    m = S.shape[0]
    for top in range(0, m, BLOCK):
        bottom = min(top + BLOCK, m)
        diagonal = S[top:bottom, top:bottom]
        diagonal.copy_(diagonal.tril() + diagonal.tril(-1).T)
        S[top:bottom, bottom:].copy_(S[bottom:, top:bottom].T)
    return S
