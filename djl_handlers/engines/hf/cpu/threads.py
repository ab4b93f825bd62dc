"""Fewer torch threads while other processes hold this process's cores (``option.cpu_threads``).

A decode step on the CPU is ~250 short parallel operations, each ending at an OpenMP barrier. When
every thread has a core the threads meet at the barrier within microseconds; when another process
runs on one of the cores, the descheduled thread stalls its partner at every barrier and 2 threads
are slower than 1 (measured on this project's 2-core box: a bf16 decode step at 32 rows took 86-95 ms with 2
threads against 77-87 ms with 1 while one busy process shared the 2 cores; 56 against 77 ms without it).

:class:`ThreadGovernor` asks the kernel: the time this process's threads spent runnable but waiting
for a CPU (``/proc/self/task/*/schedstat``, second field), per second of steps, over windows of about a
second of steps. On free cores that is under 1 % (0.006-0.008 s per s measured); with a busy process
on one of the 2 cores and 2 threads it was 0.65; serving a burst, with the HTTP front end and the
clients on the same 2 cores, it touched 0.25 for a window. After :data:`BAD_WINDOWS` windows in a row
above :data:`WAITING` the count is halved; every
``probe_s`` seconds (doubling up to ``max_probe_s`` while probes keep failing) twice as many are tried
for one window and kept if they do not wait. It never goes above the count it started with. (A first
version compared CPU seconds with wall seconds; small batches use 2 threads poorly on free cores too,
so it dropped to 1 thread at the wrong times.)

Waiting alone cannot tell one busy neighbour from a crowd. With one busy process on 2 cores, 2
threads get about one core (0.97-0.99 measured), as 1 thread does, and stall at every barrier: fewer
threads win. When many runnable threads share the cores (a load average of 9 on 2 cores, measured
while serving), the scheduler gives each thread its share, so 1 thread gets half the CPU that 2 get:
halving then halved the engine's throughput against a neighbour that kept 2. And between the two,
a front end, a client and a neighbour now and then on the same cores make 2 threads wait while they
still get far more CPU than 1: at a load average of 2-4, a ~1 B model served 38.7 tok/s on 2 fixed
threads and 24.6 with the halving rule alone. So the CPU seconds the process got per second of
steps (cores obtained) also count: a window is bad only when its threads waited *and* obtained less
than :data:`HALVE_BELOW` times the cores half of them could use (2 threads: 1.25 cores; one busy
neighbour leaves them 0.97-0.99); after a halving, and in a probe, the larger count is kept when it
obtained at least :data:`GAIN` times the cores of the smaller one, and halving is then held off for
the probe interval (doubling up to ``max_probe_s`` while the crowd stays).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

__all__ = ["GAIN", "HALVE_BELOW", "WAITING", "ThreadGovernor", "run_queue_seconds"]

LOG = logging.getLogger(__name__)

#: Seconds waited for a CPU per second of steps above which the threads are too many.
WAITING = 0.4
#: Windows in a row above :data:`WAITING` before the count is halved (a burst of the front end's or
#: the clients' work on the same cores is not a neighbour that stays: at 0.25 s/s and one window, a
#: served benchmark round ran on 1 thread at 0.6x the speed of the rounds around it).
BAD_WINDOWS = 2
#: Cores obtained with more threads, over those obtained with half as many, above which the larger
#: count is kept although its threads wait (a crowd of runnable threads shares the cores: each thread
#: gets its share). One busy neighbour on 2 cores: about 1.0 (no gain); a crowd: close to 2.
GAIN = 1.4
#: A window counts as bad only when its threads also obtained less than this many times the cores half
#: of them could use: 2 threads that get 1.25 cores or more bring more than 1 thread can, however long
#: they wait.
HALVE_BELOW = 1.25


def run_queue_seconds() -> float | None:
    """Seconds this process's threads have spent runnable but not running (``schedstat``); ``None``
    where the kernel does not report it."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat", encoding="ascii") as handle:
                total += int(handle.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return total / 1e9


class ThreadGovernor:
    """Adapt the torch thread count to the cores the steps get. Call :meth:`start` before a step and
    :meth:`finish` with its result after: one clock read each, plus ``waited()`` once per window."""

    def __init__(self, most: int, *, window_s: float = 1.0, probe_s: float = 8.0, max_probe_s: float = 64.0,
                 set_threads: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 waited: Callable[[], float | None] = run_queue_seconds,
                 cpu: Callable[[], float] = time.process_time) -> None:
        if most < 1:
            raise ValueError(f"most={most} must be at least 1")
        self.most = most
        self.threads = most
        self.window_s = window_s
        self.probe_s = probe_s
        self.max_probe_s = max_probe_s
        self._set = set_threads if set_threads is not None else _torch_set_threads
        self._clock = clock
        self._waited = waited
        self._cpu = cpu
        self._wall = 0.0
        self._waited_at: float | None = None  # run-queue seconds at the window's start
        self._cpu_at = 0.0  # the process's CPU seconds at the window's start
        self._halved_from: tuple[int, float] | None = None  # (threads, cores obtained) before the last halving
        self._hold_until = 0.0  # no halving before this time: more threads were found to get more CPU
        self._before_probe: int | None = None  # the count to go back to when the current probe fails
        self._wait = probe_s
        self._next_probe = 0.0
        self._bad = 0  # windows in a row above WAITING
        self._before_cores = 0.0  # cores obtained in the window before the current probe
        self._hold = probe_s  # the next hold-off after more threads were found to get more CPU
        self.changes = 0

    def start(self) -> float:
        """The clock before a step (and the run-queue time, at a window's first step)."""
        if self._waited_at is None:
            self._waited_at = self._waited()
            self._cpu_at = self._cpu()
        return self._clock()

    def finish(self, started: float) -> None:
        """Account one step (``started`` from :meth:`start`); at the end of a window, judge it."""
        now = self._clock()
        self._wall += now - started
        if self._wall < self.window_s:
            return
        waited, before = self._waited(), self._waited_at
        cores = (self._cpu() - self._cpu_at) / self._wall
        wall, self._wall, self._waited_at = self._wall, 0.0, None
        if waited is None or before is None:
            return
        self._judge((waited - before) / wall, now, cores)

    def _judge(self, waiting: float, now: float, cores: float = 0.0) -> None:
        """``waiting``: seconds the threads waited for a CPU per second of steps in the window;
        ``cores``: CPU seconds the process got per second of steps in it."""
        if self._halved_from is not None:  # the first window after a halving: did the threads bring CPU?
            (more, had), self._halved_from = self._halved_from, None
            if had >= GAIN * cores:
                self._crowded(now)
                self._apply(more, f"{more} threads got {had:.2f} cores against {cores:.2f} with {self.threads}: "
                                  "many processes share the cores, more threads get a larger share")
                return
        if self._before_probe is not None:  # this window ran with the probed count
            smaller, self._before_cores = self._before_cores, 0.0
            if waiting <= WAITING or cores >= GAIN * smaller:
                LOG.debug("cpu_threads: %d threads waited %.2f s/s for a CPU and got %.2f cores; kept",
                          self.threads, waiting, cores)
                self._before_probe = None
                if waiting > WAITING:
                    self._crowded(now)
                else:
                    self._wait = self._hold = self.probe_s
            else:
                back, self._before_probe = self._before_probe, None
                self._wait = min(self._wait * 2, self.max_probe_s)
                self._next_probe = now + self._wait
                self._apply(back, f"the probe waited {waiting:.2f} s/s for a CPU")
            return
        starved = cores < HALVE_BELOW * max(1, self.threads // 2)
        self._bad = self._bad + 1 if waiting > WAITING and starved else 0
        if self.threads > 1 and self._bad >= BAD_WINDOWS and now >= self._hold_until:
            self._bad = 0
            self._wait = self.probe_s
            self._next_probe = now + self._wait
            self._halved_from = (self.threads, cores)
            self._apply(max(1, self.threads // 2),
                        f"{self.threads} threads waited {waiting:.2f} s/s for a CPU: other processes hold the cores")
        elif self.threads < self.most and now >= self._next_probe:
            self._before_probe, self._before_cores = self.threads, cores
            self._apply(min(self.most, self.threads * 2), "probing whether the cores are free again")

    def _crowded(self, now: float) -> None:
        """More threads got more CPU although they wait: keep them, and do not halve again before the
        probe interval, which doubles (up to ``max_probe_s``) each time this is found again."""
        self._hold_until = now + self._hold
        self._hold = min(self._hold * 2, self.max_probe_s)

    def _apply(self, threads: int, why: str) -> None:
        level = logging.INFO if self.changes == 0 else logging.DEBUG
        LOG.log(level, "cpu_threads: %d -> %d torch threads (%s)", self.threads, threads, why)
        self.threads = threads
        self.changes += 1
        self._set(threads)


def _torch_set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
