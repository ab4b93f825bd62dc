"""Our beam-search loop over vLLM (``vllm_beam_rules``, ``vllm_beam_loop``, ``vllm_beam_sync``) without vLLM.

The "model" is a fixed random table: each context (prompt + tokens) has its own log-softmax over a
20-token vocabulary (id 0 is the eos), so eos candidates come up often. transformers' rule fed only
each beam's top ``K`` must give what ``BeamSearch`` gives on the full tables (the claim the loop rests
on); vLLM's rule is checked on cases worked by hand; the synchronous adapter drives both rules across
its steps over the fake ``vllm`` package (tests/fakes) whose engine answers one-token requests from
the table, beside a plain request.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")

from djl_handlers.engines.base import EngineRequest, StepOutput  # noqa: E402
from djl_handlers.engines.external.vllm_beam_loop import beam_rule, check_beams  # noqa: E402
from djl_handlers.engines.external.vllm_beam_rules import (  # noqa: E402
    Ended,
    VllmRule,
    sequence_outputs,
)
from djl_handlers.engines.external.vllm_beam_transformers import TransformersRule  # noqa: E402
from djl_handlers.engines.hf.beams import BeamSearch, beam_outputs  # noqa: E402
from djl_handlers.errors import InvalidParameter  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

FAKES = Path(__file__).resolve().parents[1] / "fakes"
VOCAB = 20
EOS = 0
PROMPT = (5, 9, 3)


def table(context: tuple[int, ...]) -> Any:
    """The table model's next-token log-probs after ``context`` (float32)."""
    generator = torch.Generator().manual_seed(zlib.crc32(repr(context).encode()))
    return torch.log_softmax(torch.randn(VOCAB, generator=generator) * 2.0, dim=-1)


def top(context: tuple[int, ...], k: int) -> dict[int, float]:
    """What vLLM returns for ``logprobs=k``: the top ``k``, most likely first."""
    values, index = torch.topk(table(context), k)
    return {int(t): float(v) for t, v in zip(index.tolist(), values.tolist(), strict=True)}


def full_search(search: BeamSearch, prompt: tuple[int, ...]) -> list[StepOutput]:
    """``BeamSearch`` on every beam's full table (as the HF engine feeds it)."""
    outs = []
    while not search.done:
        rows = torch.stack([table(prompt + tokens) for tokens, _ in search.running])
        search.step(rows, rows)
        outs += beam_outputs(search)
    return outs


def drive(rule: Any, prompt: tuple[int, ...]) -> tuple[list[StepOutput], int]:
    """A rule fed each asked beam's top log-probs, as the loops feed it; its outputs and steps."""
    outs, steps = [], 0
    while not rule.done:
        outs += rule.feed([top(prompt + ask, rule.logprobs) for ask in rule.asks()])
        steps += 1
    return outs, steps


@pytest.mark.parametrize(("beams", "limit", "eos", "length_penalty", "early_stopping"), [
    (2, 8, [EOS], 1.0, False),
    (3, 10, [EOS], 0.5, True),
    (4, 12, [EOS, 7], 2.0, "never"),
    (3, 9, [EOS, 7, 11], -1.0, False),
    (2, 6, [], 1.0, True),
])
@pytest.mark.parametrize("prompt", [PROMPT, (1,), (4, 4, 8, 2)])
def test_transformers_rule_on_top_k_equals_the_full_vocabulary(
    prompt: tuple[int, ...], beams: int, limit: int, eos: list[int], length_penalty: float,
    early_stopping: bool | str,
) -> None:
    knobs: dict[str, Any] = {"length_penalty": length_penalty, "early_stopping": early_stopping, "ids": [1, 2]}
    want = full_search(BeamSearch(beams, limit, eos, **knobs), prompt)
    rule = TransformersRule(BeamSearch(beams, limit, eos, **knobs))
    assert rule.logprobs == max(2, 1 + len(eos)) * beams
    got, _ = drive(rule, prompt)
    assert got == want
    assert [o.request_id for o in got if o.finish_reason] == [1, 2]


def test_transformers_rule_asks_one_beam_first_then_every_beam() -> None:
    rule = TransformersRule(BeamSearch(3, 5, [EOS], ids=[1]))
    assert rule.asks() == [()]
    rule.feed([top(PROMPT, rule.logprobs)])
    asks = rule.asks()
    assert len(asks) == 3 and all(len(a) == 1 for a in asks) and len(set(asks)) == 3


def vllm_rule(prompt: tuple[int, ...] = PROMPT, **kwargs: Any) -> VllmRule:
    settings: dict[str, Any] = {"beam_width": 2, "max_tokens": 3, "eos_token_id": EOS, "ids": [1, 2], **kwargs}
    return VllmRule(list(prompt), **settings)


