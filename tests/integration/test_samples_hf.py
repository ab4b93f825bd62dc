"""``n``/``best_of`` on the HF handler with the tiny model: the samples of a request equal requests
seeded with the derived seeds, next to LoRA adapters and structured output in the same batch, and
DJL's async mode answers byte for byte as the rolling batch."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Optional

import pytest
from conftest_models import embedded_dir, tiny_dir, tiny_model  # noqa: F401
from lora_adapters import ATTENTION, make_adapter

from djl_handlers.io import Input
from djl_handlers.params.samples import sample_seed
from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncModeClient
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

pytest.importorskip("xgrammar")

CHOICES = ["red", "green", "blue"]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory, tiny_model: Any) -> Path:  # noqa: F811
    model, _ = tiny_model
    return make_adapter(model, tmp_path_factory.mktemp("samples-adapter") / "a", seed=1, targets=ATTENTION)


@pytest.fixture(scope="module")
def service(tiny_dir: Path, adapter: Path) -> InferenceService:  # noqa: F811
    service = InferenceService("huggingface")
    init = {"model_id": str(tiny_dir), "dtype": "fp32", "enable_lora": "true", "rolling_batch": "auto",
            "max_rolling_batch_size": "16"}
    assert service.handle(Input.from_parts(init, ())) is None
    props = {"handler": "register_adapter", "name": "a", "src": str(adapter)}
    assert service.adapter_call("register", Input.from_parts(props, [])).code == 200
    return service


def run(service: InferenceService, bodies: list[dict[str, Any]]) -> list[Any]:
    driver = RollingBatchDriver(service.handle)
    requests = [driver.submit(json_request(body)) for body in bodies]
    driver.run()
    assert all(r.code is None for r in requests), [r.error for r in requests]
    return [json.loads(r.text) for r in requests]


def lmi(prompt: str, adapter: Optional[str] = None, **params: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": prompt, "parameters": {"max_new_tokens": 8, **params}}
    if adapter:
        body["adapters"] = adapter
    return body


def texts(body: dict[str, Any]) -> list[str]:
    return [body["generated_text"], *(s["generated_text"] for s in body["details"].get("best_of_sequences", []))]


def test_samples_next_to_lora_and_structured_output(service: InferenceService) -> None:
    sampled = {"do_sample": True, "temperature": 1.5, "seed": 31}
    lora_n, choice_n, greedy = run(service, [
        lmi("Deep learning is", "a", n=3, **sampled),
        lmi("My favourite colour is", guided_choice=CHOICES, n=3, **sampled),
        lmi("Water boils at"),
    ])
    alone = run(service, [lmi("Deep learning is", "a", **{**sampled, "seed": sample_seed(31, i)}) for i in range(3)])
    assert sorted(texts(lora_n)) == sorted(a["generated_text"] for a in alone)
    assert set(texts(choice_n)) <= set(CHOICES) and len(texts(choice_n)) == 3
    assert greedy["generated_text"] == run(service, [lmi("Water boils at")])[0]["generated_text"]


def test_best_of_returns_the_most_likely_samples(service: InferenceService) -> None:
    body = run(service, [lmi("Once upon a time", best_of=4, n=2, do_sample=True, seed=8, details=True)])[0]
    every = run(service, [lmi("Once upon a time", n=4, do_sample=True, seed=8, details=True)])[0]
    pairs = [(every["generated_text"], every["details"]["tokens"]),
             *((s["generated_text"], s["tokens"]) for s in every["details"]["best_of_sequences"])]
    score = {text: sum(t["log_prob"] for t in tokens) for text, tokens in pairs}
    best_two = sorted(score, key=score.__getitem__, reverse=True)[:2]
    assert texts(body) == best_two


@pytest.mark.parametrize("body", [
    lmi("Hello, my name is", n=2, do_sample=True, seed=5, details=True),
    {"messages": [{"role": "user", "content": "Hi"}], "n": 2, "max_tokens": 6, "seed": 3, "stream": True},
], ids=["lmi-json", "openai-chat-stream"])
def test_async_mode_answers_as_the_rolling_batch(tiny_dir: Path, body: dict[str, Any]) -> None:  # noqa: F811
    init = {"model_id": str(tiny_dir), "dtype": "fp32"}
    rolling = InferenceService("huggingface")
    assert rolling.handle(Input.from_parts({**init, "rolling_batch": "auto"}, ())) is None
    driver = RollingBatchDriver(rolling.handle)
    expected = driver.submit(json_request(body))
    driver.run()

    async def main() -> Any:
        service = InferenceService("huggingface")
        client = AsyncModeClient(service.handle)
        assert await client.init({**init, "rolling_batch": "disable"}) is None
        try:
            return await client.request(body)
        finally:
            assert service.async_mode is not None
            service.async_mode.close()

    got = asyncio.run(main())
    assert got.code == 200 and expected.code is None
    if body.get("stream"):  # response ids and times differ: compare the choices' texts
        assert _stream_texts(got.text) == _stream_texts(expected.text)
    else:
        assert got.text == expected.text


def _stream_texts(text: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for event in text.split("\n\n"):
        if event.startswith("data: {"):
            for choice in json.loads(event[len("data: "):])["choices"]:
                out[choice["index"]] = out.get(choice["index"], "") + choice["delta"].get("content", "")
    return out
