"""Callbacks that observe a run (they never know a task): the Lipschitz constant step, the step-size
monitor, the constraint-violation metrics; the end-of-fit summary and crash-safe checkpoints
live in their own modules."""

from .lipschitz import LipschitzEstimator, reset_all_parameters
from .step_size import StepSizeMonitor
from .violation import ConstraintViolationMonitor

__all__ = [
    "ConstraintViolationMonitor",
    "LipschitzEstimator",
    "StepSizeMonitor",
    "reset_all_parameters",
]
