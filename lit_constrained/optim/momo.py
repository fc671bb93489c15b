r"""MoMo and MoMo-Adam: model-based momentum with an adaptive (Polyak-type) step size.

Schaipp, Ohana, Eickenberg, Defazio, Gower, "MoMo: Momentum Models for Adaptive Learning Rates"
(arXiv 2305.07583), Algorithms 1, 2, 5 and Lemma 3.1; the online lower bound of Algorithms 3, 4.

With loss value :math:`f_k`, gradient :math:`g_k`, user learning rate :math:`\alpha_k`, weight decay
:math:`\lambda \ge 0` and a lower bound :math:`f^*_k` of the loss, MoMo keeps exponential averages

.. math::
    \bar f_k = (1-\beta) f_k + \beta \bar f_{k-1}, \quad
    \gamma_k = (1-\beta) \langle g_k, x_k\rangle + \beta \gamma_{k-1}, \quad
    d_k = (1-\beta) g_k + \beta d_{k-1},

which define a truncated model of the loss, :math:`\max\{\rho_k^{-1}(\bar f_k + \langle d_k, y\rangle
- \gamma_k), f^*_k\}`. Its proximal step (Lemma 3.1) is

.. math::
    \zeta_k = \frac{\big((1+\alpha_k\lambda)(\bar f_k - \rho_k f^*_k - \gamma_k)
              + \langle d_k, x_k\rangle\big)_+}{\|d_k\|^2_{D_k^{-1}}}, \qquad
    \tau_k = \min\{\alpha_k / \rho_k, \zeta_k\}, \qquad
    x_{k+1} = \frac{x_k - \tau_k D_k^{-1} d_k}{1 + \alpha_k \lambda}.

The user lr caps the adaptive step :math:`\zeta_k` (so a tiny lr gives plain SGD-M / Adam), and
:math:`\tau_k` shows an automatic warm-up and decay.

* :class:`MoMo`: :math:`D_k = I`. Without bias correction :math:`\rho_k = 1` and the averages start at the
  first sample (:math:`\bar f_0 = f_1, d_0 = g_1, \gamma_0 = \langle g_1, x_1\rangle`); with
  ``bias_correction=True`` (MoMo-Bias, Algorithm 5) they start at 0 and :math:`\rho_k = 1 - \beta^k`.
* :class:`MoMoAdam`: always bias-corrected, :math:`\rho_k = 1 - \beta_1^k`, and Adam's preconditioner
  :math:`v_k = \beta_2 v_{k-1} + (1-\beta_2) g_k \odot g_k`,
  :math:`D_k = \mathrm{diag}(\epsilon + \sqrt{v_k / (1-\beta_2^k)})` (eps outside the root).
  ``decoupled_weight_decay=True`` is the AdamW-style rule of the paper's appendix A.2:
  :math:`x_{k+1} = (1 - \lambda\alpha_k) x_k - \tau_k D_k^{-1} d_k`, :math:`\tau_k` unchanged.

Online lower bound (``estimate_lower_bound=True``, MoMo* / MoMo-Adam*). The user's ``lower_bound`` is
:math:`f^*_1` and the floor. With :math:`h^\lambda_k = (1+\alpha_k\lambda)(\bar f_k - \gamma_k)
+ \langle d_k, x_k\rangle` and :math:`h_k = \bar f_k + \langle d_k, x_k\rangle - \gamma_k`:

.. math::
    \text{ResetStar (before the update): if } (1+\alpha_k\lambda)\rho_k f^*_k \ge h^\lambda_k:\
        f^*_k \leftarrow \max\Big\{\frac{h^\lambda_k}{2(1+\alpha_k\lambda)\rho_k}, f^*_1\Big\}

    \text{EstimateStar (after the update): }
        f^*_{k+1} = \max\Big\{\frac{h_k - \tfrac12 \tau_k \|d_k\|^2_{D_k^{-1}}}{\rho_k}, f^*_1\Big\}.

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
* ``optimizer.state`` holds exactly what resuming needs: ``state["momo"]`` with ``step`` (k, an int),
  ``loss_avg`` (:math:`\bar f_k`), ``gamma`` (:math:`\gamma_k`) and ``lower_bound`` (:math:`f^*_{k+1}`),
  0-dim float64 tensors on the parameters' device, read directly (``opt.state["momo"]["lower_bound"]`` is the
  current estimate of :math:`f^*`), and the per-parameter moments. ``state_dict()`` /
  ``load_state_dict()`` resume the exact trajectory.

Details:

* The loss value comes from the closure: ``loss.backward(); opt.step(lambda: loss)``. In data-parallel
  training it must be the mean over ranks (the package's stepper does this), else replicas drift apart.
* No host sync: the inner products are taken per tensor in the parameter dtype and summed in float64
  on the device, and :math:`\bar f, \gamma, f^*, \zeta, \tau` stay 0-dim device tensors (the step is
  applied with a tensor factor), so a step never waits for the device. Hence, as in ``torch.optim``,
  a NaN/inf loss or gradient is not detected by default: it propagates into the parameters. With
  ``check_finite=True`` the step reads one flag (:math:`f` and :math:`\langle g, x\rangle` finite) and
  raises ``ValueError`` before anything is changed; the package's ``TrainingStepper`` checks the loss
  and gradients itself (``on_nonfinite``).
* Passes over memory (MoMo-Adam). :math:`\tau_k` needs three sums over the new :math:`d_k, D_k`
  (:math:`\langle g, x\rangle, \langle d, x\rangle, \|d\|^2_{D^{-1}}`) before any :math:`x` moves, so the
  step needs two passes at least: 10 n-vector reads and writes (read x, g, d, v and write d, v,
  :math:`D^{-1} d`; read x, :math:`D^{-1} d` and write x), against 7 for Adam. With ``fused`` (the
  default where it applies) torch's fused Adam kernel forms :math:`d, v, -D^{-1} d` in one pass over a
  zeroed workspace; the three sums (a BLAS dot per tensor) and the update follow: 17 in all (torch's
  multi-tensor Adam: 18; the reference multi-tensor ops: 24). ``benchmarks/bench_momo.py`` times them
  against the bound.
* A zero direction (:math:`\|d_k\| = 0`) gives :math:`\tau_k = \zeta_k = 0` and a zero step (with weight
  decay the shrinkage :math:`x/(1+\alpha\lambda)` still applies, as it is the exact proximal step).
* Parameters whose ``.grad`` is None are left out of the step (not moved, moments untouched), as in
  torch's optimizers. Complex parameters are treated as pairs of reals.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.optimizer import ParamsT

from .autocast import outside_autocast
from .checks import (
    all_finite,
    check_beta,
    check_betas,
    check_finite,
    check_lr,
    check_positive,
    check_shared_keys,
    loss_from_closure,
)
from .flat import real_view

GLOBAL_KEY = "momo"
"""The ``optimizer.state`` key of the loss model's scalars (``step``, ``loss_avg``, ``gamma``, ``lower_bound``)."""


