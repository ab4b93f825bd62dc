"""HFEngine with several samples per prompt (``n``/``best_of``): one prefill, forked KV rows."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.base import EngineRequest, StepOutput  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import InvalidParameter  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402
from djl_handlers.params.samples import sample_seed  # noqa: E402

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model

PROMPT = "The capital of France is a city that"
LONG = ("One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty")


def sampling(seed: int, **extra: Any) -> GenerationParameters:
    values: dict[str, Any] = {"do_sample": True, "seed": seed, "temperature": 1.3, "max_new_tokens": 8, **extra}
    return GenerationParameters(**values)


def drain(engine: HFEngine, limits: dict[int, int]) -> dict[int, list[StepOutput]]:
    """Step until every id in ``limits`` has its count of tokens (each released on reaching it)."""
    got: dict[int, list[StepOutput]] = {rid: [] for rid in limits}
    for _ in range(200):
        if not engine.has_unfinished():
            return got
        for out in engine.step():
            got[out.request_id].append(out)
            assert out.error is None, out.error
            if len(got[out.request_id]) == limits[out.request_id]:
                engine.release(out.request_id)
    raise AssertionError("engine did not finish")


def tokens(outs: list[StepOutput]) -> list[int]:
    return [o.token_id for o in outs]


def alone(model: Any, tok: Any, ids: list[int], params: GenerationParameters, budget: int = 512) -> list[int]:
    engine = HFEngine(model, tok, max_prefill_tokens=budget)
    engine.add_request(EngineRequest(99, ids, params))
    return tokens(drain(engine, {99: params.max_new_tokens})[99])


@pytest.mark.parametrize("budget", [512, 4])  # 4: the prompt is prefilled in chunks, then forked
def test_each_sample_equals_a_request_with_its_derived_seed(tiny_model: Any, budget: int) -> None:
    model, tok = tiny_model
    ids = tok.encode(PROMPT)
    params = sampling(1234, n=3)
    engine = HFEngine(model, tok, max_prefill_tokens=budget)
    engine.add_request(EngineRequest(1, ids, params, sample_ids=(2, 3)))
    got = drain(engine, {1: 8, 2: 8, 3: 8})
    for index, rid in enumerate((1, 2, 3)):
        seeded = sampling(sample_seed(1234, index))  # type: ignore[arg-type]
        assert tokens(got[rid]) == alone(model, tok, ids, seeded, budget)
    assert len({tuple(tokens(got[rid])) for rid in (1, 2, 3)}) > 1  # the samples differ
    assert engine.kv_shape == (0, 0)


def test_the_prompt_is_prefilled_once(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    shapes: list[tuple[int, int]] = []
    forward = engine._forward

    def counting(ids: torch.Tensor, *args: Any) -> torch.Tensor:
        shapes.append(tuple(ids.shape))
        return forward(ids, *args)

    monkeypatch.setattr(engine, "_forward", counting)
    ids = tok.encode(PROMPT)
    engine.add_request(EngineRequest(1, ids, sampling(5, n=4), sample_ids=(2, 3, 4)))
    first = engine.step()
    assert shapes == [(1, len(ids))]  # one prefill row for the four samples
    assert sorted(o.request_id for o in first) == [1, 2, 3, 4]
    engine.step()
    assert shapes[1] == (4, 1)  # then four decode rows
    assert engine.running_ids == (1, 2, 3, 4)


def test_a_sample_released_early_leaves_the_others_unchanged(tiny_model: Any) -> None:
    model, tok = tiny_model
    ids = tok.encode(PROMPT)
    engine = HFEngine(model, tok)
    engine.add_request(EngineRequest(1, ids, sampling(77, n=3), sample_ids=(5, 6)))
    got = drain(engine, {1: 8, 5: 2, 6: 8})
    assert len(got[5]) == 2
    assert tokens(got[6]) == alone(model, tok, ids, sampling(sample_seed(77, 2)))  # type: ignore[arg-type]
    assert tokens(got[1]) == alone(model, tok, ids, sampling(77))


def test_releasing_queued_samples(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    engine.add_request(EngineRequest(1, tok.encode("hi"), sampling(3, n=3), sample_ids=(2, 3)))
    engine.release(3)  # a further sample: the others stay
    first = engine.step()
    assert sorted(o.request_id for o in first) == [1, 2]
    engine.add_request(EngineRequest(10, tok.encode("hi"), sampling(3, n=2), sample_ids=(11,)))
    engine.release(10)  # the first sample of a queued request takes the others along
    assert sorted(o.request_id for o in engine.step()) == [1, 2]
    with pytest.raises(ValueError):
        engine.add_request(EngineRequest(20, tok.encode("hi"), sampling(3, n=2), sample_ids=(2,)))


def test_samples_wait_for_free_rows(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_batch_size=4)
    engine.add_request(EngineRequest(1, tok.encode("hi"), sampling(1, n=2), sample_ids=(2,)))
    engine.step()
    engine.add_request(EngineRequest(3, tok.encode("a b"), sampling(2, n=3), sample_ids=(4, 5)))
    engine.add_request(EngineRequest(6, tok.encode("c"), GenerationParameters(max_new_tokens=4)))
    outs = engine.step()
    assert 3 not in {o.request_id for o in outs}  # 2 rows free, 3 needed: it waits ...
    assert 6 not in {o.request_id for o in outs}  # ... and nobody overtakes it
    engine.release(1)
    engine.release(2)
    outs = engine.step()
    assert {o.request_id for o in outs} == {3, 4, 5, 6}
    assert engine.kv_shape[0] == 4


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        (GenerationParameters(n=2), "n", "greedily"),
        (GenerationParameters(best_of=3, do_sample=True, temperature=0.0), "best_of", "greedily"),
        (GenerationParameters(n=5, do_sample=True), "n", "max_rolling_batch_size"),
    ],
)
def test_refused_sample_requests_name_the_field(tiny_model: Any, params: GenerationParameters, field: str,
                                                words: str) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_batch_size=4)
    with pytest.raises(InvalidParameter) as info:
        engine.add_request(EngineRequest(1, tok.encode("hi"), params, sample_ids=tuple(range(2, 1 + params.n))))
    assert info.value.field == field and words in info.value.message
    assert not engine.has_unfinished()
