"""Write a new learning rate into an optimizer's param groups and the schedulers that drive them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.optim import Optimizer

__all__ = ["set_lr"]


def set_lr(
    optimizer: Optimizer,
    lr: float,
    *,
    groups: Iterable[int] | None = None,
    schedulers: Iterable[Any] = (),
) -> list[int]:
    r"""Make ``lr`` the base learning rate of the chosen param groups, keeping any schedule's factor.

    A scheduler (``torch.optim.lr_scheduler.LRScheduler``) keeps the base lr :math:`\eta_i` of each
    group :math:`i` in ``base_lrs[i]`` and writes :math:`\eta_{i,t} = \eta_i \, s_t` into the group,
    :math:`s_t` its factor at step :math:`t`. So for every chosen group

    .. math::

        s = \frac{\text{group["lr"]}}{\text{base\_lrs}[i]}, \qquad
        \text{base\_lrs}[i] \leftarrow \text{lr}, \qquad
        \text{group["initial\_lr"]} \leftarrow \text{lr}, \qquad
        \text{group["lr"]} \leftarrow \text{lr} \cdot s,

    and the schedule continues from the new base: for the closed-form and multiplicative schedulers
    (``LambdaLR``, ``StepLR``, ``ExponentialLR``, ...) the next ``scheduler.step()`` gives the lr it
    would have given with ``lr`` as the base from the start. :math:`s = 1` when no scheduler has a
    non-zero ``base_lrs[i]`` or the group's lr is ``None``; with several schedulers the last one
    with a non-zero base gives :math:`s`, and every one gets the new base. ``initial_lr`` (set by
    schedulers when they are created) is written only where it exists. Schedulers without
    ``base_lrs`` (``ReduceLROnPlateau``) only see the new group lr.

    Args:
        optimizer: the optimizer whose param groups receive ``lr``.
        lr: the new base learning rate.
        groups: indices of the param groups to write (``None``: all of them).
        schedulers: the schedulers that drive ``optimizer`` (their ``optimizer`` must be it).

    Returns:
        The indices of the groups written, in order.
    """
    schedulers = list(schedulers)
    for scheduler in schedulers:
        if getattr(scheduler, "optimizer", optimizer) is not optimizer:
            raise ValueError(
                f"set_lr: the scheduler {type(scheduler).__name__} drives another optimizer than the "
                f"{type(optimizer).__name__} given; pass only the schedulers of this optimizer."
            )
    chosen = range(len(optimizer.param_groups)) if groups is None else sorted(set(groups))
    written = []
    for i in chosen:
        if not 0 <= i < len(optimizer.param_groups):
            raise IndexError(f"set_lr: no param group {i}; the optimizer has {len(optimizer.param_groups)}.")
        group = optimizer.param_groups[i]
        factor = 1.0
        for scheduler in schedulers:
            base_lrs = getattr(scheduler, "base_lrs", None)
            if base_lrs is not None and i < len(base_lrs):
                if base_lrs[i] and group["lr"] is not None:
                    factor = float(group["lr"]) / float(base_lrs[i])
                base_lrs[i] = lr
        if "initial_lr" in group:
            group["initial_lr"] = lr
        group["lr"] = lr * factor
        written.append(i)
    return written
