"""Cost of structured output in the HF engine: decode tokens/s with and without a constraint at
batch 1 and batch 16 (same model, same number of generated tokens, side by side in one run), and
grammar compile times (the vocabulary index built once per engine, each schema cold and cached).

``python -m benchmarks.structured [--quick]`` prints the tables and writes
``benchmarks/results/structured[-quick].json``. Read the ratios, not the absolute numbers (shared
2-core box; the load average is recorded). CPU seconds are reported next to wall time because
they are less sensitive to the other jobs on the machine.

The constrained rows follow a JSON schema that forces exactly ``N`` tokens' worth of output (an
array of 3-digit integers of fixed length); the free rows generate the same number of tokens with
``ignore_eos_token``. Both run through ``HFEngine.step`` exactly as the server does.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.common import context, print_table, rnd, setup_torch, write_report

LONG = {"type": "array", "items": {"type": "integer", "minimum": 100, "maximum": 999}, "minItems": 24, "maxItems": 24}
SCHEMAS: dict[str, Any] = {
    "flat_object": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                     "age": {"type": "integer"}}, "required": ["name", "age"]},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"},
                                                  "tags": {"type": "array", "items": {"type": "string"}}}},
        "ok": {"type": "boolean"}}},
    "enum_anyof": {"anyOf": [{"enum": ["a", "b", "c"]}, {"type": "object", "properties": {"x": {"type": "number"}}}]},
    "long_array": LONG,
}


def _engine() -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.model.embedded import embedded_model_dir

    path = str(embedded_model_dir())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return HFEngine(model, tok, max_batch_size=32)


def _params(constrained: bool, tokens: int) -> Any:
    from djl_handlers.params.generation import GenerationParameters

    if constrained:
        return GenerationParameters.from_dict({"max_new_tokens": tokens, "guided_json": LONG})
    return GenerationParameters.from_dict({"max_new_tokens": tokens, "ignore_eos_token": True})


def decode_rate(engine: Any, batch: int, constrained: bool, tokens: int) -> dict[str, Any]:
    """Generate with ``batch`` identical-length requests; tokens/s over the whole run (prefill
    included, the same in both modes)."""
    from djl_handlers.engines.base import EngineRequest

    prompt = engine.tokenizer.encode("<|im_start|>user\nList numbers.<|im_end|>\n<|im_start|>assistant\n")
    counts: dict[int, int] = {}
    base = int(time.monotonic_ns() % 1_000_000_000)
    for i in range(batch):
        engine.add_request(EngineRequest(base + i, prompt, _params(constrained, tokens)))
    wall, cpu = time.perf_counter(), time.process_time()
    while engine.has_unfinished():
        for out in engine.step():
            counts[out.request_id] = counts.get(out.request_id, 0) + 1
            done = out.finish_reason or out.error or counts[out.request_id] >= tokens
            if done or (constrained and out.token_id in engine.eos_token_ids):
                engine.release(out.request_id)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    total = sum(counts.values())
    return {"batch": batch, "constrained": constrained, "tokens": total, "wall_s": rnd(wall, 3),
            "tok_s": rnd(total / wall, 1), "tok_per_cpu_s": rnd(total / cpu, 1)}


def compile_times(engine: Any) -> list[dict[str, Any]]:
    """Per schema: cold compile (fresh backend: no cache) and a cached lookup, in ms."""
    from djl_handlers.engines.hf.grammar import GrammarBackend
    from djl_handlers.params.structured import StructuredOutput, schema_text

    rows = []
    started = time.perf_counter()
    backend = GrammarBackend(engine.tokenizer, engine._vocab, sorted(engine.eos_token_ids))
    backend._get_compiler()
    rows.append({"what": "vocabulary index (once per engine)", "ms": rnd((time.perf_counter() - started) * 1e3, 1)})
    started = time.perf_counter()
    backend.compile(StructuredOutput("regex", "x", "guided_regex"))
    rows.append({"what": "first compile (one-time set-up)", "ms": rnd((time.perf_counter() - started) * 1e3, 1)})
    for name, schema in SCHEMAS.items():
        constraint = StructuredOutput("json", schema_text(schema, "guided_json"), "guided_json")
        t0 = time.perf_counter()
        backend.check(constraint)
        t1 = time.perf_counter()
        backend.submit(constraint).result()
        t2 = time.perf_counter()
        backend.submit(constraint).result()
        t3 = time.perf_counter()
        rows.append({"what": name, "check_ms": rnd((t1 - t0) * 1e3, 2), "compile_ms": rnd((t2 - t1) * 1e3, 2),
                     "cached_ms": rnd((t3 - t2) * 1e3, 3)})
    backend.close()
    return rows


def run_benchmark(quick: bool) -> dict[str, Any]:
    engine = _engine()
    tokens = 48 if quick else 96
    decode_rate(engine, 1, True, 8)  # warm-up (compiles the schema, first-call costs)
    rates = []
    for batch in (1, 16):
        free = decode_rate(engine, batch, False, tokens)
        constrained = decode_rate(engine, batch, True, tokens)
        constrained["vs_free"] = rnd(constrained["tok_per_cpu_s"] / free["tok_per_cpu_s"], 3)
        rates += [free, constrained]
    return {"decode": rates, "compile": compile_times(engine), "tokens_per_request": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    setup_torch()
    started = context()
    report = run_benchmark(args.quick)
    print_table(report["decode"], ["batch", "constrained", "tokens", "wall_s", "tok_s", "tok_per_cpu_s", "vs_free"],
                "decode with and without a JSON-schema constraint")
    print_table(report["compile"], ["what", "ms", "check_ms", "compile_ms", "cached_ms"], "grammar compile")
    write_report("structured", report, args.quick, started)


if __name__ == "__main__":
    main()
