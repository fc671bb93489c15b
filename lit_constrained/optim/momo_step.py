r"""The MoMo step shared by :class:`~lit_constrained.optim.momo.MoMo` and
:class:`~lit_constrained.optim.momo.MoMoAdam` (:class:`_MoMoBase`): one model of the one loss over all
parameter groups, its scalars on the device, the rules of :mod:`~lit_constrained.optim.momo_rules`.

Several parameter groups. :math:`\bar f, \gamma, \langle d, x\rangle` and :math:`\|d\|^2_{D^{-1}}` are
sums over ALL parameters (one model of the one loss), so the momentum / betas, ``lower_bound``,
``estimate_lower_bound``, ``bias_correction`` and ``check_finite`` must be the same in every group (a
``ValueError`` names the key otherwise). Each group i gets its own
:math:`\tau_i = \min\{\alpha_i/\rho_k, \zeta_i\}` from its own lr :math:`\alpha_i` and weight decay
:math:`\lambda_i` (and, for MoMo-Adam, its own eps in :math:`D` and its own ``decoupled_weight_decay``);
with equal lr and weight decay in all groups this is exactly the paper's single step size. ResetStar is
applied group after group (each can only lower :math:`f^*`), and EstimateStar uses
:math:`\sum_i \tau_i \|d_i\|^2_{D^{-1}}` in place of :math:`\tau_k \|d_k\|^2_{D^{-1}}`.

torch.optim conventions:

* Every hyperparameter is in ``defaults`` and each param group (``repr`` shows them,
  ``load_state_dict`` restores the saved ones). MoMo's :math:`\beta` is the group key ``momentum`` and
  MoMo-Adam's :math:`(\beta_1, \beta_2)` the key ``betas``, so ``OneCycleLR`` / ``CyclicLR(cycle_momentum=True)``
  can drive them and Lightning's ``LearningRateMonitor(log_momentum=True)`` reads them. A scheduled
  :math:`\beta_k` enters the averages step by step; the bias correction uses the current one,
  :math:`\rho_k = 1 - \beta_k^k`, as torch's Adam does.
* ``step(closure, *, diagnostics=False)``: the closure returns the (already back-propagated) loss.
  ``optimizer.diagnostics`` is a dict of 0-dim tensors, filled only on the steps called with
  ``diagnostics=True`` and emptied on the others: ``tau``, ``zeta`` (the step size and the adaptive
  term; ``tau/group<i>``, ``zeta/group<i>`` with several groups) and ``lower_bound_used`` (the
  :math:`f^*_k` this step used, after ResetStar).
* ``optimizer.state`` holds exactly what resuming needs, in the package's convention
  (:mod:`~lit_constrained.optim.state`): ``state["global"]`` with ``step`` (k, an int),
  ``loss_avg`` (:math:`\bar f_k`), ``gamma`` (:math:`\gamma_k`) and ``lower_bound`` (:math:`f^*_{k+1}`),
  0-dim float64 tensors on the parameters' device, read directly (``opt.state["global"]["lower_bound"]`` is the
  current estimate of :math:`f^*`), and the per-parameter moments. ``state_dict()`` /
  ``load_state_dict()`` resume the exact trajectory.

No host sync: the inner products are taken per tensor in the parameter dtype and summed in float64
on the device, and :math:`\bar f, \gamma, f^*, \zeta, \tau` stay 0-dim device tensors (the step is
applied with a tensor factor), so a step never waits for the device. Hence, as in ``torch.optim``,
a NaN/inf loss or gradient is not detected by default: it propagates into the parameters. With
``check_finite=True`` the step reads one flag (:math:`f` and :math:`\langle g, x\rangle` finite) and
raises ``ValueError`` before anything is changed; the package's ``TrainingStepper`` checks the loss
and gradients itself (``on_nonfinite``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.optimizer import ParamsT

from lit_constrained.jacobians import real_view

from .autocast import outside_autocast
from .checks import all_finite, check_finite, check_lr, check_shared_keys, loss_from_closure
from .momo_rules import adaptive_step, estimate_lower_bound, reset_lower_bound
from .state import STATE_KEY, rename_momo_state

GLOBAL_KEY = STATE_KEY
"""The ``optimizer.state`` key of the loss model's scalars (``step``, ``loss_avg``, ``gamma``, ``lower_bound``):
the package's shared entry, ``state["global"]`` (:mod:`~lit_constrained.optim.state`)."""


