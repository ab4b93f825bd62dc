"""REAL vLLM on the CPU: ``decoder_input_details`` / ``top_n_tokens`` from vLLM's ``prompt_logprobs`` /
``logprobs`` through our adapter, and the HF engine's vLLM sampling set (penalties, bad words)
choosing what vLLM chooses for the same request on the same fp32 model.

Run with ``.venv-vllm/bin/python -m pytest tests/vllm_cpu/test_vllm_cpu_logprobs.py`` (see
``test_vllm_cpu.py`` for the setup); one vLLM engine and one HF engine are built for the module.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture
from test_vllm_cpu import ENGINE_OPTIONS, _model_dir, _shutdown

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.params.generation import GenerationParameters

PROMPT = "The capital of France is"
N = 10


@pytest.fixture(scope="module")
def engines(embedded_dir: Path) -> Iterator[dict[str, Any]]:  # noqa: F811
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.registry import load_engine_class

    made: dict[str, Any] = {}
    for name, extra in (("vllm", ENGINE_OPTIONS), ("huggingface", {"rolling_batch": "auto", "dtype": "fp32"})):
        config = ServingConfig.from_properties({"model_id": _model_dir(embedded_dir), **extra}, engine=name)
        made[name] = load_engine_class(config.serving_engine).from_config(config)
    yield made
    _shutdown(made["vllm"].engine)


def run(engine: Any, engine_name: str, rid: int, **parameters: Any) -> list[StepOutput]:
    params = GenerationParameters.from_dict({"max_new_tokens": N, **parameters}, engine=engine_name)
    engine.add_request(EngineRequest(rid, engine.tokenizer.encode(PROMPT), params, PROMPT))
    outs: list[StepOutput] = []
    deadline = time.monotonic() + 180
    while len(outs) < N and not (outs and (outs[-1].finish_reason or outs[-1].error)):
        assert time.monotonic() < deadline
        outs += [o for o in engine.step() if o.request_id == rid]
    engine.release(rid)
    assert all(o.error is None for o in outs), outs[-1].error
    return outs


def test_vllm_prompt_and_top_log_probs_match_the_hf_engine(engines: dict[str, Any]) -> None:
    asks = {"decoder_input_details": True, "top_n_tokens": 3}
    ours = run(engines["huggingface"], "huggingface", 1, **asks)
    theirs = run(engines["vllm"], "vllm", 2, **asks)
    assert [o.token_id for o in theirs] == [o.token_id for o in ours]
    vp, hp = theirs[0].prompt_logprobs, ours[0].prompt_logprobs
    assert vp is not None and hp is not None and vp[0] is None and len(vp) == len(hp)
    assert vp[1:] == pytest.approx(hp[1:], abs=2e-3)
    assert theirs[0].prompt_top_tokens is not None and len(theirs[0].prompt_top_tokens[1] or ()) == 3
    for v, h in zip(theirs, ours, strict=True):
        assert v.top_tokens is not None and h.top_tokens is not None
        assert [t for t, _ in v.top_tokens] == [t for t, _ in h.top_tokens]
        assert [lp for _, lp in v.top_tokens] == pytest.approx([lp for _, lp in h.top_tokens], abs=2e-3)
        assert v.top_tokens[0][0] == v.token_id  # greedy: the chosen token is the most likely


@pytest.mark.parametrize("asks", [
    {"frequency_penalty": 1.2, "presence_penalty": 0.8, "repetition_penalty": 1.1},
    {"bad_sequences": [" Paris", " the"], "min_new_tokens": N},
])
def test_the_hf_sampling_set_chooses_what_vllm_chooses(engines: dict[str, Any], asks: dict[str, Any]) -> None:
    ours = [o.token_id for o in run(engines["huggingface"], "huggingface", 3, **asks)]
    theirs = [o.token_id for o in run(engines["vllm"], "vllm", 4, **asks)]
    plain = [o.token_id for o in run(engines["huggingface"], "huggingface", 5)]
    assert ours == theirs
    assert ours != plain  # the parameters changed the output
