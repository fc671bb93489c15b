"""The :class:`~lit_constrained.stepping.StepServices` a training step gets from Lightning: the
LightningOptimizer and its ``step`` (which advances ``global_step``), ``manual_backward``,
``clip_gradients`` by norm (for ``max_grad_norm``), the strategy's all-gather, the world size and rank,
the step's index, whether the logger writes this step, the device and ``print`` (rank 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..stepping import StepServices


def reaching_every_parameter(loss: Tensor, params: list[Tensor]) -> Tensor:
    """``loss`` plus an exact zero that depends on every parameter in ``params`` (one element of each
    times 0): the same value, the same gradient (each parameter's gains + 0), and no parameter left
    without one.

    Under DDP the gradient is averaged by DDP's reducer during the objective's backward, and the
    reducer stops the next step ("parameters that were not used in producing the loss") when the
    objective leaves a parameter out, which is legal here: the obstacle's Dirichlet energy does not
    depend on the output bias, the constraints do, and the constraints' J is formed by the package
    outside DDP. ``find_unused_parameters=True`` would cost a graph traversal every step and is the
    user's strategy argument; this costs one multiply per parameter tensor."""
    anchor = [p.reshape(-1)[:1].sum() * 0.0 for p in params if p.requires_grad and p.numel() > 0]
    return loss + torch.stack(anchor).sum().to(loss.dtype) if anchor else loss


def _backward(module: Any) -> Callable[[Tensor], Any]:
    """``manual_backward``; on more than one process, of the loss reaching every parameter."""
    if module.trainer.world_size <= 1:
        return module.manual_backward
    params = [p for p in module.parameters() if p.requires_grad]
    return lambda loss: module.manual_backward(reaching_every_parameter(loss, params))


def lightning_step_services(module: Any) -> StepServices:
    """The services of ``module``'s Trainer for its current training step (one optimizer only)."""
    opt = module.optimizers()
    if isinstance(opt, list):
        raise ValueError("ConstrainedModule trains with exactly one optimizer.")
    trainer = module.trainer

    def clip(max_norm: float) -> None:
        module.clip_gradients(opt, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")

    return StepServices(
        optimizer=opt.optimizer,
        optimizer_step=opt.step,  # the LightningOptimizer's: it advances global_step
        backward=_backward(module),
        clip_gradients=clip,
        all_gather=trainer.strategy.all_gather,
        world_size=trainer.world_size,
        rank=trainer.global_rank,
        step_index=trainer.global_step,
        diagnostics=module.is_logging_step(),
        device=module.device,
        report=module.print,
    )
