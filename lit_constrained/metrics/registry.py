"""Names of the violation metrics, as used by ``ConstraintViolationMonitor`` and in log keys."""

from __future__ import annotations

from typing import Any, Literal

from ._base import ViolationMetric
from .maximum import MaxViolation
from .mean import MeanViolation
from .norms import L1Violation, L2Violation
from .relative import RelativeViolation

MetricName = Literal["max", "mean", "l1", "l2", "relative"]

VIOLATION_METRICS: dict[str, type[ViolationMetric]] = {
    "max": MaxViolation,
    "mean": MeanViolation,
    "l1": L1Violation,
    "l2": L2Violation,
    "relative": RelativeViolation,
}


def check_metric_names(names: Any) -> tuple[str, ...]:
    """Return ``names`` as a tuple if every entry is a known metric name, else raise a ``ValueError``."""
    if isinstance(names, str):
        names = (names,)
    names = tuple(names)
    unknown = [n for n in names if n not in VIOLATION_METRICS]
    if unknown or not names:
        raise ValueError(
            f"Unknown violation metric name(s) {unknown or names!r}: choose a non-empty subset of "
            f"{sorted(VIOLATION_METRICS)}."
        )
    if len(set(names)) != len(names):
        raise ValueError(f"Duplicate violation metric names in {names!r}: list each once.")
    return names


def build_violation_metric(name: str, **kwargs: Any) -> ViolationMetric:
    """Instantiate the metric called ``name`` (one of ``VIOLATION_METRICS``) with Metric ``kwargs``."""
    check_metric_names((name,))
    return VIOLATION_METRICS[name](**kwargs)
