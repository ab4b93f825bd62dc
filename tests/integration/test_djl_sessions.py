"""LMI's stateful sessions on DJL Serving's real front end (0.34 and 0.36) (async mode, HF engine with prefix
caching): create, use, close and unknown sessions answer with LMI's status codes,
headers and bodies, as ``djl-handlers serve`` does (``test_server_sessions.py``).

The model is the embedded SmolLM2 (``option.embedded_model``, no ``model_id``): DJL's
``LmiConfigRecommender`` sets ``load_on_devices=0`` (GPU 0) and ``maxWorkers=1`` for
``option.enable_stateful_sessions=true`` when it finds the model's ``config.json``, so a model it can
see fails to load on a machine without a GPU ("No GPU device detected"); it does not look into the
embedded model, which then loads on the CPU.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest_models import embedded_dir  # noqa: F401  (converted before DJL starts)
from djl_server_fixture import (  # noqa: F401  (djl_server_fixture registers the fixture)
    DJL_VERSIONS,
    DjlServer,
    DjlServerFactory,
    djl_server_fixture,
    version_param,
)

pytestmark = [pytest.mark.djl, pytest.mark.slow]

HEADER = "X-Amzn-SageMaker-Session-Id"
CLOSED = "X-Amzn-SageMaker-Closed-Session-Id"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
PROPS = """engine=Python
option.entryPoint=djl_handlers.huggingface
option.embedded_model=smollm2-135m-instruct
option.dtype=fp32
option.predict_timeout=120
option.async_mode=true
option.rolling_batch=disable
option.enable_prefix_caching=true
option.enable_stateful_sessions=true
option.sessions_path={root}
minWorkers=1
maxWorkers=1
"""


@pytest.fixture(scope="module", params=[version_param(v) for v in DJL_VERSIONS])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path,  # noqa: F811
           djl_server: DjlServerFactory) -> tuple[DjlServer, Path]:
    folder = tmp_path_factory.mktemp("djl-sessions")
    root = tmp_path_factory.mktemp("djl-sessions-root")
    (folder / "serving.properties").write_text(PROPS.format(root=root), encoding="utf-8")
    return djl_server(folder, version=str(request.param)), root


def _post(server: DjlServer, body: dict[str, Any], session: str | None = None) -> httpx.Response:
    headers = {HEADER: session} if session is not None else {}
    return httpx.post(server.url + "/invocations", json=body, headers=headers, timeout=120)


def test_create_use_close_and_unknown_as_lmi(server: tuple[DjlServer, Path]) -> None:
    djl, root = server
    created = _post(djl, {"requestType": "NEW_SESSION"})
    assert created.status_code == 200, created.text
    found = re.fullmatch(rf"({UUID}); Expires=\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created.headers[HEADER])
    assert found, created.headers
    sid = found.group(1)
    assert created.text == f'{{"result": "Session {sid} created"}}\n'
    assert (root / sid).is_dir()
    body = {"inputs": "Deep learning is", "parameters": {"max_new_tokens": 5}}
    used, plain = _post(djl, body, sid), _post(djl, body)
    assert used.status_code == 200 and used.json() == plain.json()
    unknown = _post(djl, {"inputs": "Hi"}, "nope")
    assert unknown.status_code == 424
    assert unknown.json() == {"code": 424, "error": "Input parsing failed: session not found: nope"}
    closed = _post(djl, {"requestType": "CLOSE"}, sid)
    assert closed.status_code == 200 and closed.headers[CLOSED] == sid
    assert closed.text == f'{{"result": "Session {sid} closed"}}\n'
    assert not (root / sid).exists()
    again = _post(djl, {"requestType": "CLOSE"}, sid)
    assert again.status_code == 424 and again.json()["error"] == f"Input parsing failed: session not found: {sid}"
