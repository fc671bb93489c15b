"""lit_constrained: hard constraints (equalities, inequalities, bounds) during training, with PyTorch Lightning.

``lit_constrained.optim`` is pure PyTorch; the Lightning layer (``ConstrainedModule``) is imported
lazily so that importing the optimizers does not import Lightning.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["ConstrainedModule", "Coupled", "Imposed", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "ConstrainedModule":
        from .module import ConstrainedModule

        return ConstrainedModule
    if name in ("Imposed", "Coupled"):  # no Lightning import: plain dataclasses
        from . import imposed

        return getattr(imposed, name)
    raise AttributeError(f"module 'lit_constrained' has no attribute {name!r}")
