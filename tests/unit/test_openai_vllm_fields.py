"""vLLM's extra request fields on the OpenAI routes: mapped onto the LMI parameters, honoured per
engine, refused with a 400 naming the client's field where an engine cannot honour them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from djl_handlers.dialects.openai.fields import DEFAULT_ONLY, FIELDS, IGNORED, PARAMETER
from djl_handlers.dialects.openai.request import chat_to_lmi, completion_to_lmi, openai_request
from djl_handlers.engines.fake import EOS_ID, REPLY, FakeEngine
from djl_handlers.errors import InvalidParameter, InvalidRequest
from djl_handlers.io import Input
from djl_handlers.params.generation import SPECS
from djl_handlers.request.parser import ParserSettings
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

PROMPT = {"prompt": "Hello"}


def _item() -> Input:
    return Input()


def _parse(body: dict[str, Any], engine: str = "huggingface", chat: bool = False) -> Any:
    settings = ParserSettings(engine=engine, chat_template=_Template() if chat else None)
    return openai_request(_item(), body, settings, chat=chat)


class _Template:
    """A chat template that records the keyword arguments it was called with."""

    reads_tools = False

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        self.calls.append(kwargs)
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)


def test_every_parameter_field_names_a_real_lmi_parameter() -> None:
    for api in FIELDS.values():
        for spec in api.values():
            if spec.handling == PARAMETER:
                assert spec.parameter in SPECS or spec.parameter.startswith("guided_"), spec


@pytest.mark.parametrize(("field", "value", "parameter", "expected"), [
    ("ignore_eos", True, "ignore_eos_token", True),
    ("min_tokens", 3, "min_new_tokens", 3),
    ("top_k", 7, "top_k", 7),
    ("repetition_penalty", 1.2, "repetition_penalty", 1.2),
    ("include_stop_str_in_output", True, "include_stop_str_in_output", True),
    ("skip_special_tokens", False, "skip_special_tokens", False),
    ("truncate_prompt_tokens", 4, "truncate", 4),
    ("stop_token_ids", [5], "stop_token_ids", (5,)),
])
def test_vllm_fields_set_lmi_parameters_on_the_hf_engine(field: str, value: Any, parameter: str,
                                                          expected: Any) -> None:
    request = _parse({**PROMPT, field: value})
    assert getattr(request.params, parameter) == expected
    assert parameter in request.params.provided


@pytest.mark.parametrize(("field", "value", "parameter"), [
    ("min_p", 0.1, "min_p"), ("bad_words", ["x"], "bad_sequences"),
    ("spaces_between_special_tokens", False, "spaces_between_special_tokens"),
])
def test_vllm_sampling_fields_are_honoured_by_the_hf_engine_as_by_vllm(field: str, value: Any, parameter: str) -> None:
    expected = tuple(value) if isinstance(value, list) else value
    for engine in ("huggingface", "vllm"):
        accepted = _parse({**PROMPT, field: value}, engine=engine)
        assert getattr(accepted.params, parameter) == expected


def test_a_bad_value_of_a_vllm_sampling_field_is_a_400_naming_it() -> None:
    with pytest.raises(InvalidParameter) as info:
        _parse({**PROMPT, "min_p": 2})
    assert info.value.field == "min_p" and "min_p" in info.value.message


def test_default_values_are_accepted_where_the_engine_lacks_the_feature() -> None:
    request = _parse({**PROMPT, "min_p": 0.0, "stop_token_ids": [], "ignore_eos": False, "use_beam_search": False,
                      "priority": 0, "spaces_between_special_tokens": True, "bad_words": []})
    assert request.params.min_p == 0.0 and not request.params.ignore_eos_token


def test_an_lmi_error_names_the_field_as_the_client_spelled_it() -> None:
    with pytest.raises(InvalidParameter) as info:
        _parse({**PROMPT, "ignore_eos": "yes"})
    assert info.value.field == "ignore_eos"
    assert info.value.message.startswith("ignore_eos must be a boolean")
    with pytest.raises(InvalidParameter) as info:
        _parse({**PROMPT, "min_tokens": 9, "max_tokens": 4})
    assert info.value.field == "min_tokens" and "ignore_eos_token" not in info.value.message


def test_use_beam_search_is_vllm_beam_width_n_and_greedy() -> None:
    params = _parse({**PROMPT, "use_beam_search": True, "n": 3, "temperature": 0.7}).params
    assert (params.num_beams, params.n, params.do_sample) == (3, 3, False)
    params = _parse({**PROMPT, "use_beam_search": True, "n": 2, "best_of": 4, "length_penalty": 0.5}).params
    assert (params.num_beams, params.n, params.best_of, params.length_penalty) == (4, 2, 4, 0.5)
    with pytest.raises(InvalidParameter) as info:
        _parse({**PROMPT, "use_beam_search": "yes"})
    assert info.value.field == "use_beam_search"
    params = _parse({**PROMPT, "use_beam_search": True, "n": 2}, engine="tensorrt_llm").params
    assert (params.num_beams, params.n, params.do_sample) == (2, 2, False)  # TensorRT-LLM's beam search


@pytest.mark.parametrize(("field", "value"), [("priority", 3), ("logits_processors", ["x"]),
                                              ("suffix", "tail"), ("return_tokens_as_token_ids", True)])
def test_default_only_fields_refuse_other_values(field: str, value: Any) -> None:
    with pytest.raises(InvalidParameter) as info:
        _parse({**PROMPT, field: value})
    assert info.value.field == field and "not supported" in info.value.message


def test_ignored_and_unknown_fields() -> None:
    ignored = [name for name, spec in FIELDS["completion"].items() if spec.handling == IGNORED]
    assert "user" in ignored and "request_id" in ignored
    _parse({**PROMPT, **{name: "x" for name in ignored}})
    with pytest.raises(InvalidRequest) as info:
        completion_to_lmi({**PROMPT, "not_a_field": 1})
    assert info.value.field == "not_a_field"


def test_default_only_table_holds_each_default_in_its_schema() -> None:
    for api in FIELDS.values():
        for spec in api.values():
            if spec.handling == DEFAULT_ONLY:
                assert spec.schema["enum"][0] is None
                assert spec.default is None or spec.schema["enum"][1] == spec.default


def test_structured_outputs_object_becomes_a_guided_parameter() -> None:
    request = _parse({**PROMPT, "structured_outputs": {"choice": ["yes", "no"]}})
    assert request.params.structured_output is not None
    assert request.params.structured_output.kind == "choice"
    with pytest.raises(InvalidParameter) as info:
        _parse({**PROMPT, "structured_outputs": {"regex": "a+", "choice": ["a"]}})
    assert info.value.field == "structured_outputs"
    with pytest.raises(InvalidParameter):
        _parse({**PROMPT, "structured_outputs": {"regex": "a+"}, "guided_choice": ["a"]})


def test_chat_template_options_reach_the_template() -> None:
    template = _Template()
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": False},
            "continue_final_message": True}
    chat_to_lmi(body, template)
    assert template.calls[-1] == {"enable_thinking": False, "continue_final_message": True,
                                  "add_generation_prompt": False}
    chat_to_lmi({"messages": body["messages"]}, template)
    assert template.calls[-1] == {}  # a plain render: the template's own defaults
    with pytest.raises(InvalidParameter):
        chat_to_lmi({**body, "add_generation_prompt": True}, template)
    with pytest.raises(InvalidParameter) as info:
        chat_to_lmi({**body, "chat_template_kwargs": {"tokenize": True}}, template)
    assert info.value.field == "chat_template_kwargs"


def test_a_template_that_fails_on_the_messages_is_a_400() -> None:
    def strict(messages: list[dict[str, Any]], **kwargs: Any) -> str:
        raise ValueError("Conversation roles must alternate user/assistant")

    with pytest.raises(InvalidRequest) as info:
        chat_to_lmi({"messages": [{"role": "user", "content": "hi"}]}, strict)
    assert "roles must alternate" in info.value.message and info.value.field == "messages"


def test_add_special_tokens_is_honoured_when_tokenizing() -> None:
    assert _parse({**PROMPT, "add_special_tokens": False}).add_special_tokens is False
    assert _parse(PROMPT).add_special_tokens is None


# -- through the service on the fake engine -----------------------------------------------------

def _run(body: dict[str, Any]) -> dict[str, Any]:
    engine = FakeEngine()
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    driver = RollingBatchDriver(service.handle)
    driver.init({"rolling_batch": "auto"})
    req = driver.submit(json_request(body))
    driver.run()
    return json.loads(req.text)


def test_ignore_eos_generates_past_the_eos_token() -> None:
    body = {"prompt": "<eos@3>", "max_tokens": 6, "temperature": 0}
    stopped = _run(body)
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] == 3
    went_on = _run({**body, "ignore_eos": True})
    assert went_on["choices"][0]["finish_reason"] == "length"
    assert went_on["usage"]["completion_tokens"] == 6
    assert EOS_ID not in [ord(c) for c in went_on["choices"][0]["text"]]


def test_min_tokens_passes_over_stop_strings_until_reached() -> None:
    body = {"prompt": "x", "max_tokens": 30, "temperature": 0, "stop": ["quick", "o"]}  # one byte a token
    early = _run(body)
    assert early["choices"][0]["text"] == REPLY[:REPLY.index("quick")]
    late = _run({**body, "min_tokens": 14})  # past "quick" and the "o" of "brown" (token 13)
    assert late["choices"][0]["finish_reason"] == "stop"
    assert late["choices"][0]["text"] == REPLY[:REPLY.index("o", 13)]  # the "o" of "fox"
    assert late["usage"]["completion_tokens"] == REPLY.index("o", 13) + 1


def test_stop_token_ids_end_the_request_on_the_hf_pipeline() -> None:
    stop = ord("o")  # one byte a token: the "o" of "brown" (index 12), then of "fox" (17)
    body = {"prompt": "x", "max_tokens": 30, "temperature": 0, "stop_token_ids": [stop]}
    stopped = _run(body)
    assert stopped["choices"][0]["text"] == REPLY[:12] and stopped["choices"][0]["finish_reason"] == "stop"
    assert _run({**body, "include_stop_str_in_output": True})["choices"][0]["text"] == REPLY[:13]
    assert _run({**body, "min_tokens": 14})["choices"][0]["text"] == REPLY[:17]  # the first "o" was text
    assert _run({**body, "ignore_eos": True})["choices"][0]["text"] == REPLY[:12]


def test_docs_name_every_field_of_the_table() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text(encoding="utf-8")
    section = text.split("#### vLLM's extra request fields")[1].split("\n### ")[0]
    own = {name for api in FIELDS.values() for name, spec in api.items() if spec.handling == "own"}
    missing = [name for api in FIELDS.values() for name in api if name not in own and f"`{name}`" not in section]
    assert not missing


def test_samples_are_bounded() -> None:
    """A huge ``n`` (found by the schema fuzzer) used to make the worker build that many samples."""
    from djl_handlers.params.generation import MAX_SAMPLES

    for field in ("n", "best_of"):
        with pytest.raises(InvalidParameter) as info:
            _parse({**PROMPT, field: 43238211167902})
        assert info.value.field == field
    assert FIELDS["chat"]["n"].schema["anyOf"][0]["maximum"] == MAX_SAMPLES
