"""Wall-time measurement shared by the load-time GEMM probes (the 16-bit probe in ``isa``, the MKL
probe in ``mkl_linear``) and the GEMM benchmarks: calls interleaved in rounds, each call's best time."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


def best_times(calls: Sequence[Callable[[], object]], repeats: int) -> list[float]:
    """Each call's best wall time (seconds) over ``repeats`` rounds that call them in turn, after one
    untimed round (which warms the libraries' kernel caches)."""
    best = [float("inf")] * len(calls)
    for round_ in range(repeats + 1):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            if round_:
                best[i] = min(best[i], time.perf_counter() - start)
    return best
