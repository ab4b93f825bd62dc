"""HFEngine beam search (``num_beams``): each beam request returns what transformers' ``generate(num_beams=...)``
returns for it alone, with greedy and sampling requests of other clients in the same batch."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.base import EngineRequest, StepOutput  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import InvalidParameter  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model, real_model

PROMPTS = [
    "The capital of France is a city that",
    "Hello there",
    "One two three four five six seven eight nine ten eleven twelve",
    "Deep learning is",
]


def generate_beams(model: Any, ids: list[int], eos: list[int], n: int, **beam: Any) -> list[int]:
    """transformers' beam search for this request alone: the best sequence's new tokens (to its eos)."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos or None,
                             pad_token_id=0, **beam)
    new = out[0, len(ids):].tolist()
    return new[: next((i + 1 for i, t in enumerate(new) if t in eos), len(new))]


def drive(engine: HFEngine, requests: list[EngineRequest], joins: list[int]) -> dict[int, list[StepOutput]]:
    """Step like the scheduler: add each request at its join step, release it at its finish_reason,
    its eos or its max_new_tokens."""
    got: dict[int, list[StepOutput]] = {r.request_id: [] for r in requests}
    by_id = {r.request_id: r for r in requests}
    step = 0
    while step <= max(joins) or engine.has_unfinished():
        for req, join in zip(requests, joins, strict=True):
            if join == step:
                engine.add_request(req)
        for out in engine.step():
            got[out.request_id].append(out)
            assert out.error is None, out.error
            limit = by_id[out.request_id].params.max_new_tokens
            if out.finish_reason or out.token_id in engine.eos_token_ids or len(got[out.request_id]) == limit:
                engine.release(out.request_id)
        step += 1
        assert step < 300, "engine did not finish"
    return got


def tokens(outs: list[StepOutput]) -> list[int]:
    return [o.token_id for o in outs]


@pytest.fixture(scope="module")
def eos_token(tiny_model: Any) -> list[int]:
    """Two tokens the tiny model's beams meet (its greedy continuation's 3rd token of one prompt, its
    3-beam continuation's 6th of another), used as eos so that hypotheses end early: the finishing
    rules (and several eos ids) are exercised, not only the length limit."""
    model, tok = tiny_model
    first = generate_beams(model, tok.encode(PROMPTS[0]), [], 3)[2]
    second = generate_beams(model, tok.encode(PROMPTS[2]), [], 7, num_beams=3)[5]
    return [first, second]


def beams(n: int, max_new: int = 10, **extra: Any) -> GenerationParameters:
    return GenerationParameters(num_beams=n, max_new_tokens=max_new, **extra)


CASES = [  # (num_beams, length_penalty, early_stopping)
    (2, 1.0, False),
    (3, 0.5, True),
    (4, 2.0, "never"),
    (4, -1.0, False),
    (3, 1.0, "never"),
    (2, 0.0, True),
]


@pytest.mark.parametrize(("num_beams", "length_penalty", "early_stopping"), CASES)
def test_beams_in_a_mixed_batch_equal_generate_alone(
    tiny_model: Any, eos_token: list[int], num_beams: int, length_penalty: float, early_stopping: bool | str
) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_prefill_tokens=64)
    engine.eos_token_ids = frozenset(eos_token)
    knobs = {"length_penalty": length_penalty, "early_stopping": early_stopping}
    requests = [
        EngineRequest(1, tok.encode(PROMPTS[0]), beams(num_beams, **knobs)),
        EngineRequest(2, tok.encode(PROMPTS[3]), GenerationParameters(max_new_tokens=6)),
        EngineRequest(3, tok.encode(PROMPTS[2]), beams(num_beams, max_new=7, **knobs)),
        EngineRequest(4, tok.encode(PROMPTS[3]), GenerationParameters(do_sample=True, seed=7, max_new_tokens=6)),
        EngineRequest(5, tok.encode(PROMPTS[1]), beams(num_beams, max_new=10, **knobs)),
    ]
    got = drive(engine, requests, joins=[0, 0, 1, 2, 4])
    for req in (requests[0], requests[2], requests[4]):
        want = generate_beams(model, list(req.prompt_ids), eos_token, req.params.max_new_tokens,
                              num_beams=num_beams, **knobs)
        assert tokens(got[req.request_id]) == want, req.request_id
        assert got[req.request_id][-1].finish_reason == ("eos_token" if want[-1] in eos_token else "length")
    greedy = generate_beams(model, list(requests[1].prompt_ids), eos_token, 6)
    assert tokens(got[2]) == greedy
    alone = HFEngine(model, tok)
    alone.eos_token_ids = frozenset(eos_token)
    assert tokens(got[4]) == tokens(drive(alone, [requests[3]], [0])[4])
    assert not engine.has_unfinished() and engine.kv_shape == (0, 0)


