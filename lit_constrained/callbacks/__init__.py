"""Callbacks that observe a run (they never know a task): the Lipschitz constant step, the step-size
monitor, the constraint-violation metrics; the end-of-fit summary, crash-safe checkpoints and
monitoring helpers live in their own modules."""

from .lipschitz import LipschitzEstimator, reset_all_parameters
from .step_size import StepSizeMonitor
from .violation import ConstraintViolationMonitor
from .fstar import FStarMonitor  # deprecated alias of StepSizeMonitor (old configs)

__all__ = [
    "ConstraintViolationMonitor",
    "FStarMonitor",
    "LipschitzEstimator",
    "StepSizeMonitor",
    "reset_all_parameters",
]
