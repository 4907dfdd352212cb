"""A real headless Chromium for the console's browser tests: Debian's `/usr/bin/chromium` (installed
by `make browser`) driven through Playwright. Nothing is downloaded at run time: Playwright's own
browser builds are never used, and a missing chromium fails the test with the command that installs
it (these tests are on the core path and must not skip).

The browser runs under Playwright's driver, a child of the test process. Closing stops both; any
process of that tree still alive after a grace period is killed by PID (by what we started, never
by name).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.processes import descendants, hard_kill, pid_gone

CHROMIUM = Path("/usr/bin/chromium")
# Headless, offline, no first-run or update work: the browser talks to 127.0.0.1 and nothing else.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
)
CLOSE_GRACE_S = 5.0


def chromium_path() -> Path:
    """Debian's chromium, or a test failure that says how to install it."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the console's browser tests drive Debian's chromium. "
            "Install it with `make browser` (apt-get install chromium); `make test` does this first.",
            pytrace=False,
        )
    return CHROMIUM


@contextmanager
def chromium() -> Iterator:
    """A launched headless Chromium (a Playwright `Browser`); everything it started is stopped on exit."""
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    before = set(descendants(os.getpid()))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(executable), args=list(CHROMIUM_ARGS), headless=True
        )
        started = _playwright_tree(before)
        try:
            yield browser
        finally:
            started |= _playwright_tree(before)
            browser.close()
    _reap(started)


def _playwright_tree(before: set[int]) -> set[int]:
    """The driver processes this launch added below the test process, and everything under them."""
    out: set[int] = set()
    for pid in set(descendants(os.getpid())) - before:
        if _is_playwright_driver(pid):
            out |= {pid, *descendants(pid)}
    return out


def _is_playwright_driver(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"playwright" in cmdline and _ppid(pid) == os.getpid()


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _reap(pids: set[int]) -> None:
    deadline = time.monotonic() + CLOSE_GRACE_S
    while time.monotonic() < deadline and not all(pid_gone(p) for p in pids):
        time.sleep(0.1)
    hard_kill(p for p in pids if not pid_gone(p))
