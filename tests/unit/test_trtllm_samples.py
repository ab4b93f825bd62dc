"""``n``/``best_of`` on TensorRT-LLM against the fake ``tensorrt_llm`` package (it mirrors the LLM API:
one request with ``SamplingParams.n`` sequences, each response naming its ``sequence_index``, the
finish reason set on the request's final response): each sample reported under its own id, in sync
and async mode, and through the handler as ``details.best_of_sequences``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_trtllm_engine import fake_trt, make_engine, params, run  # noqa: F401 - fixture

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.params.translate import to_trtllm

OPTIONS = {"model_id": "toy", "rolling_batch": "trtllm"}
SAMPLING = {"do_sample": True, "seed": 11, "max_new_tokens": 6}


@pytest.fixture
def engine(fake_trt: Any) -> Iterator[Any]:  # noqa: F811
    eng = make_engine()
    yield eng
    eng.close()


def request(engine: Any, rid: int, sample_ids: tuple[int, ...], **kwargs: Any) -> EngineRequest:
    return EngineRequest(rid, engine.tokenizer.encode("Deep"), params(**kwargs), "Deep", sample_ids=sample_ids)


def test_translation_asks_for_every_sample_with_log_probs() -> None:
    from djl_handlers.params.generation import GenerationParameters

    p = GenerationParameters.from_dict({**SAMPLING, "n": 2, "best_of": 3}, engine="tensorrt_llm")
    kwargs = to_trtllm(p)
    assert kwargs["n"] == 3 and "best_of" not in kwargs and kwargs["logprobs"] == 1
    assert "n" not in to_trtllm(GenerationParameters.from_dict(SAMPLING, engine="tensorrt_llm"))


def test_each_sample_under_its_own_id_and_sample_zero_is_the_seeded_single_request(engine: Any) -> None:
    engine.add_request(request(engine, 1, (2, 3), n=3, **SAMPLING))
    per = run(engine)
    assert sorted(per) == [1, 2, 3]
    for outs in per.values():
        assert outs[-1].finish_reason is not None and all(o.error is None for o in outs)
        assert all(o.log_prob is not None for o in outs if o.finish_reason is None)
    # a sequence that reached max_tokens before the request's last response is closed by a final
    # output without a token then (the LLM API sets finish reasons on the last response only)
    tokens = {rid: [o.token_id for o in outs if o.token_id >= 0] for rid, outs in per.items()}
    assert all(len(t) == SAMPLING["max_new_tokens"] for t in tokens.values())
    assert len({tuple(t) for t in tokens.values()}) > 1  # the samples differ
    engine.add_request(request(engine, 9, (), **SAMPLING))
    assert [o.token_id for o in run(engine)[9]] == tokens[1]


def test_releasing_every_sample_aborts_the_request(engine: Any) -> None:
    engine.add_request(request(engine, 1, (2,), n=2, **{**SAMPLING, "max_new_tokens": 200}))
    engine.step()
    result = engine._requests[1].result
    engine.release(1)
    assert not result.aborted()  # sample 2 still runs
    engine.release(2)
    deadline = time.monotonic() + 5
    while not result.aborted():  # the abort runs on the adapter's event loop
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not engine.has_unfinished()


def test_async_mode_reports_every_sample(engine: Any) -> None:
    async def collect() -> dict[int, list[StepOutput]]:
        per: dict[int, list[StepOutput]] = {}
        async for outs in engine.generate_async(request(engine, 1, (2, 3), n=3, **SAMPLING)):
            for out in outs:
                per.setdefault(out.request_id, []).append(out)
        return per

    per = asyncio.run(collect())
    assert sorted(per) == [1, 2, 3]
    assert all(outs[-1].finish_reason is not None for outs in per.values())


def test_handler_returns_the_samples_as_best_of_sequences(fake_trt: Any) -> None:  # noqa: F811
    from djl_handlers.service import InferenceService
    from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

    service = InferenceService("tensorrt_llm")
    driver = RollingBatchDriver(service.handle)
    assert driver.init(dict(OPTIONS)) is None
    both = driver.submit(json_request({"inputs": "Deep", "parameters": {**SAMPLING, "n": 3, "details": True}}))
    greedy = driver.submit(json_request({"inputs": "Deep", "parameters": {"n": 2}}))
    plain = driver.submit(json_request({"inputs": "Deep", "parameters": {"max_new_tokens": 4}}))
    driver.run()
    service.engine.close()  # type: ignore[union-attr]
    body = json.loads(both.text)
    assert len(body["details"]["best_of_sequences"]) == 2
    assert greedy.code == 400 and "n" in (greedy.error or "")
    assert json.loads(plain.text)["generated_text"]
