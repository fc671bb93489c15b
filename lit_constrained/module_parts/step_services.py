"""The :class:`~lit_constrained.stepping.StepServices` a training step gets from Lightning: the
LightningOptimizer and its ``step`` (which advances ``global_step``), ``manual_backward``,
``clip_gradients`` by norm (for ``max_grad_norm``), the strategy's all-gather, the world size and rank,
the step's index, whether the logger writes this step, the device and ``print`` (rank 0).
"""

from __future__ import annotations

from typing import Any

from ..stepping import StepServices


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
        backward=module.manual_backward,
        clip_gradients=clip,
        all_gather=trainer.strategy.all_gather,
        world_size=trainer.world_size,
        rank=trainer.global_rank,
        step_index=trainer.global_step,
        diagnostics=module.is_logging_step(),
        device=module.device,
        report=module.print,
    )
