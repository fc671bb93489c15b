r"""The merged step: :math:`\delta = a P w - J^+ (s c)` in one pass for :math:`J w` and one for :math:`J^T z`.

With :math:`P w = w - J^T G^+ J w` and :math:`J^+ c = J^T G^+ c`, by linearity

.. math::
    \delta = a P w - J^+ (s c) = a w - J^T z, \qquad z = G^+ (s c + a J w),

then refined (:func:`~.refinement.refine_`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .gram_factor import GramFactor
from .products import Scaling, add_rmatvec_, matvec
from .refinement import refine_

def merged_step(
    J: Tensor,
    factor: GramFactor,
    w: Tensor | None,
    a: float,
    sc: Tensor,
    refinements: int,
    out: Tensor,
    workspace: tuple[Tensor, Tensor] | None = None,
    scaling: Scaling | None = None,
    exact: bool = True,
    scratch: Tensor | None = None,
    multipliers: Tensor | None = None,
) -> Tensor:
    r"""out = a P w - J^+ (s c), merged: :math:`out = a w - J^T z`, :math:`z = G^+(sc + a J w)`.

    Then :math:`J\,out = -U_r U_r^T (sc)` up to round-off, improved by ``refinements`` steps of iterative
    refinement (residuals from :func:`exact_matvec` with ``workspace``, or from :func:`blocked_matvec`
    when ``exact`` is False; :func:`exact_residual_needed` decides). ``w=None`` means w = 0 (the
    normal step alone); ``sc`` is :math:`s c` (float64). Returns ``out`` (J's dtype), which may alias ``w``. ``scratch``: an
    n-vector in J's dtype for the refinement's corrections (:func:`refine_`; allocated there when None).

    ``scaling = (d, scratch)``: the same with the operator :math:`J D`, D = diag(d), in place of J
    (``factor`` then factors :math:`J D^2 J^T`, :func:`scaled_gram`); it is never formed: its
    products are :math:`J (d \odot v)` and :math:`d \odot (J^T z)`, through the n-vector ``scratch``.

    ``multipliers``: an optional (m,) float64 tensor that receives z (before refinement: the
    multipliers of the rows, e.g. the inequality rows' signs an active-set method reads).
    """
    if w is None:
        z = factor.solve(sc)
        if multipliers is not None:
            multipliers.copy_(z)
        if scaling is None:
            out.zero_()
            add_rmatvec_(out, J, z, alpha=-1.0)
        else:  # -d (J^T z)
            d, scratch = scaling
            scratch.addmv_(J.T, z.to(J.dtype), beta=0.0, alpha=-1.0)
            torch.mul(scratch, d, out=out)
    else:
        z = factor.solve(sc + a * matvec(J, w, scaling))
        if multipliers is not None:
            multipliers.copy_(z)
        z = z.to(J.dtype)
        if scaling is None:
            torch.addmv(w, J.T, z, beta=a, alpha=-1.0, out=out)  # a w - J^T z in one pass
        else:  # a w - d (J^T z)
            d, scratch = scaling
            scratch.addmv_(J.T, z, beta=0.0, alpha=-1.0).mul_(d)
            torch.add(scratch, w, alpha=a, out=out)
    return refine_(J, factor, out, sc, refinements, workspace, scaling, exact, scratch)
