"""``python -m lit_constrained.cli ...`` (e.g. ``torchrun ... -m lit_constrained.cli fit ...``): the whole
``lit-constrained`` command (:func:`lit_constrained.cli.console.main`), compare included.

A script, not a module of the fit layer: nothing imports it, so the fit layer (:mod:`lit_constrained.cli.fit`)
never imports the console and the layers stay one-way (console -> compare -> fit).
"""

from lit_constrained.cli.console import main

main()
