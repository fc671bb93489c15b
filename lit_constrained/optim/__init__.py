"""Constrained and adaptive stochastic optimizers (pure PyTorch, no Lightning import)."""

from .adam_con import AdamCon
from lit_constrained.jacobians import constraint_jacobian
from .linalg.nullspace import NullSpace
from .sqp import SQPAdam, SQPHeavyBall
from .constant_step_adam import ConstantStepAdam
from .lipschitz import LipschitzEstimate, constant_step_size, estimate_lipschitz, reset_all_parameters
from .lr_setting import set_lr
from .momo import MoMo, MoMoAdam

__all__ = [
    "AdamCon", "ConstantStepAdam", "MoMo", "MoMoAdam", "NullSpace", "SQPAdam", "SQPHeavyBall", "constraint_jacobian",
    "LipschitzEstimate", "constant_step_size", "estimate_lipschitz", "reset_all_parameters", "set_lr",
]
