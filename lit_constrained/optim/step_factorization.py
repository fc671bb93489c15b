"""The constrained step's workspaces and the factor of its Gram (:class:`StepFactorization`, a mixin of
:class:`~lit_constrained.optim.constrained.ConstrainedOptimizer`): persistent scratch buffers, and
:math:`G = J D^2 J^T` formed blocked (:func:`~lit_constrained.optim.linalg.gram.scaled_gram`) or, where
the last step of this shape needed it, from float64 products at once
(:func:`~lit_constrained.optim.linalg.gram.exact_gram`), then factored
(:class:`~lit_constrained.optim.linalg.gram_factor.GramFactor`) with its finiteness flag."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .linalg.gram import exact_gram, gram_partials_shape, scaled_gram, scaled_scratch_shape
from .linalg.gram_factor import GramFactor
from .linalg.products import Scaling, chunk_columns, matvec
from .projection import Projection


class StepFactorization:
    """The workspaces and Gram factorizations of a
    :class:`~lit_constrained.optim.constrained.ConstrainedOptimizer` (which sets the attributes below)."""

    param_groups: list[dict[str, Any]]
    _buffers: dict[str, Tensor]
    _exact_gram_for: tuple[tuple[int, ...], torch.dtype] | None

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """A persistent scratch tensor (allocated once; not part of the state)."""
        buf = self._buffers.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(shape, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf

    def _vector(self, name: str, like: Tensor) -> Tensor:
        """A persistent n-vector buffer shaped like ``like``."""
        return self._buffer(name, tuple(like.shape), like.dtype, like.device)

    def _scaling(self, projection: Projection) -> Scaling | None:
        """(d, scratch) when the projection Jacobian is J diag(d) (see ``merged_step``); None for J itself."""
        d = projection.scaling
        if d is None:
            return None
        return d, self._vector("scaled_vector", d)

    def _exact_workspace(self, jacobian: Tensor) -> tuple[Tensor, Tensor]:
        """Scratch for ``exact_matvec`` (and ``exact_gram``): float64 (m, chunk) and (chunk,)."""
        m, n = jacobian.shape
        chunk = min(n, chunk_columns(m))
        return (self._buffer("exact_rows", (m, chunk), torch.float64, jacobian.device),
                self._buffer("exact_vector", (chunk,), torch.float64, jacobian.device))

    def _exact_gram(self, jacobian: Tensor, d: Tensor | None = None) -> Tensor:
        """J D^2 J^T from float64 products, in the optimizer's workspace."""
        return exact_gram(jacobian, self._exact_workspace(jacobian), d)

    def _exact_factor(self, jacobian: Tensor, d: Tensor | None = None) -> GramFactor:
        return GramFactor.from_gram(self._exact_gram(jacobian, d), self.param_groups[0]["rcond"], exact=True)

    def _exact_gram_expected(self, jacobian: Tensor, d: Tensor | None) -> bool:
        """Whether the last step of this J's shape and dtype needed the exact Gram (J itself, d None): J
        changes little between steps, so this one forms it at once instead of the blocked Gram first (a
        pass of m^2 n float32 products and a factorization saved; ``_projector`` clears the mark when the
        exact factor's conditioning would have let the blocked Gram do)."""
        return d is None and self._exact_gram_for == (tuple(jacobian.shape), jacobian.dtype)

    def _factorize(self, jacobian: Tensor) -> tuple[GramFactor, Tensor]:
        """The factor of G = J J^T and whether G is finite (a NaN/inf anywhere in J shows in G; the
        factorization then runs on zeros instead, and the flag stops the step)."""
        factor, finite, _ = self._scaled_factorize(jacobian, None)
        return factor, finite

    def _scaled_factorize(self, jacobian: Tensor, d: Tensor | None, v: Tensor | None = None,
                          ) -> tuple[GramFactor, Tensor, Tensor | None]:
        """``_factorize`` for G = J D^2 J^T (D = diag(d), the identity when ``d`` is None; a NaN/inf in d
        shows in G too), with J D v (float64) when ``v`` is given (else None; from the Gram's pass with
        ``d``): :func:`~lit_constrained.optim.linalg.gram.scaled_gram`."""
        m, n = jacobian.shape
        if m == 0:
            return (GramFactor.empty(jacobian.device), torch.ones((), dtype=torch.bool, device=jacobian.device),
                    None if v is None else torch.zeros(0, dtype=torch.float64, device=jacobian.device))
        exact = self._exact_gram_expected(jacobian, d)
        if exact:
            G = self._exact_gram(jacobian)
            Jv = None if v is None else matvec(jacobian, v)  # (the blocked path's product for d = None)
        else:
            partials = scratch = None
            if jacobian.dtype != torch.float64:
                partials = self._buffer("gram_partials", gram_partials_shape((m, n)), jacobian.dtype,
                                        jacobian.device)
            if d is not None:
                scratch = self._buffer("scaled_columns", scaled_scratch_shape(m, n, jacobian.dtype), jacobian.dtype,
                                       jacobian.device)
            G, Jv = scaled_gram(jacobian, d, partials, scratch, v)
        finite = torch.isfinite(G).all()
        G.masked_fill_(finite.logical_not(), 0.0)  # flagged (the step raises): never used; in place (m x m bytes)
        return GramFactor.from_gram(G, self.param_groups[0]["rcond"], exact=exact), finite, Jv
