r"""The base class of the hard-constrained optimizers: one step from (g, c, J) to x_{k+1}.

A subclass turns the flat gradient g (and its state) into a tangential direction w, expressed in the
variables of a "projection Jacobian" :math:`\tilde J` (J itself for the SQP methods; the scaled
:math:`J H^{-1/2}` for Adam(con), never formed: ``Projection.scaling``) with a map T back to x
(identity, or :math:`H^{-1/2}`), and this class
composes the step

.. math::
    \Delta x = T\big(\alpha\, \tilde P w - s\, \tilde J^+ c\big)
             = T\big(\alpha w - \tilde J^T z\big), \qquad z = \tilde G^+ (s c + \alpha \tilde J w),

with :math:`\tilde G = \tilde J \tilde J^T`, :math:`\tilde P` the projector on its null space and
:math:`s = \alpha\rho` the normal-step scale (the paper's normal step is :math:`v = -\rho \tilde J^+ c`,
:math:`d = v + \tilde P w`, :math:`x_{k+1} = x_k + \alpha d`). The normal and tangential parts share
their passes over J by linearity: J is read for the Gram matrix, for :math:`\tilde J w` and for
:math:`\tilde J^T z` (plus two reads per refinement step; :mod:`~lit_constrained.optim.nullspace`).

``rho="full"`` (the default) takes :math:`s = 1` (:math:`\rho_k = 1/\alpha_k` at every step, so it
follows LR schedulers): the linearized constraint :math:`c + J \Delta x` is restored in one step
instead of shrinking by :math:`(1 - \alpha \rho)` per step. A numeric ``rho`` is the papers' method.
So ``lr = 0`` is not "no step": it removes the tangential (objective) step, but with ``rho="full"`` each
step still takes the full normal step, and with any rho the post-step corrections (``max_corrections``)
still pull max |c| down to ``constraint_tol``: the weights move onto the constraints (a feasibility
projection). Only a numeric rho with ``max_corrections=0`` leaves them unchanged at lr = 0 (the fit
warns: :class:`~lit_constrained.callbacks.health.RunHealth`).

**The normal-step safeguard** (``max_normal_step``). Far from feasibility the linearization can be
poor and a full normal step huge (a Darcy FNO's first full normal step has norm ~730). A number caps
:math:`\|\Delta x_{normal}\| \le \text{max\_normal\_step}\,\|x\|` (any rho); ``None`` disables the cap;
``"adaptive"`` (the default, :data:`DEFAULT_MAX_NORMAL_STEP`) is a trust radius on the full normal step
(active with ``rho="full"`` only: a numeric rho is the papers' method, whose normal step the small
:math:`\alpha\rho` already damps). The radius :math:`\Delta_k` bounds
:math:`\|\Delta x_{normal}\| \le \Delta_k \max(\|x_1\|, 1)` (:math:`x_1` the parameters at the first step:
a fixed scale; :math:`\Delta_k \le 1`, a normal step at most the initial weights' norm) and is adapted
from the ratio of the actual to
the linearized decrease of the violation on the capped steps,

.. math::
    r_k = \frac{\|c_k\| - \|c_{k+1}\|}{\|c_k\| - \|c_k + J_k \Delta x_k\|}, \qquad
    \Delta_{k+1} = \begin{cases} \max(\Delta_k / 2, \Delta_{\min}) & r_k < 1/4 \\ 2 \Delta_k & r_k > 3/4 \\
    \Delta_k & \text{else} \end{cases}

(:data:`ADAPTIVE_NORMAL_STEP`): the standard trust-region test, applied only where the normal step was
large enough to be capped. Uncapped steps (near feasibility the normal step is tiny) leave the radius
alone, so the tangential steps' own curvature cannot shrink it, and no step is ever slowed where the
linearization is good: the radius doubles on every capped step that achieves the predicted decrease
(from the initial 0.02, the cap Darcy needed, to the largest, 1, in six steps). A radius relative to
the current ||x_k|| (and up to 1e4 of it) let the weights grow geometrically on an ill-conditioned J: on
the Poisson task with 200 imposed points (n = 501, cond(J J^T) ~1e14) the normal steps grew to 490 by
step 51, the network saturated (the rank of J fell from 62 to 18) and the run ended at rel. L2 177; with
the fixed scale it trains (docs/scale.md, section 5). Everything is computed with
tensors (:math:`\|J^+ c\|^2 = c^T G^+ c` costs no pass over J): no host sync.

Hyperparameters follow torch.optim's conventions: every one is in ``defaults`` and hence in each param
group (``repr``, ``state_dict``/``load_state_dict`` and schedulers see them). ``rho``, ``rcond``,
``max_normal_step`` and ``precision`` define the one projection shared by all groups and must be equal in
all groups; the others (``lr``, momenta, ``eps``, ``h``) are honoured per group. When the groups' lrs
differ, the tangential part :math:`\mathrm{diag}(\alpha) t` is projected again on the null space of J,
so it still leaves the linearized constraints unchanged; the normal part is scaled per block as well
(``rho`` numeric) or not at all (``rho="full"``), so :math:`J \Delta x = -\alpha\rho c` holds exactly
only when all groups share one lr or with ``rho="full"``.

**Precision.** ``precision="native"`` (the default) keeps J, the momenta and every n-vector in the
parameters' dtype and uses float64 for the m x m algebra and the accumulations
(:mod:`~lit_constrained.optim.nullspace`); ``precision="float64"`` (or float64 parameters) runs all of
it in float64, the reference. Buffers are allocated at the first step and reused.

Step diagnostics (rank, norms, violation, ...) are computed only when asked,
``step(..., diagnostics=True)``, into the plain attribute ``optimizer.diagnostics`` (0-dim tensors: no
host sync to produce them); ``optimizer.state`` holds only what resuming needs. A step with
``diagnostics=False`` reads one value on the host (the finiteness flag and the refinement plan together).

**CPU tensors** (``host_algebra``, on by default): there is no device to wait for, so the m x m algebra
and the scalar rules (finiteness flags, refinement plan, safeguard) run on NumPy/Python floats, the same
float64 formulas with far fewer torch dispatches (:mod:`~lit_constrained.optim.nullspace`, "the host
path"); the n-sized work is the same torch ops either way. On a GPU (or with ``host_algebra = False``)
everything stays on the device, sync-free.
"""

