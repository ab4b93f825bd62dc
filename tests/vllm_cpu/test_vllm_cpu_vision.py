"""REAL vLLM on the CPU: OpenAI chat requests with images through ``djl_handlers.vllm``, in sync mode
(``LLMEngine``, driven like DJL's Java rolling-batch loop) and async mode (``AsyncLLM``, driven like
DJL's ``PythonAsyncEngine``), on the tiny random LLaVA of ``djl_handlers.model.tiny_vision``.

Skipped unless vLLM's CPU build is installed (see conftest.py). Each mode builds one engine, sends one
batch and shuts the engine down before the next mode starts (the two never run together): two image
requests (different generated PNGs as ``data:`` URLs), a text request and a truncated PNG. The
reference is vLLM itself on the same engine, called directly with the rendered prompt text and the
image as vLLM's own API takes them (``multi_modal_data``, no UUIDs, vLLM's default tokenization).

Checked in both modes: greedy answers equal vLLM's own, ``usage.prompt_tokens`` equals the prompt
vLLM prefilled (the image's 576 tokens included), the two images give different answers, the text
request completes, and the truncated PNG is a 400 naming ``messages[0].content[0].image_url``. In
async mode a beam search with an image (``use_beam_search``) returns vLLM's own beam-search loop's
beams for vLLM's own rendering of the prompt.

vLLM's LLaVA module needs a transformers module that imports torchvision, which ``.venv-vllm`` lacks:
the start-up hook in ``torchvision_free/`` (see test_vllm_cpu_vision_model.py) goes on ``PYTHONPATH``
for vLLM's processes and is installed in this one.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import runpy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture

from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncAnswer, AsyncModeClient
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

pytestmark = pytest.mark.slow

HOOK_DIR = Path(__file__).parent / "torchvision_free"
NEW = 8
BEAM_TOKENS = 4
QUESTION = "What is in the picture?"
IMAGE_TOKENS = 576  # 336x336 through CLIP patches of 14
BAD_PART = "messages[0].content[0].image_url"
OPTIONS = {
    "dtype": "fp32",
    "max_model_len": "1024",
    "max_rolling_batch_size": "4",
    "enforce_eager": "true",
    "gpu_memory_utilization": "0.3",  # vLLM's CPU build wants this share of the RAM free
    "limit_mm_per_prompt": '{"image": 1}',
}


# -- the model, the images, the requests ---------------------------------------------------------
@pytest.fixture(scope="module")
def hook() -> Iterator[None]:
    """vLLM's LLaVA imports without torchvision: here and in the processes vLLM starts."""
    runpy.run_path(str(HOOK_DIR / "sitecustomize.py"))["install"]()
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), before) if p)
    yield
    if before is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = before


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path, hook: None) -> str:  # noqa: F811
    from djl_handlers.model.tiny_vision import tiny_vlm_dir

    return str(tiny_vlm_dir(tmp_path_factory.mktemp("tiny-llava"), "llava"))


def _images() -> list[Any]:
    """Two different 336x336 RGB noise images (fixed seed)."""
    from PIL import Image

    rng = np.random.default_rng(7)
    return [Image.fromarray(rng.integers(0, 256, (336, 336, 3), dtype=np.uint8), "RGB") for _ in range(2)]


def _png(image: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _chat(url: str, **body: Any) -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": NEW,
            "temperature": 0, "ignore_eos": True, **body}


