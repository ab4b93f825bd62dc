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


def greedy_texts(path: Any, prompts: tuple[str, ...] | list[str],
                 new_tokens: int) -> dict[str, tuple[list[int], str]]:
    """prompt -> (new token ids, text) of transformers' ``generate(do_sample=False)`` in fp32 on the
    model at ``path``: the reference one vLLM rank, several ranks and the HF engine must equal."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out: dict[str, tuple[list[int], str]] = {}
    with torch.inference_mode():
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt").input_ids
            gen = model.generate(ids, do_sample=False, max_new_tokens=new_tokens, pad_token_id=tok.eos_token_id)
            new = gen[0, ids.shape[1]:].tolist()
            out[prompt] = (new, tok.decode(new, skip_special_tokens=True))
    del model
    return out


# The documented agreement of a lower-precision path with fp32, teacher-forced over fp32's greedy text: the
# same argmax wherever fp32's two best logits are at least AGREEMENT_GAP apart.
AGREEMENT_GAP = 0.5
AGREEMENT_PROMPTS = ("The capital of France is", "Deep learning is", "def fibonacci(n):",
                     "The three primary colors are", "My favourite book is", "Dear hiring manager,")


def decided_agreement(want: Any, got: Any, label: str) -> tuple[int, int]:
    """Asserts ``got``'s argmax equals ``want``'s (fp32 logits, one row per position) wherever fp32 is
    decided (:data:`AGREEMENT_GAP`); returns (decided positions, positions whose argmax differs)."""
    import torch

    want, got = want.float(), got.float()
    assert bool(torch.isfinite(got).all())
    top = want.topk(2).values
    clear = (top[:, 0] - top[:, 1]) >= AGREEMENT_GAP
    same = want.argmax(-1) == got.argmax(-1)
    assert bool(same[clear].all()), (label, (top[:, 0] - top[:, 1])[clear & ~same])
    return int(clear.sum()), int((~same).sum())
