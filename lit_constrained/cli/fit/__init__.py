"""The fit layer of ``lit-constrained`` (:mod:`~lit_constrained.cli.fit.command`: :func:`run_fit`,
:func:`main`, :class:`ConstrainedCLI`; its parser :mod:`~lit_constrained.cli.fit.parser`; the errors'
words :mod:`~lit_constrained.cli.fit.hints`): the only part of :mod:`lit_constrained.cli` that imports
Lightning when imported."""

from lit_constrained.cli.fit.command import ConstrainedCLI, main, run_fit

__all__ = ["ConstrainedCLI", "main", "run_fit"]
