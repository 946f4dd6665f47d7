"""What this machine offers: cores and memory (psutil)."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

import psutil


def default_threads() -> int:
    """Physical cores: llama.cpp decoding is memory-bound and gains nothing from SMT siblings."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


BUSY_CORE = 0.6  # another process using this much of a core or more takes the core


def threads_for(load: MachineLoad) -> int:
    """The physical cores other processes leave free, at least one. llama.cpp's threads
    wait for one another at every layer, so one thread that shares its core with another
    busy process slows them all (with a CPU hog on one of two cores, one thread decodes
    about twice as fast as two: docs/benchmarks.md)."""
    physical = default_threads()
    busy = load.others_share * physical  # in physical cores
    return max(1, physical - int(busy + 1 - BUSY_CORE))


def choose_threads(window_s: float = 0.25) -> tuple[int, MachineLoad]:
    """Threads for a model about to load, from what the machine is doing now."""
    load = machine_load(window_s)
    return threads_for(load), load


def available_memory() -> int:
    return int(psutil.virtual_memory().available)


BUSY_SHARE = 0.15  # other processes using more than this share of all cores: busy


@dataclass(frozen=True)
class MachineLoad:
    """What else the machine is doing, measured over a short window before timing starts."""

    load_average: float  # 1-minute load average (0 where the OS has none)
    cores: int
    others_share: float  # CPU used by other processes, as a share of all logical cores
    top: tuple[tuple[str, int, float], ...]  # (name, pid, % of one core), the busiest others

    @property
    def busy(self) -> bool:
        return self.others_share > BUSY_SHARE

    def describe(self) -> str:
        state = "busy" if self.busy else "quiet"
        text = (
            f"machine {state}: other processes use {100 * self.others_share:.0f}% of its "
            f"{self.cores} cores (load average {self.load_average:.2f})"
        )
        if self.busy and self.top:
            text += "; busiest: " + ", ".join(f"{n} ({pid}) {pct:.0f}%" for n, pid, pct in self.top)
        if self.busy:
            text += " - timings will be noisy; repeats and noise checks are on"
        return text

    def to_dict(self) -> dict[str, object]:
        return {
            "busy": self.busy,
            "load_average": round(self.load_average, 2),
            "others_share": round(self.others_share, 3),
            "busiest": [{"name": n, "pid": pid, "cpu_percent": pct} for n, pid, pct in self.top],
        }


def machine_load(window_s: float = 0.5) -> MachineLoad:
    """Sample every other process's CPU time over ``window_s`` (psutil), while this process
    waits, so the figure is what competes with the measurements about to start."""
    me = os.getpid()
    procs = []
    for p in psutil.process_iter(["name"]):
        if p.pid != me:
            with contextlib.suppress(psutil.Error):
                p.cpu_percent(None)  # the first call starts the window
                procs.append(p)
    time.sleep(window_s)
    usage = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            usage.append((p.info["name"] or "?", p.pid, p.cpu_percent(None)))
    cores = psutil.cpu_count() or 1
    busiest = tuple(sorted((u for u in usage if u[2] >= 5), key=lambda u: -u[2])[:3])
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return MachineLoad(load, cores, sum(u[2] for u in usage) / (100 * cores), busiest)
