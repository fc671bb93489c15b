#!/usr/bin/env python
"""Screenshots of TensorBoard as a user first sees it: the opening view and the Images tab.

Starts ``tensorboard`` on 127.0.0.1 (a free port) over LOGDIR, waits until all its data are loaded
(it serves every scalar tag up to the last step the event files hold, read here first), and saves what
headless Chromium renders::

    python scripts/tensorboard_screenshots.py lightning_logs docs/ --playwright node_modules
        # -> docs/tensorboard_opening.png, docs/tensorboard_images.png, docs/tensorboard_custom_scalars.png

With ``--playwright DIR`` (a ``node_modules`` folder holding ``playwright-core``: ``npm install
playwright-core``) the pages are driven by playwright, which waits for the charts to be drawn (the
Time Series tab draws its lines with WebGL after its data arrive: Chromium's own ``--screenshot``
with a virtual-time budget measured here, TensorBoard 2.21 and Chromium 156, showed the cards' axes
but not always their lines), and it also saves ``<prefix>custom_scalars.png`` (the Custom Scalars
tab: train and validation on one chart each). Without it, Chromium's ``--screenshot`` makes the first
two views.

Needs Debian's ``chromium`` (``apt-get install chromium``) or ``--chromium PATH``. Chromium runs with a
fresh profile, without sandbox, GPU, network services or first-run UI, and renders for
``--budget-ms`` of virtual time (TensorBoard's charts are drawn by JavaScript) before each screenshot.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--force-device-scale-factor=1",
)
VIEWS = {"opening": "", "images": "#images"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_runs(url: str, timeout_s: float) -> list[str]:
    """Poll TensorBoard's run list until it is non-empty (the logdir has been read)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/data/runs", timeout=5) as response:
                runs = json.loads(response.read())
            if runs:
                return runs
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"TensorBoard at {url} listed no runs within {timeout_s:.0f} s: is the logdir right?")


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def last_steps(logdir: Path) -> dict[tuple[str, str], int]:
    """(run, tag) -> the last step of every scalar tag in the event files under ``logdir``, read here with
    TensorBoard's own reader (the runs named as TensorBoard names them: their paths under ``logdir``)."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    events = EventMultiplexer(size_guidance={"scalars": 0})
    events.AddRunsFromDirectory(str(logdir))
    events.Reload()
    return {(run, tag): max(e.step for e in events.Scalars(run, tag))
            for run, kinds in events.Runs().items() for tag in kinds.get("scalars", [])}


def wait_until_loaded(url: str, expected: dict[tuple[str, str], int], timeout_s: float) -> None:
    """Wait until TensorBoard serves every scalar tag of ``expected`` up to its last step. It lists runs as
    soon as it finds them and loads their events in the background; on a loaded machine the count of
    points it serves can stand still for seconds mid-load, so a pause is no sign that it is done."""
    deadline = time.monotonic() + timeout_s
    missing = dict(expected)
    while time.monotonic() < deadline:
        for (run, tag), step in list(missing.items()):
            query = urllib.parse.urlencode({"run": run, "tag": tag})
            try:
                points = _get_json(f"{url}/data/plugin/scalars/scalars?{query}")
            except OSError:  # the tag is not served yet
                continue
            if points and max(point[1] for point in points) >= step:
                del missing[(run, tag)]
        if not missing:
            return
        time.sleep(1.0)
    raise TimeoutError(f"TensorBoard at {url} had not served {len(missing)} tags to their last step after "
                       f"{timeout_s:.0f} s (e.g. {next(iter(missing))})")


def screenshot(chromium: str, url: str, path: Path, width: int, height: int, budget_ms: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tb-chromium-") as profile:
        command = [
            chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
            f"--virtual-time-budget={budget_ms}", f"--screenshot={path}", url,
        ]
        subprocess.run(command, check=True, capture_output=True, timeout=max(60, budget_ms // 1000 * 4))
    if not path.exists() or path.stat().st_size == 0:
        raise RuntimeError(f"Chromium wrote no screenshot to {path}")


PLAYWRIGHT_SCRIPT = r"""
import { chromium } from "playwright-core";
const [view, executable, url, out, width, height, ...flags] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: executable, args: flags });
const page = await browser.newPage({ viewport: { width: Number(width), height: Number(height) } });
await page.goto(url);
if (view === "images") {
  await page.waitForSelector("img", { timeout: 60000 });
  await page.waitForTimeout(4000);
} else if (view === "custom_scalars") {
  await page.waitForSelector("tf-custom-scalar-multi-line-chart-card", { timeout: 60000 });
  await page.waitForTimeout(8000);
} else {
  await page.waitForSelector('button[aria-label="More line chart options"]', { timeout: 60000 });
  await page.waitForTimeout(8000);  // the cards' data requests and their WebGL lines
}
await page.screenshot({ path: out });
await browser.close();
"""


def playwright_screenshot(
    view: str, node_modules: Path, chromium: str, url: str, path: Path, width: int, height: int
) -> None:
    """``view`` ("opening", "images" or "custom_scalars") rendered by Chromium under playwright-core,
    which waits for the page's charts."""
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("--playwright needs node (apt-get install nodejs)")
    with tempfile.TemporaryDirectory(prefix="tb-playwright-") as tmp:
        script = Path(tmp, "screenshot.mjs")
        script.write_text(PLAYWRIGHT_SCRIPT)
        (Path(tmp) / "node_modules").symlink_to(node_modules.resolve())  # ESM resolves from the script's folder
        # playwright starts chromium headless with a fresh temporary profile of its own
        flags = [f for f in CHROMIUM_FLAGS if f != "--headless"]
        done = subprocess.run([node, str(script), view, chromium, url, str(path), str(width), str(height), *flags],
                              capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"the {view} screenshot failed:\n{done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logdir", type=Path, help="TensorBoard log directory (e.g. lightning_logs)")
    parser.add_argument("outdir", type=Path, help="where the PNGs go")
    parser.add_argument("--prefix", default="tensorboard_", help="file name prefix (default: tensorboard_)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--budget-ms", type=int, default=20000, help="virtual time for the page to render")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="how long to wait for TensorBoard")
    parser.add_argument("--playwright", type=Path, default=None,
                        help="a node_modules folder with playwright-core: drive Chromium with it (waits for the "
                             "charts) and also save the Custom Scalars view")
    args = parser.parse_args(argv)
    if not args.chromium:
        parser.error("no chromium found: apt-get install chromium, or pass --chromium PATH")
    if not args.logdir.is_dir():
        parser.error(f"{args.logdir} is not a directory")
    args.outdir.mkdir(parents=True, exist_ok=True)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(args.logdir), "--host", "127.0.0.1",
         "--port", str(port), "--load_fast", "false", "--reload_interval", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        runs = wait_for_runs(url, args.timeout_s)
        wait_until_loaded(url, last_steps(args.logdir), args.timeout_s)
        print(f"TensorBoard {url}: runs {runs}")
        views = dict(VIEWS, custom_scalars="#custom_scalars") if args.playwright is not None else VIEWS
        for view, fragment in views.items():
            path = (args.outdir / f"{args.prefix}{view}.png").resolve()
            if args.playwright is not None:
                playwright_screenshot(view, args.playwright, args.chromium, f"{url}/{fragment}", path,
                                      args.width, args.height)
            else:
                screenshot(args.chromium, f"{url}/{fragment}", path, args.width, args.height, args.budget_ms)
            print(f"wrote {path}")
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
