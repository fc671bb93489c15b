r"""Log MoMo's lower bound :math:`f^*`, its step size :math:`\tau`, the adaptive term :math:`\zeta` and the lr.

MoMo's step is :math:`\tau_k = \min\{\alpha_k/\rho_k, \zeta_k\}` (user lr :math:`\alpha_k`, adaptive term
:math:`\zeta_k`); plotting :math:`\tau_k` against :math:`\alpha_k` shows its automatic warm-up (small
:math:`\zeta` in the first steps) and decay, and :math:`f^*_k` shows the online lower-bound estimate.

After every training step (``on_train_batch_end``) the callback reads, from each of
``trainer.optimizers``, the string-keyed entries of ``optimizer.state``:

* a scalar stored directly under one of ``keys`` (e.g. ``state["tau"]``), or inside a string-keyed
  dict (e.g. ``state["momo"]["lower_bound"]``, ``state["diagnostics"]["tau"]``), is logged as
  ``<prefix>/<key>``;
* a dict under ``"group<i>"`` holds group i's values (``state["group0"]["tau"]``): with several
  parameter groups they are logged as ``<prefix>/<key>/group<i>``;
* the user lr ``param_groups[i]["lr"]`` as ``<prefix>/lr`` (``<prefix>/lr/group<i>``).

Keys an optimizer does not record are skipped silently, so the callback works with any optimizer
(``torch.optim.Adam`` gives just the lr). With several optimizers the prefix becomes
``<prefix>/opt<j>``. Values are logged on step only; the Trainer's ``log_every_n_steps`` (default 50) decides how
often they reach the logger (set it to 1 to see every step), ``trainer.callback_metrics`` always holds
the latest. They are identical on every rank (the package's stepper gives every rank
the same loss), so no sync is needed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor
from torch.optim import Optimizer

__all__ = ["FStarMonitor", "step_size_values"]

_GROUP = re.compile(r"group(\d+)")


def _scalar(value: Any) -> float | None:
    """The value as a float when it is a real scalar (number or one-element tensor), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_complex():
        return float(value.detach())
    return None


def step_size_values(
    optimizer: Optimizer, keys: Sequence[str] = ("lower_bound", "tau", "zeta"), log_lr: bool = True
) -> dict[str, float]:
    """The scalars ``keys`` (and the lr) an optimizer records, named as in the module docstring (no prefix)."""
    several = len(optimizer.param_groups) > 1
    wanted = set(keys)
    out: dict[str, float] = {}

    def put(name: str, value: Any, group: int | None) -> None:
        x = _scalar(value)
        if x is not None:
            out[f"{name}/group{group}" if several and group is not None else name] = x

    for entry, value in optimizer.state.items():
        if not isinstance(entry, str):
            continue  # per-parameter state
        if entry in wanted:
            put(entry, value, None)
        elif isinstance(value, Mapping):
            match = _GROUP.fullmatch(entry)
            group = int(match.group(1)) if match else None
            for key in keys:
                if key in value:
                    put(key, value[key], group)
    if log_lr:
        for i, group in enumerate(optimizer.param_groups):
            put("lr", group.get("lr"), i)
    return out


class FStarMonitor(Callback):
    r"""Log :math:`f^*`, :math:`\tau`, :math:`\zeta` and the lr every training step (see the module docstring).

    Args:
        keys: the ``optimizer.state`` keys to log (missing ones are skipped).
        log_lr: also log the user lr of each parameter group.
        prefix: the metric-name prefix.
        prog_bar: also show the values on the progress bar.
    """

    def __init__(
        self,
        keys: Sequence[str] = ("lower_bound", "tau", "zeta"),
        log_lr: bool = True,
        prefix: str = "fstar",
        prog_bar: bool = False,
    ) -> None:
        super().__init__()
        keys = (keys,) if isinstance(keys, str) else tuple(keys)
        if not all(isinstance(k, str) and k for k in keys):
            raise ValueError(f"Invalid keys={keys!r}: a sequence of non-empty strings (optimizer.state keys).")
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
