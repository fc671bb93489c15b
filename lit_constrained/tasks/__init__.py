"""The papers' tasks. Darcy (neuraloperator's FNO, whose import pulls in several heavy packages) is
imported on first use: ``lit_constrained.tasks.Darcy`` or ``lit_constrained.tasks.darcy``."""

from typing import Any

from .spring import Spring, SpringData
from .chemistry import Chemistry, ChemistryData
from .burgers import Burgers, BurgersData

__all__ = ["Spring", "SpringData", "Chemistry", "ChemistryData", "Burgers", "BurgersData", "Darcy", "DarcyData"]


def __getattr__(name: str) -> Any:
    if name in ("Darcy", "DarcyData"):
        from . import darcy

        return getattr(darcy, name)
    raise AttributeError(f"module 'lit_constrained.tasks' has no attribute {name!r}")
