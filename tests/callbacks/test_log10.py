"""Log10/<tag>: the headline curves as log10 at log-spaced steps, read back with TensorBoard's reader.

Checked against the raw tags of the same run (log10 of the value logged at the same step) and
against TensorBoard's own y-range rule with "Ignore outliers in chart scaling" on (its default),
written out here from its front end (TensorBoard 2.21, line chart: the sorted values of the smoothed
series, from index ceil(0.05 (n - 1)) to floor(0.95 (n - 1)); smoothing 0.6, a debiased exponential
moving average).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_constrained.callbacks.log10 import (
    END_COPIES, GRID_POINTS, HEADLINE_TAGS, decade_grid, log_spaced_steps, next_grid_step,
)
from lit_constrained.tasks.curve import CurveData, CurveFit

STEPS = 120


def tensorboard_smoothed(values: list[float], weight: float = 0.6) -> list[float]:
    """TensorBoard's default smoothing: a debiased exponential moving average over the points."""
    smoothed, last = [], 0.0
    for count, value in enumerate(values, start=1):
        last = last * weight + (1 - weight) * value
        smoothed.append(last / (1 - weight**count))
    return smoothed


def tensorboard_y_range(values: list[float], weight: float = 0.6) -> tuple[float, float]:
    """The y range TensorBoard gives a card of one run by default (smoothing 0.6, outliers ignored)."""
    ordered = sorted(tensorboard_smoothed(values, weight))
    n = len(ordered)
    if n <= 2:
        return ordered[0], ordered[-1]
    return ordered[math.ceil(0.05 * (n - 1))], ordered[math.floor(0.95 * (n - 1))]


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> EventAccumulator:
    torch.manual_seed(0)
    task = CurveFit(hidden=16, optimizer={"class_path": "lit_constrained.optim.SQPAdam", "init_args": {"lr": 0.01}})
    logger = TensorBoardLogger(tmp_path_factory.mktemp("tb"), name="curve")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(accelerator="cpu", devices=1, max_steps=STEPS, log_every_n_steps=1, check_val_every_n_epoch=None,
                val_check_interval=10, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0).fit(task, CurveData(num_samples=16, batch_size=16))
    acc = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def test_the_grid_is_one_two_five_a_decade():
    grid = decade_grid()
    assert [next(grid) for _ in range(10)] == [0, 1, 2, 5, 10, 20, 50, 100, 200, 500]
    assert [next_grid_step(s) for s in (0, 1, 4, 5, 99, 100, 4999)] == [1, 2, 5, 10, 100, 200, 5000]


def test_log_spaced_steps_span_the_fit_evenly_in_log_step():
    steps = log_spaced_steps(4999)
    assert steps[:3] == [0, 1, 2] and steps[-1] == 4999 and len(steps) <= 36
    ratios = [b / a for a, b in zip(steps[-10:], steps[-9:])]  # away from the rounding at small steps
    assert max(ratios) / min(ratios) < 1.05 and 1.2 < ratios[0] < 1.35  # 4999^(1/34) = 1.285
    assert log_spaced_steps(0) == [0] and log_spaced_steps(3) == [0, 1, 2, 3]


@pytest.mark.parametrize("name", ["Objective/train", "Violation/train", "Objective/val", "Violation/val"])
def test_log10_points_are_log10_of_the_raw_tag_at_log_spaced_steps(events: EventAccumulator, name: str) -> None:
    raw = {e.step: e.value for e in events.Scalars(name)}
    points = [(e.step, e.value) for e in events.Scalars(f"Log10/{name}")]
    for step, value in points:
        assert value == pytest.approx(math.log10(raw[step]), abs=1e-6), (name, step)
    steps = [s for s, _ in points]
    # the first and the last raw points, each END_COPIES times; in between one point a grid step
    assert steps[:END_COPIES] == [min(raw)] * END_COPIES and steps[-END_COPIES:] == [max(raw)] * END_COPIES
    inner = steps[END_COPIES:-END_COPIES]
    assert inner == sorted(set(inner)) and len(steps) <= GRID_POINTS + 2 * END_COPIES
    grid = log_spaced_steps(STEPS - 1)
    for step in inner:  # each is the first raw step at or after a grid step
        after = [g for g in grid if g <= step]
        assert not [s for s in raw if after[-1] <= s < step], (name, step)


@pytest.mark.parametrize("name", ["Objective/train", "Violation/train", "Objective/val", "Violation/val"])
def test_tensorboard_shows_the_start_and_the_end_by_default(events: EventAccumulator, name: str) -> None:
    values = [e.value for e in events.Scalars(f"Log10/{name}")]
    low, high = tensorboard_y_range(values)
    assert low <= values[0] <= high  # the start, raw and smoothed (equal)
    # the end, raw and smoothed, inside the range up to 2 % of it (d3's nice() rounding of the domain pads
    # more): the raw line's last point is drawn, not cut off at the card's bottom
    assert values[-1] >= low - 0.02 * (high - low) and tensorboard_smoothed(values)[-1] >= low - 0.02 * (high - low)
    # while the raw tag at every step loses its start to the outlier rule (why Log10 exists)
    raw = [e.value for e in events.Scalars(name)]
    if name == "Violation/train":
        assert tensorboard_y_range(raw)[1] < raw[0]


def test_only_headline_tags_are_mirrored(events: EventAccumulator) -> None:
    mirrored = {t.removeprefix("Log10/") for t in events.Tags()["scalars"] if t.startswith("Log10/")}
    assert mirrored <= set(HEADLINE_TAGS) and {"Objective/train", "Violation/train"} <= mirrored


def test_the_logger_is_restored_after_fit(tmp_path: Any) -> None:
    logger = TensorBoardLogger(tmp_path, name="curve")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(accelerator="cpu", devices=1, max_steps=2, logger=logger, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0).fit(
            CurveFit(hidden=4), CurveData(num_samples=8, batch_size=8))
    assert "log_metrics" not in vars(logger)
