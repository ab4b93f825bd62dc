"""HFEngine: continuous batching must reproduce ``model.generate()`` request by request."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.base import EngineRequest, StepOutput  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import PromptTooLong  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model, real_model, embedded_dir

PROMPTS = [
    "Hello there",
    "The capital of France is a city that",
    "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three",
    "x",
    "Deep learning is",
]


def reference(model: Any, ids: list[int], n: int, **kwargs: Any) -> list[int]:
    """What ``generate()`` gives for this request alone (exactly ``n`` tokens)."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, **kwargs)
    return out[0, len(ids) :].tolist()


def run(
    engine: HFEngine,
    requests: list[EngineRequest],
    joins: list[int],
    stop_after: dict[int, int] | None = None,
) -> dict[int, list[StepOutput]]:
    """Drive the engine like a scheduler: add requests at their join step, release each when it
    has ``max_new_tokens`` tokens (or ``stop_after[id]``), collect every output."""
    got: dict[int, list[StepOutput]] = {r.request_id: [] for r in requests}
    limits = {r.request_id: r.params.max_new_tokens for r in requests}
    limits.update(stop_after or {})
    step = 0
    while step <= max(joins) or engine.has_unfinished():
        for req, join in zip(requests, joins, strict=True):
            if join == step:
                engine.add_request(req)
        for out in engine.step():
            got[out.request_id].append(out)
            if out.error is not None or len(got[out.request_id]) == limits[out.request_id]:
                engine.release(out.request_id)
        step += 1
        assert step < 500, "engine did not finish"
    return got


def greedy_requests(tok: Any, news: list[int]) -> list[EngineRequest]:
    return [
        EngineRequest(i, tok.encode(p), GenerationParameters(max_new_tokens=n))
        for i, (p, n) in enumerate(zip(PROMPTS, news, strict=True))
    ]


@pytest.mark.parametrize("prefill_budget", [512, 16])
def test_greedy_mixed_batch_equals_generate_alone(tiny_model: Any, prefill_budget: int) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_prefill_tokens=prefill_budget)
    news = [6, 9, 5, 7, 8]
    requests = greedy_requests(tok, news)
    got = run(engine, requests, joins=[0, 0, 2, 3, 5])
    for req in requests:
        tokens = [o.token_id for o in got[req.request_id]]
        assert tokens == reference(model, list(req.prompt_ids), req.params.max_new_tokens)
    assert not engine.has_unfinished() and engine.kv_shape == (0, 0)


