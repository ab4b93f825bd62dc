"""REAL vLLM on the CPU in DJL's async mode: ``djl_handlers.vllm`` over vLLM's ``AsyncLLM``.

Skipped unless vLLM's CPU build is installed (see conftest.py). The reference is sync mode: the
same handler over vLLM's ``LLMEngine``, driven like DJL's Java rolling-batch loop. Async mode is
driven two ways: in process, the way DJL's ``PythonAsyncEngine`` awaits the handler
(``AsyncModeClient``, one asyncio loop for the module: ``AsyncLLM`` stays on the loop that built
it), and through ``djl-handlers serve`` with ``option.async_mode=true`` (its worker awaits every
request on one loop). Both engines have LoRA on, with two random-but-fixed PEFT adapters
(``tests/lora_adapters.py``).

Checked: answers equal sync mode's — status, Content-Type, every line, text and token (log-probs
within 1e-3, as they depend a little on the batch) — for JSON with details and for streaming,
requests run concurrently; a bad request (ours, and one vLLM itself rejects) is a 400 while its
neighbour answers; a cancelled request is aborted in vLLM (``AsyncLLM`` has no unfinished request
afterwards); LoRA adapters in one batch equal transformers' merged ``generate()``; guided JSON
follows its schema and equals sync mode's answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture
from integration.test_server_harness import ServerProcess, wait_until
from lora_adapters import MLP, make_adapter, merged_generate

from djl_handlers.io.inputs import Input
from djl_handlers.io.wire import binary_decode
from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncAnswer, AsyncModeClient
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

PROMPTS = ("The capital of France is", "Deep learning is", "Once upon a time")
OPTIONS = {
    "dtype": "fp32",
    "max_model_len": "1024",
    "max_rolling_batch_size": "8",
    "enforce_eager": "true",
    "gpu_memory_utilization": "0.3",  # vLLM's CPU build wants this share of the RAM free
    "enable_lora": "true",
    "max_loras": "2",
    "max_lora_rank": "8",
}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer", "minimum": 1,
                                                                            "maximum": 9}},
    "required": ["city", "rank"],
}
CHAT = "<|im_start|>user\nName a city in JSON.<|im_end|>\n<|im_start|>assistant\n"
BODIES: list[dict[str, Any]] = [
    *({"inputs": p, "parameters": {"max_new_tokens": 24, "details": True}} for p in PROMPTS),
    *({"inputs": p, "stream": True, "parameters": {"max_new_tokens": 12, "details": True}} for p in PROMPTS[:2]),
    {"inputs": PROMPTS[0], "stream": True, "parameters": {"max_new_tokens": 24, "stop": [" Paris"]}},
    {"inputs": CHAT, "parameters": {"max_new_tokens": 60, "guided_json": SCHEMA}},
]
LORA_ROWS = ("a", None, "b")
LORA_CHECKED = 8  # vLLM's CPU LoRA kernels sum in another order than a merged model (tests/vllm_cpu lora test)


def _model_dir(embedded: Path) -> str:
    return os.environ.get("DJL_HANDLERS_VLLM_MODEL") or str(embedded)


def _shutdown(service: InferenceService) -> None:
    engine = getattr(service.engine, "engine", None)
    for obj in (getattr(engine, "engine_core", None), engine):
        if callable(getattr(obj, "shutdown", None)):
            obj.shutdown()
            return


@pytest.fixture(scope="module")
def model_path(embedded_dir: Path) -> str:  # noqa: F811
    return _model_dir(embedded_dir)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The one event loop async mode runs on in this module (AsyncLLM is bound to it)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, model_path: str) -> dict[str, Any]:
    pytest.importorskip("peft")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    root = tmp_path_factory.mktemp("vllm-async-lora")
    folders = {"a": make_adapter(model, root / "a", seed=21, rank=8, std=0.02),
               "b": make_adapter(model, root / "b", seed=22, rank=4, targets=MLP, std=0.02)}
    want = [merged_generate(model, tok, p, LORA_CHECKED, folders[a] if a else None)
            for p, a in zip(PROMPTS, LORA_ROWS, strict=True)]
    del model
    return {"folders": folders, "want": want}


@pytest.fixture(scope="module")
def sync_answers(model_path: str) -> list[tuple[int, str, str]]:
    """Sync mode's answers to ``BODIES`` (status, body, Content-Type): the handler over LLMEngine,
    all in one rolling batch; its engine stops afterwards."""
    service = InferenceService("vllm")
    driver = RollingBatchDriver(service.handle)
    assert driver.init({"model_id": model_path, "rolling_batch": "vllm", **OPTIONS}) is None
    try:
        reqs = [driver.submit(json_request(body)) for body in BODIES]
        driver.run()
    finally:
        _shutdown(service)
    return [(r.code or 200, r.text, r.headers.get("Content-Type", "")) for r in reqs]


@pytest.fixture(scope="module")
def async_client(model_path: str, loop: asyncio.AbstractEventLoop) -> Iterator[tuple[AsyncModeClient, Any]]:
    """The handler in async mode (DJL 0.36's rewrite: rolling_batch=disable + async_mode=true)."""
    service = InferenceService("vllm")
    client = AsyncModeClient(service.handle)
    started = time.monotonic()
    init = client.init({"model_id": model_path, "rolling_batch": "disable", **OPTIONS})
    assert loop.run_until_complete(init) is None
    print(f"djl_handlers.vllm in async mode ready in {time.monotonic() - started:.1f}s")
    yield client, service
    _shutdown(service)


def _close(a: Any, b: Any) -> bool:
    """JSON values equal but for floats within 1e-3 (a log-prob depends a little on the batch)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) < 1e-3
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _same_answer(got: tuple[int, str, str], want: tuple[int, str, str]) -> bool:
    """Same status, Content-Type, and body: the same lines, the same text and tokens (log-probs
    within 1e-3: requests that run in another batch than sync mode's differ in the last digits)."""
    if got[0] != want[0] or got[2] != want[2]:
        return False
    lines, expected = got[1].splitlines(), want[1].splitlines()
    return len(lines) == len(expected) and all(_close(json.loads(a), json.loads(b))
                                               for a, b in zip(lines, expected, strict=True))


def _engine(service: InferenceService) -> Any:
    from djl_handlers.engines.external.vllm_async import VllmAsyncEngine

    assert isinstance(service.engine, VllmAsyncEngine)
    return service.engine.engine


# -- in process, as DJL's PythonAsyncEngine awaits the handler ----------------------------------
def test_async_mode_runs_asyncllm(async_client: tuple[AsyncModeClient, Any]) -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    _, service = async_client
    assert isinstance(_engine(service), AsyncLLM)
    assert service.async_mode is not None and service.async_mode.driver is None  # no engine-loop thread


def test_concurrent_answers_equal_sync_modes(async_client: tuple[AsyncModeClient, Any],
                                            sync_answers: list[tuple[int, str, str]],
                                            loop: asyncio.AbstractEventLoop) -> None:
    client, service = async_client

    async def main() -> list[AsyncAnswer]:
        return list(await asyncio.gather(*(client.request(body) for body in BODIES)))

    answers = loop.run_until_complete(main())
    for body, answer, reference in zip(BODIES, answers, sync_answers, strict=True):
        got = (answer.code, answer.text, answer.headers.get("Content-Type", ""))
        assert _same_answer(got, reference), (body, got, reference)
    value = json.loads(json.loads(answers[-1].text)["generated_text"])  # guided JSON follows the schema
    assert isinstance(value["city"], str) and len(value["city"]) <= 12 and 1 <= value["rank"] <= 9
    assert _engine(service).get_num_unfinished_requests() == 0


def test_bad_requests_are_400s_beside_a_good_one(async_client: tuple[AsyncModeClient, Any],
                                                 sync_answers: list[tuple[int, str, str]],
                                                 loop: asyncio.AbstractEventLoop) -> None:
    client, _ = async_client

    async def main() -> list[AsyncAnswer]:
        return list(await asyncio.gather(
            client.request({"inputs": PROMPTS[0], "parameters": {"max_new_tokens": -1}}),
            client.request({"inputs": PROMPTS[0], "parameters": {"guided_grammar": "root ::= undefined_rule"}}),
            client.request(BODIES[0]),
        ))

    ours, vllms, good = loop.run_until_complete(main())
    assert ours.code == 400 and "max_new_tokens" in (ours.error or "")
    assert vllms.code == 400 and "guided_grammar" in (vllms.error or "")  # vLLM's own rejection
    assert _same_answer((good.code, good.text, good.headers["Content-Type"]), sync_answers[0])


def test_cancel_aborts_the_request_in_vllm(async_client: tuple[AsyncModeClient, Any],
                                           loop: asyncio.AbstractEventLoop) -> None:
    client, service = async_client
    llm = _engine(service)

    async def main() -> tuple[AsyncAnswer, AsyncAnswer]:
        answer = AsyncAnswer()
        body = {"inputs": PROMPTS[1], "stream": True, "parameters": {"max_new_tokens": 500, "ignore_eos_token": True}}
        task = asyncio.ensure_future(client.stream(body, answer, tracking_id="cancel-me"))
        while len(answer.records) < 3:
            await asyncio.sleep(0.01)
        neighbour = asyncio.ensure_future(client.request({"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 4}}))
        await client.cancel("cancel-me")
        await asyncio.wait_for(task, 60)
        deadline = time.monotonic() + 30
        while llm.get_num_unfinished_requests() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return answer, await neighbour

    answer, neighbour = loop.run_until_complete(main())
    assert answer.done and len(answer.records) < 100
    assert neighbour.code == 200 and json.loads(neighbour.text)["generated_text"]
    assert llm.get_num_unfinished_requests() == 0  # vLLM aborted it


def test_lora_adapters_in_one_batch(async_client: tuple[AsyncModeClient, Any], adapters: dict[str, Any],
                                    loop: asyncio.AbstractEventLoop) -> None:
    client, service = async_client

    async def main() -> list[AsyncAnswer]:
        for name, folder in adapters["folders"].items():
            reply = await service.adapter_call("register", Input.from_parts({"name": name, "src": str(folder)}, []))
            record = binary_decode(bytes(reply.content.value_at(0)))
            assert "code" not in record, record
        await asyncio.sleep(1)  # the scheduled add_lora calls reach vLLM
        return list(await asyncio.gather(*(
            client.request({"inputs": p, "adapters": a or "",
                            "parameters": {"max_new_tokens": LORA_CHECKED, "details": True}})
            for p, a in zip(PROMPTS, LORA_ROWS, strict=True))))

    answers = loop.run_until_complete(main())
    for answer, want, name in zip(answers, adapters["want"], LORA_ROWS, strict=True):
        assert answer.code == 200, answer.text
        ids = [t["id"][0] for t in json.loads(answer.text)["details"]["tokens"]]
        assert ids == want[:LORA_CHECKED], name


# -- through djl-handlers serve ------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_path: str) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("vllm-async-server")
    lines = ["engine=Python", "option.entryPoint=djl_handlers.vllm", f"option.model_id={model_path}",
             "option.rolling_batch=disable", "option.async_mode=true", "option.model_loading_timeout=900",
             *(f"option.{k}={v}" for k, v in OPTIONS.items())]
    (folder / "serving.properties").write_text("\n".join(lines) + "\n")
    proc = ServerProcess(folder, folder / "server.log", start_timeout=900)
    yield proc
    proc.stop()


def _post(server: ServerProcess, body: dict[str, Any]) -> tuple[int, str, str]:
    with httpx.Client(base_url=server.url, timeout=300) as client:
        response = client.post("/invocations", json=body)
        return response.status_code, response.text, response.headers.get("content-type", "")


def test_server_answers_equal_sync_mode_concurrently(server: ServerProcess,
                                                     sync_answers: list[tuple[int, str, str]]) -> None:
    with ThreadPoolExecutor(len(BODIES)) as pool:
        got = list(pool.map(lambda body: _post(server, body), BODIES))
    for body, answer, reference in zip(BODIES, got, sync_answers, strict=True):
        assert _same_answer(answer, reference), (body, answer, reference)


def test_server_bad_request_beside_a_good_one(server: ServerProcess,
                                              sync_answers: list[tuple[int, str, str]]) -> None:
    bodies = [{"inputs": PROMPTS[0], "parameters": {"guided_grammar": "root ::= undefined_rule"}},
              {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": -1}}, BODIES[0]]
    with ThreadPoolExecutor(3) as pool:
        vllms, ours, good = pool.map(lambda body: _post(server, body), bodies)
    assert vllms[0] == 400 and "guided_grammar" in vllms[1]
    assert ours[0] == 400 and "max_new_tokens" in ours[1]
    assert _same_answer(good, sync_answers[0])


def test_server_client_that_goes_away_is_cancelled(server: ServerProcess,
                                                   sync_answers: list[tuple[int, str, str]]) -> None:
    body = {"inputs": PROMPTS[1], "stream": True, "parameters": {"max_new_tokens": 500, "ignore_eos_token": True}}
    with httpx.Client(base_url=server.url, timeout=300) as client, \
            client.stream("POST", "/invocations", json=body) as response:
        for _ in zip(range(3), response.iter_lines(), strict=False):
            pass

    def metric(name: str) -> float:
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    wait_until(lambda: metric("djl_handlers_cancelled_total") >= 1, "the cancellation", timeout=60)
    wait_until(lambda: metric("djl_handlers_num_requests_running") == 0, "nothing running", timeout=60)
    assert _same_answer(_post(server, BODIES[0]), sync_answers[0])


def test_server_lora_adapters(server: ServerProcess, adapters: dict[str, Any]) -> None:
    with httpx.Client(base_url=server.url, timeout=300) as client:
        for name, folder in adapters["folders"].items():
            reply = client.post(f"/models/{server.name}/adapters", params={"name": name, "src": str(folder)})
            assert reply.status_code == 200, reply.text
    bodies = [{"inputs": p, "adapters": a or "", "parameters": {"max_new_tokens": LORA_CHECKED, "details": True}}
              for p, a in zip(PROMPTS, LORA_ROWS, strict=True)]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda body: _post(server, body), bodies))
    for (code, text, _), want, name in zip(got, adapters["want"], LORA_ROWS, strict=True):
        assert code == 200, text
        assert [t["id"][0] for t in json.loads(text)["details"]["tokens"]] == want[:LORA_CHECKED], name
