"""Beam search's finishing rules, held against transformers' ``generate(num_beams=...)`` step for step.

The texts of ``test_hf_engine_beams.py`` do not show *when* a search ends (a finished set closed by
``early_stopping=True`` returns the same texts one step later as right away), so these tests count
the steps: a beam request is advanced by as many engine steps as transformers' beam search runs
(``len(scores)`` of ``generate(output_scores=True)``). The rest are the rules no text of a random
model reaches: an eos is never streamed before the end, the refusals of :func:`check_beams`, a
beam request whose logits break, ``ignore_eos_token``, the repetition penalty of a beam that forks into
another row, and one sequence of several let go mid-search.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.base import EngineRequest, StepOutput  # noqa: E402
from djl_handlers.engines.hf.beam_rows import check_beams  # noqa: E402
from djl_handlers.engines.hf.beams import BeamSearch  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import InvalidParameter  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model

PROMPT = "One two three four five six seven eight nine ten eleven twelve"


def generate_steps(model: Any, ids: list[int], eos: list[int], max_new: int, **beam: Any) -> tuple[list[int], int]:
    """transformers' beam search alone: the best sequence's new tokens (to its eos) and the steps it ran."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True, **beam)
    new = out.sequences[0, len(ids):].tolist()
    return new[: next((i + 1 for i, t in enumerate(new) if t in eos), len(new))], len(out.scores)


def run_alone(engine: HFEngine, request: EngineRequest) -> tuple[list[int], int]:
    """The request's tokens and the engine steps that advanced it (its prompt fits one prefill step)."""
    engine.add_request(request)
    outs: list[StepOutput] = []
    steps = 0
    while engine.has_unfinished():
        got = engine.step()
        steps += 1
        outs += got
        assert all(o.error is None for o in got)
        if got and got[-1].finish_reason:
            engine.release(request.request_id)
        assert steps < 100
    return [o.token_id for o in outs], steps


@pytest.fixture(scope="module")
def eos_pair(tiny_model: Any) -> list[int]:
    """Two tokens the tiny model's beams of PROMPT meet (the 5th token of its 4-beam answer, the 7th of
    its 2-beam one): as eos, three beams with ``early_stopping=True`` finish three hypotheses at the
    8th step, long before the limit, so the finishing rule decides when the search ends."""
    model, tok = tiny_model
    four, _ = generate_steps(model, tok.encode(PROMPT), [0], 8, num_beams=4)
    two, _ = generate_steps(model, tok.encode(PROMPT), [0], 8, num_beams=2)
    return [four[4], two[6]]


@pytest.mark.parametrize(("num_beams", "length_penalty", "early_stopping"), [
    (3, 0.0, True),
    (3, 0.0, False),
    (4, 1.0, False),
    (3, 2.0, "never"),
])
def test_a_beam_request_runs_as_many_steps_as_generate(
    tiny_model: Any, eos_pair: list[int], num_beams: int, length_penalty: float, early_stopping: bool | str
) -> None:
    """``early_stopping=True`` ends the search as soon as ``num_beams`` hypotheses have finished."""
    model, tok = tiny_model
    ids = tok.encode(PROMPT)
    knobs: dict[str, Any] = {"num_beams": num_beams, "length_penalty": length_penalty, "early_stopping": early_stopping}
    want, want_steps = generate_steps(model, ids, eos_pair, 24, **knobs)
    if early_stopping is True:
        assert want_steps < 24  # ended by the rule, not the token limit
    engine = HFEngine(model, tok)
    engine.eos_token_ids = frozenset(eos_pair)
    params = GenerationParameters(max_new_tokens=24, **knobs)
    got, steps = run_alone(engine, EngineRequest(1, ids, params))
    assert got == want
    assert steps == want_steps


