"""The command line, ``lit-constrained`` (and ``python -m lit_constrained.cli``): the console
(:mod:`~lit_constrained.cli.console`: argparse, no torch), the ``fit --help`` page
(:mod:`~lit_constrained.cli.help`) and the fit layer (:mod:`~lit_constrained.cli.fit`: LightningCLI, its
parser and its error phrasing), imported only when a Lightning subcommand runs. This ``__init__``
imports nothing, so that importing the console does not import the fit layer.
"""
