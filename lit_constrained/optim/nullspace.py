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
:math:`\sim\epsilon_{32}\,\kappa(J)`). :func:`refinement_plan` picks the number of steps, or the exact
float64 Gram when the blocked one is too inaccurate for the conditioning of J. The residual is what
limits the refined accuracy: :func:`blocked_matvec` (float32 products over ``RESIDUAL_BLOCK`` columns
summed in float64, the cost of one float32 pass) is accurate to about :math:`\epsilon_{32}
\sqrt{B/n}\,\kappa(J)` relative to :math:`\|s c\|`, and :func:`exact_matvec` (float64 products, ~3-6
float32 passes' time: the conversion of J dominates) to the float32 rounding of :math:`\delta` itself;
:func:`exact_residual_needed` picks the exact one only where the blocked one cannot reach
``TARGET_ERROR`` (and always on the exact-Gram path).

**The host path (CPU tensors).** The m x m algebra is a few dozen tiny operations per step; as torch ops
each costs a dispatch (~3-10 us), together about one Adam step at n = 1e5. When the tensors are on the
CPU, :meth:`GramFactor.from_gram` with ``host=True`` also keeps NumPy views of its data
(:class:`HostFactor`), and :func:`merged_step` / :func:`refine_` given ``sc`` as a NumPy array do the
m x m work in NumPy (the same float64 formulas; equal to the torch path to round-off). On a GPU the torch
path stays, free of host syncs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .pivoted_cholesky import HostCholesky

DEFAULT_RCOND = 1e-7
"""Relative cutoff on the singular values of J: a float32 Jacobian carries ~1e-7 relative noise.
(The float64 Gram matrix resolves singular-value ratios down to ~1e-8: a smaller rcond is not meaningful.)"""

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
||J d + c|| / ||c|| was at most 9.2e-7 with 256-column blocks, 6.3e-7 with 128 and 4.5e-7 with 64;
a 64-column residual costs ~1.25x a 256-column one (7.3 against 5.9 ms at n = 1e6, m = 10)."""

TARGET_ERROR = 1e-6
"""Refine until the estimated relative error of J delta = -s c is below this (float32 data; about the
rounding error of a float32 step itself at cond(J) = 1e3)."""

EIGH_MAX_SIZE = 64
"""The largest m whose Gram matrix the host path factors by ``eigh`` (below it the m x m algebra costs
microseconds either way); a larger one is factored by a pivoted Cholesky factorization
(:mod:`~lit_constrained.optim.pivoted_cholesky`; measured on one AMD EPYC core: eigh 0.6 / 77 / 2 570
ms at m = 100 / 1 000 / 3 000 against 0.03 / 6 / 140 ms)."""

MAX_REFINEMENTS = 2
"""Beyond this many refinement steps with the blocked Gram, the exact (float64-product) Gram is used (m <=
``EIGH_MAX_SIZE``; see :func:`max_refinements`)."""

LARGE_MAX_REFINEMENTS = 8
""":func:`max_refinements` for m > ``EIGH_MAX_SIZE``: there the exact Gram's m^2 n float64 products cost far
more than a refinement step's two or three passes over J (3.3 s against ~10 ms a pass at m = 1 000,
n = 8 964 on one AMD EPYC core), so more steps with the blocked Gram come first."""

RESIDUAL_FLAG = 16
"""The refinement code's flag for float64-product residuals: code = plan + 2 + RESIDUAL_FLAG * exact_residual,
with plan + 2 in [1, LARGE_MAX_REFINEMENTS + 2] < RESIDUAL_FLAG (asserted below)."""
assert LARGE_MAX_REFINEMENTS + 2 < RESIDUAL_FLAG and MAX_REFINEMENTS <= LARGE_MAX_REFINEMENTS


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
    whole blocks) the chunked Gram measured 1.08-1.25x the time of forming J D and its Gram at m = 50,
    n = 1e6 (cache-set conflicts between the rows), 0.88-0.91x with the pad (m = 10: 0.62-0.74x either
    way, chunks of 8k-64k columns; 1.7x with 2k)."""
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
    and, when ``v`` is given (and ``d``), J D v in float64 from the same pass (else None).

    With ``d``, J D is never formed in full: ``scaled_chunk_columns(m, n, J.dtype)`` columns at a time
    are scaled into ``scratch`` (shape ``scaled_scratch_shape(m, n, J.dtype)``, J's dtype; allocated if
    None), small enough to stay in cache, and their block products are taken there. For float32 J these
    are the same products and the same float64 sum as ``gram(J * d)`` (tested equal); the traffic is one
    read of J instead of a read of J, a write of J D and a read of it. J D v is taken from the cached
    chunks too (a product in J's dtype per chunk, the chunks summed in float64): no pass of its own."""
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
        if blocks:
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
    return _symmetrized_sum(G, tail), Jv


def _symmetrized_sum(G: Tensor | None, tail: Tensor | None) -> Tensor:
    """0.5 (S + S^T) for S = G + tail in float64 (G float64, tail in J's dtype, converted exactly; one
    may be None). CPU tensors outside autograd: the same arithmetic in NumPy (a dispatch per op saved)."""
    parts = [part for part in (G, tail) if part is not None]
    if parts[0].device.type == "cpu" and not any(part.requires_grad for part in parts):
        S = G.numpy() if G is not None else tail.numpy().astype(np.float64)
        if G is not None and tail is not None:
            S = S + tail.numpy()  # (float32 entries promote to float64 exactly, as .to(float64) does)
        return torch.from_numpy(0.5 * (S + S.T))
    S = G if tail is None else tail.to(torch.float64) if G is None else G + tail.to(torch.float64)
    return 0.5 * (S + S.T)


def exact_gram(J: Tensor, workspace: tuple[Tensor, Tensor] | None = None, d: Tensor | None = None) -> Tensor:
    """G = J D^2 J^T (D = diag(d), the identity when ``d`` is None) from float64 products (exact to
    float64 round-off), converting J (and d) chunk by chunk into ``workspace`` = (float64 (m, chunk),
    float64 (chunk,)) so that no float64 copy of all of J is made."""
    if J.dtype == torch.float64:
        return scaled_gram(J, d)[0]
    m, n = J.shape
    if workspace is None:
        chunk = min(n, chunk_columns(m))
        workspace = (torch.empty(m, chunk, dtype=torch.float64, device=J.device),
                     torch.empty(chunk, dtype=torch.float64, device=J.device))
    rows, vector = workspace
    chunk = rows.shape[1]
    G = torch.zeros(m, m, dtype=torch.float64, device=J.device)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        block = rows[:, : stop - start]
        block.copy_(J[:, start:stop])
        if d is not None:
            block.mul_(vector[: stop - start].copy_(d[start:stop]))
        G.addmm_(block, block.T)
    return 0.5 * (G + G.T)


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
    """The shape of :func:`gram`'s workspace for a J of ``shape``."""
    m, n = shape
    return (n // gram_block(m), m, m)


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
    chunks of ``chunk_columns(m)`` columns into ``workspace`` = (float64 (m, chunk), float64 (chunk,))."""
    if J.dtype == torch.float64 and v.dtype == torch.float64:
        return J @ v
    m, n = J.shape
    if workspace is None:
        chunk = min(n, chunk_columns(m))
        workspace = (torch.empty(m, chunk, dtype=torch.float64, device=J.device),
                     torch.empty(chunk, dtype=torch.float64, device=J.device))
    J64, v64 = workspace
    chunk = J64.shape[1]
    out = torch.zeros(m, dtype=torch.float64, device=J.device)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        a, b = J64[:, : stop - start], v64[: stop - start]
        a.copy_(J[:, start:stop])
        b.copy_(v[start:stop])
        out.addmv_(a, b)
    return out


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
        Jb = J[:, :full].view(m, blocks, block).transpose(0, 1)
        partial = torch.bmm(Jb, v[:full].view(blocks, block, 1))
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


# ---------------------------------------------------------------------------- the m x m algebra
@dataclass
class GramFactor:
    """The pseudo-inverse of G = J J^T by an eigendecomposition, with a relative cutoff as a mask.

    Attributes (all tensors, float64 unless said):
        basis: U, all eigenvectors of G, shape (m, m).
        inverse: keep_i / lambda_i, 0 for the dropped eigenvalues, shape (m,).
        keep: the kept eigenvalues (bool), shape (m,).
        kept_min: the smallest kept eigenvalue (0-dim; lambda_max when nothing is kept).
        condition: lambda_max / lambda_min of the kept eigenvalues (0-dim; 1 when r = 0).
    ``rank`` and ``smallest_singular_value`` (diagnostics) are computed when read.
    """

    basis: Tensor | None
    inverse: Tensor | None
    keep: Tensor | None
    kept_min: Tensor
    condition: Tensor
    host: "HostFactor | HostCholesky | None" = None
    """NumPy views of the same data (``from_gram(..., host=True)``, CPU tensors only), for the host path
    (:class:`PivotedGramFactor`: its pivoted Cholesky factorization instead)."""

    @classmethod
    def from_gram(cls, G: Tensor, rcond: float = DEFAULT_RCOND, host: bool = False) -> "GramFactor":
        """Factor G (float64, symmetric). ``host=True`` (G on the CPU): the cutoff and its scalars are
        computed in NumPy, and :attr:`host` is set; the tensors are views of the same arrays. On the
        host, a G larger than ``EIGH_MAX_SIZE`` is factored by a pivoted Cholesky factorization instead
        (:meth:`from_pivoted_cholesky`)."""
        if host and G.shape[0] > EIGH_MAX_SIZE:
            return cls.from_pivoted_cholesky(G, rcond)
        eigenvalues, basis = torch.linalg.eigh(G)
        if host:
            return cls._from_host_eigh(eigenvalues, basis, rcond)
        largest = eigenvalues[-1]
        # (when largest <= 0 nothing is kept: every eigenvalue is <= largest <= 0 = the cutoff)
        keep = eigenvalues > (rcond**2) * largest.clamp_min(0.0)
        inverse = torch.where(keep, eigenvalues.reciprocal(), 0.0)
        kept_min = torch.where(keep, eigenvalues, largest).min()
        # nothing kept: kept_min = largest, so the ratio is 1, or 0/0 for G = 0
        condition = (largest / kept_min).nan_to_num(nan=1.0)
        return cls(basis, inverse, keep, kept_min, condition)

    @classmethod
    def _from_host_eigh(cls, eigenvalues: Tensor, basis: Tensor, rcond: float) -> "GramFactor":
        """``from_gram``'s cutoff in NumPy and Python floats (the same IEEE operations, hence the same
        values). The eigenvalues ascend, so the kept ones are the last r and the smallest kept is the r-th
        from the end."""
        values = eigenvalues.numpy()
        largest = float(values[-1])
        keep = values > (rcond**2) * max(largest, 0.0)
        inverse = np.divide(1.0, values, out=np.zeros(values.shape[0]), where=keep)
        rank = int(np.count_nonzero(keep))
        kept_min = float(values[-rank]) if rank else largest
        # nothing kept: kept_min = largest, so the ratio is 1, or 0/0 for G = 0 (1 as well)
        condition = largest / kept_min if kept_min != 0.0 else 1.0
        host = HostFactor(basis.numpy(), inverse, keep.astype(np.float64), condition)
        return cls(basis, torch.from_numpy(inverse), torch.from_numpy(keep), _host_scalar(kept_min),
                   _host_scalar(condition), host)

    @classmethod
    def from_pivoted_cholesky(cls, G: Tensor, rcond: float = DEFAULT_RCOND) -> "GramFactor":
        """The host factor of a CPU G by LAPACK's rank-revealing pivoted Cholesky factorization
        (:class:`~lit_constrained.optim.pivoted_cholesky.HostCholesky`: the same cutoff on the singular
        values of J, ~10x cheaper than ``eigh`` at m = 1 000 and ~20x at 3 000). It has no eigenvector
        basis: the tensor methods run the host ones."""
        chol = HostCholesky.factor(G.numpy(), rcond)
        return PivotedGramFactor(None, None, None, _host_scalar(chol.kept_min), _host_scalar(chol.condition), chol)

    @classmethod
    def empty(cls, device: torch.device | None = None) -> "GramFactor":
        z = torch.zeros(0, dtype=torch.float64, device=device)
        scalar = torch.zeros((), dtype=torch.float64, device=device)
        return cls(z.reshape(0, 0), z, z.bool(), scalar, scalar + 1.0)

    @property
    def size(self) -> int:
        """m, the order of G."""
        return self.basis.shape[0]

    @property
    def rank(self) -> Tensor:
        """The numerical rank r of J (0-dim, int64)."""
        return self.keep.sum()

    @property
    def smallest_singular_value(self) -> Tensor:
        """The smallest kept singular value of J (0-dim; 0 when r = 0)."""
        return self.kept_min.clamp_min(0.0).sqrt()

    def solve(self, b: Tensor) -> Tensor:
        """G^+ b for b of shape (m,) or (m, k)."""
        U = self.basis
        weights = self.inverse if b.dim() == 1 else self.inverse[:, None]
        return U @ (weights * (U.T @ b))

    def range_part(self, c: Tensor) -> Tensor:
        """U_r U_r^T c: the part of c that J can reach (c itself when J has full row rank)."""
        U = self.basis
        weights = self.keep.to(c.dtype) if c.dim() == 1 else self.keep.to(c.dtype)[:, None]
        return U @ (weights * (U.T @ c))

    def pinv_norm_sq(self, c: Tensor) -> Tensor:
        """||J^+ c||^2 = c^T G^+ c (no pass over J)."""
        return (self.inverse * (self.basis.T @ c) ** 2).sum()


@dataclass
class PivotedGramFactor(GramFactor):
    """A :class:`GramFactor` by a pivoted Cholesky factorization on the host (``from_pivoted_cholesky``):
    no eigenvector basis (basis, inverse and keep are None); the tensor methods run the host ones."""

    host: HostCholesky | None = None

    @property
    def size(self) -> int:
        return self.host.order.shape[0]

    @property
    def rank(self) -> Tensor:
        return torch.tensor(self.host.rank)

    def solve(self, b: Tensor) -> Tensor:
        return torch.from_numpy(self.host.solve(b.numpy()))

    def range_part(self, c: Tensor) -> Tensor:
        return torch.from_numpy(self.host.range_part(c.numpy()))

    def pinv_norm_sq(self, c: Tensor) -> Tensor:
        return _host_scalar(self.host.pinv_norm_sq(c.numpy()))


_QUIET = np.errstate(over="ignore", invalid="ignore", divide="ignore")
"""Host-path arithmetic overflows to inf/NaN silently, as torch's does (a diverging run is reported by
the step's finiteness checks, not by NumPy warnings)."""


@dataclass
class HostFactor:
    """A :class:`GramFactor`'s data as NumPy arrays (float64), for the host path on CPU tensors:
    the same formulas as the tensor methods, without a torch dispatch per operation."""

    basis: np.ndarray
    inverse: np.ndarray
    keep: np.ndarray
    """the kept eigenvalues as 1.0 / 0.0"""
    condition: float

    @property
    def rank(self) -> int:
        """The numerical rank r (the number of kept eigenvalues)."""
        return int(np.count_nonzero(self.keep))

    @_QUIET
    def solve(self, b: np.ndarray) -> np.ndarray:
        """G^+ b for b of shape (m,) or (m, k)."""
        U = self.basis
        weights = self.inverse if b.ndim == 1 else self.inverse[:, None]
        return U @ (weights * (U.T @ b))

    @_QUIET
    def range_part(self, c: np.ndarray) -> np.ndarray:
        """U_r U_r^T c."""
        U = self.basis
        weights = self.keep if c.ndim == 1 else self.keep[:, None]
        return U @ (weights * (U.T @ c))

    @_QUIET
    def pinv_norm_sq(self, c: np.ndarray) -> float:
        """c^T G^+ c."""
        return float((self.inverse * (self.basis.T @ c) ** 2).sum())


def _host_scalar(value: float) -> Tensor:
    """A 0-dim float64 CPU tensor (from a NumPy scalar: cheaper than ``torch.tensor``)."""
    return torch.from_numpy(np.asarray(value, dtype=np.float64))


def host_norm(x: np.ndarray) -> float:
    """The 2-norm of a float64 vector, sqrt(x . x) (``np.linalg.norm``'s formula without its overhead)."""
    return math.sqrt(float(x @ x))


_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


def to_device(x: np.ndarray, like: Tensor) -> Tensor:
    """A host float64 array as a tensor of ``like``'s dtype and device (rounded as ``Tensor.to`` rounds)."""
    target = _NUMPY_DTYPES.get(like.dtype)
    if target is None or like.device.type != "cpu":
        return torch.from_numpy(np.ascontiguousarray(x)).to(device=like.device, dtype=like.dtype)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=target))