# ---------------------------------------------------------------------------- scalar rules (0-dim tensors)


def adaptive_step(
    *,
    lr: float,
    weight_decay: float,
    rho: float,
    loss_avg: Tensor,
    gamma: Tensor,
    d_dot_x: Tensor,
    d_norm_sq: Tensor,
    lower_bound: Tensor | float,
) -> tuple[Tensor, Tensor]:
    r"""``(tau, zeta)`` of Lemma 3.1: :math:`\tau = \min\{\alpha/\rho, \zeta\}`; (0, 0) when d = 0.

    :math:`\zeta = ((1+\alpha\lambda)(\bar f - \gamma - \rho f^*) + \langle d, x\rangle)_+ / \|d\|^2_{D^{-1}}`,
    computed on the device (no host sync).
    """
    scale = 1.0 + lr * weight_decay
    offset = loss_avg - gamma
    if isinstance(lower_bound, Tensor) or lower_bound != 0.0:  # (f* = 0, the default: one op fewer)
        offset = offset - rho * lower_bound
    gap = torch.add(d_dot_x, offset, alpha=scale)
    zeta = torch.where(d_norm_sq > 0.0, gap.clamp_min(0.0) / d_norm_sq, 0.0)  # (0/0 in the masked lane only)
    return zeta.clamp(max=lr / rho), zeta


