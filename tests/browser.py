"""Rendering roofline's HTML pages in a real headless Chromium, for the tests marked `browser`."""

import shutil
import subprocess

import pytest


def chromium() -> str:
    found = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if found is None:
        pytest.fail("no Chromium to render the HTML report: install Debian's `chromium` (scripts/setup does where "
                    "apt can)")
    return found


def dom(url: str) -> tuple[str, str]:
    """The page's DOM after its script ran, and Chromium's log."""
    done = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr
