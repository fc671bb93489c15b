"""``lit-constrained compare``: a tiny grid end to end (CSV, JSON, figures, table, TensorBoard, resume)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from lit_constrained.compare import main
from lit_constrained.compare.configs import find_config, run_config
from lit_constrained.compare.grid import RunSpec, build_grid, parse_rho
from lit_constrained.compare.worker import summarize

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 4


def test_tiny_grid_writes_outputs_and_skips_finished_runs(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = [
        "--task", "curve", "--methods", "sqp_adam,adam_unc", "--lrs", "0.01", "--full-seeds", "1",
        "--max-epochs", str(EPOCHS), "--config-dir", str(ROOT / "configs"), "--out", str(out),
        "--jobs", "1", "--no-progress",
    ]
    assert main(argv) == 0
    first = capsys.readouterr()

    # tidy CSV: one row per (run, epoch), both runs, every epoch, finite objective and test error
    with open(out / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    runs = {row["run"] for row in rows}
    assert runs == {"sqp_adam_lr0.01_default_seed0", "adam_unc_lr0.01_default_seed0"}
    for run in runs:
        epochs = sorted(int(r["epoch"]) for r in rows if r["run"] == run)
        assert epochs == list(range(1, EPOCHS + 1))
    for row in rows:
        assert math.isfinite(float(row["objective"])) and math.isfinite(float(row["test_error"]))
        assert float(row["violation_max"]) >= 0 and row["test_metric"] == "mse"
    # the curve task's validation set is the noiseless target, so val objective == val mse there
    assert all(float(r["objective"]) == pytest.approx(float(r["test_error"])) for r in rows)

    # step counts: full batch on curve (256 samples, batch 256) is one optimizer step per epoch
    results = json.loads((out / "results.json").read_text())
    assert {r["name"] for r in results} == runs
    for result in results:
        assert result["status"] == "ok"
        assert [h["step"] for h in result["history"]] == [float(e) for e in range(1, EPOCHS + 1)]

    # a fair comparison: the same seed gives both methods the same initial network, so the objective of
    # the first step (taken at the initial weights) is identical, and the trajectories then differ
    by_method = {r["spec"]["method"]: r["history"] for r in results}
    assert by_method["sqp_adam"][0]["train_objective"] == by_method["adam_unc"][0]["train_objective"]
    assert by_method["sqp_adam"][-1]["val_objective"] != by_method["adam_unc"][-1]["val_objective"]

    # figures and table
    for name in ("loss.png", "test_error.png", "violation.png"):
        assert (out / name).stat().st_size > 5_000
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "table.md").read_text()
    assert "SQP-Adam(con)" in table and "Adam(unc)" in table and "| method |" in table
    assert "SQP-Adam(con)" in first.out

    # TensorBoard: one run per grid point, named compare/<task>/<run>, with the epoch curves
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for run in runs:
        folder = out / "tensorboard" / "compare" / "curve" / run
        acc = EventAccumulator(str(folder))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"epoch/val_objective", "epoch/violation_max", "val/objective"} <= tags
        assert [e.step for e in acc.Scalars("epoch/val_objective")] == list(range(1, EPOCHS + 1))

    # the second invocation skips both runs and leaves their result files untouched
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    assert main(argv) == 0
    second = capsys.readouterr()
    assert "0 run(s) done, 2 skipped" in second.err
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == stamps


def test_grid_follows_the_paper_defaults():
    runs = build_grid("spring", ["sqp_adam", "sqp_heavyball", "adam_con", "adam_unc"], [5e-4, 1e-4],
                      ["full", "minibatch"], ["paper", "full"], full_seeds=1, minibatch_seeds=5, max_epochs=10)
    # constrained: 3 methods x 2 rho x 2 lr x (1 + 5) seeds; Adam(unc) has no rho: 2 lr x 6
    assert len(runs) == 3 * 2 * 2 * 6 + 2 * 6
    assert len({r.name for r in runs}) == len(runs)
    paper = [r for r in runs if r.rho_variant == "paper"]
    assert {r.rho for r in paper} == {1.0}  # the spring's rho
    assert all(r.rho is None for r in runs if r.method == "adam_unc")
    assert sorted({r.seed for r in runs if r.mode == "minibatch"}) == [0, 1, 2, 3, 4]
    assert {r.seed for r in runs if r.mode == "full"} == {0}
    darcy = build_grid("darcy", ["sqp_adam", "sqp_heavyball"], [1e-3], ["full"], ["paper"], 1, 0, 1)
    assert {r.method: r.rho for r in darcy} == {"sqp_adam": 0.5, "sqp_heavyball": 1.0}


def test_run_config_overrides(tmp_path):
    spec = RunSpec("spring", "sqp_adam", "full", "full", 1e-4, "minibatch", 3, 7)
    config = run_config(spec, ROOT / "configs", tmp_path, threads=1, eval_every=2)
    opt = config["model"]["init_args"]["optimizer"]
    assert opt["class_path"].endswith("SQPAdam") and opt["init_args"]["lr"] == 1e-4 and opt["init_args"]["rho"] == "full"
    assert config["seed_everything"] == 3 and config["data"]["init_args"]["batch_mode"] == "minibatch"
    assert config["trainer"]["max_epochs"] == 7 and config["trainer"]["check_val_every_n_epoch"] == 2
    assert config["trainer"]["logger"]["init_args"]["version"] == spec.name
    yaml.safe_dump(config)  # serializable
    # a method without its own config file is swapped into another config of the task
    swapped = run_config(RunSpec("curve", "adam_con", "paper", 1.0, 0.01, "default", 0, 1), ROOT / "configs",
                         tmp_path, threads=1)
    assert swapped["model"]["init_args"]["optimizer"]["class_path"] == "lit_constrained.optim.AdamCon"
    assert swapped["model"]["init_args"]["optimizer"]["init_args"]["rho"] == 1.0


def test_config_lookup_order(tmp_path):
    for place in (tmp_path / "t", tmp_path / "t" / "paper"):
        place.mkdir(parents=True, exist_ok=True)
    (tmp_path / "t" / "paper" / "adam_con.yaml").write_text("model: {class_path: X}\n")
    (tmp_path / "t" / "sqp_adam.yaml").write_text("model: {class_path: X}\n")
    (tmp_path / "t" / "paper" / "sqp_adam.yaml").write_text("model: {class_path: X}\n")
    assert find_config(tmp_path, "t", "sqp_adam") == (tmp_path / "t" / "sqp_adam.yaml", True)
    assert find_config(tmp_path, "t", "sqp_adam", prefer_paper=True) == (tmp_path / "t" / "paper" / "sqp_adam.yaml", True)
    assert find_config(tmp_path, "t", "adam_con") == (tmp_path / "t" / "paper" / "adam_con.yaml", True)
    # no config of its own: derived from another method's (the optimizer is swapped in run_config)
    assert find_config(tmp_path, "t", "adam_unc") == (tmp_path / "t" / "sqp_adam.yaml", False)


def test_summary_weights_time_by_steps():
    history = [
        {"epoch": 1.0, "step": 1.0, "time_per_step_s": 4.0, "violation_max": 1.0, "val_objective": 2.0, "val_mse": 3.0},
        {"epoch": 2.0, "step": 4.0, "time_per_step_s": 1.0, "violation_max": 0.5},
    ]
    summary = summarize(history, "mse")
    assert summary["time_per_step_s"] == pytest.approx((4.0 * 1 + 1.0 * 3) / 4)
    assert summary["objective"] == 2.0 and summary["test_error"] == 3.0 and summary["validated_epoch"] == 1.0
    assert summary["violation_max"] == 0.5 and summary["epochs"] == 2.0


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="paper', 'full' or a number"):
        parse_rho("fast")
    with pytest.raises(ValueError, match="Unknown method"):
        build_grid("spring", ["sgd"], [1e-3], ["full"], ["paper"], 1, 0, 1)
    with pytest.raises(ValueError, match="Batch modes"):
        build_grid("spring", ["sqp_adam"], [1e-3], ["tiny"], ["paper"], 1, 0, 1)
    with pytest.raises(ValueError, match="No configs for task"):
        run_config(RunSpec("nope", "sqp_adam", "paper", 1.0, 1e-3, "full", 0, 1), tmp_path, tmp_path, 1)
    with pytest.raises(SystemExit):
        main(["--task", "spring", "--rho", "fast", "--out", str(tmp_path)])