def test_vllm_rule_ends_a_hypothesis_on_any_returned_eos() -> None:
    """An eos ranked last in a beam's top 2 x width still finishes a hypothesis (vLLM's loop keeps
    every one), and wins here by the length penalty that counts the prompt."""
    rule = vllm_rule(max_tokens=2, length_penalty=1.0)
    assert rule.logprobs == 4
    assert rule.feed([{4: -0.1, 6: -0.5, 8: -1.0, EOS: -1.2}]) == []
    assert [b.tokens for b in rule.running] == [(4,), (6,)]
    assert [b.tokens for b in rule.completed] == [()]
    outs = rule.feed([{5: -3.0, 2: -3.1, 1: -3.2, EOS: -3.3}, {7: -3.0, 2: -3.1, 1: -3.2, EOS: -3.4}])
    assert rule.done
    # scores: eos at step 1: -1.2/3 = -0.4 (prompt 3, eos not counted); (4, 5): -3.1/5; eos after 4: -3.4/4
    assert [(o.request_id, o.token_id, o.finish_reason) for o in outs] == [
        (1, EOS, "eos_token"), (2, 4, None), (2, 5, "length")]
    assert [o.log_prob for o in outs] == pytest.approx([-1.2, -0.1, -3.0])


def test_vllm_rule_length_counts_the_prompt() -> None:
    """The same candidates, a longer prompt: the early eos overtakes the running beam. Prompt of one
    token: eos -0.5/1 < (4, 5) -0.6/3; of 19: eos -0.5/19 > (4, 5) -0.6/21 (generated tokens alone
    would rank (4, 5) first in both)."""
    steps = [[{4: -0.1, 6: -0.3, 8: -1.0, EOS: -0.5}], [{5: -0.5, 2: -3.1, 1: -3.2, 3: -3.3},
                                                      {7: -3.0, 2: -3.1, 1: -3.2, 3: -3.4}]]
    firsts = []
    for prompt in ((5,), tuple(range(1, 20))):
        rule = vllm_rule(prompt, max_tokens=2, length_penalty=1.0)
        outs = [o for tops in steps for o in rule.feed(tops)]
        firsts.append([o.token_id for o in outs if o.request_id == 1])
    assert firsts == [[4, 5], [EOS]]


def test_vllm_rule_ignore_eos_and_include_stop_str() -> None:
    ignoring = vllm_rule(max_tokens=1, ignore_eos=True, beam_width=1)
    outs = ignoring.feed([{EOS: -0.1, 3: -0.2}])
    assert [(o.token_id, o.finish_reason) for o in outs] == [(EOS, "length")]
    including = vllm_rule(max_tokens=1, include_stop_str_in_output=True, beam_width=1)
    outs = including.feed([{EOS: -0.1, 3: -0.2}])
    assert including.results()[0] == Ended((EOS,), ({EOS: -0.1, 3: -0.2},), "stop", EOS)
    assert [(o.token_id, o.finish_reason) for o in outs] == [(EOS, "eos_token")]


def test_sequence_outputs_restore_the_eos_vllm_left_out() -> None:
    ended = Ended((4, 6), ({4: -0.5}, {6: -0.25}, {EOS: -0.125}), "stop", EOS)
    outs = sequence_outputs(7, ended)
    assert [(o.token_id, o.log_prob, o.finish_reason) for o in outs] == [
        (4, -0.5, None), (6, -0.25, None), (EOS, -0.125, "eos_token")]


def params(**kwargs: Any) -> GenerationParameters:
    return GenerationParameters.from_dict(kwargs, engine="vllm")


def test_early_stopping_given_picks_transformers_rule() -> None:
    for given, rule_type in (({}, VllmRule), ({"early_stopping": False}, TransformersRule),
                             ({"early_stopping": "never"}, TransformersRule)):
        request = EngineRequest(1, list(PROMPT), params(num_beams=2, **given))
        assert isinstance(beam_rule(request, eos_ids={EOS}, eos_token_id=EOS, max_model_len=64), rule_type)


@pytest.mark.parametrize(("given", "field"), [
    ({"num_beams": 11}, "num_beams"),  # vLLM's rule: 2 x 11 log-probs > 20
    ({"num_beams": 7, "early_stopping": True}, "num_beams"),  # max(2, 1 + 2 eos) x 7 = 21 > 20
    ({"num_beams": 2, "early_stopping": True, "do_sample": True}, "do_sample"),
    ({"num_beams": 2, "early_stopping": True, "repetition_penalty": 1.2}, "repetition_penalty"),
    ({"num_beams": 2, "early_stopping": True, "min_new_tokens": 2}, "min_new_tokens"),
    ({"num_beams": 2, "early_stopping": True, "top_n_tokens": 2}, "top_n_tokens"),
])
def test_refusals_name_the_field(given: dict[str, Any], field: str) -> None:
    request = EngineRequest(1, list(PROMPT), params(**given))
    with pytest.raises(InvalidParameter) as info:
        check_beams(request, limit=20, eos_ids={EOS, 7}, sync=True)
    assert info.value.field == field


