"""module_parts.tensorboard through public APIs only: the HParams and Custom Scalars summaries read back
with TensorBoard's own reader, also from a writer a finished fit closed; no hp_metric placeholder from
a TensorBoardLogger built with Lightning's defaults."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import plugin_data_pb2

from lit_constrained.module_parts.tags import headline_tags, scalar_layout
from lit_constrained.module_parts.tensorboard import drop_hp_metric_placeholder, write_summary

PARAMS = {"task": "CurveFit", "optimizer": "SQPAdam", "lr": 0.01, "rho": "full", "lr_scheduler": "none"}


def _trainer(logger: TensorBoardLogger) -> SimpleNamespace:
    return SimpleNamespace(is_global_zero=True, loggers=[logger])


def _read(log_dir: str) -> EventAccumulator:
    events = EventAccumulator(log_dir, size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    return events


def _hparams_and_layout(events: EventAccumulator) -> tuple[dict[str, object], list[str], list[str]]:
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    values = {k: (v.string_value or v.number_value) for k, v in start.hparams.items()}
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    metrics = [m.name.tag for m in experiment.metric_infos]
    layout = layout_pb2.Layout.FromString(events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    titles = [chart.title for category in layout.category for chart in category.chart]
    return values, metrics, titles


def test_summary_columns_metrics_and_layout_read_back(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, name="run")
    write_summary(_trainer(logger), PARAMS, headline_tags(True, False), scalar_layout(True, False))
    values, metrics, titles = _hparams_and_layout(_read(logger.log_dir))
    assert values == PARAMS
    assert metrics == ["Objective/train", "Objective/val", "Violation/train", "Violation/val"]
    assert titles == list(scalar_layout(True, False)["constrained training"])


def test_a_writer_closed_by_a_previous_fit_is_reopened(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, name="run")
    logger.experiment.add_scalar("x", 1.0, 0)
    logger.finalize("success")  # what the end of a fit does: the SummaryWriter is closed
    assert logger.experiment.file_writer is None
    write_summary(_trainer(logger), PARAMS, headline_tags(False, False), scalar_layout(False, False))
    values, metrics, _ = _hparams_and_layout(_read(logger.log_dir))
    assert values["optimizer"] == "SQPAdam" and metrics == ["Objective/train", "Objective/val"]


def test_no_hp_metric_from_a_default_logger(tmp_path: Path) -> None:
    default, dropped = TensorBoardLogger(tmp_path, name="default"), TensorBoardLogger(tmp_path, name="dropped")
    drop_hp_metric_placeholder(_trainer(dropped))
    for logger in (default, dropped):  # what Lightning does right after on_fit_start
        logger.log_hyperparams({"hidden": 16})
        logger.experiment.flush()
    assert "hp_metric" in _read(default.log_dir).Tags()["scalars"]  # the placeholder the module turns off
    # the private attribute drop_hp_metric_placeholder sets (no public setter): a rename brings the placeholder back
    assert vars(TensorBoardLogger(tmp_path, name="fresh")).get("_default_hp_metric") is True, (
        "lightning's TensorBoardLogger no longer keeps default_hp_metric as _default_hp_metric: "
        "lit_constrained/module_parts/tensorboard.py::drop_hp_metric_placeholder must set its new name")
    assert "hp_metric" not in _read(dropped.log_dir).Tags()["scalars"], "TensorBoardLogger._default_hp_metric changed"
