"""Which optimizer diagnostics are charted: :class:`VaryingScalars` keeps a chart for a quantity only once
it has changed, and the constants for the run's text summary. No torch, no Lightning."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

VARYING_SCALARS_KEY = "lit_constrained_varying_scalars"
"""Checkpoint key of which optimizer diagnostics were charted (so a resumed run charts the same tags)."""


class VaryingScalars:
    """Filters a stream of named scalars down to the ones that vary.

    A name is charted once one of its values differs from its first value; it is then written at every
    step it was fed, from the first on: the values held back while it looked constant (each equal to
    the first) are written at their own steps when it first changes. So what is written does not
    depend on the step at which the first difference shows: a round-off quantity that leaves exactly 0
    at step 1 in one run and only at step 2 in another (a different summation order, e.g. 1 and 2
    processes) gives both runs the same points, and the flat stretch before a change is drawn flat
    (not as a slope from the first step to the change). A name that never varies is a constant,
    reported by :meth:`constants`. NaN equals NaN here.

    The held steps are kept as arithmetic runs ``[start, stride, count]`` (one run for a regular
    logging cadence), so the state stays small over a long run.
    """

    def __init__(self) -> None:
        self.first: dict[str, tuple[int, float]] = {}
        self.held: dict[str, list[list[int]]] = {}  # the steps a not-yet-varying name was fed at
        self.varying: set[str] = set()

    def update(self, step: int, values: Mapping[str, float]) -> list[tuple[int, dict[str, float]]]:
        """Feed the values of ``step``; returns ``[(step, {name: value})]`` to write, oldest first."""
        backfill: dict[int, dict[str, float]] = {}
        now: dict[str, float] = {}
        for name, value in values.items():
            if name in self.varying:
                now[name] = value
            elif name not in self.first:
                self.first[name] = (step, value)
                self.held[name] = [[step, 0, 1]]
            else:
                first = self.first[name][1]
                same = value == first or (math.isnan(value) and math.isnan(first))
                if same:
                    _append_step(self.held[name], step)
                else:
                    self.varying.add(name)
                    for held_step in _expand_steps(self.held.pop(name)):
                        backfill.setdefault(held_step, {})[name] = first
                    now[name] = value
        out = sorted(backfill.items())
        if now:
            out.append((step, now))
        return out

    def constants(self) -> dict[str, float]:
        """The names that never varied, with their value."""
        return {name: value for name, (_, value) in self.first.items() if name not in self.varying}

    def state_dict(self) -> dict[str, Any]:
        return {"first": dict(self.first), "held": {k: [list(r) for r in v] for k, v in self.held.items()},
                "varying": sorted(self.varying)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.first = {k: (int(s), float(v)) for k, (s, v) in state.get("first", {}).items()}
        self.varying = set(state.get("varying", ()))
        held = state.get("held", {})
        # a state saved before the held steps were kept knows only each name's first step
        self.held = {k: [[int(a), int(b), int(c)] for a, b, c in held[k]] if k in held else [[s, 0, 1]]
                     for k, (s, _) in self.first.items() if k not in self.varying}


def _append_step(runs: list[list[int]], step: int) -> None:
    """Add ``step`` to the arithmetic runs ``[start, stride, count]`` (extending the last when it fits)."""
    start, stride, count = runs[-1]
    last = start + stride * (count - 1)
    if count == 1 and step > start:
        runs[-1] = [start, step - start, 2]
    elif step > last and step - last == stride:
        runs[-1][2] = count + 1
    else:
        runs.append([step, 0, 1])


def _expand_steps(runs: list[list[int]]) -> list[int]:
    """The steps of the arithmetic runs ``[start, stride, count]``, in order."""
    return [start + stride * i for start, stride, count in runs for i in range(count)]
