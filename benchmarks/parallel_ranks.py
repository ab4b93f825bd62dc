"""One vLLM rank against several on vLLM's CPU engine: start-up time, time to first token and
tokens per second, through ``djl_handlers.vllm``'s adapter (so with the handler's CPU thread
binding), on the embedded SmolLM2-135M in fp32.

``.venv-vllm/bin/python -m benchmarks.parallel_ranks [--degrees 1,3] [--new-tokens 24]``

Each degree starts its own engine (one at a time, shut down before the next), runs one request
alone and then a batch of requests together, and reports: ``start_s`` (engine ready), ``ttft_s``
(request added → first token), ``decode_tok_s`` (tokens after the first / their time) for the
lone request, and ``batch_tok_s`` / ``batch_ttft_p50_s`` for the batch. Greedy texts are compared
across degrees (``identical``). Ranks share the machine's cores, so on a small CPU more ranks are
slower: the figures show what the all-reduces and the rank processes cost, not a speed-up.
Writes ``benchmarks/results/parallel_ranks.json``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

PROMPTS = ("The capital of France is", "Deep learning is", "Once upon a time", "The best way to learn is")
OPTIONS = {"rolling_batch": "vllm", "dtype": "fp32", "max_model_len": "512", "max_rolling_batch_size": "8",
           "enforce_eager": "true", "gpu_memory_utilization": "0.3"}


def _run(engine: Any, prompts: tuple[str, ...], new_tokens: int, first_id: int) -> dict[str, Any]:
    """Add ``prompts`` at once and step until all finish; per-request first/last token times and texts."""
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.params.generation import GenerationParameters

    params = GenerationParameters.from_dict({"max_new_tokens": new_tokens, "ignore_eos_token": True}, engine="vllm")
    started = time.perf_counter()
    ids = list(range(first_id, first_id + len(prompts)))
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(EngineRequest(rid, engine.tokenizer.encode(prompt), params, prompt))
    first: dict[int, float] = {}
    tokens = dict.fromkeys(ids, 0)
    texts = dict.fromkeys(ids, "")
    while engine.has_unfinished():
        for out in engine.step():
            now = time.perf_counter() - started
            first.setdefault(out.request_id, now)
            tokens[out.request_id] += 1
            texts[out.request_id] += out.text or ""
            if out.finish_reason:
                engine.release(out.request_id)
    wall = time.perf_counter() - started
    return {"wall_s": wall, "ttft_s": [first[i] for i in ids], "tokens": sum(tokens.values()),
            "texts": [texts[i] for i in ids]}


def measure(degree: int, model: str, new_tokens: int) -> dict[str, Any]:
    """Start an engine with ``tensor_parallel_degree=degree``, measure, shut it down."""
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.registry import load_engine_class

    config = ServingConfig.from_properties({"model_id": model, "tensor_parallel_degree": str(degree), **OPTIONS},
                                           engine="vllm")
    started = time.perf_counter()
    engine: Any = load_engine_class(config.serving_engine).from_config(config)
    start_s = time.perf_counter() - started
    try:
        _run(engine, PROMPTS[:1], 4, 1)  # warm-up
        alone = _run(engine, PROMPTS[:1], new_tokens, 100)
        batch = _run(engine, PROMPTS, new_tokens, 200)
    finally:
        engine.engine.engine_core.shutdown()
    ttft = alone["ttft_s"][0]
    batch_ttft = sorted(batch["ttft_s"])
    return {
        "tensor_parallel_degree": degree,
        "start_s": round(start_s, 1),
        "ttft_s": round(ttft, 3),
        "decode_tok_s": round((alone["tokens"] - 1) / max(alone["wall_s"] - ttft, 1e-9), 2),
        "batch_tok_s": round(batch["tokens"] / batch["wall_s"], 2),
        "batch_ttft_p50_s": round(batch_ttft[len(batch_ttft) // 2], 3),
        "texts": alone["texts"] + batch["texts"],
    }


def main(argv: list[str] | None = None) -> None:
    from benchmarks.common import context, print_table, write_report

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--degrees", default="1,3", help="tensor-parallel degrees, comma-separated")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--model", default="", help="model folder (default: the embedded SmolLM2)")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.model:
        from djl_handlers.model.embedded import embedded_model_dir

        args.model = str(embedded_model_dir())
    started = context()
    rows = [measure(int(d), args.model, args.new_tokens) for d in args.degrees.split(",")]
    base = rows[0]
    for row in rows:
        row["identical"] = row["texts"] == base["texts"]
        row["batch_tok_s_vs_first"] = round(row["batch_tok_s"] / base["batch_tok_s"], 2)
        row["decode_tok_s_vs_first"] = round(row["decode_tok_s"] / base["decode_tok_s"], 2)
    print_table(rows, ["tensor_parallel_degree", "start_s", "ttft_s", "decode_tok_s", "batch_tok_s",
                       "batch_ttft_p50_s", "decode_tok_s_vs_first", "batch_tok_s_vs_first", "identical"],
                f"vLLM CPU engine, {len(PROMPTS)}-request batch, {args.new_tokens} new tokens, {os.cpu_count()} cores")
    write_report("parallel_ranks", {"rows": rows, "new_tokens": args.new_tokens, "model": os.path.basename(args.model),
                                    "cores": len(os.sched_getaffinity(0))}, False, started)


if __name__ == "__main__":
    main()
