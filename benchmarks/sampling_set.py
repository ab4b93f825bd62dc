"""Cost of vLLM's sampling set in the HF engine: a batch that mixes penalties, ``min_p`` and top-5
log-probs against a plain greedy batch of the same size, generating the same number of tokens.

``python -m benchmarks.sampling_set [--quick]`` prints the tables and writes
``benchmarks/results/sampling_set[-quick].json``. Two measurements, each in alternating rounds
(plain, mixed, plain, mixed, ...) so the shared machine's load hits both alike:

- **engine**: 32 requests through ``HFEngine.step`` on the embedded SmolLM2-135M (fp32), every
  request generating the same number of tokens (``ignore_eos_token``); the mixed batch has a quarter
  of its rows with frequency/presence/repetition penalties and bad words, a quarter sampling with
  ``min_p``, a quarter asking for ``logprobs: 5`` and a quarter plain. The ratio is CPU seconds per
  token, mixed over plain (goal <= 1.05).
- **sampler**: ``sample_batch`` alone on random ``[32, 49152]`` logits, the same two batches: the
  sampler's own share of a step.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.common import context, print_table, rnd, setup_torch, write_report

BATCH = 32
MIXED: list[dict[str, Any]] = [
    {"frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.1, "bad_sequences": [" the"]},
    {"do_sample": True, "seed": 1, "min_p": 0.1, "temperature": 0.8},
    {"logprobs": 5},
    {},
]


def _engine() -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.model.embedded import embedded_model_dir

    path = str(embedded_model_dir())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return HFEngine(model, tok, max_batch_size=BATCH)


def _asks(mixed: bool) -> list[dict[str, Any]]:
    return [MIXED[i % len(MIXED)] if mixed else {} for i in range(BATCH)]


def engine_round(engine: Any, mixed: bool, tokens: int) -> dict[str, Any]:
    """Every request generates ``tokens`` tokens; CPU and wall time over the whole run."""
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.params.generation import GenerationParameters

    prompt = engine.tokenizer.encode("<|im_start|>user\nTell me about the sea.<|im_end|>\n<|im_start|>assistant\n")
    base = int(time.monotonic_ns() % 1_000_000_000)
    for i, ask in enumerate(_asks(mixed)):
        params = GenerationParameters.from_dict({"max_new_tokens": tokens, "ignore_eos_token": True, **ask})
        engine.add_request(EngineRequest(base + i, prompt, params))
    counts: dict[int, int] = {}
    wall, cpu = time.perf_counter(), time.process_time()
    while engine.has_unfinished():
        for out in engine.step():
            counts[out.request_id] = counts.get(out.request_id, 0) + 1
            if out.error or counts[out.request_id] >= tokens:
                engine.release(out.request_id)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    total = sum(counts.values())
    return {"batch": "mixed" if mixed else "plain", "tokens": total, "wall_s": rnd(wall, 3),
            "cpu_ms_per_token": rnd(cpu / total * 1e3, 3)}


def sampler_round(mixed: bool, steps: int) -> dict[str, Any]:
    """``sample_batch`` on random logits for ``steps`` steps (each row observes its tokens)."""
    import torch

    from djl_handlers.engines.hf.sampling import RowSampling, sample_batch
    from djl_handlers.params.generation import GenerationParameters

    vocab = 49152
    tokenizer = _WordTokenizer()
    rows = [RowSampling.from_params(GenerationParameters.from_dict(a), [1, 2, 3], vocab, (0,), tokenizer)
            for a in _asks(mixed)]
    top_n = [max(int(a.get("logprobs") or 0), 0) for a in _asks(mixed)]
    gen = torch.Generator().manual_seed(0)
    logits = [torch.randn(BATCH, vocab, generator=gen) * 4 for _ in range(4)]
    cpu = time.process_time()
    for step in range(steps):
        sample_batch(logits[step % 4], rows, top_n if any(top_n) else None)
    cpu = time.process_time() - cpu
    return {"batch": "mixed" if mixed else "plain", "steps": steps, "cpu_ms_per_step": rnd(cpu / steps * 1e3, 3)}


class _WordTokenizer:
    """Bad words for the sampler-only rounds: a word is its characters' codes (no model needed)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def _ratio(rows: list[dict[str, Any]], key: str) -> float | None:
    plain = [r[key] for r in rows if r["batch"] == "plain"]
    mixed = [r[key] for r in rows if r["batch"] == "mixed"]
    return rnd(sum(mixed) / sum(plain), 3) if plain and mixed else None


def run_benchmark(quick: bool) -> dict[str, Any]:
    engine = _engine()
    tokens, rounds, steps = (16, 2, 50) if quick else (48, 3, 200)
    engine_round(engine, True, 4)  # warm-up (first-call costs)
    engine_rows: list[dict[str, Any]] = []
    sampler_rows: list[dict[str, Any]] = []
    for _ in range(rounds):
        for mixed in (False, True):
            engine_rows.append(engine_round(engine, mixed, tokens))
            sampler_rows.append(sampler_round(mixed, steps))
    return {"engine": engine_rows, "sampler": sampler_rows, "tokens_per_request": tokens,
            "engine_ratio": _ratio(engine_rows, "cpu_ms_per_token"),
            "sampler_ratio": _ratio(sampler_rows, "cpu_ms_per_step")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    setup_torch()
    started = context()
    report = run_benchmark(args.quick)
    print_table(report["engine"], ["batch", "tokens", "wall_s", "cpu_ms_per_token"], "HF engine, 32 requests")
    print_table(report["sampler"], ["batch", "steps", "cpu_ms_per_step"], "sample_batch alone, [32, 49152]")
    print({"engine_ratio": report["engine_ratio"], "sampler_ratio": report["sampler_ratio"]})
    write_report("sampling_set", report, args.quick, started)


if __name__ == "__main__":
    main()
