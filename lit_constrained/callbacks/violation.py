r"""Log constraint-violation metrics on train (per step) and validation/test (per epoch).

For each stage the callback keeps its own :mod:`lit_constrained.metrics` modules (on the module's device)
and logs them under ``Violation/<stage>/<name>`` (``source="constraints"``: the m imposed constraints,
the family of ``ConstrainedModule``'s ``Violation/<stage>`` = max) or ``residual/<stage>/<name>``
(``source="validation_constraints"``: the residual over every validation point, val/test only),
``<stage>`` in ``train``, ``val``, ``test`` and ``<name>`` in ``max``, ``mean``, ``l1``, ``l2``, ``relative``
(the default leaves out ``max``: ``ConstrainedModule`` logs it already):

.. math::
    \max_i |c_i|, \quad \frac{1}{m}\sum_i |c_i|, \quad \|c\|_1, \quad \|c\|_2, \quad
    \frac{\|c\|_p}{\|c_0\|_p \ (\text{or } 1 \text{ if } \|c_0\|_p = 0)}.

It reads the residuals from what the step hooks return (``{"objective": f, "constraints": c,
"validation_constraints": r}``):

* **train**: the training constraints are already the mean over ranks and the same on every rank, so
  the train metrics never sync (``sync_on_compute=False``); each step's value is computed from that
  step's residuals alone and logged on step.
* **val / test**, ``source="constraints"`` of a module with ``constraints_shared`` (ConstrainedModule):
  the imposed constraints are one fixed set, the same in every batch and on every rank: each batch's
  value is computed alone (no sync) and the epoch value is their mean (the value itself).
* **val / test**, otherwise: each rank holds its own shard of a (possibly larger) constraint set, e.g. the residual
  at all collocation points; the metrics accumulate over the epoch and sync across ranks when Lightning
  computes them at epoch end, so the logged value is the value on the whole constraint set. One set of
  metrics is kept per dataloader (Lightning adds ``/dataloader_idx_k`` to the keys).

``relative`` divides by the first value it computes in its stage (the first training step; the first
validation or test epoch, sanity checking excluded) unless a reference norm is given in ``references``;
the references taken are saved in the callback's checkpoint state, so a resumed run keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lit_constrained.module_parts.tags import RESIDUAL, VIOLATION
from lit_constrained.metrics import MetricName, RelativeViolation, ViolationMetric, build_violation_metric, check_metric_names
from lit_constrained.metrics.functional import check_norm_order, reference_norm

__all__ = ["ConstraintViolationMonitor"]

Stage = Literal["train", "val", "test"]
STAGES: tuple[str, ...] = ("train", "val", "test")
Source = Literal["constraints", "validation_constraints"]
SOURCES: dict[str, str] = {"constraints": VIOLATION, "validation_constraints": RESIDUAL}


class ConstraintViolationMonitor(Callback):
    """Log constraint-violation metrics (see the module docstring for what is logged when).

    Args:
        metrics: which metrics to log, a subset of ``("max", "mean", "l1", "l2", "relative")``.
        stages: where to log them, a subset of ``("train", "val", "test")``.
        source: ``"constraints"`` (the imposed constraints; tags ``Violation/<stage>/<name>``) or
            ``"validation_constraints"`` (the residual over every validation point, val/test only;
            tags ``residual/<stage>/<name>``).
        norm_order: the norm of the ``relative`` metric: 1, 2 or ``"inf"``.
        references: optional reference norms :math:`\\|c_0\\|` for ``relative``, keyed by stage; a stage
            without one takes its first computed value.
        prog_bar: also show the metrics on the progress bar.
    """

    def __init__(
        self,
        metrics: Sequence[MetricName] = ("mean", "l1", "l2", "relative"),
        stages: Sequence[Stage] = ("train", "val", "test"),
        source: Source = "constraints",
        norm_order: float | Literal["inf"] = 2.0,
        references: dict[Stage, float] | None = None,
        prog_bar: bool = False,
    ) -> None:
        super().__init__()
        self.metric_names = check_metric_names(metrics)
        stages = (stages,) if isinstance(stages, str) else tuple(stages)
        bad = [s for s in stages if s not in STAGES]
        if bad or not stages or len(set(stages)) != len(stages):
            raise ValueError(f"Invalid stages {stages!r}: choose a non-empty subset of {STAGES} without repeats.")
        if source not in SOURCES:
            raise ValueError(f"Invalid source {source!r}: choose one of {tuple(SOURCES)}.")
        if source == "validation_constraints" and "train" in stages:
            stages = tuple(s for s in stages if s != "train")  # training steps impose only the constraints
            if not stages:
                raise ValueError("source='validation_constraints' has no train values: choose stages val and/or test.")
        self.source = source
        self.family = SOURCES[source]
        self.stages = stages
        self.norm_order = check_norm_order(norm_order)
        references = dict(references or {})
        bad = [s for s in references if s not in STAGES]
        if bad:
            raise ValueError(f"references has unknown stage(s) {bad}: key them by {STAGES}.")
        # validate now (clear error at config time), keep as floats
        self.references = {s: float(reference_norm(v, self.norm_order)) for s, v in references.items()}
        self.prog_bar = prog_bar
        # one ModuleDict of metrics per "<stage>_<dataloader_idx>", created on first use
        self.metrics = torch.nn.ModuleDict()
        self._restored_references: dict[str, float] = {}
        self._warned: set[str] = set()

    @property
    def state_key(self) -> str:
        return self._generate_state_key(
            metrics=self.metric_names, stages=self.stages, norm_order=self.norm_order, source=self.source
        )

    # ------------------------------------------------------------------------------------ metric store
    def _stage_metrics(self, stage: str, dataloader_idx: int, pl_module: LightningModule) -> torch.nn.ModuleDict:
        key = f"{stage}_{dataloader_idx}"
        if key not in self.metrics:
            sync = stage != "train" and not self._one_shared_set(pl_module)
            group = torch.nn.ModuleDict()
            for name in self.metric_names:
                kwargs: dict[str, Any] = {"sync_on_compute": sync}
                if name == "relative":
                    kwargs["p"] = self.norm_order
                group[name] = build_violation_metric(name, **kwargs)
            self.metrics[key] = group.to(pl_module.device)
            self._apply_reference(key)
        return self.metrics[key]

    def _apply_reference(self, key: str) -> None:
        group = self.metrics[key]
        if "relative" not in group:
            return
        metric = group["relative"]
        assert isinstance(metric, RelativeViolation)
        stage = key.rsplit("_", 1)[0]
        if key in self._restored_references:
            metric.set_reference(self._restored_references[key])
        elif stage in self.references:
            metric.set_reference(self.references[stage])

    def _move_to(self, pl_module: LightningModule) -> None:
        self.metrics.to(pl_module.device)

    def _constraints_from(self, outputs: Any, stage: str) -> Tensor | None:
        if isinstance(outputs, Mapping) and self.source in outputs:
            c = outputs[self.source]
            if c is None or isinstance(c, Tensor):
                return c
            raise ValueError(
                f"ConstraintViolationMonitor: the {stage} step returned {self.source} of type {type(c).__name__}; "
                "return a 1-D tensor of residuals (or None when the task has none)."
            )
        if stage not in self._warned:
            self._warned.add(stage)
            rank_zero_warn(
                f"ConstraintViolationMonitor: the {stage} step output has no '{self.source}' entry "
                f"(got {type(outputs).__name__}), so no {stage} violation is logged. Return "
                f'{{"objective": f, "{self.source}": c}} from the step (ConstrainedModule does).'
            )
        return None

    # ------------------------------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._move_to(pl_module)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._move_to(pl_module)

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._move_to(pl_module)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if "train" not in self.stages:
            return
        c = self._constraints_from(outputs, "train")
        if c is None:
            return
        for name, metric in self._stage_metrics("train", 0, pl_module).items():
            metric.update(c)
            value = metric.compute()  # no sync: c is already the rank mean, identical on all ranks
            metric.reset()
            pl_module.log(f"{self.family}/train/{name}", value, on_step=True, on_epoch=False, prog_bar=self.prog_bar)

    def _one_shared_set(self, pl_module: LightningModule) -> bool:
        """Whether the evaluation residuals are ONE fixed constraint set, the same in every batch and on
        every rank: the imposed constraints of a module that says so (``constraints_shared``, as
        ConstrainedModule). Their norms are then taken per batch, never summed over batches or ranks."""
        return self.source == "constraints" and bool(getattr(pl_module, "constraints_shared", False))

    def _evaluation_batch_end(self, stage: str, outputs: Any, dataloader_idx: int, pl_module: LightningModule) -> None:
        if stage not in self.stages:
            return
        c = self._constraints_from(outputs, stage)
        if c is None:
            return
        key = f"{stage}_{dataloader_idx}"
        if self._one_shared_set(pl_module):
            for name, metric in self._stage_metrics(stage, dataloader_idx, pl_module).items():
                metric.update(c)
                value = metric.compute()  # no sync: the same set on every rank
                metric.reset()
                # identical in every batch at fixed weights: the epoch mean is that value
                # (sync_dist: a mean of equal values, so Lightning does not warn about epoch logging)
                pl_module.log(f"{self.family}/{stage}/{name}", value, on_step=False, on_epoch=True,
                              prog_bar=self.prog_bar, batch_size=1, sync_dist=True)
            return
        for name, metric in self._stage_metrics(stage, dataloader_idx, pl_module).items():
            assert isinstance(metric, ViolationMetric)
            metric.update(c)
            # Lightning computes (synced across ranks) and resets the metric object at epoch end
            pl_module.log(
                f"{self.family}/{stage}/{name}",
                metric,
                on_step=False,
                on_epoch=True,
                prog_bar=self.prog_bar,
                metric_attribute=f"violation_monitor.{self.family}.{key}.{name}",
            )

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking:  # a few batches only: not the constraint set, and not c_0
            return
        self._evaluation_batch_end("val", outputs, dataloader_idx, pl_module)

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._evaluation_batch_end("test", outputs, dataloader_idx, pl_module)

    # ------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        refs: dict[str, float] = dict(self._restored_references)
        for key, group in self.metrics.items():
            if "relative" in group and group["relative"].reference is not None:
                refs[key] = group["relative"].reference
        return {"references": refs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored_references = {k: float(v) for k, v in state_dict.get("references", {}).items()}
        for key in self.metrics:
            self._apply_reference(key)
