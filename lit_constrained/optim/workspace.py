"""An optimizer's scratch (:class:`Workspace`): persistent buffers reused from step to step, and the
factor of a step's Gram :math:`G = J D^2 J^T`, formed blocked (:func:`~lit_constrained.optim.linalg.gram.scaled_gram`)
or, where the last step of this shape needed it, from float64 products at once
(:func:`~lit_constrained.optim.linalg.gram.exact_gram`), then factored
(:class:`~lit_constrained.optim.linalg.gram_factor.GramFactor`) with its finiteness flag.

Nothing here is optimizer state: a workspace only saves allocations and a factorization, and a step with
a fresh one computes the same numbers (the exact-Gram memory only skips the blocked Gram a step would
discard)."""

from __future__ import annotations

import torch
from torch import Tensor

from .linalg.gram import exact_gram, gram_partials_shape, scaled_gram, scaled_scratch_shape
from .linalg.gram_factor import GramFactor
from .linalg.products import Scaling, chunk_columns, matvec

Memory = str
"""Which exact-Gram memory a factorization reads and writes: ``"equality"`` (J itself) or ``"stacked"``
(the rows [J; G_A] of a step with active inequality rows)."""


class Workspace:
    """Persistent scratch tensors, the flat layout's cache and the exact-Gram memory of one optimizer."""

    def __init__(self) -> None:
        self.buffers: dict[str, Tensor] = {}
        self.cache: dict[str, object] = {}
        """The flat layout and the param groups' blocks (:class:`~lit_constrained.optim.flat.FlatLayout`)."""
        self.exact_gram_for: dict[Memory, tuple[tuple[int, ...], torch.dtype] | None] = {}
        """Per memory, the (shape, dtype) of the J whose last step needed the exact Gram."""

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """A persistent scratch tensor (allocated once; not part of the state)."""
        buf = self.buffers.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(shape, dtype=dtype, device=device)
            self.buffers[name] = buf
        return buf

    def vector(self, name: str, like: Tensor) -> Tensor:
        """A persistent n-vector buffer shaped like ``like``."""
        return self.buffer(name, tuple(like.shape), like.dtype, like.device)

    def swap(self, name: str, tensor: Tensor) -> Tensor:
        """Put ``tensor`` into the buffer ``name`` and return what was there (a spare of the same shape)."""
        spare = self.buffers[name]
        self.buffers[name] = tensor
        return spare

    def scaling(self, d: Tensor | None) -> Scaling | None:
        """(d, scratch) when the projection Jacobian is J diag(d) (see ``merged_step``); None for J itself."""
        if d is None:
            return None
        return d, self.vector("scaled_vector", d)

    def exact_workspace(self, jacobian: Tensor) -> tuple[Tensor, Tensor]:
        """Scratch for ``exact_matvec`` (and ``exact_gram``): float64 (m, chunk) and (chunk,)."""
        m, n = jacobian.shape
        chunk = min(n, chunk_columns(m))
        return (self.buffer("exact_rows", (m, chunk), torch.float64, jacobian.device),
                self.buffer("exact_vector", (chunk,), torch.float64, jacobian.device))

    def exact_factor(self, jacobian: Tensor, rcond: float, d: Tensor | None = None) -> GramFactor:
        """The factor of J D^2 J^T from float64 products."""
        return GramFactor.from_gram(exact_gram(jacobian, self.exact_workspace(jacobian), d), rcond, exact=True)

    def remember_exact_gram(self, jacobian: Tensor, needed: bool, memory: Memory = "equality") -> None:
        """Mark (or clear) that a step of this J's shape and dtype needed the exact Gram."""
        self.exact_gram_for[memory] = (tuple(jacobian.shape), jacobian.dtype) if needed else None

    def exact_gram_expected(self, jacobian: Tensor, d: Tensor | None, memory: Memory = "equality") -> bool:
        """Whether the last step of this J's shape and dtype needed the exact Gram (J itself, d None): J
        changes little between steps, so this one forms it at once instead of the blocked Gram first (a
        pass of m^2 n float32 products and a factorization saved; the host read clears the mark when the
        exact factor's conditioning would have let the blocked Gram do)."""
        return d is None and self.exact_gram_for.get(memory) == (tuple(jacobian.shape), jacobian.dtype)

    def factorize(self, jacobian: Tensor, rcond: float, d: Tensor | None = None, v: Tensor | None = None,
                  memory: Memory = "equality") -> tuple[GramFactor, Tensor, Tensor | None]:
        """The factor of G = J D^2 J^T (D = diag(d), the identity when ``d`` is None), whether G is finite
        (a NaN/inf anywhere in J or d shows in G; the factorization then runs on zeros instead, and the
        flag stops the step) and, when ``v`` is given, J D v (float64, from the Gram's pass with ``d``;
        else None): :func:`~lit_constrained.optim.linalg.gram.scaled_gram`."""
        m, n = jacobian.shape
        if m == 0:
            return (GramFactor.empty(jacobian.device), torch.ones((), dtype=torch.bool, device=jacobian.device),
                    None if v is None else torch.zeros(0, dtype=torch.float64, device=jacobian.device))
        exact = self.exact_gram_expected(jacobian, d, memory)
        if exact:
            G = exact_gram(jacobian, self.exact_workspace(jacobian))
            Jv = None if v is None else matvec(jacobian, v)  # (the blocked path's product for d = None)
        else:
            partials = scratch = None
            if jacobian.dtype != torch.float64:
                partials = self.buffer("gram_partials", gram_partials_shape((m, n)), jacobian.dtype, jacobian.device)
            if d is not None:
                scratch = self.buffer("scaled_columns", scaled_scratch_shape(m, n, jacobian.dtype), jacobian.dtype,
                                      jacobian.device)
            G, Jv = scaled_gram(jacobian, d, partials, scratch, v)
        finite = torch.isfinite(G).all()
        G.masked_fill_(finite.logical_not(), 0.0)  # flagged (the step raises): never used; in place (m x m bytes)
        return GramFactor.from_gram(G, rcond, exact=exact), finite, Jv
