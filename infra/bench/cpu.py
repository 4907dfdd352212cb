"""CPU time from the processes' own accounting (Linux `/proc/<pid>/stat`: user + system time of all
the process's threads). On a shared machine this is the stable figure: wall-clock throughput moves
with the neighbours, the CPU a process spends on a unit of work hardly does."""

from __future__ import annotations

import os

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds `pid` has used so far; None when it is gone or there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) ": field 3 onwards
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime (fields 14, 15)


def snapshot(pids: dict[str, int]) -> dict[str, tuple[int, float]]:
    """name -> (pid, CPU seconds) for every process still running."""
    out = {}
    for name, pid in pids.items():
        cpu = process_cpu_s(pid)
        if cpu is not None:
            out[name] = (pid, cpu)
    return out


def per_thousand(
    before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]], units: int
) -> dict[str, float | None]:
    """CPU seconds per 1,000 units of work per process between two snapshots; None for a process that
    was restarted (another PID) or not running at both ends."""
    out: dict[str, float | None] = {}
    for name in sorted(set(before) | set(after)):
        b, a = before.get(name), after.get(name)
        ok = b is not None and a is not None and a[0] == b[0] and units > 0
        out[name] = round((a[1] - b[1]) * 1000 / units, 4) if ok else None
    return out
