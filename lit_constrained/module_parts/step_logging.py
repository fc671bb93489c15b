"""What one training step logs, and the step Lightning logs it at.

On the logger's steps (Lightning's ``log_every_n_steps``): ``Objective/train`` and ``Violation/train``
(also on the progress bar), ``Violation/<part>/train`` for a task with two imposed parts or more, and
the optimizer's diagnostics under ``optim/<name>`` once they vary (:class:`DiagnosticCharts`). At step
0, if it is not a logging step, the start values are written directly, so that every curve starts at
the initial weights. Only logging steps read a tensor's value on the host (one sync for all).

With inequality rows the step's ``constraints`` are already :math:`v` (c on the equality rows,
:math:`\\max(g, 0)` on the inequality rows: :func:`lit_constrained.imposed.violated_part`), so every
``Violation/*`` here counts only the violated part of an inequality row; the optimizer's ``active`` and
``dual_max`` diagnostics are charted as ``optim/active`` and ``optim/dual_max`` like any other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..imposed import PartLayout
from ..metrics.functional import violation_max
from ..stepping import StepResult
from .tags import DIAGNOSTICS, OBJECTIVE, REDUNDANT_DIAGNOSTICS, VIOLATION, part_tag, tag
from .tensorboard import write_scalars, write_text
from .varying import VARYING_SCALARS_KEY, VaryingScalars


def step_index(trainer: Any) -> int:
    """s, the number of training batches before this one (the optimizer steps and the batches skipped
    under ``on_nonfinite="skip"``): the x value Lightning gives the values logged in this training step
    (they are those at the weights x_s, before update s+1)."""
    loop = trainer.fit_loop.epoch_loop
    # private, unavoidable: the step Lightning's logger connector (and its LearningRateMonitor) logs at has
    # no public accessor; global_step misses skipped batches, total_batch_idx is one behind outside a step
    return int(getattr(loop, "_batches_that_stepped", trainer.global_step))


def is_logging_step(trainer: Any) -> bool:
    """Whether the logger writes this batch's values (Lightning's ``log_every_n_steps`` cadence)."""
    n = trainer.log_every_n_steps
    return bool(n) and (step_index(trainer) + 1) % n == 0


def part_violations(layout: Sequence[PartLayout] | None, c: Tensor | None, stage: str) -> dict[str, Tensor]:
    """``Violation/<name>/<stage>``: max |c| of each imposed part, for a task with two parts or more
    (one part's is ``Violation/<stage>`` itself). ``c`` is the imposed vector the parts' ``layout``
    describes, or W of them stacked (per-rank constraints: the union's parts)."""
    if layout is None or len(layout) < 2 or c is None:
        return {}
    m = sum(part.size for part in layout)
    if m == 0 or c.numel() % m:
        return {}
    ranks = c.detach().reshape(-1, m)
    return {part_tag(VIOLATION, part.name, stage): violation_max(ranks[:, part.offset:part.offset + part.size])
            for part in layout}


def log_training_step(
    module: Any, result: StepResult, layout: Sequence[PartLayout] | None, charts: DiagnosticCharts
) -> None:
    """Log one training step's f and max |c| (and each imposed part's, by its ``layout``: see
    :func:`part_violations`) through ``module.log``, and the optimizer's diagnostics through ``charts``.

    f and c are those at x_s (before this step's update) and identical on every rank (reduced in the
    step): no ``sync_dist``. Logged (progress bar included) only on the logger's steps, where Lightning
    turns them into Python numbers; step 0 (the start) is written directly."""
    c = result.constraints
    has_constraints = c is not None and c.numel() > 0
    trainer = module.trainer
    if module.is_logging_step():
        module.log(tag(OBJECTIVE, "train"), result.objective, prog_bar=True)
        if has_constraints:
            module.log(tag(VIOLATION, "train"), violation_max(c), prog_bar=True)
            for key, value in part_violations(layout, c, "train").items():
                module.log(key, value)
        charts.write(trainer, module.optimizers().optimizer)
    elif step_index(trainer) == 0:
        start = {tag(OBJECTIVE, "train"): float(result.objective)}
        if has_constraints:
            start[tag(VIOLATION, "train")] = float(violation_max(c))
            start.update({k: float(v) for k, v in part_violations(layout, c, "train").items()})
        write_scalars(trainer, start, step=0)


class DiagnosticCharts:
    """The ``optim/<name>`` charts of a run: the optimizer's step diagnostics (0-dim values) and lr,
    each only once it has varied (:class:`~lit_constrained.module_parts.varying.VaryingScalars`); the
    constants go to the run's text summary at the end of fit. Diagnostics that repeat another chart
    (``REDUNDANT_DIAGNOSTICS``) are left out. Which names were charted is saved in the checkpoint, so a
    resumed run charts the same ones."""

    def __init__(self) -> None:
        self.varying: VaryingScalars | None = None
        self.restored: Mapping[str, Any] | None = None  # read from a checkpoint, applied at the next fit start

    def start(self) -> None:
        """At fit start: a fresh filter, or the one the checkpoint being resumed saved."""
        self.varying = VaryingScalars()
        if self.restored is not None:  # resumed: keep charting the diagnostics that varied before the stop
            self.varying.load_state_dict(self.restored)
            self.restored = None

    def write(self, trainer: Any, optimizer: Any) -> None:
        """Feed this step's diagnostics and lr and write those that vary (one host sync for all)."""
        diagnostics = getattr(optimizer, "diagnostics", None) or {}  # torch optimizers have none
        names: list[str] = []
        values: list[Tensor] = []
        for key, value in diagnostics.items():
            if key in REDUNDANT_DIAGNOSTICS or (isinstance(value, Tensor) and value.numel() != 1):
                continue
            if isinstance(value, (Tensor, int, float)):
                names.append(key)
                values.append(torch.as_tensor(value).detach().reshape(()).to("cpu" if not isinstance(value, Tensor) else value.device, torch.float64))
        names.append("lr")
        lr = optimizer.param_groups[0]["lr"]
        values.append(torch.as_tensor(lr, dtype=torch.float64).reshape(()).to(values[0].device if values else "cpu"))
        numbers = torch.stack(values).tolist()  # the one host sync
        finite = {f"{DIAGNOSTICS}/{k}": v for k, v in zip(names, numbers) if math.isfinite(v)}
        if self.varying is None:
            self.varying = VaryingScalars()
        for step, metrics in self.varying.update(step_index(trainer), finite):
            write_scalars(trainer, metrics, step)

    def write_constants(self, trainer: Any, m: int | None) -> None:
        """At fit end: the diagnostics that never varied, as a table in the run's text summary
        (``run/constants``), with the number ``m`` of imposed constraints if known."""
        constants = self.varying.constants() if self.varying is not None else {}
        if not constants:
            return
        rows = [f"| {name} | {value:.6g} |" for name, value in sorted(constants.items())]
        text = "Optimizer diagnostics that stayed constant during the run (not charted):\n\n| name | value |\n|---|---|\n"
        text += "\n".join(rows)
        if m is not None:
            text += f"\n\nm = {m} imposed constraints."
        write_text(trainer, "run/constants", text, step=trainer.global_step)

    def save(self, checkpoint: dict[str, Any]) -> None:
        if self.varying is not None:
            checkpoint[VARYING_SCALARS_KEY] = self.varying.state_dict()

    def restore(self, checkpoint: Mapping[str, Any]) -> None:
        self.restored = checkpoint.get(VARYING_SCALARS_KEY)
