"""The command line, ``lit-constrained`` (and ``python -m lit_constrained.cli``), in one wing.

* :mod:`~lit_constrained.cli.console`: the entry point (argparse): the subcommands, their dispatch, the
  help pages; imports neither torch nor Lightning.
* :mod:`~lit_constrained.cli.preflight`: the checks made before Lightning is imported (a missing config,
  an unknown key, a class or an argument that does not exist, a value its annotation cannot take), read
  from the source files; nothing it checks is imported.
* :mod:`~lit_constrained.cli.fit`: the Lightning part (LightningCLI, its parser, the run); the only
  module of the wing that imports Lightning, imported only when a Lightning subcommand runs.

This package's ``__init__`` imports nothing, so that importing the console does not import the fit layer.
"""
