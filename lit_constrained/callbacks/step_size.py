r"""The step-size monitor: log an optimizer's step size :math:`\tau`, the adaptive term :math:`\zeta`, MoMo's
lower bound :math:`f^*` and the lr.

MoMo's step is :math:`\tau_k = \min\{\alpha_k/\rho_k, \zeta_k\}` (user lr :math:`\alpha_k`, adaptive term
:math:`\zeta_k`); plotting :math:`\tau_k` against :math:`\alpha_k` shows its automatic warm-up (small
:math:`\zeta` in the first steps) and decay, and :math:`f^*_k` shows the online lower-bound estimate.

After every training step (``on_train_batch_end``) the callback reads, from each of
``trainer.optimizers``, for each of ``keys``:

1. the step's diagnostics, ``optimizer.diagnostics`` (a dict of 0-dim tensors that the package's
   optimizers fill on the steps asked for them: the package's stepper asks on the logger's steps):
   ``diagnostics[key]`` is logged as ``<prefix>/<key>``, and with several parameter groups
   ``diagnostics[f"{key}/group{i}"]`` (MoMo's per-group ``tau``, ``zeta``) as ``<prefix>/<key>/group<i>``;
2. otherwise the optimizer's string-keyed state: a scalar stored directly under ``key``
   (``state["tau"]``) or inside a string-keyed dict (MoMo's current estimate
   ``state["global"]["lower_bound"]``), logged as ``<prefix>/<key>``;
3. the user lr ``param_groups[i]["lr"]`` as ``<prefix>/lr`` (``<prefix>/lr/group<i>``).

Keys an optimizer does not provide at this step are skipped silently, so the callback works with any
optimizer (``torch.optim.Adam`` gives just the lr). With several optimizers the prefix becomes
``<prefix>/opt<j>``. Tensors are logged as they are (no host sync here: Lightning reads them when it
writes to the logger). Values are logged on step only; the Trainer's ``log_every_n_steps`` (default 50)
decides how often they reach the logger (set it to 1 to see every step), ``trainer.callback_metrics``
holds the latest. They are identical on every rank (the package's stepper gives every rank the same
loss), so no sync is needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor
from torch.optim import Optimizer

__all__ = ["StepSizeMonitor", "step_size_values"]

Scalar = Tensor | float


def _scalar(value: Any) -> Scalar | None:
    """The value as a 0-dim tensor or a float when it is a real scalar, else None (no host sync)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool:
        value = value.detach().reshape(())
        return value if value.is_floating_point() else value.float()
    return None


def _from_state(optimizer: Optimizer, key: str) -> Scalar | None:
    """``state[key]`` or ``state[<entry>][key]`` over the optimizer's string-keyed state entries."""
    for entry, value in optimizer.state.items():
        if not isinstance(entry, str):
            continue  # per-parameter state
        if entry == key:
            found = _scalar(value)
        elif isinstance(value, Mapping) and key in value:
            found = _scalar(value[key])
        else:
            continue
        if found is not None:
            return found
    return None


def step_size_values(
    optimizer: Optimizer, keys: Sequence[str] = ("lower_bound", "tau", "zeta"), log_lr: bool = True
) -> dict[str, Scalar]:
    """The scalars ``keys`` (and the lr) an optimizer provides now, named as in the module docstring
    (no prefix): 0-dim tensors or floats."""
    groups = range(len(optimizer.param_groups))
    several = len(groups) > 1
    diagnostics = getattr(optimizer, "diagnostics", None)
    diagnostics = diagnostics if isinstance(diagnostics, Mapping) else {}
    out: dict[str, Scalar] = {}

    def put(name: str, value: Any) -> bool:
        x = _scalar(value)
        if x is not None:
            out[name] = x
        return x is not None

    for key in keys:
        found = key in diagnostics and put(key, diagnostics[key])
        if several:
            for i in groups:
                name = f"{key}/group{i}"
                if name in diagnostics:
                    found = put(name, diagnostics[name]) or found
        if not found:
            value = _from_state(optimizer, key)
            if value is not None:
                out[key] = value
    if log_lr:
        for i, group in enumerate(optimizer.param_groups):
            put(f"lr/group{i}" if several else "lr", group.get("lr"))
    return out


class StepSizeMonitor(Callback):
    r"""Log :math:`\tau`, :math:`\zeta`, :math:`f^*` and the lr every training step (see the module docstring).

    Args:
        keys: the diagnostics / ``optimizer.state`` keys to log (missing ones are skipped).
        log_lr: also log the user lr of each parameter group.
        prefix: the metric-name prefix (``step_size/tau``, ``step_size/lr``, ...).
        prog_bar: also show the values on the progress bar.
    """

    def __init__(
        self,
        keys: Sequence[str] = ("lower_bound", "tau", "zeta"),
        log_lr: bool = True,
        prefix: str = "step_size",
        prog_bar: bool = False,
    ) -> None:
        super().__init__()
        keys = (keys,) if isinstance(keys, str) else tuple(keys)
        if not all(isinstance(k, str) and k for k in keys):
            raise ValueError(
                f"Invalid keys={keys!r}: a sequence of non-empty strings (diagnostics or optimizer.state keys)."
            )
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"Invalid prefix={prefix!r}: a non-empty string.")
        self.keys = keys
        self.log_lr = log_lr
        self.prefix = prefix
        self.prog_bar = prog_bar

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        optimizers = trainer.optimizers
        for j, optimizer in enumerate(optimizers):
            prefix = f"{self.prefix}/opt{j}" if len(optimizers) > 1 else self.prefix
            for name, value in step_size_values(optimizer, self.keys, self.log_lr).items():
                pl_module.log(
                    f"{prefix}/{name}",
                    value,
                    on_step=True,
                    on_epoch=False,
                    prog_bar=self.prog_bar,
                    logger=True,
                    batch_size=1,
                )
