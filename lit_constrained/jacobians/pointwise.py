r"""The Jacobian of per-point residuals, point by point: linear in the number of imposed points.

A per-point residual :math:`r : (N, d) \to (N, k)` (row i depends only on point :math:`x_i`) imposed
at N points gives :math:`m = N k` constraints :math:`c_{ik} = r(x_i)_k`. Its Jacobian w.r.t. the
parameters :math:`\theta` is a stack of per-point Jacobians,

.. math::

    J = \begin{pmatrix} \partial_\theta r(\theta; x_1) \\ \vdots \\ \partial_\theta r(\theta; x_N)
    \end{pmatrix} \in \mathbb{R}^{N k \times n},

each the Jacobian of ONE small evaluation, so J costs O(N) evaluations and backward passes of one
point. The general autograd Jacobian (:func:`~lit_constrained.jacobians.batched.constraint_jacobian`)
instead runs one backward of the whole graph of c per row: O(m^2).

Two paths, chosen per residual and remembered (:class:`PointwiseJacobian`):

* ``"func"`` (fast): ``torch.func``: the residual evaluated on ONE point with functional parameters
  (``functional_call``), ``jacrev`` w.r.t. the parameters, ``vmap`` over the points. Residuals whose
  input derivatives are ``torch.func`` transforms (``jvp``, ``jacfwd``, ``hessian``, ...; the
  operators of :mod:`lit_constrained.physics`) run here, second order included.
* ``"autograd"`` (fallback): residuals that cannot run inside ``torch.func`` transforms (input
  derivatives by ``torch.autograd.grad``, custom ``autograd.Function`` s without a vmap rule) are
  evaluated on chunks of C points, each chunk its own small graph, and that chunk's C k rows come
  from one batched ``torch.autograd.grad`` (``is_grads_batched``) over the chunk's graph: O(m C)
  work, still linear in m, but C times the work of the ``"func"`` path per row.

A part of at most ``small_part_rows`` rows (4) takes the ``"autograd"`` path in one chunk under
``"auto"`` without trying ``"func"``: there that is the general Jacobian of a graph of a few points,
cheaper than the ``torch.func`` transforms' fixed cost per call (measured on the spring task, m = 3:
a 1.5x longer training step through ``"func"``). Above it ``"func"`` wins once the residual's
derivatives come from a jet (:mod:`lit_constrained.physics.jets`); measured on one Intel Xeon core, the
PINNacle 100 x 5 MLP in float64, a second-order PDE residual at 8 / 16 / 32 points: 7.6 / 8.6 / 12 ms
against 15 / 25 / 77 ms (a plain value residual: 2.3 / 2.7 / 4.1 against 1.7 / 2.9 / 17 ms).

A part may carry per-point data :math:`D` (a tensor or a dict of tensors, one row per point: the normals
of boundary points, a weight, a value): its residual is then :math:`r(X, D)`, row i depending on
:math:`x_i` and :math:`D_i` only, and both paths take the data's rows with the points' (``vmap`` maps
them along with the points; a chunk cuts them with its points).

Both fill J in chunks of points whose size follows a memory budget (:func:`chunk_points`), directly
into the output (no concatenation of pieces). Pure PyTorch: no Lightning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev, vmap

from .batched import _parameter_names, _row_range, constraint_jacobian
from .columns import block_sizes, numel_real, real_view

__all__ = ["PointwiseJacobian", "PointwisePath", "chunk_points", "pointwise_jacobian"]

PointwisePath = Literal["auto", "func", "autograd"]

DEFAULT_MEMORY_BUDGET = 64 * 2**20
"""The most bytes of workspace one chunk of points takes by default (besides J itself): 64 MiB."""

MIN_MEMORY_BUDGET = 16 * 2**20
"""The least the default budget gives (16 MiB): below it more chunks only add the transforms' fixed cost."""

