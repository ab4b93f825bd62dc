"""REAL vLLM on the CPU: LMI's stateful sessions on the vLLM entry point in DJL's async mode
(``AsyncModeClient``, as DJL's ``PythonAsyncEngine`` awaits the handler). Skipped unless vLLM's CPU
build is installed (see conftest.py).

Checked: NEW_SESSION answers LMI's body and session header; a request in the session answers as the
same request without one (vLLM's own prefix cache serves both; nothing is pinned); CLOSE answers
with the closed-session header; a closed or unknown session is LMI's 424.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture

from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncModeClient

HEADER = "X-Amzn-SageMaker-Session-Id"
OPTIONS = {"dtype": "fp32", "max_model_len": "1024", "max_rolling_batch_size": "4", "enforce_eager": "true",
           "gpu_memory_utilization": "0.3", "rolling_batch": "disable"}


@pytest.fixture(scope="module")
def client(embedded_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, AsyncModeClient]]:  # noqa: F811
    loop = asyncio.new_event_loop()
    service = InferenceService("vllm")
    async_client = AsyncModeClient(service.handle)
    root = tmp_path_factory.mktemp("vllm-sessions")
    init = async_client.init({"model_id": str(embedded_dir), "enable_stateful_sessions": "true",
                              "sessions_path": str(root), **OPTIONS})
    assert loop.run_until_complete(init) is None
    yield loop, async_client
    engine = getattr(service.engine, "engine", None)
    for obj in (getattr(engine, "engine_core", None), engine):
        if callable(getattr(obj, "shutdown", None)):
            obj.shutdown()
            break
    loop.close()


def test_sessions_on_the_vllm_entry_point(client: tuple[Any, AsyncModeClient]) -> None:
    loop, async_client = client
    created = loop.run_until_complete(async_client.request({"requestType": "NEW_SESSION"}))
    assert created.code == 200, created.text
    sid = created.headers[HEADER].split(";")[0]
    assert re.fullmatch(r"[0-9a-f-]{36}", sid) and created.text == f'{{"result": "Session {sid} created"}}\n'
    body = {"inputs": "The capital of France is", "parameters": {"max_new_tokens": 8}}
    used = loop.run_until_complete(async_client.request(body, **{HEADER: sid}))
    plain = loop.run_until_complete(async_client.request(body))
    assert used.code == 200 and used.json() == plain.json()
    closed = loop.run_until_complete(async_client.request({"requestType": "CLOSE"}, **{HEADER: sid}))
    assert closed.code == 200 and closed.headers["X-Amzn-SageMaker-Closed-Session-Id"] == sid
    gone = loop.run_until_complete(async_client.request(body, **{HEADER: sid}))
    assert gone.code == 424 and gone.error == f"Input parsing failed: session not found: {sid}"
