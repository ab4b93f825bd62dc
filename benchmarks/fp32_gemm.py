"""fp32 GEMMs on MKL's packed sgemm against oneDNN's prepacked GEMM (``option.cpu_linear=mkl`` vs ``onednn``).

Two measurements, each at the CPU's own ISA level and capped at AVX2 (``--isa avx2``: oneDNN, MKL,
ATen and the C kernels, as on an AVX2-only CPU):

- **GEMMs**: the embedded model's packed weights (q/k/v and gate/up fused, o, down, the LM head) at
  1, 16, 32 and 256 rows, one model's worth per step (30 layers, one LM head), each the best of
  interleaved repeats; the ratio is oneDNN's time over MKL's (above 1: MKL faster).
- **The engine**: two HF engines on the embedded model in one process, ``cpu_linear=onednn`` and
  ``mkl``, serving the same batch (32 prompts x 256 tokens, 128 greedy tokens each, and one prompt
  alone) in interleaved rounds; tok/s of each and the ratio within each round. Greedy tokens of the
  two are compared (the values differ in the last bits: another summation order).

    .venv/bin/python -m benchmarks.fp32_gemm                # both ISA levels, 3 rounds
    .venv/bin/python -m benchmarks.fp32_gemm --isa avx2 --quick
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from benchmarks.common import LOWER_ISA, ROOT, context, print_table, rnd, setup_torch, write_report

LIBRARIES = ("onednn", "mkl")
# (out, in, per model): the embedded model's (SmolLM2-135M) packed weights, projections fused
SHAPES = ((960, 576, 30), (576, 576, 30), (3072, 576, 30), (576, 1536, 30), (49152, 576, 1))
ROWS = (1, 16, 32, 256)


def gemms(repeats: int) -> list[dict[str, Any]]:
    """One model's packed GEMMs per step on each library at each row count (milliseconds)."""
    import torch

    from djl_handlers.engines.hf.cpu.linear import reorder, run_packed
    from djl_handlers.engines.hf.cpu.timing import best_times

    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(out, inp, generator=gen), count) for out, inp, count in SHAPES]
    packed = [[reorder(w, lib) for lib in LIBRARIES] for w, _ in weights]
    rows_out = []
    with torch.inference_mode():
        for rows in ROWS:
            xs = [torch.randn(rows, w.shape[1], generator=gen) for w, _ in weights]
            # per shape, each library in turn: [shape 0 oneDNN, shape 0 MKL, shape 1 oneDNN, ...]
            calls = [functools.partial(run_packed, x, p, None) for x, per_lib in zip(xs, packed, strict=True)
                     for p in per_lib]
            best = best_times(calls, repeats)
            ms = {lib: 1e3 * sum(t * count for t, (_, count) in zip(best[j::len(LIBRARIES)], weights, strict=True))
                  for j, lib in enumerate(LIBRARIES)}
            rows_out.append({"rows": rows, "oneDNN ms": rnd(ms["onednn"]), "MKL ms": rnd(ms["mkl"]),
                             "oneDNN/MKL": rnd(ms["onednn"] / ms["mkl"], 3)})
    return rows_out


def engines(rounds: int, count: int, prompt_len: int, new: int) -> list[dict[str, Any]]:
    """Interleaved rounds of both engines on ``count`` prompts at once, then on one prompt alone."""
    import torch

    from benchmarks.cpu_int8 import load, run_tokens

    gen = torch.Generator().manual_seed(0)
    loaded = {lib: load({"dtype": "fp32", "cpu_linear": lib}) for lib in LIBRARIES}
    rows = []
    for clients in (count, 1):
        prompts = [torch.randint(100, 40000, (prompt_len,), generator=gen).tolist() for _ in range(clients)]
        for engine in loaded.values():
            run_tokens(engine, prompts[:1], 2)  # warm-up
        tps: dict[str, list[float]] = {lib: [] for lib in LIBRARIES}
        same = []
        for round_ in range(rounds):
            order = LIBRARIES if round_ % 2 == 0 else LIBRARIES[::-1]
            tokens = {}
            for lib in order:
                rate, tokens[lib] = run_tokens(loaded[lib], prompts, new)
                tps[lib].append(rate)
            same.append(sum(a == b for a, b in zip(tokens["onednn"], tokens["mkl"], strict=True)))
        ratios = [m / o for o, m in zip(tps["onednn"], tps["mkl"], strict=True)]
        rows.append({"clients": clients, "oneDNN tok/s": rnd(statistics.median(tps["onednn"]), 1),
                     "MKL tok/s": rnd(statistics.median(tps["mkl"]), 1), "MKL/oneDNN": rnd(statistics.median(ratios)),
                     "ratios": [rnd(r) for r in ratios], "same greedy": f"{min(same)}/{clients}"})
    return rows


def child(args: argparse.Namespace) -> dict[str, Any]:
    from djl_handlers.engines.hf.cpu.isa import features

    count, prompt_len, new, rounds = (4, 64, 8, 1) if args.quick else (32, 256, 128, args.rounds)
    return {"isa": args.isa, "cpu": features().describe(), "gemms": gemms(3 if args.quick else 20),
            "engines": engines(rounds, count, prompt_len, new)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", choices=("native", "avx2", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 prompts x 64 tokens, 8 new, 1 round")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        setup_torch()
        print(json.dumps(child(args)))
        return 0
    started = context()
    results = []
    for isa in (("native", "avx2") if args.isa == "both" else (args.isa,)):
        env = dict(os.environ, **(LOWER_ISA if isa == "avx2" else {}))
        cmd = [sys.executable, "-m", "benchmarks.fp32_gemm", "--child", "--isa", isa, "--rounds", str(args.rounds)]
        done = subprocess.run(cmd + (["--quick"] if args.quick else []), cwd=ROOT, env=env, capture_output=True,
                              text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        cpu = result["cpu"]
        title = f"CPU {cpu['model']} (isa {cpu['isa']}, run at {isa}; ATen {cpu['atenCapability']})"
        print_table([{"isa": isa, **r} for r in result["gemms"]], ["isa", "rows", "oneDNN ms", "MKL ms", "oneDNN/MKL"],
                    title=title + ": one model's packed GEMMs per step")
        print_table([{"isa": isa, **r} for r in result["engines"]],
                    ["isa", "clients", "oneDNN tok/s", "MKL tok/s", "MKL/oneDNN", "ratios", "same greedy"],
                    title=title + ": the engine, interleaved rounds")
    write_report("fp32_gemm", {"results": results}, args.quick, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