def test_release_mid_batch_keeps_others_correct_and_frees_rows(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    news = [10, 10, 10, 10, 10]
    requests = greedy_requests(tok, news)
    for req in requests:
        engine.add_request(req)
    got: dict[int, list[int]] = {r.request_id: [] for r in requests}
    for _ in range(3):
        for out in engine.step():
            got[out.request_id].append(out.token_id)
    width_before = engine.kv_shape[1]
    engine.release(2)  # the long prompt: its left padding must go too
    engine.release(4)
    assert engine.running_ids == (0, 1, 3)
    while any(len(got[i]) < 10 for i in (0, 1, 3)):
        outs = engine.step()
        assert {o.request_id for o in outs} == {0, 1, 3}
        for out in outs:
            got[out.request_id].append(out.token_id)
    rows, width = engine.kv_shape
    assert rows == 3
    assert width < width_before  # trimmed: the longest remaining prompt is much shorter
    for i in (0, 1, 3):
        assert got[i] == reference(model, list(requests[i].prompt_ids), 10)


def test_release_of_queued_request_and_unknown_id(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    engine.add_request(EngineRequest(1, tok.encode("hi"), GenerationParameters()))
    engine.release(1)
    engine.release(12345)  # unknown: ignored
    assert not engine.has_unfinished()
    assert engine.step() == []


def sampling_params(seed: int) -> GenerationParameters:
    return GenerationParameters(do_sample=True, seed=seed, temperature=0.9, top_k=50, top_p=0.95, max_new_tokens=8)


def test_same_seed_same_tokens_alone_or_in_a_batch(tiny_model: Any) -> None:
    model, tok = tiny_model
    target = EngineRequest(0, tok.encode(PROMPTS[1]), sampling_params(seed=1234))
    alone = run(HFEngine(model, tok), [target], joins=[0])[0]
    neighbours = [
        EngineRequest(1, tok.encode(PROMPTS[2]), sampling_params(seed=7)),
        EngineRequest(2, tok.encode(PROMPTS[0]), GenerationParameters(max_new_tokens=12)),
        EngineRequest(3, tok.encode(PROMPTS[4]), sampling_params(seed=1234)),
    ]
    batched = run(HFEngine(model, tok, max_prefill_tokens=16), [*neighbours, target], joins=[0, 0, 1, 2])[0]
    assert [o.token_id for o in batched] == [o.token_id for o in alone]
    other_seed = EngineRequest(0, target.prompt_ids, sampling_params(seed=99))
    different = run(HFEngine(model, tok), [other_seed], joins=[0])[0]
    assert [o.token_id for o in different] != [o.token_id for o in alone]


def test_log_probs_are_the_model_distribution(tiny_model: Any) -> None:
    model, tok = tiny_model
    ids = tok.encode(PROMPTS[1])
    got = run(HFEngine(model, tok), [EngineRequest(0, ids, GenerationParameters(max_new_tokens=4))], [0])[0]
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=4, do_sample=False, return_dict_in_generate=True, output_logits=True
        )
    for o, logits in zip(got, out.logits, strict=True):
        expected = torch.log_softmax(logits[0].float(), dim=-1)[o.token_id].item()
        assert math.isfinite(o.log_prob) and o.log_prob <= 0.0
        assert o.log_prob == pytest.approx(expected, abs=1e-4)


def test_repetition_penalty_greedy_matches_generate(tiny_model: Any) -> None:
    model, tok = tiny_model
    ids = tok.encode(PROMPTS[0])
    params = GenerationParameters(max_new_tokens=8, repetition_penalty=1.5)
    got = run(HFEngine(model, tok), [EngineRequest(0, ids, params)], [0])[0]
    expected = reference(model, ids, 8, repetition_penalty=1.5)
    assert [o.token_id for o in got] == expected
    assert expected != reference(model, ids, 8)  # the penalty really changed something


def test_prompt_longer_than_context_is_rejected(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_model_len=32)
    with pytest.raises(PromptTooLong, match="32"):
        engine.add_request(EngineRequest(0, [5] * 32, GenerationParameters()))
    assert not engine.has_unfinished()


def test_row_reaching_context_length_gets_an_error_alone(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_model_len=32)
    full = EngineRequest(0, [5] * 30, GenerationParameters(max_new_tokens=10))
    short = EngineRequest(1, tok.encode("hi"), GenerationParameters(max_new_tokens=5))
    got = run(engine, [full, short], joins=[0, 0])
    assert [o.error is None for o in got[0]] == [True, True, False]  # 30 + 2 tokens = 32 = context
    assert "context length" in (got[0][-1].error or "")
    assert [o.token_id for o in got[1]] == reference(model, list(short.prompt_ids), 5)


def test_generate_static_equals_generate_alone(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    requests = greedy_requests(tok, [3, 6, 4, 5, 2])
    requests.append(EngineRequest(9, tok.encode(PROMPTS[1]), sampling_params(seed=3)))
    results = engine.generate_static(requests)
    assert len(results) == len(requests)
    for req, outs in zip(requests[:-1], results, strict=False):
        assert [o.token_id for o in outs] == reference(model, list(req.prompt_ids), req.params.max_new_tokens)
        assert all(o.log_prob is not None and o.log_prob <= 0 for o in outs)
        assert outs[-1].finish_reason == "length"
    assert len(results[-1]) == 8 and all(o.error is None for o in results[-1])
    assert engine.generate_static([requests[-1]])[0] == results[-1]  # seeded: reproducible
    too_long = EngineRequest(7, [5] * 600, GenerationParameters())
    assert "600" in (engine.generate_static([too_long])[0][0].error or "")


def test_step_failure_drops_running_rows(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    engine.add_request(EngineRequest(0, tok.encode("hi"), GenerationParameters()))
    engine.step()

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("forward exploded")

    monkeypatch.setattr(engine, "_forward", boom)
    with pytest.raises(RuntimeError, match="exploded"):
        engine.step()
    assert not engine.has_unfinished() and engine.kv_shape == (0, 0)


@pytest.mark.slow
def test_real_model_greedy_mixed_batch_equals_generate(real_model: Any) -> None:
    model, tok = real_model
    engine = HFEngine(model, tok, max_prefill_tokens=24)
    news = [5, 6, 4, 5]
    requests = greedy_requests(tok, news + [3])[:4]
    got = run(engine, requests, joins=[0, 1, 1, 3])
    for req in requests:
        tokens = [o.token_id for o in got[req.request_id]]
        assert tokens == reference(model, list(req.prompt_ids), req.params.max_new_tokens)
        assert all(math.isfinite(o.log_prob or math.nan) for o in got[req.request_id])


@pytest.mark.slow
def test_real_model_generate_static_equals_generate(real_model: Any) -> None:
    model, tok = real_model
    requests = greedy_requests(tok, [4, 3, 5, 2, 4])[:3]
    results = HFEngine(model, tok).generate_static(requests)
    for req, outs in zip(requests, results, strict=True):
        assert [o.token_id for o in outs] == reference(model, list(req.prompt_ids), req.params.max_new_tokens)


def test_prefill_failure_fails_only_the_new_requests(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    first = EngineRequest(0, tok.encode(PROMPTS[0]), GenerationParameters(max_new_tokens=4))
    engine.add_request(first)
    tokens = [engine.step()[0].token_id]
    real_forward = engine._forward

    def fail_prefill(ids: Any, *args: Any) -> Any:
        if ids.shape[1] > 1:  # a prefill, not a decode
            raise RuntimeError("bad prompt")
        return real_forward(ids, *args)

    monkeypatch.setattr(engine, "_forward", fail_prefill)
    engine.add_request(EngineRequest(1, tok.encode(PROMPTS[1]), GenerationParameters()))
    outs = {o.request_id: o for o in engine.step()}
    assert "bad prompt" in (outs[1].error or "")
    tokens.append(outs[0].token_id)
    monkeypatch.setattr(engine, "_forward", real_forward)
    while len(tokens) < 4:
        tokens.append(engine.step()[0].token_id)
    assert tokens == reference(model, list(first.prompt_ids), 4)
    assert engine.running_ids == (0,)


def test_admission_is_first_fit_and_never_overtakes_a_chunked_prompt(tiny_model: Any) -> None:
    """Budget 64 padded tokens: a (40) is admitted; b (40) does not fit what is left, c (20) does and
    goes first; b is considered first at the next step. A prompt longer than the whole budget (d)
    is chunked from a full budget and nobody behind it (e) overtakes it."""
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_prefill_tokens=64)
    lengths = {0: 40, 1: 40, 2: 20}
    for rid, n in lengths.items():
        engine.add_request(EngineRequest(rid, [5 + (i % 50) for i in range(n)], GenerationParameters(max_new_tokens=3)))
    engine.step()
    assert sorted(engine.running_ids) == [0, 2]
    engine.step()
    assert sorted(engine.running_ids) == [0, 1, 2]
    for rid in (0, 1, 2):
        engine.release(rid)
    engine.add_request(EngineRequest(3, [7] * 100, GenerationParameters(max_new_tokens=2)))
    engine.add_request(EngineRequest(4, [9] * 5, GenerationParameters(max_new_tokens=2)))
    engine.step()  # d's first chunk (64 tokens) takes the whole budget; e waits behind it
    assert engine.running_ids == () and [r.request.request_id for r in engine._queue] == [4]  # noqa: SLF001
    engine.step()  # d's last 36 tokens, then e fits in what is left
    assert sorted(engine.running_ids) == [3, 4]


def test_prefill_groups_keep_padding_small(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """100, 10 and 95 tokens fit one 512 budget, but 10 next to 100 would be 90 % padding: it gets
    its own group in the same step, and 95 joins 100's group (2.5 % padding)."""
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_prefill_tokens=512)
    groups: list[list[int]] = []
    original = engine._prefill_group  # noqa: SLF001

    def record(group: list[Any]) -> Any:
        groups.append([r.request.request_id for r in group])
        return original(group)

    monkeypatch.setattr(engine, "_prefill_group", record)
    for rid, n in enumerate((100, 10, 95)):
        engine.add_request(EngineRequest(rid, [5 + (i % 50) for i in range(n)], GenerationParameters(max_new_tokens=2)))
    engine.step()
    assert groups == [[0, 2], [1]] and sorted(engine.running_ids) == [0, 1, 2]
