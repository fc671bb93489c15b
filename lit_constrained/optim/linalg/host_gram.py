r"""The products of a large Gram matrix :math:`G = J J^T` on the CPU by NumPy/SciPy's BLAS.

For m > ``EIGH_MAX_SIZE`` on the CPU the m x m algebra is already SciPy's (the pivoted Cholesky factor,
:mod:`~lit_constrained.optim.linalg.pivoted_cholesky`); its Gram products are taken there too. The products
are the same as torch's (float32 products of a block of columns, :math:`J_b J_b^T`; float64 products of a
converted chunk, accumulated in float64), formed by another BLAS: on the AMD EPYC of these measurements
torch's MKL ran a 1 000 x 2 048 float32 product at 0.44x and a float64 rank-k update at 0.71x the speed of
SciPy's OpenBLAS (docs/optim_measurements.md, large m). The products accumulate in another order than
torch's: the Gram agrees with torch's to its rounding (:func:`~lit_constrained.optim.linalg.gram.gram_error`),
not bit for bit. The caller holds OpenBLAS to torch's thread count
(:mod:`~lit_constrained.optim.linalg.blas_threads`, around every step with such an m).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.linalg import blas
from torch import Tensor

from .symmetric import mirror_lower_


def takes(J: Tensor, d: Tensor | None = None) -> bool:
    """Whether these products take J (and the scaling d): float32 CPU tensors outside autograd (NumPy has
    no bfloat16 and no graph: a 16-bit J, or one that requires grad, keeps torch's products)."""
    return all(t is None or (t.device.type == "cpu" and t.dtype == torch.float32 and not t.requires_grad)
               for t in (J, d))


def add_block_product_(G: Tensor, piece: Tensor, product: Tensor) -> Tensor:
    """G += piece piece^T: the product in piece's dtype (into ``product``, m x m in that dtype), added to the
    float64 G, for a J that :func:`takes` allows; ``piece`` may be a strided view of J's columns (its rows'
    stride is J's)."""
    columns = piece.numpy()
    np.matmul(columns, columns.T, out=product.numpy())
    return G.add_(product)


class SymmetricAccumulator:
    """:math:`C = \\sum_k B_k B_k^T` in float64 by SciPy's ``dsyrk`` (the lower triangle only: half the
    multiply-adds of a full product), for float64 chunks :math:`B_k` (m x k, C-contiguous rows)."""

    def __init__(self, m: int) -> None:
        self._lower = np.zeros((m, m), order="F")

    def add_(self, chunk: Tensor) -> None:
        # chunk (m, k) C-ordered is (k, m) Fortran-ordered as its transpose: C += A^T A with A = chunk^T
        self._lower = blas.dsyrk(1.0, chunk.numpy().T, beta=1.0, c=self._lower, trans=1, lower=1, overwrite_c=1)

    def result(self) -> Tensor:
        """C (float64, symmetric, C-contiguous): the lower triangle mirrored in place (the Fortran-ordered
        array's transpose is C-ordered and, C being symmetric, C itself)."""
        return mirror_lower_(torch.from_numpy(self._lower)).T
