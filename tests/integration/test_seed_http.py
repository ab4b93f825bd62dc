"""The seed is resolved once: over HTTP, greedy replies report no seed, sampling replies the seed
they sampled with (the client's, else the one the server sent with the request)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_server_harness import ServerProcess

FAKE_LMI = Path(__file__).resolve().parents[1] / "robustness" / "models" / "fake_lmi"


@pytest.fixture(scope="module")
def lmi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``djl-handlers serve`` on the real pipeline over the fake engine (no ML library)."""
    base = tmp_path_factory.mktemp("fake_lmi")
    model = base / "fake_lmi"
    shutil.copytree(FAKE_LMI, model, ignore=shutil.ignore_patterns("__pycache__"))
    props = model / "serving.properties"
    props.write_text(props.read_text().replace("option.fake_step_delay=0.002", ""), encoding="utf-8")
    server = ServerProcess(model, base / "server.log")
    yield server
    server.stop()


def _tgi_seed(server: ServerProcess, **params: object) -> object:
    with server.client() as client:
        response = client.post("/generate", json={"inputs": "x", "parameters": {"max_new_tokens": 2, "details": True,
                                                                                **params}})
    assert response.status_code == 200, response.text
    return json.loads(response.text)[0]["details"]["seed"]


def _stream_seed(server: ServerProcess, **params: object) -> object:
    with server.client() as client:
        response = client.post("/generate_stream", json={"inputs": "x", "parameters": {"max_new_tokens": 2,
                                                                                       "details": True, **params}})
    last = [line for line in response.text.split("\n\n") if line][-1]
    return json.loads(last[len("data:"):])["details"]["seed"]


def test_greedy_reports_no_seed_even_with_the_servers_seed(lmi: ServerProcess) -> None:
    assert _tgi_seed(lmi) is None
    assert _tgi_seed(lmi, seed=5) is None  # greedy decoding uses no seed, whoever set one
    assert _stream_seed(lmi) is None


def test_sampling_reports_the_seed_it_used(lmi: ServerProcess) -> None:
    assert _tgi_seed(lmi, do_sample=True, seed=5) == 5
    server_seed = _tgi_seed(lmi, do_sample=True)
    assert isinstance(server_seed, int) and 0 <= server_seed < 2**32
    assert isinstance(_stream_seed(lmi, do_sample=True), int)
