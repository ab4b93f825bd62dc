"""Vision-language chat on DJL Serving 0.36's real front end: the same random-weight LLaVA-style model
and requests as ``test_server_vision.py``, in sync rolling mode (``option.rolling_batch=scheduler``)
and in async mode. Greedy fp32 answers equal transformers' ``generate()`` with the processor's inputs,
usage counts the image tokens, and a truncated image is a 400 naming its part."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from djl_server_fixture import (  # noqa: F401  (djl_server_fixture registers the fixture)
    DjlServer,
    DjlServerFactory,
    djl_server_fixture,
    version_param,
)
from test_server_vision import data_url, png, reference, reference_model, user, vlm  # noqa: F401

pytestmark = [pytest.mark.djl, pytest.mark.slow]

MODES = {"sync": "option.rolling_batch=scheduler", "async": "option.async_mode=true\noption.rolling_batch=disable"}


@pytest.fixture(scope="module", params=[pytest.param(("0.36", mode), marks=version_param("0.36").marks,
                                                     id=f"djl-0.36-{mode}") for mode in MODES])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, vlm: Path,  # noqa: F811
           djl_server: DjlServerFactory) -> DjlServer:
    version, mode = request.param
    folder = tmp_path_factory.mktemp(f"djl-vision-{mode}")
    (folder / "serving.properties").write_text("\n".join([
        "engine=Python", "option.entryPoint=djl_handlers.huggingface", f"option.model_id={vlm}",
        "option.dtype=fp32", MODES[mode], "option.predict_timeout=120", "minWorkers=1", "maxWorkers=1", ""]))
    return djl_server(folder, version=str(version))


def _chat(server: DjlServer, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"messages": messages, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    return httpx.post(server.url + "/invocations", json=body, timeout=120)


def test_image_chat_equals_transformers(server: DjlServer, reference_model: tuple[Any, Any]) -> None:  # noqa: F811
    res = _chat(server, [user(data_url(png(1)))])
    assert res.status_code == 200, res.text
    text, prompt_tokens = reference(reference_model, [png(1)], "What is in the picture?")
    body = res.json()
    assert body["choices"][0]["message"]["content"] == text
    assert body["usage"]["prompt_tokens"] == prompt_tokens


def test_truncated_image_is_a_400_naming_the_part(server: DjlServer) -> None:
    res = _chat(server, [user(data_url(png(2)[:300]))])
    assert res.status_code == 400, res.text
    assert "messages[0].content[0].image_url" in res.text
    text = _chat(server, [{"role": "user", "content": "Hello"}])
    assert text.status_code == 200, text.text
