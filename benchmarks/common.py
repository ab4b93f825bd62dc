"""Shared helpers of the benchmark modules: torch set-up, percentiles, the machine context every
JSON report carries (load average!), tables, JSON and PNG output into ``benchmarks/results/``.

Every figure a benchmark reports is meant to be read as a *ratio* taken side by side in one run;
absolute numbers depend on a shared 2-core box and are context only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Where every benchmark writes its raw JSON and PNG by default (git-ignored).
RESULTS = ROOT / "benchmarks" / "results"
THREADS = 2
# What caps this project's CPU paths at AVX2 on a CPU that has more (engines.md, "Every x86-64 ISA level"):
# oneDNN's and ATen's dispatch, and the C kernels built for x86-64-v3.
LOWER_ISA = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "DJL_HANDLERS_KERNEL_MARCH": "x86-64-v3"}


def stop_process(proc: Any, timeout: float = 30) -> None:
    """Terminate a server subprocess, killing it when it does not exit within ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def setup_torch() -> None:
    """Offline hub, 2 torch threads (the box has 2 cores shared with other jobs), and the served
    worker's OpenMP waiting (a short spin, then sleep: ``djl_handlers.openmp.openmp_defaults``); must run
    before torch loads."""
    from djl_handlers.openmp import openmp_defaults

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    openmp_defaults(os.environ)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(min(THREADS, os.cpu_count() or 1))


def pct(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1, nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def median(values: Sequence[float]) -> float | None:
    """The median of ``values`` (mean of the two middle ones for an even count); None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def rnd(value: float | None, digits: int = 2) -> float | None:
    """``round`` that lets None through."""
    return None if value is None else round(value, digits)


def context() -> dict[str, Any]:
    """Machine and library facts, with the load average at the time of the call."""
    info: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
    }
    try:
        import torch
        import transformers

        info.update(torch=torch.__version__, transformers=transformers.__version__,
                    torch_threads=torch.get_num_threads())
    except ImportError:
        pass
    return info


def write_report(name: str, report: dict[str, Any], quick: bool, started: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>[-quick].json`` with the context at start and end."""
    report = {"benchmark": name, "quick": quick, "context_start": started, "context_end": context(), **report}
    path = result_path(name, quick)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} (load average {started['loadavg']} -> {report['context_end']['loadavg']})")
    return path


def result_path(name: str, quick: bool = False, suffix: str = ".json") -> Path:
    """``benchmarks/results/<name>[-quick]<suffix>``, its folder created."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{name}{'-quick' if quick else ''}{suffix}"


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], title: str = "") -> None:
    """A plain fixed-width table of ``columns`` from ``rows``."""
    if title:
        print(f"\n== {title}")

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        return str(value)

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def pyplot(quick: bool) -> Any:
    """matplotlib's pyplot (Agg backend), or None when not installed or in a quick run (no PNGs)."""
    if quick:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_png(fig: Any, name: str) -> None:
    """Save ``fig`` as ``benchmarks/results/<name>.png`` (small: dpi 80) and close it."""
    path = result_path(name, suffix=".png")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    fig.clf()
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")


def per_dtype_main(description: str, argv: list[str] | None, out: Path, rounds: int,
                   measure: Callable[[Any, argparse.Namespace], dict[str, Any]],
                   options: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """The command line of a side-by-side micro benchmark: ``--dtype fp32,bf16``, ``--rounds``,
    ``--out`` (+ ``options``); runs ``measure(torch dtype, args)`` per dtype under inference mode,
    prints each result and writes the report (load average at start and end) as JSON."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dtype", default="fp32,bf16")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--out", default=str(out))
    if options is not None:
        options(parser)
    args = parser.parse_args(argv)
    setup_torch()
    import torch

    report: dict[str, Any] = {"load_avg_start": os.getloadavg()[0], "threads": torch.get_num_threads(), "runs": {}}
    for name in args.dtype.split(","):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        with torch.inference_mode():
            run = measure(dtype, args)
        report["runs"][name] = run
        print(name, json.dumps(run), flush=True)
    report["load_avg_end"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(report, indent=1) + "\n")
    print("wrote", args.out)


#: A run that loses more than this share of the machine's core time to the hypervisor is "stolen".
STEAL_LIMIT = 0.02


def host_cpu() -> dict[str, float]:
    """This machine's CPU seconds so far from ``/proc/stat`` (all cores): ``busy`` (user, nice,
    system, irq, softirq), ``idle`` (idle, iowait) and ``steal`` (time the hypervisor gave this VM's
    cores to someone else); empty where it cannot be read."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    busy = user + nice + system + irq + softirq
    return {"busy": busy / tick, "idle": (idle + iowait) / tick, "steal": steal / tick}


def steal_share(host: dict[str, float] | None) -> float:
    """The share of the machine's core time that the hypervisor gave away, from a difference of two
    :func:`host_cpu` readings (0 when there is none)."""
    host = host or {}
    total = sum(host.get(k, 0.0) for k in ("busy", "idle", "steal"))
    return float(host.get("steal", 0.0)) / total if total > 0 else 0.0


def stolen(*hosts: dict[str, float] | None) -> bool:
    """Whether any of these runs lost more than :data:`STEAL_LIMIT` of the machine to steal."""
    return any(steal_share(h) > STEAL_LIMIT for h in hosts)


def host_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """``after - before`` per key of two :func:`host_cpu` readings, rounded."""
    return {k: round(after[k] - before[k], 2) for k in after if k in before}