def reset_lower_bound(
    lower_bound: Tensor | float,
    floor: float,
    *,
    lr: float,
    weight_decay: float,
    rho: float,
    loss_avg: Tensor,
    gamma: Tensor,
    d_dot_x: Tensor,
) -> Tensor:
    r"""ResetStar (Algorithm 3): lower :math:`f^*_k` when it would make :math:`\zeta_k = 0`.

    If :math:`(1+\alpha\lambda)\rho f^* \ge h^\lambda`, :math:`f^* \leftarrow \max\{h^\lambda / (2(1+\alpha\lambda)\rho), f^*_1\}`.
    """
    scale = 1.0 + lr * weight_decay
    h_lam = scale * (loss_avg - gamma) + d_dot_x
    lowered = (h_lam / (2.0 * scale * rho)).clamp_min(floor)
    return torch.where(scale * rho * lower_bound >= h_lam, lowered, lower_bound)


def estimate_lower_bound(
    floor: float, *, rho: float, loss_avg: Tensor, gamma: Tensor, d_dot_x: Tensor, tau_d_norm_sq: Tensor
) -> Tensor:
    r"""EstimateStar (Algorithm 4): :math:`f^*_{k+1} = \max\{(h_k - \tau_k\|d_k\|^2_{D^{-1}}/2)/\rho_k, f^*_1\}`."""
    h = loss_avg + d_dot_x - gamma
    return ((h - 0.5 * tau_d_norm_sq) / rho).clamp_min(floor)


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
    """The MoMo step shared by :class:`MoMo` and :class:`MoMoAdam` (see the module docstring)."""

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
        """torch's ``load_state_dict``; a checkpoint of the earlier layout (Python floats, per-group
        ``"group<i>"`` entries holding the last tau and zeta) resumes too, without those stale entries."""
        super().load_state_dict(state_dict)
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


# ---------------------------------------------------------------------------- MoMo


class MoMo(_MoMoBase):
    r"""MoMo: SGD with momentum and the MoMo adaptive step size (Algorithms 1 and 5, Lemma 3.1, D = I).

    .. math::
        \tau_k = \min\Big\{\frac{\alpha_k}{\rho_k},
            \frac{((1+\alpha_k\lambda)(\bar f_k - \rho_k f^*_k - \gamma_k) + \langle d_k, x_k\rangle)_+}
                 {\|d_k\|^2}\Big\}, \qquad
        x_{k+1} = \frac{x_k - \tau_k d_k}{1 + \alpha_k\lambda},

    with :math:`\rho_k = 1` (averages start at the first sample) or, with ``bias_correction``,
    :math:`\rho_k = 1 - \beta^k` (averages start at 0). With a small lr the cap is active and MoMo is
    ``torch.optim.SGD(momentum=beta, dampening=beta)``; with ``momentum = 0`` it is SPS_max. See the
    module docstring for the online lower bound, parameter groups and diagnostics.

    Args:
        params: parameters or parameter groups (per group: ``lr``, ``weight_decay``).
        lr: the user learning rate :math:`\alpha`, the cap of the adaptive step (default 1.0, the
            paper's: with a small cap MoMo is plain SGD with momentum).
        momentum: :math:`\beta \in [0, 1)`, the averaging weight of the loss model (the group key
            ``momentum``, so momentum schedulers drive it), the same in all groups.
        weight_decay: :math:`\lambda \ge 0` (a proximal l2 term, kept out of the loss model).
        lower_bound: a lower bound :math:`f^*` of the loss (0 for most losses); with
            ``estimate_lower_bound`` the start value and floor of the online estimate. May be negative.
        estimate_lower_bound: estimate :math:`f^*` online (MoMo*).
        bias_correction: MoMo-Bias (Algorithm 5).
        check_finite: raise on a NaN/inf loss or gradient, at the cost of one host sync per step.
    """

    shared_keys = ("momentum", "lower_bound", "estimate_lower_bound", "bias_correction", "check_finite")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        lower_bound: float = 0.0,
        estimate_lower_bound: bool = False,
        bias_correction: bool = False,
        check_finite: bool = False,
    ) -> None:
        check_lr(lr)
        check_beta("momentum", momentum)
        _check_common(weight_decay, lower_bound, estimate_lower_bound, check_finite)
        if not isinstance(bias_correction, bool):
            raise ValueError(f"Invalid bias_correction={bias_correction!r}: it must be True or False.")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            lower_bound=lower_bound,
            estimate_lower_bound=estimate_lower_bound,
            bias_correction=bias_correction,
            check_finite=check_finite,
        )
        super().__init__(params, defaults)

    def _beta(self, group: dict[str, Any]) -> float:
        return float(group["momentum"])

    def _rho(self, k: int, group: dict[str, Any]) -> float:
        return 1.0 - float(group["momentum"]) ** k if group["bias_correction"] else 1.0

    def _first_weight(self, k: int, group: dict[str, Any]) -> float:
        if k == 1 and not group["bias_correction"]:
            return 1.0  # fbar_0 = f_1, d_0 = g_1, gamma_0 = <g_1, x_1>
        return 1.0 - float(group["momentum"])

    def _init_param_state(self, p: Tensor) -> dict[str, Tensor]:
        return {"grad_avg": torch.zeros_like(p, memory_format=torch.preserve_format)}

    def _moments_and_dots(self, k: int, g: _Group, weight: float) -> tuple[list[Tensor], float, list[Tensor]]:
        directions = [state["grad_avg"] for state in g.states]
        torch._foreach_lerp_(directions, g.grads, weight)
        return directions, 1.0, _model_dots(g.params, g.grads, directions, directions)

    def _apply(self, g: _Group, step: Tensor, direction: list[Tensor]) -> None:
        shrink = 1.0 + float(g.group["lr"]) * float(g.group["weight_decay"])
        _add_scaled_(g.params, direction, step)
        if shrink != 1.0:
            torch._foreach_mul_(g.params, 1.0 / shrink)


