"""Experimental optimizers: exact and tested, but short of the goal they were built for (each module's
docstring says what was measured and the command). Pure PyTorch, no Lightning import, as the rest of
:mod:`lit_constrained.optim`; the API may change or the classes may be removed.

* :class:`SQPMoMo`, :class:`SQPMoMoAdam` (:mod:`.sqp_momo`, docs/sqp_momo.md): MoMo's model-based step size
  on the linearized constraints. Goal: a good-lr range >= 10x SQP-Adam's at a best error within 1.5x;
  missed in the lr sweep (issue 31).

In a config: ``class_path: lit_constrained.optim.experimental.SQPMoMoAdam``.
"""

from .sqp_momo import SQPMoMo, SQPMoMoAdam

__all__ = ["SQPMoMo", "SQPMoMoAdam"]
