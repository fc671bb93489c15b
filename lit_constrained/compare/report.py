"""The comparison's outputs: a tidy CSV of the per-epoch history, a JSON summary, PNG figures, markdown tables.

Everything is computed from the run records (``runs/<run>.json``), so ``--report-only`` redraws it
from them. Every title states the budget fraction (epochs run / the paper configs' epochs)
and the problem size.

* ``metrics.csv``: one row per (run, epoch): task, method, label, rho, lr, mode, seed, run, status,
  epoch, step, ``objective`` (full objective at the end of the epoch), ``train_objective`` (mean of the
  epoch's training-step objectives), ``test_error`` (the task's test metric, named in ``test_metric``),
  ``violation_max`` (max |c| of the imposed constraints), ``val_violation_max`` (residual at all
  validation points), ``time_per_step_s``.
* ``results.json``: every run's spec, status, budget, summary and wall time (the histories are in
  ``runs/`` and ``metrics.csv``).
* ``loss.png`` / ``test_error.png`` / ``violation.png``: the paper's form (its Figures 1, 3, 4): one
  panel per learning rate (columns) and batch mode (rows), one line per method; several seeds give
  the mean as a solid line and a shaded band of +/- one standard deviation; log scale.
* ``table.md``: per method, mode and lr, the final objective, test error and max |c| (mean +/- std
  over seeds) and the mean wall time per training step; the rho = "full" rows next to the paper's rho.
* ``verdict.md``: the paper's claims about the task with what the records measure
  (:mod:`lit_constrained.compare.verdict`).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from .grid import METHODS, Budget, RunSpec, lr_text
from .records import load_result, result_path, write_json
from .verdict import verdict_table

CSV_COLUMNS = [
    "task", "method", "label", "rho", "lr", "mode", "seed", "run", "status", "epoch", "step", "objective",
    "train_objective", "test_error", "test_metric", "violation_max", "val_violation_max", "time_per_step_s",
]
METHOD_ORDER = list(METHODS)
COLORS = {"sqp_adam": "tab:blue", "sqp_heavyball": "tab:green", "adam_con": "tab:orange", "adam_unc": "tab:red"}
LINESTYLES = ["-", "--", ":", "-."]


def collect(runs: list[RunSpec], out_dir: Path) -> list[dict[str, Any]]:
    """The result files of ``runs`` that exist (in grid order), histories as lists of per-epoch dicts.

    A result file of another budget (the run's name without its epochs) is not one of ``runs``: left out.
    """
    results = []
    for spec in runs:
        result = load_result(result_path(out_dir, spec))
        if result is not None and result.get("spec") == spec.to_dict():
            results.append(result)
    return results


def budget_text(results: list[dict[str, Any]], fallback: Budget | None = None) -> str:
    """The budget statement of the records (``Budget.text``), or of ``fallback`` when they carry none."""
    texts = []
    for result in results:
        budget = result.get("budget")
        if budget:
            texts.append(Budget(budget["epochs"], budget["reference_epochs"], budget["source"],
                                budget.get("size", "paper")).text)
        elif fallback is not None:
            texts.append(fallback.text)
    texts = list(dict.fromkeys(texts))
    if not texts:
        return fallback.text if fallback is not None else "budget fraction unknown"
    return texts[0] if len(texts) == 1 else "mixed budgets: " + "; ".join(texts)


def tidy_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for result in results:
        spec = result["spec"]
        metric = result["test_metric"]
        for record in result["history"]:
            rows.append({
                "task": spec["task"], "method": spec["method"], "label": result["label"],
                "rho": spec["rho"] if spec["rho"] is not None else "", "lr": spec["lr"], "mode": spec["mode"],
                "seed": spec["seed"], "run": result["name"], "status": result["status"],
                "epoch": int(record["epoch"]), "step": int(record["step"]),
                "objective": record.get("val_objective", math.nan),
                "train_objective": record.get("train_objective", math.nan),
                "test_error": record.get(f"val_{metric}", math.nan), "test_metric": metric,
                "violation_max": record.get("violation_max", math.nan),
                "val_violation_max": record.get("val_violation_max", math.nan),
                "time_per_step_s": record.get("time_per_step_s", math.nan),
            })
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def _groups(results: list[dict[str, Any]]) -> dict[tuple[str, str, float, str], list[dict[str, Any]]]:
    """Results grouped by (mode, label, lr, method)."""
    groups: dict[tuple[str, str, float, str], list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        spec = result["spec"]
        groups[(spec["mode"], result["label"], spec["lr"], spec["method"])].append(result)
    return groups


def _curve(group: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(epochs, mean, std) over the runs of a group, on the epochs every run has a finite value at."""
    per_run = []
    for result in group:
        points = {int(r["epoch"]): r.get(key, math.nan) for r in result["history"]}
        per_run.append({e: v for e, v in points.items() if v is not None and math.isfinite(v)})
    if not per_run:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    epochs = sorted(set.intersection(*(set(p) for p in per_run)))
    values = np.array([[p[e] for e in epochs] for p in per_run], dtype=float).reshape(len(per_run), len(epochs))
    return np.array(epochs), values.mean(axis=0), values.std(axis=0)


def plot(results: list[dict[str, Any]], key: str, ylabel: str, title: str, path: Path) -> bool:
    """One panel per (mode, lr); a line (and +/- std band for several seeds) per method. False: no data.

    The title is also stored as the PNG's ``Title`` text chunk.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(results)
    if not groups:
        return False
    modes = sorted({g[0] for g in groups}, key=lambda m: ["full", "minibatch", "default"].index(m))
    lrs = sorted({g[2] for g in groups}, reverse=True)
    fig, axes = plt.subplots(len(modes), len(lrs), figsize=(4.6 * len(lrs), 3.4 * len(modes)), squeeze=False)
    labels = sorted({(g[3], g[1]) for g in groups}, key=lambda ml: (METHOD_ORDER.index(ml[0]), ml[1]))
    styles = {}
    for method, label in labels:
        variants = [lab for m, lab in labels if m == method]
        styles[label] = (COLORS.get(method, None), LINESTYLES[variants.index(label) % len(LINESTYLES)])
    drawn = False
    for i, mode in enumerate(modes):
        for j, lr in enumerate(lrs):
            ax = axes[i][j]
            for method, label in labels:
                group = groups.get((mode, label, lr, method))
                if not group:
                    continue
                epochs, mean, std = _curve(group, key)
                if not len(epochs):
                    continue
                color, style = styles[label]
                seeds = f" ({len(group)} seeds)" if len(group) > 1 else ""
                # earlier methods drawn wider, so a later method lying on top leaves them visible
                width = 2.6 - 0.4 * (METHOD_ORDER.index(method) if method in METHOD_ORDER else 0)
                ax.plot(epochs, mean, color=color, linestyle=style, lw=width, label=label + seeds)
                if len(group) > 1:
                    ax.fill_between(epochs, mean - std, mean + std, color=color, alpha=0.2, lw=0)
                drawn = True
            if ax.get_lines() and all(np.min(line.get_ydata()) > 0 for line in ax.get_lines()):
                ax.set_yscale("log")  # a band reaching <= 0 is cut at the lowest mean / 3
                ax.set_ylim(bottom=min(np.min(line.get_ydata()) for line in ax.get_lines()) / 3)
            mode_text = {"full": "full batch", "minibatch": "mini-batch", "default": ""}[mode]
            ax.set_title(f"{mode_text}, lr = {lr_text(lr)}".strip(", "), fontsize=10)
            ax.set_xlabel("epoch")
            if j == 0:
                ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3, which="both", lw=0.5)
    legend: dict[str, Any] = {}  # one legend for all panels, below them (label -> line)
    for ax in axes.flat:
        for line in ax.get_lines():
            legend.setdefault(str(line.get_label()), line)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(4, len(legend)), fontsize=8,
                   frameon=False)
    rows_of_legend = math.ceil(len(legend) / 4) if legend else 0
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.045 * rows_of_legend / len(modes), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Title": title})
    plt.close(fig)
    return drawn


def _mean_std(values: list[float]) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "n/a"
    if len(finite) == 1:
        return f"{finite[0]:.3e}"
    return f"{np.mean(finite):.3e} ± {np.std(finite):.1e}"


def table(results: list[dict[str, Any]], task: str) -> str:
    """The markdown table of final values (mean ± std over seeds)."""
    if not results:
        return f"No finished runs for {task}.\n"
    metric = results[0]["test_metric"]
    lines = [
        f"| method | mode | lr | runs | final objective | test {metric} | max abs c (imposed) "
        f"| max residual (all val. points) | epochs | ms / step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups = _groups(results)
    order = sorted(groups, key=lambda g: (["full", "minibatch", "default"].index(g[0]), -g[2],
                                          METHOD_ORDER.index(g[3]), g[1]))
    for key in order:
        mode, label, lr, _ = key
        group = groups[key]
        summaries = [r["summary"] for r in group]
        diverged = sum(r["status"] != "ok" for r in group)
        runs = f"{len(group)}" + (f" ({diverged} diverged)" if diverged else "")
        times = [s.get("time_per_step_s", math.nan) for s in summaries]
        finite_times = [t for t in times if math.isfinite(t)]
        ms = f"{1e3 * float(np.mean(finite_times)):.2f}" if finite_times else "n/a"
        epochs = sorted({int(s.get("epochs", 0)) for s in summaries})
        lines.append(
            f"| {label} | {mode} | {lr_text(lr)} | {runs} | {_mean_std([s.get('objective') for s in summaries])} "
            f"| {_mean_std([s.get('test_error') for s in summaries])} "
            f"| {_mean_std([s.get('violation_max') for s in summaries])} "
            f"| {_mean_std([s.get('val_violation_max') for s in summaries])} "
            f"| {'/'.join(map(str, epochs))} | {ms} |"
        )
    return "\n".join(lines) + "\n"


def write_report(runs: list[RunSpec], out_dir: Path, budget: Budget | None = None) -> dict[str, Path]:
    """Write the CSV, JSON, figures and tables for the runs of the grid that have results.

    ``budget`` states the budget when the records carry none (records of older versions).
    """
    results = collect(runs, out_dir)
    task = runs[0].task
    scope = budget_text(results, budget)
    paths = {
        "csv": out_dir / "metrics.csv",
        "json": out_dir / "results.json",
        "table": out_dir / "table.md",
        "verdict": out_dir / "verdict.md",
    }
    write_csv(tidy_rows(results), paths["csv"])
    write_json(paths["json"], [{k: v for k, v in r.items() if k != "history"} for r in results])
    paths["table"].write_text(
        f"# {task}: final values ({scope}; {len(results)} of {len(runs)} runs)\n\n" + table(results, task)
    )
    settings = sorted({(spec.mode, spec.lr) for spec in runs})
    paths["verdict"].write_text(verdict_table(task, results, scope, len(runs), settings))
    metric = results[0]["test_metric"] if results else "test error"
    figures = {
        "loss": ("val_objective", "objective (loss)", f"{task}: loss over epochs\n{scope}"),
        "test_error": (f"val_{metric}", f"test {metric}", f"{task}: test {metric} over epochs\n{scope}"),
        "violation": ("violation_max", "max |c| (imposed)", f"{task}: constraint violation over epochs\n{scope}"),
    }
    for name, (key, ylabel, title) in figures.items():
        path = out_dir / f"{name}.png"
        if plot(results, key, ylabel, title, path):
            paths[name] = path
    return paths
