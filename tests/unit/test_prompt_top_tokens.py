"""Each prompt position's top N on the HF engine (``decoder_input_details`` with ``top_n_tokens``,
what OpenAI's ``echo`` with ``logprobs: N`` shows): equal to a direct forward of the tiny model,
whether the prompt is prefilled at once or in chunks, beside a request that asks for neither and
one that asks for the prompt's log-probs alone."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.base import EngineRequest  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model, tiny_dir

PROMPT = "One two three four five six seven eight nine ten eleven twelve"


@pytest.mark.parametrize("prefill_budget", [512, 5])  # 5: the prompt is prefilled in chunks
def test_prompt_top_tokens_equal_a_direct_forward(tiny_model: Any, prefill_budget: int) -> None:
    model, tok = tiny_model
    ids = tok.encode(PROMPT)
    engine = HFEngine(model, tok, max_prefill_tokens=prefill_budget)
    asks = [{"decoder_input_details": True, "top_n_tokens": 3}, {}, {"decoder_input_details": True}]
    for i, extra in enumerate(asks):
        engine.add_request(EngineRequest(i, ids, GenerationParameters(max_new_tokens=1, **extra)))
    first: dict[int, Any] = {}
    for _ in range(100):
        for out in engine.step():
            assert out.error is None, out.error
            first.setdefault(out.request_id, out)
            engine.release(out.request_id)
        if len(first) == len(asks):
            break
    assert first[1].prompt_top_tokens is None and first[2].prompt_top_tokens is None
    top = list(first[0].prompt_top_tokens or [])
    assert len(top) == len(ids) and top[0] is None
    with torch.inference_mode():
        lsm = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    for j in range(1, len(ids)):
        values, want = torch.topk(lsm[j - 1], 3)
        assert [t for t, _ in top[j]] == want.tolist()
        assert [lp for _, lp in top[j]] == pytest.approx(values.tolist(), abs=1e-4)
    assert first[0].prompt_logprobs == first[2].prompt_logprobs  # asking for the top N changes nothing else
