"""The flat-vector layout of the constrained optimizers: the columns of J
(:mod:`~lit_constrained.jacobians.columns`) in ``param_groups`` order.

Parameters are taken in ``param_groups`` order, each flattened in row-major order; a complex
parameter contributes ``torch.view_as_real(p)`` (real and imaginary parts interleaved), so every
parameter is a block of real numbers of a single vector x in R^n. :class:`FlatLayout` is that layout,
written once: gather tensors shaped like the parameters into a flat vector, add a flat vector to the
parameters, the param groups' blocks and the working dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lit_constrained.jacobians.columns import block_sizes, real_view


def group_params(param_groups: Sequence[dict]) -> list[Tensor]:
    """All parameters of an optimizer, in ``param_groups`` order (the flat layout's order)."""
    return [p for group in param_groups for p in group["params"]]


def group_blocks(param_groups: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], slice]]:
    """Each param group with its slice of the flat vector."""
    blocks, offset = [], 0
    for group in param_groups:
        size = sum(block_sizes(group["params"]))
        blocks.append((group, slice(offset, offset + size)))
        offset += size
    return blocks


@dataclass(frozen=True, eq=False)
class FlatLayout:
    """The flat layout of a list of parameters (per parameter, of its real view).

    Attributes:
        key: the (dtype, shape) of each parameter it was built for (:meth:`matches`).
        sizes, shapes, dtypes: of each parameter's real view.
        dtype: the dtype they promote to, float32 at least (the ``"native"`` working dtype).
        real: no parameter is complex.
        n: the length of the flat vector.
    """

    key: tuple[tuple[torch.dtype, torch.Size], ...]
    sizes: list[int]
    shapes: list[torch.Size]
    dtypes: list[torch.dtype]
    dtype: torch.dtype
    real: bool
    n: int
    _views: dict[str, tuple[int, torch.dtype, list[Tensor]]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, params: Sequence[Tensor]) -> "FlatLayout":
        reals = [real_view(p) for p in params]
        dtype = torch.float32
        for t in reals:  # (promote_types is a dispatch per parameter: once per layout)
            dtype = torch.promote_types(dtype, t.dtype)
        return cls(_key(params), [t.numel() for t in reals], [t.shape for t in reals], [t.dtype for t in reals],
                   dtype if dtype.is_floating_point else torch.float32,
                   not any(p.is_complex() for p in params), sum(t.numel() for t in reals))

    @classmethod
    def cached(cls, cache: dict[str, Any], params: Sequence[Tensor]) -> "FlatLayout":
        """The layout of ``params`` from ``cache`` while their dtypes and shapes stay the same."""
        layout = cache.get("layout")
        if layout is None or not layout.matches(params):
            layout = cache["layout"] = cls.of(params)
        return layout

    def matches(self, params: Sequence[Tensor]) -> bool:
        return self.key == _key(params)

    def working_dtype(self, precision: str) -> torch.dtype:
        """float64 for ``precision="float64"`` (the reference), else the parameters' :attr:`dtype`."""
        return torch.float64 if precision == "float64" else self.dtype

    def reals(self, params: Sequence[Tensor]) -> list[Tensor]:
        """The parameters as real tensors (their real views)."""
        return list(params) if self.real else [real_view(p) for p in params]

    def views(self, name: str, flat: Tensor) -> list[Tensor]:
        """Views of the flat vector ``flat`` shaped like each parameter's real view (cached per
        ``name`` while ``flat`` is the same storage)."""
        cached = self._views.get(name)
        if cached is None or cached[0] != flat.data_ptr() or cached[1] != flat.dtype:
            views, offset = [], 0
            for shape, size in zip(self.shapes, self.sizes):
                views.append(flat[offset:offset + size].view(shape))
                offset += size
            cached = self._views[name] = (flat.data_ptr(), flat.dtype, views)
        return cached[2]

    def gather(self, tensors: Sequence[Tensor | None], out: Tensor, name: str = "gather",
               owner: str = "The flat layout") -> Tensor:
        """``tensors`` (shaped like the parameters, e.g. their gradients; None: zeros) copied into the
        flat vector ``out`` (one foreach copy). Sparse tensors are refused (the error names ``owner``)."""
        views = self.views(name, out)
        targets, sources = [], []
        for t, view in zip(tensors, views, strict=True):
            if t is None:
                view.zero_()
            elif t.is_sparse:
                raise ValueError(f"{owner} does not support sparse gradients (use dense gradients).")
            else:
                targets.append(view)
                sources.append(real_view(t.detach()))
        if targets:
            torch._foreach_copy_(targets, sources)
        return out

    def add_(self, params: Sequence[Tensor], delta: Tensor) -> None:
        """x <- x + delta, block by block (one foreach add when the dtypes agree; each block cast to its
        parameter's dtype otherwise). ``params``: the parameters or their real views (:meth:`reals`)."""
        targets = self.reals(params)
        steps = self.views("delta", delta)
        with torch.no_grad():
            if all(dtype == delta.dtype for dtype in self.dtypes):
                torch._foreach_add_(targets, steps)
            else:  # e.g. the float64 reference path with lower-precision parameters
                for target, step in zip(targets, steps):
                    target.add_(step.to(target.dtype))


def _key(params: Sequence[Tensor]) -> tuple[tuple[torch.dtype, torch.Size], ...]:
    return tuple([(p.dtype, p.shape) for p in params])


def gather(tensors: Sequence[Tensor | None], like: Sequence[Tensor], dtype: torch.dtype) -> Tensor:
    """``tensors`` (e.g. gradients; None: zeros) as one new flat real vector of ``dtype``, in the layout
    of ``like`` (:meth:`FlatLayout.gather`)."""
    layout = FlatLayout.of(like)
    device = like[0].device if like else None
    return layout.gather(tensors, torch.empty(layout.n, dtype=dtype, device=device))
