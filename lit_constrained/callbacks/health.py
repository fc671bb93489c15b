r"""RunHealth: one clear warning when a run diverges or its constraints look infeasible, instead of exit 0
and no word.

It observes the training step's outputs (f and c at the weights before the update) and the optimizer's
``diagnostics`` on the logging steps (``log_every_n_steps``; the diagnostics exist only there), plus
the first step; each observation costs one host read of at most three numbers. Each finding is warned
once (:class:`RunHealthWarning`, rank 0) and listed in the end-of-fit summary
(:class:`~lit_constrained.callbacks.summary.FitSummary`), with what to try. Batches skipped under
``on_nonfinite="skip"`` are not observed (they are not the run's state); a resumed fit starts its
references at the resumed step.

**Divergence.** With :math:`F` = ``divergence_factor`` (1e3), the objective diverges at an observation
when

.. math::
    |f_k| > F \min_{1 \le j < k} |f_j| \quad\text{and}\quad |f_k| > |f_0|,

i.e. it grew a thousandfold from its lowest value since the first update and above where it started
(the first update is left out of the minimum: restoring infeasible constraints may raise f legitimately);
the same rule with :math:`j \ge 0` holds for :math:`\max|c|`, which must also exceed
:math:`\sqrt{\varepsilon}` of the weights' dtype (a fit resumed at a feasible point starts its references
within round-off, where max |c| wanders a thousandfold); a non-finite f or c is divergence at once.

**Apparent infeasibility.** The projected optimizers log ``linearized_feasibility_error``
:math:`e_k = \|J\Delta x + s c\| / \|s c\|`, the relative least-squares residual of the normal
equations :math:`J d = -c` (about 1e-10 in float64, 1e-4 in float32 when c lies in the range of J; 1
when no step can reduce c, e.g. a constant residual). Over the last ``window`` (10) observations the
constraints look infeasible when the median of :math:`e` is at least ``infeasible_error`` (0.1), the
rank of J (``optim/rank``) is below m (with full row rank, J d = -c is always solvable: a residual there is
round-off), max |c| has not halved over the window, and it stays above both :math:`10^{-3}\max|c_0|` and
:math:`\sqrt{\varepsilon}` of the weights' dtype (so round-off at a feasible point does not count). A
rank that fell during the run is named as the likely cause (a network saturated by too large steps).

**lr = 0.** With ``rho="full"`` the normal step does not scale with the lr (:math:`\rho_k = 1/\alpha_k`),
and the post-step corrections (``max_corrections``) never do: lr = 0 removes the tangential (objective)
step, but every step still restores the constraints, so the weights move. That is a feasibility
projection, which may be what is wanted; the fit says so once at its start (only a numeric rho with
``max_corrections=0`` makes lr = 0 no step).
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor


class RunHealthWarning(UserWarning):
    """A run that goes on but is going nowhere (divergence, infeasibility) or does not do what its
    settings suggest (lr = 0 with the full normal step)."""


@dataclass
class _Observation:
    step: int
    objective: float
    violation: float | None
    feasibility_error: float | None
    rank: float | None = None  # numerical rank of J (the optimizer's diagnostic)
    rows: int = 0  # m, the number of constraint rows


def _fmt(value: float) -> str:
    return f"{value:.2e}"


class RunHealth(Callback):
    """Warns once per finding: divergence, apparent infeasibility, lr = 0 with ``rho="full"``.

    :class:`~lit_constrained.module.ConstrainedModule` adds it to every Trainer (``configure_callbacks``);
    the warnings are :class:`RunHealthWarning` (``warnings.filterwarnings("ignore", category=...)``
    silences them) and :attr:`findings` holds them for the end-of-fit summary.

    Args:
        divergence_factor: growth factor that counts as divergence (see the module docs).
        window: number of consecutive observations the infeasibility test looks at.
        infeasible_error: median relative least-squares residual of J d = -c that counts as "far from 0".
    """

    def __init__(self, divergence_factor: float = 1e3, window: int = 10, infeasible_error: float = 0.1) -> None:
        if not divergence_factor > 1:
            raise ValueError(f"divergence_factor must be > 1, got {divergence_factor!r}.")
        if window < 2:
            raise ValueError(f"window must be >= 2 observations, got {window!r}.")
        self.divergence_factor = float(divergence_factor)
        self.window = int(window)
        self.infeasible_error = float(infeasible_error)
        self.findings: dict[str, str] = {}
        self._reset()

    def _reset(self) -> None:
        self.findings = {}
        self._first: _Observation | None = None
        self._lowest_objective: float | None = None  # min |f| over observations after the first
        self._lowest_violation: float | None = None  # min max|c| over all observations
        self._recent: deque[_Observation] = deque(maxlen=self.window)
        self._eps_floor = math.sqrt(torch.finfo(torch.float32).eps)

    # ------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        dtype = getattr(pl_module, "dtype", torch.float32)
        self._eps_floor = math.sqrt(torch.finfo(dtype if dtype.is_floating_point else torch.float32).eps)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                if float(group.get("lr") or 0.0) != 0.0 or group.get("lr") is None:
                    continue
                moves = []
                if group.get("rho") == "full":
                    moves.append("the full normal step -J^+ c (rho='full' does not scale it with the lr)")
                if int(group.get("max_corrections") or 0) > 0:
                    moves.append(f"up to {int(group['max_corrections'])} Gauss-Newton corrections toward "
                                 "max |c| <= constraint_tol (max_corrections)")
                if moves:
                    self._report(trainer, "lr_zero", (
                        f"lit-constrained: lr = 0 ({type(optimizer).__name__}): the objective's (tangential) step is "
                        f"zero, but every step still takes {' and '.join(moves)}, so the weights move onto the "
                        "constraints (a feasibility projection). For no step at all, give a number as rho and "
                        "max_corrections=0."
                    ))
                    return

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        last = getattr(pl_module, "last_step", None)
        if getattr(last, "skipped", False):  # on_nonfinite="skip": a skipped batch is not the run's state
            return
        observation = self._observe(trainer, outputs)
        if observation is None:
            return
        self._check_divergence(trainer, observation)
        self._check_infeasibility(trainer, observation)

    # ------------------------------------------------------------------ observing
    def _observe(self, trainer: pl.Trainer, outputs: Any) -> _Observation | None:
        """f, max|c| and the feasibility error of this step, on logging steps and the first (one host read)."""
        if not isinstance(outputs, dict) or not isinstance(outputs.get("objective"), Tensor):
            return None
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        diagnostics = getattr(optimizer, "diagnostics", None) or {}
        every = trainer.log_every_n_steps or 50
        step = trainer.global_step  # after the update: the outputs are at the weights of step - 1
        if not diagnostics and step % every != 0 and self._first is not None:
            return None
        f = outputs["objective"].detach().reshape(())
        values = [f.double()]
        c = outputs.get("constraints")
        violation = diagnostics.get("violation_max")
        if not isinstance(violation, Tensor):
            violation = c.detach().abs().max() if isinstance(c, Tensor) and c.numel() else None
        if violation is not None:
            values.append(violation.detach().reshape(()).to(f.device, torch.float64))
        extra = [diagnostics.get(k) for k in ("linearized_feasibility_error", "rank")]
        present = [isinstance(v, Tensor) for v in extra]
        values.extend(v.detach().reshape(()).to(f.device, torch.float64) for v in extra if isinstance(v, Tensor))
        numbers = torch.stack(values).tolist()  # the one host read
        tail = iter(numbers[2 if violation is not None else 1:])
        error, rank = (next(tail) if here else None for here in present)
        return _Observation(
            step=max(step - 1, 0),
            objective=numbers[0],
            violation=numbers[1] if violation is not None else None,
            feasibility_error=error,
            rank=rank,
            rows=c.numel() if isinstance(c, Tensor) else 0,
        )

    # ------------------------------------------------------------------ divergence
    def _check_divergence(self, trainer: pl.Trainer, now: _Observation) -> None:
        first = self._first
        if first is None:
            self._first = now
        if "diverging" not in self.findings:
            message = self._divergence(trainer, now, first)
            if message:
                self._report(trainer, "diverging", message)
        if first is not None and math.isfinite(now.objective):
            low = self._lowest_objective
            self._lowest_objective = abs(now.objective) if low is None else min(low, abs(now.objective))
        if now.violation is not None and math.isfinite(now.violation):
            low = self._lowest_violation
            self._lowest_violation = now.violation if low is None else min(low, now.violation)

    def _divergence(self, trainer: pl.Trainer, now: _Observation, first: _Observation | None) -> str | None:
        lr = self._lr(trainer)
        advice = (f"Try a smaller lr (now {lr:.3g}; e.g. {lr / 10:.2g} or below)" if lr else "Try a smaller lr") + (
            ", max_grad_norm (clips the objective gradient), or a scheduler with a warm-up.")
        bad = [name for name, value in (("objective", now.objective), ("max |c|", now.violation))
               if value is not None and not math.isfinite(value)]
        if bad:
            return (f"lit-constrained: the run diverged: the {' and '.join(bad)} is not finite at step {now.step}. "
                    + advice)
        if first is None:
            return None
        factor = self.divergence_factor
        low = self._lowest_objective
        if low is not None and abs(now.objective) > factor * low and abs(now.objective) > abs(first.objective):
            return (f"lit-constrained: the run is diverging: the objective grew to {_fmt(now.objective)} at step "
                    f"{now.step}, {_fmt(abs(now.objective) / max(low, 1e-300))} times its lowest value since the "
                    f"first step ({_fmt(low)}; {_fmt(first.objective)} at the start). " + advice)
        # max |c|: from its lowest value, the start included
        low_c = self._lowest_violation
        # and above sqrt(eps) of the weights' dtype: a resumed fit starts its references at a feasible
        # point, where max |c| wanders 1000-fold within round-off (the uninterrupted run starts far above)
        if (now.violation is not None and low_c is not None and first.violation is not None
                and now.violation > factor * low_c and now.violation > max(first.violation, self._eps_floor)):
            since = "at the start" if low_c == first.violation else f"; {_fmt(first.violation)} at the start"
            return (f"lit-constrained: the run is diverging: max |c| grew to {_fmt(now.violation)} at step "
                    f"{now.step}, {_fmt(now.violation / max(low_c, 1e-300))} times its lowest value ({_fmt(low_c)}"
                    f"{' ' if since.startswith('at') else ''}{since}). " + advice.replace(
                        ", max_grad_norm", ", a cap on the normal step (the optimizer's max_normal_step), max_grad_norm"))
        return None

    # ------------------------------------------------------------------ infeasibility
    def _check_infeasibility(self, trainer: pl.Trainer, now: _Observation) -> None:
        if now.feasibility_error is None or now.violation is None or not math.isfinite(now.feasibility_error):
            return
        self._recent.append(now)
        if "infeasible" in self.findings or "diverging" in self.findings or len(self._recent) < self.window:
            return
        recent = list(self._recent)
        errors = [o.feasibility_error for o in recent]
        violations = [o.violation for o in recent]
        start = self._first.violation if self._first is not None and self._first.violation is not None else violations[0]
        median = statistics.median(errors)  # type: ignore[type-var]
        lowest = min(violations)  # type: ignore[type-var]
        stalled = lowest >= 0.5 * violations[0]  # type: ignore[operator]
        far = lowest >= max(1e-3 * start, self._eps_floor)  # type: ignore[operator]
        # J d = -c has an exact solution whenever J has full row rank: a residual needs rank(J) < m
        deficient = all(o.rank is None or o.rank < o.rows for o in recent)
        if median >= self.infeasible_error and stalled and far and deficient:
            self._report(trainer, "infeasible", self._infeasible_message(trainer, recent, start, median))

    def _infeasible_message(self, trainer: pl.Trainer, recent: list[_Observation], start: float, median: float) -> str:
        now = recent[-1]
        first_rank = self._first.rank if self._first is not None else None
        if now.rank is not None and first_rank is not None and now.rank < first_rank:
            lr = self._lr(trainer)
            cause = (f"The rank of J fell from {first_rank:.0f} to {now.rank:.0f} (m = {now.rows}) during the run: the "
                     "network lost the freedom to meet them, often from steps too large for it (saturated units): "
                     f"try a smaller lr{f' (now {lr:.3g})' if lr else ''}.")
        else:
            rank = f" (rank of J {now.rank:.0f} < m = {now.rows})" if now.rank is not None else ""
            cause = (f"Check that constraints() can vanish{rank}: no contradictory rows (two values asked at one "
                     "point), no residual that does not depend on the weights, a network able to represent them.")
        return (
            f"lit-constrained: the constraints look infeasible: max |c| stays near {_fmt(now.violation or 0.0)} "
            f"(steps {recent[0].step}-{now.step}; {_fmt(start)} at the start) and the step cannot reduce it: the "
            f"least-squares residual of J d = -c is {median:.0%} of ||c|| (median of "
            f"optim/linearized_feasibility_error; ~0 when the constraints can be met). {cause}"
        )

    # ------------------------------------------------------------------ reporting
    @staticmethod
    def _lr(trainer: pl.Trainer) -> float | None:
        try:
            return float(trainer.optimizers[0].param_groups[0]["lr"])
        except (IndexError, KeyError, TypeError, ValueError):
            return None

    def _report(self, trainer: pl.Trainer, kind: str, message: str) -> None:
        if kind in self.findings:
            return
        self.findings[kind] = message
        if trainer.is_global_zero:
            warnings.warn(message, RunHealthWarning, stacklevel=2)
