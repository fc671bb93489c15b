"""Geometry sampling cost: 1e5 boundary points with outward normals of a rectangle minus 4 disks.

The target (issue: "Geometry sampling: 1e5 boundary points with normals of a rectangle minus 4 disks in
<= 50 ms") is a figure in milliseconds, so no ratio: each figure is the median over ``--repeats`` runs
of ``boundary_sample(n, method, seed)`` (points AND normals, float64 tensors), as wall-clock time and
as the process's CPU time (``time.process_time``: what the sampler itself used, less sensitive to a
shared machine's other load, printed beside it with the load average), on

* ``warm``: one geometry, its boundary's kept arcs found on the first call (cached on the object);
* ``cold``: a new geometry each run, so the kept arcs are found anew (the first call's cost);

and the interior (``interior(n)``, by rejection from the bounding box) for comparison. Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_geometry.py [--n 100000] [--repeats 21] [--methods uniform,sobol,lhs,grid]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from collections.abc import Callable

from machine import cpu_model  # benchmarks/machine.py (scripts run from benchmarks/)
from lit_constrained.physics import Box, Disk, Geometry

HOLES = ((0.25, 0.25), (0.75, 0.25), (0.25, 0.75), (0.75, 0.75))


def plate() -> Geometry:
    """[0, 1]^2 minus 4 disks of radius 0.1 (boundary length 4 + 0.8 pi)."""
    domain: Geometry = Box((0.0, 0.0), (1.0, 1.0))
    for center in HOLES:
        domain = domain - Disk(center, 0.1)
    return domain


def timed(run: Callable[[int], object], repeats: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of ``run(seed)`` over ``repeats`` seeds (after one untimed call)."""
    run(10_000)
    walls, cpus = [], []
    for seed in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        run(seed)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return 1e3 * statistics.median(walls), 1e3 * statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--methods", default="uniform,sobol,lhs,grid")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", "The balance properties of Sobol")
    domain = plate()
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"rectangle minus 4 disks, n = {args.n}, medians of {args.repeats} runs (ms, wall / CPU):")
    for method in args.methods.split(","):
        warm = timed(lambda seed: domain.boundary_sample(args.n, method, seed), args.repeats)
        cold = timed(lambda seed: plate().boundary_sample(args.n, method, seed), args.repeats)
        print(f"  boundary_sample {method:7s}  warm {warm[0]:7.1f} / {warm[1]:7.1f}   cold {cold[0]:7.1f} / {cold[1]:7.1f}")
    for method in ("uniform", "sobol"):
        inside = timed(lambda seed: domain.interior(args.n, method, seed), args.repeats)
        print(f"  interior        {method:7s}  {inside[0]:7.1f} / {inside[1]:7.1f}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
