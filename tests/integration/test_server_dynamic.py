"""Local server with the fake dynamic-batch echo model: routes, request mapping, batching, errors."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_server_harness import ServerProcess, module_server

dynamic = module_server("fake_dynamic")


def _echo(response: object) -> dict:
    return json.loads(response.content)  # type: ignore[attr-defined]


def test_ping_models_and_describe(dynamic: ServerProcess) -> None:
    with dynamic.client() as client:
        ping = client.get("/ping")
        assert ping.status_code == 200
        assert ping.json() == {"fake_dynamic": {"status": "Healthy"}}
        listing = client.get("/models").json()
        assert listing["models"][0]["modelName"] == "fake_dynamic"
        assert listing["models"][0]["status"] == "READY"
        described = client.get("/models/fake_dynamic").json()[0]
        assert described["mode"] == "dynamic"
        assert described["batchSize"] == 4
        assert described["workers"][0]["pid"] > 0
        assert client.get("/models/nope").status_code == 404


def test_init_call_carries_options_and_model_dir(dynamic: ServerProcess) -> None:
    with dynamic.client() as client:
        body = _echo(client.post("/invocations", content=b"{}"))
    init = body["init"]
    assert init["fake_flag"] == "dyn"
    assert init["entryPoint"] == "model.py"
    assert init["handler"] == "handle"
    assert init["device_id"] == "-1"
    assert init["model_dir"].endswith("fake_dynamic")
    assert "batch_size" not in init  # a server setting, not an option: DJL does not send it
    assert body["cwd"] == init["model_dir"]


def test_headers_become_properties_and_query_becomes_content(dynamic: ServerProcess) -> None:
    with dynamic.client() as client:
        response = client.post("/invocations?alpha=1&beta=two", content=b'{"inputs": "hi"}',
                               headers={"X-Custom": "v1", "Content-Type": "application/json",
                                        "X-Amzn-SageMaker-Custom-Attributes": "k1=a;k2=b"})
    assert response.status_code == 200
    body = _echo(response)
    props = {k.lower(): v for k, v in body["properties"].items()}
    assert props["x-custom"] == "v1"
    assert props["content-type"] == "application/json"
    assert props["k1"] == "a" and props["k2"] == "b"
    assert body["content"]["data"] == '{"inputs": "hi"}'
    assert body["content"]["alpha"] == "1"
    assert body["content"]["beta"] == "two"
    assert body["top"]["handler"] == "handle"


def test_predictions_route_and_unknown_model(dynamic: ServerProcess) -> None:
    with dynamic.client() as client:
        assert client.post("/predictions/fake_dynamic", content=b"x").status_code == 200
        missing = client.post("/predictions/other", content=b"x")
        assert missing.status_code == 404
        assert missing.json()["type"] == "ModelNotFoundException"
        versioned = client.post("/predictions/fake_dynamic/1", content=b"x")  # no version, as on DJL
        assert versioned.status_code == 404
        assert versioned.json()["type"] == "ModelNotFoundException"


@pytest.mark.parametrize("headers", [{"handler": "evil"}, {"X-Amzn-SageMaker-Custom-Attributes": "a=1; Handler=evil"}],
                         ids=["header", "custom-attribute"])
def test_handler_header_is_rejected(dynamic: ServerProcess, headers: dict[str, str]) -> None:
    with dynamic.client() as client:
        response = client.post("/invocations", content=b"{}", headers=headers)
    assert response.status_code == 400
    assert response.json()["code"] == 400
    assert "handler" in response.json()["message"]


def test_body_over_20_mib_is_413(dynamic: ServerProcess) -> None:
    with dynamic.client() as client:
        response = client.post("/invocations", content=b"x" * (20 * 1024 * 1024 + 1))
    assert response.status_code == 413
    assert response.json()["code"] == 413


def test_concurrent_requests_are_batched_with_own_content_type(dynamic: ServerProcess) -> None:
    def call(index: int) -> tuple[int, str, dict]:
        with dynamic.client() as client:
            response = client.post("/invocations", content=f'{{"n": {index}}}'.encode(),
                                   headers={"x-want-type": f"application/x-test-{index}"})
            return response.status_code, response.headers["content-type"], _echo(response)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, range(4)))
    sizes = [body["batch_size"] for _, _, body in results]
    assert max(sizes) > 1, sizes  # 4 concurrent requests within max_batch_delay=300 ms share a frame
    for index, (status, content_type, body) in enumerate(results):
        assert status == 200
        assert content_type == f"application/x-test-{index}"
        assert body["content"]["data"] == f'{{"n": {index}}}'


def test_handler_errors_map_to_djl_codes(dynamic: ServerProcess) -> None:
    with dynamic.client() as client:
        failed = client.post("/invocations", content=b"{}", headers={"x-fake-action": "raise"})
        assert failed.status_code == 424
        assert failed.json()["error"] == "fake handler failure"
        oom = client.post("/invocations", content=b"{}", headers={"x-fake-action": "oom"})
        assert oom.status_code == 507
        empty = client.post("/invocations", content=b"{}", headers={"x-fake-action": "none"})
        assert empty.status_code == 204
        assert empty.content == b""


def test_metrics_expose_counts(dynamic: ServerProcess) -> None:
    with dynamic.client() as client:
        client.post("/invocations", content=b"{}")
        text = client.get("/metrics").text
    assert 'djl_handlers_requests_total{code="200",model="fake_dynamic"}' in text  # prometheus-client sorts labels
    assert "djl_handlers_e2e_request_latency_seconds_bucket" in text
    assert 'djl_handlers_worker_up{model="fake_dynamic"} 1' in text
    assert "djl_handlers_queue_depth" in text
