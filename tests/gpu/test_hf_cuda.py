"""The Hugging Face entry point on a CUDA GPU, driven like DJL drives it and served over HTTP.

Marked ``gpu``; skipped unless torch sees a CUDA device. The model is ``gpu_model_dir``: the embedded
SmolLM2-135M, or the random model of its shape that ``scripts/gpu_check.sh`` builds where the embedded
one is missing (``$DJL_HANDLERS_GPU_MODEL``). fp32 answers must equal ``model.generate()`` of each request alone
on the same GPU; bf16 answers are checked for shape (two tokens within rounding may swap).
Run with ``scripts/gpu_check.sh`` (which also runs the engine benchmark) or::

    .venv/bin/python -m pytest -m gpu tests/gpu
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.io import Input
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import RollingBatchDriver, dynamic_batch, json_request

pytest_plugins = ["conftest_models"]  # fixture: gpu_model_dir

#: ``DJL_HANDLERS_TEST_DEVICE=cpu`` runs these same tests on the CPU (to check the tests themselves).
DEVICE = os.environ.get("DJL_HANDLERS_TEST_DEVICE", "cuda")
PROMPTS = ["Deep learning is", "The capital of France is", "Once upon a time, in a small village,"]


def _device_present() -> bool:
    if DEVICE == "cpu":
        return True
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _device_present(), reason="needs a CUDA device")]


def _allocated() -> int:
    import torch

    return int(torch.cuda.memory_allocated()) if DEVICE.startswith("cuda") else 0


@pytest.fixture(scope="module")
def reference(gpu_model_dir: Path) -> Any:
    """Greedy ``generate()`` of one prompt alone, fp32 on the device."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gpu_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(gpu_model_dir), dtype=torch.float32).to(DEVICE).eval()

    def generate(prompt: str, n: int) -> str:
        ids = tok(prompt, return_tensors="pt").to(DEVICE)
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=n, do_sample=False)
        return str(tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))

    return generate


def _service(gpu_model_dir: Path, **options: str) -> InferenceService:
    before = _allocated()
    service = InferenceService("huggingface")
    opts = {"model_id": str(gpu_model_dir), "device": DEVICE, **options}
    assert service.handle(Input.from_parts(opts, ())) is None
    # 135M parameters: at least ~250 MB land on the GPU (bf16), ~500 MB in fp32.
    if DEVICE.startswith("cuda"):
        assert _allocated() - before > 200 * 2**20, "the model did not load onto the GPU"
    return service


@pytest.fixture(scope="module")
def rolling_fp32(gpu_model_dir: Path) -> InferenceService:
    return _service(gpu_model_dir, rolling_batch="scheduler", dtype="fp32")


def test_rolling_batch_fp32_equals_generate_for_requests_joining_later(
    rolling_fp32: InferenceService, reference: Any
) -> None:
    driver = RollingBatchDriver(rolling_fp32.handle)
    first = driver.submit(json_request({"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 24}}))
    for _ in range(3):
        driver.step()
    later = [driver.submit(json_request({"inputs": p, "parameters": {"max_new_tokens": 16}})) for p in PROMPTS[1:]]
    driver.run()
    assert json.loads(first.text)["generated_text"] == reference(PROMPTS[0], 24)
    for prompt, req in zip(PROMPTS[1:], later, strict=True):
        assert json.loads(req.text)["generated_text"] == reference(prompt, 16)


def test_bad_request_gets_400_and_leaves_its_neighbour_intact(rolling_fp32: InferenceService, reference: Any) -> None:
    driver = RollingBatchDriver(rolling_fp32.handle)
    good = driver.submit(json_request({"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 12}}))
    bad = driver.submit(json_request({"inputs": PROMPTS[0], "parameters": {"max_new_tokens": -3}}))
    driver.run()
    assert bad.code == 400 and "max_new_tokens" in bad.error
    assert json.loads(good.text)["generated_text"] == reference(PROMPTS[1], 12)


def test_bf16_streaming_jsonlines_shape(gpu_model_dir: Path) -> None:
    service = _service(gpu_model_dir, rolling_batch="scheduler", dtype="bf16")
    driver = RollingBatchDriver(service.handle)
    req = driver.submit(
        json_request({"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 10, "details": True}, "stream": True})
    )
    driver.run()
    lines = [json.loads(line) for line in req.text.splitlines() if line.strip()]
    assert req.headers["Content-Type"] == "application/jsonlines"
    assert all("token" in line for line in lines)
    assert lines[-1]["generated_text"] == "".join(line["token"]["text"] for line in lines)
    reason = lines[-1]["details"]["finish_reason"]
    assert (reason, len(lines)) == ("length", 10) or (reason == "eos_token" and len(lines) <= 10)


def test_dynamic_batch_fp32_equals_generate(gpu_model_dir: Path, reference: Any) -> None:
    service = _service(gpu_model_dir, rolling_batch="disable", dtype="fp32")
    bodies = [
        {"inputs": [PROMPTS[0], PROMPTS[2]], "parameters": {"max_new_tokens": 8}},
        {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 14}},
        {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": -3}},
    ]
    results = dynamic_batch(service.handle, bodies)
    assert results[0] == [{"generated_text": reference(PROMPTS[0], 8)}, {"generated_text": reference(PROMPTS[2], 8)}]
    assert results[1] == [{"generated_text": reference(PROMPTS[1], 14)}]
    assert results[2]["code"] == 400 and "max_new_tokens" in results[2]["error"]


def test_served_over_http(tmp_path: Path, gpu_model_dir: Path, reference: Any) -> None:
    """``djl-handlers serve`` with ``option.device=cuda``: 6 concurrent streaming clients over real
    sockets, each answer equal to ``generate()`` alone."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from integration.test_server_harness import ServerProcess  # tests/ is on sys.path, as for conftest_models

    model = tmp_path / "model"
    model.mkdir()
    (model / "serving.properties").write_text(
        "engine=Python\noption.entryPoint=djl_handlers.huggingface\n"
        f"option.model_id={gpu_model_dir}\noption.device={DEVICE}\noption.dtype=fp32\n"
        "option.rolling_batch=scheduler\noption.max_rolling_batch_size=8\n"
    )
    server = ServerProcess(model, tmp_path / "server.log")
    try:
        jobs = [(PROMPTS[i % 3], 8 + 3 * i) for i in range(6)]

        def ask(job: tuple[str, int]) -> str:
            body = {"inputs": job[0], "parameters": {"max_new_tokens": job[1]}, "stream": True}
            with server.client() as client:
                with client.stream("POST", "/invocations", json=body) as resp:
                    assert resp.status_code == 200
                    lines = [json.loads(x) for x in resp.iter_lines() if x.strip()]
            return str(lines[-1]["generated_text"])

        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(ask, jobs))
        for (prompt, n), answer in zip(jobs, answers, strict=True):
            assert answer == reference(prompt, n)
    finally:
        server.stop()
