"""``python -m benchmarks [--n 32] [--quick]``: engine throughput, printed as a table with ratios,
written to docs/benchmarks.json (and a PNG plot when matplotlib is installed)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--n", type=int, default=32, help="number of requests")
    parser.add_argument("--model", default=None, help="model dir (default: the embedded SmolLM2)")
    parser.add_argument("--quick", action="store_true", help="8 short requests (smoke run)")
    parser.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: all at once)")
    parser.add_argument("--skip-sequential", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    from benchmarks.engine_throughput import load_hf, ratios, run_rolling, run_sequential, run_static
    from benchmarks.workload import mixed_workload
    from djl_handlers.model.embedded import embedded_model_dir

    model_dir = args.model or str(embedded_model_dir())
    model, tok = load_hf(model_dir)
    kw = {"prompt_range": (16, 64), "new_range": (8, 24)} if args.quick else {}
    jobs = mixed_workload(tok, n=8 if args.quick else args.n, rate_per_s=args.rate, **kw)
    results = {"rolling": run_rolling(model_dir, jobs)}
    results["static"] = run_static(model, tok, jobs)
    if not args.skip_sequential:
        results["sequential"] = run_sequential(model, tok, jobs)
    table = [r.summary() for r in results.values()]
    report = {"requests": len(jobs), "prompt_tokens": sum(j.prompt_tokens for j in jobs),
              "max_new_tokens": sum(j.max_new_tokens for j in jobs), "results": table,
              "ratios": ratios(results)}
    print(f"{'mode':32} {'tok/s':>8} {'tokens':>7} {'wall s':>8} {'ttft p50':>9} {'itl p50 ms':>10}")
    for row in table:
        print(f"{row['mode']:32} {row['tok_s']:8.1f} {row['tokens']:7d} {row['wall_s']:8.1f} "
              f"{(row['ttft_p50_s'] or 0):9.2f} {row['itl_p50_ms']:10.1f}")
    for k, v in report["ratios"].items():
        print(f"{k}: {v}x")
    DOCS.mkdir(exist_ok=True)
    name = "benchmarks-quick" if args.quick else "benchmarks"
    (DOCS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    _plot(table, DOCS / f"{name}.png")
    return 0


def _plot(table: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh([r["mode"] for r in table], [r["tok_s"] for r in table], color=["#2a7", "#888", "#bbb"][: len(table)])
    ax.set_xlabel("generated tokens / s (fp32, 2 CPU threads)")
    ax.set_title("Mixed workload throughput (higher is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
