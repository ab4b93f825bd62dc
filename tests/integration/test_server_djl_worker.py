"""Interchangeability: ``djl-handlers serve`` driving DJL's own ``djl_python_engine.py`` worker.

Uses the djl_python copy extracted by the DJL harness (``tests/djl_serving/lib/python``) and the
harness's echo models written against ``djl_python``; skipped when that copy is absent.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_server_harness import ROOT, ServerProcess

DJL_PYTHON = ROOT / "tests" / "djl_serving" / "lib" / "python"
ENGINE = DJL_PYTHON / "djl_python_engine.py"
DJL_MODELS = ROOT / "tests" / "djl_serving" / "models"

pytestmark = pytest.mark.skipif(not ENGINE.is_file(), reason=f"DJL's worker script not found at {ENGINE}")


@pytest.fixture
def djl_worker_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make the server start DJL's worker, with djl_python importable."""
    monkeypatch.setenv("DJL_HANDLERS_WORKER_SCRIPT", str(ENGINE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(DJL_PYTHON)]))
    yield


def _serve(tmp_path: Path, name: str) -> ServerProcess:
    model = tmp_path / name
    shutil.copytree(DJL_MODELS / name, model, ignore=shutil.ignore_patterns("__pycache__"))
    return ServerProcess(model, tmp_path / "server.log")


def test_rolling_batch_with_djl_worker(tmp_path: Path, djl_worker_env: None) -> None:
    server = _serve(tmp_path, "echo_rb")
    try:
        def call(words: str) -> tuple[int, str]:
            with server.client() as client:
                response = client.post("/invocations", content=json.dumps({"inputs": words}).encode())
                return response.status_code, response.text

        prompts = ["alpha beta gamma", "one two", "x y z w v"]
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(call, prompts))
        for prompt, (status, text) in zip(prompts, results, strict=True):
            assert status == 200
            assert text.split() == prompt.split()
        with server.client() as client:
            failed = client.post("/invocations", content=json.dumps({"inputs": "a b", "mode": "code"}).encode())
        assert failed.status_code >= 400
        assert json.loads(failed.text)["code"] == failed.status_code
    finally:
        assert server.stop() == 0


def test_dynamic_batch_with_djl_worker(tmp_path: Path, djl_worker_env: None) -> None:
    server = _serve(tmp_path, "echo")
    try:
        def call(index: int) -> dict:
            with server.client() as client:
                response = client.post("/invocations?q=1", content=json.dumps({"n": index}).encode(),
                                       headers={"content-type": "application/json"})
                assert response.status_code == 200
                return json.loads(response.content)

        with ThreadPoolExecutor(2) as pool:
            bodies = list(pool.map(call, range(2)))
        assert {body["echo"]["n"] for body in bodies} == {0, 1}
        assert all(body["batch_size"] == 2 for body in bodies)
        assert bodies[0]["content_keys"] == ["q", "data"]
        assert bodies[0]["init"]["echo_marker"] == "from-serving-properties"
    finally:
        assert server.stop() == 0
