"""The routes peers' clients call (``/v1/models``, ``/health``, ``/info``, ``/tokenize``,
``/detokenize``) read by the real openai and huggingface_hub clients, the API key and CORS, on
``djl-handlers serve`` with the real pipeline on the fake engine (``tests/robustness/models``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest_models import embedded_dir, tiny_dir, tiny_model  # noqa: F401 - fixtures
from test_server_harness import MODELS, ROOT, ServerProcess

from djl_handlers.engines.fake import REPLY

FAKE = ROOT / "tests" / "robustness" / "models" / "fake_lmi"
KEY = "s3cret-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(FAKE, tmp_path_factory.mktemp("surface") / "server.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """API key from the environment, CORS for one origin."""
    proc = ServerProcess(FAKE, tmp_path_factory.mktemp("locked") / "server.log",
                         args=("--allowed-origins", "http://app.example"), env={"DJL_HANDLERS_API_KEY": KEY})
    yield proc
    proc.stop()


@pytest.fixture
def hub_online_for_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub refuses every URL in offline mode, even 127.0.0.1; our server is local."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def test_openai_client_lists_the_model(server: ServerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    models = client.models.list().data
    assert [m.id for m in models] == [server.name]
    assert models[0].owned_by == "djl-handlers" and models[0].object == "model"
    raw = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert raw["root"] == str(FAKE) and raw["parent"] is None and raw["max_model_len"] == 2048


def test_health_and_info_through_huggingface_hub(server: ServerProcess, hub_online_for_loopback: None) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=server.url, provider="hf-inference")  # a URL: no hub call
    assert client.health_check() is True
    info = client.get_endpoint_info()
    assert info["max_total_tokens"] == 2048 and info["max_input_tokens"] == 2047
    assert info["model_dtype"] == "torch.float32" and info["model_device_type"] == "cpu"
    assert info["model_id"] == str(FAKE) and info["version"]
    assert httpx.get(server.url + "/health").content == b""


def test_vllm_tokenize_and_detokenize(server: ServerProcess) -> None:
    with server.client() as client:
        reply = client.post("/tokenize", json={"model": "any", "prompt": "héllo", "return_token_strs": True})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["tokens"] == list("héllo".encode()) and body["count"] == 6 and body["max_model_len"] == 2048
        assert len(body["token_strs"]) == 6
        back = client.post("/detokenize", json={"model": "any", "tokens": body["tokens"]})
        assert back.json() == {"prompt": "héllo"}
        chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        assert bytes(chat["tokens"]).decode() == "<user>hi<assistant>"  # the model's chat template
        cont = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}],
                                              "add_generation_prompt": True, "continue_final_message": True})
        assert cont.status_code == 400 and cont.json()["error"]["param"] == "continue_final_message"


def test_tgi_tokenize_offsets(server: ServerProcess) -> None:
    with server.client() as client:
        tokens = client.post("/tokenize", json={"inputs": "ab c"}).json()
    assert tokens == [{"id": ord(ch), "text": ch, "start": i, "stop": i + 1} for i, ch in enumerate("ab c")]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {"prompt": 3}, "prompt"),
    ("/tokenize", {"prompt": "x", "extra": 1}, "extra"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": "12"}, "tokens"),
])
def test_vllm_query_errors_are_openai_errors_naming_the_field(server: ServerProcess, path: str,
                                                               body: dict[str, Any], param: str) -> None:
    reply = httpx.post(server.url + path, json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and param in error["message"]


def test_tgi_tokenize_error_is_tgi_shaped(server: ServerProcess) -> None:
    reply = httpx.post(server.url + "/tokenize", json={"inputs": ["x"]})
    assert reply.status_code == 400
    assert reply.json() == {"error": "inputs must be a string", "error_type": "validation"}


def test_a_handler_without_queries_answers_501(tmp_path: Path) -> None:
    proc = ServerProcess(MODELS / "fake_rolling", tmp_path / "server.log")
    try:
        reply = httpx.post(proc.url + "/tokenize", json={"prompt": "x"})
        assert reply.status_code == 501 and "djl_handlers_query" in reply.json()["message"]
        listed = httpx.get(proc.url + "/v1/models").json()["data"]  # still answered from what the front end knows
        assert listed[0]["id"] == proc.name and listed[0]["root"] == str(MODELS / "fake_rolling")
    finally:
        proc.stop()


def test_the_model_field_and_other_names_are_accepted(server: ServerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    for model in (server.name, "gpt-anything"):
        res = client.completions.create(model=model, prompt="x", max_tokens=4, temperature=0,
                                        extra_body={"ignore_eos": True, "min_tokens": 2})
        assert res.choices[0].text == REPLY[:4] and res.model == model


# -- access control ---------------------------------------------------------------------------

@pytest.mark.parametrize(("method", "path", "shape"), [
    ("POST", "/v1/completions", "openai"), ("GET", "/v1/models", "openai"), ("POST", "/tokenize", "openai"),
    ("POST", "/generate", "tgi"), ("GET", "/info", "tgi"),
    ("POST", "/invocations", "djl"), ("GET", "/models", "djl"),
])
def test_api_key_refusals_speak_each_dialect(locked: ServerProcess, method: str, path: str, shape: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        reply = httpx.request(method, locked.url + path, json={"prompt": "x"}, headers=headers)
        assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer"
        body = reply.json()
        if shape == "openai":
            assert body["error"]["code"] == 401 and "API key" in body["error"]["message"]
        elif shape == "tgi":
            assert body["error_type"] == "unauthorized" and "API key" in body["error"]
        else:
            assert body["code"] == 401 and body["type"] == "UnauthorizedException"


def test_api_key_lets_the_right_key_in_and_probes_stay_open(locked: ServerProcess) -> None:
    from openai import AuthenticationError, OpenAI

    for probe in ("/health", "/ping", "/metrics"):
        assert httpx.get(locked.url + probe).status_code == 200
    good = OpenAI(base_url=locked.url + "/v1", api_key=KEY, max_retries=0)
    assert good.completions.create(model="m", prompt="x", max_tokens=3, temperature=0).choices[0].text == REPLY[:3]
    bad = OpenAI(base_url=locked.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(AuthenticationError):
        bad.models.list()


def test_protect_probes_closes_them_too(tmp_path: Path) -> None:
    proc = ServerProcess(FAKE, tmp_path / "server.log", args=("--api-key", KEY, "--protect-probes"))
    try:
        assert httpx.get(proc.url + "/health").status_code == 401
        assert httpx.get(proc.url + "/ping", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    finally:
        proc.stop()


def test_cors_only_for_the_allowed_origin(locked: ServerProcess, server: ServerProcess) -> None:
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    allowed = httpx.options(locked.url + "/v1/completions", headers=preflight)
    assert allowed.status_code == 200  # answered before the API key is asked for
    assert allowed.headers["access-control-allow-origin"] == "http://app.example"
    other = httpx.options(locked.url + "/v1/completions", headers={**preflight, "Origin": "http://evil.example"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    plain = httpx.get(server.url + "/v1/models", headers={"Origin": "http://app.example"})
    assert "access-control-allow-origin" not in plain.headers  # CORS is off by default


# -- LoRA adapters: listed as models, selected by the model field or SageMaker's header ---------

def test_adapters_are_models_and_sagemaker_header_selects_one(tmp_path: Path, tiny_dir: Path,  # noqa: F811
                                                              tiny_model: Any) -> None:  # noqa: F811
    from test_server_lora import PROMPTS, ROWS, N, expected_texts, model_dir

    directory, folders = model_dir(tmp_path, tiny_dir, tiny_model[0])
    want = expected_texts(*tiny_model, folders)
    proc = ServerProcess(directory, tmp_path / "server.log")
    try:
        with proc.client() as client:
            assert client.post(f"/models/{proc.name}/adapters",
                               params={"name": "a", "src": str(folders["a"])}).status_code == 200
            listed = client.get("/v1/models").json()["data"]
            assert [(m["id"], m["parent"]) for m in listed] == [(proc.name, None), ("c", proc.name), ("a", proc.name)]
            assert listed[2]["root"] == str(folders["a"])
            body = {"model": "whatever", "prompt": PROMPTS[0], "max_tokens": N, "temperature": 0}
            assert ROWS[0] == "a"
            by_header = client.post("/v1/completions", json=body,
                                    headers={"X-Amzn-SageMaker-Adapter-Identifier": "a"})
            assert by_header.status_code == 200, by_header.text
            assert by_header.json()["choices"][0]["text"] == want[0]
            by_model = client.post("/v1/completions", json={**body, "model": "a"})
            assert by_model.json()["choices"][0]["text"] == want[0] and by_model.json()["model"] == "a"
    finally:
        proc.stop()


def test_queries_in_async_mode(tmp_path: Path) -> None:
    """The query calls go through DJL's async channel in async mode (answered as records)."""
    model = tmp_path / "fake_async"
    model.mkdir()
    model.joinpath("model.py").write_text(FAKE.joinpath("model.py").read_text())
    model.joinpath("serving.properties").write_text(
        FAKE.joinpath("serving.properties").read_text() + "\noption.rolling_batch=disable\noption.async_mode=true\n")
    proc = ServerProcess(model, tmp_path / "server.log")
    try:
        assert httpx.post(proc.url + "/tokenize", json={"prompt": "hi"}).json()["tokens"] == [104, 105]
        refused = httpx.post(proc.url + "/detokenize", json={"tokens": [-1]})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens"
        assert httpx.get(proc.url + "/v1/models").json()["data"][0]["max_model_len"] == 2048
    finally:
        proc.stop()