def test_beams_with_repetition_penalty_and_min_new_tokens_equal_generate(tiny_model: Any, eos_token: list[int]) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    engine.eos_token_ids = frozenset(eos_token)
    ids = tok.encode(PROMPTS[0])
    params = beams(3, max_new=9, repetition_penalty=1.3, min_new_tokens=4)
    got = drive(engine, [EngineRequest(1, ids, params)], [0])
    want = generate_beams(model, ids, eos_token, 9, num_beams=3, repetition_penalty=1.3, min_new_tokens=4)
    assert tokens(got[1]) == want


@pytest.mark.parametrize("budget", [4, 512])  # 4: the prompt is prefilled in chunks, then forked
def test_the_prompt_is_prefilled_once_then_forked(tiny_model: Any, budget: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_prefill_tokens=budget)
    shapes: list[tuple[int, ...]] = []
    forward = engine._forward

    def counting(ids: torch.Tensor, *args: Any) -> torch.Tensor:
        shapes.append(tuple(ids.shape))
        return forward(ids, *args)

    monkeypatch.setattr(engine, "_forward", counting)
    ids = tok.encode(PROMPTS[0])
    engine.add_request(EngineRequest(1, ids, beams(4, max_new=5)))
    while engine.kv_shape[0] == 0:
        engine.step()
    assert all(shape[0] == 1 for shape in shapes)  # the prompt: one row
    assert sum(shape[1] for shape in shapes) == len(ids)
    assert engine.kv_shape[0] == 4  # then four beam rows
    engine.step()
    assert shapes[-1] == (4, 1)
    outs: list[StepOutput] = []
    while engine.has_unfinished():
        outs += engine.step()
        if outs and outs[-1].finish_reason:
            engine.release(1)
    assert len(outs) <= 5


def test_streamed_tokens_are_settled_and_end_with_the_best(tiny_model: Any, eos_token: list[int]) -> None:
    """Tokens come out only once every beam and finished hypothesis shares them; joined, they are the best."""
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    engine.eos_token_ids = frozenset(eos_token)
    ids = tok.encode(PROMPTS[2])
    engine.add_request(EngineRequest(1, ids, beams(4, max_new=12)))
    seen: list[int] = []
    per_step: list[int] = []
    while engine.has_unfinished():
        outs = engine.step()
        per_step.append(len(outs))
        seen += tokens(outs)
        if outs and outs[-1].finish_reason:
            engine.release(1)
    assert seen == generate_beams(model, ids, eos_token, 12, num_beams=4)
    assert per_step[-1] >= 1 and len(per_step) >= 2


