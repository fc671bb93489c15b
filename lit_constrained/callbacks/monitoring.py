"""What :class:`~lit_constrained.module.ConstrainedModule` writes to its loggers, and how TensorBoard
shows it first.

Tag families (one name, one meaning):

=======================  ==========================================================================
``Objective/<stage>``    the objective f. ``train``: the step's (mini-batch) f at the weights x_s
                         BEFORE update s+1, at step s (step 0: the start); ``val``/``test``: the
                         mean over the evaluation batches.
``Violation/<stage>``    :math:`\\max_i |c_i|` of the m IMPOSED constraints (``constraints(batch)``);
                         ``val``/``test``: at the evaluated weights, the max over the batches.
``Violation/<part>/<s>`` the same over one part of a task's ``imposed()`` (e.g.
                         ``Violation/pde/train``, ``Violation/boundary/val``), for a task that
                         imposes two parts or more (one part's is ``Violation/<stage>`` itself).
``residual/<stage>``     :math:`\\max |r|` over every point of ``validation_constraints(batch)``
                         (e.g. all collocation points), only for a task that overrides it.
``<stage>/<name>``       the task's ``evaluation_metrics`` (e.g. ``val/mse``).
``optim/<name>``         optimizer diagnostics, charted only if it changes (then at every step; a
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
are also written as a Custom Scalars layout (train and val on one chart each, log10 first) and as the
HParams tab's metrics (optimizer, lr, rho as columns), and Lightning's constant ``hp_metric``
placeholder is turned off.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


__all__ = [
    "OBJECTIVE", "VIOLATION", "RESIDUAL", "DIAGNOSTICS", "FIGURE", "LOG10", "tag", "part_tag", "headline_tags", "scalar_layout",
    "run_hparams", "VaryingScalars", "tensorboard_writers", "write_scalars", "write_summary", "log_figure",
    "REDUNDANT_DIAGNOSTICS", "write_text", "small_figure", "run_name", "next_version", "default_logger",
    "imposes_constraints",
]

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


def imposes_constraints(optimizer: Any) -> bool:
    """Whether ``optimizer`` imposes the task's constraints: its ``requires`` names ``"constraints"``
    (the package's hard-constrained methods); torch's optimizers and MoMo step on the objective alone,
    and the constraints are then only monitored (``Violation/<stage>``)."""
    return "constraints" in getattr(optimizer, "requires", frozenset())


def run_hparams(module: Any, optimizer: Any, scheduler: Any = None) -> dict[str, int | float | str | bool]:
    """The HParams tab's columns: task, optimizer, its lr and rho, the LR scheduler.

    No more than five: TensorBoard's HParams dashboard displays only its first five columns by default
    (the task's own arguments are in the run's ``hparams.yaml`` and ``config.yaml``)."""
    group = optimizer.param_groups[0] if getattr(optimizer, "param_groups", None) else {}
    params: dict[str, int | float | str | bool] = {
        "task": type(module).__name__,
        "optimizer": type(optimizer).__name__,
    }
    if group.get("lr") is not None:  # None: set later (ConstantStepAdam's LipschitzEstimator)
        params["lr"] = float(group["lr"])
    if "rho" in group:
        params["rho"] = str(group["rho"])  # "full" or a number: one column type across runs
    params["lr_scheduler"] = type(scheduler).__name__ if scheduler is not None else "none"
    return params


class VaryingScalars:
    """Filters a stream of named scalars down to the ones that vary.

    A name is charted once one of its values differs from its first value; it is then written at every
    step it was fed, from the first on: the values held back while it looked constant (each equal to
    the first) are written at their own steps when it first changes. So what is written does not
    depend on the step at which the first difference shows: a round-off quantity that leaves exactly 0
    at step 1 in one run and only at step 2 in another (a different summation order, e.g. 1 and 2
    processes) gives both runs the same points, and the flat stretch before a change is drawn flat
    (not as a slope from the first step to the change). A name that never varies is a constant,
    reported by :meth:`constants`. NaN equals NaN here.

    The held steps are kept as arithmetic runs ``[start, stride, count]`` (one run for a regular
    logging cadence), so the state stays small over a long run.
    """

    def __init__(self) -> None:
        self.first: dict[str, tuple[int, float]] = {}
        self.held: dict[str, list[list[int]]] = {}  # the steps a not-yet-varying name was fed at
        self.varying: set[str] = set()

    def update(self, step: int, values: Mapping[str, float]) -> list[tuple[int, dict[str, float]]]:
        """Feed the values of ``step``; returns ``[(step, {name: value})]`` to write, oldest first."""
        backfill: dict[int, dict[str, float]] = {}
        now: dict[str, float] = {}
        for name, value in values.items():
            if name in self.varying:
                now[name] = value
            elif name not in self.first:
                self.first[name] = (step, value)
                self.held[name] = [[step, 0, 1]]
            else:
                first = self.first[name][1]
                same = value == first or (math.isnan(value) and math.isnan(first))
                if same:
                    _append_step(self.held[name], step)
                else:
                    self.varying.add(name)
                    for held_step in _expand_steps(self.held.pop(name)):
                        backfill.setdefault(held_step, {})[name] = first
                    now[name] = value
        out = sorted(backfill.items())
        if now:
            out.append((step, now))
        return out

    def constants(self) -> dict[str, float]:
        """The names that never varied, with their value."""
        return {name: value for name, (_, value) in self.first.items() if name not in self.varying}

    def state_dict(self) -> dict[str, Any]:
        return {"first": dict(self.first), "held": {k: [list(r) for r in v] for k, v in self.held.items()},
                "varying": sorted(self.varying)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.first = {k: (int(s), float(v)) for k, (s, v) in state.get("first", {}).items()}
        self.varying = set(state.get("varying", ()))
        held = state.get("held", {})
        # a state saved before the held steps were kept knows only each name's first step
        self.held = {k: [[int(a), int(b), int(c)] for a, b, c in held[k]] if k in held else [[s, 0, 1]]
                     for k, (s, _) in self.first.items() if k not in self.varying}


def _append_step(runs: list[list[int]], step: int) -> None:
    """Add ``step`` to the arithmetic runs ``[start, stride, count]`` (extending the last when it fits)."""
    start, stride, count = runs[-1]
    last = start + stride * (count - 1)
    if count == 1 and step > start:
        runs[-1] = [start, step - start, 2]
    elif step > last and step - last == stride:
        runs[-1][2] = count + 1
    else:
        runs.append([step, 0, 1])


def _expand_steps(runs: list[list[int]]) -> list[int]:
    """The steps of the arithmetic runs ``[start, stride, count]``, in order."""
    return [start + stride * i for start, stride, count in runs for i in range(count)]


def tensorboard_writers(trainer: Any) -> list[Any]:
    """The ``SummaryWriter`` of every TensorBoard logger of ``trainer`` (rank 0 only; else empty)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    if trainer is None or not trainer.is_global_zero:
        return []
    return [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]


def write_scalars(trainer: Any, metrics: Mapping[str, float], step: int) -> None:
    """Write ``metrics`` (Python numbers) at ``step`` to every logger, outside Lightning's cadence."""
    if trainer is None or not metrics:
        return
    for logger in trainer.loggers:
        logger.log_metrics(dict(metrics), step=step)  # rank-zero only (Lightning's decorator)


def write_summary(
    trainer: Any, params: Mapping[str, int | float | str | bool], metric_tags: Iterable[str],
    layout: Mapping[str, Any] | None = None,
) -> None:
    """The HParams summary (``params`` as columns, ``metric_tags``: scalar tags whose last values are
    the metrics) and the Custom Scalars layout, to every TensorBoard logger; ``params`` also go to every
    logger's hyper-parameters (hparams.yaml)."""
    if trainer is None:
        return
    from lightning.pytorch.loggers import TensorBoardLogger

    for logger in trainer.loggers:
        if not isinstance(logger, TensorBoardLogger):
            logger.log_hyperparams(dict(params))
    writers = tensorboard_writers(trainer)
    if not writers:
        return
    from torch.utils.tensorboard.summary import custom_scalars, hparams

    exp, ssi, sei = hparams(dict(params), {name: 0.0 for name in metric_tags})
    for writer in writers:
        file_writer = writer._get_file_writer()
        for summary in (exp, ssi, sei):
            file_writer.add_summary(summary)
        if layout:
            file_writer.add_summary(custom_scalars(dict(layout)))
        writer.flush()


def log_figure(trainer: Any, figure: Any, step: int, tag_name: str = FIGURE) -> bool:
    """Add a matplotlib figure as an image to every TensorBoard logger (rank 0) and close it."""
    import matplotlib.pyplot as plt

    writers = tensorboard_writers(trainer)
    for writer in writers:
        writer.add_figure(tag_name, figure, global_step=step, close=False)
    plt.close(figure)
    return bool(writers)


def write_text(trainer: Any, tag_name: str, text: str, step: int) -> None:
    """Add a markdown text summary (TensorBoard's Text tab) to every TensorBoard logger (rank 0)."""
    for writer in tensorboard_writers(trainer):
        writer.add_text(tag_name, text, global_step=step)
        writer.flush()


def small_figure(nrows: int = 1, ncols: int = 1, width_in: float = 4.0, row_height_in: float = 2.8, **kwargs: Any) -> tuple[Any, Any]:
    """A matplotlib ``Figure`` (no pyplot state) sized for a TensorBoard image card, and its axes.

    TensorBoard's Images tab shows an image at its card's width (about 360 px in a 1400 px window),
    so the figure is made that wide (4 in at 90 dpi) and matplotlib's 10 pt text stays about 12 px;
    stack panels in rows rather than columns.
    ``kwargs`` go to ``Figure.subplots`` (``squeeze=False`` for a 2-D array of axes).
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_in, row_height_in * nrows), dpi=90, layout="constrained")
    return figure, figure.subplots(nrows, ncols, **kwargs)


def run_name(module: Any) -> str:
    """``<task>/<Optimizer>`` of a ConstrainedModule, e.g. ``spring/SQPAdam`` (the task's class name in
    lower case, the optimizer's class name from its saved class path)."""
    task = type(module).__name__.lower()
    spec = (getattr(module, "hparams", None) or {}).get("optimizer")
    if isinstance(spec, Mapping) and spec.get("class_path"):
        optimizer = str(spec["class_path"]).rsplit(".", 1)[-1]
    else:
        factory = getattr(module, "optimizer_factory", None)
        optimizer = getattr(getattr(factory, "func", factory), "__name__", "optimizer")
    return f"{task}/{optimizer}"


def next_version(directory: str) -> int:
    """One more than the largest ``version_<n>`` under ``directory`` (0 when there is none)."""
    import os

    numbers = []
    if os.path.isdir(directory):
        for entry in os.listdir(directory):
            head, _, number = entry.partition("_")
            if head == "version" and number.isdigit() and os.path.isdir(os.path.join(directory, entry)):
                numbers.append(int(number))
    return max(numbers) + 1 if numbers else 0


def default_logger(module: Any, root_dir: str | None = None) -> Any:
    """The CLI's default logger: TensorBoard under ``<root_dir>/lightning_logs/<task>/<Optimizer>/
    version_<nnn>`` (zero-padded, so runs sort in order), without Lightning's ``hp_metric`` placeholder."""
    import os

    from lightning.pytorch.loggers import TensorBoardLogger

    save_dir = os.path.join(root_dir or os.getcwd(), "lightning_logs")
    name = run_name(module)
    version = f"version_{next_version(os.path.join(save_dir, name)):03d}"
    return TensorBoardLogger(save_dir, name=name, version=version, default_hp_metric=False)
