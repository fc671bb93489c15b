"""What the benchmarks print beside every figure: the CPU they ran on (machines here differ 3x in
MKL's float64 GEMM speed, so a ratio without its CPU model is not comparable)."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU model name (``lscpu``'s "Model name", read from /proc/cpuinfo where there is one)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"