JACOBIAN_BUDGET_RATIO = 2.0
"""The default budget's share of J's own bytes: chemistry at m = 300 (J 10.3 MiB) took all its points in one
chunk of ~3x J under a flat 64 MiB, the step's peak RSS above Adam(unc) 4.6x J; with 2x J (20.5 MiB, two
chunks) 3.95x, with 1.5x 3.6x but 3.9x at m = 1 000 (against 3.6x with its full 64 MiB, which 2x J keeps);
the Jacobian at m = 300 no slower with two chunks (8.0 against 10.0 ms at 16 MiB; docs/optim_measurements.md, "At scale")."""


def default_memory_budget(jacobian_bytes: int) -> int:
    """The default chunk budget for a J of ``jacobian_bytes``: ``JACOBIAN_BUDGET_RATIO`` x J, within
    [``MIN_MEMORY_BUDGET``, ``DEFAULT_MEMORY_BUDGET``]."""
    return int(min(DEFAULT_MEMORY_BUDGET, max(MIN_MEMORY_BUDGET, JACOBIAN_BUDGET_RATIO * jacobian_bytes)))

FALLBACK_MAX_CHUNK = 32
"""The largest chunk of the ``"autograd"`` path: its work per row grows with the chunk (O(m C))."""

SMALL_PART_ROWS = 4
"""Parts of at most this many rows take the ``"autograd"`` path in one chunk under ``"auto"``."""

Residual = Callable[..., Tensor]

PointData = Union[Tensor, Mapping[str, Tensor]]
"""A part's per-point data: a tensor or a dict of tensors, each with one row per point."""


def _rows_of(data: PointData | None, index: Any) -> PointData | None:
    """The data's rows ``index`` (each tensor of a dict alike; ``None`` adds a leading axis of one row)."""
    if data is None or isinstance(data, Tensor):
        return None if data is None else data[index]
    return {key: value[index] for key, value in data.items()}


def _detached(data: PointData | None) -> PointData | None:
    """The data outside any graph (as the points: the Jacobian is w.r.t. the parameters only)."""
    if data is None or isinstance(data, Tensor):
        return None if data is None else data.detach()
    return {key: value.detach() for key, value in data.items()}


def _evaluate(residual: Residual, x: Tensor, data: PointData | None) -> Tensor:
    """``residual(x)``, or ``residual(x, data)`` for a part with data."""
    return residual(x) if data is None else residual(x, data)


