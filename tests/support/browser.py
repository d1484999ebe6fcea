"""A real headless browser for tests of the HTML report: Chromium, driven from the command line.

`dump_dom` loads a page (a file, with an optional #fragment) and returns the DOM after its
scripts ran; `screenshot` writes a PNG. Tests that need it use `needs_chromium`, which skips
with the reason when no Chromium binary is installed (Debian: `apt-get install chromium`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome", "headless_shell")


def chromium_binary() -> str | None:
    """The Chromium (or Chrome) executable on PATH, or $BATCHRUN_CHROMIUM, or None."""
    given = os.environ.get("BATCHRUN_CHROMIUM")
    if given:
        return given
    return next((path for name in _NAMES if (path := shutil.which(name))), None)


needs_chromium = pytest.mark.skipif(chromium_binary() is None,
                                    reason="no Chromium binary on PATH (apt-get install chromium, "
                                           "or set BATCHRUN_CHROMIUM)")


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    binary = chromium_binary()
    if binary is None:
        raise RuntimeError("no Chromium binary")
    with tempfile.TemporaryDirectory(prefix="batchrun-chromium-") as profile:
        # --no-sandbox: tests may run as root in a container; a fresh profile keeps runs independent.
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   "--no-first-run", f"--user-data-dir={profile}", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=True)


def page_url(path: Path, fragment: str = "") -> str:
    return path.resolve().as_uri() + (f"#{fragment}" if fragment else "")


def dump_dom(path: Path, fragment: str = "", *, budget_ms: int = 5000, timeout_s: float = 120) -> str:
    """The page's DOM after its scripts ran (up to ``budget_ms`` of virtual time)."""
    result = _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", page_url(path, fragment)], timeout_s)
    return result.stdout


def screenshot(path: Path, output: Path, fragment: str = "", *, size: tuple[int, int] = (1280, 900),
               budget_ms: int = 5000, timeout_s: float = 120) -> Path:
    """A PNG of the page's first ``size`` pixels, written to ``output``."""
    _run([f"--virtual-time-budget={budget_ms}", f"--window-size={size[0]},{size[1]}",
          f"--screenshot={output.resolve()}", page_url(path, fragment)], timeout_s)
    return output
