r"""MoMo's scalar rules on 0-dim tensors: the adaptive step of Lemma 3.1 and the online lower bound
(Algorithms 3, 4; arXiv 2305.07583). MoMo, MoMo-Adam (:mod:`~lit_constrained.optim.momo`) and SQP-MoMo
(:mod:`~lit_constrained.optim.experimental.sqp_momo`) take them from here.

With the averages :math:`\bar f_k, \gamma_k, d_k` of the loss model, user learning rate :math:`\alpha_k`, weight
decay :math:`\lambda` and a lower bound :math:`f^*_k` of the loss, the proximal step is

.. math::
    \zeta_k = \frac{\big((1+\alpha_k\lambda)(\bar f_k - \rho_k f^*_k - \gamma_k)
              + \langle d_k, x_k\rangle\big)_+}{\|d_k\|^2_{D_k^{-1}}}, \qquad
    \tau_k = \min\{\alpha_k / \rho_k, \zeta_k\}, \qquad
    x_{k+1} = \frac{x_k - \tau_k D_k^{-1} d_k}{1 + \alpha_k \lambda}.

Online lower bound (``estimate_lower_bound=True``, MoMo* / MoMo-Adam*). The user's ``lower_bound`` is
:math:`f^*_1` and the floor. With :math:`h^\lambda_k = (1+\alpha_k\lambda)(\bar f_k - \gamma_k)
+ \langle d_k, x_k\rangle` and :math:`h_k = \bar f_k + \langle d_k, x_k\rangle - \gamma_k`:

.. math::
    \text{ResetStar (before the update): if } (1+\alpha_k\lambda)\rho_k f^*_k \ge h^\lambda_k:\
        f^*_k \leftarrow \max\Big\{\frac{h^\lambda_k}{2(1+\alpha_k\lambda)\rho_k}, f^*_1\Big\}

    \text{EstimateStar (after the update): }
        f^*_{k+1} = \max\Big\{\frac{h_k - \tfrac12 \tau_k \|d_k\|^2_{D_k^{-1}}}{\rho_k}, f^*_1\Big\}.
"""

from __future__ import annotations

import torch
from torch import Tensor


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
