"""The HF engine's options: typed once in config/hf.py, with one set of defaults, read by the engine,
its loader and its CPU patches (never from the raw option map)."""

from __future__ import annotations

from pathlib import Path

import pytest

from djl_handlers.config.hf import HuggingFaceOptions
from djl_handlers.config.models import ServingConfig
from djl_handlers.errors import ConfigError

pytest_plugins = ["conftest_models"]  # fixture: tiny_dir


def _hf(engine: str = "huggingface", **options: str) -> HuggingFaceOptions:
    rolling = {"vllm": "vllm"}.get(engine, "scheduler" if engine != "tensorrt_llm" else "trtllm")
    return ServingConfig.from_properties({"rolling_batch": rolling, **options}, engine=engine).hf


def test_unset_options_take_the_one_set_of_defaults() -> None:
    hf = _hf()
    assert hf == HuggingFaceOptions()
    assert (hf.max_prefill_tokens, hf.torch_threads, hf.cpu_threads) == (None, None, "adaptive")  # None: per device
    assert (hf.cpu_linear, hf.cpu_fuse_projections, hf.cpu_attention, hf.cpu_norm, hf.cpu_rotary) == (
        "auto", True, "auto", "fused", "fused")


def test_values_are_trimmed_case_folded_and_typed() -> None:
    hf = _hf(cpu_linear=" TORCH ", cpu_fuse_projections="FALSE", cpu_attention="Ragged", cpu_norm="torch",
             cpu_rotary="TORCH", cpu_threads="fixed", max_prefill_tokens="512", torch_threads="3", hf_step="Padded")
    assert (hf.cpu_linear, hf.cpu_fuse_projections, hf.cpu_attention, hf.cpu_norm, hf.cpu_rotary) == (
        "torch", False, "ragged", "torch", "torch")
    assert (hf.cpu_threads, hf.max_prefill_tokens, hf.torch_threads) == ("fixed", 512, 3)


@pytest.mark.parametrize(("key", "value"), [
    ("cpu_linear", "openblas"), ("cpu_attention", "flash"), ("cpu_norm", "triton"), ("cpu_rotary", "fast"),
    ("cpu_threads", "sometimes"), ("cpu_fuse_projections", "maybe"), ("max_prefill_tokens", "0"),
    ("max_prefill_tokens", "2k"), ("torch_threads", "-1"), ("hf_step", "ragged"),
])
def test_a_bad_value_is_an_error_naming_the_key_and_the_value(key: str, value: str) -> None:
    for engine in ("huggingface", "deepspeed"):
        with pytest.raises(ConfigError, match=f"option.{key}={value!r} is invalid; allowed: ") as info:
            _hf(engine, **{key: value})
        assert info.value.field == f"option.{key}"


def test_the_packed_step_was_removed_and_says_so() -> None:
    with pytest.raises(ConfigError, match=r"option.hf_step='packed' was removed: .*set padded") as info:
        _hf(hf_step="packed")
    assert info.value.field == "option.hf_step"


def test_deepspeed_reads_the_step_and_cpu_options_but_not_the_loading_ones() -> None:
    hf = _hf("deepspeed", cpu_linear="torch", max_prefill_tokens="64", quantize="smoothquant",
             attn_implementation="eager")
    assert (hf.cpu_linear, hf.max_prefill_tokens) == ("torch", 64)
    assert hf.attn_implementation is None and hf.quantize is None  # DeepSpeed's quantize is its own


def test_engines_outside_the_hf_family_do_not_read_them() -> None:
    assert _hf("vllm", cpu_linear="mkl", max_prefill_tokens="0") == HuggingFaceOptions()


def test_the_loader_copies_the_validated_config() -> None:
    from djl_handlers.engines.hf.loader import LoadOptions

    config = ServingConfig.from_properties({"dtype": "bf16", "cpu_norm": "torch", "revision": "r1",
                                            "trust_remote_code": "true", "attn_implementation": "eager"})
    opts = LoadOptions.from_config(config)
    assert (opts.model_id, opts.dtype, opts.device, opts.revision, opts.trust_remote_code) == (
        "", "bfloat16", "cpu", "r1", True)
    assert opts.hf is config.hf and opts.hf.cpu_norm == "torch" and opts.hf.attn_implementation == "eager"


def test_the_engine_steps_with_the_typed_limits(tiny_dir: Path) -> None:
    pytest.importorskip("torch")
    from djl_handlers.engines.hf.engine import HFEngine

    config = ServingConfig.from_properties({"model_id": str(tiny_dir), "rolling_batch": "scheduler",
                                            "max_prefill_tokens": "64", "max_rolling_batch_size": "3",
                                            "cpu_linear": "torch", "cpu_threads": "fixed"})
    engine = HFEngine.from_config(config)
    assert (engine.max_prefill_tokens, engine.max_batch_size, engine.threads) == (64, 3, None)
    assert not any("forward" in m.__dict__ for m in engine.model.modules() if type(m).__name__ == "Linear")
