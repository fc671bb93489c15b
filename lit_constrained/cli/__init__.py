"""The command line, ``lit-constrained`` (and ``python -m lit_constrained.cli``), in one wing.

* :mod:`~lit_constrained.cli.console`: the entry point (argparse): the subcommands and their dispatch;
  imports neither torch nor Lightning.
* :mod:`~lit_constrained.cli.help`: the ``fit --help`` page, built from a parser of a run's options and
  from the signatures (nothing imported).
* :mod:`~lit_constrained.cli.trainer_arguments`: the Trainer's arguments from its signature, cached per
  installed Lightning (the first use imports the Trainer; later ones read a file).
* :mod:`~lit_constrained.cli.preflight`: the checks made before Lightning is imported (a missing config,
  an unknown key, a class or an argument that does not exist, a value its annotation cannot take), read
  from the source files; nothing it checks is imported.
* :mod:`~lit_constrained.cli.fit`: the Lightning part (LightningCLI, its parser, its error hints, the
  run), imported only when a Lightning subcommand runs.

This package's ``__init__`` imports nothing, so that importing the console does not import the fit layer.
"""
