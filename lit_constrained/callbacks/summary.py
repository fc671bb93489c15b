"""FitSummary: what a run achieved, printed once at the end of ``fit`` (rank 0), and what each
violation figure of ``validate``/``test`` covers.

At the end of ``fit``::

    fit summary
      steps        5000 in 41.2 s (8.2 ms a step)
      objective    3.1e-01 (the last training step's objective())
      max |c|      7.6e+01 at the start -> 7.1e-05 at the end (x 9.3e-07) over the m = 3 imposed constraints
      validation   at the final weights (step 5000):
        val/objective        2.9e-01   objective() on the validation data, mean over batches
        val/violation_max    3.4e-04   max |r| over all 33 residuals of validation_constraints() (training imposes 3)
      checkpoint   lightning_logs/version_0/checkpoints/last.ckpt
      warning      the run is diverging: the objective grew to ... Try a smaller lr ...

"warning" lines are the findings of :class:`~lit_constrained.callbacks.health.RunHealth` (divergence,
apparent infeasibility, lr = 0 with the full normal step), each also warned once during the run.
After a resume from step k the steps line reads ``N: k before the resume (from the checkpoint), N - k in
this run in T s``: the seconds are this run's, and so are the references of the run-health findings
(a ``health`` line says which steps they judge) and "at this run's start" of max |c|.
"at the start" is max |c(x_0)| at the first step's weights (before any update); "at the end" is
evaluated again at the final weights. Validation figures come from the run's last validation if it
was at the final step; otherwise they are computed here, at the final weights, from the DataModule's
validation loader (so a run of any length reports them).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lit_constrained.batch import as_task_sees_it
from lit_constrained.callbacks.health import RunHealth
from lit_constrained.imposed import SenseRows, active_rows, violated_part
from lit_constrained.module_parts.constraint_precision import WARN_AFTER_STEPS, feasibility_finding
from lit_constrained.module_parts.evaluation import evaluate, measures_residual
from lit_constrained.module_parts.tags import OBJECTIVE, RESIDUAL, VIOLATION, tag
from lit_constrained.module_parts.trainer_checks import attached_trainer, imposes_constraints
from lit_constrained.module_parts.validation_pass import as_loader_list, overrides_hook, validation_batches
from lit_constrained.stepping import constraint_precision, row_signs


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.2e}"


def _max_abs(c: Any) -> float | None:
    if not isinstance(c, Tensor) or c.numel() == 0:
        return None
    return float(c.detach().abs().max())


def constraint_role(pl_module: Any) -> str:
    """``"imposed"``, or what the fit's optimizer does with the constraints instead: ``"monitored, not
    imposed"`` (e.g. torch.optim.Adam, MoMo) or ``"penalized, not imposed"`` (with a penalty_weight)."""
    trainer = attached_trainer(pl_module)
    optimizers = getattr(trainer, "optimizers", None) or []
    if not optimizers or imposes_constraints(optimizers[0]):
        return "imposed"
    penalty = getattr(getattr(pl_module, "stepper", None), "penalty_weight", 0.0)
    return "penalized, not imposed" if penalty else "monitored, not imposed"


class _EvalCount:
    """Residual rows and their max |r| over one validation/test run (this rank's batches)."""

    def __init__(self) -> None:
        self.rows = 0
        self.max_abs: Tensor | None = None
        self.batch_rows: set[int] = set()  # the number of rows of each batch

    def add(self, c: Any) -> None:
        if isinstance(c, Tensor) and c.numel():
            self.rows += c.numel()
            self.batch_rows.add(c.numel())
            m = c.detach().abs().max()
            self.max_abs = m if self.max_abs is None else torch.maximum(self.max_abs, m)


