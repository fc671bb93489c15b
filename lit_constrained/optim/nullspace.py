r"""Rank-revealing null-space linear algebra for a constraint Jacobian J (m x n, m small, n large).

J and every n-vector stay in their own dtype (float32 for float32 parameters); float64 is used for the
m x m algebra and for the accumulations that need it:

* the Gram matrix :math:`G = J J^T` (:func:`gram`): for float32 J, float32 products over column blocks
  of ``GRAM_BLOCK`` columns, the blocks summed in float64 (relative error ~ :math:`\epsilon_{32}
  \sqrt{B/n}`, :func:`gram_error`; one float32 GEMM over all n would give ~:math:`\epsilon_{32}\sqrt n`);
  :func:`exact_gram` forms it from float64 products when J is too ill-conditioned for that;
* :math:`J v` (:func:`matvec`) is a float32 product; :func:`exact_matvec` forms it from float64
  products (J converted chunk by chunk) for the residuals of iterative refinement; :math:`J^T z`
  (:func:`add_rmatvec_`) is an n-vector written in J's dtype (a refinement's correction formed apart
  and then added, :func:`refine_`);
* a column-scaled operator :math:`J D`, D = diag(d) (Adam(con)'s :math:`J H^{-1/2}`), is never formed
  (``scaling``): its Gram :math:`J D^2 J^T` scales a cache-sized chunk of columns at a time
  (:func:`scaled_gram`), its products are :math:`J (d \odot v)` and :math:`d \odot (J^T z)`.

With :math:`G = U \Lambda U^T` (an eigendecomposition: the left singular vectors and squared singular
values of J), the numerical rank keeps the eigenvalues with :math:`\lambda_i > \mathrm{rcond}^2
\lambda_{\max}` (a relative cutoff on the singular values, never an absolute shift) and
:math:`G^+ = U \mathrm{diag}(\mathrm{keep}/\lambda) U^T` (:class:`GramFactor`; the cutoff is a mask, so
no host sync and no data-dependent shapes). Then

.. math::
    P w = w - J^T G^+ J w, \qquad J^+ c = J^T G^+ c,

P the orthogonal projector on the numerical null space of J and :math:`J^+ c` the minimum-norm
least-squares solution of :math:`J x = c`. The optimizers need both at once and merge them by linearity
(:func:`merged_step`): one pass for :math:`J w`, one for :math:`J^T z`,

.. math::
    \delta = a P w - J^+ (s c) = a w - J^T z, \qquad z = G^+ (s c + a J w).

Iterative refinement (residual :math:`-s\,U_r U_r^T c - J \delta`, correction :math:`J^T G^+ r`, two
passes over J) removes the errors of the first pass: that of the normal
equations (each step multiplies it by about :math:`q = \kappa(G)\,\epsilon_G`, :math:`\epsilon_G` the
Gram's relative error) and, for float32 J, the cancellation in :math:`J^T z` (:math:`z` grows like
:math:`1/\sigma_{\min}^2` while :math:`J^T z` like :math:`1/\sigma_{\min}`: a relative error
:math:`\sim\epsilon_{32}\,\kappa(J)`). :class:`RefinementPlan` holds the number of steps, or the exact
float64 Gram when the blocked one is too inaccurate for the conditioning of J. The residual is what
limits the refined accuracy: :func:`blocked_matvec` (float32 products over ``RESIDUAL_BLOCK`` columns
summed in float64, the cost of one float32 pass) is accurate to about :math:`\epsilon_{32}
\sqrt{B/n}\,\kappa(J)` relative to :math:`\|s c\|`, and :func:`exact_matvec` (float64 products, ~3-6
float32 passes' time: the conversion of J dominates) to the float32 rounding of :math:`\delta` itself;
:func:`exact_residual_needed` picks the exact one only where the blocked one cannot reach
``TARGET_ERROR`` (and always on the exact-Gram path).

The factor of G and its rank cutoff are :mod:`~lit_constrained.optim.gram_factor`'s (``eigh``, or a
pivoted Cholesky factorization for a large CPU Gram); this module forms the products with J, decides the
refinement (:class:`RefinementPlan`) and composes the step (:func:`merged_step`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from . import host_gram
from .gram_factor import EIGH_MAX_SIZE, GramFactor
from .hyperparameters import DEFAULT_RCOND
from .symmetric import mirror_lower_, symmetrize_

REFINE_ABOVE_CONDITION = 1e3
"""float64 data: iterative refinement is applied when the condition number of the kept part of J J^T
exceeds this (the unrefined error is then ~1e-13 or less)."""

GRAM_BLOCK = 512
"""Columns per float32 product block of the Gram matrix (blocks are summed in float64), for m <= 16;
``gram_block(m)`` grows it for more constraints so that the (n / block, m, m) partial products stay
smaller than J."""


def gram_block(m: int) -> int:
    return GRAM_BLOCK if m <= 16 else GRAM_BLOCK * 4

CHUNK_ELEMENTS = 1 << 18
"""float64 entries of J converted at a time by :func:`exact_matvec` / :func:`exact_gram` (2 MiB: an L2
cache), i.e. ``chunk_columns(m)`` columns."""


def chunk_columns(m: int) -> int:
    """Columns per float64 chunk of an m-row J."""
    return max(1024, min(65536, CHUNK_ELEMENTS // max(m, 1)))

RESIDUAL_BLOCK = 256
"""Columns per float32 product block of :func:`blocked_matvec` (partials summed in float64)."""

SCALED_RESIDUAL_BLOCK = 64
r"""The block of the scaled residuals :math:`J (d \odot v)` (Adam(con)): the scaling spreads the products'
magnitudes (H^{-1/2} spans ~1e3 for a random gradient), which the estimate of :func:`residual_error`
does not see. At n = 1e5, m = 10, cond(J) = 1e2 (J from an SVD, 18 instances) Adam(con)'s
||J d + c|| / ||c|| was at most 9.2e-7 with 256-column blocks, 6.3e-7 with 128 and 4.5e-7 with 64.
Its cost against a 256-column residual: docs/optim_measurements.md (blocked residual)."""

TARGET_ERROR = 1e-6
"""Refine until the estimated relative error of J delta = -s c is below this (float32 data; about the
rounding error of a float32 step itself at cond(J) = 1e3)."""

MAX_REFINEMENTS = 2
"""Beyond this many refinement steps with the blocked Gram, the exact (float64-product) Gram is used (m <=
``EIGH_MAX_SIZE``; see :func:`max_refinements`)."""

LARGE_MAX_REFINEMENTS = 8
""":func:`max_refinements` for m > ``EIGH_MAX_SIZE``: there the exact Gram's m^2 n float64 products cost far
more than a refinement step's two or three passes over J, so more steps with the blocked Gram come first
(the measured costs: docs/optim_measurements.md, large m)."""

assert MAX_REFINEMENTS <= LARGE_MAX_REFINEMENTS


def max_refinements(m: int) -> int:
    """The most refinement steps with the blocked Gram before the exact Gram is formed instead."""
    return MAX_REFINEMENTS if m <= EIGH_MAX_SIZE else LARGE_MAX_REFINEMENTS


# ---------------------------------------------------------------------------- products with J
SCRATCH_PAD = 16
"""Extra entries per row of :func:`scaled_gram`'s scratch (see :func:`scaled_scratch_shape`)."""


