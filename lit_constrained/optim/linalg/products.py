r"""The products with J (m x n, in its own dtype): :math:`J v` and :math:`J^T z`.

:math:`J v` (:func:`matvec`) is a product in J's dtype; :func:`exact_matvec` forms it from float64
products (J converted chunk by chunk) and :func:`blocked_matvec` from float32 products over column blocks
summed in float64, for the residuals of iterative refinement; :math:`J^T z` (:func:`add_rmatvec_`) is an
n-vector written in J's dtype (a refinement's correction formed apart from split multipliers and then
added, :func:`_rmatvec_into`). A column-scaled operator :math:`J D`, D = diag(d) (:data:`Scaling`), is
never formed: its products are :math:`J (d \odot v)` and :math:`d \odot (J^T z)`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .gram_factor import EIGH_MAX_SIZE

CHUNK_ELEMENTS = 1 << 18
"""float64 entries of J converted at a time by :func:`exact_matvec` / :func:`exact_gram` (2 MiB: an L2
cache), i.e. ``chunk_columns(m)`` columns."""


def chunk_columns(m: int) -> int:
    """Columns per float64 chunk of an m-row J."""
    return max(1024, min(65536, CHUNK_ELEMENTS // max(m, 1)))


def chunk_workspace(m: int, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """A float64 chunk workspace for an (m, n) J: (m, chunk) rows and a (chunk,) vector."""
    chunk = min(n, chunk_columns(m))
    return (torch.empty(m, chunk, dtype=torch.float64, device=device),
            torch.empty(chunk, dtype=torch.float64, device=device))

RESIDUAL_BLOCK = 256
"""Columns per float32 product block of :func:`blocked_matvec` (partials summed in float64)."""


Scaling = tuple[Tensor, Tensor]
"""(d, scratch): the operator is J diag(d), never formed (Adam(con)'s J H^{-1/2}); ``scratch`` is an
n-vector buffer in J's dtype for the products with it."""


def matvec(J: Tensor, v: Tensor, scaling: Scaling | None = None) -> Tensor:
    """J v (J D v with ``scaling``) as float64 (a product in J's dtype: float32 accumulation for float32 J)."""
    if scaling is not None:
        d, scratch = scaling
        v = torch.mul(d, v, out=scratch)
    if J.dtype == torch.float64:
        return J @ v.to(torch.float64)
    return (J @ v.to(J.dtype)).to(torch.float64)


def exact_matvec(J: Tensor, v: Tensor, workspace: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """J v from float64 products and sums (exact to float64 round-off for float32 J and v), converting
    chunks of ``chunk_columns(m)`` columns into ``workspace`` = (float64 (m, chunk), float64 (chunk,)), or
    for a large m whole rows into the same storage (:func:`_exact_rows`)."""
    if J.dtype == torch.float64 and v.dtype == torch.float64:
        return J @ v
    m, n = J.shape
    if workspace is None:
        workspace = chunk_workspace(m, n, J.device)
    J64, v64 = workspace
    rows = _exact_rows(m, n, J64.numel())
    if rows:  # whole rows converted at a time: a contiguous copy (column chunks: 2x the time at m = 1 000)
        v_full = v.to(torch.float64)
        block = J64.view(-1)[: rows * n].view(rows, n)
        out = torch.empty(m, dtype=torch.float64, device=J.device)
        for start in range(0, m, rows):
            stop = min(start + rows, m)
            torch.mv(block[: stop - start].copy_(J[start:stop]), v_full, out=out[start:stop])
        return out
    chunk = J64.shape[1]
    out = torch.zeros(m, dtype=torch.float64, device=J.device)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        a, b = J64[:, : stop - start], v64[: stop - start]
        a.copy_(J[:, start:stop])
        b.copy_(v[start:stop])
        out.addmv_(a, b)
    return out


def _exact_rows(m: int, n: int, capacity: int) -> int:
    """Rows of J that :func:`exact_matvec` converts at a time for m > ``EIGH_MAX_SIZE`` (``CHUNK_ELEMENTS`` /
    n, at least one, when they fit the workspace's ``capacity`` float64 entries); 0: column chunks (smaller
    m, where the conversion of a few long rows is no faster: docs/optim_measurements.md, large m)."""
    rows = max(1, CHUNK_ELEMENTS // max(n, 1))
    return rows if m > EIGH_MAX_SIZE and rows * n <= capacity else 0


def blocked_matvec(J: Tensor, v: Tensor, block: int = RESIDUAL_BLOCK) -> Tensor:
    r"""J v as float64: float32 products over blocks of ``block`` columns (one ``bmm``), the
    blocks' partial sums added in float64 (exact float64 products for float64 J and v). The error of a
    row is :math:`\sim\epsilon_{32}\sqrt{B/n}\,\|J_i\|\,\|v\|` (the blocks' rounding errors are
    independent), against :math:`\epsilon_{32}\|J_i\|\|v\|`-like for one float32 GEMV over all n; it
    costs one float32 pass over J (no conversion of J, unlike :func:`exact_matvec`)."""
    if J.dtype == torch.float64:
        return J @ v.to(torch.float64)
    m, n = J.shape
    v = v.to(J.dtype)
    blocks = n // block
    full = blocks * block
    out = torch.zeros(m, dtype=torch.float64, device=J.device)
    if blocks:
        # v_b^T J_b^T for every block b: (blocks, 1, B) @ (blocks, B, m), J_b^T a strided view of J. The
        # same products and float64 sum as J_b v_b, but this orientation runs at a GEMV's speed on the
        # CPU (J_b v_b as a bmm with one column: 7x a GEMV's time, docs/optim_measurements.md)
        row, column = J.stride()
        JbT = J.as_strided((blocks, block, m), (block * column, column, row))
        partial = torch.bmm(v[:full].reshape(blocks, 1, block), JbT)
        out += partial.sum(0, dtype=torch.float64).view(m)
    if full < n:
        out += (J[:, full:] @ v[full:]).to(torch.float64)
    return out


def add_rmatvec_(
    out: Tensor,
    J: Tensor,
    z: Tensor,
    alpha: float = 1.0,
    scaling: Scaling | None = None,
    split: bool = False,
    scratch: Tensor | None = None,
) -> Tensor:
    """out += alpha J^T z (alpha D J^T z with ``scaling``), in place (out and J share a dtype; z is cast
    to it). ``split``: J^T z is formed apart from split multipliers (:func:`_rmatvec_into`; in ``scratch``,
    an n-vector in J's dtype allocated when None, or in the scaling's scratch) and added in one rounding,
    for a float64 z that the product would otherwise lose (a refinement's correction, :func:`refine_`)."""
    if split:
        if scaling is None:
            product = _rmatvec_into(torch.empty_like(out) if scratch is None else scratch, J, z)
            return out.add_(product, alpha=alpha)
        d, scaled = scaling
        return out.addcmul_(_rmatvec_into(scaled, J, z), d, value=alpha)
    z = z if z.dtype == J.dtype else z.to(J.dtype)
    if scaling is None:
        return out.addmv_(J.T, z, alpha=alpha)
    d, scaled = scaling
    return out.addcmul_(torch.mv(J.T, z, out=scaled), d, value=alpha)


def _rmatvec_into(out: Tensor, J: Tensor, z: Tensor) -> Tensor:
    r"""out = J^T z in J's dtype for a float64 z, its rounding to J's dtype carried by a second product:
    :math:`J^T z_{hi} + J^T z_{lo}` with :math:`z_{hi}` = z rounded and :math:`z_{lo} = z - z_{hi}` (one
    more pass over J). G^+ amplifies the residual by up to :math:`1/\lambda_{\min}`, so z spans many orders
    and its float32 rounding alone left the refinement at 9e-6-5e-5 relative error at cond(J) = 1e5
    (n = 1e5, m = 10; 5e-6-8e-6 split, about the float32 floor of a step that large). Used with the exact
    residuals (ill-conditioned J), where that pass is a small part of the cost."""
    high = z.to(J.dtype)
    torch.mv(J.T, high, out=out)
    if z.dtype != J.dtype:
        out.addmv_(J.T, (z - high.to(z.dtype)).to(J.dtype))
    return out