def test_widths_at_the_limit_pass() -> None:
    for given in ({"num_beams": 10}, {"num_beams": 6, "early_stopping": True},
                  {"num_beams": 6, "early_stopping": True, "repetition_penalty": 1.0}):
        check_beams(EngineRequest(1, list(PROMPT), params(**given)), limit=20, eos_ids={EOS, 7}, sync=True)


# -- the synchronous adapter over the fake vllm package ---------------------------------------------


def _drop(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture
def adapter(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A ``VllmEngine`` over the fake ``LLMEngine`` whose one-token requests with ``logprobs`` > 1 read
    the table (the top ``logprobs``, the greedy token first); other requests are the toy model's."""
    _drop("vllm")
    monkeypatch.syspath_prepend(str(FAKES))
    import vllm
    from vllm.engine.llm_engine import LLMEngine
    from vllm.logprobs import Logprob

    assert getattr(vllm, "IS_FAKE", False), vllm.__file__

    class TableEngine(LLMEngine):  # type: ignore[misc]
        def _advance(self, seq: Any) -> None:
            k = seq.params.logprobs or 0
            if k <= 1:
                super()._advance(seq)
                return
            tops = top(tuple(seq.prompt_ids), k)
            seq.token_ids.append(next(iter(tops)))
            seq.logprobs.append({t: Logprob(lp, r + 1) for r, (t, lp) in enumerate(tops.items())})
            seq.finish_reason = "length"

    from djl_handlers.engines.external.vllm import VllmEngine

    engine = TableEngine(vllm.EngineArgs(model="toy", max_model_len=64))
    yield VllmEngine(engine)
    _drop("vllm")


def run(adapter: Any, requests: list[EngineRequest], release: bool = True) -> dict[int, list[tuple[int, StepOutput]]]:
    """Add the requests, step until nothing is unfinished; each output with the step that gave it.
    Finished ids are released as the scheduler does."""
    for request in requests:
        adapter.add_request(request)
    got: dict[int, list[tuple[int, StepOutput]]] = {}
    for step in range(200):
        if not adapter.has_unfinished():
            return got
        for out in adapter.step():
            assert out.error is None, out.error
            got.setdefault(out.request_id, []).append((step, out))
            if out.finish_reason and release:
                adapter.release(out.request_id)
    raise AssertionError("the adapter did not finish")


def test_sync_beams_run_beside_a_plain_request(adapter: Any) -> None:
    knobs = {"num_beams": 3, "max_new_tokens": 6, "n": 2, "length_penalty": 0.5}
    vllm_way = EngineRequest(1, list(PROMPT), params(**knobs), sample_ids=(11,))
    hf_way = EngineRequest(2, list(PROMPT), params(early_stopping=True, **knobs), sample_ids=(12,))
    plain = EngineRequest(3, adapter.tokenizer.encode("Deep"), params(max_new_tokens=4))
    got = run(adapter, [vllm_way, hf_way, plain])
    want_vllm, vllm_steps = drive(beam_rule(vllm_way, eos_ids={EOS}, eos_token_id=EOS, max_model_len=64), PROMPT)
    want_hf, _ = drive(beam_rule(hf_way, eos_ids={EOS}, eos_token_id=EOS, max_model_len=64), PROMPT)
    assert [o for rid in (1, 11) for _, o in got[rid]] == [o for o in want_vllm if o.request_id == 1] + [
        o for o in want_vllm if o.request_id == 11]
    assert [o for rid in (2, 12) for _, o in got[rid]] == [o for o in want_hf if o.request_id == 2] + [
        o for o in want_hf if o.request_id == 12]
    assert [o.text for _, o in got[3]] == [" learning", " is", " a", " really"]
    assert got[3][-1][0] < got[1][0][0]  # the plain request finished while the beams still searched
    assert vllm_steps == 6 and {s for s, _ in got[1]} == {vllm_steps - 1}  # vLLM's rule answers once, at the end
    assert not adapter._beams._searches and not adapter._beams._subs


def test_sync_beams_stream_settled_tokens_with_transformers_rule(adapter: Any) -> None:
    """Tokens come at the steps where the pure rule settles them (a prompt whose beams agree early)."""
    prompt = (1, 2)
    request = EngineRequest(1, list(prompt), params(num_beams=2, max_new_tokens=10, early_stopping="never"))
    rule = beam_rule(request, eos_ids={EOS}, eos_token_id=EOS, max_model_len=64)
    want = []
    while not rule.done:
        want.append(rule.feed([top(prompt + ask, rule.logprobs) for ask in rule.asks()]))
    got = run(adapter, [request])[1]
    assert [[o for s, o in got if s == step] for step in range(len(want))] == want
    assert sum(1 for outs in want if outs) > 2  # several steps reported tokens


def test_releasing_a_beam_request_aborts_its_running_steps(adapter: Any) -> None:
    request = EngineRequest(1, list(PROMPT), params(num_beams=3, max_new_tokens=8))
    adapter.add_request(request)
    adapter.step()
    adapter.step()
    assert adapter.has_unfinished() and adapter._beams._subs
    running = set(adapter._beams._subs)
    adapter.release(1)
    assert running <= set(adapter.engine.aborted)
    assert not adapter.has_unfinished() and not adapter._beams._subs


def test_sync_beam_errors_are_the_requests(adapter: Any) -> None:
    from djl_handlers.errors import PromptTooLong

    with pytest.raises(PromptTooLong):
        adapter.add_request(EngineRequest(1, [3] * 65, params(num_beams=2)))
    with pytest.raises(InvalidParameter) as info:
        adapter.add_request(EngineRequest(2, list(PROMPT), params(num_beams=11)))
    assert info.value.field == "num_beams"
    assert not adapter.has_unfinished()


def test_a_beam_searchs_best_is_its_first_hypothesis_not_the_highest_sum() -> None:
    """With a length penalty the best hypothesis may have the lower sum of log-probs (a longer one):
    the response keeps the engine's order for beams, and ranks samples by the sum otherwise."""
    from djl_handlers.request.records import Request, RequestOutput, Token
    from djl_handlers.request.sequences import best_first

    def group(**knobs: Any) -> RequestOutput:
        request = Request(prompt="p", params=GenerationParameters(n=2, **knobs), inputs="p")
        out = RequestOutput(request=request, prompt_tokens=1)
        long = RequestOutput(request=request, tokens=[Token(5, "a", -1.0), Token(6, "b", -1.0)])
        short = RequestOutput(request=request, tokens=[Token(7, "c", -1.5)])
        out.sequences = [long, short]
        return out

    beams = group(num_beams=2)
    assert best_first(beams) == (beams.sequences[0], [beams.sequences[1]])
    samples = group(do_sample=True)
    assert best_first(samples) == (samples.sequences[1], [samples.sequences[0]])


class _TableAsyncEngine:
    """``AsyncLLM.generate`` for one-token requests over the table (one ``RequestOutput``-like object)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.closed = 0

    def generate(self, prompt: dict[str, Any], sampling: Any, request_id: str, **kwargs: Any) -> Any:
        from types import SimpleNamespace

        self.ids.append(request_id)
        tops = top(tuple(prompt["prompt_token_ids"]), sampling.logprobs)
        entries = {t: SimpleNamespace(logprob=lp) for t, lp in tops.items()}
        comp = SimpleNamespace(token_ids=[next(iter(tops))], logprobs=[entries], finish_reason="length")
        engine = self

        async def stream() -> Any:
            try:
                yield SimpleNamespace(outputs=[comp], finished=True)
            finally:
                engine.closed += 1

        return stream()


def test_async_driver_yields_what_the_rule_gives_step_by_step() -> None:
    import asyncio
    from types import SimpleNamespace

    from djl_handlers.engines.external.vllm_beam_loop import own_beam_outputs

    prompt = (1, 2)
    request = EngineRequest(1, list(prompt), params(num_beams=2, max_new_tokens=10, early_stopping="never"))
    rule = beam_rule(request, eos_ids={EOS}, eos_token_id=EOS, max_model_len=64)
    want = [outs for outs in drive_steps(beam_rule(request, eos_ids={EOS}, eos_token_id=EOS, max_model_len=64),
                                         prompt) if outs]
    engine = _TableAsyncEngine()
    sampling = SimpleNamespace(logprobs=rule.logprobs)

    async def collect() -> list[list[StepOutput]]:
        return [outs async for outs in own_beam_outputs(engine, request, rule, sampling, {})]

    assert asyncio.run(collect()) == want
    assert engine.ids[:3] == ["1-beam-0-0", "1-beam-1-0", "1-beam-1-1"]  # one beam first, then each
    assert engine.closed == len(engine.ids)


def drive_steps(rule: Any, prompt: tuple[int, ...]) -> list[list[StepOutput]]:
    """The rule's outputs per step (as ``drive``, kept apart)."""
    steps = []
    while not rule.done:
        steps.append(rule.feed([top(prompt + ask, rule.logprobs) for ask in rule.asks()]))
    return steps
