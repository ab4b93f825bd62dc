"""Our HF handler in DJL's async mode, on DJL Serving's real front end (0.34 and 0.36).

With ``option.async_mode=true`` DJL's ``PythonAsyncEngine`` hands every request to the handler
alone and awaits it (``djl_handlers/async_mode.py``). On each release the tiny model (fp32, greedy)
must become ready and answer JSON, jsonlines streaming and concurrent requests with the same bytes
(texts, for concurrent requests) as sync rolling mode (``option.rolling_batch=scheduler``) on the
same release, and a bad request (``max_new_tokens=-1``) with a 400 naming ``max_new_tokens`` while a
concurrent good request succeeds. On 0.36, ``SERVING_FEATURES=vllm`` without ``option.rolling_batch``
makes DJL choose async mode itself (``rolling_batch=disable`` + ``option.async_mode=true``): our HF
entry point must serve it.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401
from djl_server_fixture import (  # noqa: F401  (djl_server_fixture registers the fixture)
    DJL_VERSIONS,
    DjlServer,
    DjlServerFactory,
    djl_server_fixture,
    version_param,
)

pytestmark = [pytest.mark.djl]

PROPS = """engine=Python
option.entryPoint=djl_handlers.huggingface
option.model_id={model}
option.dtype=fp32
option.predict_timeout=120
option.max_rolling_batch_size=8
minWorkers=1
maxWorkers=1
"""
MODES = {"async": "option.async_mode=true\n", "sync": "option.rolling_batch=scheduler\n", "vllm-feature": ""}
JSON_BODY = {"inputs": "Deep learning is", "parameters": {"max_new_tokens": 12, "details": True}}
STREAM_BODY = {"inputs": "The capital of France is", "stream": True, "parameters": {"max_new_tokens": 8}}
CONCURRENT = [
    {"inputs": prompt, "parameters": {"max_new_tokens": n}}
    for prompt, n in (("Deep learning is", 10), ("The capital of France is", 6), ("Hello, my name is", 14),
                      ("Once upon a time", 8), ("1, 2, 3,", 12), ("The weather today", 5))
]
GOOD_NEIGHBOUR = {"inputs": "Once upon a time", "parameters": {"max_new_tokens": 16}}
BAD = {"inputs": "Deep learning is", "parameters": {"max_new_tokens": -1}}
Reply = tuple[int, str, Any]  # status, media type, parsed body


def _post(server: DjlServer, body: dict[str, Any]) -> Reply:
    resp = httpx.post(server.url + "/invocations", json=body, timeout=120)
    kind = (resp.headers.get("content-type") or "").split(";")[0].strip()
    if kind == "application/jsonlines":
        return resp.status_code, kind, [json.loads(line) for line in resp.text.splitlines() if line.strip()]
    try:
        return resp.status_code, kind, resp.json()
    except ValueError:
        return resp.status_code, kind, resp.text


def _concurrently(server: DjlServer, bodies: list[dict[str, Any]]) -> list[Reply]:
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: _post(server, body), bodies))


def _text(reply: Reply) -> str:
    status, _, body = reply
    assert status == 200 and isinstance(body, dict), reply
    return str(body["generated_text"])


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> dict[str, Path]:  # noqa: F811
    root = tmp_path_factory.mktemp("djl-async")
    dirs = {}
    for name, extra in MODES.items():
        folder = root / name
        folder.mkdir()
        (folder / "serving.properties").write_text(PROPS.format(model=tiny_dir.resolve()) + extra, encoding="utf-8")
        dirs[name] = folder
    return dirs


@pytest.fixture(scope="module", params=[version_param(v) for v in DJL_VERSIONS])
def release(request: pytest.FixtureRequest) -> str:
    """The DJL Serving release (tests are grouped by it: one server start per release and mode)."""
    return str(request.param)


_SYNC_REPLIES: dict[str, dict[str, Any]] = {}


@pytest.fixture()
def sync(release: str, djl_server: DjlServerFactory, model_dirs: dict[str, Path]) -> dict[str, Any]:
    """The replies of sync rolling mode (``rolling_batch=scheduler``) on the same release, one by one."""
    if release not in _SYNC_REPLIES:
        server = djl_server(model_dirs["sync"], version=release)
        _SYNC_REPLIES[release] = {
            "json": _post(server, JSON_BODY),
            "stream": _post(server, STREAM_BODY),
            "texts": [_text(_post(server, body)) for body in CONCURRENT],
            "neighbour": _text(_post(server, GOOD_NEIGHBOUR)),
        }
    return _SYNC_REPLIES[release]


@pytest.fixture()
def server(sync: dict[str, Any], release: str, djl_server: DjlServerFactory, model_dirs: dict[str, Path]) -> DjlServer:
    """The async-mode server of the release (started after the sync replies are known)."""
    return djl_server(model_dirs["async"], version=release)


def test_async_mode_is_what_runs(server: DjlServer, release: str) -> None:
    assert server.model_settings().get("option.async_mode") == "true"
    log = server.log_path.read_text(encoding="utf-8", errors="replace") if server.log_path else ""
    assert "Creating new python process in async mode" in log, server.log_tail()
    assert "engine ready (huggingface, async mode)" in log, server.log_tail()


def test_json_equals_sync_rolling(server: DjlServer, sync: dict[str, Any]) -> None:
    reply = _post(server, JSON_BODY)
    assert reply[:2] == (200, "application/json"), reply
    assert reply == sync["json"]
    assert reply[2]["details"]["generated_tokens"] == 12


def test_jsonlines_stream_equals_sync_rolling(server: DjlServer, sync: dict[str, Any]) -> None:
    reply = _post(server, STREAM_BODY)
    assert reply[:2] == (200, "application/jsonlines"), reply
    lines = reply[2]
    assert len(lines) == 8 and all("token" in line for line in lines)
    assert lines[-1]["generated_text"] == "".join(line["token"]["text"] for line in lines)
    assert reply == sync["stream"]


def test_concurrent_requests_keep_their_greedy_texts(server: DjlServer, sync: dict[str, Any]) -> None:
    replies = _concurrently(server, CONCURRENT)
    assert [_text(r) for r in replies] == sync["texts"]


def test_bad_request_is_a_400_beside_a_good_one(server: DjlServer, sync: dict[str, Any]) -> None:
    good, bad = _concurrently(server, [GOOD_NEIGHBOUR, BAD])
    status, kind, body = bad
    assert status == 400, bad
    assert "max_new_tokens" in json.dumps(body), bad
    assert _text(good) == sync["neighbour"]
    assert _text(_post(server, GOOD_NEIGHBOUR)) == sync["neighbour"]  # the worker still serves


@pytest.mark.parametrize("release", [version_param("0.36")], indirect=True)
def test_vllm_feature_without_rolling_batch_is_async_mode_on_036(
    release: str, sync: dict[str, Any], djl_server: DjlServerFactory, model_dirs: dict[str, Path]
) -> None:
    """DJL 0.36: ``auto`` + ``SERVING_FEATURES=vllm`` → ``rolling_batch=disable`` + async mode, and
    our HF entry point serves it with sync rolling mode's bytes."""
    server = djl_server(model_dirs["vllm-feature"], version=release, SERVING_FEATURES="vllm")
    settings = server.model_settings()
    assert (settings.get("option.rolling_batch"), settings.get("option.async_mode")) == ("disable", "true")
    log = server.log_path.read_text(encoding="utf-8", errors="replace") if server.log_path else ""
    assert "engine ready (huggingface, async mode)" in log, server.log_tail()
    assert _post(server, JSON_BODY) == sync["json"]
    assert _post(server, STREAM_BODY) == sync["stream"]