# ---------------------------------------------------------------------------- MoMo-Adam


class MoMoAdam(_MoMoBase):
    r"""MoMo-Adam: Adam with the MoMo adaptive step size (Algorithm 2, Lemma 3.1).

    .. math::
        d_k = (1-\beta_1) g_k + \beta_1 d_{k-1}, \quad
        v_k = \beta_2 v_{k-1} + (1-\beta_2) g_k \odot g_k, \quad
        D_k = \mathrm{diag}\big(\epsilon + \sqrt{v_k/(1-\beta_2^k)}\big),

        \tau_k = \min\Big\{\frac{\alpha_k}{\rho_k},
            \frac{((1+\alpha_k\lambda)(\bar f_k - \rho_k f^*_k - \gamma_k) + \langle d_k, x_k\rangle)_+}
                 {\sum_i d_{k,i}^2 / D_{k,ii}}\Big\}, \quad \rho_k = 1 - \beta_1^k,

        x_{k+1} = \frac{x_k - \tau_k D_k^{-1} d_k}{1+\alpha_k\lambda}
        \quad\text{or (decoupled)}\quad x_{k+1} = (1-\lambda\alpha_k) x_k - \tau_k D_k^{-1} d_k.

    :math:`\bar f, \gamma, d, v` start at 0. With a small lr the cap is active and MoMo-Adam is
    ``torch.optim.Adam`` (or AdamW with ``decoupled_weight_decay``). See the module docstring for the
    online lower bound, parameter groups (per group: ``lr``, ``weight_decay``, ``eps``,
    ``decoupled_weight_decay``) and diagnostics.

    Args:
        params: parameters or parameter groups.
        lr: the user learning rate :math:`\alpha` (default 1e-2, the paper's), the cap of the adaptive step.
        betas: :math:`(\beta_1, \beta_2)`, the same in all groups.
        eps: :math:`\epsilon > 0`, added outside the square root.
        weight_decay: :math:`\lambda \ge 0`.
        lower_bound: a lower bound :math:`f^*` of the loss; with ``estimate_lower_bound`` the start value
            and floor of the online estimate. May be negative.
        estimate_lower_bound: estimate :math:`f^*` online (MoMo-Adam*).
        decoupled_weight_decay: AdamW-style decay (appendix A.2) instead of the proximal one.
        check_finite: raise on a NaN/inf loss or gradient, at the cost of one host sync per step.
        fused: how the moments and :math:`D^{-1} d` are formed, per group. ``None`` (default): in one
            pass over memory by torch's fused Adam kernel where it applies (CPU, float32 or float64,
            contiguous tensors of one dtype per group), else by the reference multi-tensor ops;
            ``False``: always the reference ops; ``True``: always the kernel (a ``ValueError`` says why
            where it does not apply). Both give the same iterates up to round-off.
    """

    shared_keys = ("betas", "lower_bound", "estimate_lower_bound", "check_finite")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        lower_bound: float = 0.0,
        estimate_lower_bound: bool = False,
        decoupled_weight_decay: bool = False,
        check_finite: bool = False,
        fused: bool | None = None,
    ) -> None:
        check_lr(lr)
        check_betas(tuple(betas))
        check_positive("eps", eps)
        _check_common(weight_decay, lower_bound, estimate_lower_bound, check_finite)
        if not isinstance(decoupled_weight_decay, bool):
            raise ValueError(
                f"Invalid decoupled_weight_decay={decoupled_weight_decay!r}: it must be True or False."
            )
        if fused not in (None, True, False):
            raise ValueError(f"Invalid fused={fused!r}: it must be None, True or False.")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            lower_bound=lower_bound,
            estimate_lower_bound=estimate_lower_bound,
            decoupled_weight_decay=decoupled_weight_decay,
            check_finite=check_finite,
            fused=fused,
        )
        super().__init__(params, defaults)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # also load_state_dict's last call: groups saved before ``fused`` existed
        for group in self.param_groups:
            group.setdefault("fused", None)

    def _beta(self, group: dict[str, Any]) -> float:
        return float(group["betas"][0])

    def _rho(self, k: int, group: dict[str, Any]) -> float:
        return 1.0 - float(group["betas"][0]) ** k

    def _init_param_state(self, p: Tensor) -> dict[str, Tensor]:
        return {
            "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
        }

    def _moments_and_dots(self, k: int, g: _Group, weight: float) -> tuple[list[Tensor], float, list[Tensor]]:
        work = self._workspace(g)
        exp_avgs = [state["exp_avg"] for state in g.states]
        exp_avg_sqs = [state["exp_avg_sq"] for state in g.states]
        if _use_fused(g, k):
            _fused_moments(k, g, exp_avgs, exp_avg_sqs, work)
            scale = -1.0  # work = -D^{-1} d
        else:
            scale = _reference_moments(k, g, exp_avgs, exp_avg_sqs, work)
        return work, scale, _model_dots(g.params, g.grads, exp_avgs, work)

    def _workspace(self, g: _Group) -> list[Tensor]:
        """One scratch tensor per parameter (the real view's shape), reused across steps."""
        store: dict[Tensor, Tensor] | None = self.__dict__.get("_scratch")
        if store is None:
            store = self.__dict__["_scratch"] = {}
        out = []
        for p, x in zip(g.tensors, g.params):
            w = store.get(p)
            if w is None or w.shape != x.shape or w.dtype != x.dtype or w.device != x.device:
                w = store[p] = torch.empty_like(x, memory_format=torch.contiguous_format)
            out.append(w)
        return out

    def _apply(self, g: _Group, step: Tensor, direction: list[Tensor]) -> None:
        lr, wd = float(g.group["lr"]), float(g.group["weight_decay"])
        if wd != 0.0 and g.group["decoupled_weight_decay"]:
            torch._foreach_mul_(g.params, 1.0 - wd * lr)
            _add_scaled_(g.params, direction, step)
            return
        _add_scaled_(g.params, direction, step)
        if wd != 0.0:
            torch._foreach_mul_(g.params, 1.0 / (1.0 + lr * wd))


