"""How a worker process's idle OpenMP threads wait: a short spin, then sleep.

``djl-handlers serve`` puts :data:`OPENMP_SPIN_COUNT` into its worker's environment
(:func:`openmp_defaults`). Under DJL Serving's own front end the worker inherits the JVM's environment,
where nothing sets it, so the service applies the same default in its own process on the first call
(:func:`in_process_defaults`), which works while GNU libgomp (torch's OpenMP runtime) is not loaded
yet: libgomp reads ``GOMP_SPINCOUNT`` once, when it loads, and our entry-point modules import no engine
library until that call. A user's ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` always wins.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

__all__ = ["OPENMP_SPIN_COUNT", "in_process_defaults", "libgomp_loaded", "openmp_defaults"]

#: How long an idle OpenMP thread spins before it sleeps (GNU libgomp's unit: 1,000 is ~10-20 µs here).
#: libgomp's default (300,000) made 2 torch threads 5-8x slower than 1 on a loaded 2-core box; sleeping at
#: once (``OMP_WAIT_POLICY=PASSIVE``) wakes the partner thread late at every barrier, which made 2 threads
#: no faster than 1 for a decode step. 20,000 covers the gaps between a decode step's parallel regions
#: (the Python between them): 1.08-1.10x the engine's tok/s of 1,000 on free cores, where 1,000 left
#: the second core idle 16 % of a decode step; with another process on a core the HF engine drops to
#: one thread and both counts serve alike (0.97x) (docs/benchmarks.md, "What the defaults rest on").
OPENMP_SPIN_COUNT = "20000"
USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # either one: the user chose how threads wait


def openmp_defaults(env: MutableMapping[str, str]) -> bool:
    """Set the OpenMP waiting in ``env`` unless the user chose it (:data:`USER_KEYS`); whether it did.
    Must reach the process before libgomp loads (torch's import loads it)."""
    if any(key in env for key in USER_KEYS):
        return False
    env["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT
    return True


def libgomp_loaded(maps: Path = Path("/proc/self/maps")) -> bool:
    """Whether GNU libgomp is mapped into this process already (then it has read its environment).
    Where ``/proc`` is missing, torch's import stands for it."""
    try:
        return "libgomp" in maps.read_text(errors="replace")
    except OSError:
        return "torch" in sys.modules


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