from __future__ import annotations

import functools
import math
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Union

import numpy as np
import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.optimizer import ParamsT

from .autocast import outside_autocast
from .blas_threads import host_blas_threads
from .checks import check_finite, check_lr, check_positive, check_shared_keys, prepared_constraint_inputs
from .flat import block_sizes, group_params, real_view
from .nullspace import (
    DEFAULT_RCOND,
    EIGH_MAX_SIZE,
    RESIDUAL_FLAG,
    GramFactor,
    NullSpace,
    Scaling,
    chunk_columns,
    exact_gram,
    exact_matvec,
    exact_refinements,
    gram_partials_shape,
    host_norm,
    host_refinement_code,
    merged_step,
    refine_,
    refinement_code,
    scaled_gram,
    scaled_scratch_shape,
)

Rho = Union[float, Literal["full"]]
MaxNormalStep = Union[float, None, Literal["adaptive"]]
Precision = Literal["native", "float64"]

DEFAULT_LR = 1e-3
DEFAULT_RHO: Rho = "full"
DEFAULT_CONSTRAINT_TOL = 1e-6
"""The default of ``constraint_tol``: the post-step corrections stop once
max |c| <= constraint_tol * max(max |c_1|, 1) (c_1: the constraints at the first step)."""
DEFAULT_MAX_CORRECTIONS = 3
"""The default of ``max_corrections`` (0 switches the post-step corrections off: the papers' methods)."""
BACKTRACK_ABOVE_TOL = 10.0
BACKTRACK_GROWTH = 2.0
MAX_BACKTRACKS = 3
"""Step acceptance of the corrections (see ``ConstrainedOptimizer._correct``): a step whose corrected max |c|
exceeds max(10 tol, 2 max |c_k|) is halved, at most 3 times (to 1/8 of the step)."""
CORRECTION_STALL = 0.5
"""The corrections stop when one leaves max |c| above this fraction of the previous max |c| (the
rounding floor of the residual is reached: more corrections would only cost forwards)."""
DEFAULT_MAX_NORMAL_STEP: MaxNormalStep = "adaptive"
"""The default of ``max_normal_step``: ``"adaptive"`` (the trust radius of :data:`ADAPTIVE_NORMAL_STEP`),
a number (a fixed cap relative to ||x||) or ``None`` (no cap)."""


