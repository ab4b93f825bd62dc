"""One greedy rule for every engine, over HTTP: ``do_sample: true, temperature: 0`` is greedy.

Each case serves a model directory with ``djl-handlers serve`` (a real worker process) and sends
two identical temperature-0 requests; both must answer exactly the greedy text (the same
request with ``do_sample: false``), and a real sampling request must differ from it (so the test
would notice an engine that ignores parameters altogether). HF and DeepSpeed run on the tiny
random Llama in both batching modes; vLLM and TensorRT-LLM run their adapters against the fakes in
``tests/fakes`` (whose toy model samples when its sampling parameters say so).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401
from test_server_harness import ServerProcess

FAKES = Path(__file__).resolve().parents[1] / "fakes"
PROMPT = "Deep learning is"
GREEDY = {"max_new_tokens": 8}
ZERO = {"max_new_tokens": 8, "do_sample": True, "temperature": 0}
SAMPLE = {"max_new_tokens": 8, "do_sample": True, "temperature": 1.5, "seed": 7}

# (case id, entry point, extra options, uses the tiny model, needs a module)
CASES = [
    ("hf-rolling", "djl_handlers.huggingface", "option.rolling_batch=scheduler", True, None),
    ("hf-dynamic", "djl_handlers.huggingface", "option.rolling_batch=disable\nbatch_size=2", True, None),
    ("deepspeed-rolling", "djl_handlers.deepspeed", "option.rolling_batch=deepspeed", True, "deepspeed"),
    ("deepspeed-dynamic", "djl_handlers.deepspeed", "option.rolling_batch=disable", True, "deepspeed"),
    ("vllm-fake", "djl_handlers.vllm", "option.rolling_batch=vllm", False, None),
    ("trtllm-fake", "djl_handlers.tensorrt_llm", "option.rolling_batch=trtllm", False, None),
]


@pytest.fixture(params=CASES, ids=[c[0] for c in CASES])
def server(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerProcess]:
    name, entry, extra, tiny, module = request.param
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    if tiny:
        model_id = str(request.getfixturevalue("tiny_dir"))
        extra += "\noption.dtype=fp32"
    else:
        model_id = "toy"
        monkeypatch.setenv("PYTHONPATH", str(FAKES))  # the worker imports the fake library
    model_dir = tmp_path / name
    model_dir.mkdir()
    (model_dir / "serving.properties").write_text(
        f"engine=Python\noption.entryPoint={entry}\noption.model_id={model_id}\n{extra}\n", encoding="utf-8"
    )
    proc = ServerProcess(model_dir, tmp_path / "server.log")
    try:
        yield proc
    finally:
        proc.stop()


def _text(server: ServerProcess, params: dict[str, object]) -> str:
    with server.client() as client:
        response = client.post("/invocations", json={"inputs": PROMPT, "parameters": params})
    assert response.status_code == 200, response.text
    body = json.loads(response.text)
    if isinstance(body, list):  # dynamic batch answers a list
        body = body[0]
    return str(body["generated_text"])


def test_temperature_zero_is_greedy_for_every_engine_and_mode(server: ServerProcess) -> None:
    greedy = _text(server, GREEDY)
    assert greedy
    assert [_text(server, ZERO), _text(server, ZERO)] == [greedy, greedy]
    assert _text(server, SAMPLE) != greedy  # sampling really samples on this engine