def _bodies() -> list[dict[str, Any]]:
    """Two image requests, a text request, a truncated PNG (in this order)."""
    first, second = (_png(image) for image in _images())
    return [_chat(_data_url(first)), _chat(_data_url(second)),
            {"model": "m", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": NEW},
            _chat(_data_url(first[: len(first) // 2]))]


@pytest.fixture(scope="module")
def prompt_text(llava_dir: str) -> str:
    """The chat prompt the service renders for ``_chat``, rendered by the folder's processor."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(llava_dir, local_files_only=True)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    return str(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))


def _greedy() -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)


def _shutdown(service: InferenceService, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Stop vLLM: ``AsyncLLM.shutdown()`` on its loop (its renderer, engine core and output task), or
    ``LLMEngine``'s renderer and engine core."""
    engine = _llm(service)
    if loop is not None:
        engine.shutdown()
        loop.run_until_complete(asyncio.sleep(0.1))  # the output task sees its cancellation
        return
    engine.renderer.shutdown()
    engine.engine_core.shutdown()


def _llm(service: InferenceService) -> Any:
    """vLLM's own engine inside the service's adapter (``LLMEngine`` or ``AsyncLLM``)."""
    adapter: Any = service.engine
    return adapter.engine


def _facts(engine: Any) -> dict[str, Any]:
    """What the adapter and vLLM say about images (read before the engine stops)."""
    config = engine.engine.model_config.multimodal_config
    return {"media_options": engine.media_options, "vllm_limit": config.get_limit_per_prompt("image"),
            "tokenizer": engine.tokenizer}


# -- sync mode: LLMEngine ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sync_run(llava_dir: str, prompt_text: str) -> dict[str, Any]:
    """The batch's answers (status, body, error) and vLLM's own outputs for the two images; the
    engine stops afterwards."""
    service = InferenceService("vllm")
    driver = RollingBatchDriver(service.handle)
    started = time.monotonic()
    assert driver.init({"model_id": llava_dir, "rolling_batch": "vllm", **OPTIONS}) is None
    print(f"djl_handlers.vllm (sync mode) with the tiny LLaVA ready in {time.monotonic() - started:.1f}s")
    try:
        facts = _facts(service.engine)
        reqs = [driver.submit(json_request(body)) for body in _bodies()]
        driver.run()
        llm = _llm(service)
        for i, image in enumerate(_images()):
            llm.add_request(f"reference-{i}", {"prompt": prompt_text, "multi_modal_data": {"image": image}}, _greedy())
        finished: dict[str, Any] = {}
        deadline = time.monotonic() + 120
        while llm.has_unfinished_requests():
            assert time.monotonic() < deadline
            finished.update((o.request_id, o) for o in llm.step() if o.finished)
    finally:
        _shutdown(service)
    return {**facts, "answers": [(r.code or 200, r.text, r.error) for r in reqs],
            "reference": [finished[f"reference-{i}"] for i in range(2)]}


# -- async mode: AsyncLLM ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def async_run(llava_dir: str, prompt_text: str) -> dict[str, Any]:
    """As ``sync_run`` in async mode, with a beam search with an image and vLLM's own beam-search
    loop on vLLM's own rendering of that prompt."""
    from vllm.renderers.inputs.preprocess import parse_model_prompt
    from vllm.sampling_params import BeamSearchParams

    from djl_handlers.engines.external.vllm_beams import searcher

    loop = asyncio.new_event_loop()
    service = InferenceService("vllm")
    client = AsyncModeClient(service.handle)
    started = time.monotonic()
    assert loop.run_until_complete(client.init({"model_id": llava_dir, "rolling_batch": "disable", **OPTIONS})) is None
    print(f"djl_handlers.vllm (async mode) with the tiny LLaVA ready in {time.monotonic() - started:.1f}s")
    beam_body = _chat(_data_url(_png(_images()[0])), max_tokens=BEAM_TOKENS, use_beam_search=True, n=2,
                      ignore_eos=False)

    async def reference(llm: Any, image: Any, rid: str) -> Any:
        last = None
        async for out in llm.generate({"prompt": prompt_text, "multi_modal_data": {"image": image}}, _greedy(), rid):
            last = out
        return last

    async def beams(llm: Any, image: Any) -> list[list[int]]:
        parsed = parse_model_prompt(llm.model_config, {"prompt": prompt_text, "multi_modal_data": {"image": image}})
        (rendered,) = await llm.renderer.render_cmpl_async([parsed], llm.renderer.default_cmpl_tok_params)
        params = BeamSearchParams(beam_width=2, max_tokens=BEAM_TOKENS, temperature=0.0)
        outs = [o async for o in searcher(llm).beam_search(rendered, "reference-beams", params)]
        return [list(c.token_ids) for c in outs[-1].outputs]

    async def main() -> dict[str, Any]:
        answers: list[AsyncAnswer] = list(await asyncio.gather(*(client.request(b) for b in _bodies())))
        beam = await client.request(beam_body)
        llm = _llm(service)
        refs = [await reference(llm, image, f"reference-{i}") for i, image in enumerate(_images())]
        return {**_facts(service.engine), "answers": [(a.code, a.text, a.error) for a in answers],
                "reference": refs, "beam": (beam.code, beam.text, beam.error), "beam_reference":
                await beams(llm, _images()[0]), "unfinished": llm.get_num_unfinished_requests()}

    try:
        return loop.run_until_complete(main())
    finally:
        _shutdown(service, loop)
        loop.close()


@pytest.fixture(scope="module", params=["sync", "async"])
def run(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dict(request.getfixturevalue(f"{request.param}_run"))


# -- the checks ----------------------------------------------------------------------------------
def test_vision_model_takes_images_with_vllms_limit(run: dict[str, Any]) -> None:
    assert run["media_options"] is not None and run["media_options"].limit_images == 1
    assert run["vllm_limit"] == 1  # vLLM's own limit_mm_per_prompt


def test_image_answers_equal_vllms_own(run: dict[str, Any]) -> None:
    texts = []
    for (code, text, error), want in zip(run["answers"][:2], run["reference"], strict=True):
        assert code == 200, error
        body = json.loads(text)
        assert body["choices"][0]["message"]["content"] == want.outputs[0].text
        assert body["usage"]["completion_tokens"] == len(want.outputs[0].token_ids) == NEW
        texts.append(want.outputs[0].text)
    assert texts[0] != texts[1]  # the pixels reach the model


def test_usage_counts_the_prompt_vllm_prefilled(run: dict[str, Any]) -> None:
    for (_, text, _), want in zip(run["answers"][:2], run["reference"], strict=True):
        usage = json.loads(text)["usage"]
        assert usage["prompt_tokens"] == len(want.prompt_token_ids) > IMAGE_TOKENS


def test_text_request_and_truncated_png_in_the_same_batch(run: dict[str, Any]) -> None:
    (code, text, error), (bad_code, _, bad_error) = run["answers"][2:]
    assert code == 200, error
    body = json.loads(text)
    assert body["choices"][0]["message"]["content"] and 0 < body["usage"]["prompt_tokens"] < 32
    assert bad_code == 400 and BAD_PART in (bad_error or ""), bad_error


def test_async_beam_search_with_an_image_returns_vllms_beams(async_run: dict[str, Any]) -> None:
    code, text, error = async_run["beam"]
    assert code == 200, error
    tokenizer = async_run["tokenizer"]
    choices = sorted(json.loads(text)["choices"], key=lambda c: c["index"])
    want = [tokenizer.decode(ids, skip_special_tokens=True) for ids in async_run["beam_reference"]]
    assert [c["message"]["content"] for c in choices] == want
    assert json.loads(text)["usage"]["prompt_tokens"] > IMAGE_TOKENS
    assert async_run["unfinished"] == 0