# ---------------------------------------------------------------------------- tensor helpers


def _dot_sum(a: list[Tensor], b: list[Tensor], dtype: torch.dtype) -> Tensor:
    r""":math:`\sum_i \langle a_i, b_i\rangle` as a 0-dim ``dtype`` tensor, on the device.

    One dot per tensor in the tensors' dtype (BLAS), summed in ``dtype`` (torch has no multi-tensor dot).
    """
    dots = [_dot(x, y) for x, y in zip(a, b)]
    if len(dots) == 1:
        return dots[0].to(dtype)
    return torch.stack(dots).to(dtype).sum()


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return torch.dot(_flat(a), _flat(b))


def _flat(t: Tensor) -> Tensor:
    """``t`` as a vector (a view where the layout allows)."""
    return t if t.dim() == 1 else t.reshape(-1)


def _model_dots(
    params: list[Tensor], grads: list[Tensor], directions: list[Tensor], work: list[Tensor]
) -> list[Tensor]:
    r"""Per tensor :math:`\langle g, x\rangle, \langle d, x\rangle, \langle d, U\rangle` (interleaved, in the
    tensors' dtype), every tensor flattened once. torch has no multi-tensor dot: one BLAS dot each."""
    dots = []
    for x, g, d, u in zip(params, grads, directions, work):
        x, g, d, u = _flat(x), _flat(g), _flat(d), _flat(u)
        dots += [torch.dot(g, x), torch.dot(d, x), torch.dot(d, u)]
    return dots


def _device_scalar(value: Any, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A stored scalar as a 0-dim tensor on the step's device (a no-op for the state's own tensors;
    Python floats come from checkpoints of the earlier layout)."""
    if isinstance(value, Tensor) and value.dtype == dtype and value.device == device:
        return value
    return torch.as_tensor(value, dtype=dtype, device=device)


def _scalar_dtype(device: torch.device) -> torch.dtype:
    """float64 for the loss model's scalars, except on MPS (no float64 there)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _diagnostic_name(key: str, index: int, several: bool) -> str:
    """``key`` with one param group, ``key/group<i>`` with several (as the step-size monitor logs them)."""
    return f"{key}/group{index}" if several else key


@dataclass
class _Group:
    """The tensors of one parameter group that take part in this step (real views)."""

    index: int
    group: dict[str, Any]
    tensors: list[Tensor]
    params: list[Tensor]
    grads: list[Tensor]
    states: list[dict[str, Tensor]]


# ---------------------------------------------------------------------------- the shared step


