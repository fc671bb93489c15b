"""Run the doctested examples of every module of lit_constrained.metrics."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import lit_constrained.metrics as metrics_pkg

MODULES = sorted(
    ["lit_constrained.metrics"]
    + [f"lit_constrained.metrics.{m.name}" for m in pkgutil.iter_modules(metrics_pkg.__path__)]
)


@pytest.mark.parametrize("module_name", MODULES)
def test_doctests(module_name: str) -> None:
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_every_metric_class_has_a_doctested_example() -> None:
    finder = doctest.DocTestFinder()
    for name in metrics_pkg.VIOLATION_METRICS.values():
        tests = [t for t in finder.find(name) if t.examples and t.name == name.__qualname__]
        assert tests, f"{name.__qualname__} has no doctest example"
