"""GenerationParameters: seed defaults, per-engine defaults, validation and the unknown-key rule."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from djl_handlers.errors import InvalidParameter
from djl_handlers.params import GenerationParameters
from djl_handlers.params.translate import ENGINES, known_parameters

gp = GenerationParameters.from_dict

COMMON_DEFAULTS = {
    "do_sample": False, "seed": None, "temperature": 1.0, "repetition_penalty": 1.0, "top_k": 0,
    "top_p": 1.0, "max_new_tokens": 30, "details": False, "return_full_text": False,
    "stop_sequences": (),
}
DEEPSPEED_EXTRAS = {"typical_p": 1.0, "truncate": None}
VLLM_EXTRAS = {
    "top_k": -1, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "num_beams": 1,
    "length_penalty": 1.0, "early_stopping": False, "stop_token_ids": (),
    "include_stop_str_in_output": False, "ignore_eos_token": False, "logprobs": None,
    "prompt_logprobs": None, "skip_special_tokens": True, "spaces_between_special_tokens": True,
}
LMI_DIST_EXTRAS = {**VLLM_EXTRAS, **DEEPSPEED_EXTRAS}
TRT_EXTRAS = {"min_length": 1, "bad_sequences": (), "temperature": 0.8, "top_k": 0, "top_p": 0.0}


def values(p: GenerationParameters, names: dict[str, Any]) -> dict[str, Any]:
    return {k: getattr(p, k) for k in names}


# -- defaults (the seed) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("huggingface", COMMON_DEFAULTS),
        ("deepspeed", {**COMMON_DEFAULTS, **DEEPSPEED_EXTRAS}),
        ("vllm", {**COMMON_DEFAULTS, **VLLM_EXTRAS}),
        ("lmi-dist", {**COMMON_DEFAULTS, **LMI_DIST_EXTRAS}),
        ("tensorrt_llm", {**COMMON_DEFAULTS, **TRT_EXTRAS}),
    ],
)
def test_seed_defaults_per_engine(engine: str, expected: dict[str, Any]) -> None:
    p = gp({}, engine)
    assert values(p, expected) == expected
    assert p.engine == engine and p.provided == frozenset() and p.ignored == ()


def test_tensorrt_llm_sampling_defaults() -> None:
    p = gp({"do_sample": True}, "tensorrt_llm")
    assert (p.temperature, p.top_k, p.top_p) == (1.0, 5, 0.85)


def test_tensorrt_llm_greedy_defaults_when_do_sample_false() -> None:
    p = gp({"do_sample": False}, "tensorrt_llm")
    assert (p.temperature, p.top_k, p.top_p) == (0.8, 0, 0.0)


def test_explicit_values_beat_engine_defaults() -> None:
    p = gp({"do_sample": True, "top_k": 10, "temperature": 0.5}, "tensorrt_llm")
    assert (p.temperature, p.top_k, p.top_p) == (0.5, 10, 0.85)
    assert gp({"top_k": 3}, "vllm").top_k == 3


def test_engine_aliases() -> None:
    assert gp({}, "trtllm").engine == "tensorrt_llm"
    with pytest.raises(ValueError, match="unknown engine"):
        gp({}, "onnx")


# -- accepted values -------------------------------------------------------------------------


def test_typical_request() -> None:
    p = gp({"do_sample": True, "max_new_tokens": 256, "details": True, "temperature": 0.7,
            "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.1, "stop_sequences": ["\n\n", "###"],
            "return_full_text": True, "seed": 7, "truncate": 100, "typical_p": 0.95})
    assert (p.do_sample, p.max_new_tokens, p.details, p.temperature) == (True, 256, True, 0.7)
    assert (p.top_p, p.top_k, p.repetition_penalty, p.seed) == (0.9, 50, 1.1, 7)
    assert p.stop_sequences == ("\n\n", "###") and p.return_full_text and p.truncate == 100
    assert isinstance(p.temperature, float)


def test_int_given_for_float_becomes_float() -> None:
    p = gp({"temperature": 1, "top_p": 1})
    assert isinstance(p.temperature, float) and isinstance(p.top_p, float)


def test_seed_digit_string_from_java() -> None:
    assert gp({"seed": "12345"}).seed == 12345
    assert gp({"seed": 0}).seed == 0
    assert gp({"seed": str(2**64 - 1)}).seed == 2**64 - 1


@pytest.mark.parametrize("seed", ["abc", "-1", " 1", "1.5", "", "²", -1, 2**64, 1.0, True, [1]])
def test_bad_seeds(seed: Any) -> None:
    with pytest.raises(InvalidParameter) as err:
        gp({"seed": seed})
    assert err.value.field == "seed"


def test_stop_alias_and_single_string() -> None:
    assert gp({"stop": ["a", "b"]}).stop_sequences == ("a", "b")
    assert gp({"stop_sequences": "END"}).stop_sequences == ("END",)
    with pytest.raises(InvalidParameter, match="mean the same") as err:
        gp({"stop": ["a"], "stop_sequences": ["b"]})
    assert err.value.field in ("stop", "stop_sequences")


def test_tensorrt_llm_stop_boolean_is_accepted_without_effect() -> None:
    p = gp({"stop": True}, "tensorrt_llm")
    assert p.stop_sequences == () and p.ignored == ()
    with pytest.raises(InvalidParameter, match="stop_sequences"):
        gp({"stop": True}, "vllm")


def test_null_means_default() -> None:
    p = gp({"temperature": None, "seed": None, "top_k": None}, "vllm")
    assert (p.temperature, p.seed, p.top_k) == (1.0, None, -1)
    assert p.provided == frozenset()


def test_meta_keys_are_ignored() -> None:
    p = gp({"stream": True, "output_formatter": "jsonlines", "max_new_tokens": 5})
    assert p.max_new_tokens == 5 and p.ignored == () and p.provided == {"max_new_tokens"}


def test_max_new_tokens_limit_is_configurable() -> None:
    assert gp({"max_new_tokens": 8000}, max_new_tokens_limit=8000).max_new_tokens == 8000
    with pytest.raises(InvalidParameter, match=r"\[1, 100\], got 101"):
        gp({"max_new_tokens": 101}, max_new_tokens_limit=100)


def test_top_p_zero_only_for_tensorrt_llm() -> None:
    assert gp({"top_p": 0}, "tensorrt_llm").top_p == 0.0
    with pytest.raises(InvalidParameter, match=r"parameters.top_p must be a number in \(0, 1\], got 0"):
        gp({"top_p": 0}, "vllm")


# -- rejections name the field ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("temperature", -1, "parameters.temperature must be a number >= 0, got -1"),
        ("temperature", True, "parameters.temperature must be a number >= 0, got true"),
        ("temperature", "0.5", 'parameters.temperature must be a number >= 0, got "0.5"'),
        ("temperature", float("nan"), "got NaN"),
        ("temperature", float("inf"), "got Infinity"),
        ("temperature", 10**400, "must be a number >= 0"),
        ("top_p", 1.5, r"parameters.top_p must be a number in (0, 1], got 1.5"),
        ("top_p", 0.0, "top_p must be a number in (0, 1]"),
        ("top_k", -2, "parameters.top_k must be an integer >= -1, got -2"),
        ("top_k", 1.0, "top_k must be an integer"),
        ("max_new_tokens", 0, "parameters.max_new_tokens must be an integer in [1, 4096], got 0"),
        ("max_new_tokens", 4097, "got 4097"),
        ("max_new_tokens", "30", "max_new_tokens must be an integer"),
        ("repetition_penalty", 0, "parameters.repetition_penalty must be a number > 0, got 0"),
        ("do_sample", "true", 'parameters.do_sample must be a boolean (true or false), got "true"'),
        ("do_sample", 1, "do_sample must be a boolean"),
        ("details", "yes", "details must be a boolean"),
        ("return_full_text", 0, "return_full_text must be a boolean"),
        ("stop_sequences", [1, 2], "parameters.stop_sequences must be a list of non-empty strings"),
        ("stop_sequences", [""], "stop_sequences must be a list of non-empty strings"),
        ("stop_sequences", {"a": 1}, "stop_sequences must be a list"),
        ("typical_p", 0, "typical_p must be a number in (0, 1]"),
        ("truncate", 0, "truncate must be an integer >= 1"),
        ("min_new_tokens", -1, "min_new_tokens must be an integer >= 0"),
    ],
)
def test_rejections_name_the_field(key: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidParameter) as err:
        gp({key: value})
    assert message in str(err.value)
    assert err.value.field == key
    assert err.value.status == 400


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("min_p", 1.5), ("presence_penalty", 3), ("frequency_penalty", -2.5), ("stop_token_ids", [-1]),
        ("stop_token_ids", [True]), ("stop_token_ids", 5), ("logprobs", -1), ("logprobs", 21),
        ("prompt_logprobs", "1"), ("ignore_eos_token", "no"), ("skip_special_tokens", 1),
    ],
)
def test_vllm_rejections(key: str, value: Any) -> None:
    with pytest.raises(InvalidParameter) as err:
        gp({key: value}, "vllm")
    assert err.value.field == key and f"parameters.{key}" in str(err.value)


def test_trt_rejections() -> None:
    with pytest.raises(InvalidParameter, match="bad_sequences") as err:
        gp({"bad_sequences": [3]}, "tensorrt_llm")
    assert err.value.field == "bad_sequences"
    with pytest.raises(InvalidParameter, match="min_length must be an integer >= 0"):
        gp({"min_length": -1}, "tensorrt_llm")


def test_cross_field_checks() -> None:
    with pytest.raises(InvalidParameter, match="min_new_tokens must be <= max_new_tokens") as err:
        gp({"min_new_tokens": 10, "max_new_tokens": 5})
    assert err.value.field == "min_new_tokens"


def test_parameters_must_be_a_mapping() -> None:
    with pytest.raises(InvalidParameter, match="must be a JSON object") as err:
        gp(["temperature"])  # type: ignore[arg-type]
    assert err.value.field == "parameters"


# -- unknown / unsupported keys --------------------------------------------------------------


def test_unknown_key_strict_names_it_with_suggestions() -> None:
    with pytest.raises(InvalidParameter, match="unknown parameter 'temprature'; did you mean temperature") as err:
        gp({"temprature": 0.5})
    assert err.value.field == "temprature"


def test_unknown_key_without_close_match() -> None:
    with pytest.raises(InvalidParameter) as err:
        gp({"zzzz": 1})
    assert str(err.value) == "unknown parameter 'zzzz'"


def test_unknown_key_even_with_null_value() -> None:
    with pytest.raises(InvalidParameter):
        gp({"nonsense": None})


def test_unknown_key_lenient_is_ignored_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="djl_handlers.params.generation"):
        p = gp({"temprature": 0.5, "max_new_tokens": 3}, strict=False)
    assert p.ignored == ("temprature",) and p.max_new_tokens == 3 and p.temperature == 1.0
    assert "temprature" in caplog.text


def test_engine_unsupported_key_strict() -> None:
    with pytest.raises(InvalidParameter) as err:
        gp({"typical_p": 0.5}, "tensorrt_llm")
    assert str(err.value) == "parameter typical_p is not supported by engine tensorrt_llm"
    assert err.value.field == "typical_p"
    with pytest.raises(InvalidParameter, match="typical_p is not supported by engine vllm"):
        gp({"typical_p": 0.9}, "vllm")


def test_lmi_dist_message_says_which_engine_serves_it() -> None:
    with pytest.raises(InvalidParameter, match=r"typical_p is not supported by engine lmi-dist \(served by vLLM\)"):
        gp({"typical_p": 0.9}, "lmi-dist")


def test_engine_unsupported_key_lenient(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        p = gp({"typical_p": 0.5, "decoder_input_details": True}, "tensorrt_llm", strict=False)
    assert p.ignored == ("typical_p", "decoder_input_details")
    assert p.typical_p == 1.0 and not p.decoder_input_details
    assert "not supported by engine tensorrt_llm" in caplog.text


def test_unsupported_key_with_default_value_is_accepted() -> None:
    p = gp({"early_stopping": False, "presence_penalty": 0.0, "n": 1}, "vllm")
    assert p.ignored == () and p.early_stopping is False
    with pytest.raises(InvalidParameter, match="typical_p is not supported"):
        gp({"typical_p": True}, "tensorrt_llm")


@pytest.mark.parametrize("value", [True, False, "never"])
def test_early_stopping_is_a_boolean_or_never(value: Any) -> None:
    assert gp({"num_beams": 2, "early_stopping": value}, "huggingface").early_stopping == value


@pytest.mark.parametrize(("body", "field"), [({"num_beams": 0}, "num_beams"), ({"early_stopping": "soon"},
                                                                                "early_stopping")])
def test_bad_beam_values_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidParameter) as err:
        gp(body, "huggingface")
    assert err.value.field == field


def test_invalid_value_for_supported_key_raises_even_when_lenient() -> None:
    with pytest.raises(InvalidParameter):
        gp({"temperature": -3}, strict=False)


# -- output helpers --------------------------------------------------------------------------


def test_to_dict_and_changed() -> None:
    p = gp({"do_sample": True, "stop_sequences": ["x"], "top_k": 5}, "tensorrt_llm")
    full = p.to_dict()
    assert set(full) == known_parameters()
    assert full["stop_sequences"] == ["x"] and full["max_new_tokens"] == 30
    # top_k 5 is TRT's own sampling default, so it is not "changed"
    assert p.changed() == {"do_sample": True, "stop_sequences": ["x"]}
    assert gp({}, "vllm").changed() == {}
    assert gp({"top_k": 0}, "vllm").changed() == {"top_k": 0}


def test_frozen_hashable_and_equality_ignores_bookkeeping() -> None:
    a = gp({"temperature": 1.0})
    b = gp({})
    assert a == b and hash(a) == hash(b) and a.provided != b.provided
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.temperature = 2.0  # type: ignore[misc]


def test_placeholder_field_names_still_exist() -> None:
    names = {f.name for f in dataclasses.fields(GenerationParameters)}
    assert {"engine", "provided", "ignored", "structured_output"} | known_parameters() == names


# -- property: nothing but InvalidParameter escapes ------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
keys = st.sampled_from(sorted(known_parameters() | {"stop", "stream", "output_formatter"})) | st.text(max_size=10)


@settings(max_examples=300, deadline=None)
@given(data=st.dictionaries(keys, json_values, max_size=6), engine=st.sampled_from(ENGINES),
       strict=st.booleans())
def test_from_dict_raises_only_invalid_parameter(data: dict[str, Any], engine: str, strict: bool) -> None:
    try:
        p = gp(data, engine, strict=strict)
    except InvalidParameter as exc:
        assert exc.field
        assert str(exc)
    else:
        assert 1 <= p.max_new_tokens <= 4096
        assert p.temperature >= 0 and p.top_k >= -1 and 0 <= p.top_p <= 1
        hash(p)