def host_matvec(J: Tensor, v: Tensor, scaling: Scaling | None = None) -> np.ndarray:
    """:func:`matvec` as a host float64 array (CPU tensors)."""
    if scaling is not None:
        d, scratch = scaling
        v = torch.mul(d, v, out=scratch)
    return (J @ (v if v.dtype == J.dtype else v.to(J.dtype))).numpy().astype(np.float64)


def host_refinement_code(condition: float, n: int, dtype: torch.dtype, m: int) -> int:
    """:func:`refinement_code` from a host float cond(G): the same thresholds and weights."""
    thresholds, weights = _code_thresholds(n, dtype, m)
    return int(sum(weight for threshold, weight in zip(thresholds, weights) if condition > threshold))


def refinement_plan(factor: GramFactor, n: int, dtype: torch.dtype) -> Tensor:
    r"""The refinement to apply, as a 0-dim int64 tensor (read with one host sync by the caller):
    ``k >= 0`` refinement steps with the Gram of :func:`gram`, or ``-1``: recompute the Gram with
    :func:`exact_gram` first (then :func:`exact_refinements` steps).

    float64 data: one step when cond(G) > ``REFINE_ABOVE_CONDITION``, else none. float32 data: each step
    multiplies the error by :math:`r = \max(\kappa(G)\epsilon_G, \epsilon\sqrt{\kappa(G)})` (the Gram's
    error; the cancellation in :math:`J^T z`), so the fewest k with :math:`r^{k+1} \le`
    ``TARGET_ERROR``, if at most ``max_refinements(m)``."""
    kappa = factor.condition
    if dtype == torch.float64:
        return (kappa > REFINE_ABOVE_CONDITION).to(torch.int64)
    most = max_refinements(factor.size)
    rate = _contraction(kappa, gram_error(n, dtype, factor.size), torch.finfo(dtype).eps)
    thresholds = torch.tensor([TARGET_ERROR ** (1.0 / (k + 1)) for k in range(most + 1)],
                              dtype=rate.dtype, device=rate.device)
    steps = (rate > thresholds).sum()  # k steps reach TARGET_ERROR iff rate <= thresholds[k]
    return torch.where(steps > most, -torch.ones_like(steps), steps)