class _MoMoBase(Optimizer, ABC):
    """The MoMo step shared by :class:`MoMo` and :class:`MoMoAdam` (this module's docstring)."""

    requires: frozenset[str] = frozenset()
    shared_keys: tuple[str, ...] = ("lower_bound", "estimate_lower_bound", "check_finite")
    """Hyperparameters of the one loss model: equal in all param groups (checked at every step)."""

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        super().__init__(params, defaults)
        self.diagnostics: dict[str, Tensor] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # torch pickles defaults, state and param_groups only
        self.__dict__.setdefault("diagnostics", {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``; checkpoints of the earlier layouts resume too: the scalars in
        ``state["momo"]`` (:func:`~lit_constrained.optim.state.rename_momo_state`), and before that Python
        floats and per-group ``"group<i>"`` entries holding the last tau and zeta (dropped: stale)."""
        super().load_state_dict(rename_momo_state(state_dict))
        for key in [key for key in self.state if isinstance(key, str) and key != GLOBAL_KEY]:
            del self.state[key]
        self.state.get(GLOBAL_KEY, {}).pop("lower_bound_used", None)

    # -- subclass hooks
    @abstractmethod
    def _beta(self, group: dict[str, Any]) -> float:
        """beta (MoMo's ``momentum``) or beta1 (MoMo-Adam) of the group."""

    @abstractmethod
    def _rho(self, k: int, group: dict[str, Any]) -> float:
        """The bias-correction factor rho_k."""

    def _first_weight(self, k: int, group: dict[str, Any]) -> float:
        """The averaging weight of the new sample (1 at k = 1 when the averages start at the sample)."""
        return 1.0 - self._beta(group)

    @abstractmethod
    def _init_param_state(self, p: Tensor) -> dict[str, Tensor]:
        """The per-parameter state at the first step."""

    @abstractmethod
    def _moments_and_dots(self, k: int, g: _Group, weight: float) -> tuple[list[Tensor], float, list[Tensor]]:
        """Update the moments of one group; return (U, s, dots) with D^{-1} d = s * U and, per tensor
        of the group, the inner products <g, x>, <d, x>, <d, U> (in that order, interleaved: see
        :func:`_model_dots`)."""

    @abstractmethod
    def _apply(self, g: _Group, step: Tensor, direction: list[Tensor]) -> None:
        """x <- the update of one group: x + step * direction (step = -tau s, a 0-dim tensor), with decay."""

    # -- the step
    @torch.no_grad()
    def _collect(self) -> list[_Group]:
        groups = []
        for i, group in enumerate(self.param_groups):
            tensors, params, grads, states = [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError(f"{type(self).__name__} does not support sparse gradients.")
                state = self.state[p]
                if not state:
                    state.update(self._init_param_state(p))
                tensors.append(p)
                if p.is_complex():
                    params.append(real_view(p))
                    grads.append(real_view(p.grad))
                    states.append({key: real_view(t) for key, t in state.items()})
                else:
                    params.append(p)
                    grads.append(p.grad)
                    states.append(state)
            if params:
                groups.append(_Group(i, group, tensors, params, grads, states))
        return groups

    def _check_groups(self) -> None:
        for group in self.param_groups:
            check_lr(group["lr"])
        check_shared_keys(type(self).__name__, self.param_groups, self.shared_keys, "the one model of the loss")

    @outside_autocast
    def step(self, closure: Callable[[], Any] | None = None, *, diagnostics: bool = False) -> Any:
        """One MoMo step. ``closure`` returns the loss value (it is called once, under grad mode).

        ``diagnostics=True`` fills ``optimizer.diagnostics`` (0-dim tensors, no host sync); otherwise it
        is emptied. Returns the closure's value.
        """
        self.diagnostics = {}
        value, loss = loss_from_closure(type(self).__name__, closure, "step(closure)")
        self._check_groups()
        with torch.no_grad():
            self._step(loss.detach().reshape(()), diagnostics)
        return value

    @torch.no_grad()
    def _step(self, loss: Tensor, diagnostics: bool) -> None:
        groups = self._collect()
        if not groups:
            return
        first = self.param_groups[0]
        device = groups[0].params[0].device
        dtype = _scalar_dtype(device)
        previous = self.state.get(GLOBAL_KEY)
        k = 1 if previous is None else int(previous["step"]) + 1
        rho = self._rho(k, first)
        weight = self._first_weight(k, first)
        floor = float(first["lower_bound"])
        estimate = bool(first["estimate_lower_bound"])
        f_star: Tensor | float = floor
        if estimate and previous is not None:
            f_star = _device_scalar(previous["lower_bound"], dtype, device)

        # 1. the loss (and, when asked, the finiteness check before anything changes: the one host sync)
        f = loss.to(device=device, dtype=dtype)
        if first["check_finite"]:
            gx = _dot_sum([t for g in groups for t in g.grads], [p for g in groups for p in g.params], dtype)
            if not all_finite(torch.stack([f, gx])):  # the one host sync; the failure path names the culprit
                check_finite(f"{type(self).__name__}: the loss", f)
                check_finite(f"{type(self).__name__}: <g, x> (the gradient or the parameters)", gx)

        # 2. moments, then all inner products in one table: <g, x>, <d, x>, <d, D^-1 d> / s per tensor
        directions, scales, sizes, dots = [], [], [], []
        for g in groups:
            u, s, group_dots = self._moments_and_dots(k, g, weight)
            directions.append(u)
            scales.append(s)
            sizes.append(len(u))
            dots += group_dots
        table = torch.stack(dots).view(-1, 3)  # columns: <g, x>, <d, x>, <d, U>; a row per tensor
        if len(groups) == 1:
            gx, d_dot_x, du = table.sum(0, dtype=dtype).unbind()
            dnorms = [scales[0] * du]
        else:
            gx, d_dot_x = table[:, :2].sum(0, dtype=dtype).unbind()
            dnorms = [s * part.sum(dtype=dtype) for s, part in zip(scales, table[:, 2].split(sizes))]
        d_norm_sq = dnorms[0] if len(dnorms) == 1 else torch.stack(dnorms).sum()
        if previous is None:  # the averages start at 0 (or, weight 1, at the first sample)
            loss_avg, gamma = f * weight, gx * weight
        else:
            loss_avg = torch.lerp(_device_scalar(previous["loss_avg"], dtype, device), f, weight)
            gamma = torch.lerp(_device_scalar(previous["gamma"], dtype, device), gx, weight)

        # 3. ResetStar, step sizes, update
        model = dict(rho=rho, loss_avg=loss_avg, gamma=gamma, d_dot_x=d_dot_x)
        if estimate:
            for g in groups:
                lr, wd = float(g.group["lr"]), float(g.group["weight_decay"])
                f_star = reset_lower_bound(f_star, floor, lr=lr, weight_decay=wd, **model)
        taus, zetas = [], []
        for g, u, s in zip(groups, directions, scales):
            lr, wd = float(g.group["lr"]), float(g.group["weight_decay"])
            tau, zeta = adaptive_step(lr=lr, weight_decay=wd, d_norm_sq=d_norm_sq, lower_bound=f_star, **model)
            self._apply(g, (tau if s == -1.0 else tau * -s).to(u[0].dtype), u)
            taus.append(tau)
            zetas.append(zeta)

        # 4. EstimateStar, record
        used = f_star
        if estimate:
            tau_dnorm = sum((t * n for t, n in zip(taus[1:], dnorms[1:])), taus[0] * dnorms[0])
            f_star = estimate_lower_bound(floor, tau_d_norm_sq=tau_dnorm, **model)
        self.state[GLOBAL_KEY] = {
            "step": k,
            "loss_avg": loss_avg,
            "gamma": gamma,
            "lower_bound": f_star if isinstance(f_star, Tensor) else torch.full((), f_star, dtype=dtype, device=device),
        }
        if diagnostics:
            several = len(self.param_groups) > 1
            for g, tau, zeta in zip(groups, taus, zetas):
                self.diagnostics[_diagnostic_name("tau", g.index, several)] = tau
                self.diagnostics[_diagnostic_name("zeta", g.index, several)] = zeta
            if not isinstance(used, Tensor):
                used = torch.full((), used, dtype=dtype, device=device)
            self.diagnostics["lower_bound_used"] = used


def _add_scaled_(params: list[Tensor], direction: list[Tensor], step: Tensor) -> None:
    """x_i += step * u_i for every tensor, with a 0-dim tensor factor (no host sync)."""
    torch._foreach_addcmul_(params, direction, [step] * len(params))