def _with_host_blas_threads(step: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``step`` with NumPy/SciPy's BLAS held to torch's thread count where its m x m algebra is
    BLAS-sized: CPU constraints with m > ``EIGH_MAX_SIZE`` (the pivoted Cholesky path;
    :mod:`~lit_constrained.optim.blas_threads`). Smaller m and device tensors skip the ~15 us limit."""

    @functools.wraps(step)
    def limited(*args: Any, **kwargs: Any) -> Any:
        c = kwargs.get("constraints")
        if c is None or c.device.type != "cpu" or c.numel() <= EIGH_MAX_SIZE:
            return step(*args, **kwargs)
        with host_blas_threads():
            return step(*args, **kwargs)

    return limited


@dataclass(frozen=True)
class AdaptiveNormalStep:
    """Constants of the adaptive normal-step radius (relative to max(||x_1||, 1), x_1 the first step's
    parameters)."""

    initial: float = 0.02
    smallest: float = 1e-3
    largest: float = 1.0
    shrink_below: float = 0.25
    grow_above: float = 0.75
    shrink: float = 0.5
    grow: float = 2.0


ADAPTIVE_NORMAL_STEP = AdaptiveNormalStep()

STATE_KEY = "flat"
_TINY = 1e-30
PRECISIONS = ("native", "float64")


def check_rho(rho: Rho) -> None:
    if rho == "full":
        return
    if isinstance(rho, (str, bool)) or not (isinstance(rho, (int, float)) and math.isfinite(rho) and rho > 0):
        raise ValueError(f"Invalid rho={rho!r}: a number > 0, or 'full' for rho_k = 1 / lr_k.")


def check_max_normal_step(value: MaxNormalStep) -> None:
    if value is None or value == "adaptive":
        return
    if isinstance(value, (str, bool)) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(
            f"Invalid max_normal_step={value!r}: a number > 0 (a fixed cap relative to ||x||), 'adaptive' "
            "(the default trust radius) or None (no cap)."
        )


def check_max_corrections(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"Invalid max_corrections={value!r}: an integer >= 0 (0: no post-step corrections, the papers' "
            "methods)."
        )


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(
            f"Invalid precision={precision!r}: 'native' (the parameters' dtype, float64 only for the m x m "
            "algebra) or 'float64' (everything in float64, the reference path)."
        )


@dataclass(frozen=True)
class Layout:
    """The flat layout of the parameters (per parameter, of its real view): the shapes and dtypes it was
    built for (``key``), sizes, shapes, dtypes, the dtype they promote to (float32 at least) and whether
    none is complex."""

    key: tuple[tuple[torch.dtype, torch.Size], ...]
    sizes: list[int]
    shapes: list[torch.Size]
    dtypes: list[torch.dtype]
    dtype: torch.dtype
    real: bool
    n: int


@dataclass
class Projection:
    """What a subclass hands the base class before any state changes (see ``_prepare``).

    Attributes:
        jacobian: J in the working dtype.
        factor: the factorization of the projection Jacobian's Gram matrix (J J^T, or J D^2 J^T).
        finite: 0-dim bool (a Python bool on the host path), False when the inputs (J, g, ...) hold
            NaN/inf (checked on m x m data).
        extras: subclass data for ``_tangent`` / ``_to_x``.
        tangent_scale: see below.
    """

    jacobian: Tensor
    factor: GramFactor
    finite: Tensor | bool
    extras: dict[str, Any] = field(default_factory=dict)
    tangent_scale: float = 1.0
    """A scalar multiplying w, set by ``_tangent`` (folded into the merged step: no pass over w)."""
    scaling: Tensor | None = None
    """d: the projection Jacobian is J diag(d) (Adam(con): d = H^{-1/2}), never formed (its products go
    through ``ConstrainedOptimizer._scaling``, see :func:`~lit_constrained.optim.nullspace.merged_step`);
    None: J itself."""
    step_scale: float | None = None
    """a = lr * tangent_scale when all groups share one lr (set before ``_normal_norm``), else None: a
    ``_normal_norm`` that makes a pass over J~ may then form the tangential part a P~ w in the same pass
    (``extras["tangent_direction"]`` = -J~^T G~^+ (a J~ w), next to ``extras["normal_direction"]``)."""


class ConstrainedOptimizer(Optimizer, ABC):
    """Shared machinery: hyperparameters, input checks, the flat layout, rho / "full", the safeguard,
    the merged step, diagnostics, state and workspaces."""

    requires = frozenset({"constraints", "jacobian"})
    shared_keys: tuple[str, ...] = ("rho", "rcond", "max_normal_step", "precision", "constraint_tol",
                                    "max_corrections")
    """Hyperparameters of the one projection: equal in all param groups."""
    host_algebra: bool = True
    """With CPU tensors, run the m x m algebra and the scalar rules in NumPy (the host path; equal to the
    torch path to round-off). False keeps the torch path that a GPU runs (the sync-budget tests use it)."""

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        defaults = {
            "lr": DEFAULT_LR,
            "rho": DEFAULT_RHO,
            "rcond": DEFAULT_RCOND,
            "max_normal_step": DEFAULT_MAX_NORMAL_STEP,
            "precision": "native",
            "constraint_tol": DEFAULT_CONSTRAINT_TOL,
            "max_corrections": DEFAULT_MAX_CORRECTIONS,
            **defaults,
        }
        self._check_group(defaults)
        super().__init__(params, defaults)
        self.diagnostics: dict[str, Tensor] = {}
        self._on_host = False
        self._rank_warned = False
        self._buffers: dict[str, Tensor] = {}
        self._view_cache: dict[str, tuple[Any, list[Tensor]]] = {}
        self._check_groups()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("diagnostics", {})
        self.__dict__.setdefault("_on_host", False)
        self.__dict__.setdefault("_rank_warned", False)
        self.__dict__.setdefault("_buffers", {})
        self.__dict__.setdefault("_view_cache", {})

    # ------------------------------------------------------------------ hyperparameters
    def _check_group(self, group: dict[str, Any]) -> None:
        """Validate one group's hyperparameters (subclasses extend it with their own)."""
        check_lr(group["lr"])
        check_rho(group["rho"])
        check_positive("rcond", group["rcond"])
        check_max_normal_step(group["max_normal_step"])
        check_precision(group["precision"])
        check_positive("constraint_tol", group["constraint_tol"])
        check_max_corrections(group["max_corrections"])

    def _check_groups(self) -> None:
        for group in self.param_groups:
            self._check_group(group)
        check_shared_keys(
            type(self).__name__, self.param_groups, self.shared_keys,
            "the one projection (the constraints couple the groups)",
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``; groups saved before a hyperparameter existed get its default (a
        checkpoint from before ``constraint_tol`` / ``max_corrections`` resumes with the corrections of
        today's defaults)."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for key in ("constraint_tol", "max_corrections"):
                group.setdefault(key, self.defaults[key])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "diagnostics"):  # after __init__: validate the new group at once
            self._check_groups()

    @property
    def rho(self) -> Rho:
        """The normal-step scale shared by all groups (``param_groups[i]["rho"]``)."""
        return self.param_groups[0]["rho"]

    # ------------------------------------------------------------------ subclass hooks
    @abstractmethod
    def _prepare(self, g: Tensor, jacobian: Tensor, c: Tensor, state: dict[str, Any]) -> Projection:
        """Factorize the projection Jacobian (``_factorize``); flag non-finite inputs. No state change
        (``state["step"]`` is still k - 1)."""

    @abstractmethod
    def _tangent(self, projection: Projection, g: Tensor, state: dict[str, Any],
                 diagnostics: dict[str, Tensor] | None) -> Tensor:
        """Update the state; return w (projection variables, working dtype; may be a workspace)."""

    def _to_x(self, projection: Projection, step: Tensor) -> Tensor:
        """Map a step from the projection variables to x, in place (identity by default)."""
        return step

    def _scaling(self, projection: Projection) -> Scaling | None:
        """(d, scratch) when the projection Jacobian is J diag(d) (see ``merged_step``); None for J itself."""
        d = projection.scaling
        if d is None:
            return None
        return d, self._buffer("scaled_vector", tuple(d.shape), d.dtype, d.device)

    def _normal_norm(self, projection: Projection, c: Tensor) -> Tensor:
        """||T(J~^+ c)|| (0-dim float64): free for T = identity (c^T G~^+ c)."""
        return projection.factor.pinv_norm_sq(c).sqrt()

    def _normal_norm_host(self, projection: Projection, c: np.ndarray) -> float:
        """``_normal_norm`` on the host path (c a float64 NumPy array)."""
        return math.sqrt(projection.factor.host.pinv_norm_sq(c))

    @abstractmethod
    def _init_state(self, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        """The state at the first step (moments in ``dtype``)."""

    # ------------------------------------------------------------------ workspaces
    def _buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """A persistent scratch tensor (allocated once; not part of the state)."""
        buf = self._buffers.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(shape, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf

    def _layout(self, params: list[Tensor]) -> Layout:
        """The flat layout of ``params`` (cached while their dtypes and shapes stay the same)."""
        key = tuple([(p.dtype, p.shape) for p in params])
        cached = self._view_cache.get("layout")
        if cached is not None and cached.key == key:
            return cached
        reals = [real_view(p) for p in params]
        dtype = torch.float32
        for t in reals:  # (promote_types is a dispatch per parameter: once per layout)
            dtype = torch.promote_types(dtype, t.dtype)
        layout = Layout(key, [t.numel() for t in reals], [t.shape for t in reals], [t.dtype for t in reals],
                        dtype if dtype.is_floating_point else torch.float32,
                        not any(p.is_complex() for p in params), sum(t.numel() for t in reals))
        self._view_cache["layout"] = layout
        return layout

    def _working_dtype(self, layout: Layout) -> torch.dtype:
        return torch.float64 if self.param_groups[0]["precision"] == "float64" else layout.dtype

    def _group_blocks(self) -> list[tuple[dict[str, Any], slice]]:
        """Each param group with its slice of the flat vector (cached while the groups' params stay)."""
        key = tuple(id(p) for group in self.param_groups for p in group["params"])
        cached = self._view_cache.get("group_blocks")
        if cached is not None and cached[0] == key and all(
            a is b for a, (b, _) in zip(self.param_groups, cached[1])
        ) and len(cached[1]) == len(self.param_groups):
            return cached[1]
        blocks, offset = [], 0
        for group in self.param_groups:
            size = sum(block_sizes(group["params"]))
            blocks.append((group, slice(offset, offset + size)))
            offset += size
        self._view_cache["group_blocks"] = (key, blocks)
        return blocks

    def _exact_workspace(self, jacobian: Tensor) -> tuple[Tensor, Tensor]:
        """Scratch for :func:`exact_matvec` (and :func:`exact_gram`): float64 (m, chunk) and (chunk,)."""
        m, n = jacobian.shape
        chunk = min(n, chunk_columns(m))
        return (self._buffer("exact_rows", (m, chunk), torch.float64, jacobian.device),
                self._buffer("exact_vector", (chunk,), torch.float64, jacobian.device))

    def _exact_factor(self, jacobian: Tensor, host: bool = False, d: Tensor | None = None) -> GramFactor:
        G = exact_gram(jacobian, self._exact_workspace(jacobian), d)
        return GramFactor.from_gram(G, self.param_groups[0]["rcond"], host=host)

    def _factorize(self, jacobian: Tensor) -> tuple[GramFactor, Tensor]:
        """The factor of G = J J^T and whether G is finite (a NaN/inf anywhere in J shows in G; the
        eigendecomposition then runs on the identity instead, and the flag stops the step)."""
        factor, finite, _ = self._scaled_factorize(jacobian, None)
        return factor, finite

    def _scaled_factorize(self, jacobian: Tensor, d: Tensor | None, v: Tensor | None = None,
                          ) -> tuple[GramFactor, Tensor, Tensor | None]:
        """``_factorize`` for G = J D^2 J^T (D = diag(d), the identity when ``d`` is None; a NaN/inf in d
        shows in G too), with J D v (float64) from the Gram's pass when ``v`` and ``d`` are given (else
        None): :func:`~lit_constrained.optim.nullspace.scaled_gram`."""
        m, n = jacobian.shape
        if m == 0:
            return (GramFactor.empty(jacobian.device), torch.ones((), dtype=torch.bool, device=jacobian.device),
                    None)
        partials = scratch = None
        if jacobian.dtype != torch.float64:
            partials = self._buffer("gram_partials", gram_partials_shape((m, n)), jacobian.dtype, jacobian.device)
        if d is not None:
            scratch = self._buffer("scaled_columns", scaled_scratch_shape(m, n, jacobian.dtype), jacobian.dtype,
                                   jacobian.device)
        G, Jv = scaled_gram(jacobian, d, partials, scratch, v)
        if self._on_host:
            finite = bool(np.isfinite(G.numpy()).all())
            if not finite:  # flagged (the step raises): never used
                G = torch.zeros_like(G)
            return GramFactor.from_gram(G, self.param_groups[0]["rcond"], host=True), finite, Jv
        finite = torch.isfinite(G).all()
        G = torch.where(finite, G, 0.0)  # a non-finite G is flagged (the step raises): never used
        return GramFactor.from_gram(G, self.param_groups[0]["rcond"]), finite, Jv

    def _diagnostic_factor(self, projection: Projection, jacobian: Tensor) -> GramFactor:
        """The factor of J J^T whose rank / smallest singular value the diagnostics report."""
        return projection.factor

    # ------------------------------------------------------------------ the step
    @outside_autocast
    @torch.no_grad()
    @_with_host_blas_threads
    def step(
        self,
        closure: Callable[[], Any] | None = None,
        *,
        constraints: Tensor | None = None,
        jacobian: Tensor | None = None,
        diagnostics: bool = False,
        constraint_closure: Callable[[], Tensor] | None = None,
    ) -> Any:
        """One step; g is read from ``p.grad``, c and J are given (J in the flat layout).

        Args:
            closure: optional, re-evaluates the model and returns the loss (called under grad mode).
            constraints: c, shape (m,); ``None`` for m = 0.
            jacobian: J, shape (m, n), columns in ``param_groups`` order (complex parameters as
                ``view_as_real``).
            diagnostics: fill ``self.diagnostics`` with this step's diagnostics (0-dim tensors); when
                False it is left empty (a stale value is never read as current).
            constraint_closure: optional, returns c (shape (m,)) at the current parameters; given, the
                step is followed by at most ``max_corrections`` Gauss-Newton corrections toward
                max |c| <= tol (see :meth:`_correct`). It must return the same c on every
                data-parallel rank.

        A NaN/inf in g, c or J raises ``ValueError`` before anything changes.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_groups()
        self.diagnostics = {}
        params = group_params(self.param_groups)
        if not params:
            return loss
        device = params[0].device
        layout = self._layout(params)
        dtype = self._working_dtype(layout)
        n = layout.n
        g = self._gather_grad(params, layout, dtype, device)
        reals = params if layout.real else [real_view(p) for p in params]  # (x as real tensors)
        c, J = self._checked_constraints(constraints, jacobian, n, dtype, device)
        m = c.numel()

        state = self.state[STATE_KEY]
        if not state:
            state.update(self._init_state(n, device, dtype))
        elif state.get("n", n) != n:
            raise ValueError(
                f"The number of parameters changed from {state['n']} to {n} since the first step; "
                "create a new optimizer after adding parameter groups."
            )
        else:
            self._match_state_dtype(state, dtype)

        self._on_host = host = (self.host_algebra and m > 0 and device.type == "cpu" and J.device.type == "cpu"
                                and c.device.type == "cpu")
        c_host = c.numpy() if host else None
        projection = self._prepare(g, J, c, state)
        if host:  # the same decisions from host floats
            finite = projection.finite and bool(np.isfinite(c_host).all())
            code = host_refinement_code(projection.factor.host.condition, n, dtype, m) + 2 if finite else 0
        else:
            # the one host sync: finiteness of the inputs (on m x m data) and the refinement plan together
            finite = projection.finite & torch.isfinite(c).all()
            if m == 0:
                finite = finite & torch.isfinite(torch.dot(g, g))
            if m:  # plan in {-1, ..., max_refinements(m)}; + RESIDUAL_FLAG where the residuals need float64 products
                plan = refinement_code(projection.factor, n, dtype)
            else:
                plan = torch.zeros((), dtype=torch.int64)
            plan = plan.to(finite.device)
            code = int(torch.where(finite, plan + 2, torch.zeros_like(plan)))
        if code == 0:
            self._raise_nonfinite(g, c, J)
        if host and not self._rank_warned:
            self._warn_if_dependent(projection.factor.host.rank, m, n, float(projection.factor.host.condition))
        exact_residual = code >= RESIDUAL_FLAG
        refinements = code % RESIDUAL_FLAG - 2
        if refinements < 0:
            projection.factor = self._exact_factor(projection.jacobian, host, projection.scaling)
            refinements = exact_refinements(projection.factor, dtype)
            exact_residual = True

        state["n"] = n
        state["step"] = state["step"] + 1
        record: dict[str, Tensor] | None = {} if diagnostics else None
        w = self._tangent(projection, g, state, record)

        first = self.param_groups[0]
        rho = first["rho"]
        lrs = [float(group["lr"]) for group in self.param_groups]
        lr = lrs[0]
        uniform = all(rate == lr for rate in lrs)
        a = lr * projection.tangent_scale
        delta = self._buffer("delta", (n,), dtype, device)
        if m == 0:  # no constraints: the unprojected direction, scaled by each group's lr
            if uniform:
                torch.mul(w, a, out=delta)
            else:
                self._scale_by_group_lr(delta, w).mul_(projection.tangent_scale)
            scale = None
            normal_norm = torch.zeros((), dtype=torch.float64, device=device)
        elif uniform or rho == "full":
            s = 1.0 if rho == "full" else lr * float(rho)
            projection.step_scale = a if uniform else None
            if host:  # scale a float, sc a host array (selects the host path of merged_step / refine_)
                scale, normal_norm = self._normal_scale_host(projection, c_host, s, reals, state)
                sc, zeros = scale * c_host, np.zeros(m)
            else:
                scale, normal_norm = self._normal_scale(projection, c, s, reals, state)
                sc, zeros = scale * c, torch.zeros_like(c)
            if uniform:
                # (the float64 scratch only for refinements with exact residuals)
                workspace = self._exact_workspace(J) if refinements and exact_residual else None
                scaling = self._scaling(projection)
                # (the corrections' scratch: refinements with exact residuals of the unscaled J; see refine_)
                scratch = (self._buffer("correction", (n,), dtype, device)
                           if refinements and exact_residual and scaling is None else None)
                normal = projection.extras.get("normal_direction")
                tangent = projection.extras.get("tangent_direction")
                if normal is None:
                    merged_step(J, projection.factor, w, a, sc, refinements, delta, workspace, scaling,
                                exact_residual, scratch)
                else:  # -J~^+ c was formed for the safeguard's norm: reuse it, a P~ w + s (-J~^+ c)
                    if tangent is None:
                        merged_step(J, projection.factor, w, a, zeros, 0, delta, scaling=scaling)
                    else:  # -J~^T G~^+ (a J~ w) came from the same pass: a P~ w = a w + tangent
                        torch.add(tangent, w, alpha=a, out=delta)
                    if host:
                        delta.add_(normal, alpha=scale)
                    else:
                        delta.addcmul_(normal, scale.to(delta.dtype))
                    refine_(J, projection.factor, delta, sc, refinements, workspace, scaling, exact_residual,
                            scratch)
                self._to_x(projection, delta)
            else:
                if host:
                    scale = torch.tensor(scale, dtype=torch.float64, device=device)
                self._mixed_lr_step(projection, w, c, scale, None, refinements, J, delta)
        else:  # mixed lrs with a numeric rho: each block's normal part scaled by its own lr * rho
            lr_rho = self._lr_vector(dtype, device).mul_(float(rho))
            scale = None
            normal_norm = torch.full((), math.nan, dtype=torch.float64, device=device)
            self._mixed_lr_step(projection, w, c, None, lr_rho, refinements, J, delta)
        self._add_to_params(reals, layout, delta)

        if "initial_violation" not in state:
            state["initial_violation"] = c.abs().max() if m else c.new_zeros(())
        if m and constraint_closure is not None and first["max_corrections"]:
            self._correct(constraint_closure, projection, refinements, exact_residual, reals, layout, state,
                          record, c, delta)
        if record is not None:
            normal_norm = torch.as_tensor(normal_norm, dtype=torch.float64, device=device)
            self._record(record, state, projection, c, J, delta, scale, normal_norm, lr, refinements)
            self.diagnostics = record
        return loss

    # ------------------------------------------------------------------ pieces of the step
    def _correct(
        self,
        evaluate: Callable[[], Tensor],
        projection: Projection,
        refinements: int,
        exact_residual: bool,
        reals: list[Tensor],
        layout: Layout,
        state: dict[str, Any],
        record: dict[str, Tensor] | None,
        c_before: Tensor,
        delta: Tensor,
    ) -> None:
        r"""Feasibility held to a tolerance (``../shared/spec/algorithms.md`` section 8): after the step
        :math:`x^+ = x_k + \Delta_k`, at most K = ``max_corrections`` times while
        :math:`\max|c(x^+)| > \text{tol}`,

        .. math::
            x^+ \leftarrow x^+ + T\big(-\tilde J_k^+ c(x^+)\big)
                = x^+ - T \tilde J_k^T \tilde G_k^+ c(x^+)

        with the step's own factorization (J at :math:`x_k`: a second-order correction, no new Jacobian;
        T and :math:`\tilde J` as in the step, so :math:`J_k \Delta x = -c(x^+)`), the same
        refinements, and only c re-evaluated (``evaluate``). tol = ``constraint_tol`` * max(max
        :math:`|c_1|`, 1). The loop stops early when a correction leaves max |c| above
        ``CORRECTION_STALL`` times the previous one (the residual's rounding floor); a correction that
        increased max |c| is undone.

        Step acceptance: when after the corrections max |c| is still above
        max(``BACKTRACK_ABOVE_TOL`` tol, ``BACKTRACK_GROWTH`` max :math:`|c_k|`) (the step's curvature
        outran the linearization: the corrections with :math:`J_k` cannot restore it), the step is
        halved, :math:`x^+ = x_k + \tau \Delta_k` with :math:`\tau = 1/2, 1/4, ...` (at most
        ``MAX_BACKTRACKS`` times; the optimizer's state keeps the full step's update), and corrected
        again. No correction follows a step whose normal step the safeguard capped
        (``max_normal_step``: far from feasibility the linearization is not trusted, and an uncapped
        Gauss-Newton correction would take the step the cap refused). Each evaluation is one host read
        of max |c| (the decisions are the same on every rank: c is). Diagnostics: ``corrections``
        (taken), ``step_fraction`` (:math:`\tau`) and ``corrected_violation`` (max |c| after them; an
        evaluation of its own on diagnostic steps where none was made last)."""
        group = self.param_groups[0]
        J = projection.jacobian
        m, n = J.shape
        taken, violation, fraction = 0, math.nan, 1.0
        capped = state.get("normal_step_capped")
        if capped is None or not bool(capped):  # a capped step: far from feasibility, the safeguard decides
            tol = float(group["constraint_tol"]) * max(float(state["initial_violation"]), 1.0)
            accept_below = max(BACKTRACK_ABOVE_TOL * tol, BACKTRACK_GROWTH * float(c_before.abs().max()))
            applied = self._buffer("corrections_applied", (n,), J.dtype, J.device).zero_()
            for backtrack in range(MAX_BACKTRACKS + 1):
                count, violation = self._gauss_newton_corrections(
                    evaluate, projection, refinements, exact_residual, reals, layout, tol, applied)
                taken += count
                if backtrack == MAX_BACKTRACKS:
                    break
                if math.isnan(violation):
                    violation = float(self._evaluated_constraints(evaluate, m).abs().max())
                if violation <= accept_below:
                    break
                # back to x_k + (tau / 2) Delta_k: remove the corrections and half of what is left of the step
                self._add_to_params(reals, layout, applied.add_(delta, alpha=fraction / 2).neg_())
                applied.zero_()
                fraction /= 2
                violation = math.nan
        if record is not None:
            if math.isnan(violation):
                violation = float(self._evaluated_constraints(evaluate, m).abs().max())
            as_tensor = functools.partial(torch.tensor, dtype=torch.float64, device=J.device)
            record["corrections"] = as_tensor(float(taken))
            record["step_fraction"] = as_tensor(fraction)
            record["corrected_violation"] = as_tensor(violation)

    def _gauss_newton_corrections(
        self, evaluate: Callable[[], Tensor], projection: Projection, refinements: int, exact_residual: bool,
        reals: list[Tensor], layout: Layout, tol: float, applied: Tensor,
    ) -> tuple[int, float]:
        """The correction loop of :meth:`_correct` (each correction also added to ``applied``): the number
        taken and the last evaluated max |c| (NaN when the last correction was not evaluated after)."""
        J, factor = projection.jacobian, projection.factor
        m, n = J.shape
        correction = self._buffer("correction_step", (n,), J.dtype, J.device)
        scaling = self._scaling(projection)
        workspace = self._exact_workspace(J) if refinements and exact_residual else None
        taken, previous, violation = 0, math.inf, math.nan
        for _ in range(int(self.param_groups[0]["max_corrections"])):
            c = self._evaluated_constraints(evaluate, m)
            violation = float(c.abs().max())
            if taken and not violation <= previous:  # the last correction made it worse (or NaN): undo it
                self._add_to_params(reals, layout, correction.neg_())
                applied.add_(correction)
                return taken - 1, previous
            if not violation > tol or violation > CORRECTION_STALL * previous:
                return taken, violation
            sc = c.to(torch.float64)
            merged_step(J, factor, None, 0.0, sc.numpy() if self._on_host else sc, refinements, correction,
                        workspace, scaling, exact_residual)
            self._add_to_params(reals, layout, self._to_x(projection, correction))
            applied.add_(correction)
            taken, previous, violation = taken + 1, violation, math.nan
        return taken, violation

    def _warn_if_dependent(self, rank: int, m: int, n: int, condition: float) -> None:
        """One warning per optimizer when the imposed constraints are numerically dependent (rank < m):
        duplicate points, or more points than the network can satisfy (m > n among them)."""
        if rank >= m or self._rank_warned:
            return
        self._rank_warned = True
        why = (f"there are more constraints than parameters (m = {m} > n = {n}): at most n can hold"
               if m > n else "duplicate or redundant points, or more points than the network can satisfy")
        warnings.warn(
            f"{type(self).__name__}: the m = {m} imposed constraints have numerical rank {rank} (singular values "
            f"of J below rcond = {self.param_groups[0]['rcond']:g} x the largest are dropped; cond(J J^T) of the "
            f"kept part {condition:.2g}): {m - rank} are dependent on the others ({why}). The step imposes "
            "their least-squares solution (the minimum-norm Gauss-Newton step), so not every constraint can "
            "reach 0: impose fewer or independent points, or use a larger network. The rank is logged as "
            "optim/rank.", RuntimeWarning, stacklevel=3,
        )

    @staticmethod
    def _evaluated_constraints(evaluate: Callable[[], Tensor], m: int) -> Tensor:
        c = evaluate()
        if not isinstance(c, Tensor) or c.shape != (m,):
            shape = tuple(c.shape) if isinstance(c, Tensor) else type(c).__name__
            raise ValueError(
                f"constraint_closure returned {shape}, expected a tensor of shape ({m},): the constraints "
                "of this step at the updated parameters."
            )
        return c.detach()

    def _normal_scale(
        self, projection: Projection, c: Tensor, s: float, params: list[Tensor], state: dict[str, Any]
    ) -> tuple[Tensor, Tensor]:
        """The normal-step scale s * tau (0-dim float64: tau < 1 where the safeguard caps the step) and
        the resulting normal-step norm; updates the adaptive radius in the state. ``params``: x as real
        tensors (the parameters' real views)."""
        cap = self.param_groups[0]["max_normal_step"]
        s_t = torch.full((), s, dtype=torch.float64, device=c.device)
        adaptive = cap == "adaptive" and self.param_groups[0]["rho"] == "full"
        if cap is None or (cap == "adaptive" and not adaptive):
            return s_t, s * self._normal_norm(projection, c)
        norm = s * self._normal_norm(projection, c)
        x_norm = torch.linalg.vector_norm(  # (step() runs under no_grad: no detach needed)
            torch.stack(torch._foreach_norm(params)).to(torch.float64)
        )
        if adaptive:
            rule = ADAPTIVE_NORMAL_STEP
            c_norm = c.norm()
            radius = state.get("normal_radius")
            if radius is None:
                radius = torch.full((), rule.initial, dtype=torch.float64, device=c.device)
            if "previous_violation" in state:
                previous, was_capped = state["previous_violation"], state["normal_step_capped"]
                ratio = (previous - c_norm) / (previous - state["predicted_violation"]).clamp_min(_TINY)
                factor = torch.where(was_capped & (ratio < rule.shrink_below), rule.shrink,
                                     torch.where(was_capped & (ratio > rule.grow_above), rule.grow, 1.0))
                radius = (radius * factor).clamp(rule.smallest, rule.largest)
            if "reference_norm" not in state:
                state["reference_norm"] = x_norm.clamp_min(1.0)
            limit = radius * state["reference_norm"]
        else:
            limit = cap * x_norm
        capped = norm > limit
        tau = (limit / norm.clamp_min(_TINY)).clamp_max(1.0)
        if adaptive:
            reach = projection.factor.range_part(c)  # J~ = J H^{-1/2} has the range of J
            state["normal_radius"] = radius
            state["previous_violation"] = c_norm
            state["predicted_violation"] = (c - (s * tau) * reach).norm()
        state["normal_step_capped"] = capped
        return s_t * tau, norm * tau

    @np.errstate(over="ignore", invalid="ignore", divide="ignore")  # inf/NaN silently, as in torch
    def _normal_scale_host(
        self, projection: Projection, c: np.ndarray, s: float, params: list[Tensor], state: dict[str, Any]
    ) -> tuple[float, float]:
        """``_normal_scale`` on the host path: the same rules on Python floats (c a float64 NumPy array);
        the state keeps its 0-dim tensors."""
        cap = self.param_groups[0]["max_normal_step"]
        adaptive = cap == "adaptive" and self.param_groups[0]["rho"] == "full"
        norm = s * self._normal_norm_host(projection, c)
        if cap is None or (cap == "adaptive" and not adaptive):
            return s, norm
        x_norm = host_norm(torch.stack(torch._foreach_norm(params)).numpy().astype(np.float64))
        if adaptive:
            rule = ADAPTIVE_NORMAL_STEP
            c_norm = host_norm(c)
            radius = float(state["normal_radius"]) if "normal_radius" in state else rule.initial
            if "previous_violation" in state:
                previous, was_capped = float(state["previous_violation"]), float(state["normal_step_capped"])
                # (max/min with the computed value first keep a NaN, as torch's clamp does)
                ratio = (previous - c_norm) / max(previous - float(state["predicted_violation"]), _TINY)
                factor = (rule.shrink if was_capped and ratio < rule.shrink_below
                          else rule.grow if was_capped and ratio > rule.grow_above else 1.0)
                radius = min(max(radius * factor, rule.smallest), rule.largest)
            if "reference_norm" not in state:
                state["reference_norm"] = _host_tensor(max(x_norm, 1.0))
            limit = radius * float(state["reference_norm"])
        else:
            limit = cap * x_norm
        capped = norm > limit
        tau = min(limit / max(norm, _TINY), 1.0)
        if adaptive:
            reach = projection.factor.host.range_part(c)  # J~ = J H^{-1/2} has the range of J
            state["normal_radius"] = _host_tensor(radius)
            state["previous_violation"] = _host_tensor(c_norm)
            state["predicted_violation"] = _host_tensor(host_norm(c - (s * tau) * reach))
        state["normal_step_capped"] = torch.from_numpy(np.asarray(capped, dtype=np.bool_))
        return s * tau, norm * tau

    def _lr_vector(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        """The per-entry lr of the flat layout (the mixed-lr path only)."""
        pieces = [torch.full((block.stop - block.start,), float(group["lr"]), dtype=dtype, device=device)
                  for group, block in self._group_blocks()]
        return torch.cat(pieces)

    def _scale_by_group_lr(self, out: Tensor, w: Tensor) -> Tensor:
        for group, block in self._group_blocks():
            torch.mul(w[block], float(group["lr"]), out=out[block])
        return out

    def _mixed_lr_step(
        self, projection: Projection, w: Tensor, c: Tensor, scale: Tensor | None, lr_rho: Tensor | None,
        refinements: int, J: Tensor, out: Tensor,
    ) -> None:
        """Groups with different lrs: Delta x = P(diag(lr) t) + normal, with t = T(P~ w) the tangential
        direction and the normal part s v_hat (``scale``) or diag(lr rho) v_hat (``lr_rho``)."""
        zeros = torch.zeros_like(c)
        scaling = self._scaling(projection)
        t = merged_step(J, projection.factor, w, projection.tangent_scale, zeros, refinements, torch.empty_like(w),
                        scaling=scaling)
        t = self._to_x(projection, t)
        self._scale_by_group_lr(t, t)
        plain = NullSpace.from_jacobian(J, self.param_groups[0]["rcond"])
        merged_step(J, plain.factor, t, 1.0, zeros, plain.refine, out)
        v_hat = merged_step(J, projection.factor, None, 0.0, c, refinements, torch.empty_like(w), scaling=scaling)
        v_hat = self._to_x(projection, v_hat)
        if lr_rho is not None:
            out.addcmul_(lr_rho, v_hat)
        else:
            out.add_(v_hat * scale.to(out.dtype))

    def _views(self, name: str, flat: Tensor, layout: Layout) -> list[Tensor]:
        """Views of the persistent flat buffer ``flat`` shaped like each parameter's real view (cached)."""
        cached = self._view_cache.get(name)
        if cached is None or cached[0] is not layout or cached[1] != flat.data_ptr() or cached[2] != flat.dtype:
            views, offset = [], 0
            for shape, size in zip(layout.shapes, layout.sizes):
                views.append(flat[offset:offset + size].view(shape))
                offset += size
            cached = (layout, flat.data_ptr(), flat.dtype, views)
            self._view_cache[name] = cached
        return cached[3]

    def _gather_grad(self, params: list[Tensor], layout: Layout, dtype: torch.dtype, device: torch.device) -> Tensor:
        """g in the flat layout, copied into a persistent buffer (one foreach copy; zeros for no grad)."""
        g = self._buffer("grad", (layout.n,), dtype, device)
        views = self._views("grad", g, layout)
        targets, grads = [], []
        for p, view in zip(params, views):
            grad = p.grad  # (a property: read once)
            if grad is None:
                view.zero_()
            elif grad.is_sparse:
                raise ValueError(f"{type(self).__name__} does not support sparse gradients.")
            else:
                targets.append(view)
                grads.append(grad if layout.real else real_view(grad))
        if targets:
            torch._foreach_copy_(targets, grads)
        return g

    def _add_to_params(self, targets: list[Tensor], layout: Layout, delta: Tensor) -> None:
        """x <- x + delta, block by block (one foreach add when the dtypes agree); ``targets``: the
        parameters' real views (step() runs under no_grad)."""
        steps = self._views("delta", delta, layout)
        if all(dtype == delta.dtype for dtype in layout.dtypes):
            torch._foreach_add_(targets, steps)
        else:  # the float64 reference path with lower-precision parameters
            for target, step in zip(targets, steps):
                target.add_(step.to(target.dtype))

    @staticmethod
    def _match_state_dtype(state: dict[str, Any], dtype: torch.dtype) -> None:
        """Moments loaded from a checkpoint of another precision are cast once to the working dtype."""
        for key, value in state.items():
            if isinstance(value, Tensor) and value.dim() == 1 and value.dtype != dtype and value.is_floating_point():
                state[key] = value.to(dtype)

    def _checked_constraints(
        self, constraints: Tensor | None, jacobian: Tensor | None, n: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[Tensor, Tensor]:
        return prepared_constraint_inputs(
            type(self).__name__, constraints, jacobian, n, dtype, device,
            lambda m: self._buffer("jacobian", (m, n), dtype, device),
        )

    def _raise_nonfinite(self, g: Tensor, c: Tensor, J: Tensor) -> None:
        """The failure path (syncs are fine here): name what is not finite."""
        check_finite("The constraints c", c)
        check_finite("The jacobian J", J)
        check_finite("The objective gradient g", g)
        raise ValueError(
            "The step is not finite (an overflow in the projection); the step was not taken. "
            "Check the loss/constraints at this point (a diverging run or a bad batch)."
        )

    def _record(
        self,
        record: dict[str, Tensor],
        state: dict[str, Any],
        projection: Projection,
        c: Tensor,
        J: Tensor,
        delta: Tensor,
        scale: Tensor | None,
        normal_norm: Tensor,
        lr: float,
        refinements: int,
    ) -> None:
        """Diagnostics of this step (0-dim tensors; a pass over J for the feasibility error)."""
        device = c.device
        as_tensor = lambda value: torch.as_tensor(value, dtype=torch.float64, device=device)  # noqa: E731
        factor = self._diagnostic_factor(projection, J)
        violation = c.abs().max() if c.numel() else c.new_zeros(())
        rho = self.param_groups[0]["rho"]
        step_norm = delta.norm().to(torch.float64)
        if not self._on_host:  # (the host path checks at every step; here the rank is read on logging steps)
            self._warn_if_dependent(int(factor.rank), *J.shape, float(factor.condition))
        record.update(
            rank=factor.rank,
            gram_condition=factor.condition.to(torch.float64),
            smallest_singular_value=factor.smallest_singular_value,
            rho=as_tensor((1.0 / lr if lr > 0 else math.inf) if rho == "full" else float(rho)),
            step_norm=step_norm,
            normal_step_norm=normal_norm,
            violation_max=violation,
            violation_ratio=violation / state["initial_violation"].clamp_min(_TINY),
            refinements=as_tensor(refinements),
        )
        if c.numel() and scale is not None:
            normal = merged_step(J, projection.factor, None, 0.0, scale * c, refinements, torch.empty_like(delta),
                                 scaling=self._scaling(projection))
            normal = self._to_x(projection, normal)
            record["tangential_step_norm"] = (delta - normal).norm().to(torch.float64)
        else:
            record["tangential_step_norm"] = step_norm
        if "normal_step_capped" in state:
            record["normal_step_capped"] = state["normal_step_capped"].to(torch.float64)
        if "normal_radius" in state:
            record["normal_radius"] = state["normal_radius"]
        if lr > 0:
            record["direction_norm"] = step_norm / lr
        if c.numel() and scale is not None:
            # ||J d + rho c|| / (rho ||c||) with d = delta / lr: the relative error of the intended
            # linearized reduction J delta = -lr rho c (~1e-10 or less in float64 when healthy).
            record["linearized_feasibility_error"] = (exact_matvec(J, delta) + scale * c).norm() / (
                scale * c.norm()
            ).clamp_min(_TINY)


def _host_tensor(value: float) -> Tensor:
    """A 0-dim float64 CPU tensor holding ``value`` (for the state, on the host path)."""
    return torch.from_numpy(np.asarray(value, dtype=np.float64))
