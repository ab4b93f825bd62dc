"""The garbage collector's policy for the long-running processes: the front end, its worker, and DJL
Serving's Python worker running our handler (a module of its own: the server, the worker and the
service layer all call it).

Both processes build their long-lived heap once (imports, the app, the model) and then allocate
short-lived objects per request and per step. With CPython's defaults every full collection walks
the whole start-up heap again (31,000 objects in the front end, many more in a worker that imported
torch) and the small gen-0 threshold (700) is crossed by every burst of one step's records; measured
on the fake engine at 64 streaming clients: ~1,400 gen-0, 130 gen-1
and 12 full collections per 20 s, 0.75 s of collector time and single pauses of 30-50 ms, which made
the TTFT p99 tail (what the policy below changes: docs/benchmarks.md, "What the defaults rest on").

:func:`settle` runs once the heap is built (the front end before it opens its port, our worker
after its init call, the handler after loading its model inside DJL Serving's own worker process):
one collection, then ``gc.freeze()`` (the survivors move to the permanent generation and are never
walked again) and a gen-0 threshold of :data:`GEN0_THRESHOLD`. The collector stays on: cyclic garbage
is still reclaimed, a request only pays for what it allocated. ``DJL_HANDLERS_GC=default`` keeps
CPython's behaviour.
"""

from __future__ import annotations

import gc
import logging
import os
import sys

__all__ = ["DJL_WORKER_SCRIPT", "GEN0_THRESHOLD", "in_djl_worker", "settle"]

_LOG = logging.getLogger("djl_handlers.heap")

#: Net new container objects between young collections (CPython's default is 700). A gen-0 pass walks
#: only what survived refcounting since the last one, so its pause grows with this number: 10,000 is a
#: fraction of a millisecond, and rarely reached once the per-request reference cycles are gone.
GEN0_THRESHOLD = 10_000


#: The script DJL Serving runs as its Python worker process: a process that exists to serve one model.
DJL_WORKER_SCRIPT = "djl_python_engine.py"


def in_djl_worker() -> bool:
    """True in DJL Serving's own Python worker process (``djl_python_engine.py``), where the handler
    settles the heap after its model is loaded; never in a user's process (tests, notebooks)."""
    return os.path.basename(sys.argv[0] if sys.argv else "") == DJL_WORKER_SCRIPT


def settle(role: str) -> bool:
    """Freeze the heap built so far and raise the gen-0 threshold (``role`` names the process in
    the log). ``False`` when ``DJL_HANDLERS_GC=default`` asked for CPython's own policy."""
    mode = os.environ.get("DJL_HANDLERS_GC", "tuned").strip().lower()
    if mode == "default":
        return False
    if mode != "tuned":
        _LOG.warning("DJL_HANDLERS_GC=%r is neither 'tuned' nor 'default'; using 'tuned'", mode)
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GEN0_THRESHOLD, gen0), gen1, gen2)
    _LOG.info("%s: heap settled, %d objects frozen, gc thresholds %s", role, gc.get_freeze_count(), gc.get_threshold())
    return True
