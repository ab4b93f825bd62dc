"""DJL's ``test_model.TestHandler`` (from the jar) driving ``djl_handlers.huggingface``.

Our equivalent of DJL's ``test_test_model.py``, which needs ``djl_python.huggingface`` and
``djl_python.tests.rolling_batch.fake_rolling_batch`` (neither is in the jar nor in ../shared).
The model is the tiny random Llama from env ``TINY_MODEL_DIR``. DJL's worker sends an init message
with the model's properties before any batch, so each test sends one first.
"""

from __future__ import annotations

import json
import os

import pytest
from djl_python import Input, Output
from djl_python.test_model import TestHandler

import djl_handlers.huggingface as huggingface

MODEL = os.environ.get("TINY_MODEL_DIR", "")
pytestmark = pytest.mark.skipif(not MODEL, reason="TINY_MODEL_DIR not set")

PROMPTS = [
    {"inputs": "The winner of oscar this year is", "parameters": {"max_new_tokens": 6}},
    {"inputs": "A little redhood is", "parameters": {"max_new_tokens": 3}},
]


@pytest.fixture(autouse=True)
def fresh_service() -> None:
    huggingface._service.initialized = False  # a fresh service per test (what TestHandler(module) does)


def _init(handler: TestHandler) -> None:
    assert handler.inference(Input()) is None  # the init message: properties only


def test_rolling_batch_with_serving_properties() -> None:
    handler = TestHandler(huggingface)
    handler.serving_properties.update({"engine": "Python", "rolling_batch": "auto", "model_id": MODEL})
    _init(handler)
    result = handler.inference_rolling_batch([dict(p) for p in PROMPTS])
    assert sorted(result) == [0, 1]
    texts = [json.loads(result[i])["generated_text"] for i in (0, 1)]
    assert all(isinstance(t, str) and t for t in texts)
    # greedy decoding: the same request alone gives the same text
    again = handler.inference_rolling_batch([dict(PROMPTS[1])])
    assert json.loads(again[0])["generated_text"] == texts[1]


def test_with_env_and_tgi_compat(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"HF_MODEL_ID": MODEL, "OPTION_ROLLING_BATCH": "auto", "OPTION_TGI_COMPAT": "true"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    handler = TestHandler(huggingface)
    assert handler.serving_properties["rolling_batch"] == "auto"
    assert handler.serving_properties["tgi_compat"] == "true"
    assert handler.serving_properties["model_id"] == MODEL
    _init(handler)
    result = handler.inference_rolling_batch([dict(p) for p in PROMPTS])
    for i in (0, 1):
        body = json.loads(result[i])
        assert isinstance(body, list) and isinstance(body[0]["generated_text"], str)


def test_dynamic_batch_output_is_ours() -> None:
    handler = TestHandler(huggingface)
    handler.serving_properties.update({"rolling_batch": "disable", "model_id": MODEL})
    _init(handler)
    out = handler.inference_batch([dict(p) for p in PROMPTS])
    assert isinstance(out, Output) and out.code == 200
    assert out.content.get_keys() == ["batch_0.data", "batch_1.data"]
    assert all(isinstance(json.loads(bytes(v)), list) for v in out.content.get_values())
