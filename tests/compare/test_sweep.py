"""The lr sweep (lit_constrained.compare.sweep): the good-lr range, the goal's verdict, the command line on
hand-made records, and one real (tiny) run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lit_constrained.compare import sweep


def records(task: str, method: str, errors: dict[float, float], c0: float = 1.0, c_end: float = 1e-6) -> list[dict]:
    return [{"task": task, "method": method, "lr": lr, "seed": seed, "steps": 10, "error": e, "c0": c0,
             "c_end": c_end, "status": "ok", "seconds": 0.0}
            for lr, e in errors.items() for seed in (0, 1)]


def test_the_good_range_is_the_contiguous_stretch_around_the_best() -> None:
    errors = {1e-3: 1.0, 1e-2: 0.15, 1e-1: 0.1, 1.0: 0.19, 10.0: 0.3, 100.0: 0.12}
    # 100.0 is within 2x of the best but not contiguous with it: not part of the range
    assert sweep.good_range(errors, 2.0) == (0.1, 1e-1, 1e-2, 1.0)
    assert sweep.good_range({1.0: math.inf, 2.0: 3.0}, 2.0) == (3.0, 2.0, 2.0, 2.0)


def test_a_failed_seed_makes_the_mean_infinite() -> None:
    runs = records("curve", "sqp_adam", {0.1: 1.0})
    runs[0]["error"] = math.inf
    assert sweep.mean_errors(runs, "curve", "sqp_adam") == {0.1: math.inf}


def test_the_verdict_checks_range_error_and_feasibility_against_sqp_adam() -> None:
    lrs = [10.0 ** (e / 2) for e in range(-6, 1)]
    base = dict(zip(lrs, [9, 9, 1.0, 1.2, 9, 9, 9]))  # SQP-Adam: range 3.16x, best 1.0
    wide = dict(zip(lrs, [1.9, 1.4, 1.2, 1.1, 1.3, 1.5, 1.8]))  # range 1000x, best 1.1 (1.1x)
    runs = []
    for task in ("curve", "spring"):
        runs += records(task, "sqp_adam", base)
        runs += records(task, "sqp_momo_adam_euclidean", wide, c_end=1e-5 if task == "curve" else 1e-3)
    rows = {(r["task"], r["method"]): r for r in sweep.summary(runs, 2.0)}
    assert rows["curve", "sqp_adam"]["width"] == pytest.approx(10**0.5)
    assert rows["curve", "sqp_momo_adam_euclidean"]["width"] == pytest.approx(1e3)
    text = sweep.verdict(runs, 2.0)
    # spring misses feasibility (1e-3 > 1e-4): the goal holds on one task only
    assert "spring, SQP-MoMo-Adam(con), Euclidean" in text and "max|c| ratio 1.0e-03 (missed)" in text
    assert "goal met on 1 task(s) ['curve'] (needs 2): MISSED" in text


def test_report_mode_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = records("curve", "adam_unc", {1e-3: 0.5, 1e-2: 0.2}) + records("curve", "sqp_adam", {1e-3: 0.3, 1e-2: 0.1})
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": runs}))
    assert sweep.main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| curve | 10 | SQP-Adam(con) | 1.000e-01 | 1.0e-02 |" in out
    assert "| curve | 10 | Adam(unc) | 2.000e-01 | 1.0e-02 | 1.0e-02 .. 1.0e-02 | 1x | (unconstrained) |" in out


def test_steps_and_bad_arguments() -> None:
    assert sweep.parse_steps(["100", "spring=5"]) == {"curve": 100, "spring": 5, "burgers": 100}
    with pytest.raises(ValueError, match="unknown task"):
        sweep.parse_steps(["darcy=3"])
    with pytest.raises(ValueError, match=">= 1"):
        sweep.parse_steps(["0"])
    with pytest.raises(ValueError, match="Unknown method"):
        sweep.make_optimizer("sgd", 0.1)
    with pytest.raises(SystemExit):
        sweep.main(["--steps", "curve=x"])


@pytest.mark.slow  # a Lightning fit and matplotlib: ~10 s on a free core
def test_a_tiny_sweep_runs_resumes_and_draws(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    args = (["curve"], ["sqp_momo_adam_euclidean"], [1e-2], [0], {"curve": 3})
    runs = sweep.sweep(*args, json_path=path, echo=False)
    assert len(runs) == 1
    r = runs[0]
    assert r["status"] == "ok" and r["steps"] == 3 and math.isfinite(r["error"]) and r["c0"] > 0
    assert r["c_end"] < r["c0"]  # the full normal steps reduce the violation
    assert json.loads(path.read_text())["runs"] == runs
    assert sweep.sweep(*args, json_path=path, echo=False) == runs  # resumed: nothing ran again
    sweep.figure(runs, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").stat().st_size > 0
