"""TensorRT-LLM beam search (``num_beams``) through the adapter, on the fake LLM API (``tests/fakes``):
the translation asks for the LLM API's beam search, the adapter reports the beams the library
returns (best under the request id, the next under the sample ids), and a width past the engine's
``max_beam_width`` or a sampled beam request is a 400 naming the field while neighbours finish."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from test_trtllm_engine import fake_trt, make_engine, params, run  # noqa: F401 - fixture

from djl_handlers.engines.base import EngineRequest
from djl_handlers.errors import InvalidParameter
from djl_handlers.params.translate import to_trtllm

BEAMS = {"num_beams": 3, "max_new_tokens": 8, "length_penalty": 0.5, "early_stopping": "never"}


@pytest.fixture
def engine(fake_trt: Any) -> Iterator[Any]:  # noqa: F811
    eng = make_engine({"max_beam_width": "4"})
    yield eng
    eng.close()


def library_beams(engine: Any, prompt: str, **kwargs: Any) -> list[tuple[list[int], str | None]]:
    """What the LLM API itself returns for the request (no adapter): each beam's tokens and finish."""
    import tensorrt_llm

    sampling = tensorrt_llm.SamplingParams(**{**to_trtllm(params(**kwargs)), "end_id": 0})
    result = engine.llm.generate_async(engine.tokenizer.encode(prompt), sampling_params=sampling).result(timeout=5)
    return [(list(o.token_ids), o.finish_reason) for o in result.outputs]


def test_translation_asks_for_the_llm_api_beam_search() -> None:
    kwargs = to_trtllm(params(**BEAMS, n=2))
    assert kwargs["use_beam_search"] is True and kwargs["best_of"] == 3 and kwargs["n"] == 2
    assert kwargs["length_penalty"] == 0.5 and kwargs["early_stopping"] == 2
    assert to_trtllm(params(num_beams=2, early_stopping=True))["early_stopping"] == 1
    assert "use_beam_search" not in to_trtllm(params(max_new_tokens=4))


def test_beams_under_their_ids_equal_the_library_answer(engine: Any) -> None:
    prompt = "Deep"
    want = library_beams(engine, prompt, **BEAMS, n=3)
    assert len({tuple(t) for t, _ in want}) == 3  # three different beams
    engine.add_request(EngineRequest(1, engine.tokenizer.encode(prompt), params(**BEAMS, n=3), prompt,
                                     sample_ids=(5, 6)))
    engine.add_request(EngineRequest(2, engine.tokenizer.encode("cool"), params(max_new_tokens=4), "cool"))
    per = run(engine)
    for rid, (tokens, finish) in zip((1, 5, 6), want, strict=True):
        got = [o.token_id for o in per[rid] if o.token_id >= 0 and o.token_id != 0]
        assert got == tokens, rid
        assert per[rid][-1].finish_reason == ("eos_token" if finish == "stop" else "length")
    assert [o.token_id for o in per[2]] == engine.tokenizer.encode("field and it keeps")


def test_early_stopping_true_ends_sooner_than_never(engine: Any) -> None:
    never = library_beams(engine, "Deep", num_beams=2, max_new_tokens=30, early_stopping="never", length_penalty=2.0)
    early = library_beams(engine, "Deep", num_beams=2, max_new_tokens=30, early_stopping=True, length_penalty=2.0)
    assert max(len(t) for t, _ in early) < max(len(t) for t, _ in never)
    engine.add_request(EngineRequest(1, engine.tokenizer.encode("Deep"), params(
        num_beams=2, max_new_tokens=30, early_stopping=True, length_penalty=2.0), "Deep"))
    got = [o.token_id for o in run(engine)[1] if o.token_id > 0]
    assert got == early[0][0]


@pytest.mark.parametrize(("extra", "field"), [({"num_beams": 5}, "num_beams"),
                                              ({"num_beams": 2, "do_sample": True}, "do_sample")])
def test_beams_the_engine_cannot_run_are_refused(engine: Any, extra: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidParameter) as err:
        engine.add_request(EngineRequest(1, engine.tokenizer.encode("Deep"), params(**extra), "Deep"))
    assert err.value.field == field and f"parameters.{field}" in err.value.message
    assert not engine.has_unfinished()


def test_without_max_beam_width_beams_are_a_400_naming_the_option(fake_trt: Any) -> None:  # noqa: F811
    eng = make_engine()
    try:
        with pytest.raises(InvalidParameter) as err:
            eng.add_request(EngineRequest(1, eng.tokenizer.encode("Deep"), params(num_beams=2), "Deep"))
        assert err.value.field == "num_beams" and "option.max_beam_width" in err.value.message
    finally:
        eng.close()


def test_handler_beams_in_best_of_sequences_and_async(fake_trt: Any) -> None:  # noqa: F811
    import asyncio

    from djl_handlers.service import InferenceService
    from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

    service = InferenceService("tensorrt_llm")
    driver = RollingBatchDriver(service.handle)
    assert driver.init({"model_id": "toy", "rolling_batch": "trtllm", "max_beam_width": "3"}) is None
    engine = service.engine
    want = library_beams(engine, "Deep", **BEAMS, n=2)
    beams = driver.submit(json_request({"inputs": "Deep", "parameters": {**BEAMS, "n": 2, "details": True}}))
    wide = driver.submit(json_request({"inputs": "Deep", "parameters": {"num_beams": 4}}))
    plain = driver.submit(json_request({"inputs": "Deep", "parameters": {"max_new_tokens": 4}}))
    driver.run()
    body = json.loads(beams.text)
    texts = [body["generated_text"], *(s["generated_text"] for s in body["details"]["best_of_sequences"])]
    assert texts == [engine.tokenizer.decode(t) for t, _ in want]
    assert wide.code == 400 and "num_beams" in (wide.error or "")
    assert json.loads(plain.text)["generated_text"]

    async def collect() -> list[int]:
        got: list[int] = []
        request = EngineRequest(9, engine.tokenizer.encode("Deep"), params(**BEAMS), "Deep")
        async for outs in engine.generate_async(request):
            got += [o.token_id for o in outs if o.token_id > 0]
        return got

    assert asyncio.run(collect()) == want[0][0]
    engine.close()


def test_the_fake_beam_search_is_exhaustive_when_wide_enough(fake_trt: Any) -> None:  # noqa: F811
    """The fake's search (what the adapter tests compare with) against every path of the toy model: with
    a width above the number of paths nothing is pruned, so its ranking is the exhaustive one."""
    from tensorrt_llm._beams import BeamSearch
    from tensorrt_llm._toy import beam_candidates

    sampling = fake_trt.SamplingParams(use_beam_search=True, best_of=12, max_tokens=2, length_penalty=1.0,
                                       early_stopping=2, end_id=0)
    search = BeamSearch(sampling, 18)  # after "people" (18) the toy's candidates reach eos (0)
    while not search.done:
        search.step()
    paths: list[tuple[float, list[int]]] = []
    for first, lp1 in beam_candidates(18):
        if first == 0:
            paths.append((lp1 / 1, []))
            continue
        for second, lp2 in beam_candidates(first):
            paths.append(((lp1 + lp2) / 2, [first] if second == 0 else [first, second]))
    want = [tokens for _, tokens in sorted(paths, key=lambda p: p[0], reverse=True)]
    assert [h.tokens for h in search.best()] == want[:12]
