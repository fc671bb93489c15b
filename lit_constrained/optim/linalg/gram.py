r"""The Gram matrix :math:`G = J D^2 J^T` in float64 (D = diag(d), the identity when unscaled).

For float32 J: float32 products over column blocks of ``gram_block(m)`` columns, the blocks summed in
float64 (relative error ~ :math:`\epsilon_{32} \sqrt{B/n}`, :func:`gram_error`; one float32 GEMM over all n
would give ~:math:`\epsilon_{32}\sqrt n`); :func:`exact_gram` forms it from float64 products when J is too
ill-conditioned for that. A column-scaled operator :math:`J D` (Adam(con)'s :math:`J H^{-1/2}`) is never
formed: :func:`scaled_gram` scales a cache-sized chunk of columns at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from . import host_gram
from .gram_factor import EIGH_MAX_SIZE
from .products import chunk_columns, chunk_workspace, matvec
from .symmetric import mirror_lower_, symmetrize_

GRAM_BLOCK = 512
"""Columns per float32 product block of the Gram matrix (blocks are summed in float64), for m <= 16;
``gram_block(m)`` grows it for more constraints so that the (n / block, m, m) partial products stay
smaller than J."""


def gram_block(m: int) -> int:
    return GRAM_BLOCK if m <= 16 else GRAM_BLOCK * 4


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
    for a large m on the CPU (:class:`~lit_constrained.optim.linalg.host_gram.SymmetricAccumulator`), else torch's
    (:class:`BandAccumulator`); both take the lower triangle only."""
    if J.dtype == torch.float64:
        return scaled_gram(J, d)[0]
    m, n = J.shape
    if workspace is None:
        workspace = chunk_workspace(m, n, J.device)
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
