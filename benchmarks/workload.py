"""The mixed workload: deterministic prompts of varied length and varied max_new_tokens."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TEXT = (
    "Deep learning is a branch of machine learning that trains neural networks with many layers. "
    "The capital of France is Paris, a city known for art, food and the river Seine. "
    "Once upon a time, in a quiet village by the sea, a young girl found a map to a hidden island. "
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules. "
    "The history of computing spans from mechanical calculators to modern microprocessors. "
)


@dataclass(frozen=True)
class Job:
    """One request of the workload."""

    prompt: str
    prompt_tokens: int
    max_new_tokens: int
    arrival_s: float


def mixed_workload(tokenizer: Any, n: int = 32, seed: int = 0, rate_per_s: float = 0.0,
                   prompt_range: tuple[int, int] = (16, 454), new_range: tuple[int, int] = (12, 123)) -> list[Job]:
    """``n`` jobs with prompt lengths and new-token budgets drawn uniformly from the ranges;
    arrivals are Poisson at ``rate_per_s`` (0: all at once)."""
    rng = random.Random(seed)
    ids = tokenizer.encode(TEXT * 40)
    jobs, t = [], 0.0
    for _ in range(n):
        plen = rng.randint(*prompt_range)
        start = rng.randrange(0, len(ids) - plen)
        prompt = tokenizer.decode(ids[start : start + plen])
        real = len(tokenizer.encode(prompt))
        jobs.append(Job(prompt, real, rng.randint(*new_range), t))
        if rate_per_s > 0:
            t += rng.expovariate(rate_per_s)
    return jobs


def decoding_engine(dtype: Any, prepare: Callable[[Any], None]) -> tuple[Any, Any]:
    """``(model, engine)``: the embedded model in ``dtype``, ``prepare(model)`` applied (the kernels a
    benchmark starts from), and an ``HFEngine`` (32 rows, 512-token prefill chunks) that has prefilled
    all 32 prompts of :func:`mixed_workload` and is decoding them (no request ends)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.model.embedded import embedded_model_dir
    from djl_handlers.params.generation import GenerationParameters

    folder = str(embedded_model_dir())
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    prepare(model)
    engine = HFEngine(model, tok, max_batch_size=32, max_prefill_tokens=512)
    for i, job in enumerate(mixed_workload(tok, n=32)):
        engine.add_request(EngineRequest(i, tok.encode(job.prompt), GenerationParameters(max_new_tokens=1000)))
    while engine._queue or engine._partial is not None:
        engine.step()
    assert engine._batch is not None
    return model, engine
