"""Structured output through the vLLM and TensorRT-LLM adapters, against the fakes in tests/fakes
(which mirror ``vllm.sampling_params.StructuredOutputsParams`` and TensorRT-LLM's
``GuidedDecodingParams``), and the fake engine's refusal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.config.models import ServingConfig
from djl_handlers.engines.base import EngineRequest
from djl_handlers.errors import InvalidParameter
from djl_handlers.params.generation import GenerationParameters

FAKES = Path(__file__).resolve().parents[1] / "fakes"
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


def _drop(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    _drop("vllm")
    _drop("tensorrt_llm")
    monkeypatch.syspath_prepend(str(FAKES))
    yield
    _drop("vllm")
    _drop("tensorrt_llm")


def request(engine: str, rid: int = 1, **params: Any) -> EngineRequest:
    return EngineRequest(rid, [5, 6, 7], GenerationParameters.from_dict({"max_new_tokens": 4, **params}, engine), "p")


@pytest.mark.usefixtures("fakes")
@pytest.mark.parametrize(
    ("params", "field", "value"),
    [
        ({"guided_json": SCHEMA}, "json", SCHEMA),
        ({"guided_regex": "[a-z]+"}, "regex", "[a-z]+"),
        ({"guided_choice": ["x", "y"]}, "choice", ["x", "y"]),
        ({"guided_grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
        ({"guided_json_object": True}, "json_object", True),
    ],
)
def test_vllm_gets_structured_outputs_params(params: dict[str, Any], field: str, value: Any) -> None:
    import vllm

    from djl_handlers.engines.external.vllm import VllmEngine

    options = {"model_id": "toy", "rolling_batch": "vllm"}
    engine = VllmEngine.from_config(ServingConfig.from_properties(options, engine="vllm"))
    engine.add_request(request("vllm", **params))
    so = engine.engine.added["1"].structured_outputs
    assert isinstance(so, vllm.sampling_params.StructuredOutputsParams)
    assert getattr(so, field) == value
    others = {"json", "regex", "choice", "grammar", "json_object"} - {field}
    assert all(getattr(so, name) is None for name in others)


@pytest.mark.usefixtures("fakes")
def test_vllm_rejection_of_the_constraint_is_a_400_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from djl_handlers.engines.external.vllm import VllmEngine

    options = {"model_id": "toy", "rolling_batch": "vllm"}
    engine = VllmEngine.from_config(ServingConfig.from_properties(options, engine="vllm"))

    def reject(*args: Any, **kwargs: Any) -> None:
        raise ValueError("Failed to convert the grammar")

    monkeypatch.setattr(engine.engine, "add_request", reject)
    with pytest.raises(InvalidParameter, match="vLLM rejected parameters.guided_regex") as info:
        engine.add_request(request("vllm", guided_regex="[0-9]"))
    assert info.value.field == "guided_regex"


@pytest.mark.usefixtures("fakes")
def test_older_vllm_without_structured_outputs_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm

    from djl_handlers.engines.external.vllm import vllm_structured_kwargs

    monkeypatch.delattr(vllm.sampling_params, "StructuredOutputsParams")
    monkeypatch.delattr(vllm, "StructuredOutputsParams")
    with pytest.raises(InvalidParameter, match="not supported by the installed vLLM"):
        vllm_structured_kwargs(vllm, {"regex": "a"})


@pytest.mark.usefixtures("fakes")
@pytest.mark.parametrize(
    ("params", "field", "value"),
    [
        ({"guided_json": SCHEMA}, "json", SCHEMA),
        ({"guided_regex": "[a-z]+"}, "regex", "[a-z]+"),
        ({"guided_choice": ["x", "y"]}, "regex", "(x|y)"),
        ({"guided_grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
        ({"guided_json_object": True}, "json_object", True),
    ],
)
def test_trtllm_gets_guided_decoding_params(params: dict[str, Any], field: str, value: Any) -> None:
    import tensorrt_llm

    from djl_handlers.engines.external.trtllm import TrtLlmEngine, llm_kwargs

    config = ServingConfig.from_properties({"model_id": "toy"}, engine="tensorrt_llm")
    assert llm_kwargs(config, tensorrt_llm.llmapi)["guided_decoding_backend"] == "xgrammar"
    engine = TrtLlmEngine.from_config(config)
    try:
        engine.add_request(request("tensorrt_llm", **params))
        sp = next(iter(engine.llm.submitted.values()))
        assert isinstance(sp.guided_decoding, tensorrt_llm.llmapi.GuidedDecodingParams)
        assert getattr(sp.guided_decoding, field) == value
    finally:
        engine.close()


def test_fake_engine_refuses_structured_output() -> None:
    from djl_handlers.engines.fake import FakeEngine

    engine = FakeEngine()
    with pytest.raises(InvalidParameter, match="not supported by engine fake"):
        engine.add_request(request("huggingface", guided_regex="a"))
    assert not engine.has_unfinished()
