"""The papers' tasks (spring, chemistry, Burgers, Darcy), the 2D Poisson problem and four PINNacle problems
(Burgers1d-C, Poisson2d-C, Wave1d-C, Heat2d-MS: :mod:`lit_constrained.tasks.pinnacle`) and its two inverse
problems (PInv, HInv: :mod:`lit_constrained.tasks.pinnacle_inverse`).

Darcy is imported on first use (``lit_constrained.tasks.Darcy`` or ``lit_constrained.tasks.darcy``); its
FNO needs neuraloperator, the optional ``[fno]`` extra, imported only when a ``Darcy`` is built."""

from typing import Any

from .spring import Spring, SpringData
from .chemistry import Chemistry, ChemistryData
from .burgers import Burgers, BurgersData
from .poisson import Poisson, PoissonData
from .pinnacle import BurgersPinnacle, HeatPinnacle, PinnacleData, PoissonPinnacle, WavePinnacle
from .pinnacle_inverse import HeatInverse, HeatInverseData, PoissonInverse, PoissonInverseData

__all__ = [
    "Spring", "SpringData", "Chemistry", "ChemistryData", "Burgers", "BurgersData", "Poisson", "PoissonData",
    "Darcy", "DarcyData", "BurgersPinnacle", "PoissonPinnacle", "WavePinnacle", "HeatPinnacle", "PinnacleData",
    "PoissonInverse", "PoissonInverseData", "HeatInverse", "HeatInverseData",
]


def __getattr__(name: str) -> Any:
    if name in ("Darcy", "DarcyData"):
        from . import darcy

        return getattr(darcy, name)
    raise AttributeError(f"module 'lit_constrained.tasks' has no attribute {name!r}")
