"""The issue-18 learning-rate sweep; the logic lives in :mod:`lit_constrained.compare.sweep`.

    python benchmarks/sqp_momo_sweep.py --tasks curve --steps curve=300 --json sweep.json
    (the same as: python -m lit_constrained.compare.sweep ...)
"""

from lit_constrained.compare.sweep import main

if __name__ == "__main__":
    raise SystemExit(main())
