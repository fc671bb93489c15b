from .lipschitz import LipschitzEstimator, reset_all_parameters
from .violation import ConstraintViolationMonitor
from .fstar import FStarMonitor
