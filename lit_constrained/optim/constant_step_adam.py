"""Adam with a constant step size, as analysed by Tian et al. (arXiv 2309.08339, Algorithm 1).

The step size is meant to be the paper's "exact" constant

.. math::

    \\alpha = \\sqrt{\\frac{2 \\mathcal{L}(w_0)}{\\hat L \\, T}},

written into the optimizer by :class:`lit_constrained.callbacks.LipschitzEstimator` before the first
step (``lr=None`` here means exactly that), but any fixed ``lr`` may be given instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from .autocast import outside_autocast
from lit_constrained.optim.checks import check_betas, check_lr, check_positive
from lit_constrained.jacobians import real_view

__all__ = ["ConstantStepAdam"]


class ConstantStepAdam(torch.optim.Optimizer):
    r"""Adam without bias correction and with a constant step size (2309.08339, Algorithm 1).

    With gradient :math:`g_t`, the update is (all operations elementwise)

    .. math::

        m_t &= \beta_1 m_{t-1} + (1 - \beta_1) g_t, \qquad m_0 = 0,\\
        v_t &= \beta_2 v_{t-1} + (1 - \beta_2) g_t^2, \qquad v_0 = 0,\\
        w_{t+1} &= w_t - \alpha \, \frac{m_t}{\sqrt{v_t} + \rho_\epsilon}.

    ``eps`` is :math:`\rho_\epsilon`, added *outside* the square root as in the paper. With
    ``bias_correction=True`` the moments are replaced by :math:`\hat m_t = m_t / (1 - \beta_1^t)` and
    :math:`\hat v_t = v_t / (1 - \beta_2^t)` (then this is ``torch.optim.Adam`` without weight decay);
    the paper's analysis and default use none.

    The paper's step size :math:`\alpha = \sqrt{2 (\mathcal{L}(w_0) - \mathcal{L}(w^*)) /
    (K \delta^2 T)}` (Theorems 3.1/3.2) is simplified in its section 3.2 to
    :math:`\alpha \approx \sqrt{2 \mathcal{L}(w_0) / (K T)}` (final loss set to 0, :math:`\delta^2`
    dropped), with :math:`T` the number of iterations of the run. Note an inconsistency that the
    code does not hide: in the theorems :math:`K` is a *smoothness* constant (the gradient is
    :math:`K`-Lipschitz), whereas the paper's Algorithms 2/3, which the callback
    :class:`~lit_constrained.callbacks.LipschitzEstimator` implements, estimate a bound on the
    *gradient norm* :math:`\sup_w \|\nabla \mathcal{L}(w)\|` (the Lipschitz constant of the loss
    itself). This optimizer only applies Algorithm 1 with whatever ``lr`` it is given.

    Args:
        params: parameters or parameter groups.
        lr: the constant step size :math:`\alpha`; ``None`` means "set by the
            ``LipschitzEstimator`` callback before the first step" (stepping with ``lr=None`` raises).
        betas: :math:`(\beta_1, \beta_2)`, each in [0, 1).
        eps: :math:`\rho_\epsilon > 0`, added to :math:`\sqrt{v_t}`.
        bias_correction: divide the moments by :math:`1 - \beta^t` (off in the paper).

    Complex parameters are treated as pairs of real numbers (``view_as_real``), so the second
    moment is taken per real and imaginary part.

    All hyperparameters are per param group (``lr``, ``betas``, ``eps``, ``bias_correction``), so
    schedulers, ``CyclicLR(cycle_momentum=True)`` / ``OneCycleLR`` (on ``betas[0]``) and
    ``load_state_dict`` (which restores the saved ones) work as with ``torch.optim.Adam``.

    State: per parameter ``"exp_avg"`` (:math:`m`), ``"exp_avg_sq"`` (:math:`v`) and ``"step"`` (a CPU
    tensor, as in ``torch.optim.Adam``). ``step(closure=None, *, diagnostics=False)``: with
    ``diagnostics=True``, ``optimizer.diagnostics`` holds ``step_norm`` (:math:`\|w_{t+1} - w_t\|` over
    all groups, a 0-dim tensor; one extra pass, the update itself is unchanged); on other steps it is
    empty.

    Example:
        >>> import torch
        >>> w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        >>> opt = ConstantStepAdam([w], lr=0.1)
        >>> w.grad = torch.tensor([0.5, -0.5])
        >>> _ = opt.step()
        >>> w.data  # first step: lr (1 - beta1) / sqrt(1 - beta2) sign(g) = 0.1 * 3.162 * sign(g)
        tensor([ 0.6838, -1.6838])
    """

    requires: frozenset[str] = frozenset()
    diagnostics: dict[str, Tensor]

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        bias_correction: bool = False,
    ) -> None:
        check_lr(lr, allow_none=True)
        check_betas(betas)
        check_positive("eps", eps)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, bias_correction=bool(bias_correction))
        super().__init__(params, defaults)
        self.diagnostics = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # torch pickles defaults, state and param_groups only
        self.__dict__.setdefault("diagnostics", {})

    @outside_autocast
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, *, diagnostics: bool = False) -> Any:
        """One step of Algorithm 1; ``diagnostics=True`` fills ``optimizer.diagnostics`` (else emptied).

        Returns the closure's value (``None`` without closure).
        """
        self.diagnostics = {}
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for i, group in enumerate(self.param_groups):
            if group["lr"] is None:
                raise ValueError(
                    f"ConstantStepAdam: param group {i} has lr=None. lr=None means the step size is to be "
                    "set before the first step by the LipschitzEstimator callback "
                    "(lit_constrained.callbacks.LipschitzEstimator): add it to the Trainer's callbacks, "
                    "or pass a number as lr."
                )
            check_lr(group["lr"])
        squares = [self._step_group(group, diagnostics) for group in self.param_groups]
        if diagnostics:
            squares = [t for t in squares if t is not None]
            device = self.param_groups[0]["params"][0].device
            total = torch.stack(squares).sum() if squares else torch.zeros((), device=device)
            self.diagnostics["step_norm"] = total.sqrt()
        return loss

    def _step_group(self, group: dict[str, Any], diagnostics: bool) -> Tensor | None:
        """Update one group; with ``diagnostics`` return the squared norm of its update (float64)."""
        params: list[Tensor] = []
        grads: list[Tensor] = []
        exp_avgs: list[Tensor] = []
        exp_avg_sqs: list[Tensor] = []
        steps: list[int] = []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ValueError("ConstantStepAdam does not support sparse gradients; use dense gradients.")
            state = self.state[p]
            if len(state) == 0:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            params.append(real_view(p))
            grads.append(real_view(p.grad))
            exp_avgs.append(real_view(state["exp_avg"]))
            exp_avg_sqs.append(real_view(state["exp_avg_sq"]))
            steps.append(int(state["step"].item()))
        if not params:
            return None
        beta1, beta2 = group["betas"]
        lr = float(group["lr"])
        # m <- beta1 m + (1 - beta1) g ;  v <- beta2 v + (1 - beta2) g^2
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        if group["bias_correction"]:
            # m^ / (sqrt(v^) + eps) = m / (1 - b1^t) / (sqrt(v) / sqrt(1 - b2^t) + eps)
            torch._foreach_div_(denom, [(1.0 - beta2**t) ** 0.5 for t in steps])
            scales = [-lr / (1.0 - beta1**t) for t in steps]
        else:
            scales = [-lr] * len(params)
        torch._foreach_add_(denom, group["eps"])
        squared = None
        if diagnostics:  # ||update||^2 = sum_i scale_i^2 ||m_i / denom_i||^2, before the update overwrites nothing
            norms = torch._foreach_norm(torch._foreach_div(exp_avgs, denom))
            squared = sum(s * s * n.double() ** 2 for s, n in zip(scales, norms))
        torch._foreach_addcdiv_(params, exp_avgs, denom, scales)
        return squared
