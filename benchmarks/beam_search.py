"""Beam search on the HF engine against transformers' ``generate(num_beams=4)`` over the same prompts.

``python -m benchmarks.beam_search [--quick] [--rounds N]`` prints the table and writes
``benchmarks/results/beam_search[-quick].json``. On the embedded SmolLM2-135M (fp32), 32 chat
prompts of different lengths, 4 beams each, ``max_new_tokens`` tokens at most (eos ends a beam as
usual), four ways in one process:

- **engine, stock modules**: all 32 requests through ``HFEngine.step`` at once (32 x 4 = 128 beam
  rows; the batch limit is set to hold them), the prompt of each prefilled once and forked into its
  beams, on the same model object as ``generate()`` (no CPU kernel patches): its texts must equal
  the one-at-a-time texts (asserted);
- **engine as served**: the same, on an engine loaded as ``djl-handlers serve`` loads the model
  directory (``HFEngine.from_config``: its CPU kernels, oneDNN linear layers): what a user gets;
  its texts are counted against the one-at-a-time texts (other kernels sum in another order, so a
  near tie between two beams may swap);
- **static**: one ``generate(num_beams=4)`` call on the 32 prompts left-padded into one batch;
- **one at a time**: ``generate(num_beams=4)`` per prompt, the reference text (run once).

The engines and the static batch run ``--rounds`` times in turn (the order rotating), so each ratio
is taken within a round, seconds apart, and the median over rounds is printed: on a shared machine
the speed of the same code drifts from one minute to the next. The static batch's texts are counted
too (left padding changes its fp32 sums a little). Printed ratios: generated tokens per second of
each engine over the static batch (goal >= 1.5) and over one at a time.
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


def served_engine(count: int) -> Any:
    """An HF engine loaded from the embedded model directory as ``djl-handlers serve`` loads it (its
    CPU kernels), with room for ``count`` beam requests."""
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.model.embedded import embedded_model_dir

    props = {"model_id": str(embedded_model_dir()), "rolling_batch": "scheduler", "dtype": "fp32",
             "max_rolling_batch_size": str(BEAMS * count), "max_prefill_tokens": "4096"}
    return HFEngine.from_config(ServingConfig.from_properties(props, engine="huggingface"))


def engine_run(model: Any, tok: Any, ids: list[list[int]], tokens: int,
               engine: Any = None) -> tuple[list[list[int]], float]:
    """Every prompt a beam request in one engine (a new one on ``model`` unless ``engine`` is given);
    each one's tokens and the wall time."""
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.params.generation import GenerationParameters

    if engine is None:
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


def run_benchmark(quick: bool, rounds: int) -> dict[str, Any]:
    import statistics

    from djl_handlers.engines.hf.engine import HFEngine

    model, tok = _model()
    eos = sorted(HFEngine(model, tok).eos_token_ids)  # the engine's eos ids, for generate() too
    count, tokens = (8, 12) if quick else (32, 24)
    ids = [tok.encode(p) for p in prompts(count)]
    served = served_engine(count)
    engine_run(model, tok, ids[:2], 2)  # warm-up (first-call costs)
    engine_run(model, tok, ids[:2], 2, served)
    wall = time.perf_counter()
    alone_tokens = [_generate(model, tok, [p], tokens, eos)[0] for p in ids]
    alone_s = time.perf_counter() - wall
    runs: dict[str, Any] = {
        "engine": lambda: engine_run(model, tok, ids, tokens),
        "served": lambda: engine_run(model, tok, ids, tokens, served),
        "static": lambda: _timed(lambda: _generate(model, tok, ids, tokens, eos)),
    }
    per_round: list[dict[str, Any]] = []
    texts: dict[str, list[list[int]]] = {}
    for r in range(rounds):
        names = list(runs)
        names = names[r % len(names):] + names[: r % len(names)]
        got = {}
        for name in names:
            out, seconds = runs[name]()
            texts[name] = out
            got[name] = {"seconds": seconds, "tokens": sum(len(t) for t in out)}
        assert texts["engine"] == alone_tokens, "the engine's beams differ from generate() alone"
        rate = {name: got[name]["tokens"] / got[name]["seconds"] for name in got}
        per_round.append({"round": r + 1, "order": names, **{f"{n}_s": rnd(got[n]["seconds"], 2) for n in got},
                          "engine_over_static": rnd(rate["engine"] / rate["static"], 2),
                          "served_over_static": rnd(rate["served"] / rate["static"], 2)})
    generated = sum(len(t) for t in alone_tokens)

    def median_s(name: str) -> float:
        return statistics.median(float(r[f"{name}_s"]) for r in per_round)

    def same(name: str) -> int:
        return sum(a == b for a, b in zip(texts[name], alone_tokens, strict=True))

    labels = {"engine": "engine, stock modules (continuous batch)", "served": "engine as served (its CPU kernels)",
              "static": "generate, one static batch"}
    rows = [{"run": labels[n], "seconds": rnd(median_s(n), 2), "tokens": sum(len(t) for t in texts[n]),
             "tokens_per_s": rnd(sum(len(t) for t in texts[n]) / median_s(n), 2), "same_as_alone": same(n)}
            for n in runs]
    rows.append({"run": "generate, one at a time", "seconds": rnd(alone_s, 2), "tokens": generated,
                 "tokens_per_s": rnd(generated / alone_s, 2), "same_as_alone": count})
    alone_rate = generated / alone_s
    return {"rows": rows, "rounds": per_round, "requests": count, "beams": BEAMS, "max_new_tokens": tokens,
            "engine_over_static": rnd(statistics.median(r["engine_over_static"] for r in per_round), 2),
            "served_over_static": rnd(statistics.median(r["served_over_static"] for r in per_round), 2),
            "engine_over_one_at_a_time": rnd(rows[0]["tokens_per_s"] / alone_rate, 2),
            "served_over_one_at_a_time": rnd(rows[1]["tokens_per_s"] / alone_rate, 2)}


def _timed(call: Any) -> tuple[Any, float]:
    wall = time.perf_counter()
    out = call()
    return out, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="engine / static rounds (ratios: their median)")
    args = parser.parse_args()
    setup_torch()
    started = context()
    report = run_benchmark(args.quick, max(1, args.rounds))
    print_table(report["rows"], ["run", "seconds", "tokens", "tokens_per_s", "same_as_alone"],
                f"beam search, {report['requests']} requests x {report['beams']} beams (median seconds over rounds)")
    print_table(report["rounds"], list(report["rounds"][0]), "rounds")
    print({k: report[k] for k in ("engine_over_static", "served_over_static", "engine_over_one_at_a_time",
                                  "served_over_one_at_a_time")})
    write_report("beam_search", report, args.quick, started)


if __name__ == "__main__":
    main()
