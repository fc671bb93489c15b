#!/usr/bin/env python
"""The README's figures of the lean install, checked against a fresh virtual environment.

Does what the README says (``python -m venv DIR && DIR/bin/pip install torch==2.13.0 && DIR/bin/pip
install -e .``, then ``du -sh DIR`` and ``DIR/bin/pip list | wc -l``) and compares with the figures of
the README's sentence "... 1.3 GB, 754 MB of it PyTorch's CPU build, and 51 lines of `pip list` (49
packages, ...)"::

    python scripts/check_lean_install.py [--venv /tmp/lean]     # minutes; about 1.3 GB of disk

Tolerances: the sizes within 10 % (wheels' sizes move between patch releases of the dependencies), the
number of ``pip list`` lines and packages exactly (a new dependency must be a decision). Exit status 1
when a figure is off or missing from the README.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = re.compile(
    r"\) ([0-9.]+) GB, ([0-9]+) MB of it PyTorch's CPU build, and ([0-9]+) lines of `pip list` \(([0-9]+) packages"
)


def du_kib(path: Path) -> int:
    """``du -sk path``: the disk usage in KiB (what ``du -sh`` rounds to K, M, G: powers of 1024)."""
    return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", type=Path, default=Path("/tmp/lean"))
    parser.add_argument("--keep", action="store_true", help="keep the venv afterwards")
    args = parser.parse_args(argv)
    text = " ".join((ROOT / "README.md").read_text().split())
    found = SENTENCE.search(text)
    if found is None:
        print("FAIL the README's lean-install sentence was not found")
        return 1
    gb, torch_mb, lines, packages = float(found.group(1)), int(found.group(2)), int(found.group(3)), int(found.group(4))
    if args.venv.exists():
        shutil.rmtree(args.venv)
    subprocess.run([sys.executable, "-m", "venv", str(args.venv)], check=True)
    pip = [str(args.venv / "bin" / "pip"), "install", "-q"]
    subprocess.run(pip + ["torch==2.13.0"], check=True)
    subprocess.run(pip + ["-e", str(ROOT)], check=True)
    listed = subprocess.run([str(args.venv / "bin" / "pip"), "list"], capture_output=True, text=True, check=True)
    fresh_lines = len(listed.stdout.splitlines())
    fresh_packages = fresh_lines - 2  # the two header lines
    total_gib = du_kib(args.venv) / 2**20
    torch_mib = du_kib(next(args.venv.glob("lib/python*/site-packages/torch"))) / 2**10
    checks = [
        ("venv size (du -sh, GB)", gb, total_gib, abs(total_gib - gb) <= 0.1 * gb + 0.05),
        ("PyTorch (du -sh of site-packages/torch, MB)", torch_mb, torch_mib, abs(torch_mib - torch_mb) <= 0.1 * torch_mb),
        ("pip list lines", lines, fresh_lines, fresh_lines == lines),
        ("packages", packages, fresh_packages, fresh_packages == packages),
    ]
    for name, stated, fresh, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: README {stated}, fresh {fresh:.4g}")
    if not args.keep:
        shutil.rmtree(args.venv)
    return 0 if all(ok for *_, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
