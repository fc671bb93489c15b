r"""The imposed constraints c and their Jacobian J evaluated in float64 at the float32 parameters, and the
floors that bound how small a float32 run can make max |c|.

**Why.** A residual with second derivatives (a PDE's :math:`-\Delta u - f`) evaluated in float32 carries
an evaluation noise :math:`\delta = c_{32}(x) - c_{64}(x)` (the same weights x; docs/float32.md: max
:math:`|\delta|` 6e-6 on the Poisson task, ~5e-7 along each left singular vector of J). The normal step
:math:`-J^+ c` divides the component of c along the left singular vector :math:`u_i` by
:math:`\sigma_i`; where J J^T is ill-conditioned (cond 1.2e13 on Poisson, :math:`\sigma_{\min}` 4.5e-5),
the noise alone makes a normal step of norm ~1e-2, whose second-order remainder puts ~1e-4 back into c at
every step: max |c| stalls 20x above the floor, and the post-step corrections (the same noise, the same
division) cannot go lower. Cutting those directions off (a larger ``rcond``) leaves the real part of c
there uncorrected instead (measured: 1.2e-4 at step 500 with rcond 1e-5). With c and J from a float64
evaluation the noise is gone: the normal step shrinks to ~1e-7 and max |c| stays at a few 1e-6.

**What.** :class:`PromotedResidual` wraps a per-point residual of a module so that it runs with the
module's floating parameters and buffers cast to float64 (a differentiable cast: gradients still reach
the float32 parameters, each entry of J rounded once at the end) and its points cast to float64; it
returns float64 values. :func:`promote_parts` maps the :class:`~lit_constrained.imposed.Imposed` parts a
task's ``imposed()`` declares, so that the task's c and its per-point Jacobian (both are built from
``imposed()``) are float64 evaluations, while the objective, its gradient and every n-vector of the step
stay in float32. The optimizer keeps c in float64 and rounds J to the parameters' dtype.

**The floors** (:func:`evaluation_floor`, :func:`weight_floor`): the float32 evaluation floor
max :math:`|c_{32}(x) - c_{64}(x)|` and the weights' resolution, the median of max
:math:`|c_{64}(x') - c_{64}(x)|` over x' = every weight moved by one ulp. :func:`feasibility_finding` turns them into
the end-of-fit warning when max |c| ends above the optimizer's tolerance.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lit_constrained.batch import cast_floats
from lit_constrained.imposed import Coupled, Part
from lit_constrained.optim.hyperparameters import STATE_KEY

ConstraintDType = Literal["native", "float64"]
CONSTRAINT_DTYPES: tuple[str, ...] = ("native", "float64")

FLOOR_FACTOR = 3.0
"""max |c| within this factor of a measured floor counts as at that floor (docs/optim_measurements.md, At scale:
within ~3x of the evaluation floor the corrections act on noise)."""

WARN_AFTER_STEPS = 50
"""The end-of-fit finding is also warned (``RuntimeWarning``) from this many steps on; a shorter fit (a
smoke run) is still restoring c, and its summary line says so without a warning."""


def check_constraint_dtype(value: object) -> ConstraintDType:
    """``value`` if it is ``"native"`` or ``"float64"``; else a ValueError naming both."""
    if value not in CONSTRAINT_DTYPES:
        raise ValueError(
            f"Invalid constraint_dtype={value!r}: 'native' (c and J in the network's dtype) or 'float64' (c and "
            "J evaluated in float64 at the network's float32 weights; the objective stays float32)."
        )
    return value  # type: ignore[return-value]


class _Call(nn.Module):
    """Calls ``fn`` with ``module`` registered as a submodule, so that ``functional_call`` on this wrapper
    swaps the module's tensors (``"module.<name>"``) for the duration of the call."""

    def __init__(self, module: nn.Module, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.module = module
        # not registered: ``fn`` may be the module itself (``Imposed(self, points)``), and a module
        # registered twice is swapped twice by functional_call and restored to the swapped tensors
        object.__setattr__(self, "fn", fn)

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def promoted_tensors(module: nn.Module, dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    """The module's parameters and buffers as they are now (the swapped ones inside a ``functional_call``),
    floating ones cast to ``dtype`` (differentiably), keyed ``"module.<name>"`` for :class:`_Call`."""
    tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    return {f"module.{name}": t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t
            for name, t in tensors.items()}


def call_promoted(module: nn.Module, fn: Callable[..., Any], *args: Any, dtype: torch.dtype = torch.float64) -> Any:
    """``fn(*args)`` with the module's floating tensors cast to ``dtype`` (args passed as given)."""
    return functional_call(_Call(module, fn), promoted_tensors(module, dtype), args, strict=False)


@dataclass(frozen=True)
class PromotedResidual:
    """``residual(points)`` (or ``residual(points, data)``) evaluated in ``dtype`` (float64): the module's
    floating parameters and buffers, the points and the data's floating tensors cast to it, the values
    returned in it.

    Equal for the same (module, residual, dtype), so the per-point Jacobian engine remembers its path
    (``torch.func`` or chunked autograd) across steps. Inside that engine's ``functional_call`` the
    parameters read are the engine's, so J is the Jacobian w.r.t. the parameters it differentiates."""

    module: nn.Module = field(repr=False)
    residual: Callable[[Tensor], Tensor]
    dtype: torch.dtype = torch.float64
    _wrapper: _Call | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_wrapper", _Call(self.module, self.residual))

    def __call__(self, points: Tensor, *data: Any) -> Tensor:
        tensors = promoted_tensors(self.module, self.dtype)
        args = (points.to(self.dtype), *(cast_floats(d, self.dtype) for d in data))
        return functional_call(self._wrapper, tensors, args, strict=False)

    @property
    def __name__(self) -> str:  # (named in the per-point engine's messages)
        return getattr(self.residual, "__name__", type(self.residual).__name__)


def promote_parts(module: nn.Module, parts: Mapping[str, Part] | None, dtype: ConstraintDType = "float64",
                  ) -> dict[str, Part] | None:
    """The parts with each residual a :class:`PromotedResidual` (``dtype="float64"`` and a module that is
    not float64 already); unchanged for ``"native"`` and for a declaration with a
    :class:`~lit_constrained.imposed.Coupled` part (differentiated as one graph of c in the network's
    dtype). Use it in ``imposed()``::

        def imposed(self, batch):
            return promote_parts(self, {"pde": Imposed(self.pde_residual, batch["x_pde_imposed"])}, "float64")
    """
    check_constraint_dtype(dtype)
    if parts is None or dtype == "native" or _module_dtype(module) == torch.float64 \
            or any(isinstance(part, Coupled) for part in parts.values()):
        return None if parts is None else dict(parts)
    return {name: dataclasses.replace(part, residual=PromotedResidual(module, part.residual))
            for name, part in parts.items()}


def _module_dtype(module: nn.Module) -> torch.dtype | None:
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


# ---------------------------------------------------------------------------- floors
def constraints_at(module: Any, batch: Any, dtype: torch.dtype | None = None) -> Tensor:
    """``module.constraints(batch)`` detached and flattened; with ``dtype`` (float64) the module's floating
    tensors and the batch's floating tensors cast to it first (c64 at the same weights)."""
    with torch.enable_grad():
        if dtype is None:
            c = module.constraints(batch)
        else:
            c = call_promoted(module, module.constraints, cast_floats(batch, dtype), dtype=dtype)
    return c.detach().reshape(-1)


def evaluation_floor(module: Any, batch: Any) -> float:
    """max |c(x) - c_64(x)| at the current weights: c as the task evaluates it against c from a float64
    evaluation of the same weights and points (the rounding noise of the task's own c; ~1e-14 x |c|'s
    terms when the task evaluates c in float64 already)."""
    c = constraints_at(module, batch).to(torch.float64)
    c64 = constraints_at(module, batch, torch.float64)
    return float((c - c64).abs().max()) if c.numel() else 0.0


def weight_floor(module: Any, batch: Any, draws: int = 5, seed: int = 0,
                 dtype: torch.dtype | None = torch.float64) -> float:
    """The median over ``draws`` of max |c(x') - c(x)|, x' = every floating parameter moved by one ulp in
    a random direction: how finely the weights' dtype resolves c (no step can land between those
    weights). c is evaluated in ``dtype`` (float64: the weights' rounding alone, without the evaluation's
    own noise; None: as the task evaluates it). The parameters are restored exactly."""
    params = [p for p in module.parameters() if p.is_floating_point()]
    saved = [p.detach().clone() for p in params]
    generator = torch.Generator().manual_seed(seed)
    changes = []
    try:
        c0 = constraints_at(module, batch, dtype)
        with torch.no_grad():
            for _ in range(draws):
                for p, x in zip(params, saved):
                    real = torch.view_as_real(x) if x.is_complex() else x
                    sign = torch.randint(0, 2, real.shape, generator=generator).to(real.dtype) * 2 - 1
                    moved = torch.nextafter(real, real + sign.to(real.device))
                    p.copy_(torch.view_as_complex(moved) if x.is_complex() else moved)
                changes.append(float((constraints_at(module, batch, dtype) - c0).abs().max()))
    finally:
        with torch.no_grad():
            for p, x in zip(params, saved):
                p.copy_(x)
    return statistics.median(changes) if changes else 0.0


def constraint_tolerance(optimizer: Any) -> float | None:
    """The optimizer's feasibility tolerance, ``constraint_tol * max(max |c_1|, 1)`` (c_1: the first
    step's constraints), or None for an optimizer without one (torch.optim's, or before its first step)."""
    groups = getattr(optimizer, "param_groups", None)
    if not groups or "constraint_tol" not in groups[0]:
        return None
    state = getattr(optimizer, "state", {}).get(STATE_KEY, {})
    start = state.get("initial_violation") if isinstance(state, dict) else None
    if start is None:
        return None
    return float(groups[0]["constraint_tol"]) * max(float(start), 1.0)


def _evaluates_float64(module: Any, batch: Any) -> bool:
    """Whether the task's own c is float64 (promoted residuals, or a float64 network)."""
    return constraints_at(module, batch).dtype == torch.float64


def feasibility_finding(module: Any, batch: Any, end: float | None, optimizer: Any) -> str | None:
    """The end-of-fit finding when max |c| = ``end`` is above the optimizer's tolerance: the measured
    floors and the fix; None when it is within the tolerance (or there is none to compare with)."""
    tol = constraint_tolerance(optimizer)
    if end is None or tol is None or not end > tol:
        return None
    failure = ""
    try:
        floor: float | None = evaluation_floor(module, batch)
        weights = weight_floor(module, batch)
    except (RuntimeError, TypeError) as error:  # a network that does not run in float64 as a whole (an FNO's FFTs)
        floor, weights = None, weight_floor(module, batch, dtype=None)
        failure = f" ({type(error).__name__}: {(str(error).splitlines() or [''])[0][:120]})"
    head = (f"the imposed constraints end at max |c| = {end:.2e}, above the optimizer's tolerance {tol:.2e} "
            f"(constraint_tol x max(max |c_1|, 1))")
    measured = (f"the network does not run in float64 as a whole{failure}, so no float64 floor" if floor is None else
                f"the evaluation floor max |c - c_64| at the final weights is {floor:.2e}")
    floors = f"{measured}; one ulp of every weight moves c by {weights:.2e}"
    native = floor is not None and not _evaluates_float64(module, batch)
    if end <= FLOOR_FACTOR * weights:
        fix = ("the weights' dtype cannot resolve c more finely: train the network in float64 (e.g. the task's "
               "dtype='float64') or accept this floor")
    elif native:
        where = "at the float32 evaluation floor" if end <= FLOOR_FACTOR * floor else "above the float32 floors"
        fix = (f"max |c| is {where}: evaluate c and J in float64 (constraint_dtype='float64', the module's default for "
               "imposed() parts; a task overriding constraints() casts its own): an ill-conditioned "
               "J amplifies the float32 noise of c into the normal step (docs/float32.md)")
    else:
        fix = ("not a precision floor: allow more post-step corrections (max_corrections), a smaller lr, more "
               "steps, or check the rank warning")
    return f"{head}; {floors}: {fix}."
