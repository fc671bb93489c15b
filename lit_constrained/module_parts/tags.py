"""The names of what :class:`~lit_constrained.module.ConstrainedModule` logs, and how TensorBoard shows
them first. No torch, no Lightning: callbacks, the module and the command line share these names.

Tag families (one name, one meaning):

=======================  ==========================================================================
``Objective/<stage>``    the objective f. ``train``: the step's (mini-batch) f at the weights x_s
                         BEFORE update s+1, at step s (step 0: the start); ``val``/``test``: the
                         mean over the evaluation batches.
``Violation/<stage>``    :math:`\\max_i |c_i|` of the m IMPOSED constraints (``constraints(batch)``);
                         ``val``/``test``: at the evaluated weights, the max over the batches. An
                         inequality row (sense ``<=``/``>=``) counts by its violated part only,
                         :math:`\\max(g_i, 0)` (:func:`lit_constrained.imposed.violated_part`).
``Violation/<part>/<s>`` the same over one part of a task's ``imposed()`` (e.g.
                         ``Violation/pde/train``, ``Violation/boundary/val``), for a task that
                         imposes two parts or more (one part's is ``Violation/<stage>`` itself).
``residual/<stage>``     :math:`\\max |r|` over every point of ``validation_constraints(batch)``
                         (e.g. all collocation points), only for a task that overrides it.
``<stage>/<name>``       the task's ``evaluation_metrics`` (e.g. ``val/mse``).
``optim/<name>``         optimizer diagnostics (with inequality rows also ``optim/active``, the
                         active rows, and ``optim/dual_max``, the largest multiplier), charted only if it changes (then at every step; a
                         constant, such as a full rank, rho or lr without a scheduler, is written once
                         to the run's text summary instead of as a flat chart).
``prediction``           the task's ``prediction_figure()`` at every validation (Images tab).
``Log10/<tag>``          log10 of ``Objective/*``, ``Violation/*``, ``residual/val`` at few,
                         log-spaced steps (:mod:`lit_constrained.callbacks.log10`): readable on
                         TensorBoard's default linear axes.
=======================  ==========================================================================

Why the capitals: TensorBoard's Time Series tab groups cards by the tag's first component, sorts the
groups naturally (digits and upper case before lower case) and expands the first two groups when it
opens. ``Log10`` (the decades of the objective and the violation) and ``Objective`` are therefore the
two open groups, above ``Violation``, Lightning's ``epoch``, ``optim/*``, ``val/*``. The same pairs
are also written as a Custom Scalars layout (:func:`scalar_layout`: train and val on one chart each,
log10 first) and as the HParams tab's metrics (:func:`headline_tags`), and Lightning's constant
``hp_metric`` placeholder is turned off (:mod:`lit_constrained.module_parts.tensorboard`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

OBJECTIVE = "Objective"
VIOLATION = "Violation"
RESIDUAL = "residual"
DIAGNOSTICS = "optim"
FIGURE = "prediction"
LOG10 = "Log10"
"""``Log10/<tag>``: log10 of a headline tag at log-spaced steps (:mod:`lit_constrained.callbacks.log10`)."""

#: Diagnostics not charted: ``violation_max`` is ``Violation/train`` (``violation_ratio`` the same over
#: its first value); ``step_norm`` is
#: sqrt(normal^2 + tangential^2) of the two orthogonal parts, both charted; ``direction_norm`` is
#: ``step_norm / lr``.
REDUNDANT_DIAGNOSTICS = frozenset({"violation_max", "violation_ratio", "step_norm", "direction_norm"})


def tag(family: str, stage: str) -> str:
    """``"<family>/<stage>"``, e.g. ``tag(VIOLATION, "val") == "Violation/val"``."""
    return f"{family}/{stage}"


def part_tag(family: str, part: str, stage: str) -> str:
    """``"<family>/<part>/<stage>"``, e.g. ``part_tag(VIOLATION, "pde", "val") == "Violation/pde/val"``:
    a quantity of one imposed part (the stage last, so the part's train and val sit side by side)."""
    return f"{family}/{part}/{stage}"


def headline_tags(has_constraints: bool, has_residual: bool, stages: Iterable[str] = ("train", "val")) -> list[str]:
    """The tags of the headline charts, objective first, in the order TensorBoard shows them."""
    families = [OBJECTIVE] + ([VIOLATION] if has_constraints else [])
    tags = [tag(family, stage) for family in families for stage in stages]
    if has_residual:
        tags += [tag(RESIDUAL, stage) for stage in stages if stage != "train"]
    return tags


def scalar_layout(has_constraints: bool, has_residual: bool) -> dict[str, dict[str, list[Any]]]:
    """A Custom Scalars layout: train and validation of each headline quantity on one chart."""
    charts: dict[str, list[Any]] = {"log10 objective f (train, val)": ["Multiline", [rf"^{LOG10}/{OBJECTIVE}/(train|val)$"]]}
    if has_constraints:
        charts["log10 max |c| (train, val)"] = ["Multiline", [rf"^{LOG10}/{VIOLATION}/(train|val)$"]]
    if has_residual:
        charts["log10 max residual over all validation points"] = ["Multiline", [rf"^{LOG10}/{RESIDUAL}/val$"]]
    charts["objective f (train, val)"] = ["Multiline", [rf"^{OBJECTIVE}/(train|val)$"]]
    if has_constraints:
        charts["max |c| of the constraints (train, val)"] = ["Multiline", [rf"^{VIOLATION}/(train|val)$"]]
    if has_residual:
        charts["max residual over all validation points"] = ["Multiline", [rf"^{RESIDUAL}/val$"]]
    return {"constrained training": charts}
