"""How `agentstream` processes run: the command line that starts a child process by module name
(`python_module_argv`, the one place the product writes `python -m`), and the process-wide settings
of the cyclic garbage collector.

CPython collects its youngest generation every 700 net allocations of container objects, and every
so often the whole heap. The stack's processes allocate a few containers per event (decoded events,
rows, states) and hold large heaps (faust, aiokafka, pydantic schemas, state caches), so with the
defaults a stream role spent about a quarter of its pure batch logic in the collector (the scoring
role's batch logic over 12,000 steps with 2 KB observations: 166-172 µs per step with the defaults,
113-116 with the thresholds below, 104-131 with the collector off). Reference counting frees nearly
everything anyway; the collector is only for cycles, which these processes rarely make.

`tune_gc` freezes what is loaded at start (modules, parsers: never garbage, so never scanned again)
and raises the thresholds. `AGENTSTREAM_GC_THRESHOLDS` overrides them ("700,10,10" is CPython's
default; "0" turns the collector off).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from infra.errors import InfraError

GC_THRESHOLDS = (50_000, 20, 10)
PYTHON_DEFAULT = (700, 10, 10)  # CPython 3.11's
ENV = "AGENTSTREAM_GC_THRESHOLDS"
CLI_MODULE = "infra.cli"  # `python -m infra.cli` is `agentstream` (pyproject.toml's console script)


def python_module_argv(module: str, *args: str) -> list[str]:
    """The command line that runs `python -m module args...` with this interpreter (the venv the
    parent runs in, whether or not the `agentstream` script is on PATH).

    >>> python_module_argv("infra.cli", "broker", "--port", "0")[1:]
    ['-m', 'infra.cli', 'broker', '--port', '0']
    """
    return [sys.executable, "-m", module, *args]


def agentstream_argv(*args: str) -> list[str]:
    """`agentstream args...` as a child process of this interpreter."""
    return python_module_argv(CLI_MODULE, *args)


def stop_child(popen: subprocess.Popen, grace_s: float = 10.0) -> int:
    """Stop our own child by its PID: SIGTERM, SIGKILL when it has not exited after `grace_s`;
    returns its exit code."""
    popen.terminate()
    try:
        return popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        return popen.wait(timeout=10)


def gc_thresholds(value: str | None) -> tuple[int, ...]:
    """The thresholds `value` names (None or empty: `GC_THRESHOLDS`).

    >>> gc_thresholds(None), gc_thresholds("700,10,10"), gc_thresholds("0")
    ((50000, 20, 10), (700, 10, 10), (0,))
    """
    if not value or not value.strip():
        return GC_THRESHOLDS
    try:
        numbers = tuple(int(part) for part in value.split(","))
    except ValueError:
        numbers = ()
    if not 1 <= len(numbers) <= 3 or any(n < 0 for n in numbers):
        raise InfraError(f"{ENV}: {value!r} is not 1 to 3 comma-separated non-negative integers")
    return numbers


def tune_gc(environ=os.environ) -> tuple[int, ...]:
    """Freeze the objects loaded so far and set the collector's thresholds; returns them."""
    thresholds = gc_thresholds(environ.get(ENV))
    gc.freeze()
    gc.set_threshold(*thresholds)
    return thresholds


@contextmanager
def default_gc() -> Iterator[None]:
    """CPython's default thresholds inside the block (a benchmark of code that runs in the user's
    process, such as the SDK, measures it as it runs there); the previous ones after."""
    before = gc.get_threshold()
    gc.set_threshold(*PYTHON_DEFAULT)
    try:
        yield
    finally:
        gc.set_threshold(*before)
