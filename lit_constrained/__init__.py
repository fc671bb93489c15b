"""lit_constrained: hard constraints (equalities, inequalities, bounds) during training, with PyTorch Lightning.

``lit_constrained.optim`` is pure PyTorch; the Lightning layer (``ConstrainedModule``) is imported
lazily so that importing the optimizers does not import Lightning.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["ConstrainedModule", "Imposed", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "ConstrainedModule":
        from .module import ConstrainedModule

        return ConstrainedModule
    if name == "Imposed":  # no Lightning import: a plain dataclass
        from .imposed import Imposed

        return Imposed
    raise AttributeError(f"module 'lit_constrained' has no attribute {name!r}")
