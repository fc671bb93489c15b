"""The fit layer of ``lit-constrained``: LightningCLI over ConstrainedModule subclasses and DataModules.

:func:`run_fit` trains as ``lit-constrained fit <args>`` does, in the calling process (the console and
the comparison's workers call it); :func:`main` is the Lightning part of the command line
(``[-c CONFIG] [--print_config] {fit,validate,test,predict} ...``); :class:`ConstrainedCLI` is the
LightningCLI subclass (:mod:`~lit_constrained.cli.fit.command`) and :mod:`~lit_constrained.cli.fit.parser`
its argument parser. The only part of :mod:`lit_constrained.cli` that imports Lightning.
"""

from lit_constrained.cli.fit.command import ConstrainedCLI, check_trusted_checkpoint, main, run_fit

__all__ = ["ConstrainedCLI", "check_trusted_checkpoint", "main", "run_fit"]
