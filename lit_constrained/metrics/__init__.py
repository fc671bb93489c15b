"""torchmetrics Metrics for constraint violation, correct under DDP (synced value = value on the union).

``functional`` holds the one-shot functions; the classes accumulate over batches and ranks.
``relative_l2`` holds the tasks' test error against a reference solution (:class:`RelativeL2Error`).
"""

from . import functional
from ._base import ViolationMetric
from .functional import (
    relative_violation,
    violation_l1,
    violation_l2,
    violation_max,
    violation_mean,
    violation_norm,
)
from .maximum import MaxViolation
from .mean import MeanViolation
from .norms import L1Violation, L2Violation
from .registry import VIOLATION_METRICS, MetricName, build_violation_metric, check_metric_names
from .relative import RelativeViolation
from .relative_l2 import RelativeL2Error, relative_l2_error

__all__ = [
    "VIOLATION_METRICS",
    "L1Violation",
    "L2Violation",
    "MaxViolation",
    "MeanViolation",
    "MetricName",
    "RelativeL2Error",
    "RelativeViolation",
    "ViolationMetric",
    "build_violation_metric",
    "check_metric_names",
    "functional",
    "relative_l2_error",
    "relative_violation",
    "violation_l1",
    "violation_l2",
    "violation_max",
    "violation_mean",
    "violation_norm",
]
