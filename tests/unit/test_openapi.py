"""``/openapi.json``: a valid OpenAPI 3.1 document (checked by openapi-spec-validator) that describes
every route the app serves, whose parameter schemas accept exactly what the validators accept, and
whose response schemas every golden response file satisfies (checked by jsonschema)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from djl_handlers.dialects.openai.fields import DEFAULT_ONLY, FIELDS
from djl_handlers.errors import InvalidParameter
from djl_handlers.params.generation import SPECS, GenerationParameters
from djl_handlers.params.schema import parameter_schema
from djl_handlers.server.access import AccessSettings
from djl_handlers.server.openapi import openapi_document

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "formatting"
FAKE = ROOT / "tests" / "robustness" / "models" / "fake_lmi"
ENGINES = ("huggingface", "vllm", "tensorrt_llm")
JSON, SSE, LINES, TEXT = "application/json", "text/event-stream", "application/jsonlines", "text/plain"
# each golden format: the route that answers in it and its content type
GOLDEN_ROUTES = {
    "json": ("/invocations", JSON), "jsonlines": ("/invocations", LINES), "sse": ("/invocations", SSE),
    "none": ("/invocations", TEXT), "3p": ("/invocations", JSON), "3p_stream": ("/invocations", LINES),
    "json_chat": ("/invocations", JSON), "jsonlines_chat": ("/invocations", LINES),
    "tgi": ("/generate", JSON), "tgi_stream": ("/generate_stream", SSE),
    "chat_json": ("/v1/chat/completions", JSON), "chat_sse": ("/v1/chat/completions", SSE),
    "completion_json": ("/v1/completions", JSON), "completion_sse": ("/v1/completions", SSE),
}
PROBES: list[Any] = [None, True, False, -2, -1, 0, 1, 2, 5, 21, 4096, 4097, 2**64, -0.5, 0.0, 0.3, 1.0, 1.5, 2.5,
                     "x", "", "12", [], ["a"], [""], [1, 2], [-1], {}]


def _doc(engine: str = "huggingface", access: AccessSettings | None = None) -> dict[str, Any]:
    return openapi_document({"parameters_engine": engine, "max_new_tokens_limit": 4096}, "model", access)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_document_is_valid_openapi_3_1(engine: str) -> None:
    validate(_doc(engine))
    validate(_doc(engine, AccessSettings(api_key="k")))


def test_every_served_route_is_described() -> None:
    from djl_handlers.server.app import create_app
    from djl_handlers.server.runtime import ModelRuntime
    from djl_handlers.server.settings import load_settings

    app = create_app(ModelRuntime(load_settings(FAKE)))  # the worker is never started
    described = _doc()["paths"]
    served = {route.path: {m.lower() for m in route.methods or ()} - {"head"} for route in app.routes}
    assert set(served) == set(described)
    for path, methods in served.items():
        documented = {m for m in described[path] if m != "parameters"}
        assert documented and documented <= methods, path


def test_the_api_key_is_described_and_probes_stay_open() -> None:
    doc = _doc(access=AccessSettings(api_key="k"))
    assert doc["security"] == [{"bearer": []}]
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert "security" not in doc["paths"]["/v1/models"]["get"]
    closed = _doc(access=AccessSettings(api_key="k", protect_probes=True))
    assert "security" not in closed["paths"]["/ping"]["get"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_parameter_schemas_accept_what_the_validators_accept(engine: str, name: str) -> None:
    schema = Draft202012Validator(parameter_schema(name, engine, max_new_tokens=4096))
    for value in PROBES:
        try:
            GenerationParameters.from_dict({name: value}, engine, max_new_tokens_limit=4096)
            accepted = True
        except InvalidParameter:
            accepted = False
        if name in ("min_new_tokens", "best_of") and accepted is False and schema.is_valid(value):
            continue  # a cross-field rule (<= max_new_tokens, >= n), not the value's own range
        if isinstance(value, float) and value.is_integer() and not accepted:
            continue  # JSON Schema cannot tell 1.0 from 1; the server wants a JSON integer (docs/schema.md)
        assert schema.is_valid(value) == accepted, (name, engine, value)


def test_openai_bodies_come_from_the_field_table() -> None:
    doc = _doc("vllm")
    chat = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"][JSON]["schema"]
    assert set(chat["properties"]) == set(FIELDS["chat"]) | {"adapters"}
    assert chat["properties"]["min_tokens"] == parameter_schema("min_new_tokens", "vllm")
    hf = _doc("huggingface")["paths"]["/v1/completions"]["post"]["requestBody"]["content"][JSON]["schema"]
    assert hf["properties"]["min_p"] == parameter_schema("min_p", "huggingface")  # the HF sampler has min_p
    for name, spec in FIELDS["completion"].items():
        if spec.handling == DEFAULT_ONLY:
            assert hf["properties"][name]["enum"] == spec.schema["enum"]


def _pieces(text: str, content_type: str) -> list[Any]:
    """The JSON values (or strings) a golden body is made of, for its content type."""
    if content_type == JSON:
        return [json.loads(text)]
    if content_type == LINES:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if content_type == SSE:
        events = []
        for event in text.split("\n\n"):
            for line in event.splitlines():
                if line.startswith("data:"):
                    payload = line[len("data:"):].strip()
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
        return events
    return [text]


def test_every_golden_format_is_mapped_to_a_route() -> None:
    assert {p.name for p in GOLDEN.iterdir() if p.is_dir()} == set(GOLDEN_ROUTES)


@pytest.mark.parametrize("name", sorted(GOLDEN_ROUTES))
def test_golden_responses_match_their_route_schema(name: str) -> None:
    doc = _doc()
    path, content_type = GOLDEN_ROUTES[name]
    operation = doc["paths"][path]["post"]
    media = operation["responses"]["200"]["content"][content_type]
    success = media.get("x-stream-item", media["schema"])
    error = operation["responses"]["default"]["content"][JSON]["schema"]
    validator = Draft202012Validator({"anyOf": [success, error], "components": doc["components"]})
    files = sorted((GOLDEN / name).glob("*.txt"))
    assert files
    for golden in files:
        for piece in _pieces(golden.read_text(encoding="utf-8"), content_type):
            errors = [e.message for e in validator.iter_errors(piece)]
            assert not errors, (golden.name, piece, errors[:3])


def test_a_wrong_shape_fails_the_response_schema() -> None:
    doc = _doc()
    schema = {**doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"][JSON]["schema"],
              "components": doc["components"]}
    assert not Draft202012Validator(schema).is_valid({"object": "chat.completion", "choices": "no"})