class FitSummary(Callback):
    """Prints the end-of-fit summary and names what each evaluation violation figure covers.

    ConstrainedModule adds it to every Trainer (``configure_callbacks``); only rank 0 prints.
    """

    def __init__(self) -> None:
        self._start_time: float | None = None
        self._c_start: float | None = None
        self._m: int | None = None
        self._last_batch: Any = None
        self._evals: dict[str, _EvalCount] = {}
        self._last_val_step: int | None = None
        self._m_eval: int | None = None  # m seen at evaluation (validate/test without a fit)
        self._imposed_evals: dict[str, _EvalCount] = {}  # constraints() rows on each evaluation's batches
        self._steps_before: int | None = 0  # global_step at this fit's start: > 0 after a resume

    # ------------------------------------------------------------------ bookkeeping
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start_time = time.perf_counter()
        self._c_start, self._m, self._last_batch, self._last_val_step = None, None, None, None
        self._steps_before = None  # until on_train_start (a fit resumed at its end never gets there)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # after the checkpoint's loops are restored: the steps a resumed fit took before its interruption
        self._steps_before = int(trainer.global_step)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._last_batch = as_task_sees_it(pl_module, batch)
        if self._m is None and isinstance(outputs, dict):
            c = outputs.get("constraints")
            self._m = c.numel() if isinstance(c, Tensor) else 0
            self._c_start = _max_abs(c)  # once per run: c at the first step's weights x_0

    def _eval_start(self, stage: str) -> None:
        self._evals[stage] = _EvalCount()
        self._imposed_evals[stage] = _EvalCount()

    def _eval_batch(self, stage: str, outputs: Any) -> None:
        # the evaluation step returns the imposed c and, for a task that overrides
        # validation_constraints, its residual r over all points; r is what the residual figure covers
        if isinstance(outputs, dict):
            imposed = outputs.get("constraints")
            if isinstance(imposed, Tensor) and self._m is None:
                self._m_eval = imposed.numel()
            self._imposed_evals.setdefault(stage, _EvalCount()).add(imposed)
            residual = outputs.get("validation_constraints", imposed)
            self._evals.setdefault(stage, _EvalCount()).add(residual)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_start("val")

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_start("test")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:  # type: ignore[no-untyped-def]
        self._eval_batch("val", outputs)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:  # type: ignore[no-untyped-def]
        self._eval_batch("test", outputs)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if trainer.state.fn == "fit":
            self._last_val_step = trainer.global_step
        elif trainer.is_global_zero:
            self._print_legend(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self._print_legend(trainer, pl_module, "test")

    # ------------------------------------------------------------------ what the figures mean
    def meaning(self, pl_module: pl.LightningModule, stage: str, key: str) -> str:
        """Plain words for the evaluation metric ``key`` (e.g. ``val/violation_max``)."""
        name = key.split("/", 1)[-1] if key.startswith(f"{stage}/") else key
        lowered = key.lower()
        if "residual" in lowered or key == f"{stage}/violation_max":
            # the residuals of validation_constraints(batch) (the imposed constraints if not overridden)
            count = self._evals.get(stage)
            rows = count.rows if count is not None else 0
            world = getattr(getattr(pl_module, "trainer", None), "world_size", 1) or 1
            per_rank = f" on each of {world} ranks" if world > 1 else ""
            m_imposed = self._m or self._m_eval
            role = constraint_role(pl_module)
            verb = "imposes" if role == "imposed" else "monitors" if role.startswith("monitored") else "penalizes"
            m = f"training {verb} {m_imposed}: constraints()" if m_imposed else f"the {role.split(',')[0]} ones are constraints()"
            if measures_residual(pl_module):
                return f"max |r| over all {rows} residuals of validation_constraints(){per_rank} ({m})"
            described = "imposed constraints" if role == "imposed" else f"constraints ({role})"
            return f"max |c| over the {rows} {described}, constraints() on the {stage} data{per_rank}"
        if "violation" in lowered:
            if len(key.split("/")) == 3:  # Violation/<part>/<stage>: one part of imposed()
                part, role = key.split("/")[1], constraint_role(pl_module)
                if role == "imposed":
                    return f"max |c| of the imposed part {part!r} (imposed()) on the {stage} data"
                # "imposed" means what the optimizer does: a part it does not impose is not called imposed
                return f"max |c| of the constraint part {part!r} (declared in imposed(); {role}) on the {stage} data"
            m_imposed = self._m or self._m_eval
            role = constraint_role(pl_module)
            seen = self._imposed_evals.get(stage)
            rows = sorted(seen.batch_rows) if seen is not None else []
            if m_imposed and rows and rows != [m_imposed]:  # constraints() of the evaluation batches' own points
                sizes = "/".join(map(str, rows))
                return (f"max |c| of constraints() on the {stage} data ({sizes} rows a batch: the {stage} batches' "
                        f"own points, not the m = {m_imposed} {role.split(',')[0]} in training)")
            m = f"m = {m_imposed} " if m_imposed else ""
            described = f"{role} constraints" if role == "imposed" else f"constraints ({role})"
            return f"max |c| of the {m}{described}, constraints() on the {stage} data"
        if name.lower() == "objective" or lowered.startswith("objective/"):
            return f"objective() on the {stage} data, mean over batches"
        return f"evaluation_metrics()['{name}'], mean over {stage} batches"

    def _print_legend(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        keys = sorted(k for k in trainer.callback_metrics if stage in k.split("/"))
        if not keys:
            return
        width = max(len(k) for k in keys)
        lines = [f"{stage} figures:"]
        for key in keys:
            value = float(trainer.callback_metrics[key])
            lines.append(f"  {key:<{width}}  {_fmt(value)}   {self.meaning(pl_module, stage, key)}")
        print("\n".join(lines), flush=True)

    # ------------------------------------------------------------------ end of fit
    def _final_constraints(self, pl_module: pl.LightningModule) -> float | None:
        constraints = getattr(pl_module, "constraints", None)
        if constraints is None or self._last_batch is None:
            return None
        # as in the step: the precision plugin's context (e.g. 64-true's default dtype), autocast off
        device = next(iter(pl_module.parameters()), torch.empty(0)).device
        with torch.enable_grad(), pl_module.trainer.precision_plugin.train_step_context(), constraint_precision(device):
            c = constraints(self._last_batch)
        signs = row_signs(pl_module, c.numel()) if isinstance(c, Tensor) else None
        self._g_end = None if signs is None else SenseRows.of(signs).inequalities(c.detach().reshape(-1))
        return _max_abs(violated_part(c, signs))  # an inequality row counts by max(g, 0)

    def _inequality_line(self, trainer: pl.Trainer) -> list[str]:
        """``inequality``: p rows g <= 0 at the final weights, how many are active (the optimizer's last
        ``active_set``, else the rows within sqrt(eps) of their bound) and the largest violation."""
        g = getattr(self, "_g_end", None)
        if g is None:
            return []
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        active_set = getattr(optimizer, "active_set", None)
        if isinstance(active_set, (Tensor, list, tuple)):
            active, how = len(active_set), "the optimizer's active set at the last step"
        else:
            active, how = active_rows(g), "rows within sqrt(eps) of their bound at the end"
        worst = float(g.clamp_min(0).max()) if g.numel() else 0.0
        return [f"  inequality   {active} of the p = {g.numel()} inequality rows active ({how}); "
                f"max(g, 0) {_fmt(worst)} at the end"]

    def _final_validation(self, trainer: pl.Trainer, pl_module: Any) -> dict[str, float]:
        """The validation figures at the final weights, from the DataModule's validation loader."""
        datamodule = trainer.datamodule
        if datamodule is None or not overrides_hook(datamodule, "val_dataloader"):
            return {}
        if trainer.limit_val_batches == 0:  # validation switched off: none at the end either
            return {}
        loaders = as_loader_list(datamodule.val_dataloader())
        imposed, residual, objectives, metrics = _EvalCount(), _EvalCount(), [], {}
        has_residual = measures_residual(pl_module)
        was_training = pl_module.training
        pl_module.eval()
        try:
            with torch.enable_grad():
                # the Trainer's own path: limit_val_batches, device transfer and the batch-transfer
                # hooks, the precision plugin's cast and context (e.g. 64-true's float64)
                for batch in validation_batches(trainer, loaders):
                    with trainer.precision_plugin.val_step_context():
                        f, c, r, task_metrics = evaluate(pl_module, batch, "val")
                    objectives.append(float(f))
                    imposed.add(c)
                    if has_residual:
                        residual.add(r)
                    for key, value in task_metrics.items():
                        metrics.setdefault(key, []).append(float(value.detach() if isinstance(value, Tensor) else value))
        finally:
            pl_module.train(was_training)
        self._evals["val"] = residual if has_residual else imposed
        self._imposed_evals["val"] = imposed
        objective_key, violation_key, residual_key = tag(OBJECTIVE, "val"), tag(VIOLATION, "val"), tag(RESIDUAL, "val")
        out = {objective_key: sum(objectives) / len(objectives)} if objectives else {}
        out.update({f"val/{k}": sum(v) / len(v) for k, v in metrics.items()})
        if imposed.max_abs is not None:
            out[violation_key] = float(imposed.max_abs)
        if residual.max_abs is not None:
            out[residual_key] = float(residual.max_abs)
        return out

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # trainer.log_dir broadcasts from rank 0 under DDP: every rank must read it, or the broadcast
        # pairs with another rank's next collective and the next fit hangs
        log_dir = trainer.log_dir if trainer.logger is not None else None
        if not trainer.is_global_zero or self._start_time is None:
            return
        seconds = time.perf_counter() - self._start_time
        steps = trainer.global_step
        if self._steps_before is None:  # training never started: every step was taken before
            self._steps_before = int(steps)
        last = getattr(pl_module, "last_step", None)
        lines = ["fit summary", self._steps_line(steps, seconds)]
        if last is not None:
            lines.append(f"  objective    {_fmt(float(last.objective))} (the last training step's objective())")
        if self._m:
            try:
                end = self._final_constraints(pl_module)
            except Exception as error:  # the summary never fails a finished fit; it says what went wrong
                lines.append(f"  max |c| at the end not evaluated: {type(error).__name__}: {error}")
                end = None
            ratio = end / self._c_start if end is not None and self._c_start else None
            role = constraint_role(pl_module)
            over = f"the m = {self._m} imposed constraints" if role == "imposed" else f"the m = {self._m} constraints, {role}"
            start = f"at this run's start (step {self._steps_before})" if self._steps_before else "at the start"
            lines.append(
                f"  max |c|      {_fmt(self._c_start)} {start} -> {_fmt(end)} at the end "
                f"(x {_fmt(ratio)}) over {over}"
            )
            lines.extend(self._inequality_line(trainer))
            lines.extend(_chosen_rows_line(pl_module))
            lines.extend(self._feasibility_lines(trainer, pl_module, end))
        lines.extend(self._validation_lines(trainer, pl_module, steps))
        ckpt = trainer.checkpoint_callback
        path = (getattr(ckpt, "last_model_path", "") or getattr(ckpt, "best_model_path", "")) if ckpt else ""
        lines.append(f"  checkpoint   {path or 'none written (no checkpoint callback ran)'}")
        if log_dir:
            lines.append(f"  logs         {log_dir}")
        lines.extend(self._health_lines(trainer, steps))
        print("\n".join(lines), flush=True)

    def _feasibility_lines(self, trainer: pl.Trainer, pl_module: Any, end: float | None) -> list[str]:
        """A ``warning`` line, also warned, when the imposed max |c| ends above the optimizer's tolerance:
        the measured float32 floors and the fix (:func:`~lit_constrained.module_parts.constraint_precision.feasibility_finding`)."""
        if self._last_batch is None or not trainer.optimizers or constraint_role(pl_module) != "imposed":
            return []
        try:
            finding = feasibility_finding(pl_module, self._last_batch, end, trainer.optimizers[0])
        except Exception as error:  # the summary never fails a finished fit; it says what went wrong
            return [f"  feasibility  not checked: {type(error).__name__}: {error}"]
        if finding is None:
            return []
        if trainer.global_step >= WARN_AFTER_STEPS:  # (a shorter fit is still restoring c: the line says it)
            warnings.warn(f"lit-constrained: {finding}", RuntimeWarning, stacklevel=2)
        return [f"  warning      {finding}"]

    def _steps_line(self, steps: int, seconds: float) -> str:
        """``steps N in T s``; after a resume the k steps before the interruption apart from this run's
        N - k steps, which alone the seconds (and the time a step) are of."""
        before = self._steps_before
        this_run = steps - before
        per_step = f" ({1e3 * seconds / this_run:.1f} ms a step)" if this_run > 0 else ""
        if not before:
            return f"  steps        {steps} in {seconds:.1f} s{per_step}"
        if this_run <= 0:
            return (f"  steps        {steps}: {before} before the resume (from the checkpoint), none in this run "
                    "(the checkpoint had reached max_steps / max_epochs already)")
        return (f"  steps        {steps}: {before} before the resume (from the checkpoint), "
                f"{this_run} in this run in {seconds:.1f} s{per_step}")

    def _health_lines(self, trainer: pl.Trainer, steps: int) -> list[str]:
        """One ``warning`` line per finding of the trainer's :class:`RunHealth` callback; after a resume,
        first the steps they judge (this run's: RunHealth's references start at the resumed step)."""
        findings = [m for cb in trainer.callbacks if isinstance(cb, RunHealth) for m in cb.findings.values()]
        lines = []
        if self._steps_before and steps > self._steps_before and any(isinstance(cb, RunHealth) for cb in trainer.callbacks):
            verdict = f"{len(findings)} finding{'s' if len(findings) != 1 else ''} below" if findings else "no finding"
            lines.append(f"  health       judged on this run's steps {self._steps_before}-{steps}: {verdict}")
        return lines + [f"  warning      {message.removeprefix('lit-constrained: ')}" for message in findings]

    def _validation_lines(self, trainer: pl.Trainer, pl_module: Any, steps: int) -> list[str]:
        if self._last_val_step == steps:
            figures = {k: float(v) for k, v in trainer.callback_metrics.items() if "val" in k.split("/")}
            where = f"the run's last validation (step {steps})"
        else:
            where = f"at the final weights (step {steps})"
            try:
                figures = self._final_validation(trainer, pl_module)
            except Exception as error:  # the summary never fails a finished fit; it says what went wrong
                return [f"  validation   not evaluated {where}: {type(error).__name__}: {error}"]
        if not figures:
            return []
        width = max(len(k) for k in figures)
        lines = [f"  validation   {where}:"]
        for key in sorted(figures):
            lines.append(f"    {key:<{width}}  {_fmt(figures[key])}   {self.meaning(pl_module, 'val', key)}")
        return lines


def _chosen_rows_line(pl_module: Any) -> list[str]:
    """``imposed  pde 40 of 1024 points, boundary 12 of 256 (chosen from the pools, every 100 steps)`` for a
    module whose parts have a ``count`` (its public ``row_choice``); none otherwise."""
    choice = getattr(pl_module, "row_choice", None)
    rows = choice.rows() if choice is not None and choice.chosen else {}
    if not rows:
        return []
    parts = ", ".join(f"{name} {points} of {pool}" for name, (points, pool) in rows.items())
    return [f"  imposed      {parts} points (chosen from the pools, every {choice.every} steps)"]

