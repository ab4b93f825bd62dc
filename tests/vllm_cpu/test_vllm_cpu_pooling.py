"""REAL vLLM on the CPU: embeddings on ``djl_handlers.vllm`` (vLLM's pooling runner), sync and async.

Skipped unless vLLM's CPU build is installed (see conftest.py). The model is the embedded
all-MiniLM-L6-v2 (vLLM's CPU build runs BERT pooling); the reference is vLLM's own ``LLM.embed`` on
the same folder with its defaults. Checked: the handler's vectors in rolling-batch (sync) mode and in
async mode equal ``LLM.embed``'s (cosine >= 0.99999), a bad request fails alone with a 400 naming the
field, and a reranker task is refused at load naming ``option.task``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from djl_handlers.errors import ConfigError
from djl_handlers.io.inputs import Input
from djl_handlers.io.wire import binary_decode
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

pytestmark = pytest.mark.slow

TEXTS = ["A man is eating food.", "A man is riding a horse.", "Pasta with tomato sauce",
         "The weather in the mountains changes quickly in the afternoon " * 40]  # over 256 tokens: truncated
OPTIONS = {"task": "text_embedding", "dtype": "fp32", "enforce_eager": "true", "gpu_memory_utilization": "0.3",
           "max_rolling_batch_size": "8"}


@pytest.fixture(scope="module")
def minilm() -> Path:
    from djl_handlers.errors import ConfigError as Missing
    from djl_handlers.model.embedder import embedder_dir

    try:
        return embedder_dir()
    except Missing as exc:
        pytest.skip(exc.message)


@pytest.fixture(scope="module")
def reference(minilm: Path) -> Any:
    from vllm import LLM

    llm = LLM(model=str(minilm), runner="pooling", dtype="float32", enforce_eager=True, gpu_memory_utilization=0.3)
    cut = {"truncation": True, "max_length": 256}  # vLLM refuses an over-long prompt unless told to cut it
    vectors = np.asarray([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False, tokenization_kwargs=cut)])
    del llm
    return vectors


def _cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def test_sync_mode_equals_llm_embed(minilm: Path, reference: Any) -> None:
    service = InferenceService("vllm")
    driver = RollingBatchDriver(service.handle)
    driver.init({"model_id": str(minilm), "rolling_batch": "vllm", **OPTIONS})
    good = driver.submit(json_request({"inputs": TEXTS}))
    bad = driver.submit(json_request({"inputs": ["fine", 3]}))
    driver.run()
    assert _cosine(json.loads(good.text), reference) >= 0.99999
    assert bad.code == 400 and "inputs[1]" in (bad.error or "")


def test_async_mode_equals_llm_embed(minilm: Path, reference: Any) -> None:
    async def run() -> Any:
        service = InferenceService("vllm")
        init = Input.from_parts({"model_id": str(minilm), "rolling_batch": "disable", "async_mode": "true",
                                 **OPTIONS}, ())
        assert await service.handle(init) is None
        item = Input.from_parts({"Content-Type": "application/json", "request_tracking_id": "r1"},
                                [("data", json.dumps({"inputs": TEXTS}).encode())])
        reply = await service.handle(item)
        return json.loads(binary_decode(bytes(reply.content.value_at(0)))["data"])

    assert _cosine(asyncio.run(run()), reference) >= 0.99999


def test_a_reranker_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        InferenceService("vllm").handle(Input.from_parts({"model_id": str(tmp_path), "task": "rerank",
                                                          "rolling_batch": "vllm"}, ()))
    assert caught.value.field == "option.task"
