"""The TensorRT-LLM adapter against the fake ``tensorrt_llm`` package in tests/fakes (mirrors the
LLM API: ``LLM.generate_async(..., streaming=True)``, ``RequestOutput``, ``abort()``)."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.config.models import ServingConfig
from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.errors import InvalidParameter, PromptTooLong
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.params.translate import to_trtllm

FAKES = Path(__file__).resolve().parents[1] / "fakes"


def _drop(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture
def fake_trt(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    _drop("tensorrt_llm")
    monkeypatch.syspath_prepend(str(FAKES))
    import tensorrt_llm

    assert getattr(tensorrt_llm, "IS_FAKE", False), tensorrt_llm.__file__
    yield tensorrt_llm
    _drop("tensorrt_llm")


@pytest.fixture
def engine(fake_trt: Any) -> Iterator[Any]:
    eng = make_engine()
    yield eng
    eng.close()


def make_engine(options: dict[str, str] | None = None) -> Any:
    from djl_handlers.engines.external.trtllm import TrtLlmEngine

    config = ServingConfig.from_properties({"model_id": "toy", **(options or {})}, engine="tensorrt_llm")
    return TrtLlmEngine.from_config(config)


def params(**kwargs: Any) -> GenerationParameters:
    return GenerationParameters.from_dict(kwargs, engine="tensorrt_llm")


def add(engine: Any, rid: int, prompt: str, **kwargs: Any) -> None:
    engine.add_request(EngineRequest(rid, engine.tokenizer.encode(prompt), params(**kwargs), prompt))


def run(engine: Any, timeout_s: float = 10.0) -> dict[int, list[StepOutput]]:
    per: dict[int, list[StepOutput]] = {}
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished():
        assert time.monotonic() < deadline, "requests did not finish"
        for out in engine.step():
            per.setdefault(out.request_id, []).append(out)
    return per


def text_of(outs: list[StepOutput]) -> str:
    return "".join(o.text or "" for o in outs)


def test_deltas_concatenate_and_finish_at_length(engine: Any) -> None:
    add(engine, 1, "Deep", max_new_tokens=5)
    outs = run(engine)[1]
    assert [o.token_id for o in outs] == [2, 3, 4, 5, 6]
    assert text_of(outs) == " learning is a really cool"
    assert [o.finish_reason for o in outs] == [None] * 4 + ["length"]


def test_eos_is_a_final_response_without_tokens(engine: Any) -> None:
    add(engine, 1, "many")
    outs = run(engine)[1]
    assert [o.token_id for o in outs] == [19, 0]  # the end id stands for the final response
    assert text_of(outs) == " people"
    assert outs[-1].finish_reason == "eos_token"


def test_stop_word_is_stop_sequence_trimmed_and_never_streamed(engine: Any) -> None:
    add(engine, 1, "Deep", stop_sequences=["really cool"])
    outs = run(engine)[1]
    assert outs[-1].finish_reason == "stop_sequence"
    assert text_of(outs) == " learning is a"
    assert all("really" not in (o.text or "") for o in outs)
    assert outs[-1].token_id == 6  # the stop word's last token completed it


def test_logprobs_when_requested(engine: Any) -> None:
    add(engine, 1, "Deep", max_new_tokens=2, logprobs=1)
    outs = run(engine)[1]
    assert [o.log_prob for o in outs] == pytest.approx([-0.25, -0.35])


def test_requests_are_batched_and_independent(engine: Any) -> None:
    add(engine, 1, "Deep", max_new_tokens=6)
    add(engine, 2, "many")
    add(engine, 3, "every", max_new_tokens=3)
    per = run(engine)
    assert text_of(per[1]) == " learning is a really cool field"
    assert [o.token_id for o in per[2]] == [19, 0]
    assert text_of(per[3]) == " day with new"
    assert all(len([o for o in outs if o.finish_reason]) == 1 for outs in per.values())


def test_release_aborts_a_running_request(engine: Any) -> None:
    engine.llm.iteration_s = 0.01
    add(engine, 1, "Deep", max_new_tokens=1000, ignore_eos_token=True)
    while not engine.step():
        pass
    result = engine._requests[1].result
    engine.release(1)
    deadline = time.monotonic() + 5
    while not result.finished:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert result.aborted()
    assert result.outputs[0].finish_reason == "cancelled"
    assert not engine.has_unfinished()
    assert engine.step() == []  # the cancelled response of a released request is dropped


def test_release_after_finish_does_not_abort(engine: Any) -> None:
    add(engine, 1, "many")
    run(engine)
    result = engine._requests[1].result
    engine.release(1)
    time.sleep(0.02)
    assert not result.aborted()


def test_step_waits_at_most_poll_timeout(engine: Any) -> None:
    from djl_handlers.engines.external.trtllm import _Request

    started = time.monotonic()
    assert engine.step() == []  # nothing in flight: no wait at all
    assert time.monotonic() - started < engine.poll_timeout_s
    engine._requests[99] = _Request()  # in flight, but its engine never answers
    started = time.monotonic()
    assert engine.step() == []
    assert engine.poll_timeout_s <= time.monotonic() - started < engine.poll_timeout_s + 0.5


@pytest.mark.parametrize("do_sample", [False, True])
def test_parameters_reach_sampling_params(engine: Any, fake_trt: Any, do_sample: bool) -> None:
    p = params(
        do_sample=do_sample,
        max_new_tokens=9,
        stop_sequences=["x"],
        bad_sequences=["y z"],
        min_length=2,
        seed=4,
        repetition_penalty=1.2,
        presence_penalty=0.3,
    )
    engine.add_request(EngineRequest(1, [1], p, "Deep"))
    sp = next(iter(engine.llm.submitted.values()))
    expected = fake_trt.SamplingParams(**to_trtllm(p), end_id=0)
    for name in (
        "max_tokens",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "stop",
        "bad",
        "min_tokens",
        "repetition_penalty",
        "presence_penalty",
        "end_id",
    ):
        assert getattr(sp, name) == getattr(expected, name), name
    assert (sp.max_tokens, sp.stop, sp.bad, sp.min_tokens, sp.seed) == (9, ["x"], ["y z"], 2, 4)
    assert sp.presence_penalty == 0.3 and sp.frequency_penalty is None  # only when provided
    # the seed's TensorRT-LLM defaults: greedy 0.8/0/0, sampling 1.0/5/0.85 (GenerationParameters)
    assert (sp.temperature, sp.top_k, sp.top_p) == ((1.0, 5, 0.85) if do_sample else (0.8, 0, 0.0))


def test_invalid_value_is_invalid_parameter(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    translate = importlib.import_module("djl_handlers.params.translate")
    monkeypatch.setattr(translate, "to_trtllm", lambda p: {"n": 2, "best_of": 1})
    with pytest.raises(InvalidParameter, match="best_of"):
        add(engine, 1, "Deep")
    assert not engine.has_unfinished()


def test_prompt_too_long(fake_trt: Any) -> None:
    eng = make_engine({"max_model_len": "8"})
    try:
        assert eng.max_model_len == 8
        with pytest.raises(PromptTooLong, match="max_seq_len"):
            add(eng, 1, "Deep", max_new_tokens=30)
        assert not eng.has_unfinished()
    finally:
        eng.close()


def test_llm_options_from_config(fake_trt: Any) -> None:
    eng = make_engine(
        {
            "dtype": "fp16",
            "max_rolling_batch_size": "4",
            "max_num_tokens": "512",
            "enable_kv_cache_reuse": "true",
            "batch_scheduler_policy": "guaranteed_no_evict",
        }
    )
    try:
        args = eng.llm.args
        assert (args.model, args.dtype, args.max_batch_size, args.max_num_tokens) == ("toy", "float16", 4, 512)
        assert args.kv_cache_config.enable_block_reuse is True
        assert args.kv_cache_config.free_gpu_memory_fraction == 0.9
        policy = args.scheduler_config.capacity_scheduler_policy
        assert policy is fake_trt.llmapi.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    finally:
        eng.close()


def test_a_failing_request_fails_alone(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    add(engine, 1, "Deep", max_new_tokens=3)
    result = engine._requests[1].result
    from tensorrt_llm.executor.result import Response

    result._deliver(Response([], [], error="boom"))
    add(engine, 2, "many")
    per = run(engine)
    assert per[1][-1].error is not None and "boom" in per[1][-1].error
    assert per[2][-1].finish_reason == "eos_token"


@pytest.mark.parametrize(
    ("reason", "stop_reason", "generated", "expected"),
    [
        ("length", None, 5, "length"),
        ("stop", None, 3, "eos_token"),
        ("stop", 7, 3, "eos_token"),
        ("stop", "##", 3, "stop_sequence"),
        ("cancelled", None, 3, "error"),
        ("timeout", None, 3, "error"),
        (None, None, 3, "eos_token"),
        (None, None, 5, "length"),
    ],
)
def test_finish_reason_table(reason: Any, stop_reason: Any, generated: int, expected: str) -> None:
    from djl_handlers.engines.external.trtllm import map_finish_reason

    assert map_finish_reason(reason, stop_reason, generated, 5) == expected


def test_through_the_rolling_batch(engine: Any) -> None:
    import json

    from djl_handlers.dialects.registry import get_formatter
    from djl_handlers.request.records import Request
    from djl_handlers.scheduling.rolling import RollingBatch

    batch = RollingBatch(engine, lambda r: get_formatter("json", stream=False))
    batch.add_request(Request(prompt="Deep", params=params(stop_sequences=["cool"], details=True), inputs="Deep"))
    batch.add_request(Request(prompt="many", params=params(details=True), inputs="many"))
    records = {0: "", 1: ""}
    live = [0, 1]
    deadline = time.monotonic() + 10
    while live:
        assert time.monotonic() < deadline
        for index, (record, _) in zip(list(live), batch.step(), strict=True):
            records[index] += record["data"]
            if record["last"]:
                live.remove(index)
    first, second = json.loads(records[0]), json.loads(records[1])
    assert first["generated_text"] == " learning is a really"
    assert first["details"]["finish_reason"] == "stop_sequence"
    assert second["generated_text"] == " people"
    assert second["details"]["finish_reason"] == "eos_token"
    assert not engine.has_unfinished()


def test_lora_config_and_per_request_lora(fake_trt: Any, tmp_path: Path) -> None:
    import json

    from djl_handlers.lora.registry import AdapterError, AdapterSpec

    eng = make_engine({"enable_lora": "true", "max_loras": "2", "max_lora_rank": "32", "max_cpu_loras": "4"})
    try:
        config = eng.llm.args.lora_config
        assert (config.max_loras, config.max_lora_rank, config.max_cpu_loras) == (2, 32, 4)
        folders = {}
        for name in ("a", "b"):
            folders[name] = tmp_path / name
            folders[name].mkdir()
            (folders[name] / "adapter_config.json").write_text(json.dumps({"r": 4}))
            eng.load_adapter(AdapterSpec(name, str(folders[name])))
        with pytest.raises(AdapterError, match="adapter_config.json"):
            eng.load_adapter(AdapterSpec("c", str(tmp_path)))
        for rid, name in enumerate(["b", None, "a"]):
            eng.add_request(EngineRequest(rid, eng.tokenizer.encode("hi"), params(max_new_tokens=2), "hi", name))
        run(eng)
        loras = sorted((lr.lora_name, lr.lora_int_id, lr.lora_path) for lr in eng.llm.submitted_lora.values())
        assert loras == [("a", 0, str(folders["a"])), ("b", 1, str(folders["b"]))]
    finally:
        eng.close()
