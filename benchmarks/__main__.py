"""``python -m benchmarks {engine,limit,overhead,server,async,memory,profile,served,compare,attention,kernels,
speculative,all}`` [--quick].

Each subcommand prints its tables and writes ``benchmarks/results/<name>.json`` (``-quick.json``
for ``--quick``, which finishes in under two minutes and draws no PNG) and, for full runs, a PNG
plot. ``robustness`` lives in ``python -m benchmarks.robustness``. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from benchmarks.common import context, print_table, pyplot, result_path, save_png, setup_torch, write_report


def _engine(args: argparse.Namespace) -> None:
    from benchmarks import engine_throughput as eng

    started = context()
    report = eng.run_benchmark(args.quick, n=args.n, rate=args.rate, wide=args.wide,
                               skip_sequential=args.skip_sequential)
    for arrival, block in report["arrivals"].items():
        print_table(block["results"], ["mode", "tok_s", "tok_per_cpu_s", "tokens", "wall_s", "ttft_p50_s", "ttft_p99_s",
                                       "itl_p50_ms", "itl_p99_ms", "mean_batch"], f"engine, {arrival}")
        print(block["ratios"], {k: v for k, v in block.items() if k.startswith("identical")})
    write_report("engine", report, args.quick, started)
    plt = pyplot(args.quick)
    if plt:
        save_png(eng.plot(report, plt), "engine")


def _limit(args: argparse.Namespace) -> None:
    from benchmarks import limit

    started = context()
    report = limit.run_benchmark(args.quick)
    print_table(report["rows"], ["batch", "context", "raw_step_ms", "ours_step_ms", "engine_step_ms",
                                 "ours_vs_raw", "engine_vs_raw"], "limit: decode step at equal batch")
    write_report("limit", report, args.quick, started)
    plt = pyplot(args.quick)
    if plt:
        save_png(limit.plot(report, plt), "limit")


def _overhead(args: argparse.Namespace) -> None:
    from benchmarks import overhead

    started = context()
    report = overhead.run_benchmark(args.quick)
    print_table(report["layers"], ["layer", "us_per_step", "pct_of_decode_step"], "per-step overhead, batch 16")
    print(f"decode step (engine.step): {report['engine_step_ms']} ms; total overhead "
          f"{report['total_overhead_pct']}% of it")
    print_table(report["metrics"], ["layer", "us_per_step", "pct_of_decode_step"], "observability cost, batch 16")
    print(f"metrics: {report['metrics_us_per_step']} µs per step = {report['metrics_fraction_of_decode_step']} "
          "of a decode step")
    write_report("overhead", report, args.quick, started)


def _server(args: argparse.Namespace) -> None:
    from benchmarks import server

    started = context()
    report = server.run_benchmark(args.quick, djl=not args.no_djl, model=args.server_model,
                                  baseline=args.baseline, repeat=args.repeat, client=args.client)
    for name, block in report["targets"].items():
        print_table(block["rows"], ["front", "clients", "req_s", "req_s_runs", "tok_s", "ttft_p50_ms", "ttft_p99_ms",
                                    "latency_p50_ms", "errors", "client_cpu_s", "server_cpu_s", "req_per_server_cpu_s",
                                    "load_avg_1m"],
                    f"server: {name}")
        print(f"ours / DJL per round ({name}):", block["ours_over_djl"])
    print("added TTFT at 1 client (p50, ms):", report["added_ttft_ms"])
    write_report("server", report, args.quick, started)
    plt = pyplot(args.quick)
    if plt:
        save_png(server.plot(report, plt), "server")


def _async(args: argparse.Namespace) -> None:
    from benchmarks import async_mode

    started = context()
    versions = () if args.no_djl else tuple(args.djl_version or ("0.34", "0.36"))
    report = async_mode.run_benchmark(args.quick, args.server_model, args.repeat, versions)
    async_mode.print_report(report)
    write_report("async" if args.server_model == "both" else f"async-{args.server_model}", report, args.quick, started)


def _memory(args: argparse.Namespace) -> None:
    from benchmarks import memory

    started = context()
    report = memory.run_benchmark(args.quick)
    print_table(report["rows"], ["concurrent", "peak_rss_mib", "rss_per_request_mib", "kv_peak_mib",
                                 "kv_per_request_mib", "kv_theory_per_request_mib"], "memory")
    print({k: v for k, v in report.items() if k != "rows" and not isinstance(v, list)})
    write_report("memory", report, args.quick, started)
    plt = pyplot(args.quick)
    if plt:
        save_png(memory.plot(report, plt), "memory")


def _served(args: argparse.Namespace) -> None:
    from benchmarks import served_engines

    started = context()
    repeat = args.repeat or (1 if args.quick else 3)
    report = served_engines.run_benchmark(args.quick, tuple(args.dtype.split(",")), repeat,
                                          reference=not args.no_reference, variants=tuple(args.variant or ()),
                                          python=args.python)
    for dtype, block in report["dtypes"].items():
        print_table(block["rows"], ["engine", "tok_s", "tok_s_runs", "ttft_p50_s", "ttft_p99_s", "itl_p50_ms",
                                    "itl_p99_ms", "errors", "identical_to_generate", "cpu_s", "tok_per_server_cpu_s",
                                    "load_avg_1m"],
                    f"engines through djl-handlers serve, {dtype}")
        print({k: v for k, v in block.items() if k != "rows"})
    write_report("served", report, args.quick, started)
    plt = pyplot(args.quick)
    if plt:
        save_png(served_engines.plot(report, plt), "served")


def _compare(args: argparse.Namespace) -> None:
    from benchmarks import engine_compare

    out = result_path("engine-compare", args.quick)
    engine_compare.main(["--n", str(8 if args.quick else args.n), "--dtype", args.dtype,
                         "--repeat", str(args.repeat or 1), "--modes", "padded,padded-sdpa,padded-torch,static",
                         "--out", str(out),
                         *([] if args.quick else ["--sequential"])])


def _attention(args: argparse.Namespace) -> None:
    from benchmarks import decode_attention

    out = result_path("decode-attention", args.quick)
    decode_attention.main(["--dtype", args.dtype, "--rounds", str(1 if args.quick else 3), "--out", str(out)])


def _kernels(args: argparse.Namespace) -> None:
    from benchmarks import step_kernels

    out = result_path("step-kernels", args.quick)
    step_kernels.main(["--dtype", args.dtype, "--rounds", str(1 if args.quick else 9), "--out", str(out)])


def _profile(args: argparse.Namespace) -> None:
    from benchmarks import profile

    started = context()
    report = profile.run_benchmark(args.quick)
    print_table(report["inclusive"], ["frame", "pct"], "profile: inclusive share of samples")
    write_report("profile", report, args.quick, started)


def _speculative(args: argparse.Namespace) -> None:
    from benchmarks import speculative

    speculative.run(args.quick, ngram=json.loads(args.ngram) if args.ngram else None)


COMMANDS: dict[str, Callable[[argparse.Namespace], None]] = {
    "engine": _engine, "limit": _limit, "overhead": _overhead, "server": _server, "async": _async, "memory": _memory,
    "profile": _profile, "served": _served, "compare": _compare, "attention": _attention,
    "kernels": _kernels, "speculative": _speculative,
}


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one benchmark, or all of them in sequence."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", default="engine", choices=[*COMMANDS, "all"])
    parser.add_argument("--quick", action="store_true", help="short smoke run (< 2 min), no PNG")
    parser.add_argument("--n", type=int, default=32, help="engine: number of requests")
    parser.add_argument("--rate", type=float, default=1.0, help="engine: Poisson arrivals per second")
    parser.add_argument("--wide", action="store_true", help="engine: wider draw, prompts 16-512, 8-256 new tokens")
    parser.add_argument("--skip-sequential", action="store_true", help="engine: no sequential generate()")
    parser.add_argument("--no-djl", action="store_true", help="server: skip DJL Serving's ModelServer")
    parser.add_argument("--server-model", choices=["fake", "embedded", "both"], default="both")
    parser.add_argument("--baseline", help="server: also run djl-handlers serve from this git revision")
    parser.add_argument("--repeat", type=int, help="server: runs per front and client count (alternated)")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw", help="server: load generator")
    parser.add_argument("--djl-version", action="append", choices=["0.34", "0.36"],
                        help="async: DJL Serving release(s) to run beside ours (default both)")
    parser.add_argument("--dtype", default="fp32,bf16", help="served/compare: dtypes to run")
    parser.add_argument("--no-reference", action="store_true", help="served: skip the sequential generate() check")
    parser.add_argument("--variant", action="append", metavar="NAME:key=value;...",
                        help="served: one more HF server with these serving.properties options")
    parser.add_argument("--ngram", metavar="JSON", help="speculative: the option.speculative_config object to measure")
    parser.add_argument("--python", metavar="VENV/bin/python",
                        help="served: run the HF servers on this interpreter's installed djl_handlers wheel")
    args: Any = parser.parse_args(argv)
    setup_torch()
    for name in COMMANDS if args.command == "all" else [args.command]:
        COMMANDS[name](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