def test_release_mid_search_frees_every_beam_row(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    engine.add_request(EngineRequest(1, tok.encode(PROMPTS[0]), beams(3, max_new=20)))
    engine.add_request(EngineRequest(2, tok.encode(PROMPTS[1]), GenerationParameters(max_new_tokens=8)))
    engine.step()
    engine.step()
    assert engine.kv_shape[0] == 4
    engine.release(1)
    engine.step()
    assert engine.running_ids == (2,)


@pytest.mark.parametrize(("extra", "field"), [
    ({"do_sample": True}, "do_sample"),
    ({"num_beams": 40}, "num_beams"),
    ({"top_n_tokens": 2}, "top_n_tokens"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
])
def test_beams_the_engine_cannot_run_are_refused(tiny_model: Any, extra: dict[str, Any], field: str) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_batch_size=8)
    params = GenerationParameters(**{"num_beams": 2, **extra})
    with pytest.raises(InvalidParameter) as err:
        engine.add_request(EngineRequest(1, tok.encode("hi"), params))
    assert err.value.field == field
    assert not engine.has_unfinished()


@pytest.mark.slow
def test_real_model_beams_equal_generate(real_model: Any) -> None:
    model, tok = real_model
    engine = HFEngine(model, tok, max_prefill_tokens=64)
    requests = [
        EngineRequest(1, tok.encode("The best way to learn a language is"), beams(4, max_new=16)),
        EngineRequest(2, tok.encode("Hello there"), GenerationParameters(max_new_tokens=8)),
        EngineRequest(3, tok.encode("Write a haiku about the sea."), beams(3, max_new=12, length_penalty=0.6,
                                                                         early_stopping=True)),
    ]
    got = drive(engine, requests, [0, 0, 2])
    eos = sorted(engine.eos_token_ids)
    for req, knobs in ((requests[0], {}), (requests[2], {"length_penalty": 0.6, "early_stopping": True})):
        with torch.inference_mode():
            out = model.generate(torch.tensor([list(req.prompt_ids)]), max_new_tokens=req.params.max_new_tokens,
                                 do_sample=False, num_beams=req.params.num_beams, eos_token_id=eos, **knobs)
        new = out[0, len(req.prompt_ids):].tolist()
        cut = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
        assert tokens(got[req.request_id]) == new[:cut]


def test_n_best_hypotheses_under_the_sample_ids_equal_generate(tiny_model: Any, eos_token: list[int]) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    engine.eos_token_ids = frozenset(eos_token)
    ids = tok.encode(PROMPTS[1])
    params = GenerationParameters(num_beams=4, n=3, max_new_tokens=10, length_penalty=2.0, early_stopping="never")
    req = EngineRequest(1, ids, params, sample_ids=(7, 8))
    neighbour = EngineRequest(2, tok.encode(PROMPTS[0]), GenerationParameters(max_new_tokens=5))
    got: dict[int, list[StepOutput]] = {1: [], 7: [], 8: [], 2: []}
    engine.add_request(req)
    engine.add_request(neighbour)
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id].append(out)
            if out.finish_reason or len(got[out.request_id]) == 5 and out.request_id == 2:
                engine.release(out.request_id)
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False, num_beams=4,
                             num_return_sequences=3, length_penalty=2.0, early_stopping="never",
                             eos_token_id=eos_token, pad_token_id=0)
    want = []
    for row in out[:, len(ids):].tolist():
        want.append(row[: next((i + 1 for i, t in enumerate(row) if t in eos_token), len(row))])
    assert [tokens(got[rid]) for rid in (1, 7, 8)] == want
    assert len({tuple(w) for w in want}) == 3
    assert engine.kv_shape == (0, 0)


def test_more_sequences_than_beams_is_refused(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    with pytest.raises(InvalidParameter) as err:
        engine.add_request(EngineRequest(1, tok.encode("hi"), GenerationParameters(num_beams=2, n=3),
                                         sample_ids=(2, 3)))
    assert err.value.field == "n"


def test_dynamic_batching_answers_that_beams_need_the_rolling_batch(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    beam, plain = engine.generate_static([EngineRequest(1, tok.encode("hi"), beams(2, max_new=3)),
                                          EngineRequest(2, tok.encode("hi"), GenerationParameters(max_new_tokens=3))])
    assert len(beam) == 1 and "rolling batch" in (beam[0].error or "")
    assert [o.error for o in plain] == [None] * 3
