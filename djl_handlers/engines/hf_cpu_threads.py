"""Fewer torch threads while other processes hold this process's cores (``option.cpu_threads``).

A decode step on the CPU is ~250 short parallel operations, each ending at an OpenMP barrier. When
every thread has a core the threads meet at the barrier within microseconds; when another process
runs on one of the cores, the descheduled thread stalls its partner at every barrier and 2 threads
are slower than 1 (docs/benchmarks.md, section 11: a bf16 decode step at 32 rows took 86-95 ms with 2
threads against 77-87 ms with 1 while one busy process shared the 2 cores; 56 against 77 ms without it).

:class:`ThreadGovernor` watches how many cores the steps actually get: the process's CPU seconds over
the steps' wall seconds, per window of about a second of steps (time between steps does not count).
Threads that get less than half a core each are not running in parallel, so the count is halved; every
``probe_s`` seconds (doubling up to ``max_probe_s`` while probes keep failing) it tries twice as many
again for one window and keeps them if they are used. It never goes above the count it started with.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["ThreadGovernor", "used_enough"]

LOG = logging.getLogger(__name__)


def used_enough(threads: int) -> float:
    """The cores ``threads`` threads must get to be kept: more than half a core each (2 threads:
    1.25 cores; a decode step with 2 threads on free cores gets 1.4-1.6, with a busy neighbour ~1.0)."""
    return threads / 2 + 0.25


class ThreadGovernor:
    """Adapt the torch thread count to the cores the steps get. Call :meth:`start` before a step and
    :meth:`finish` with its result after; both are cheap (two clock reads)."""

    def __init__(self, most: int, *, window_s: float = 1.0, probe_s: float = 8.0, max_probe_s: float = 64.0,
                 set_threads: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.process_time) -> None:
        if most < 1:
            raise ValueError(f"most={most} must be at least 1")
        self.most = most
        self.threads = most
        self.window_s = window_s
        self.probe_s = probe_s
        self.max_probe_s = max_probe_s
        self._set = set_threads if set_threads is not None else _torch_set_threads
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._wall = 0.0
        self._cpu = 0.0
        self._before_probe: int | None = None  # the count to go back to when the current probe fails
        self._wait = probe_s
        self._next_probe = 0.0
        self.changes = 0

    def start(self) -> tuple[float, float]:
        """The clocks before a step."""
        return self._clock(), self._cpu_clock()

    def finish(self, started: tuple[float, float]) -> None:
        """Account one step (``started`` from :meth:`start`); at the end of a window, judge it."""
        now = self._clock()
        self._wall += now - started[0]
        self._cpu += self._cpu_clock() - started[1]
        if self._wall < self.window_s:
            return
        cores = self._cpu / self._wall
        self._wall = self._cpu = 0.0
        self._judge(cores, now)

    def _judge(self, cores: float, now: float) -> None:
        if self._before_probe is not None:  # this window ran with the probed count
            if cores >= used_enough(self.threads):
                LOG.debug("cpu_threads: %d threads get %.2f cores; kept", self.threads, cores)
                self._before_probe = None
                self._wait = self.probe_s
            else:
                back, self._before_probe = self._before_probe, None
                self._wait = min(self._wait * 2, self.max_probe_s)
                self._next_probe = now + self._wait
                self._apply(back, f"the probe got {cores:.2f} cores")
            return
        if self.threads > 1 and cores < used_enough(self.threads):
            self._wait = self.probe_s
            self._next_probe = now + self._wait
            self._apply(max(1, self.threads // 2),
                        f"{self.threads} threads got {cores:.2f} cores: other processes share them")
        elif self.threads < self.most and now >= self._next_probe:
            self._before_probe = self.threads
            self._apply(min(self.most, self.threads * 2), "probing whether the cores are free again")

    def _apply(self, threads: int, why: str) -> None:
        level = logging.INFO if self.changes == 0 else logging.DEBUG
        LOG.log(level, "cpu_threads: %d -> %d torch threads (%s)", self.threads, threads, why)
        self.threads = threads
        self.changes += 1
        self._set(threads)


def _torch_set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