def test_early_stopping_true_ends_once_num_beams_hypotheses_finished() -> None:
    """Two beams, eos 0 the likeliest token of every step, ``length_penalty=2`` (long answers favoured):
    after two steps two hypotheses have finished, so ``early_stopping=True`` ends there, while with
    ``False`` a running beam can still beat them and the search runs to its limit."""
    lp = torch.log_softmax(torch.tensor([[2.0, 1.9, 0.0, -1.0]] * 2), dim=-1)
    stops = {}
    for rule in (True, False):
        search = BeamSearch(2, 50, [0], early_stopping=rule, length_penalty=2.0)
        steps = 0
        while not search.done:
            search.step(lp, lp)
            steps += 1
        stops[rule] = steps
    assert stops == {True: 2, False: 50}


def test_settled_tokens_never_hold_an_eos() -> None:
    """A step whose only finite candidates end with eos: the running beams then hold the eos too (the
    scores' padding), but the eos is the answer's last token, reported at the end, never as settled."""
    lp = torch.tensor([[0.0, float("-inf"), float("-inf")]] * 2)
    search = BeamSearch(2, 10, [0])
    search.step(lp, lp)
    assert [tokens for tokens, _ in search.running] == [(0,), (0,)]
    assert search.settled() == ()
    assert search.best(1)[0].tokens == (0,)


def test_settled_is_the_prefix_every_beam_shares() -> None:
    """Both beams continue token 1, so it is settled; their next tokens differ, so nothing more is."""
    first = torch.log_softmax(torch.tensor([[0.0, 5.0, 0.0, 0.0]] * 2), dim=-1)
    second = torch.log_softmax(torch.tensor([[0.0, 0.0, 3.0, 2.9]] * 2), dim=-1)
    search = BeamSearch(2, 10, [0])
    search.step(first, first)
    assert search.settled() == ()  # beam 1 forked to another token
    search.step(second, second)
    assert search.settled() == (1,)
    assert [tokens for tokens, _ in search.running] == [(1, 2), (1, 3)]


def test_a_finished_search_refuses_another_step_and_bad_sizes_are_refused() -> None:
    lp = torch.log_softmax(torch.zeros((2, 4)), dim=-1)
    search = BeamSearch(2, 1, [0])
    search.step(lp, lp)
    assert search.done
    with pytest.raises(RuntimeError):
        search.step(lp, lp)
    for beams, limit in ((0, 4), (2, 0)):
        with pytest.raises(ValueError):
            BeamSearch(beams, limit, [0])


@pytest.mark.parametrize(("extra", "field"), [
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"bad_sequences": ["a b"]}, "bad_sequences"),
    ({"top_n_tokens": 2}, "top_n_tokens"),
    ({"do_sample": True}, "do_sample"),
    ({"n": 3}, "n"),
    ({"best_of": 3}, "best_of"),
])
def test_check_beams_names_the_field_it_refuses(extra: dict[str, Any], field: str) -> None:
    params = GenerationParameters(**{"num_beams": 2, **extra})
    with pytest.raises(InvalidParameter) as err:
        check_beams(params, 8)
    assert err.value.field == field and f"parameters.{field}" in err.value.message


def test_check_beams_refuses_speculation_graphs_and_more_beams_than_rows() -> None:
    params = GenerationParameters(num_beams=3)
    check_beams(params, 3)
    check_beams(GenerationParameters(num_beams=1, do_sample=True), 1)  # no beams: nothing to check
    for kwargs in ({"speculation": True}, {"graphs": True}):
        with pytest.raises(InvalidParameter) as err:
            check_beams(params, 8, **kwargs)
        assert err.value.field == "num_beams"
    with pytest.raises(InvalidParameter) as err:
        check_beams(params, 2)
    assert err.value.field == "num_beams" and "max_rolling_batch_size" in err.value.message


