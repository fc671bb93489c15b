"""What TensorBoard shows of a ConstrainedModule run, read back with TensorBoard's own reader.

The expected values at step 0 are computed independently from a copy of the initial network; the group
order is TensorBoard's Time Series rule (tags grouped by their first component, groups in natural order
with digits and '/' first and upper case before lower case, the first two groups expanded).
"""

from __future__ import annotations

import copy
import math
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_constrained.module_parts.tensorboard import default_logger, next_version, run_name
from lit_constrained.module_parts.varying import VaryingScalars
from lit_constrained.module_parts.step_logging import step_index
from lit_constrained.optim import SQPAdam
from lit_constrained.tasks.curve import CurveData, CurveFit, target

from tests.helpers.sync_counting import SyncCounter

ROOT = Path(__file__).resolve().parents[2]
STEPS, LOG_EVERY, VAL_EVERY = 9, 3, 3


def _group_key(group: str) -> list[tuple[int, str]]:
    """TensorBoard's natural order of group names, for names without digits: '/' first, then by code
    point (upper case before lower case)."""
    return [(0 if ch == "/" else 1, ch) for ch in group]


def _opening_groups(tags: list[str]) -> list[str]:
    groups = sorted({t.split("/", 1)[0] for t in tags}, key=_group_key)
    return groups[:2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.manual_seed(0)
    task = CurveFit(hidden=16, optimizer={"class_path": "lit_constrained.optim.SQPAdam", "init_args": {"lr": 0.01}},
                    lr_decay="none")  # a constant lr: written once as text, not as a chart
    data = CurveData(num_samples=16, batch_size=16)  # full batch: one step per epoch
    start = copy.deepcopy(task)
    logger = TensorBoardLogger(tmp_path_factory.mktemp("tb"), name="curve")  # Lightning's defaults
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(
            accelerator="cpu", devices=1, max_steps=STEPS, log_every_n_steps=LOG_EVERY,
            check_val_every_n_epoch=VAL_EVERY, logger=logger, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        )
        trainer.fit(task, data)
    acc = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return {"acc": acc, "start": start, "data": data, "task": task}


def _series(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_the_opening_groups_are_log10_and_objective(run: dict[str, Any]) -> None:
    acc = run["acc"]
    tags = acc.Tags()
    all_tags = tags["scalars"] + tags["images"] + tags["histograms"]
    assert _opening_groups(all_tags) == ["Log10", "Objective"]
    headline = {"Objective/train", "Objective/val", "Violation/train", "Violation/val"}
    assert headline <= set(tags["scalars"])
    assert {f"Log10/{t}" for t in headline} <= set(tags["scalars"])
    assert "hp_metric" not in tags["scalars"]


def test_step_0_is_the_start_for_train_and_val(run: dict[str, Any]) -> None:
    acc, net, data = run["acc"], run["start"].net, run["data"]
    x, y = data.train_set.tensors
    x_val, y_val = data.val_set.tensors
    with torch.no_grad():
        c0 = (net(run["start"].anchor_x).squeeze(-1) - run["start"].anchor_y).abs().max()
        expected = {
            "Objective/train": (net(x) - y).pow(2).mean(),
            "Violation/train": c0,
            "Objective/val": (net(x_val) - y_val).pow(2).mean(),
            "Violation/val": c0,
            "val/mse": (net(x_val) - target(x_val)).pow(2).mean(),
        }
    for tag, value in expected.items():
        step, logged = _series(acc, tag)[0]
        assert step == 0, tag
        assert logged == pytest.approx(float(value), rel=1e-5), tag
    # then Lightning's cadence: train every LOG_EVERY steps, val after every VAL_EVERY-th epoch
    assert [s for s, _ in _series(acc, "Objective/train")] == [0, 2, 5, 8]
    assert [s for s, _ in _series(acc, "Objective/val")] == [0, 2, 5, 8]
    assert _series(acc, "Violation/train")[-1][1] < 0.1 * float(c0)


def test_no_duplicate_or_constant_charts(run: dict[str, Any]) -> None:
    acc = run["acc"]
    series = {tag: tuple(v for _, v in _series(acc, tag)) for tag in acc.Tags()["scalars"]}
    for tag, values in series.items():
        if len(values) > 1:
            assert len(set(values)) > 1, f"{tag} is constant: {values[0]}"
    by_values: dict[tuple[float, ...], str] = {}
    for tag, values in series.items():
        assert values not in by_values, f"{tag} repeats {by_values.get(values)}"
        by_values[values] = tag
    assert not any(t in series for t in ("optim/lr", "optim/violation_max", "optim/step_norm"))
    # the constants are written once, as text
    (text,) = acc.Tensors("run/constants/text_summary")
    assert "optim/lr | 0.01" in text.tensor_proto.string_val[0].decode()


def test_hparams_tab_columns_and_metrics(run: dict[str, Any]) -> None:
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = run["acc"].PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    params = start.session_start_info.hparams
    assert params["optimizer"].string_value == "SQPAdam"
    assert params["lr"].number_value == pytest.approx(0.01)
    assert params["rho"].string_value == "full"
    assert params["task"].string_value == "CurveFit"
    assert params["lr_scheduler"].string_value == "none"
    assert len(params) <= 5  # the HParams dashboard shows its first five columns
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics == ["Objective/train", "Objective/val", "Violation/train", "Violation/val"]
    assert set(metrics) <= set(run["acc"].Tags()["scalars"])  # the metrics are real scalars


def test_custom_scalars_layout_puts_train_and_val_on_one_chart(run: dict[str, Any]) -> None:
    import re

    from tensorboard.plugins.custom_scalar import layout_pb2

    (event,) = run["acc"].Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    charts = {chart.title: list(chart.multiline.tag) for category in layout.category for chart in category.chart}
    tags = run["acc"].Tags()["scalars"]
    matched = {title: sorted(t for t in tags if any(re.search(p, t) for p in patterns)) for title, patterns in charts.items()}
    assert sorted(matched.values()) == [
        ["Log10/Objective/train", "Log10/Objective/val"], ["Log10/Violation/train", "Log10/Violation/val"],
        ["Objective/train", "Objective/val"], ["Violation/train", "Violation/val"],
    ]
    assert list(charts)[0].startswith("log10")  # the decades first


def test_prediction_figure_at_every_validation(run: dict[str, Any]) -> None:
    images = run["acc"].Images("prediction")
    assert [i.step for i in images] == [s for s, _ in _series(run["acc"], "Objective/val")]
    assert all(i.width <= 400 for i in images)  # TensorBoard's image card is ~360 px wide


class _CountedCurve(CurveFit):
    """Counts the host syncs of the logging in each training step and of the progress-bar read."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.syncs: list[tuple[int, bool, int]] = []

    def _log_step(self, result: Any) -> None:
        logging = self.is_logging_step()
        with SyncCounter() as counter:
            super()._log_step(result)
            self.trainer.progress_bar_metrics  # what a progress bar reads after every batch
        self.syncs.append((step_index(self.trainer), logging, counter.count))


def test_progress_bar_values_are_read_on_logging_steps_only() -> None:
    torch.manual_seed(0)
    task = _CountedCurve(hidden=16, optimizer={"class_path": "lit_constrained.optim.SQPAdam", "init_args": {"lr": 0.01}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(
            accelerator="cpu", devices=1, max_steps=8, log_every_n_steps=4, logger=False, limit_val_batches=0,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )
        trainer.fit(task, CurveData(num_samples=16, batch_size=16))
    assert [(s, logging) for s, logging, _ in task.syncs] == [(s, s in (3, 7)) for s in range(8)]
    for step, logging, count in task.syncs:
        if logging:
            assert count > 0, step
        elif step > 0:  # step 0 reads the start values once
            assert count == 0, (step, count)


def test_varying_scalars_chart_a_name_from_its_first_change() -> None:
    varying = VaryingScalars()
    assert varying.update(0, {"rank": 3.0, "rho": 2.0, "norm": 1.0}) == []
    assert varying.update(5, {"rank": 3.0, "rho": 2.0, "norm": 0.5}) == [(0, {"norm": 1.0}), (5, {"norm": 0.5})]
    # rank changes at step 9: its held values (steps 0 and 5) are written at their steps, then step 9's
    assert varying.update(9, {"rank": 2.0, "rho": 2.0, "norm": 0.5}) == [
        (0, {"rank": 3.0}), (5, {"rank": 3.0}), (9, {"rank": 2.0, "norm": 0.5})]
    assert varying.constants() == {"rho": 2.0}
    (*held, now) = varying.update(12, {"rank": 2.0, "rho": math.nan, "norm": 0.4})
    assert held == [(0, {"rho": 2.0}), (5, {"rho": 2.0}), (9, {"rho": 2.0})]
    assert now[0] == 12 and now[1]["rank"] == 2.0 and now[1]["norm"] == 0.4 and math.isnan(now[1]["rho"])
    assert varying.constants() == {}
    fresh = VaryingScalars()
    fresh.update(0, {"x": math.nan})
    assert fresh.update(1, {"x": math.nan}) == [] and math.isnan(fresh.constants()["x"])


def _written(stream: list[tuple[int, dict[str, float]]], resume_at: int | None = None) -> set[tuple[int, str]]:
    """The (step, name) points a VaryingScalars writes for ``stream`` (``resume_at``: its state is
    saved before that step and loaded into a new one, as a checkpoint resume does)."""
    varying, points = VaryingScalars(), set()
    for step, values in stream:
        if step == resume_at:
            state = varying.state_dict()
            varying = VaryingScalars()
            varying.load_state_dict(state)
        points |= {(s, name) for s, metrics in varying.update(step, values) for name in metrics}
    return points


def test_varying_scalars_write_the_same_points_whenever_the_first_change_shows() -> None:
    """A round-off quantity (a linearized feasibility error, say) that leaves exactly 0 at step 1 in
    one run and only at step 3 in another (another summation order) is charted at the same steps in
    both; a name that never changes is charted in neither."""
    steps = range(0, 12, 2)
    early = [(s, {"error": 0.0 if s == 0 else 1e-16 * s, "rank": 1.0}) for s in steps]
    late = [(s, {"error": 0.0 if s < 6 else 1e-16 * s, "rank": 1.0}) for s in steps]
    expected = {(s, "error") for s in steps}
    assert _written(early) == _written(late) == expected
    assert _written(late, resume_at=4) == expected  # the held steps survive a checkpoint
    varying = VaryingScalars()
    for step, values in late[:3]:
        varying.update(step, values)
    assert varying.state_dict()["held"]["rank"] == [[0, 2, 3]]  # a regular cadence: one run of steps
    # a state saved before the held steps were kept: only the first step is written back
    old = VaryingScalars()
    old.load_state_dict({"first": {"error": (0, 0.0)}, "varying": []})
    assert old.update(7, {"error": 1.0}) == [(0, {"error": 0.0}), (7, {"error": 1.0})]


def test_default_run_directory_is_task_and_optimizer(tmp_path: Path) -> None:
    task = CurveFit(hidden=4, optimizer={"class_path": "lit_constrained.optim.SQPAdam", "init_args": {"lr": 0.01}})
    assert run_name(task) == "curvefit/SQPAdam"
    assert run_name(CurveFit(hidden=4, optimizer=torch.optim.Adam)) == "curvefit/Adam"
    logger = default_logger(task, str(tmp_path))
    assert Path(logger.log_dir) == tmp_path / "lightning_logs" / "curvefit" / "SQPAdam" / "version_000"
    (tmp_path / "lightning_logs/curvefit/SQPAdam/version_009").mkdir(parents=True)
    assert next_version(str(tmp_path / "lightning_logs/curvefit/SQPAdam")) == 10
    assert Path(default_logger(task, str(tmp_path)).log_dir).name == "version_010"
    assert logger._default_hp_metric is False


def test_cli_keeps_a_configured_logger(tmp_path: Path) -> None:
    from lit_constrained.cli.fit import ConstrainedCLI

    cli = ConstrainedCLI.__new__(ConstrainedCLI)  # only the logger default is exercised
    cli.model = CurveFit(hidden=4, optimizer=SQPAdam)
    assert cli._with_default_logger({"logger": False})["logger"] is False
    mine = TensorBoardLogger(tmp_path, name="mine")
    assert cli._with_default_logger({"logger": mine})["logger"] is mine
    chosen = cli._with_default_logger({"logger": None, "default_root_dir": str(tmp_path)})["logger"]
    assert Path(chosen.log_dir) == tmp_path / "lightning_logs/curvefit/SQPAdam/version_000"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_screenshot_script_writes_both_views(run: dict[str, Any], tmp_path: Path) -> None:
    logdir = Path(run["acc"].path).parent
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/tensorboard_screenshots.py"), str(logdir), str(tmp_path),
         "--budget-ms", "8000"], capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    for view in ("opening", "images"):
        png = tmp_path / f"tensorboard_{view}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_start_validation_respects_limit_val_batches() -> None:
    from lit_constrained.module_parts.validation_pass import batch_limit as _batch_limit

    assert _batch_limit(3, range(10)) == 3
    assert _batch_limit(0.5, range(10)) == 5
    assert _batch_limit(0.01, range(10)) == 1
    assert _batch_limit(1.0, range(10)) == math.inf
