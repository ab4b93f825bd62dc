"""Drive the HF engine and ``generate()`` over the same prompts, for tests that compare them.

``tests/`` is on ``sys.path`` while pytest runs: ``from engine_runs import engine_tokens, generate_tokens``.
"""

from __future__ import annotations

from typing import Any


def engine_tokens(model: Any, tok: Any, prompts: list[list[int]], news: list[int],
                  max_prefill_tokens: int = 16) -> dict[int, list[int]]:
    """Greedy tokens of each prompt through ``HFEngine`` on ``model``: one request joins per step
    (rows of different lengths share the batch), each released at its ``news[i]`` tokens."""
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.params.generation import GenerationParameters

    engine = HFEngine(model, tok, max_prefill_tokens=max_prefill_tokens)
    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    for i, (ids, n) in enumerate(zip(prompts, news, strict=True)):
        engine.add_request(EngineRequest(i, ids, GenerationParameters(max_new_tokens=n)))
        for out in engine.step():
            got[out.request_id].append(int(out.token_id))
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id].append(int(out.token_id))
            if len(got[out.request_id]) >= news[out.request_id]:
                engine.release(out.request_id)
    return got


def generate_tokens(model: Any, prompts: list[list[int]], news: list[int]) -> list[list[int]]:
    """Greedy tokens of each prompt alone through ``model.generate()`` (exactly ``news[i]`` of them)."""
    import torch

    with torch.inference_mode():
        return [model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(ids):]
                .tolist() for ids, n in zip(prompts, news, strict=True)]
