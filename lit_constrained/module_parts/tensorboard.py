"""Writing to a run's loggers outside Lightning's ``self.log`` cadence: scalars at a chosen step, the
HParams and Custom Scalars summaries, images and text (TensorBoard, rank 0); and the command line's
default logger. What the tags mean: :mod:`lit_constrained.module_parts.tags`.

Everything goes through public APIs (``Logger.log_metrics`` / ``log_hyperparams``, ``SummaryWriter``'s
``add_*`` methods and its ``file_writer``) except :func:`drop_hp_metric_placeholder`, which says why.
Lightning is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from .tags import FIGURE, headline_tags, scalar_layout


def tensorboard_writers(trainer: Any) -> list[Any]:
    """The ``SummaryWriter`` of every TensorBoard logger of ``trainer`` (rank 0 only; else empty)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    if trainer is None or not trainer.is_global_zero:
        return []
    return [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]


def drop_hp_metric_placeholder(trainer: Any) -> None:
    """Turn off the constant ``hp_metric`` a ``TensorBoardLogger`` built with Lightning's defaults writes
    when Lightning logs the hyper-parameters (right after ``on_fit_start``): the module writes the
    HParams tab's real metrics itself (:func:`write_summary`). The command line's logger is built
    without it (:func:`default_logger`)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            # private, unavoidable: default_hp_metric is a constructor argument only (no setter), and a
            # logger the user built is given to the Trainer already constructed. If Lightning renames it,
            # the placeholder comes back: tests/module_parts/test_tensorboard.py::
            # test_no_hp_metric_from_a_default_logger fails naming TensorBoardLogger._default_hp_metric
            logger._default_hp_metric = False


def write_scalars(trainer: Any, metrics: Mapping[str, float], step: int) -> None:
    """Write ``metrics`` (Python numbers) at ``step`` to every logger, outside Lightning's cadence."""
    if trainer is None or not metrics:
        return
    for logger in trainer.loggers:
        logger.log_metrics(dict(metrics), step=step)  # rank-zero only (Lightning's decorator)


def write_summary(
    trainer: Any, params: Mapping[str, int | float | str | bool], metric_tags: Iterable[str],
    layout: Mapping[str, Any],
) -> None:
    """The HParams summary (``params`` as columns, ``metric_tags``: scalar tags whose last values are
    the metrics) and the Custom Scalars ``layout``, to every TensorBoard logger; ``params`` also go to
    every other logger's hyper-parameters (its hparams.yaml)."""
    if trainer is None:
        return
    from lightning.pytorch.loggers import TensorBoardLogger

    for logger in trainer.loggers:
        if not isinstance(logger, TensorBoardLogger):
            logger.log_hyperparams(dict(params))
    writers = tensorboard_writers(trainer)
    if not writers:
        return
    from torch.utils.tensorboard.summary import hparams

    experiment, start, end = hparams(dict(params), {name: 0.0 for name in metric_tags})
    for writer in writers:
        writer.add_custom_scalars(dict(layout))  # also reopens the event file a previous fit's end closed
        for summary in (experiment, start, end):
            # SummaryWriter has no add_* for a ready summary: its file_writer (what torch's own
            # add_hparams writes through) takes it; add_hparams itself would write to a sub-run
            writer.file_writer.add_summary(summary)
        writer.flush()


def write_run_summary(module: Any, optimizer: Any, scheduler: Any, has_constraints: bool, has_residual: bool) -> None:
    """The run's summary at the start of training (:func:`write_summary`): the HParams columns of
    :func:`run_hparams`, the headline tags as its metrics and their Custom Scalars charts."""
    write_summary(
        module.trainer,
        run_hparams(module, optimizer, scheduler),
        headline_tags(has_constraints, has_residual),
        scalar_layout(has_constraints, has_residual),
    )


def log_figure(trainer: Any, figure: Any, step: int, tag_name: str = FIGURE) -> bool:
    """Add a matplotlib figure as an image to every TensorBoard logger (rank 0) and close it."""
    import matplotlib.pyplot as plt

    writers = tensorboard_writers(trainer)
    for writer in writers:
        writer.add_figure(tag_name, figure, global_step=step, close=False)
    plt.close(figure)
    return bool(writers)


def log_prediction_figure(
    trainer: Any, draw: Callable[[], Any], step: int, memory_freed: Callable[[], AbstractContextManager[Any]]
) -> None:
    """The figure ``draw()`` returns (None: none) as the ``prediction`` image at ``step``, drawn only for a
    TensorBoard logger, inside ``memory_freed()`` (which frees the figure's reference cycles when the
    block ends: :func:`lit_constrained.callbacks.figure_memory.figure_memory_freed`)."""
    if not tensorboard_writers(trainer):
        return
    with memory_freed():
        figure = draw()
        if figure is not None:
            log_figure(trainer, figure, step)
        del figure


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
    from lightning.pytorch.loggers import TensorBoardLogger

    save_dir = os.path.join(root_dir or os.getcwd(), "lightning_logs")
    name = run_name(module)
    version = f"version_{next_version(os.path.join(save_dir, name)):03d}"
    return TensorBoardLogger(save_dir, name=name, version=version, default_hp_metric=False)
