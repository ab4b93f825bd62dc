"""The Hugging Face entry point on the real embedded SmolLM2 (fp32), driven like DJL drives it.

Covers, at the handler level: LMI v0.27's request/response shapes from the
real model, greedy equality with ``model.generate()`` for requests joining a running batch,
per-request seeds, and a stop sequence spanning a token boundary.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import RollingBatchDriver, dynamic_batch, json_request

pytestmark = pytest.mark.slow

PROMPTS = ["Deep learning is", "The capital of France is", "Once upon a time, in a small village,"]


@pytest.fixture(scope="module")
def model_dir() -> str:
    from djl_handlers.model.embedded import embedded_model_dir

    return str(embedded_model_dir())


@pytest.fixture(scope="module")
def rolling(model_dir: str) -> InferenceService:
    service = InferenceService("huggingface")
    assert service.handle(_init({"model_id": model_dir, "rolling_batch": "auto", "dtype": "fp32"})) is None
    return service


@pytest.fixture(scope="module")
def reference(model_dir: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def generate(prompt: str, n: int) -> str:
        ids = tok(prompt, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=n, do_sample=False)
        return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)

    return generate


def _init(options: dict[str, str]) -> Any:
    from djl_handlers.io import Input

    return Input.from_parts(options, ())


def test_seed_json_shape_with_details(rolling: InferenceService) -> None:
    driver = RollingBatchDriver(rolling.handle)
    req = driver.submit(
        json_request({"inputs": "What is Deep Learning?", "parameters": {"max_new_tokens": 6, "details": True}})
    )
    driver.run()
    body = json.loads(req.text)
    assert list(body) == ["generated_text", "details"]
    details = body["details"]
    assert details["inputs"] == "What is Deep Learning?"
    assert details["generated_tokens"] == len(details["tokens"]) <= 6
    assert details["finish_reason"] in ("length", "eos_token")
    assert "".join(t["text"] for t in details["tokens"]) == body["generated_text"]
    for token in details["tokens"]:
        assert isinstance(token["id"], list) and len(token["id"]) == 1
        assert token["log_prob"] <= 0.0


def test_seed_jsonlines_shape(rolling: InferenceService) -> None:
    driver = RollingBatchDriver(rolling.handle)
    req = driver.submit(
        json_request(
            {"inputs": "What is Deep Learning?", "stream": True, "parameters": {"max_new_tokens": 5, "details": True}}
        )
    )
    driver.run()
    lines = [json.loads(x) for x in req.text.splitlines()]
    assert 1 <= len(lines) <= 5
    assert all("token" in line for line in lines)
    assert lines[-1]["generated_text"] == "".join(line["token"]["text"] for line in lines)
    assert "tokens" not in lines[-1]["details"]
    assert req.headers["Content-Type"] == "application/jsonlines"


def test_greedy_equals_generate_for_requests_joining_at_different_steps(
    rolling: InferenceService, reference: Any
) -> None:
    budgets = [7, 3, 5]
    driver = RollingBatchDriver(rolling.handle)
    reqs = [driver.submit(json_request({"inputs": PROMPTS[0], "parameters": {"max_new_tokens": budgets[0]}}))]
    driver.step()
    driver.step()
    reqs.append(driver.submit(json_request({"inputs": PROMPTS[1], "parameters": {"max_new_tokens": budgets[1]}})))
    driver.step()
    reqs.append(driver.submit(json_request({"inputs": PROMPTS[2], "parameters": {"max_new_tokens": budgets[2]}})))
    driver.run()
    for prompt, n, req in zip(PROMPTS, budgets, reqs, strict=True):
        assert json.loads(req.text)["generated_text"] == reference(prompt, n)


def test_same_seed_same_sample_regardless_of_neighbours(rolling: InferenceService) -> None:
    params = {"do_sample": True, "temperature": 0.9, "top_k": 50, "max_new_tokens": 6, "seed": 1234}
    alone = RollingBatchDriver(rolling.handle)
    a = alone.submit(json_request({"inputs": PROMPTS[0], "parameters": params}))
    alone.run()
    crowd = RollingBatchDriver(rolling.handle)
    crowd.submit(json_request({"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 6}}))
    b = crowd.submit(json_request({"inputs": PROMPTS[0], "parameters": params}))
    crowd.run()
    assert json.loads(a.text)["generated_text"] == json.loads(b.text)["generated_text"]


def test_stop_sequence_spanning_two_tokens(rolling: InferenceService) -> None:
    driver = RollingBatchDriver(rolling.handle)
    probe = driver.submit(json_request({"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 12, "details": True}}))
    driver.run()
    body = json.loads(probe.text)
    tokens = [t["text"] for t in body["details"]["tokens"]]
    full = body["generated_text"]
    stop = None
    for k in range(len(tokens) - 1):
        if len(tokens[k]) >= 2 and len(tokens[k + 1]) >= 2:
            candidate = tokens[k][-2:] + tokens[k + 1][:2]
            end = len("".join(tokens[: k + 1])) + 2
            if full.find(candidate) == end - 4:
                stop = candidate
                break
    assert stop is not None, f"no two-token boundary to test in {tokens}"
    driver = RollingBatchDriver(rolling.handle)
    req = driver.submit(
        json_request(
            {"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 12, "stop_sequences": [stop], "details": True}}
        )
    )
    driver.run()
    stopped = json.loads(req.text)
    assert stopped["details"]["finish_reason"] == "stop_sequence"
    assert stopped["generated_text"] == full[: full.find(stop)], "the stop string is removed"


def test_dynamic_batch_list_inputs_and_mixed_parameters(model_dir: str, reference: Any) -> None:
    service = InferenceService("huggingface")
    service.handle(_init({"model_id": model_dir, "rolling_batch": "disable", "dtype": "fp32"}))
    bodies = [
        {"inputs": [PROMPTS[0], PROMPTS[1]], "parameters": {"max_new_tokens": 4}},
        {"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 6}},
        {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": -3}},
    ]
    results = dynamic_batch(service.handle, bodies)
    assert results[0] == [{"generated_text": reference(PROMPTS[0], 4)}, {"generated_text": reference(PROMPTS[1], 4)}]
    assert results[1] == [{"generated_text": reference(PROMPTS[2], 6)}]
    assert results[2]["code"] == 400 and "max_new_tokens" in results[2]["error"]
