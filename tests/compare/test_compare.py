"""``lit-constrained compare``: a tiny grid end to end (records, CSV, JSON, figures, tables, TensorBoard,
resume), the budget fraction in every output, and the verdict checks on hand-built records."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from lit_constrained.compare import main
from lit_constrained.compare.configs import config_budget, find_config, fingerprint, run_config
from lit_constrained.compare.grid import RunSpec, build_grid, execution_order, parse_rho, resolve_budget
from lit_constrained.compare.verdict import CLAIMS, CONSTRAINED, Finals, least_lr_sensitive, lowest, verdict_table
from lit_constrained.compare.records import history_columns, history_from_columns, summarize, thin_history

ROOT = Path(__file__).resolve().parents[2]
EPOCHS = 4
CURVE_EPOCHS = 300  # trainer.max_epochs of configs/curve/sqp_adam.yaml: the curve task's reference budget


def _png_text(path: Path) -> str:
    """The tEXt chunks of a PNG (matplotlib writes the title given as metadata there)."""
    data = path.read_bytes()
    chunks, pos = [], 8
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        if kind == b"tEXt":
            chunks.append(data[pos + 8:pos + 8 + length].decode("latin-1"))
        pos += 12 + length
    return "\n".join(chunks)


def test_tiny_grid_writes_outputs_and_skips_finished_runs(tmp_path, capsys):
    out, work = tmp_path / "cmp", tmp_path / "work"
    argv = [
        "--task", "curve", "--methods", "sqp_adam,adam_unc", "--lrs", "0.01", "--full-seeds", "1",
        "--max-epochs", str(EPOCHS), "--config-dir", str(ROOT / "configs"), "--out", str(out),
        "--work-dir", str(work), "--jobs", "1", "--no-progress",
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

    # step counts: full batch on curve (256 samples, batch 256) is one optimizer step per epoch
    summaries = json.loads((out / "results.json").read_text())
    assert {r["name"] for r in summaries} == runs and all("history" not in r for r in summaries)
    results = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    for result in results:
        result["history"] = history_from_columns(result["history_columns"])
        assert result["status"] == "ok"
        assert result["budget"] == {"epochs": EPOCHS, "reference_epochs": CURVE_EPOCHS, "fraction": EPOCHS / CURVE_EPOCHS,
                                    "size": "embedded", "source": str(ROOT / "configs" / "curve" / "sqp_adam.yaml")}
        assert [h["step"] for h in result["history"]] == [float(e) for e in range(1, EPOCHS + 1)]
    # the records hold results only; configs, logs and TensorBoard events are in the work folder
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(f"{r}.json" for r in runs)
    assert not (out / "tensorboard").exists() and not (out / "logs").exists()
    assert sorted(p.name for p in (work / "configs").iterdir()) == sorted(f"{r}.yaml" for r in runs)

    # a fair comparison: the same seed gives both methods the same initial network, so the objective of
    # the first step (taken at the initial weights) is identical, and the trajectories then differ
    by_method = {r["spec"]["method"]: r["history"] for r in results}
    assert by_method["sqp_adam"][0]["train_objective"] == by_method["adam_unc"][0]["train_objective"]
    assert by_method["sqp_adam"][-1]["val_objective"] != by_method["adam_unc"][-1]["val_objective"]

    # figures and table, each stating the budget fraction
    fraction_text = f"budget fraction {EPOCHS / CURVE_EPOCHS:.3g} ({EPOCHS} of {CURVE_EPOCHS} epochs)"
    for name in ("loss.png", "test_error.png", "violation.png"):
        assert (out / name).stat().st_size > 5_000
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert fraction_text in _png_text(out / name)
    table = (out / "table.md").read_text()
    assert "SQP-Adam(con)" in table and "Adam(unc)" in table and "| method |" in table
    assert fraction_text in table.splitlines()[0]
    assert "SQP-Adam(con)" in first.out and fraction_text in first.err

    # TensorBoard: one run per grid point, named compare/<task>/<run>, with the epoch curves
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for run in runs:
        folder = work / "tensorboard" / "compare" / "curve" / run
        acc = EventAccumulator(str(folder))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"epoch/val_objective", "epoch/violation_max", "epoch/val_mse"} <= tags
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
    # without TensorBoard (no event files, no prediction figures): no logger, and the same run (fingerprint)
    quiet = run_config(spec, ROOT / "configs", tmp_path, threads=1, eval_every=2, tensorboard=False)
    assert quiet["trainer"]["logger"] is False and fingerprint(quiet) == fingerprint(config)
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


def test_default_budget_is_the_paper_configs_and_every_output_states_the_fraction(tmp_path, capsys):
    for task in ("spring", "chemistry", "burgers", "darcy"):
        paper = yaml.safe_load((ROOT / "configs" / task / "paper" / "sqp_adam.yaml").read_text())
        epochs, path = config_budget(ROOT / "configs", task)
        assert (epochs, path) == (paper["trainer"]["max_epochs"], ROOT / "configs" / task / "paper" / "sqp_adam.yaml")
    embedded = yaml.safe_load((ROOT / "configs" / "spring" / "sqp_adam.yaml").read_text())["trainer"]["max_epochs"]
    assert config_budget(ROOT / "configs", "spring", prefer_paper=False)[0] == embedded
    curve = yaml.safe_load((ROOT / "configs" / "curve" / "sqp_adam.yaml").read_text())["trainer"]["max_epochs"]
    assert config_budget(ROOT / "configs", "curve")[0] == curve  # no paper configs: the task's own

    budget = resolve_budget(10000, "s.yaml", "paper", fraction=0.05)
    assert budget.epochs == 500 and budget.fraction == 0.05
    assert budget.text == "budget fraction 0.05 (500 of 10000 epochs), paper size"
    assert resolve_budget(10000, "s.yaml", "paper", max_epochs=2500).text.startswith("budget fraction 0.25 (2500 of")
    assert resolve_budget(300, "s.yaml", "paper", fraction=1e-9).epochs == 1
    with pytest.raises(ValueError, match="not both"):
        resolve_budget(10, "s.yaml", "paper", max_epochs=5, fraction=0.5)
    with pytest.raises(ValueError, match="budget-fraction"):
        resolve_budget(10, "s.yaml", "paper", fraction=0.0)

    # no runs (--report-only): the header, the table and the verdict say the budget and size
    common = ["--task", "spring", "--config-dir", str(ROOT / "configs"), "--report-only", "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "a")]) == 0
    captured = capsys.readouterr()
    assert "budget fraction 1 (10000 of 10000 epochs), paper size" in captured.err
    assert main([*common, "--out", str(tmp_path / "b"), "--budget-fraction", "0.05"]) == 0
    captured = capsys.readouterr()
    assert "budget fraction 0.05 (500 of 10000 epochs), paper size" in captured.err
    for name in ("table.md", "verdict.md"):
        assert "budget fraction 0.05 (500 of 10000 epochs), paper size" in (tmp_path / "b" / name).read_text()
    # the embedded (small) configs: the fraction is still of the paper's budget
    assert main([*common, "--out", str(tmp_path / "c"), "--embedded-configs", "--budget-fraction", "0.05"]) == 0
    assert "budget fraction 0.05 (500 of 10000 epochs), embedded size" in capsys.readouterr().err


def test_execution_order_full_batch_first_then_minibatch_seed_by_seed():
    runs = build_grid("spring", ["sqp_adam", "adam_unc"], [5e-4, 1e-4], ["full", "minibatch"], ["paper", "full"],
                      full_seeds=1, minibatch_seeds=3, max_epochs=10)
    ordered = execution_order(runs)
    assert sorted(r.name for r in ordered) == sorted(r.name for r in runs)
    modes = [r.mode for r in ordered]
    assert modes == sorted(modes, key=["full", "minibatch"].index)  # every full-batch run before any mini-batch
    # within a batch mode: the paper's rho (and the unconstrained method) before rho = full, seed by seed
    for mode in ("full", "minibatch"):
        variants = [r.rho_variant for r in ordered if r.mode == mode]
        assert variants == sorted(variants, key=lambda v: v == "full") and variants.count("full") > 0
        for variants_of_setting in (("paper", "-"), ("full",)):
            seeds = [r.seed for r in ordered if r.mode == mode and r.rho_variant in variants_of_setting]
            assert seeds == sorted(seeds)


def test_records_keep_the_validated_epochs_compactly():
    history = [{"epoch": float(e), "step": float(e), "train_objective": 1.0 / e} for e in range(1, 1001)]
    for record in history[9::10]:
        record["val_objective"] = record["train_objective"] / 3
    thinned = thin_history(history)
    assert [int(h["epoch"]) for h in thinned] == [1] + list(range(10, 1001, 10))
    capped = thin_history(history, max_records=11)
    assert len(capped) == 11 and capped[0]["epoch"] == 1.0 and capped[-1]["epoch"] == 1000.0
    columns = history_columns(thinned)
    assert set(columns) == {"epoch", "step", "train_objective", "val_objective"}
    assert columns["val_objective"][0] is None  # epoch 1 was not validated
    restored = history_from_columns(columns)
    assert [set(r) for r in restored] == [set(r) for r in thinned]
    for a, b in zip(restored, thinned):
        assert all(a[k] == pytest.approx(b[k], rel=1e-6) for k in a)


def test_rho_full_keeps_the_paper_size_and_takes_the_recommended_optimizer_settings(tmp_path):
    import shutil

    configs = tmp_path / "configs"
    (configs / "darcy" / "paper").mkdir(parents=True)
    (configs / "darcy" / "recommended").mkdir()
    shutil.copy(ROOT / "configs" / "darcy" / "paper" / "sqp_adam.yaml", configs / "darcy" / "paper" / "sqp_adam.yaml")
    (configs / "darcy" / "recommended" / "sqp_adam.yaml").write_text(
        "model:\n  class_path: lit_constrained.tasks.darcy.Darcy\n  init_args:\n    optimizer:\n"
        "      class_path: lit_constrained.optim.SQPAdam\n"
        "      init_args: {lr: 1.0e-2, rho: full, max_normal_step: 0.02}\n"
    )
    spec = RunSpec("darcy", "sqp_adam", "full", "full", 1e-3, "minibatch", 0, 3)
    config = run_config(spec, configs, tmp_path, threads=1, prefer_paper=True)
    opt = config["model"]["init_args"]["optimizer"]["init_args"]
    assert opt["rho"] == "full" and opt["lr"] == 1e-3 and opt["max_normal_step"] == 0.02
    assert config["model"]["init_args"]["n_modes"] == [16, 16]  # the paper's FNO, not the embedded one
    paper = run_config(RunSpec("darcy", "sqp_adam", "paper", 0.5, 1e-3, "minibatch", 0, 3), configs,
                       tmp_path, threads=1, prefer_paper=True)
    assert "max_normal_step" not in paper["model"]["init_args"]["optimizer"]["init_args"]


def _record(method: str, variant: str, lr: float, mode: str, seed: int, losses: list[float], test: float) -> dict:
    """A hand-built run result: the loss after each of len(losses) epochs, all validated."""
    rho = None if method == "adam_unc" else (variant if variant == "full" else 1.0)
    spec = RunSpec("spring", method, "-" if method == "adam_unc" else variant, rho, lr, mode, seed, len(losses))
    history = [{"epoch": float(e), "step": float(e), "val_objective": f, "val_mse": test}
               for e, f in enumerate(losses, 1)]
    return {"spec": spec.to_dict(), "name": spec.name, "label": spec.label, "status": "ok", "test_metric": "mse",
            "history": history, "summary": summarize(history, "mse")}


def test_verdict_checks_on_known_records():
    # full batch: SQP-Adam ends lowest at both lrs; mini-batch (2 seeds): Adam(unc) ends lowest at lr 1e-4
    finals = {  # (mode, lr) -> method -> final loss (curves fall linearly from 1 to it over 4 epochs)
        ("full", 5e-4): {"sqp_adam": 0.01, "sqp_heavyball": 0.3, "adam_con": 0.3, "adam_unc": 0.1},
        ("full", 1e-4): {"sqp_adam": 0.02, "sqp_heavyball": 0.6, "adam_con": 0.5, "adam_unc": 0.4},
        ("minibatch", 5e-4): {"sqp_adam": 0.05, "sqp_heavyball": 0.3, "adam_con": 0.3, "adam_unc": 0.1},
        ("minibatch", 1e-4): {"sqp_adam": 0.2, "sqp_heavyball": 0.6, "adam_con": 0.5, "adam_unc": 0.15},
    }
    results = []
    for (mode, lr), by_method in finals.items():
        for method, final in by_method.items():
            for seed in range(1 if mode == "full" else 2):
                last = final * (1.5 if seed else 0.5) if mode == "minibatch" else final  # seed mean = final
                results.append(_record(method, "paper", lr, mode, seed, list(np.linspace(1.0, last, 4)), last / 2))
    paper = Finals(results, "paper")
    assert paper.settings == [("full", 5e-4), ("full", 1e-4), ("minibatch", 5e-4), ("minibatch", 1e-4)]
    assert paper.value(("minibatch", 1e-4), "sqp_adam", "objective") == pytest.approx(0.2)

    outcome = lowest("sqp_adam", "objective")(paper)
    assert outcome.verdict == "partly" and outcome.text.startswith("holds in 3 of 4 settings")
    # seeds at 0.5x and 1.5x the mean: std = mean / 2, so 0.2 vs 0.15 differ by less than the std (0.1)
    assert "mini-batch 0.0001: 0.2 vs 0.15 (Adam(unc)) (within the seeds' std)" in outcome.text
    assert "full batch 0.0001: 0.02 vs 0.4 (Adam(unc));" in outcome.text  # one seed: no spread
    # among the constrained methods only (Adam(unc) left out), SQP-Adam is lowest everywhere
    among = lowest("sqp_adam", "objective", CONSTRAINED)(paper)
    assert among.verdict == "reproduced" and among.text.endswith("mini-batch 0.0001: 0.2 vs 0.5 (Adam(con))")
    assert "mini-batch 0.0005: 0.05 vs 0.3 (SQP-HeavyBall(con));" in among.text  # 0.25 apart, std 0.15
    # ratios 1e-4 / 5e-4 -- full: SQP-Adam 2, HeavyBall 2, Adam(con) 1.67, Adam(unc) 4; mini-batch: 4, 2, 1.67, 1.5
    sensitivity = least_lr_sensitive("sqp_adam", "objective")(paper)
    assert sensitivity.verdict == "not reproduced" and "holds in 0 of 2" in sensitivity.text
    finals[("full", 1e-4)]["sqp_adam"] = 0.011  # ratio 1.1: closest to 1, the others > 1
    results = [r for r in results if not (r["spec"]["mode"] == "full" and r["spec"]["lr"] == 1e-4
                                          and r["spec"]["method"] == "sqp_adam")]
    results.append(_record("sqp_adam", "paper", 1e-4, "full", 0, list(np.linspace(1.0, 0.011, 4)), 0.0055))
    assert least_lr_sensitive("sqp_adam", "objective")(Finals(results, "paper")).verdict == "partly"

    # a grid stopped mid-seed: a third seed for SQP-Adam alone does not enter its mean
    extra = _record("sqp_adam", "paper", 1e-4, "minibatch", 2, list(np.linspace(1.0, 100.0, 4)), 50.0)
    assert Finals(results + [extra], "paper").value(("minibatch", 1e-4), "sqp_adam", "objective") == pytest.approx(0.2)
    # a setting without every method is left out and named; nothing at all is "no data"
    partial = [r for r in results if r["spec"]["method"] != "adam_con" or r["spec"]["mode"] == "full"]
    outcome = lowest("sqp_adam", "objective")(Finals(partial, "paper"))
    assert outcome.text.startswith("holds in 2 of 2 settings") and "no runs yet: mini-batch 0.0005" in outcome.text
    assert lowest("sqp_adam", "objective")(Finals([], "paper")).verdict == "no data"
    # a setting of the grid without any record is named too
    full_only = [r for r in results if r["spec"]["mode"] == "full"]
    outcome = lowest("sqp_adam", "objective")(Finals(full_only, "paper", [("minibatch", 1e-4)]))
    assert outcome.text.startswith("holds in 2 of 2 settings") and "no runs yet: mini-batch 0.0001" in outcome.text

    # the table: one row per claim of the task, the budget in the title and in every verdict
    table = verdict_table("spring", results, "budget fraction 0.5 (4 of 8 epochs), paper size", 24)
    rows = [line for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == len(CLAIMS["spring"]) and all("budget fraction 0.5" in row for row in rows)
    assert f"{len(results)} of 30 runs finished" in verdict_table("spring", results, "b", 30)
    assert "rho = full" not in table  # no rho = full records: no such column
    with_full = results + [_record("sqp_adam", "full", 5e-4, "full", 0, [1.0, 0.001], 1e-4)]
    assert "| measured, rho = full |" in verdict_table("spring", with_full, "b", 24)


def test_recorder_evaluates_the_constraints_on_the_batch_the_task_sees(tmp_path: Path) -> None:
    """Spring's data are float64 and its network float32 (the batch is cast by
    ConstrainedModule.prepare_batch): the per-epoch imposed violation is computed, not a dtype error."""
    import functools

    import torch
    from tests.helpers.lightning import quiet_trainer

    from lit_constrained.compare.recorder import EpochRecorder
    from lit_constrained.optim import SQPAdam
    from lit_constrained.tasks.spring import Spring, SpringData

    torch.manual_seed(0)
    task = Spring(optimizer=functools.partial(SQPAdam, lr=1e-3))
    recorder = EpochRecorder(str(tmp_path / "history.json"), log_to_tensorboard=False)
    quiet_trainer(max_epochs=2, limit_val_batches=0, callbacks=[recorder]).fit(task, SpringData())
    violations = [record["violation_max"] for record in recorder.history]
    assert len(violations) == 2 and all(math.isfinite(v) and v > 0 for v in violations)


def test_a_worker_trains_its_run_with_run_fit(tmp_path, monkeypatch):
    """The worker hands the run's config to the fit layer's ``run_fit`` (the fit layer here: a module with
    only that function) and builds the record from the history the run's EpochRecorder wrote."""
    import sys
    import types

    from lit_constrained.compare import worker

    given: list[list[str]] = []

    def fake_run_fit(args, top_level=()):
        given.append(list(args))
        config = yaml.safe_load(Path(args[1]).read_text())
        recorder = next(c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("EpochRecorder"))
        history = [{"epoch": 1.0, "step": 1.0, "train_objective": 2.0, "val_objective": 1.5, "val_mse": 0.25,
                    "violation_max": 0.125, "time_per_step_s": 0.5}]
        history_path = Path(recorder["init_args"]["history_path"])
        history_path.parent.mkdir(parents=True, exist_ok=True)
        history_path.write_text(json.dumps({"history": history, "fit_seconds": 0.75}))

    fit_layer = types.ModuleType("lit_constrained.cli.fit")
    fit_layer.run_fit = fake_run_fit
    monkeypatch.setitem(sys.modules, "lit_constrained.cli.fit", fit_layer)
    monkeypatch.setattr(worker, "set_threads", lambda threads: None)  # this test process keeps its threads
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    spec = RunSpec("curve", "sqp_adam", "paper", 1.0, 0.01, "default", 0, 1)
    result = worker.execute(spec.to_dict(), str(ROOT / "configs"), str(tmp_path / "out"), 1, 1, "mse",
                            work_dir=str(tmp_path / "work"), tensorboard=False)
    config_path = tmp_path / "work" / "configs" / f"{spec.name}.yaml"
    assert given == [["--config", str(config_path)]]
    record = json.loads((tmp_path / "out" / "runs" / f"{spec.name}.json").read_text())
    assert record["status"] == "ok" and record["fit_seconds"] == 0.75 and record["config"] == str(config_path)
    assert record["summary"]["objective"] == 1.5 and record["summary"]["test_error"] == 0.25
    assert record["fingerprint"] == fingerprint(yaml.safe_load(config_path.read_text()))
    assert result["history"][0]["val_mse"] == 0.25
    assert not (tmp_path / "work" / "runs" / f"{spec.name}.history.json").exists()  # temporary history removed


def test_the_command_and_its_report_need_neither_torch_nor_lightning():
    """Parsing ``compare``'s arguments and redrawing the report from records (``--report-only``) import
    neither torch nor Lightning: the records are plain JSON (:mod:`lit_constrained.compare.records`)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import lit_constrained.compare, lit_constrained.compare.report, lit_constrained.compare.records\n"
        "lit_constrained.compare.parser().parse_args(['--task', 'spring'])\n"
        "print(sorted(m for m in ('torch', 'lightning', 'lit_constrained.cli.fit') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"



def test_lr_sweep_is_a_compare_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compare --lr-sweep ...`` hands every later argument to the sweep's entry point; without
    --lr-sweep, --task is required."""
    import lit_constrained.compare as compare
    import lit_constrained.compare.sweep as sweep

    seen: list[list[str]] = []
    monkeypatch.setattr(sweep, "main", lambda argv: seen.append(list(argv)) or 0)
    assert compare.main(["--lr-sweep", "--tasks", "curve", "--steps", "3"]) == 0
    assert seen == [["--tasks", "curve", "--steps", "3"]]
    with pytest.raises(SystemExit):
        compare.main([])
