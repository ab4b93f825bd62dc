"""REAL vLLM on the CPU: requests with several samples (``n`` > 1) leave nothing behind in vLLM,
whether every sample finishes (at different steps, on a stop string) or the client goes away
mid-stream, in sync mode (the handler driven like DJL's rolling-batch loop, over ``LLMEngine``) and
in async mode (awaited like DJL's ``PythonAsyncEngine``, over ``AsyncLLM``). One engine at a time.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture

from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncAnswer, AsyncModeClient
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

pytestmark = pytest.mark.slow

OPTIONS = {"dtype": "fp32", "max_model_len": "1024", "max_rolling_batch_size": "8", "enforce_eager": "true",
           "gpu_memory_utilization": "0.3"}
# an OpenAI completions stream of three samples that would run for 600 tokens each
LONG = {"prompt": "Deep learning is", "n": 3, "stream": True, "temperature": 1.0, "seed": 3, "max_tokens": 600,
        "ignore_eos": True}
# three samples that stop on the first "." each, at different steps
STOPPING = {"inputs": "Once upon a time", "parameters": {"n": 3, "do_sample": True, "temperature": 1.0, "seed": 4,
                                                         "max_new_tokens": 60, "stop_sequences": ["."]}}


def _shutdown(service: InferenceService) -> None:
    engine = getattr(service.engine, "engine", None)
    for obj in (getattr(engine, "engine_core", None), engine):
        if callable(getattr(obj, "shutdown", None)):
            obj.shutdown()
            return


def _check_stopping(text: str) -> None:
    body = json.loads(text)
    sequences = [body, *body["details"]["best_of_sequences"]]
    assert len(sequences) == 3
    for seq in sequences:
        reason = seq["finish_reason"] if "finish_reason" in seq else seq["details"]["finish_reason"]
        assert reason in ("stop_sequence", "eos_token", "length")
        assert "." not in seq["generated_text"]  # vLLM cut the stop string, sample by sample


def _stream_choices(chunks: list[str]) -> set[int]:
    indexes = set()
    for line in "".join(chunks).splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            indexes |= {c["index"] for c in json.loads(line[5:])["choices"]}
    return indexes


def test_sync_mode_samples_finish_or_cancel_and_vllm_holds_nothing(embedded_dir: Path) -> None:  # noqa: F811
    service = InferenceService("vllm")
    driver = RollingBatchDriver(service.handle)
    assert driver.init({"model_id": str(embedded_dir), "rolling_batch": "vllm", **OPTIONS}) is None
    try:
        long = driver.submit(json_request(LONG))
        stopping = driver.submit(json_request(STOPPING))
        while len(long.chunks) < 4:
            driver.step()
        long.cancel = True  # the client went away: DJL's cancel property on the next step
        driver.run()
        engine = service.engine
        assert long.done and stopping.done and stopping.code is None, stopping.error
        _check_stopping(stopping.text)
        assert _stream_choices(long.chunks) == {0, 1, 2} and len(long.chunks) < 100
        assert not engine.has_unfinished()
        assert not engine.engine.has_unfinished_requests()  # vLLM aborted the cancelled samples
    finally:
        _shutdown(service)


def test_async_mode_samples_finish_or_cancel_and_vllm_holds_nothing(embedded_dir: Path) -> None:  # noqa: F811
    loop = asyncio.new_event_loop()
    service = InferenceService("vllm")
    client = AsyncModeClient(service.handle)
    init = {"model_id": str(embedded_dir), "rolling_batch": "disable", "async_mode": "true", **OPTIONS}
    try:
        assert loop.run_until_complete(client.init(init)) is None
        llm: Any = service.engine.engine  # type: ignore[union-attr]

        async def main() -> tuple[AsyncAnswer, AsyncAnswer]:
            answer = AsyncAnswer()
            task = asyncio.ensure_future(client.stream(LONG, answer, tracking_id="cancel-me"))
            stopping = asyncio.ensure_future(client.request(STOPPING))
            while len(answer.records) < 4:
                await asyncio.sleep(0.01)
            await client.cancel("cancel-me")
            await asyncio.wait_for(task, 60)
            done = await asyncio.wait_for(stopping, 300)
            deadline = time.monotonic() + 30
            while llm.get_num_unfinished_requests() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return answer, done

        answer, stopping = loop.run_until_complete(main())
        assert answer.done and len(answer.records) < 100
        assert stopping.code == 200, stopping.error
        _check_stopping(stopping.text)
        assert llm.get_num_unfinished_requests() == 0  # vLLM aborted the cancelled samples
    finally:
        _shutdown(service)
        pending = asyncio.all_tasks(loop)  # AsyncLLM's output task, ended before the loop closes
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()