@functools.lru_cache(maxsize=64)
def _code_thresholds(n: int, dtype: torch.dtype, m: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(thresholds on cond(G), weights) of :func:`refinement_code` (host floats, cached per shape)."""
    most = max_refinements(m)
    if dtype == torch.float64:
        # one step above REFINE_ABOVE_CONDITION; never the exact Gram nor the exact residual (exact already)
        return (REFINE_ABOVE_CONDITION,) + (math.inf,) * (most + 1), (1.0,) + (0.0,) * (most + 1)
    gram_eps, eps = gram_error(n, dtype, m), torch.finfo(dtype).eps
    # rate(kappa) = max(kappa gram_eps, eps sqrt(kappa)) > t  <=>  kappa > min(t / gram_eps, (t / eps)^2)
    steps = [min(t / gram_eps, (t / eps) ** 2)
             for t in (TARGET_ERROR ** (1.0 / (k + 1)) for k in range(most + 1))]
    # residual_error(kappa) = eps sqrt(B / n) sqrt(kappa) > TARGET_ERROR
    residual = (TARGET_ERROR / (eps * math.sqrt(min(RESIDUAL_BLOCK, max(n, 1)) / max(n, 1)))) ** 2
    # plan = f_0 + ... + f_{K-1} - (K + 1) f_K (all K + 1 flags set: -1, the exact Gram); + RESIDUAL_FLAG f_residual
    weights = (1.0,) * most + (-(most + 1.0),) + (float(RESIDUAL_FLAG),)
    return tuple(steps) + (residual,), weights


def refinement_code(factor: GramFactor, n: int, dtype: torch.dtype) -> Tensor:
    """``refinement_plan + RESIDUAL_FLAG * exact_residual_needed`` (0-dim int64) from one comparison of cond(G)
    with thresholds computed on the host: three small ops instead of ~15 (the same decisions; tested)."""
    kappa = factor.condition
    thresholds, weights = _code_tensors(n, dtype, factor.size, kappa.device)
    return ((kappa > thresholds).to(kappa.dtype) @ weights).to(torch.int64)


@functools.lru_cache(maxsize=64)
def _code_tensors(n: int, dtype: torch.dtype, m: int, device: torch.device) -> tuple[Tensor, Tensor]:
    thresholds, weights = _code_thresholds(n, dtype, m)
    return (torch.tensor(thresholds, dtype=torch.float64, device=device),
            torch.tensor(weights, dtype=torch.float64, device=device))


def _contraction(kappa: Tensor | float, gram_eps: float, eps: float) -> Tensor | float:
    if isinstance(kappa, Tensor):
        return torch.maximum(kappa * gram_eps, eps * kappa.sqrt())
    return max(kappa * gram_eps, eps * math.sqrt(kappa))


def exact_refinements(factor: GramFactor, dtype: torch.dtype) -> int:
    r"""Refinement steps with the exact Gram (a host-side decision, on that rare path only): the fewest
    k with :math:`r^{k+1} \le` ``TARGET_ERROR`` for :math:`r = \max(\kappa\epsilon_{64}, \epsilon\sqrt\kappa)`,
    at least one (the cancellation in :math:`J^T z`), at most 4."""
    kappa = float(factor.condition)
    rate = _contraction(kappa, torch.finfo(torch.float64).eps, torch.finfo(dtype).eps)
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
) -> Tensor:
    r"""out = a P w - J^+ (s c), merged: :math:`out = a w - J^T z`, :math:`z = G^+(sc + a J w)`.

    Then :math:`J\,out = -U_r U_r^T (sc)` up to round-off, improved by ``refinements`` steps of iterative
    refinement (residuals from :func:`exact_matvec` with ``workspace``, or from :func:`blocked_matvec`
    when ``exact`` is False; :func:`exact_residual_needed` decides). ``w=None`` means w = 0 (the
    normal step alone); ``sc`` is :math:`s c` (float64; a NumPy array selects the host path, which needs
    ``factor.host`` and CPU tensors). Returns ``out`` (J's dtype), which may alias ``w``. ``scratch``: an
    n-vector in J's dtype for the refinement's corrections (:func:`refine_`; allocated there when None).

    ``scaling = (d, scratch)``: the same with the operator :math:`J D`, D = diag(d), in place of J
    (``factor`` then factors :math:`J D^2 J^T`, :func:`scaled_gram`); it is never formed: its
    products are :math:`J (d \odot v)` and :math:`d \odot (J^T z)`, through the n-vector ``scratch``.
    """
    host = factor.host if isinstance(sc, np.ndarray) else None
    if w is None:
        z = factor.solve(sc) if host is None else to_device(host.solve(sc), J)
        if scaling is None:
            out.zero_()
            add_rmatvec_(out, J, z, alpha=-1.0)
        else:  # -d (J^T z)
            d, scratch = scaling
            scratch.addmv_(J.T, z.to(J.dtype), beta=0.0, alpha=-1.0)
            torch.mul(scratch, d, out=out)
    else:
        if host is None:
            z = factor.solve(sc + a * matvec(J, w, scaling)).to(J.dtype)
        else:
            z = to_device(host.solve(sc + a * host_matvec(J, w, scaling)), J)
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
        host = factor.host if isinstance(sc, np.ndarray) else None
        target = -factor.range_part(sc) if host is None else -host.range_part(sc)
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
            z = factor.solve(target - Jx) if host is None else torch.from_numpy(host.solve(target - Jx.numpy()))
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
        refine: the number of refinement steps the projections apply (from :func:`refinement_plan`).
        exact_residual: whether their residuals need float64 products (:func:`exact_residual_needed`).
    """

    jacobian: Tensor
    factor: GramFactor
    refine: int = 0
    exact_residual: bool = True

    @classmethod
    def from_jacobian(cls, jacobian: Tensor, rcond: float = DEFAULT_RCOND) -> "NullSpace":
        """Factorize J (host-side refinement decision: one sync; the optimizers decide in their step)."""
        m, n = jacobian.shape
        if m == 0:
            return cls(jacobian, GramFactor.empty(jacobian.device), 0)
        factor = GramFactor.from_gram(gram(jacobian), rcond)
        plan = refinement_plan(factor, n, jacobian.dtype)
        exact = exact_residual_needed(factor, n, jacobian.dtype)
        steps, exact = (int(v) for v in torch.stack([plan, exact.to(plan.dtype)]).tolist())
        if steps < 0:
            factor = GramFactor.from_gram(exact_gram(jacobian), rcond)
            steps, exact = exact_refinements(factor, jacobian.dtype), 1
        return cls(jacobian, factor, steps, bool(exact))

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
