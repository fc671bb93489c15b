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

The scalar rules (the adaptive step, the online lower bound ``estimate_lower_bound=True``):
:mod:`~lit_constrained.optim.momo_rules`; the step both share (several parameter groups, the torch.optim
conventions, no host sync): :mod:`~lit_constrained.optim.momo_step`; MoMo-Adam's moments and
:math:`D^{-1} d` (the fused pass): :mod:`~lit_constrained.optim.momo_moments`.

Details:

* The loss value comes from the closure: ``loss.backward(); opt.step(lambda: loss)``. In data-parallel
  training it must be the mean over ranks (the package's stepper does this), else replicas drift apart.
* A zero direction (:math:`\|d_k\| = 0`) gives :math:`\tau_k = \zeta_k = 0` and a zero step (with weight
  decay the shrinkage :math:`x/(1+\alpha\lambda)` still applies, as it is the exact proximal step).
* Parameters whose ``.grad`` is None are left out of the step (not moved, moments untouched), as in
  torch's optimizers. Complex parameters are treated as pairs of reals.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from .checks import check_beta, check_betas, check_lr, check_positive
from .momo_moments import _fused_moments, _reference_moments, _use_fused
from .momo_step import _add_scaled_, _Group, _model_dots, _MoMoBase


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