def chunk_points(width: int, n: int, itemsize: int, memory_budget: int, path: str = "func") -> int:
    r"""How many points one chunk takes so that its workspace stays within ``memory_budget`` bytes.

    A chunk of C points makes :math:`C k` rows of n numbers; the estimate counts three such blocks
    (the per-parameter Jacobian pieces, their batched backward's workspace, and the copy into J):
    :math:`C = \lfloor B / (3 C k n s) \rfloor` with s the bytes of a number, at least 1. The
    ``"autograd"`` path is capped at :data:`FALLBACK_MAX_CHUNK` (its work per row is O(C)).
    """
    per_point = 3 * max(width, 1) * max(n, 1) * itemsize
    size = max(1, int(memory_budget // per_point))
    return min(size, FALLBACK_MAX_CHUNK) if path == "autograd" else size


class _Reparametrized(nn.Module):
    """Calls ``residual`` with ``module`` registered as a submodule, so that ``functional_call`` on
    this wrapper swaps the module's parameters (``"module.<name>"``) for the duration of the call:
    the public way to evaluate ANY function of the module (not only its ``forward``) functionally.

    ``residual`` is kept as a plain attribute, not registered: it may be the module itself
    (``Imposed(self, points)``) or one of its submodules, and a module reachable under two names is
    swapped under both and then restored in the same (first-in, first-out) order, which leaves the
    second name's saved value, the swapped tensor, in place (see :func:`_parameters_kept`)."""

    def __init__(self, module: nn.Module, residual: Residual) -> None:
        super().__init__()
        self.module = module
        object.__setattr__(self, "residual", residual)

    def forward(self, *args: Any) -> Tensor:
        return self.residual(*args)


@contextmanager
def _parameters_kept(module: nn.Module) -> Iterator[None]:
    """Put every parameter of ``module`` back in its slot when the block ends, however it ends.

    ``functional_call`` swaps the given tensors into the module and swaps the originals back in the
    order it swapped them; a parameter slot reachable under two names (a submodule registered twice,
    e.g. ``self.u = self.net``) is swapped twice and restored first to the original, then to the
    swapped tensor it saved second. The module would keep ``torch.func``'s wrapped tensors: the next
    forward has no graph to the parameters ("constraints() returned a tensor without grad"), and
    Lightning's teardown (``module.cpu()``, ``param.data = ...``) raises "mutating directly with
    `.data` inside functorch transform is not allowed". This restores the slots themselves (each
    submodule once), so neither an alias nor an exception inside the transforms can leave them."""
    slots = [(owner, name, tensor) for owner in module.modules()
             for name, tensor in owner._parameters.items() if tensor is not None]
    try:
        yield
    finally:
        for owner, name, tensor in slots:
            if owner._parameters.get(name) is not tensor:
                owner._parameters[name] = tensor


def _param_keys(module: nn.Module, params: Sequence[Tensor]) -> list[str]:
    """``"module.<name>"`` of each parameter in ``module`` (the keys of :class:`_Reparametrized`)."""
    hint = ("the per-point Jacobian evaluates the residuals with the module's own parameters swapped "
            "(functional_call); pass the module that owns them.")
    return [f"module.{name}" for name in _parameter_names(module, params, hint)]


def _func_rows(
    module: nn.Module, params: Sequence[Tensor], residual: Residual, points: Tensor, width: int,
    out: Tensor, chunk: int, data: PointData | None = None,
) -> None:
    """The ``"func"`` path: ``out[i k + j] = d r(x_i)_j / d theta``, ``vmap`` over chunks of points (and
    their data's rows) of ``jacrev`` of the one-point residual (parameters as their real views; complex
    ones re-viewed)."""
    wrapper = _Reparametrized(module, residual)
    keys = _param_keys(module, params)
    is_complex = [p.is_complex() for p in params]
    theta = tuple(real_view(p).detach() for p in params)
    sizes = block_sizes(params)

    def at_point(real_params: tuple[Tensor, ...], x: Tensor, *row: PointData) -> Tensor:
        values = {key: torch.view_as_complex(t) if cplx else t for key, t, cplx in zip(keys, real_params, is_complex)}
        return functional_call(wrapper, values, (x[None], *(_rows_of(d, None) for d in row))).reshape(-1)

    per_point = vmap(jacrev(at_point), in_dims=(None, 0) if data is None else (None, 0, 0))
    with _parameters_kept(module):
        for start in range(0, points.shape[0], chunk):
            x = points[start:start + chunk]
            extra = () if data is None else (_rows_of(data, slice(start, start + chunk)),)
            grads = per_point(theta, x, *extra)  # per parameter: (C, k, *shape)
            rows = out[start * width:(start + x.shape[0]) * width]
            column = 0
            for g, size in zip(grads, sizes):
                if g.shape[1] != width:
                    raise ValueError(f"the residual returned {g.shape[1]} values for one point, expected {width}.")
                rows[:, column:column + size].copy_(g.reshape(-1, size))
                column += size


def _autograd_rows(
    params: Sequence[Tensor], residual: Residual, points: Tensor, width: int, out: Tensor, chunk: int,
    data: PointData | None = None,
) -> None:
    """The ``"autograd"`` path: each chunk of points (and its data's rows) evaluated as an ordinary batch
    (its own graph), its rows by :func:`~lit_constrained.jacobians.batched.constraint_jacobian` (one
    batched backward)."""
    for start in range(0, points.shape[0], chunk):
        x = points[start:start + chunk]
        with torch.enable_grad():
            values = _evaluate(residual, x, _rows_of(data, slice(start, start + chunk))).reshape(-1)
        if values.numel() != x.shape[0] * width:
            raise ValueError(f"the residual returned {values.numel()} values for {x.shape[0]} points, expected "
                             f"{x.shape[0] * width}.")
        out[start * width:(start + x.shape[0]) * width].copy_(constraint_jacobian(values, params))


def _why(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]}" if str(error).strip() else type(error).__name__


@dataclass
class PointwiseJacobian:
    """The per-point Jacobian engine, remembering per residual which path works.

    Args:
        path: ``"auto"`` (try ``"func"`` once per residual; if the residual fails inside
            ``torch.func`` transforms, use ``"autograd"`` for it from then on, saying so once),
            ``"func"`` or ``"autograd"`` (forced).
        memory_budget: bytes of workspace one chunk of points may take (:func:`chunk_points`); None (the
            default): :func:`default_memory_budget` of the J being formed.
        chunk_size: a fixed number of points per chunk (overrides the budget).
        small_part_rows: under ``"auto"``, a part (or the share of it asked for) of at most this
            many rows is differentiated as one ordinary graph (the ``"autograd"`` path, one chunk):
            cheaper than the ``torch.func`` transforms' fixed cost at that size.

    ``paths`` maps each residual seen to the path it uses (``"func"`` or ``"autograd"``).
    """

    path: PointwisePath = "auto"
    memory_budget: int | None = None
    chunk_size: int | None = None
    small_part_rows: int = SMALL_PART_ROWS
    paths: dict[Residual, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.path not in ("auto", "func", "autograd"):
            raise ValueError(f"path must be 'auto', 'func' or 'autograd', got {self.path!r}.")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive number of points (or None), got {self.chunk_size}.")
        if self.memory_budget is not None and self.memory_budget <= 0:
            raise ValueError(f"memory_budget must be a positive number of bytes (or None), got {self.memory_budget}.")

    def _chunk(self, width: int, n: int, itemsize: int, path: str, jacobian_bytes: int) -> int:
        if self.chunk_size is not None:
            return self.chunk_size
        budget = default_memory_budget(jacobian_bytes) if self.memory_budget is None else self.memory_budget
        return chunk_points(width, n, itemsize, budget, path)

    def part(
        self, module: nn.Module, params: Sequence[Tensor], residual: Residual, points: Tensor, width: int,
        out: Tensor, jacobian_bytes: int | None = None, data: PointData | None = None,
    ) -> None:
        """Fill ``out`` (N k, n) with the Jacobian of ``residual`` at ``points`` (N, d) (and their ``data``,
        one row per point: ``residual(points, data)``); ``jacobian_bytes``: of the whole J that ``out``
        is part of, for the default budget (``out``'s own when None)."""
        points, data = points.detach(), _detached(data)
        n, itemsize = out.shape[1], out.element_size()
        if jacobian_bytes is None:
            jacobian_bytes = out.numel() * itemsize
        path = self.paths.get(residual, self.path)
        rows = points.shape[0] * width
        if self.path == "auto" and rows <= self.small_part_rows:  # one small graph: no transform's overhead
            _autograd_rows(params, residual, points, width, out, max(1, points.shape[0]), data)
            return
        if path in ("auto", "func"):
            try:
                with torch.no_grad():  # torch.func differentiates by itself: no outer graph
                    chunk = self._chunk(width, n, itemsize, "func", jacobian_bytes)
                    _func_rows(module, params, residual, points, width, out, chunk, data)
                self.paths[residual] = "func"
                return
            except Exception as error:  # noqa: BLE001 -- which ops fail inside torch.func is open-ended
                if path == "func":
                    raise
                _announce_fallback(residual, error)
        self.paths[residual] = "autograd"
        chunk = self._chunk(width, n, itemsize, "autograd", jacobian_bytes)
        _autograd_rows(params, residual, points, width, out, chunk, data)

    def __call__(
        self,
        module: nn.Module,
        params: Sequence[Tensor],
        parts: Sequence[tuple[Residual, Tensor, int] | tuple[Residual, Tensor, int, PointData | None]],
        rows: slice | None = None,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        r"""J of the concatenated parts (:mod:`lit_constrained.imposed`'s layout), or its rows ``rows``.

        Args:
            module: the module whose parameters the residuals use (by attribute, e.g. ``self.net``).
            params: the parameters, in the optimizer's flat order (each a parameter of ``module``).
            parts: ``(residual, points, k)`` or ``(residual, points, k, data)`` per part, in order: part p
                gives rows :math:`o_p + i k + j` for its point i and component j; with ``data`` (a tensor
                or a dict of tensors, one row per point; None: none) the residual is called
                ``residual(points, data)``, the data's rows taken with the points'.
            rows: only these rows (a contiguous slice: a rank's share under data parallelism); only
                the points those rows touch are differentiated.
            dtype: of J (default: the parameters' real dtype).
        """
        params = list(params)
        _param_keys(module, params)  # before any path: a foreign parameter is the caller's error
        specs = [(spec[0], spec[1], spec[2], spec[3] if len(spec) > 3 else None) for spec in parts]
        m = sum(points.shape[0] * k for _, points, k, _ in specs)
        start, stop = _row_range(rows, m)
        n = numel_real(params)
        if dtype is None:
            dtype = real_view(params[0]).dtype if params else torch.get_default_dtype()
        device = params[0].device if params else (specs[0][1].device if specs else None)
        J = torch.empty(stop - start, n, dtype=dtype, device=device)
        offset = 0
        for residual, points, k, data in specs:
            size = points.shape[0] * k
            lo, hi = max(start, offset), min(stop, offset + size)  # this part's share of the rows
            if lo < hi:
                first, last = (lo - offset) // k, -(-(hi - offset) // k)  # the points those rows touch
                block = J[lo - start:hi - start]
                exact = (lo - offset) % k == 0 and (hi - offset) % k == 0
                target = block if exact else J.new_empty((last - first) * k, n)
                self.part(module, params, residual, points[first:last], k, target, J.numel() * J.element_size(),
                          _rows_of(data, slice(first, last)))
                if not exact:
                    skip = lo - offset - first * k
                    block.copy_(target[skip:skip + hi - lo])
            offset += size
        return J


def _residual_name(residual: Residual) -> str:
    owner = getattr(residual, "__self__", None)
    name = getattr(residual, "__qualname__", None) or type(residual).__name__
    return name if owner is None or "." in name else f"{type(owner).__name__}.{name}"


def _announce_fallback(residual: Residual, error: BaseException) -> None:
    """Say why a residual takes the slower path (once: the engine then remembers its path)."""
    name = _residual_name(residual)
    warnings.warn(
        f"The imposed residual {name} cannot run inside torch.func transforms ({_why(error)}); its Jacobian "
        "uses chunked autograd instead: linear in m, but each row costs a backward through a chunk of "
        f"up to {FALLBACK_MAX_CHUNK} points instead of one. Write its input derivatives with "
        "lit_constrained.physics operators or torch.func (jvp/jacfwd/hessian) for the fast path.",
        RuntimeWarning,
        stacklevel=4,
    )


def pointwise_jacobian(
    module: nn.Module,
    params: Sequence[Tensor],
    residual: Residual,
    points: Tensor,
    rows: slice | None = None,
    path: PointwisePath = "auto",
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    chunk_size: int | None = None,
    data: PointData | None = None,
) -> Tensor:
    """J of ONE per-point residual at ``points`` (N, d) (and their ``data``: ``residual(points, data)``):
    ``(N k, n)``, or its rows ``rows``.

    A one-off :class:`PointwiseJacobian` (the path is found anew: keep an engine to remember it).
    ``k`` is read from the residual at the first point."""
    with torch.enable_grad():
        first = _detached(_rows_of(data, slice(0, 1)))
        k = _evaluate(residual, points[:1].detach(), first).reshape(-1).numel() if points.shape[0] else 1
    engine = PointwiseJacobian(path, memory_budget, chunk_size)
    return engine(module, params, [(residual, points, k, data)], rows)
