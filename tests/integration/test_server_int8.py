"""``djl-handlers serve`` with ``option.quantize=dynamic_int8`` (tiny random Llama on the CPU): the
load log reports the int8 layers, and concurrent greedy requests answer as each does alone."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401
from test_server_harness import ServerProcess

pytestmark = pytest.mark.slow

PROPS = """engine=Python
option.entryPoint=djl_handlers.huggingface
option.model_id={model}
option.dtype=fp32
option.rolling_batch=scheduler
option.max_rolling_batch_size=8
option.quantize=dynamic_int8
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[ServerProcess]:  # noqa: F811
    root = tmp_path_factory.mktemp("int8")
    folder = root / "model"
    folder.mkdir()
    (folder / "serving.properties").write_text(PROPS.format(model=tiny_dir))
    started = ServerProcess(folder, root / "server.log")
    try:
        yield started
    finally:
        started.stop()


def _post(server: ServerProcess, prompt: str) -> tuple[int, Any]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 24, "do_sample": False, "details": True}}
    with server.client() as client:
        response = client.post("/invocations", json=body)
    return response.status_code, response.json()


def test_the_load_log_reports_the_int8_layers(server: ServerProcess) -> None:
    assert _post(server, "Hello")[0] == 200
    log = server.log_path.read_text(encoding="utf-8")
    assert "CPU patch cpu_linear: applied:" in log and "as int8 (option.quantize=dynamic_int8" in log, log[-3000:]


def test_concurrent_requests_answer_as_each_alone(server: ServerProcess) -> None:
    prompts = ["Deep learning is", "The capital of France is", "Hello there", "One two three", "Paris", "x"]
    alone = [_post(server, p) for p in prompts]
    assert all(status == 200 for status, _ in alone)
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: _post(server, p), prompts))
    assert [body["generated_text"] for _, body in together] == [body["generated_text"] for _, body in alone]
    assert all(body["details"]["generated_tokens"] == 24 for _, body in together)
