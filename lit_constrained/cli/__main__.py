"""``python -m lit_constrained.cli ...`` (e.g. ``torchrun ... -m lit_constrained.cli fit ...``): the whole
``lit-constrained`` command (:func:`lit_constrained.console.main`), compare included.

A script, not a module of the fit layer: nothing imports it, so the fit layer (:mod:`lit_constrained.cli`)
never imports the console and the layers stay one-way (console -> compare -> cli).
"""

from lit_constrained.console import main

main()
