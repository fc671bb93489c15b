"""Every Python file of the package, tests, benchmarks and scripts compiles without a warning (an invalid
escape such as ``\\o`` in a non-raw docstring is a SyntaxWarning today and an error under ``-W error``, which
some tests use: a fresh checkout would then fail where a cached .pyc hid it)."""

from __future__ import annotations

import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_source_compiles_without_warnings():
    offenders = []
    for folder in ("lit_constrained", "tests", "benchmarks", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                compile(path.read_text(), str(path), "exec")
            offenders += [f"{path.relative_to(ROOT)}:{w.lineno}: {w.message}" for w in caught]
    assert not offenders, "\n".join(offenders)
