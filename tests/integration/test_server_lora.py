"""DJL's adapter API on ``djl-handlers serve``: adapters registered over HTTP, one mixed rolling batch.

The adapters are made with peft for the tiny random Llama (random, fixed weights, in a tmp folder);
one sits in the model directory's ``adapters/`` folder (registered at start), two are registered
over HTTP. Every answer of a concurrent mixed batch must equal ``generate()`` of that prompt alone on
the base model with its adapter merged. The embedded SmolLM2 runs the same sequence (slow).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest
from conftest_models import embedded_dir, real_model, tiny_dir, tiny_model  # noqa: F401
from lora_adapters import ATTENTION, MLP, make_adapter, merged_generate
from test_server_harness import ServerProcess, cli_command, cli_env

N = 8
PROMPTS = ["Deep learning is", "The capital of France is", "Once upon a time", "Hello, my name is"]
ROWS: list[Optional[str]] = ["a", None, "b", "c"]
PROPERTIES = """engine=Python
option.entryPoint=djl_handlers.huggingface
option.model_id={model}
option.dtype=fp32
option.rolling_batch=scheduler
option.max_rolling_batch_size=8
option.enable_lora=true
option.max_loras=4
"""


def model_dir(root: Path, base: Path, model: Any) -> tuple[Path, dict[str, Path]]:
    """A model directory with adapter ``c`` in ``adapters/``; ``a`` and ``b`` in a separate folder."""
    target = root / "lora-model"
    (target / "adapters").mkdir(parents=True)
    (target / "serving.properties").write_text(PROPERTIES.format(model=base.resolve()))
    folders = {
        "a": make_adapter(model, root / "made" / "a", seed=11, rank=4, targets=ATTENTION),
        "b": make_adapter(model, root / "made" / "b", seed=12, rank=8, targets=("q_proj", "v_proj", "down_proj")),
        "c": make_adapter(model, target / "adapters" / "c", seed=13, rank=2, targets=MLP),
    }
    return target, folders


def expected_texts(model: Any, tok: Any, folders: dict[str, Path]) -> list[str]:
    return [tok.decode(merged_generate(model, tok, p, N, folders[a] if a else None), skip_special_tokens=True)
            for p, a in zip(PROMPTS, ROWS, strict=True)]


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path,  # noqa: F811
                tiny_model: Any) -> Any:  # noqa: F811
    root = tmp_path_factory.mktemp("lora-serve")
    directory, folders = model_dir(root, tiny_dir, tiny_model[0])
    server = ServerProcess(directory, root / "server.log")
    yield server, folders, expected_texts(*tiny_model, folders), directory
    server.stop()


def _generate(client: httpx.Client, prompt: str, adapter: Optional[str]) -> httpx.Response:
    body: dict[str, Any] = {"inputs": prompt, "parameters": {"max_new_tokens": N}}
    if adapter:
        body["adapters"] = adapter
    return client.post("/invocations", json=body)


def _mixed_batch(server: ServerProcess) -> list[str]:
    with server.client() as client, ThreadPoolExecutor(len(PROMPTS)) as pool:
        replies = list(pool.map(lambda pa: _generate(client, *pa), zip(PROMPTS, ROWS, strict=True)))
    for reply in replies:
        assert reply.status_code == 200, reply.text
    return [reply.json()["generated_text"] for reply in replies]


def _register(client: httpx.Client, model: str, name: str, src: Path, **extra: str) -> httpx.Response:
    return client.post(f"/models/{model}/adapters", params={"name": name, "src": str(src), **extra})


def test_register_over_http_then_mixed_batch_equals_merged_generate(tiny_server: Any) -> None:
    server, folders, want, _ = tiny_server
    with server.client() as client:
        listed = client.get(f"/models/{server.name}/adapters")
        assert listed.status_code == 200
        assert listed.json() == {"adapters": [{"name": "c", "src": str(folders["c"].resolve()), "preload": True,
                                               "pin": False}]}  # from adapters/ at start
        assert listed.text.endswith("}\n") and '\n  "adapters": [' in listed.text  # DJL's pretty JSON
        for name in ("a", "b"):
            reply = _register(client, server.name, name, folders[name])
            assert (reply.status_code, reply.json()) == (200, {"status": f"Adapter {name} registered"})
    assert _mixed_batch(server) == want


def test_management_statuses_and_bodies_as_djl(tiny_server: Any) -> None:
    server, folders, _, _ = tiny_server
    name = server.name
    with server.client() as client:
        _register(client, name, "a", folders["a"])  # idempotent setup whatever ran first
        dup = _register(client, name, "a", folders["a"])
        assert dup.status_code == 409
        assert dup.json() == {"code": 409, "type": "IllegalArgumentException", "message":
                              "The adapter a already exists. If you want to replace it, please unregistering "
                              "before registering a new adapter with the same name."}
        missing = client.post(f"/models/{name}/adapters", params={"name": "q"})
        assert missing.json() == {"code": 400, "type": "BadRequestException",
                                  "message": "The parameter src is required"}
        bad = _register(client, name, "q", folders["a"].parent)  # not an adapter folder: the worker refuses
        assert bad.status_code == 400 and "adapter_config.json" in bad.json()["message"]
        assert bad.json()["type"] == "BadRequestException" and "\\u0027" in bad.text  # Gson escapes ' as DJL does
        assert client.get(f"/models/{name}/adapters/q").status_code == 404
        assert client.get(f"/models/{name}/adapters/a").json() == {
            "name": "a", "src": str(folders["a"]), "preload": True, "pin": False}
        gone = client.get(f"/models/{name}/adapters/nope", headers={"X-Amzn-SageMaker-Adapter-Alias": "my-alias"})
        assert gone.json() == {"code": 404, "type": "BadRequestException",
                               "message": "The adapter my-alias was not found"}
        assert client.get("/models/other/adapters").json()["message"] == "The model other was not found"
        assert client.put(f"/models/{name}/adapters/a").status_code == 405
        update = client.post(f"/models/{name}/adapters/a/update", params={"pin": "true"})
        assert (update.status_code, update.json()) == (200, {"status": "Adapter a updated"})
        assert client.get("/adapters/a").json()["pin"] is True  # the model-less form (single model)
        page = client.get(f"/models/{name}/adapters", params={"limit": 1})
        assert page.json()["nextPageToken"] == "1" and len(page.json()["adapters"]) == 1


def test_request_side_selection_and_unregister(tiny_server: Any) -> None:
    server, folders, want, _ = tiny_server
    name = server.name
    with server.client() as client:
        for adapter in ("a", "b"):
            _register(client, name, adapter, folders[adapter])
        header = client.post("/invocations", json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": N}},
                             headers={"X-Amzn-SageMaker-Adapter-Identifier": "a"})
        assert header.json()["generated_text"] == want[0]
        chat = client.post("/v1/completions", json={"model": f"{name}:b", "prompt": PROMPTS[2], "max_tokens": N,
                                                    "temperature": 0})
        assert chat.status_code == 200, chat.text
        assert chat.json()["model"] == "b" and chat.json()["choices"][0]["text"] == want[2]
        by_name = client.post("/v1/completions", json={"model": "a", "prompt": PROMPTS[0], "max_tokens": N,
                                                       "temperature": 0})
        assert by_name.json()["model"] == "a" and by_name.json()["choices"][0]["text"] == want[0]
        unknown = _generate(client, "x", "ghost")
        assert unknown.status_code == 404 and "'ghost'" in unknown.text
        deleted = client.delete(f"/models/{name}/adapters/b")
        assert (deleted.status_code, deleted.json()) == (200, {"status": "Adapter b unregistered"})
        assert _generate(client, "x", "b").status_code == 404
        assert [a["name"] for a in client.get(f"/models/{name}/adapters").json()["adapters"]] == ["c", "a"]


def test_check_lists_the_startup_adapters(tiny_server: Any) -> None:
    _, folders, _, directory = tiny_server
    done = subprocess.run(cli_command("check", str(directory)), capture_output=True, text=True, env=cli_env(),
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["adapters"] == [{"name": "c", "src": str(folders["c"].resolve()), "preload": True, "pin": False,
                                   "loadedAtStart": True, "valid": True}]
    assert report["servingConfig"]["lora"]["enable_lora"] is True


def test_lora_not_enabled_is_400(tmp_path: Path, tiny_dir: Path) -> None:  # noqa: F811
    directory = tmp_path / "plain"
    directory.mkdir()
    (directory / "serving.properties").write_text(PROPERTIES.format(model=tiny_dir.resolve())
                                                  .replace("option.enable_lora=true", ""))
    server = ServerProcess(directory, tmp_path / "server.log")
    try:
        with server.client() as client:
            reply = client.get(f"/models/{server.name}/adapters")
        assert reply.json() == {"code": 400, "type": "BadRequestException", "message": "LoRA is not enabled."}
    finally:
        server.stop()


@pytest.mark.slow
def test_embedded_smollm2_mixed_batch_over_http(tmp_path: Path, embedded_dir: Path,  # noqa: F811
                                                real_model: Any) -> None:  # noqa: F811
    model, tok = real_model
    directory, folders = model_dir(tmp_path, embedded_dir, model)
    want = expected_texts(model, tok, folders)
    server = ServerProcess(directory, tmp_path / "server.log")
    try:
        with server.client() as client:
            for name in ("a", "b"):
                assert _register(client, server.name, name, folders[name]).status_code == 200
        assert _mixed_batch(server) == want
    finally:
        server.stop()
        shutil.rmtree(directory / "adapters", ignore_errors=True)


def test_unregister_during_a_running_stream_lets_it_finish(tiny_server: Any, tiny_model: Any) -> None:  # noqa: F811
    server, folders, _, _ = tiny_server
    model, tok = tiny_model
    tokens = 60
    want = tok.decode(merged_generate(model, tok, PROMPTS[1], tokens, folders["a"]), skip_special_tokens=True)
    name = server.name
    body = {"inputs": PROMPTS[1], "adapters": "a", "stream": True, "parameters": {"max_new_tokens": tokens}}
    with server.client() as client:
        _register(client, name, "a", folders["a"])
        with client.stream("POST", "/invocations", json=body) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line)  # the request is running in the batch now
            deleted = client.delete(f"/models/{name}/adapters/a")
            assert (deleted.status_code, deleted.json()) == (200, {"status": "Adapter a unregistered"})
            assert _generate(client, "x", "a").status_code == 404  # new requests: gone at once
            rest = [line for line in lines if line]
        assert response.status_code == 200
        assert json.loads(rest[-1])["generated_text"] == want  # the running one finished with its adapter
        assert json.loads(first)["token"]["id"] and rest
        assert "a" not in [a["name"] for a in client.get(f"/models/{name}/adapters").json()["adapters"]]
    # the worker deferred the unload because the stream was still running (its log says so)
    assert "adapter a unregistered; unloading it when its running requests finish" in server.log_path.read_text()


def test_control_calls_between_steps_leave_running_streams_intact(tiny_server: Any, tiny_model: Any) -> None:  # noqa: F811
    """Each register/unregister pauses the worker-driven batch between two steps, runs on the socket
    alone and resumes it: the streams running meanwhile still equal generate() token for token."""
    server, folders, _, _ = tiny_server
    model, tok = tiny_model
    tokens = 40
    want = [tok.decode(merged_generate(model, tok, p, tokens, None), skip_special_tokens=True) for p in PROMPTS]
    name = server.name

    def stream(prompt: str) -> str:
        body = {"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": tokens}}
        with server.client() as client, client.stream("POST", "/invocations", json=body) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        return str(json.loads(lines[-1])["generated_text"])

    with ThreadPoolExecutor(len(PROMPTS)) as pool, server.client() as client:
        running = [pool.submit(stream, p) for p in PROMPTS]
        statuses = []
        for _ in range(4):
            statuses.append(_register(client, name, "b", folders["b"]).status_code)
            statuses.append(client.delete(f"/models/{name}/adapters/b").status_code)
        texts = [future.result(timeout=120) for future in running]
    assert statuses == [200] * 8
    assert texts == want