def test_broken_logits_fail_the_beam_request_alone(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN logits in the beams' rows: every id of the beam request gets an error; the greedy neighbour
    in the same batch still answers generate()'s tokens."""
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    engine.eos_token_ids = frozenset()
    beam_ids = tok.encode(PROMPT)
    plain_ids = tok.encode("Hello there")
    forward = engine._forward

    def breaking(ids: Any, *args: Any) -> Any:
        logits = forward(ids, *args).clone()
        batch = engine._batch
        assert batch is not None
        logits[[r for r, row in enumerate(batch.rows) if row.beam is not None]] = float("nan")
        return logits

    engine.add_request(EngineRequest(1, beam_ids, GenerationParameters(num_beams=2, n=2, max_new_tokens=6),
                                     sample_ids=(9,)))
    engine.add_request(EngineRequest(2, plain_ids, GenerationParameters(max_new_tokens=6)))
    outs = engine.step()  # both prompts: the beam request forks into two rows
    assert engine.kv_shape[0] == 3
    monkeypatch.setattr(engine, "_forward", breaking)
    broken = engine.step()
    monkeypatch.setattr(engine, "_forward", forward)
    assert {o.request_id for o in broken if o.error} == {1, 9}
    engine.release(1)
    engine.release(9)
    outs += broken
    while engine.has_unfinished() and len([o for o in outs if o.request_id == 2]) < 6:
        outs += engine.step()
    plain = [o.token_id for o in outs if o.request_id == 2]
    assert all(o.error is None for o in outs if o.request_id == 2)
    with torch.inference_mode():
        want = model.generate(torch.tensor([plain_ids]), max_new_tokens=6, do_sample=False, pad_token_id=0,
                              eos_token_id=None)[0, len(plain_ids):].tolist()
    assert plain == want


def test_ignore_eos_token_beams_run_to_the_limit(tiny_model: Any, eos_pair: list[int]) -> None:
    """``ignore_eos_token``: no token ends a hypothesis, as transformers' search with an eos never met."""
    model, tok = tiny_model
    ids = tok.encode(PROMPT)
    unreachable = [model.config.vocab_size - 1]
    want, _ = generate_steps(model, ids, unreachable, 8, num_beams=3)
    assert len(want) == 8 and set(want) & set(eos_pair)  # an eos of the engine is in the answer
    engine = HFEngine(model, tok)
    engine.eos_token_ids = frozenset(eos_pair)
    got, _ = run_alone(engine, EngineRequest(1, ids, GenerationParameters(num_beams=3, max_new_tokens=8,
                                                                          ignore_eos_token=True)))
    assert got == want


@pytest.mark.parametrize("prompt", ["Hello there", PROMPT, "Deep learning is"])
def test_repetition_penalty_follows_each_beam_history_equal_generate(tiny_model: Any, prompt: str) -> None:
    """A strong repetition penalty over 4 beams: a beam that forks into a copied row carries its parent's
    tokens (what the penalty reads), not those of the row it lands in."""
    model, tok = tiny_model
    ids = tok.encode(prompt)
    want, _ = generate_steps(model, ids, [0], 12, num_beams=4, repetition_penalty=2.5)
    engine = HFEngine(model, tok)
    engine.eos_token_ids = frozenset([0])
    got, _ = run_alone(engine, EngineRequest(1, ids, GenerationParameters(num_beams=4, max_new_tokens=12,
                                                                          repetition_penalty=2.5)))
    assert got == want


def test_letting_one_sequence_go_keeps_the_search_for_the_others(tiny_model: Any) -> None:
    """``n=2``: the scheduler lets the second sequence go mid-search (a stop rule of its own); the beams
    keep their rows and the best sequence still ends as generate()'s."""
    model, tok = tiny_model
    ids = tok.encode(PROMPT)
    want, _ = generate_steps(model, ids, [0], 10, num_beams=3)
    engine = HFEngine(model, tok)
    engine.eos_token_ids = frozenset([0])
    engine.add_request(EngineRequest(1, ids, GenerationParameters(num_beams=3, n=2, max_new_tokens=10),
                                     sample_ids=(9,)))
    got: list[int] = []
    steps = 0
    while engine.has_unfinished():
        outs = engine.step()
        steps += 1
        if steps == 2:
            engine.release(9)
            assert engine.kv_shape[0] == 3
        got += [o.token_id for o in outs if o.request_id == 1]
        if any(o.request_id == 1 and o.finish_reason for o in outs):
            engine.release(1)
        assert steps < 50
    assert got == want and engine.kv_shape == (0, 0)
