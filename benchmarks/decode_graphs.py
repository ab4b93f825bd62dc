"""The HF engine's decode step on static shapes (``option.decode_graphs``) against its dynamic step,
in one process on one model object, all requests at once.

Modes: ``off`` (today's step: the slab's own shapes), ``static`` (rows and columns padded to buckets,
run eagerly) and ``compile`` (the bucketed forward through ``torch.compile``; ``reduce-overhead`` on
CUDA, inductor's default on the CPU) and, on CUDA, ``cuda_graphs``. Every round runs each mode once,
the order rotating from round to round; a warm-up round first (not counted) meets every bucket, so
compilation and capture are outside the timed rounds (their cost is reported as ``warm_s``). The
model is transformers' own (SDPA attention, no CPU kernel patches), so every mode runs the same
modules. Each mode's token ids are compared with ``off``'s (fp32: must be identical).

    python -m benchmarks.decode_graphs [--n 16] [--rounds 3] [--modes off,static,compile] [--sizes 16]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.common import context, median, print_table, result_path, rnd, setup_torch
from benchmarks.engine_compare import run_engine
from benchmarks.workload import mixed_workload


def engine_for(model: Any, tok: Any, mode: str, rows: int, sizes: list[int] | None) -> Any:
    """An ``HFEngine`` on ``model`` whose decode steps run ``mode``."""
    from djl_handlers.engines.hf.engine import HFEngine

    engine = HFEngine(model, tok, max_batch_size=rows, max_prefill_tokens=2048)
    if mode != "off":
        engine.use_decode_graphs(mode, sizes)
    return engine


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.model.embedded import embedded_model_dir

    model_dir = str(embedded_model_dir())
    tok = AutoTokenizer.from_pretrained(model_dir)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(args.device).eval()
    jobs = mixed_workload(tok, n=args.n, prompt_range=(16, args.prompt_max), new_range=(32, args.new_max))
    prompts = [tok.encode(j.prompt) for j in jobs]
    limits = [j.max_new_tokens for j in jobs]
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
    modes = args.modes.split(",")
    engines = {m: engine_for(model, tok, m, args.n, sizes) for m in modes}
    warm: dict[str, float] = {}
    tokens: dict[str, list[list[int]]] = {}
    with torch.inference_mode():
        for mode in modes:  # warm-up: compiles / captures every bucket the workload meets
            t0 = time.perf_counter()
            tokens[mode] = run_engine(engines[mode], mode, prompts, limits)["token_ids"]
            warm[mode] = rnd(time.perf_counter() - t0) or 0.0
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[: r % len(modes)]
            row: dict[str, Any] = {"round": r + 1, "order": ",".join(order)}
            for mode in order:
                row[mode] = run_engine(engines[mode], mode, prompts, limits)["tok_s"]
            rounds.append(row)
    medians = {m: median([row[m] for row in rounds]) for m in modes}
    ratios = {f"{m}/off": rnd(median([row[m] / row["off"] for row in rounds])) for m in modes if m != "off"}
    graphs = {m: dict(engines[m].decode_graphs.stats) for m in modes if engines[m].decode_graphs is not None}
    return {"n": args.n, "dtype": args.dtype, "device": args.device, "sizes": sizes, "modes": modes,
            "rounds": rounds, "median_tok_s": medians, "median_ratio_to_off": ratios, "warm_s": warm,
            "identical_to_off": {m: tokens[m] == tokens["off"] for m in modes if m != "off"},
            "decode_graph_stats": graphs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=16, help="requests, all at once (also the batch's row limit)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="off,static,compile")
    parser.add_argument("--sizes", default="", help="option.cudagraph_capture_sizes (default: vLLM's)")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompt-max", type=int, default=96)
    parser.add_argument("--new-max", type=int, default=96)
    parser.add_argument("--out", default="", help="JSON report path (default benchmarks/results/decode_graphs.json)")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        setup_torch()
    if "off" not in args.modes.split(","):
        parser.error("--modes must include off (the baseline)")
    started = context()
    report = {"benchmark": "decode_graphs", "context_start": started, **measure(args), "context_end": context()}
    print_table(report["rounds"], ["round", "order", *report["modes"]], "decode graphs: tok/s per round")
    print("median ratio to off:", report["median_ratio_to_off"], "| identical to off:", report["identical_to_off"],
          "| warm-up s:", report["warm_s"])
    path = Path(args.out) if args.out else result_path("decode_graphs")
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    differs = [m for m, same in report["identical_to_off"].items() if not same]
    return 1 if args.dtype == "fp32" and differs else 0


if __name__ == "__main__":
    raise SystemExit(main())
