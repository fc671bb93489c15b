r"""MoMo-Adam's moments and :math:`D^{-1} d`: torch's fused Adam kernel where it applies, else the
multi-tensor reference ops.

Passes over memory. :math:`\tau_k` needs three sums over the new :math:`d_k, D_k`
(:math:`\langle g, x\rangle, \langle d, x\rangle, \|d\|^2_{D^{-1}}`) before any :math:`x` moves, so the
step needs two passes at least: 10 n-vector reads and writes (read x, g, d, v and write d, v,
:math:`D^{-1} d`; read x, :math:`D^{-1} d` and write x), against 7 for Adam. With ``fused`` (the
default where it applies) torch's fused Adam kernel forms :math:`d, v, -D^{-1} d` in one pass over a
zeroed workspace; the three sums (a BLAS dot per tensor) and the update follow: 17 in all (torch's
multi-tensor Adam: 18; the reference multi-tensor ops: 24). ``benchmarks/bench_momo.py`` times them
against the bound.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .momo_step import _Group

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
