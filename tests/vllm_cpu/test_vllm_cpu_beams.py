"""REAL vLLM on the CPU: beam search (``num_beams``, OpenAI ``use_beam_search``) through vLLM's own
beam-search loop in async mode, and the 400 of sync mode.

Skipped unless vLLM's CPU build is installed (see conftest.py). The reference is vLLM's loop itself,
called on the same ``AsyncLLM`` (what vLLM's OpenAI server answers for ``use_beam_search``): the
handler returns its sequences, best first, under the right choices (OpenAI) and its best beam with
LMI's finish reason (an eos-ended beam shows its eos token, as every LMI answer does).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture

from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncModeClient
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

PROMPT = "The capital of France is"
N = 6
OPTIONS = {"dtype": "fp32", "max_model_len": "512", "max_rolling_batch_size": "8", "enforce_eager": "true",
           "gpu_memory_utilization": "0.3"}


def _model_dir(embedded: Path) -> str:
    return os.environ.get("DJL_HANDLERS_VLLM_MODEL") or str(embedded)


def _shutdown(service: InferenceService) -> None:
    engine = getattr(service.engine, "engine", None)
    for obj in (getattr(engine, "engine_core", None), engine):
        if callable(getattr(obj, "shutdown", None)):
            obj.shutdown()
            return


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def client(embedded_dir: Path, loop: asyncio.AbstractEventLoop) -> Iterator[tuple[AsyncModeClient, Any]]:  # noqa: F811
    service = InferenceService("vllm")
    client = AsyncModeClient(service.handle)
    init = client.init({"model_id": _model_dir(embedded_dir), "rolling_batch": "disable", "async_mode": "true",
                        **OPTIONS})
    assert loop.run_until_complete(init) is None
    yield client, service
    _shutdown(service)


def _vllm_loop(service: Any, loop: asyncio.AbstractEventLoop, ids: list[int], width: int) -> list[list[int]]:
    """vLLM's own beam search on the same engine: each returned beam's tokens (best first)."""
    from vllm.sampling_params import BeamSearchParams

    from djl_handlers.engines.external.vllm_beams import searcher

    async def main() -> list[list[int]]:
        params = BeamSearchParams(beam_width=width, max_tokens=N, temperature=0.0)
        prompt = {"type": "token", "prompt_token_ids": ids}
        outs = [o async for o in searcher(service.engine.engine).beam_search(prompt, "reference", params)]
        return [list(c.token_ids) for c in outs[-1].outputs]

    return loop.run_until_complete(main())


def test_openai_use_beam_search_returns_vllms_beams(client: tuple[AsyncModeClient, Any],
                                                   loop: asyncio.AbstractEventLoop) -> None:
    handler, service = client
    tok = service.engine.tokenizer
    ids = tok.encode(PROMPT)
    answer = loop.run_until_complete(handler.request(
        {"prompt": PROMPT, "max_tokens": N, "use_beam_search": True, "n": 3}))
    assert answer.code in (None, 200), answer.text
    choices = sorted(json.loads(answer.text)["choices"], key=lambda c: c["index"])
    want = _vllm_loop(service, loop, ids, 3)
    assert [c["text"] for c in choices] == [tok.decode(t, skip_special_tokens=True) for t in want]
    assert len({c["text"] for c in choices}) == 3


def test_lmi_num_beams_best_is_vllms_best(client: tuple[AsyncModeClient, Any],
                                          loop: asyncio.AbstractEventLoop) -> None:
    handler, service = client
    tok = service.engine.tokenizer
    ids = tok.encode(PROMPT)
    answer = loop.run_until_complete(handler.request(
        {"inputs": PROMPT, "parameters": {"num_beams": 2, "max_new_tokens": N, "details": True}}))
    details = json.loads(answer.text)["details"]
    got = [t["id"][0] if isinstance(t["id"], list) else t["id"] for t in details["tokens"]]
    best = _vllm_loop(service, loop, ids, 2)[0]
    if details["finish_reason"] == "eos_token":  # vLLM leaves the eos out of the tokens; LMI shows it
        assert got[:-1] == best and got[-1] == tok.eos_token_id
    else:
        assert got == best and details["finish_reason"] == "length" and len(got) == N


def test_sync_mode_refuses_beams_naming_the_field(embedded_dir: Path) -> None:  # noqa: F811
    service = InferenceService("vllm")
    driver = RollingBatchDriver(service.handle)
    assert driver.init({"model_id": _model_dir(embedded_dir), "rolling_batch": "vllm", **OPTIONS}) is None
    try:
        beams = driver.submit(json_request({"inputs": PROMPT, "parameters": {"num_beams": 2}}))
        plain = driver.submit(json_request({"inputs": PROMPT, "parameters": {"max_new_tokens": 3}}))
        driver.run()
    finally:
        _shutdown(service)
    assert beams.code == 400 and "num_beams" in (beams.error or "") and "async_mode" in (beams.error or "")
    assert json.loads(plain.text)["generated_text"]
