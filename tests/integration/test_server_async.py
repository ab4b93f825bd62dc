"""``djl-handlers serve`` in DJL's async mode on the HF engine (tiny random Llama, fp32, greedy):
the same bytes as sync rolling mode for every format, concurrency, a bad neighbour, cancellation."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401
from test_server_harness import ServerProcess
from test_server_harness import wait_until as _wait

pytestmark = pytest.mark.slow
ROBUSTNESS_MODELS = Path(__file__).resolve().parents[1] / "robustness" / "models"

PROPS = """engine=Python
option.entryPoint=djl_handlers.huggingface
option.model_id={model}
option.dtype=fp32
option.max_rolling_batch_size=8
"""


def _model(tmp_path: Path, tiny: Path, extra: str) -> Path:
    folder = tmp_path / extra.split("=")[0].replace(".", "_")
    folder.mkdir()
    (folder / "serving.properties").write_text(PROPS.format(model=tiny) + extra + "\n")
    return folder


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[dict[str, ServerProcess]]:  # noqa: F811
    root = tmp_path_factory.mktemp("async-servers")
    started: dict[str, ServerProcess] = {}
    try:
        for name, extra in (("async", "option.async_mode=true"), ("sync", "option.rolling_batch=scheduler")):
            started[name] = ServerProcess(_model(root, tiny_dir, extra), root / f"{name}.log")
        yield started
    finally:
        for server in started.values():
            server.stop()


REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/invocations", {"inputs": "Deep learning is", "parameters": {"max_new_tokens": 12, "details": True}}),
    ("/invocations", {"inputs": "The capital of France is", "stream": True, "parameters": {"max_new_tokens": 8}}),
    ("/invocations", {"inputs": "Hello", "stream": True,
                      "parameters": {"max_new_tokens": 6, "details": True, "output_formatter": "sse"}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 7,
                              "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me"}], "max_tokens": 5, "stream": True,
                              "temperature": 0}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}),
    ("/generate", {"inputs": "Paris is", "parameters": {"max_new_tokens": 6}}),
    ("/generate_stream", {"inputs": "Paris is", "parameters": {"max_new_tokens": 4}}),
]


def _post(server: ServerProcess, route: str, body: dict[str, Any]) -> tuple[int, str, str]:
    with server.client() as client:
        response = client.post(route, json=body, timeout=120)
        return response.status_code, response.headers.get("content-type", ""), response.text


def _normalised(text: str) -> str:
    """OpenAI bodies carry an id and a creation time of their own: drop those fields."""
    out = []
    for line in text.splitlines():
        raw = line[len("data: "):] if line.startswith("data: ") else line
        try:
            value = json.loads(raw)
        except ValueError:
            out.append(line)
            continue
        if isinstance(value, dict):
            value.pop("id", None)
            value.pop("created", None)
        out.append(json.dumps(value, sort_keys=True))
    return "\n".join(out)


@pytest.mark.parametrize(("route", "body"), REQUESTS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(REQUESTS)])
def test_async_mode_answers_byte_for_byte_as_sync_rolling(servers: dict[str, ServerProcess], route: str,
                                                           body: dict[str, Any]) -> None:
    a = _post(servers["async"], route, body)
    s = _post(servers["sync"], route, body)
    assert a[0] == s[0] == 200
    assert a[1] == s[1]
    if route.startswith("/v1/"):
        assert _normalised(a[2]) == _normalised(s[2])
    else:
        assert a[2] == s[2]


def test_concurrent_requests_and_a_bad_neighbour(servers: dict[str, ServerProcess]) -> None:
    bodies = [{"inputs": f"Request number {i} says", "stream": i % 2 == 0,
               "parameters": {"max_new_tokens": 4 + i}} for i in range(10)]
    bodies[3] = {"inputs": "bad", "parameters": {"max_new_tokens": -1}}
    with ThreadPoolExecutor(10) as pool:
        got = list(pool.map(lambda b: _post(servers["async"], "/invocations", b), bodies))
    expected = [_post(servers["sync"], "/invocations", b) for b in bodies]
    for index, (answer, reference) in enumerate(zip(got, expected, strict=True)):
        assert answer == reference, index
    assert got[3][0] == 400 and "max_new_tokens" in got[3][2]


def test_mode_is_reported(servers: dict[str, ServerProcess]) -> None:
    with servers["async"].client() as client:
        described = client.get(f"/models/{servers['async'].name}").json()
    text = json.dumps(described)
    assert "async" in text


def test_client_that_goes_away_is_cancelled(tmp_path: Path) -> None:
    """The fake engine at 50 ms a step (the tiny model finishes before a client can leave)."""
    model = tmp_path / "fake_lmi"
    shutil.copytree(ROBUSTNESS_MODELS / "fake_lmi", model, ignore=shutil.ignore_patterns("__pycache__"))
    with open(model / "serving.properties", "a", encoding="utf-8") as handle:
        handle.write("\noption.rolling_batch=disable\noption.async_mode=true\noption.fake_step_delay=0.05\n")
    server = ServerProcess(model, tmp_path / "server.log")
    try:
        body = {"inputs": "Count forever", "stream": True, "parameters": {"max_new_tokens": 2000}}
        with server.client() as client, client.stream("POST", "/invocations", json=body, timeout=60) as response:
            for _ in zip(range(3), response.iter_lines(), strict=False):
                pass

        def metric(name: str) -> float:
            with server.client() as client:
                text = client.get("/metrics").text
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

        _wait(lambda: metric("djl_handlers_cancelled_total") >= 1, "the cancellation to be counted", timeout=30)
        _wait(lambda: metric("djl_handlers_num_requests_running") == 0, "the request to leave", timeout=30)
        status, _, text = _post(server, "/invocations", {"inputs": "after", "parameters": {"max_new_tokens": 3}})
        assert status == 200 and json.loads(text)["generated_text"]
    finally:
        server.stop()