# ---------------------------------------------------------------------------- MoMo-Adam's moments and D^-1 d

FUSED_DTYPES = (torch.float32, torch.float64)
"""Where torch's fused Adam kernel forms MoMo-Adam's moments and :math:`D^{-1} d`: float32 and float64 on
the CPU, where it is tested (torch has it for half precision and on CUDA too; there the multi-tensor
reference ops run)."""

FUSED_MAX_STEP = 2**24
"""The kernel reads the step count k as float32, exact up to here; later steps take the reference pass."""


def _fused_unsupported(g: _Group, k: int) -> str | None:
    """Why the fused pass cannot serve this group at step k (None when it can). Checked at every step,
    cheaply (``is_cpu``, ``dtype``, ``is_contiguous`` of each tensor): the kernel walks raw memory."""
    dtype = g.params[0].dtype
    if dtype not in FUSED_DTYPES:
        return f"the parameters are {dtype}, the fused pass takes {FUSED_DTYPES}"
    for x, grad, state in zip(g.params, g.grads, g.states):
        for t in (x, grad, *state.values()):
            if not t.is_cpu:
                return f"a tensor is on {t.device}, the fused pass runs on the CPU"
            if t.dtype != dtype:
                return "the group mixes dtypes (split it into one group per dtype)"
            if not t.is_contiguous():
                return "a parameter, gradient or moment is not contiguous (the kernel walks memory in order)"
    if k >= FUSED_MAX_STEP:
        return f"step {k} is past {FUSED_MAX_STEP}, where float32 no longer holds the count exactly"
    return None


