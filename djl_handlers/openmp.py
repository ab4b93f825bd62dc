"""How a worker process's idle OpenMP threads wait: a short spin, then sleep.

``djl-handlers serve`` puts :data:`OPENMP_SPIN_COUNT` into its worker's environment
(:func:`openmp_defaults`). Under DJL Serving's own front end the worker inherits the JVM's environment,
where nothing sets it, so the service applies the same default in its own process on the first call
(:func:`in_process_defaults`), which works while GNU libgomp (torch's OpenMP runtime) is not loaded
yet: libgomp reads ``GOMP_SPINCOUNT`` once, when it loads, and our entry-point modules import no engine
library until that call. A user's ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` always wins.

libgomp spins only 100 times (not ``GOMP_SPINCOUNT``) while it manages more threads than the process
has CPUs, and it counts every thread pool: the loading thread's (its idle partner threads stay alive)
and, in async mode, the engine loop thread's, on which the steps run. With 2 CPUs that is 3 threads:
a decode step kept 1.65 of the 2 cores busy, against 1.97 for the same loop on the loading thread
(0.93x the tok/s). :func:`release_thread_pool` frees the calling thread's pool (OpenMP 5.0's
``omp_pause_resource_all``), so the engine thread's pool is the only one left.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

__all__ = ["OPENMP_SPIN_COUNT", "in_process_defaults", "libgomp_loaded", "libgomp_paths", "openmp_defaults",
           "release_thread_pool"]

#: How long an idle OpenMP thread spins before it sleeps (GNU libgomp's unit: 1,000 is ~10-20 µs here).
#: libgomp's default (300,000) made 2 torch threads 5-8x slower than 1 on a loaded 2-core box; sleeping at
#: once (``OMP_WAIT_POLICY=PASSIVE``) wakes the partner thread late at every barrier, which made 2 threads
#: no faster than 1 for a decode step. 20,000 covers the gaps between a decode step's parallel regions
#: (the Python between them): 1.08-1.10x the engine's tok/s of 1,000 on free cores, where 1,000 left
#: the second core idle 16 % of a decode step; with another process on a core the HF engine drops to
#: one thread and both counts serve alike (0.97x) (docs/benchmarks.md, "What the defaults rest on").
OPENMP_SPIN_COUNT = "20000"
USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # either one: the user chose how threads wait
OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: free the threads, keep the runtime usable (they return on demand)


def openmp_defaults(env: MutableMapping[str, str]) -> None:
    """Set the OpenMP waiting in ``env`` unless the user chose it (:data:`USER_KEYS`). Must reach the
    process before libgomp loads (torch's import loads it)."""
    if not any(key in env for key in USER_KEYS):
        env["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT


def libgomp_paths(maps: Path = Path("/proc/self/maps")) -> list[str] | None:
    """The files of every GNU libgomp mapped into this process (torch's; a wheel may bundle another,
    e.g. sentencepiece's), in the order first mapped; None where ``/proc`` is missing."""
    try:
        lines = maps.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found: list[str] = []
    for line in lines:
        path = line.split()[-1] if line.split() else ""
        if "libgomp" in Path(path).name and path not in found:
            found.append(path)
    return found


def release_thread_pool(maps: Path = Path("/proc/self/maps")) -> int:
    """Free the calling thread's OpenMP thread pool in every libgomp loaded (``omp_pause_resource_all
    (omp_pause_soft)``): call it on the thread that loaded the model, outside any parallel region,
    before another thread takes over the steps. A later parallel region on this thread builds its pool
    again. How many libgomp copies released one (0 where none could: no ``/proc``, a libgomp older than
    OpenMP 5.0)."""
    released = 0
    for path in libgomp_paths(maps) or []:
        try:
            pause = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
        released += pause(OMP_PAUSE_SOFT) == 0
    return released


def libgomp_loaded(maps: Path = Path("/proc/self/maps")) -> bool:
    """Whether GNU libgomp is mapped into this process already (then it has read its environment).
    Where ``/proc`` is missing, torch's import stands for it."""
    paths = libgomp_paths(maps)
    return "torch" in sys.modules if paths is None else bool(paths)


def in_process_defaults(env: MutableMapping[str, str] | None = None, maps: Path = Path("/proc/self/maps")) -> str:
    """Apply :func:`openmp_defaults` to this process's environment while libgomp has not loaded; one
    line saying what happened, for the load log."""
    env = os.environ if env is None else env
    chosen = [f"{key}={env[key]}" for key in USER_KEYS if key in env]
    if chosen:
        return f"OpenMP waiting: {', '.join(chosen)} (the environment's)"
    if libgomp_loaded(maps):
        return (f"OpenMP waiting: libgomp's default (it loaded before the service, e.g. from model.py); set "
                f"GOMP_SPINCOUNT={OPENMP_SPIN_COUNT} in the server's environment for the worker's default")
    openmp_defaults(env)
    return f"OpenMP waiting: GOMP_SPINCOUNT={OPENMP_SPIN_COUNT} (the worker's default, set before torch loads)"
