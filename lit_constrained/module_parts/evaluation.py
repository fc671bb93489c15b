"""One validation/test batch: the objective f, the imposed constraints c, the residual r over every
point of ``validation_constraints()`` and the task's metrics, computed with gradients on (residuals take
input derivatives) and logged under the tags of :mod:`lit_constrained.module_parts.tags`.

Used by the module's ``validation_step``/``test_step``, by the validation at the initial weights
(:mod:`~lit_constrained.module_parts.validation_pass`) and by the end-of-fit summary's validation at the
final weights (:class:`~lit_constrained.callbacks.summary.FitSummary`), so all three see the same values.

The constraints and the residual are evaluated with autocast off, in the parameters' dtype, as the
training step evaluates them (:func:`~lit_constrained.stepping.constraint_precision`): under ``bf16-mixed``
Lightning's evaluation context would run the network in bfloat16 (8 significant bits), and max |c| would
report its rounding (1.6 against 6.9e-5 in float32 at the same weights) instead of the constraints.
The objective and the metrics keep the run's precision.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..batch import clone_tensors
from ..imposed import violated_part
from ..hints import DERIVATIVE_FIX, add_hint, evaluation_hook_hint, is_derivative_without_graph
from ..metrics.functional import violation_max
from ..optim.checks import check_constraints, check_objective
from ..stepping import constraint_precision, row_signs
from .step_logging import part_violations
from .tags import OBJECTIVE, RESIDUAL, VIOLATION, tag

Evaluation = tuple[Tensor, Tensor | None, Tensor | None, dict[str, Any]]
"""f, the imposed c (or None), the residual r (or None), the task's metrics: all detached."""


def measures_residual(task: Any) -> bool:
    """Whether ``task``'s ``validation_constraints()`` measures more than its imposed constraints: its
    class redefines the hook below the class that introduced it (ConstrainedModule's default returns
    ``constraints(batch)``)."""
    definers = [klass for klass in type(task).__mro__ if "validation_constraints" in vars(klass)]
    return len(definers) > 1


def evaluate(task: Any, batch: Any, stage: str) -> Evaluation:
    """f, the imposed constraints c (None unless ``task.constraints_shared``), the residual over all
    points (None unless the task overrides validation_constraints or its constraints are per rank)
    and the task's metrics on one evaluation batch (``stage``: ``"val"`` or ``"test"``)."""
    # residuals need input derivatives: leave Lightning's inference mode for this step
    with torch.inference_mode(False), torch.enable_grad():
        batch = task.prepare_batch(clone_tensors(batch))
        name = type(task).__name__
        f = check_objective(_call_hook(task, "objective", batch, stage), f"{name}.objective()")
        # the imposed constraints are one fixed set only when shared (the same on every rank and in
        # every batch); per-rank constraints at validation are the residual of the val batches
        shared = bool(task.constraints_shared)
        c = None
        with constraint_precision(_device(task)):  # autocast off: c and r in the parameters' dtype
            if shared:
                c = check_constraints(_call_hook(task, "constraints", batch, stage), f"{name}.constraints()", None, False)
                if c is not None:  # inequality rows count by their violated part, max(g, 0)
                    c = violated_part(c, row_signs(task, c.numel()))
            r = None
            if measures_residual(task) or not shared:
                r = check_constraints(_call_hook(task, "validation_constraints", batch, stage),
                                      f"{name}.validation_constraints()", None, False)
        metrics = _call_hook(task, "evaluation_metrics", batch, stage)
    detach = lambda t: None if t is None else t.detach()  # noqa: E731
    return f.detach(), detach(c), detach(r), {k: detach(v) if isinstance(v, Tensor) else v for k, v in metrics.items()}


def _device(task: Any) -> torch.device:
    """Where ``task``'s parameters live (the CPU for a task without any)."""
    parameter = next(iter(task.parameters()), None) if hasattr(task, "parameters") else None
    return parameter.device if parameter is not None else torch.device("cpu")


def _call_hook(task: Any, hook: str, batch: Any, stage: str) -> Any:
    """``task.<hook>(batch)`` on an evaluation batch; an error raised in it gets a hint saying that the
    hooks also run on validation/test batches, and what this batch holds."""
    try:
        return getattr(task, hook)(batch, stage) if hook == "evaluation_metrics" else getattr(task, hook)(batch)
    except Exception as error:
        if is_derivative_without_graph(error):
            raise add_hint(error, DERIVATIVE_FIX)
        train_batch = getattr(getattr(task, "stepper", None), "batch_description", None)
        raise add_hint(error, evaluation_hook_hint(type(task).__name__, hook, stage, batch, train_batch))


def log_evaluation_step(module: Any, batch: Any, stage: str) -> dict[str, Tensor | None]:
    """:func:`evaluate` ``batch`` and log it through ``module.log`` (reduced over the ranks: the mean
    of f and of the metrics, the max of max |c| and max |r|); the step's output for the callbacks."""
    f, c, r, metrics = evaluate(module, batch, stage)
    # each evaluation batch weighs the same in the epoch mean (batch_size=1 says so to Lightning)
    module.log(tag(OBJECTIVE, stage), f, sync_dist=True, batch_size=1)
    if c is not None and c.numel():
        module.log(tag(VIOLATION, stage), violation_max(c), sync_dist=True, reduce_fx="max", batch_size=1)
        for key, value in part_violations(module.imposed_layout, c, stage).items():
            module.log(key, value, sync_dist=True, reduce_fx="max", batch_size=1)
    if r is not None and r.numel():
        module.log(tag(RESIDUAL, stage), violation_max(r), sync_dist=True, reduce_fx="max", batch_size=1)
    for key, value in metrics.items():
        module.log(f"{stage}/{key}", value, sync_dist=True, batch_size=1)
    return {"objective": f, "constraints": c, "validation_constraints": r}
