"""How many threads torch computes with on a CPU: the cores this process may actually use (its CPU
affinity, capped by a cgroup v2 CPU quota) less the work already running on them, at least one.

OpenMP threads wait for each other at every operation's end; a thread that shares its core with
another busy process stalls all of them while its siblings spin. Measured on a 2-core machine
(issue 32): the default command at a load of 2-3 took 296 s with torch's default two threads and
84 s with one, identical outputs; vLLM's CPU build drops to one thread for the same reason.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" in microseconds, or "max <period>"


def available_cores(cpu_max: Path = CPU_MAX) -> int:
    """The CPUs this process may run on, capped by its cgroup's CPU quota (whole cores, at least one)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota == "max":
            return cores
        return max(1, min(cores, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):  # no cgroup v2 file (another OS, cgroup v1): the affinity alone
        return cores


def auto_threads(cores: int, load: float) -> int:
    """Threads for `cores` whose runnable work already averages `load`: only the cores left free. Whole
    cores only: the 1-minute average still holds a finished job's tail and this process's own start
    (imports, the part check), which are no busy neighbour (at 0.57 on a quiet 2-core machine, rounding
    gave one thread)."""
    return max(1, min(cores, cores - math.floor(load)))


def choose(requested: int) -> tuple[int, str]:
    """(threads, why): `requested` when set (> 0), else the user's OMP_NUM_THREADS, else the cores free
    now (1-minute load average)."""
    if requested:
        return requested, "backend.threads"
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    cores, load = available_cores(), os.getloadavg()[0]
    return auto_threads(cores, load), f"{cores} available cores at load {load:.2f}"