def _use_fused(g: _Group, k: int) -> bool:
    """The group's ``fused`` choice: None uses the fused pass where it applies; True requires it."""
    choice = g.group.get("fused")
    if choice is False:
        return False
    reason = _fused_unsupported(g, k)
    if reason is not None and choice is True:
        raise ValueError(f"MoMoAdam(fused=True): {reason}. Pass fused=None (the default) to fall back to "
                         "the reference pass there, or fused=False.")
    return reason is None


def _fused_moments(
    k: int, g: _Group, exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor], work: list[Tensor]
) -> None:
    r"""The moments in place and ``work`` :math:`= -D^{-1} d`, in one pass over memory (reads g, d, v).

    torch's fused Adam kernel on a zeroed ``work`` in place of the parameters, without weight decay:
    it sets :math:`d \leftarrow \beta_1 d + (1-\beta_1) g` (as ``lerp``),
    :math:`v \leftarrow \beta_2 v + (1-\beta_2) g^2` and
    :math:`w \leftarrow w - \frac{\alpha}{1-\beta_1^k}\, d / (\sqrt{v}/\sqrt{1-\beta_2^k} + \epsilon)`;
    with :math:`w = 0` and :math:`\alpha = 1-\beta_1^k` (the same double-precision power, so the factor
    is exactly 1) that is :math:`-D^{-1} d`. ``torch._fused_adam_`` is private, but it is the kernel of
    the public ``torch.optim.Adam(fused=True)``, and no public op forms :math:`D^{-1} d` without four
    separate passes (sqrt, add, div and the moment updates).
    """
    beta1, beta2 = (float(b) for b in g.group["betas"])
    count = torch.full((), float(k), dtype=torch.float32, device=work[0].device)
    torch._foreach_zero_(work)
    torch._fused_adam_(
        work,
        g.grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        [count] * len(work),
        lr=1.0 - beta1**k,
        beta1=beta1,
        beta2=beta2,
        weight_decay=0.0,
        eps=float(g.group["eps"]),
        amsgrad=False,
        maximize=False,
    )


def _reference_moments(
    k: int, g: _Group, exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor], work: list[Tensor]
) -> float:
    r"""The moments in place and ``work`` :math:`= U` with :math:`D^{-1} d = s U`; returns s.

    :math:`D = \epsilon + \sqrt{v/c_2} = (\sqrt{v} + \epsilon\sqrt{c_2})/\sqrt{c_2}` with
    :math:`c_2 = 1-\beta_2^k`, so :math:`U = d/(\sqrt{v} + \epsilon\sqrt{c_2})` and :math:`s = \sqrt{c_2}`:
    one elementwise pass fewer than forming D itself. Separate multi-tensor ops (any device, dtype, layout).
    """
    beta1, beta2 = (float(b) for b in g.group["betas"])
    root_c2 = math.sqrt(1.0 - beta2**k)
    eps = float(g.group["eps"]) * root_c2
    torch._foreach_lerp_(exp_avgs, g.grads, 1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, g.grads, g.grads, value=1.0 - beta2)
    for d, v, u in zip(exp_avgs, exp_avg_sqs, work):
        torch.sqrt(v, out=u)
        u.add_(eps)
        torch.div(d, u, out=u)
    return root_c2


def _check_common(weight_decay: float, lower_bound: float, estimate_lower_bound: bool, check_finite: bool) -> None:
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"Invalid weight_decay={weight_decay!r}: it must be a finite number >= 0.")
    if not (isinstance(lower_bound, (int, float)) and math.isfinite(lower_bound)):
        raise ValueError(
            f"Invalid lower_bound={lower_bound!r}: it must be a finite number (a lower bound of the loss; "
            "0 for non-negative losses)."
        )
    if not isinstance(estimate_lower_bound, bool):
        raise ValueError(f"Invalid estimate_lower_bound={estimate_lower_bound!r}: it must be True or False.")
    if not isinstance(check_finite, bool):
        raise ValueError(f"Invalid check_finite={check_finite!r}: it must be True or False.")
