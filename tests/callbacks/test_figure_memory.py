"""A figure drawn inside figure_memory_freed() is freed when the block ends, without a full collection."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from lit_constrained.callbacks.figure_memory import figure_memory_freed
from lit_constrained.module_parts.tensorboard import small_figure


def _draw() -> weakref.ref:
    figure, axes = small_figure()
    axes.plot(np.arange(50.0), np.sin(np.arange(50.0)), label="a")
    axes.set(title="t", xlabel="x")
    figure.legend(loc="outside lower center")
    figure.canvas.draw()  # as TensorBoard's add_figure renders it
    return weakref.ref(figure)


def test_the_figure_is_freed_at_the_end_of_the_block_and_the_collector_restored() -> None:
    assert gc.isenabled()
    with figure_memory_freed():
        assert not gc.isenabled()
        freed = _draw()
    assert freed() is None and gc.isenabled()  # its cycles collected by the young-generation pass


def test_without_it_the_figure_waits_for_a_full_collection() -> None:
    # the control: the same figure drawn outside the block is still alive (only unreachable cycles hold it)
    kept = _draw()
    try:
        assert kept() is not None
    finally:
        gc.collect()
    assert kept() is None


def test_a_paused_collector_stays_paused() -> None:
    gc.disable()
    try:
        with figure_memory_freed():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
