"""How many threads torch computes with on a CPU: the cores this process may actually use (its CPU
affinity, capped by a cgroup v2 CPU quota) less the work already running on them, at least one.

OpenMP threads wait for each other at every operation's end; a thread that shares its core with
another busy process stalls all of them while its siblings spin. Measured on a 2-core machine
(issue 32): the default command at a load of 2-3 took 296 s with torch's default two threads and
84 s with one, identical outputs; vLLM's CPU build drops to one thread for the same reason.

A neighbour that starts after the model loads stalls a count chosen then just as much (issue 32: the
large peer grid's first call took 385 s with two threads beside a one-core job, 70 s on the quiet
machine), so an automatic count is chosen again while the engine computes (`Adaptive`), from the
CPU time the allowed cores spent on other processes since the last look. Results do not depend on it:
torch's CPU kernels split work across threads, not the sums within one output.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" in microseconds, or "max <period>"
PROC_STAT = Path("/proc/stat")  # per CPU: jiffies spent in user, nice, system, idle, iowait, irq, softirq, steal, ...


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


CONFIG, OMP = "backend.threads", "OMP_NUM_THREADS"  # `choose`'s reasons for a count the user set


def choose(requested: int) -> tuple[int, str]:
    """(threads, why): `requested` when set (> 0), else the user's OMP_NUM_THREADS, else the cores free
    now (1-minute load average)."""
    if requested:
        return requested, CONFIG
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"]), OMP
    cores, load = available_cores(), os.getloadavg()[0]
    return auto_threads(cores, load), f"{cores} available cores at load {load:.2f}"


def busy_seconds(cpus: set[int], stat: Path = PROC_STAT) -> float | None:
    """CPU seconds the given CPUs have spent on anything but idling since boot (stolen time included:
    a host that takes the core stalls OpenMP's threads as a neighbour does); None where the file is missing."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(f) for f in fields[:8]]
            busy += sum(ticks) - ticks[3] - ticks[4]  # less idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def threads_beside(cores: int, cpus: int, others: float) -> int:
    """Threads for a process that may use `cores` of `cpus` CPUs on which other processes keep `others`
    cores busy: the CPUs they leave, within `cores`, at least one. A neighbour at half a core or more
    holds its core: three threads on two cores give it about two thirds of one."""
    return max(1, min(cores, cpus - math.floor(others + 0.5)))


class Adaptive:
    """Calls (cheap: a clock read) between forward passes re-choose torch's thread count at most every
    `every_s` seconds, from the other processes' share of the allowed CPUs over that time
    (`threads_beside`)."""

    def __init__(self, threads: int, every_s: float = 2.0, stat: Path = PROC_STAT):
        self.threads, self.every_s, self.stat = threads, every_s, stat
        self.used = {threads}  # every count it has run with: the manifest says these, not the count at load alone
        self.cpus, self.cores = os.sched_getaffinity(0), available_cores()
        self._mark = self._sample()

    def _sample(self) -> tuple[float, float | None, float]:
        return time.monotonic(), busy_seconds(self.cpus, self.stat), time.process_time()

    def __call__(self) -> None:
        wall, busy, own = self._mark
        if time.monotonic() - wall < self.every_s:
            return
        self._mark = now = self._sample()
        if busy is None or now[1] is None:
            return
        # this process's CPU time (all its threads, spinning ones too) is the part of the busy time that is ours
        others = max(0.0, (now[1] - busy) - (now[2] - own)) / (now[0] - wall)
        threads = threads_beside(self.cores, len(self.cpus), others)
        if threads != self.threads:
            import torch

            torch.set_num_threads(threads)
            self.threads = threads
            self.used.add(threads)
