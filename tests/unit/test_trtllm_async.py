"""TensorRT-LLM in DJL's async mode against the fake ``tensorrt_llm`` package in tests/fakes: the
adapter awaited directly (``LLM.generate_async(..., streaming=True)`` on the caller's loop,
``RequestOutput.abort()``), and the handler answering as the rolling batch does. The fake mirrors
the LLM API; it proves nothing about the real TensorRT-LLM (see docs/engines.md)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.config.models import ServingConfig
from djl_handlers.engines.base import AsyncEngine, EngineRequest, StepOutput
from djl_handlers.errors import PromptTooLong
from djl_handlers.params.generation import GenerationParameters

FAKES = Path(__file__).resolve().parents[1] / "fakes"
OPTIONS = {"model_id": "toy", "rolling_batch": "trtllm"}


def _drop(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture
def fake_trt(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    _drop("tensorrt_llm")
    monkeypatch.syspath_prepend(str(FAKES))
    import tensorrt_llm

    assert getattr(tensorrt_llm, "IS_FAKE", False), tensorrt_llm.__file__
    yield tensorrt_llm
    _drop("tensorrt_llm")


@pytest.fixture
def engine(fake_trt: Any) -> Iterator[Any]:
    from djl_handlers.engines.external.trtllm import TrtLlmEngine

    config = ServingConfig.from_properties({**OPTIONS, "async_mode": "true"}, engine="tensorrt_llm")
    eng = TrtLlmEngine.from_config(config)
    yield eng
    eng.close()


def request(engine: Any, rid: int, prompt: str, **kwargs: Any) -> EngineRequest:
    params = GenerationParameters.from_dict(kwargs, engine="tensorrt_llm")
    return EngineRequest(rid, engine.tokenizer.encode(prompt), params, prompt)


async def collect(engine: Any, req: EngineRequest) -> list[StepOutput]:
    return [out async for group in engine.generate_async(req) for out in group]


def test_the_adapter_is_awaited_directly_without_its_own_thread(engine: Any) -> None:
    assert isinstance(engine, AsyncEngine)
    outs = asyncio.run(collect(engine, request(engine, 3, "Deep", max_new_tokens=5)))
    assert [o.token_id for o in outs] == [2, 3, 4, 5, 6]
    assert "".join(o.text or "" for o in outs) == " learning is a really cool"
    assert outs[-1].finish_reason == "length" and all(o.request_id == 3 for o in outs)
    assert engine._thread is None  # sync mode's adapter loop never started
    [params] = engine.llm.submitted.values()
    assert params.max_tokens == 5


def test_finishes_as_in_sync_mode(engine: Any) -> None:
    async def main() -> list[list[StepOutput]]:
        reqs = [request(engine, 1, "many"), request(engine, 2, "Deep", stop_sequences=["cool"])]
        return list(await asyncio.gather(*(collect(engine, r) for r in reqs)))

    eos, stop = asyncio.run(main())
    assert eos[-1].finish_reason == "eos_token" and "".join(o.text or "" for o in eos) == " people"
    assert stop[-1].finish_reason == "stop_sequence"
    assert "".join(o.text or "" for o in stop) == " learning is a really"
    assert not any("cool" in (o.text or "") for o in stop)  # never streamed


def test_prompt_too_long_is_its_400(engine: Any) -> None:
    long = request(engine, 1, "Deep", max_new_tokens=2048)
    with pytest.raises(PromptTooLong, match="TensorRT-LLM rejected the prompt"):
        asyncio.run(collect(engine, long))


def test_abort_async_and_closing_the_stream_abort_in_tensorrt_llm(engine: Any) -> None:
    async def main() -> tuple[list[StepOutput], Any]:
        engine.llm.iteration_s = 0.01
        first = engine.generate_async(request(engine, 1, "Deep", max_new_tokens=400, ignore_eos_token=True))
        head = await first.__anext__()
        await engine.abort_async(1)
        rest = [out async for group in first for out in group]
        second = engine.generate_async(request(engine, 2, "Deep", max_new_tokens=400, ignore_eos_token=True))
        await second.__anext__()
        result = engine._results[2]
        await second.aclose()
        await engine.abort_async(99)  # unknown: nothing happens
        return head + rest, result

    outs, closed = asyncio.run(main())
    assert outs[-1].error is not None and "cancelled" in outs[-1].error
    assert closed.aborted() and engine._results == {}


def test_handler_in_async_mode_answers_as_the_rolling_batch(fake_trt: Any) -> None:
    from djl_handlers.service import InferenceService
    from djl_handlers.testing.async_loop import AsyncModeClient
    from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

    payloads = [{"inputs": "Deep", "parameters": {"max_new_tokens": 6, "details": True}},
                {"inputs": "Deep", "stream": True, "parameters": {"max_new_tokens": 9, "stop": ["cool"]}},
                {"inputs": "Deep", "parameters": {"max_new_tokens": -1}}]

    async def run_async() -> list[Any]:
        service = InferenceService("tensorrt_llm")
        client = AsyncModeClient(service.handle)
        await client.init({**OPTIONS, "rolling_batch": "disable"})
        assert service.async_mode is not None and service.async_mode.driver is None
        answers = await asyncio.gather(*(client.request(p) for p in payloads))
        service.engine.close()  # type: ignore[union-attr]
        return [(a.code, a.text) for a in answers]

    service = InferenceService("tensorrt_llm")
    driver = RollingBatchDriver(service.handle)
    driver.init(dict(OPTIONS))
    reqs = [driver.submit(json_request(p)) for p in payloads]
    driver.run()
    service.engine.close()  # type: ignore[union-attr]
    expected = [(r.code or 200, r.text) for r in reqs]
    got = asyncio.run(run_async())
    assert got[:2] == expected[:2]
    assert got[2][0] == 400 and "max_new_tokens" in json.loads(got[2][1])["error"]
