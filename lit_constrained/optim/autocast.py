"""The optimizers' linear algebra runs outside ``torch.autocast``.

Under mixed precision (``torch.autocast``, e.g. Lightning's ``bf16-mixed``, whose autocast region covers
the whole training step, the optimizer step included) a matrix product such as ``J @ g`` or the Gram
``J J^T`` would run in bfloat16 (8 significant bits): the projection, and with it the feasibility the
step restores, would lose all accuracy. :func:`outside_autocast` wraps an optimizer's ``step`` so that
its body runs with autocast off, in the parameters' dtype, while a closure still evaluates the model
under the caller's autocast settings.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

Step = TypeVar("Step", bound=Callable[..., Any])

#: the device types whose autocast state is checked
DEVICE_TYPES = ("cpu", "cuda")


def outside_autocast(step: Step) -> Step:
    """Decorate ``step(self, closure=None, **kwargs)``: autocast off for the step, on as the caller had it
    for the closure."""

    @functools.wraps(step)
    def wrapper(self: Any, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        active = {d: torch.get_autocast_dtype(d) for d in DEVICE_TYPES if torch.is_autocast_enabled(d)}
        if not active:
            return step(self, closure, **kwargs)

        def under_callers_autocast() -> Any:
            with contextlib.ExitStack() as stack:
                for device, dtype in active.items():
                    stack.enter_context(torch.autocast(device_type=device, dtype=dtype))
                return closure()

        with contextlib.ExitStack() as stack:
            for device in active:
                stack.enter_context(torch.autocast(device_type=device, enabled=False))
            return step(self, None if closure is None else under_callers_autocast, **kwargs)

    return wrapper  # type: ignore[return-value]
