"""The verdict table: the paper's claims per task, checked against the run records.

Each :class:`Claim` carries the paper's words (2601.11795, section 5, with the figure number), what the
paper shows, and a check: a function of the final values (:class:`Finals`) that returns the measured
statement and a verdict. A check compares the methods within each *setting* (batch mode x learning
rate) that has all the methods it needs; a claim about every setting is

* ``reproduced`` when it holds in every such setting,
* ``partly`` when it holds in some,
* ``not reproduced`` when it holds in none,
* ``no data`` when no setting has the runs it needs.

"Loss" is the full objective (all training points) at the weights reached at the end of an epoch
(``val_objective`` of the records); the final value is that of the last validated epoch; mini-batch
values are means over the seeds; a comparison whose two means differ by less than the larger of their
seeds' standard deviations is marked "(within the seeds' std)" (the verdict still counts it). The
claims are checked with the paper's rho (Adam(unc) has none) and, where the records have them, again
with rho = "full" for the constrained methods.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .grid import METHODS, lr_text

Setting = tuple[str, float]  # (batch mode, lr)
MODE_TEXT = {"full": "full batch", "minibatch": "mini-batch", "default": "default"}
MODE_ORDER = ["full", "minibatch", "default"]


def _short(method: str) -> str:
    return METHODS[method].label if method in METHODS else method


def _g(value: float) -> str:
    return format(value, ".3g")


def _setting_text(setting: Setting) -> str:
    return f"{MODE_TEXT.get(setting[0], setting[0])} {lr_text(setting[1])}"


class Finals:
    """Final values per (setting, method) for one rho variant of the constrained methods.

    Args:
        results: run results (spec, summary, history) as written by the worker.
        variant: ``"paper"`` or ``"full"``: the rho variant of the constrained methods to read;
            unconstrained methods are read whatever the variant.
        expected: the settings of the grid, so those without any record yet are named as missing.

    Values (means over the seeds of a setting): ``objective`` (final loss), ``test_error``,
    ``violation_max`` and ``log_loss_area`` (the mean over validated epochs of log10 of the
    seed-mean loss curve: lower means lower loss sooner). The methods of a setting are compared on the
    seeds they all have (a grid stopped mid-seed has one method at more seeds than another).
    """

    def __init__(self, results: list[dict[str, Any]], variant: str = "paper",
                 expected: list[Setting] | None = None) -> None:
        self.variant = variant
        groups: dict[tuple[Setting, str], list[dict[str, Any]]] = defaultdict(list)
        for result in results:
            spec = result["spec"]
            if spec["rho_variant"] not in ("-", variant):
                continue
            groups[((spec["mode"], float(spec["lr"])), spec["method"])].append(result)
        common: dict[Setting, set[int]] = {}
        for (setting, _), group in groups.items():
            seeds = {int(r["spec"]["seed"]) for r in group}
            common[setting] = common.get(setting, seeds) & seeds
        groups = {key: [r for r in group if int(r["spec"]["seed"]) in common[key[0]]]
                  for key, group in groups.items()}
        self.values: dict[tuple[Setting, str], dict[str, float]] = {}
        self.spreads: dict[tuple[Setting, str], dict[str, float]] = {}
        self.runs: dict[tuple[Setting, str], int] = {}
        for key, group in groups.items():
            self.values[key] = {
                "objective": _mean([r["summary"].get("objective") for r in group]),
                "test_error": _mean([r["summary"].get("test_error") for r in group]),
                "violation_max": _mean([r["summary"].get("violation_max") for r in group]),
                "log_loss_area": _log_area(group),
            }
            self.spreads[key] = {
                name: _std([r["summary"].get(name) for r in group]) for name in ("objective", "test_error")
            }
            self.runs[key] = len(group)
        self.settings: list[Setting] = sorted(
            {setting for setting, _ in self.values} | set(expected or []),
            key=lambda s: (MODE_ORDER.index(s[0]) if s[0] in MODE_ORDER else 9, -s[1]),
        )

    def has_constrained(self) -> bool:
        return any(METHODS.get(m) is not None and METHODS[m].constrained for _, m in self.values)

    def value(self, setting: Setting, method: str, key: str) -> float:
        return self.values.get((setting, method), {}).get(key, math.nan)

    def spread(self, setting: Setting, method: str, key: str) -> float:
        """The standard deviation over the seeds of ``key`` (0 for one seed; nan where not kept)."""
        return self.spreads.get((setting, method), {}).get(key, math.nan)

    def complete(self, setting: Setting, methods: list[str], key: str) -> bool:
        return all(math.isfinite(self.value(setting, m, key)) for m in methods)

    def within_spread(self, setting: Setting, a: str, b: str, key: str) -> bool:
        """Whether the seed means of ``a`` and ``b`` differ by less than the larger seed std."""
        spread = max(self.spread(setting, a, key), self.spread(setting, b, key))
        return spread > 0 and abs(self.value(setting, a, key) - self.value(setting, b, key)) < spread


def _finite(values: list[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _mean(values: list[Any]) -> float:
    finite = _finite(values)
    return float(np.mean(finite)) if finite else math.nan


def _std(values: list[Any]) -> float:
    """The seeds' standard deviation (population, as the tables' +/-)."""
    finite = _finite(values)
    return float(np.std(finite)) if finite else math.nan


def _log_area(group: list[dict[str, Any]]) -> float:
    """Mean over the epochs every run validated of log10(seed-mean loss); nan if some loss is <= 0."""
    per_run = []
    for result in group:
        per_run.append({int(r["epoch"]): r["val_objective"] for r in result["history"]
                        if r.get("val_objective") is not None and math.isfinite(r["val_objective"])})
    epochs = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    if not epochs:
        return math.nan
    mean = np.array([np.mean([p[e] for p in per_run]) for e in epochs])
    return float(np.mean(np.log10(mean))) if np.all(mean > 0) else math.nan


@dataclass(frozen=True)
class Outcome:
    """What a check measured (``text``) and the verdict."""

    text: str
    verdict: str


def _tally(flags: list[bool], details: list[str], missing: list[str]) -> Outcome:
    text = "; ".join(details) if details else "no setting has the runs this claim needs"
    if missing:
        text += f" (no runs yet: {', '.join(missing)})"
    if not flags:
        return Outcome(text, "no data")
    held = sum(flags)
    verdict = "reproduced" if held == len(flags) else "not reproduced" if held == 0 else "partly"
    return Outcome(f"holds in {held} of {len(flags)} settings: {text}", verdict)


Check = Callable[[Finals], Outcome]
ALL = list(METHODS)
CONSTRAINED = [key for key, method in METHODS.items() if method.constrained]


def _extreme(method: str, key: str, methods: list[str], lowest_wins: bool) -> Check:
    """``method`` has the lowest (or highest) ``key`` of ``methods`` in each setting."""
    pick = min if lowest_wins else max

    def check(finals: Finals) -> Outcome:
        flags, details, missing = [], [], []
        for setting in finals.settings:
            if not finals.complete(setting, methods, key):
                missing.append(_setting_text(setting))
                continue
            others = {m: finals.value(setting, m, key) for m in methods if m != method}
            rival = pick(others, key=others.get)
            mine = finals.value(setting, method, key)
            flags.append(mine < others[rival] if lowest_wins else mine > others[rival])
            tie = " (within the seeds' std)" if finals.within_spread(setting, method, rival, key) else ""
            details.append(f"{_setting_text(setting)}: {_g(mine)} vs {_g(others[rival])} ({_short(rival)}){tie}")
        return _tally(flags, details, missing)

    return check


def lowest(method: str, key: str, methods: list[str] = ALL) -> Check:
    """``method`` has the lowest ``key`` of ``methods`` in each setting."""
    return _extreme(method, key, methods, lowest_wins=True)


def highest(method: str, key: str, methods: list[str] = ALL) -> Check:
    """``method`` has the highest ``key`` of ``methods`` in each setting."""
    return _extreme(method, key, methods, lowest_wins=False)


def comparable(a: str, b: str, key: str, factor: float) -> Check:
    """``a`` and ``b`` end within a factor ``factor`` of each other in each setting."""

    def check(finals: Finals) -> Outcome:
        flags, details, missing = [], [], []
        for setting in finals.settings:
            if not finals.complete(setting, [a, b], key):
                missing.append(_setting_text(setting))
                continue
            va, vb = finals.value(setting, a, key), finals.value(setting, b, key)
            ratio = va / vb if vb else math.inf
            flags.append(1 / factor <= ratio <= factor)
            details.append(f"{_setting_text(setting)}: {_g(va)} vs {_g(vb)} (ratio {_g(ratio)})")
        return _tally(flags, details, missing)

    return check


def worse_than(method: str, others: list[str], key: str) -> Check:
    """``method`` ends above every one of ``others`` in each setting."""

    def check(finals: Finals) -> Outcome:
        flags, details, missing = [], [], []
        for setting in finals.settings:
            if not finals.complete(setting, [method, *others], key):
                missing.append(_setting_text(setting))
                continue
            mine = finals.value(setting, method, key)
            best_other = max(finals.value(setting, m, key) for m in others)
            flags.append(mine > best_other)
            details.append(f"{_setting_text(setting)}: {_g(mine)} vs at most {_g(best_other)}")
        return _tally(flags, details, missing)

    return check


def least_lr_sensitive(method: str, key: str, methods: list[str] = ALL) -> Check:
    """Per batch mode, with r = value at the smaller lr / value at the larger lr: ``method`` has the
    r closest to 1 (|log r| smallest) and every other method has r > 1 (worse at the smaller lr)."""

    def check(finals: Finals) -> Outcome:
        flags, details, missing = [], [], []
        modes = list(dict.fromkeys(s[0] for s in finals.settings))
        for mode in modes:
            lrs = sorted({s[1] for s in finals.settings if s[0] == mode})
            if len(lrs) < 2 or not all(finals.complete((mode, lr), methods, key) for lr in (lrs[0], lrs[-1])):
                missing.append(MODE_TEXT.get(mode, mode))
                continue
            small, large = (mode, lrs[0]), (mode, lrs[-1])
            ratios = {m: finals.value(small, m, key) / finals.value(large, m, key) for m in methods}
            closest = min(ratios, key=lambda m: abs(math.log(ratios[m])))
            others_worse = all(r > 1 for m, r in ratios.items() if m != method)
            flags.append(closest == method and others_worse)
            listed = ", ".join(f"{_short(m)} {_g(r)}" for m, r in ratios.items())
            details.append(f"{MODE_TEXT.get(mode, mode)} (lr {lr_text(lrs[0])} / {lr_text(lrs[-1])}): {listed}")
        return _tally(flags, details, missing)

    return check


@dataclass(frozen=True)
class Claim:
    """One claim of the paper about a task: its words, figure, what the figure shows, and the check."""

    figure: str
    words: str
    paper_shows: str
    check: Check


_LOSS = "final loss (full objective)"
CLAIMS: dict[str, list[Claim]] = {
    "spring": [
        Claim("Figure 1", "SQP-Adam(con) yielded lower objective values (loss) more quickly",
              "SQP-Adam(con)'s loss curve lowest over the epochs, full batch and mini-batch, lr 5e-4 and 1e-4 "
              "(measured: mean log10 loss over the validated epochs, lowest per setting)",
              lowest("sqp_adam", "log_loss_area")),
        Claim("Figure 1", "SQP-Adam(con) yielded lower objective values (loss) ... after the training budget "
              "expired", f"SQP-Adam(con) lowest {_LOSS} in every panel", lowest("sqp_adam", "objective")),
        Claim("Figure 1 (text)", "achieved better accuracy (i.e., lower mean-squared error) after the training "
              "budget expired", "SQP-Adam(con) lowest test MSE (MSE figures are not in our copy of the paper)",
              lowest("sqp_adam", "test_error")),
        Claim("Figure 1", "SQP-Adam(con) achieved more comparable results for the two learning rates, whereas "
              "the other algorithms performed worse for the smaller learning rate",
              "loss at lr 1e-4 / loss at 5e-4 closest to 1 for SQP-Adam(con), > 1 for the others",
              least_lr_sensitive("sqp_adam", "objective")),
    ],
    "chemistry": [
        Claim("Figure 3", "The results in Figures 3 show that SQP-Adam(con) performed best",
              f"SQP-Adam(con) lowest loss curve, full batch and mini-batch, lr 5e-4 and 1e-4 "
              f"(measured: {_LOSS})", lowest("sqp_adam", "objective")),
        Claim("Figure 3", "SQP-Adam(con) performed best (over the epochs)",
              "measured: mean log10 loss over the validated epochs, lowest per setting",
              lowest("sqp_adam", "log_loss_area")),
    ],
    "burgers": [
        Claim("Figure 4", "the results obtained by Adam(unc) and SQP-Adam(con) were in fact comparable",
              f"the two loss curves close, full batch and mini-batch, lr 1e-3 and 5e-4 (measured: {_LOSS} "
              "within a factor 2)", comparable("sqp_adam", "adam_unc", "objective", 2.0)),
        Claim("Figure 4", "The performance by the projection-less Adam approach (Adam(con)) was inferior to these",
              f"Adam(con) above SQP-Adam(con) and Adam(unc) (measured: {_LOSS})",
              worse_than("adam_con", ["sqp_adam", "adam_unc"], "objective")),
        Claim("Figure 4", "the performance by SQP-Heavyball(con) was poorer still",
              f"SQP-HeavyBall(con) highest (measured: {_LOSS})", highest("sqp_heavyball", "objective")),
    ],
    "darcy": [
        Claim("Figure 7", "The results in 7 show strong relative performance by SQP-Adam(con)",
              f"SQP-Adam(con) lowest loss, full batch and mini-batch, lr 5e-3 and 1e-3 (measured: {_LOSS})",
              lowest("sqp_adam", "objective")),
        Claim("Figure 7", "strong relative performance by SQP-Adam(con) (test error)",
              "measured: test relative L2 error on held-out nu, lowest per setting",
              lowest("sqp_adam", "test_error")),
        Claim("Figure 7", "strong relative performance by SQP-Adam(con) (among the methods that impose the "
              "constraints)", "SQP-Adam(con) lowest of the three constrained methods; Adam(unc) left out, "
              f"it only penalizes the residuals (measured: {_LOSS})",
              lowest("sqp_adam", "objective", CONSTRAINED)),
    ],
}


def verdict_table(task: str, results: list[dict[str, Any]], budget_text: str, total_runs: int,
                  expected: list[Setting] | None = None) -> str:
    """The markdown verdict table of the task's claims (a note for a task without claims).

    ``expected``: the grid's (mode, lr) settings, so that settings without records are named.
    """
    claims = CLAIMS.get(task)
    if not claims:
        return f"No claims of the paper are recorded for task {task!r}.\n"
    paper = Finals(results, "paper", expected)
    full = Finals(results, "full", expected)
    with_full = full.has_constrained()
    lines = [
        f"# {task}: the paper's claims ({budget_text}; {len(results)} of {total_runs} runs finished)",
        "",
        "Generated by `lit-constrained compare` from the run records; the verdict is the paper's rho column's.",
        "",
        "| # | claim (paper's words, figure) | what the paper shows | measured, paper's rho "
        + ("| measured, rho = full " if with_full else "") + "| verdict |",
        "|---|---|---|---" + ("|---" if with_full else "") + "|---|",
    ]
    for i, claim in enumerate(claims, 1):
        outcome = claim.check(paper)
        cells = [str(i), f"\"{claim.words}\" ({claim.figure})", claim.paper_shows, outcome.text]
        if with_full:
            cells.append(f"{claim.check(full).text} [{claim.check(full).verdict}]")
        cells.append(f"**{outcome.verdict}** ({budget_text})")
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
