"""NumPy/SciPy's BLAS threads held to torch's thread count during the host linear algebra.

The host path of the optimizers (:mod:`~lit_constrained.optim.linalg`, "the host path") runs the m x m
algebra in NumPy/SciPy, whose OpenBLAS starts one thread per core regardless of ``torch.set_num_threads``.
On a shared machine those threads spin against each other and against torch's: the pivoted Cholesky
factor of a 1 000 x 1 000 Gram took 640-1 510 ms with OpenBLAS's default threads against 72-118 ms on one
(AMD EPYC, 2 cores under load; ``threadpoolctl`` measured). :func:`host_blas_threads` limits them to
``torch.get_num_threads()`` for the duration of a step (~10 us to enter).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

_CONTROLLER: Any = None


def host_blas_threads() -> contextlib.AbstractContextManager:
    """A context in which NumPy/SciPy's BLAS uses ``torch.get_num_threads()`` threads."""
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController  # (imported once, at the first step)

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=torch.get_num_threads(), user_api="blas")
