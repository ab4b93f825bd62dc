"""Per-engine translations, the support table, and the docs table that renders it."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from djl_handlers.params import GenerationParameters, to_deepspeed, to_hf, to_trtllm, to_vllm, translate
from djl_handlers.params.translate import ENGINES, SUPPORT, is_sampling, known_parameters, supported_parameters

ROOT = Path(__file__).resolve().parents[2]
gp = GenerationParameters.from_dict


def load_fake(package: str) -> ModuleType:
    """Load a faithful fake ``SamplingParams`` module from tests/fakes without touching sys.path."""
    name = f"_fake_{package}_sampling_params"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "fakes" / package / "sampling_params.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- huggingface / deepspeed -----------------------------------------------------------------


def test_to_hf_greedy_omits_sampling_knobs() -> None:
    kwargs = to_hf(gp({"max_new_tokens": 12, "temperature": 0.3, "top_k": 7}))
    assert kwargs == {"max_new_tokens": 12, "do_sample": False, "repetition_penalty": 1.0, "num_beams": 1}


def test_to_hf_sampling() -> None:
    p = gp({"do_sample": True, "temperature": 0.7, "top_p": 0.9, "typical_p": 0.8,
            "repetition_penalty": 1.2, "min_new_tokens": 3})
    assert to_hf(p) == {
        "max_new_tokens": 30, "do_sample": True, "repetition_penalty": 1.2, "num_beams": 1,
        "min_new_tokens": 3, "temperature": 0.7, "top_k": 0, "top_p": 0.9, "typical_p": 0.8,
    }


def test_to_hf_top_k_minus_one_and_zero_temperature() -> None:
    assert to_hf(gp({"do_sample": True, "top_k": -1}))["top_k"] == 0
    assert to_hf(gp({"do_sample": True, "temperature": 0}))["do_sample"] is False


@pytest.mark.parametrize(
    ("params", "engine", "expected"),
    [
        ({}, "huggingface", False),
        ({"do_sample": True}, "huggingface", True),
        ({"do_sample": True, "temperature": 0}, "huggingface", False),
        ({"do_sample": True, "temperature": 0}, "vllm", False),
        ({"do_sample": True, "temperature": 0}, "tensorrt_llm", False),
        ({"do_sample": False, "temperature": 0.5}, "vllm", False),
        ({"do_sample": True, "temperature": 0.5}, "tensorrt_llm", True),
    ],
)
def test_one_greedy_rule(params: dict, engine: str, expected: bool) -> None:
    assert is_sampling(gp(params, engine)) is expected


def test_temperature_zero_is_greedy_in_every_translation() -> None:
    zero = {"do_sample": True, "temperature": 0, "top_k": 5}
    assert to_hf(gp(zero))["do_sample"] is False and "temperature" not in to_hf(gp(zero))
    assert to_deepspeed(gp(zero, "deepspeed"))["do_sample"] is False
    assert to_vllm(gp(zero, "vllm"))["temperature"] == 0.0
    trt = to_trtllm(gp(zero, "tensorrt_llm"))
    assert "temperature" not in trt and (trt["top_k"], trt["top_p"]) == (1, 0.0)
    sampling = load_fake("tensorrt_llm").SamplingParams(**trt)
    assert sampling._greedy_decoding  # the LLM API's own greedy test


def test_support_table_is_its_own_module() -> None:
    from djl_handlers.params import support

    assert SUPPORT is support.SUPPORT and ENGINES == support.ENGINES
    for name in ("generation.py", "translate.py"):
        text = (ROOT / "djl_handlers" / "params" / name).read_text()
        other = "translate" if name == "generation.py" else "generation"
        runtime = text.split("if TYPE_CHECKING:")[0]
        assert f"djl_handlers.params.{other} import" not in runtime, name


def test_to_deepspeed_matches_hf() -> None:
    p = gp({"do_sample": True, "top_k": 4}, "deepspeed")
    assert to_deepspeed(p) == to_hf(p)
    assert translate(p) == to_hf(p)


# -- vLLM ------------------------------------------------------------------------------------


def test_to_vllm_greedy_default() -> None:
    kwargs = to_vllm(gp({}, "vllm"))
    assert kwargs["temperature"] == 0.0 and kwargs["top_k"] == -1 and kwargs["max_tokens"] == 30
    assert kwargs["logprobs"] == 1 and "prompt_logprobs" not in kwargs and "bad_words" not in kwargs
    sampling = load_fake("vllm").SamplingParams(**kwargs)
    assert sampling.max_tokens == 30


def test_to_vllm_full_request_builds_sampling_params() -> None:
    p = gp({"do_sample": True, "temperature": 0.6, "top_k": 0, "top_p": 0.95, "min_p": 0.05, "seed": "9",
            "stop_sequences": ["</s>"], "stop_token_ids": [2], "ignore_eos_token": True,
            "include_stop_str_in_output": True, "logprobs": 3, "prompt_logprobs": 2,
            "skip_special_tokens": False, "spaces_between_special_tokens": False,
            "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
            "max_new_tokens": 64, "min_new_tokens": 4, "bad_sequences": ["bad"]}, "vllm")
    kwargs = to_vllm(p)
    assert kwargs["temperature"] == 0.6 and kwargs["top_k"] == -1 and kwargs["seed"] == 9
    assert kwargs["stop"] == ["</s>"] and kwargs["stop_token_ids"] == [2] and kwargs["ignore_eos"] is True
    assert kwargs["logprobs"] == 3 and kwargs["prompt_logprobs"] == 2 and kwargs["bad_words"] == ["bad"]
    assert kwargs["min_tokens"] == 4 and kwargs["max_tokens"] == 64
    sampling = load_fake("vllm").SamplingParams(**kwargs)  # real field names, real validation
    assert sampling.top_p == 0.95 and sampling.include_stop_str_in_output is True


def test_to_vllm_decoder_input_details_and_top_n_tokens() -> None:
    # vLLM reports them (prompt_logprobs / logprobs): the prompt's top N too when both are asked for
    kwargs = to_vllm(gp({"decoder_input_details": True, "top_n_tokens": 5}, "lmi-dist"))
    assert kwargs["prompt_logprobs"] == 5 and kwargs["logprobs"] == 5
    assert to_vllm(gp({"decoder_input_details": True}, "vllm"))["prompt_logprobs"] == 1
    # vLLM's own logprobs / prompt_logprobs ask for the same reports, under their own counts
    p = gp({"logprobs": 4, "prompt_logprobs": 2}, "vllm")
    assert p.top_n_tokens == 4 and p.decoder_input_details
    assert to_vllm(p)["logprobs"] == 4 and to_vllm(p)["prompt_logprobs"] == 2


def test_translate_dispatches_lmi_dist_to_vllm() -> None:
    p = gp({"do_sample": True}, "lmi-dist")
    assert translate(p) == to_vllm(p)


# -- TensorRT-LLM ----------------------------------------------------------------------------


def test_to_trtllm_greedy_defaults() -> None:
    kwargs = to_trtllm(gp({}, "tensorrt_llm"))
    assert (kwargs["temperature"], kwargs["top_k"], kwargs["top_p"]) == (0.8, 0, 0.0)
    assert kwargs["max_tokens"] == 30 and kwargs["min_tokens"] == 1 and kwargs["stop"] is None
    for optional in ("presence_penalty", "frequency_penalty", "length_penalty", "min_p", "logprobs"):
        assert optional not in kwargs
    sampling = load_fake("tensorrt_llm").SamplingParams(**kwargs)
    assert (sampling.top_k, sampling.top_p, sampling.temperature) == (0, 0.0, 0.8)


def test_to_trtllm_sampling_defaults_and_extras() -> None:
    p = gp({"do_sample": True, "seed": 3, "stop": ["\n"], "bad_sequences": "oops", "min_length": 4,
            "length_penalty": 1.0, "presence_penalty": 0.2, "max_new_tokens": 10}, "tensorrt_llm")
    kwargs = to_trtllm(p)
    assert (kwargs["temperature"], kwargs["top_k"], kwargs["top_p"]) == (1.0, 5, 0.85)
    assert kwargs["seed"] == 3 and kwargs["stop"] == ["\n"] and kwargs["bad"] == ["oops"]
    assert kwargs["min_tokens"] == 4 and kwargs["max_tokens"] == 10
    # provided penalties are sent even when equal to the neutral value; others are left out
    assert kwargs["length_penalty"] == 1.0 and kwargs["presence_penalty"] == 0.2
    assert "frequency_penalty" not in kwargs
    sampling = load_fake("tensorrt_llm").SamplingParams(**kwargs)
    assert sampling.top_k == 5


def test_to_trtllm_min_new_tokens_wins_over_min_length() -> None:
    assert to_trtllm(gp({"min_new_tokens": 6, "min_length": 2}, "tensorrt_llm"))["min_tokens"] == 6


# -- support table ---------------------------------------------------------------------------


def test_support_table_covers_every_field_and_engine() -> None:
    assert set(SUPPORT) == set(ENGINES)
    for engine in ENGINES:
        assert set(SUPPORT[engine]) == known_parameters()
        assert set(SUPPORT[engine].values()) <= {"native", "emulated", "unsupported"}


def test_common_parameters_supported_everywhere() -> None:
    common = {"do_sample", "seed", "temperature", "repetition_penalty", "top_k", "top_p",
              "max_new_tokens", "details", "return_full_text", "stop_sequences"}
    for engine in ENGINES:
        assert common <= supported_parameters(engine)


def test_seed_extras_are_supported_where_the_engine_can() -> None:
    assert {"typical_p", "truncate"} <= supported_parameters("deepspeed")
    assert {"min_length", "bad_sequences", "presence_penalty", "length_penalty",
            "frequency_penalty"} <= supported_parameters("tensorrt_llm")
    vllm_extras = {"min_p", "presence_penalty", "frequency_penalty", "stop_token_ids",
                   "include_stop_str_in_output", "ignore_eos_token", "logprobs", "prompt_logprobs",
                   "skip_special_tokens", "spaces_between_special_tokens"}
    assert vllm_extras <= supported_parameters("vllm")
    assert vllm_extras | {"truncate"} <= supported_parameters("lmi-dist")


@pytest.mark.parametrize("engine", ENGINES)
def test_translation_is_pure(engine: str) -> None:
    p = gp({"stop_sequences": ["x"]}, engine)
    first = translate(p)
    expected = dict(first)
    for value in first.values():
        if isinstance(value, list):
            value.append("mutated")  # mutating one result must not leak into the next
    assert translate(p) == {k: [x for x in v if x != "mutated"] if isinstance(v, list) else v
                            for k, v in expected.items()}
    assert p.stop_sequences == ("x",)


def test_docs_table_matches_support() -> None:
    text = (ROOT / "docs" / "parameters.md").read_text(encoding="utf-8")
    block = text.split("<!-- support-table:start -->")[1].split("<!-- support-table:end -->")[0]
    rows = [line for line in block.strip().splitlines() if line.startswith("| `")]
    header = [c.strip() for c in block.strip().splitlines()[0].strip("|").split("|")]
    assert header[1:] == list(ENGINES)
    parsed: dict[str, list[str]] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = re.fullmatch(r"`(\w+)`", cells[0])
        assert name is not None
        parsed[name.group(1)] = cells[1:]
    assert parsed == {name: [SUPPORT[e][name] for e in ENGINES] for name in SUPPORT["huggingface"]}