def scaled_chunk_columns(m: int, n: int, dtype: torch.dtype) -> int:
    """Columns of J scaled at a time by :func:`scaled_gram`: ``chunk_columns(m)`` (~1 MiB of
    float32 J, in L2), rounded down to whole ``gram_block(m)`` blocks for float32 J; at most n."""
    if dtype == torch.float64:
        return min(n, chunk_columns(m))
    block = gram_block(m)
    return min(n, max(block, chunk_columns(m) // block * block))


def scaled_scratch_shape(m: int, n: int, dtype: torch.dtype) -> tuple[int, int]:
    """The shape of :func:`scaled_gram`'s scratch: m rows of ``scaled_chunk_columns`` + ``SCRATCH_PAD``
    entries. The pad keeps the row stride off multiples of 4 KiB: with rows 4 KiB-aligned (a chunk of
    whole blocks) the rows of the chunk conflict in the cache sets (the measured costs:
    docs/optim_measurements.md, scaled Gram)."""
    return m, scaled_chunk_columns(m, n, dtype) + SCRATCH_PAD


def _scaled_columns(J: Tensor, d: Tensor, start: int, stop: int, scratch: Tensor) -> Tensor:
    """The columns start:stop of J diag(d), written into the first columns of ``scratch``."""
    return torch.mul(J[:, start:stop], d[start:stop], out=scratch[:, : stop - start])


def gram(J: Tensor, workspace: Tensor | None = None) -> Tensor:
    """G = J J^T in float64 (exact products for float64 J; float32 products over column blocks of
    ``gram_block(m)`` summed in float64 otherwise), symmetrized. ``workspace``: an optional buffer of
    shape ``gram_partials_shape(J.shape)`` in J's dtype for the blocks' products."""
    return scaled_gram(J, None, workspace)[0]


def scaled_gram(J: Tensor, d: Tensor | None, workspace: Tensor | None = None, scratch: Tensor | None = None,
                v: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    r"""(G, J D v): G = J D^2 J^T as :func:`gram` forms it (D = diag(d), the identity when ``d`` is None),
    and, when ``v`` is given, J D v in float64 (else None).

    With ``d``, J D is never formed in full: ``scaled_chunk_columns(m, n, J.dtype)`` columns at a time
    are scaled into ``scratch`` (shape ``scaled_scratch_shape(m, n, J.dtype)``, J's dtype; allocated if
    None), small enough to stay in cache, and their block products are taken there. For float32 J these
    are the same products and the same float64 sum as ``gram(J * d)`` (tested equal); the traffic is one
    read of J instead of a read of J, a write of J D and a read of it. J D v is taken from the cached
    chunks too (a product in J's dtype per chunk, the chunks summed in float64): no pass of its own.
    Without ``d``, J v is :func:`matvec`'s product (a pass of its own)."""
    m, n = J.shape
    chunk = scaled_chunk_columns(m, n, J.dtype)
    if d is not None and scratch is None:
        scratch = torch.empty(scaled_scratch_shape(m, n, J.dtype), dtype=J.dtype, device=J.device)
    products = tail = None
    if d is not None and v is not None:
        products = torch.zeros(-(-n // chunk) + 1, m, dtype=J.dtype, device=J.device)  # + a row for the tail

    def scaled(start: int, stop: int) -> Tensor:  # columns start:stop of J D, with their share of J D v
        S = _scaled_columns(J, d, start, stop, scratch)
        if products is not None:
            torch.mv(S, v[start:stop], out=products[start // chunk])
        return S

    if J.dtype == torch.float64:
        if d is None:
            G = J @ J.T
        else:
            G = torch.zeros(m, m, dtype=torch.float64, device=J.device)
            for start in range(0, n, chunk):
                S = scaled(start, min(start + chunk, n))
                G.addmm_(S, S.T)
    else:
        block = gram_block(m)
        blocks = n // block
        full = blocks * block
        G = None
        if blocks and m > EIGH_MAX_SIZE:  # large m: one block's m x m product at a time (see gram_partials_shape)
            G = _accumulated_gram(J, d, block, blocks, workspace, chunk, scaled)
        elif blocks:
            if workspace is None or tuple(workspace.shape) != (blocks, m, m):
                workspace = torch.empty(blocks, m, m, dtype=J.dtype, device=J.device)
            if d is None:  # the (blocks, m, block) column blocks of J and their transposes: strided views
                row, column = J.stride()
                Jb = J.as_strided((blocks, m, block), (block * column, row, column))
                JbT = J.as_strided((blocks, block, m), (block * column, column, row))
                partial = torch.bmm(Jb, JbT, out=workspace)
            else:
                for start in range(0, full, chunk):
                    stop = min(start + chunk, full)
                    S = scaled(start, stop).view(m, -1, block).transpose(0, 1)
                    torch.bmm(S, S.transpose(1, 2), out=workspace[start // block: stop // block])
                partial = workspace
            G = partial.sum(0, dtype=torch.float64)
        if full < n:
            rest = J[:, full:] if d is None else _scaled_columns(J, d, full, n, scratch)
            if products is not None:
                torch.mv(rest, v[full:], out=products[-1])
            tail = rest @ rest.T  # (added to G in float64 below)
        if G is None and tail is None:
            G = torch.zeros(m, m, dtype=torch.float64, device=J.device)
    Jv = None
    if products is not None:
        Jv = products.sum(0, dtype=torch.float64)
    G = _symmetrized_sum(G, tail)
    if d is None and v is not None:
        Jv = matvec(J, v)
    return G, Jv


def _accumulated_gram(J: Tensor, d: Tensor | None, block: int, blocks: int, workspace: Tensor | None, chunk: int,
                      scaled: Callable[[int, int], Tensor]) -> Tensor:
    """The float64 sum over the first ``blocks`` column blocks of their float32 products J_b D_b^2 J_b^T, one
    (m, m) product at a time in ``workspace[0]`` (shape (1, m, m); allocated if None) and added to G in
    float64: the same products and float64 sum as the (blocks, m, m) partials of :func:`scaled_gram`, whose
    bytes (blocks x m^2) would exceed a fraction of J's at large m. ``scaled(start, stop)`` returns the
    scaled columns (with ``d``; chunks of ``chunk`` columns, whole blocks)."""
    m = J.shape[0]
    if workspace is None or tuple(workspace.shape) != (1, m, m):
        workspace = torch.empty(1, m, m, dtype=J.dtype, device=J.device)
    product = workspace[0]
    G = torch.zeros(m, m, dtype=torch.float64, device=J.device)
    full = blocks * block
    step = block if d is None else chunk
    host = host_gram.takes(J)  # SciPy's BLAS, as the factor of this m (host_gram: why)
    for start in range(0, full, step):
        stop = min(start + step, full)
        columns = J[:, start:stop] if d is None else scaled(start, stop)
        for offset in range(0, stop - start, block):
            piece = columns[:, offset:offset + block]
            if host:
                host_gram.add_block_product_(G, piece, product)
            else:
                G.add_(torch.mm(piece, piece.T, out=product))
    return G


def _symmetrized_sum(G: Tensor | None, tail: Tensor | None) -> Tensor:
    """0.5 (S + S^T) for S = G + tail in float64 (G float64, tail in J's dtype, converted exactly; one
    may be None)."""
    S = tail.to(torch.float64) if G is None else G if tail is None else G.add_(tail)
    return symmetrize_(S)


def exact_gram(J: Tensor, workspace: tuple[Tensor, Tensor] | None = None, d: Tensor | None = None) -> Tensor:
    """G = J D^2 J^T (D = diag(d), the identity when ``d`` is None) from float64 products (exact to
    float64 round-off), converting J (and d) chunk by chunk into ``workspace`` = (float64 (m, chunk),
    float64 (chunk,)) so that no float64 copy of all of J is made. The chunks' products: SciPy's ``dsyrk``
    for a large m on the CPU (:class:`~lit_constrained.optim.host_gram.SymmetricAccumulator`), else torch's
    (:class:`BandAccumulator`); both take the lower triangle only."""
    if J.dtype == torch.float64:
        return scaled_gram(J, d)[0]
    m, n = J.shape
    if workspace is None:
        chunk = min(n, chunk_columns(m))
        workspace = (torch.empty(m, chunk, dtype=torch.float64, device=J.device),
                     torch.empty(chunk, dtype=torch.float64, device=J.device))
    rows, vector = workspace
    chunk = rows.shape[1]
    if m > EIGH_MAX_SIZE and host_gram.takes(J, d):  # SciPy's dsyrk, as the factor of this m (host_gram)
        accumulator: host_gram.SymmetricAccumulator | BandAccumulator = host_gram.SymmetricAccumulator(m)
    else:
        accumulator = BandAccumulator(m, J.device)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        block = rows[:, : stop - start]
        block.copy_(J[:, start:stop])
        if d is not None:
            block.mul_(vector[: stop - start].copy_(d[start:stop]))
        accumulator.add_(block)
    return accumulator.result()


class BandAccumulator:
    """:math:`C = \\sum_k B_k B_k^T` in float64 by torch (any device), for float64 chunks :math:`B_k` (m x k):
    for m >= 256 only the products of the band blocks on and below the diagonal (``_row_bands``), the
    upper triangle mirrored."""

    def __init__(self, m: int, device: torch.device) -> None:
        self._sum = torch.zeros(m, m, dtype=torch.float64, device=device)
        self._bands = _row_bands(m)

    def add_(self, chunk: Tensor) -> None:
        if len(self._bands) == 1:
            self._sum.addmm_(chunk, chunk.T)
            return
        for i, (top, bottom) in enumerate(self._bands):  # the blocks on and below the diagonal only
            for left, right in self._bands[: i + 1]:
                self._sum[top:bottom, left:right].addmm_(chunk[top:bottom], chunk[left:right].T)

    def result(self) -> Tensor:
        """C (float64, symmetric)."""
        if len(self._bands) == 1:
            return symmetrize_(self._sum)
        return mirror_lower_(self._sum)


EXACT_GRAM_BAND_ROWS = 128
"""Rows per band of :class:`BandAccumulator` (torch's exact Gram, off the CPU) for a large m: its m^2 n
float64 products are taken only for the blocks on and below the diagonal of G (p(p + 1)/2 of p^2 band pairs,
p = min(8, m // 128)), the upper triangle mirrored: ~30 % less time at m = 1 000 (docs/optim_measurements.md;
measured on the CPU, before its exact Gram moved to SciPy's dsyrk)."""


def _row_bands(m: int) -> list[tuple[int, int]]:
    """The row bands (start, stop) of :func:`exact_gram`: one band (the whole G) for m < 256."""
    bands = max(1, min(8, m // EXACT_GRAM_BAND_ROWS))
    return [(i * m // bands, (i + 1) * m // bands) for i in range(bands)]


def gram_error(n: int, dtype: torch.dtype, m: int = 1) -> float:
    r"""An estimate of the relative error :math:`\|G_{computed} - J J^T\| / \|J J^T\|` of :func:`gram`.

    Float32 blocks: each block's result carries :math:`\sim\epsilon_{32}` relative error, independent
    across the :math:`n/B` blocks, hence :math:`\epsilon_{32}\sqrt{B/n}` (measured: 2.6e-9 at n = 1e5 and
    7.6e-10 at n = 1e6 with B = 512, against the estimate's 4.3e-9 and 1.4e-9)."""
    eps = torch.finfo(dtype).eps
    if dtype == torch.float64:
        return eps
    return eps * math.sqrt(min(gram_block(m), max(n, 1)) / max(n, 1))


def gram_partials_shape(shape: tuple[int, int]) -> tuple[int, int, int]:
    """The shape of :func:`gram`'s workspace for a J of ``shape``: the blocks' (m, m) partials, or for
    m > ``EIGH_MAX_SIZE`` a single one (accumulated block by block: at m = 1 000 all partials would take
    half of J's bytes)."""
    m, n = shape
    return (1 if m > EIGH_MAX_SIZE else n // gram_block(m), m, m)


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
        chunk = min(n, chunk_columns(m))
        workspace = (torch.empty(m, chunk, dtype=torch.float64, device=J.device),
                     torch.empty(chunk, dtype=torch.float64, device=J.device))
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


def residual_error(factor: "GramFactor", n: int, dtype: torch.dtype) -> Tensor:
    r"""An estimate of the relative error of a residual from :func:`blocked_matvec`,
    :math:`\epsilon\sqrt{B/n}\,\kappa(J)` with :math:`\kappa(J) = \sqrt{\kappa(G)}` (the normal step's
    norm is at most :math:`\kappa(J)\|s c\|/\sigma_{\max}`); 0-dim float64. Measured 5-15x below this
    at n = 1e5-1e6, cond(J) = 180-1e3."""
    eps = torch.finfo(dtype).eps if dtype != torch.float64 else 0.0
    return eps * math.sqrt(min(RESIDUAL_BLOCK, max(n, 1)) / max(n, 1)) * factor.condition.sqrt()


def exact_residual_needed(factor: "GramFactor", n: int, dtype: torch.dtype) -> Tensor:
    """Whether the refinement residuals must come from :func:`exact_matvec` (0-dim bool): when the
    blocked residual's estimated error (:func:`residual_error`) exceeds ``TARGET_ERROR``."""
    return residual_error(factor, n, dtype) > TARGET_ERROR


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


# ---------------------------------------------------------------------------- the refinement plan
@dataclass(frozen=True)
class RefinementPlan:
    """How a step's projections are refined (decided from cond(G) once per step).

    Attributes:
        steps: refinement steps of :func:`refine_`.
        exact_residual: their residuals from float64 products (:func:`exact_matvec`) rather than the
            blocked float32 ones (:func:`exact_residual_needed`).
        exact_gram: the blocked Gram is too inaccurate for the conditioning of J: form the Gram from
            float64 products (:func:`exact_gram`) and refine :func:`exact_refinements` times instead.
    """

    steps: int
    exact_residual: bool
    exact_gram: bool = False

    @classmethod
    def decode(cls, counts: tuple[float, float], m: int) -> "RefinementPlan":
        """The plan from :func:`refinement_counts` read on the host."""
        steps, residual = int(counts[0]), bool(counts[1])
        if steps > max_refinements(m):
            return cls(0, True, exact_gram=True)
        return cls(steps, residual)


def refinement_counts(factor: GramFactor, n: int, dtype: torch.dtype) -> Tensor:
    r"""The refinement decision as a float64 tensor (2,), read with one host sync by the caller
    (:meth:`RefinementPlan.decode`): [k, exact residual], k the fewest refinement steps with the Gram of
    :func:`gram` that reach ``TARGET_ERROR`` (``max_refinements(m) + 1`` when none does: the exact Gram).

    float64 data: one step when cond(G) > ``REFINE_ABOVE_CONDITION``, else none, never an exact residual.
    float32 data: each step multiplies the error by :math:`r = \max(\kappa(G)\epsilon_G,
    \epsilon\sqrt{\kappa(G)})` (the Gram's error; the cancellation in :math:`J^T z`), so k steps reach
    ``TARGET_ERROR`` iff :math:`r^{k+1} \le` ``TARGET_ERROR``; the residual is exact where the blocked one's
    estimated error (:func:`residual_error`) exceeds ``TARGET_ERROR``. Both are comparisons of cond(G)
    with thresholds computed once per shape on the host (one comparison and one product on the device)."""
    thresholds, weights = _plan_tensors(n, dtype, factor.size, factor.condition.device)
    return (factor.condition > thresholds).to(torch.float64) @ weights


@functools.lru_cache(maxsize=64)
def _plan_thresholds(n: int, dtype: torch.dtype, m: int) -> tuple[float, ...]:
    """Thresholds on cond(G): k + 1 of the first ``max_refinements(m) + 1`` exceeded means k + 1 steps
    needed; the last one is the exact residual's."""
    most = max_refinements(m)
    if dtype == torch.float64:
        return (REFINE_ABOVE_CONDITION,) + (math.inf,) * (most + 1)
    gram_eps, eps = gram_error(n, dtype, m), torch.finfo(dtype).eps
    # rate(kappa) = max(kappa gram_eps, eps sqrt(kappa)) > t  <=>  kappa > min(t / gram_eps, (t / eps)^2)
    steps = [min(t / gram_eps, (t / eps) ** 2) for t in (TARGET_ERROR ** (1.0 / (k + 1)) for k in range(most + 1))]
    # residual_error(kappa) = eps sqrt(B / n) sqrt(kappa) > TARGET_ERROR
    residual = (TARGET_ERROR / (eps * math.sqrt(min(RESIDUAL_BLOCK, max(n, 1)) / max(n, 1)))) ** 2
    return tuple(steps) + (residual,)


@functools.lru_cache(maxsize=64)
def _plan_tensors(n: int, dtype: torch.dtype, m: int, device: torch.device) -> tuple[Tensor, Tensor]:
    thresholds = _plan_thresholds(n, dtype, m)
    weights = torch.zeros(len(thresholds), 2, dtype=torch.float64)
    weights[:-1, 0] = 1.0  # k = the number of step thresholds exceeded
    weights[-1, 1] = 1.0  # the exact residual's flag
    return torch.tensor(thresholds, dtype=torch.float64, device=device), weights.to(device)


def exact_refinements(factor: GramFactor, dtype: torch.dtype) -> int:
    r"""Refinement steps with the exact Gram (a host-side decision, on that rare path only): the fewest
    k with :math:`r^{k+1} \le` ``TARGET_ERROR`` for :math:`r = \max(\kappa\epsilon_{64}, \epsilon\sqrt\kappa)`,
    at least one (the cancellation in :math:`J^T z`), at most 4."""
    kappa = float(factor.condition)
    rate = max(kappa * torch.finfo(torch.float64).eps, torch.finfo(dtype).eps * math.sqrt(kappa))
    if rate >= 1.0:
        return 4
    steps = math.ceil(math.log(TARGET_ERROR) / math.log(rate)) - 1 if rate > 0 else 0
    return min(max(steps, 1), 4)


# ---------------------------------------------------------------------------- the merged step
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


def refine_(
    J: Tensor,
    factor: GramFactor,
    out: Tensor,
    sc: Tensor,
    refinements: int,
    workspace: tuple[Tensor, Tensor] | None = None,
    scaling: Scaling | None = None,
    exact: bool = True,
    scratch: Tensor | None = None,
) -> Tensor:
    r"""``refinements`` steps of iterative refinement of :math:`J\,out = -U_r U_r^T (sc)` (of
    :math:`J D\,out` with ``scaling``) in place: residual from :func:`exact_matvec` (``exact``) or
    :func:`blocked_matvec` (``SCALED_RESIDUAL_BLOCK`` columns with ``scaling``), correction
    :math:`J^T G^+ r` (see :func:`merged_step`).

    With exact residuals (an ill-conditioned J) the correction is formed apart (in ``scratch``, an n-vector
    in J's dtype, allocated when None; with ``scaling`` in its scratch), from split multipliers
    (:func:`_rmatvec_into`), and then added to ``out`` in one rounding. Accumulated into ``out`` inside the
    product (``out.addmv_(J.T, z)``: m row updates, each rounded at the magnitude of ``out``, far above the
    correction's) the refinement stalled at 1e-6-1e-5 relative error at n = 1e5, m = 10, cond(J) = 1e3
    (float32), against the ~3e-8 of rounding the exact step to float32 that it reaches this way. With
    blocked residuals (a well-conditioned J) the product accumulates into ``out`` (measured no less
    accurate there, and two n-vector passes cheaper)."""
    if refinements:
        target = -factor.range_part(sc)
        if exact:
            product = functools.partial(exact_matvec, workspace=workspace)
        else:
            block = RESIDUAL_BLOCK if scaling is None else SCALED_RESIDUAL_BLOCK
            product = functools.partial(blocked_matvec, block=block)
        if exact and scaling is None and scratch is None:
            scratch = torch.empty_like(out)
        for _ in range(refinements):
            if scaling is None:
                Jx = product(J, out)
            else:
                d, scaled = scaling
                Jx = product(J, torch.mul(d, out, out=scaled))
            z = factor.solve(target - Jx)
            add_rmatvec_(out, J, z, scaling=scaling, split=exact, scratch=scratch)
    return out


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


# ---------------------------------------------------------------------------- a factorization object
@dataclass
class NullSpace:
    """A factorization of J that applies the null-space projector and the pseudo-inverse.

    Attributes:
        jacobian: J (any float dtype), shape (m, n).
        factor: the :class:`GramFactor` of J J^T.
        refine: the number of refinement steps the projections apply (from :class:`RefinementPlan`).
        exact_residual: whether their residuals need float64 products (:func:`exact_residual_needed`).
    """

    jacobian: Tensor
    factor: GramFactor
    refine: int = 0
    exact_residual: bool = True

    @classmethod
    def from_jacobian(cls, jacobian: Tensor, rcond: float = DEFAULT_RCOND) -> "NullSpace":
        """Factorize J (host-side refinement decision: one sync; the optimizers decide in their step). J is
        detached: the factorization (a rank cutoff) carries no autograd graph."""
        jacobian = jacobian.detach()
        m, n = jacobian.shape
        if m == 0:
            return cls(jacobian, GramFactor.empty(jacobian.device), 0)
        factor = GramFactor.from_gram(gram(jacobian), rcond)
        plan = RefinementPlan.decode(tuple(refinement_counts(factor, n, jacobian.dtype).tolist()), m)
        if plan.exact_gram:
            factor = GramFactor.from_gram(exact_gram(jacobian), rcond)
            return cls(jacobian, factor, exact_refinements(factor, jacobian.dtype), True)
        return cls(jacobian, factor, plan.steps, plan.exact_residual)

    @property
    def rank(self) -> int:
        return int(self.factor.rank)

    @property
    def smallest_singular_value(self) -> float:
        return float(self.factor.smallest_singular_value)

    def solve_gram(self, b: Tensor) -> Tensor:
        """G^+ b for b of shape (m,) or (m, k)."""
        return self.factor.solve(b)

    def project(self, w: Tensor) -> Tensor:
        """P w (a new tensor in J's dtype)."""
        if self.jacobian.shape[0] == 0:
            return w.clone()
        sc = torch.zeros(self.jacobian.shape[0], dtype=torch.float64, device=w.device)
        out = torch.empty_like(w, dtype=self.jacobian.dtype)
        return merged_step(self.jacobian, self.factor, w.to(self.jacobian.dtype), 1.0, sc, self.refine, out,
                           exact=self.exact_residual)

    def pseudo_solve(self, c: Tensor) -> Tensor:
        """J^+ c: the minimum-norm least-squares x of J x = c."""
        J = self.jacobian
        out = torch.empty(J.shape[1], dtype=J.dtype, device=J.device)
        if J.shape[0] == 0:
            return out.zero_()
        return merged_step(J, self.factor, None, 0.0, -c.to(torch.float64), self.refine, out,
                           exact=self.exact_residual)
