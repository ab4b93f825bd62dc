"""Beam search on the HF engine against transformers' ``generate(num_beams=4)`` over the same prompts.

``python -m benchmarks.beam_search [--quick]`` prints the table and writes
``benchmarks/results/beam_search[-quick].json``. On the embedded SmolLM2-135M (fp32), 32 chat
prompts of different lengths, 4 beams each, ``max_new_tokens`` tokens at most (eos ends a beam as
usual), three ways:

- **engine**: all 32 requests through ``HFEngine.step`` at once (32 x 4 = 128 beam rows; the batch
  limit is set to hold them), the prompt of each prefilled once and forked into its beams;
- **static**: one ``generate(num_beams=4)`` call on the 32 prompts left-padded into one batch;
- **one at a time**: ``generate(num_beams=4)`` per prompt, the reference text.

The engine's texts must equal the one-at-a-time texts (asserted: the engine's beams equal
``generate()`` alone); the static batch's texts are counted (left padding changes its fp32 sums a
little, so a close pair of beams may swap). Printed ratios: generated tokens per second of the
engine over the static batch (goal >= 1.5) and over one at a time.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.common import context, print_table, rnd, setup_torch, write_report

BEAMS = 4
TOPICS = ["the sea", "a mountain", "bread", "rain", "a violin", "the moon", "a library", "winter"]
ASKS = ["Tell me about {}.", "Write one sentence about {}.", "What is special about {}?",
        "Describe {} to a child in a few words, please, and keep it short."]


def prompts(count: int) -> list[str]:
    """``count`` chat prompts of a few different lengths."""
    out = []
    for i in range(count):
        ask = ASKS[i % len(ASKS)].format(TOPICS[(i // len(ASKS)) % len(TOPICS)])
        out.append(f"<|im_start|>user\n{ask}<|im_end|>\n<|im_start|>assistant\n")
    return out


def _model() -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.model.embedded import embedded_model_dir

    path = str(embedded_model_dir())
    return (AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(path))


def engine_run(model: Any, tok: Any, ids: list[list[int]], tokens: int) -> tuple[list[list[int]], float]:
    """Every prompt a beam request in one engine; each one's tokens and the wall time."""
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.params.generation import GenerationParameters

    engine = HFEngine(model, tok, max_batch_size=BEAMS * len(ids), max_prefill_tokens=4096)
    params = GenerationParameters.from_dict({"num_beams": BEAMS, "max_new_tokens": tokens})
    got: dict[int, list[int]] = {i: [] for i in range(len(ids))}
    wall = time.perf_counter()
    for i, prompt in enumerate(ids):
        engine.add_request(EngineRequest(i, prompt, params))
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id].append(out.token_id)
            if out.finish_reason:
                engine.release(out.request_id)
    return [got[i] for i in range(len(ids))], time.perf_counter() - wall


def _generate(model: Any, tok: Any, batch: list[list[int]], tokens: int, eos: list[int]) -> list[list[int]]:
    import torch

    from djl_handlers.engines.hf.batch import left_pad

    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids, mask = left_pad(batch, pad)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, num_beams=BEAMS, do_sample=False,
                             max_new_tokens=tokens, pad_token_id=pad, eos_token_id=eos)
    rows = []
    for row in out[:, ids.shape[1]:].tolist():
        rows.append(row[: next((i + 1 for i, t in enumerate(row) if t in eos), len(row))])
    return rows


def run_benchmark(quick: bool) -> dict[str, Any]:
    from djl_handlers.engines.hf.engine import HFEngine

    model, tok = _model()
    eos = sorted(HFEngine(model, tok).eos_token_ids)  # the engine's eos ids, for generate() too
    count, tokens = (8, 12) if quick else (32, 24)
    ids = [tok.encode(p) for p in prompts(count)]
    engine_run(model, tok, ids[:2], 2)  # warm-up (first-call costs)
    engine_tokens, engine_s = engine_run(model, tok, ids, tokens)
    wall = time.perf_counter()
    static_tokens = _generate(model, tok, ids, tokens, eos)
    static_s = time.perf_counter() - wall
    wall = time.perf_counter()
    alone_tokens = [_generate(model, tok, [p], tokens, eos)[0] for p in ids]
    alone_s = time.perf_counter() - wall
    assert engine_tokens == alone_tokens, "the engine's beams differ from generate() alone"
    generated = sum(len(t) for t in engine_tokens)
    static_generated = sum(len(t) for t in static_tokens)
    rates = (generated / engine_s, static_generated / static_s, generated / alone_s)
    rows = [
        {"run": "engine (continuous batch)", "seconds": rnd(engine_s, 2), "tokens": generated,
         "tokens_per_s": rnd(generated / engine_s, 2), "same_as_alone": count},
        {"run": "generate, one static batch", "seconds": rnd(static_s, 2), "tokens": sum(len(t) for t in static_tokens),
         "tokens_per_s": rnd(sum(len(t) for t in static_tokens) / static_s, 2),
         "same_as_alone": sum(a == b for a, b in zip(static_tokens, alone_tokens, strict=True))},
        {"run": "generate, one at a time", "seconds": rnd(alone_s, 2), "tokens": generated,
         "tokens_per_s": rnd(generated / alone_s, 2), "same_as_alone": count},
    ]
    return {"rows": rows, "requests": count, "beams": BEAMS, "max_new_tokens": tokens,
            "engine_over_static": rnd(rates[0] / rates[1], 2), "engine_over_one_at_a_time": rnd(rates[0] / rates[2], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    setup_torch()
    started = context()
    report = run_benchmark(args.quick)
    print_table(report["rows"], ["run", "seconds", "tokens", "tokens_per_s", "same_as_alone"],
                f"beam search, {report['requests']} requests x {report['beams']} beams")
    print({"engine_over_static": report["engine_over_static"],
           "engine_over_one_at_a_time": report["engine_over_one_at_a_time"]})
    write_report("beam_search", report, args.quick, started)


if __name__ == "__main__":
    main()
