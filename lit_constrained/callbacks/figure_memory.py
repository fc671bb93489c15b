"""Figures drawn during training free their memory when they are done, not at the next full collection.

A matplotlib figure is thousands of objects in reference cycles (figure, axes, artists, transforms), so
reference counting never frees it: the cyclic garbage collector must. Objects that survive a few young
collections while the figure is drawn reach the oldest generation, which Python scans only when it has
grown by a quarter, and a training process holds hundreds of thousands of long-lived objects: each
prediction image logged at a validation then stays in memory for tens of validations (0.5-0.7 MB each
for the spring task's figure: RSS grew 450 -> 475 MB over 16 000 steps, then fell at a full collection).
A full ``gc.collect()`` after each figure would free it, but scans every object (0.5 s in that process).

:func:`figure_memory_freed` runs the drawing with the automatic collector paused, so every object the
figure makes stays in the youngest generation, then collects the young generations only: the figure's
cycles are freed at once, for about a millisecond.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def figure_memory_freed() -> Iterator[None]:
    """Draw and log a figure inside this block; drop every reference to it before the block ends.

    The automatic collector is paused inside (and restored to its previous state after), then
    ``gc.collect(1)`` frees the cycles made inside the block that nothing outside refers to.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.collect(1)
