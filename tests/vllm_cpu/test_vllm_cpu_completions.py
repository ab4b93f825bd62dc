"""REAL vLLM on the CPU: OpenAI completions as evaluation clients send them (a list of token-id
prompts, ``echo``, ``logprobs: N``, ``max_tokens`` 0 and 2) through ``djl_handlers.vllm`` in DJL's
async mode — one engine request per prompt on vLLM's ``AsyncLLM``, their streams merged into one
answer — equal to the HF handler's answer on the same fp32 model (texts, tokens, log-probs within
2e-3), non-streamed and streamed.

Run with ``.venv-vllm/bin/python -m pytest tests/vllm_cpu/test_vllm_cpu_completions.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture
from test_vllm_cpu_async import OPTIONS, _model_dir, _shutdown

from djl_handlers.io import Input
from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncModeClient
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

PROMPTS = ["The capital of France is", "One, two, three,"]


@pytest.fixture(scope="module")
def tokenizer(embedded_dir: Path) -> Any:  # noqa: F811
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_model_dir(embedded_dir))


@pytest.fixture(scope="module")
def hf(embedded_dir: Path) -> InferenceService:  # noqa: F811
    service = InferenceService("huggingface")
    init = {"model_id": _model_dir(embedded_dir), "dtype": "fp32", "rolling_batch": "auto"}
    assert service.handle(Input.from_parts(init, ())) is None
    return service


@pytest.fixture(scope="module")
def vllm_async(embedded_dir: Path) -> Iterator[tuple[AsyncModeClient, asyncio.AbstractEventLoop]]:  # noqa: F811
    loop = asyncio.new_event_loop()
    service = InferenceService("vllm")
    client = AsyncModeClient(service.handle)
    options = {k: v for k, v in OPTIONS.items() if not k.endswith("lora") and k not in ("max_loras", "max_lora_rank")}
    init = client.init({"model_id": _model_dir(embedded_dir), "rolling_batch": "disable", **options})
    assert loop.run_until_complete(init) is None
    yield client, loop
    _shutdown(service)
    loop.close()


def _hf_answer(service: InferenceService, body: dict[str, Any]) -> str:
    driver = RollingBatchDriver(service.handle)
    request = driver.submit(json_request(body))
    driver.run()
    assert request.code is None, request.error
    return request.text


def _choices(text: str) -> list[dict[str, Any]]:
    """The choices of a body or of an SSE stream (a stream's chunks joined per index)."""
    if not text.startswith("data: "):
        return list(json.loads(text)["choices"])
    joined: dict[int, dict[str, Any]] = {}
    for event in text.strip().split("\n\n"):
        if event == "data: [DONE]":
            continue
        for c in json.loads(event[6:])["choices"]:
            into = joined.setdefault(c["index"], {"index": c["index"], "text": "", "logprobs": {
                "tokens": [], "token_logprobs": [], "top_logprobs": []}})
            into["text"] += c["text"]
            for key in ("tokens", "token_logprobs", "top_logprobs"):
                into["logprobs"][key] += c["logprobs"][key]
    return [joined[i] for i in sorted(joined)]


@pytest.mark.parametrize(("max_tokens", "stream"), [(0, False), (2, False), (2, True)])
def test_prompt_lists_with_echo_equal_the_hf_engine(hf: InferenceService, tokenizer: Any, max_tokens: int,
                                                    stream: bool,
                                                    vllm_async: tuple[AsyncModeClient, Any]) -> None:
    client, loop = vllm_async
    body = {"prompt": [tokenizer.encode(p) for p in PROMPTS], "echo": True, "logprobs": 2, "temperature": 0,
            "max_tokens": max_tokens, "stream": stream}
    theirs = _choices(loop.run_until_complete(client.request(body)).text)
    ours = _choices(_hf_answer(hf, body))
    assert [c["index"] for c in theirs] == [0, 1]
    assert [c["text"] for c in theirs] == [c["text"] for c in ours]
    for a, b in zip(theirs, ours, strict=True):
        assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
        assert a["logprobs"]["token_logprobs"][0] is None and a["logprobs"]["top_logprobs"][0] is None
        assert a["logprobs"]["token_logprobs"][1:] == pytest.approx(b["logprobs"]["token_logprobs"][1:], abs=2e-3)
        for top_a, top_b in zip(a["logprobs"]["top_logprobs"][1:], b["logprobs"]["top_logprobs"][1:], strict=True):
            assert set(top_a) == set(top_b)
