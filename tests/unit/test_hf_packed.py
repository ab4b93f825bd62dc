"""PackedHFEngine (option.hf_step=packed): one ragged forward per step over slot KV must reproduce
``model.generate()`` request by request, like the padded path, and keep its contracts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.config.models import ServingConfig  # noqa: E402
from djl_handlers.engines.base import EngineRequest, StepOutput  # noqa: E402
from djl_handlers.engines.hf_engine import HFEngine  # noqa: E402
from djl_handlers.engines.hf_packed import PackedHFEngine  # noqa: E402
from djl_handlers.errors import ConfigError  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model, real_model, tiny_dir

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


def run(engine: HFEngine, requests: list[EngineRequest], joins: list[int]) -> dict[int, list[StepOutput]]:
    """Add requests at their join step, release each at ``max_new_tokens`` outputs or an error."""
    got: dict[int, list[StepOutput]] = {r.request_id: [] for r in requests}
    limits = {r.request_id: r.params.max_new_tokens for r in requests}
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


def greedy_requests(tok: Any, news: list[int], **params: Any) -> list[EngineRequest]:
    return [
        EngineRequest(i, tok.encode(p), GenerationParameters(max_new_tokens=n, **params))
        for i, (p, n) in enumerate(zip(PROMPTS, news, strict=True))
    ]


@pytest.mark.parametrize("prefill_budget", [512, 16, 5])  # 5: every prompt but "x" in chunks
def test_greedy_mixed_batch_equals_generate_alone(tiny_model: Any, prefill_budget: int) -> None:
    model, tok = tiny_model
    engine = PackedHFEngine(model, tok, max_prefill_tokens=prefill_budget)
    requests = greedy_requests(tok, [6, 9, 5, 7, 8])
    got = run(engine, requests, joins=[0, 0, 2, 3, 5])
    for req in requests:
        want = reference(model, list(req.prompt_ids), req.params.max_new_tokens)
        assert [o.token_id for o in got[req.request_id]] == want
    assert not engine.has_unfinished() and engine.kv_shape == (0, 0)
    assert engine._kv.keys == []  # the slabs are freed with the last request


def test_one_forward_per_step_and_decode_tokens_first(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_model
    engine = PackedHFEngine(model, tok, max_prefill_tokens=8)
    requests = greedy_requests(tok, [4, 4, 4, 4, 4])
    calls: list[tuple[int, int]] = []
    real = engine._packed_forward

    def spy(plan: Any) -> Any:
        calls.append((len(plan.decode), sum(n for _, _, n in plan.chunks)))
        return real(plan)

    monkeypatch.setattr(engine, "_packed_forward", spy)
    for req in requests:
        engine.add_request(req)
    engine.step()
    engine.step()
    assert len(calls) == 2  # one model forward per step
    assert calls[0][1] <= 8 and calls[1][1] <= 8  # the prefill budget counts real tokens
    assert calls[1][0] >= 1  # the second step decodes and prefills in the same forward


def test_release_frees_the_slot_without_touching_other_rows(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = PackedHFEngine(model, tok)
    requests = greedy_requests(tok, [10, 10, 10, 10, 10])
    for req in requests:
        engine.add_request(req)
    got: dict[int, list[int]] = {r.request_id: [] for r in requests}
    for _ in range(3):
        for out in engine.step():
            got[out.request_id].append(out.token_id)
    slabs = [k.data_ptr() for k in engine._kv.keys]
    slot_of_2 = next(s.slot for s in engine._seqs if s.row.request.request_id == 2)
    engine.release(2)
    engine.release(4)
    assert engine.running_ids == (0, 1, 3)
    assert [k.data_ptr() for k in engine._kv.keys] == slabs  # nothing re-packed
    late = EngineRequest(7, tok.encode(PROMPTS[4]), GenerationParameters(max_new_tokens=10))
    engine.add_request(late)
    got[7] = []
    while any(len(got[i]) < 10 for i in (0, 1, 3, 7)):
        for out in engine.step():
            assert out.request_id in (0, 1, 3, 7)
            got[out.request_id].append(out.token_id)
            if len(got[out.request_id]) == 10:
                engine.release(out.request_id)
        if len(got[7]) == 1:
            assert next(s.slot for s in engine._seqs if s.row.request.request_id == 7) == slot_of_2  # reused
    for req in [*requests[:2], requests[3], late]:
        assert got[req.request_id] == reference(model, list(req.prompt_ids), 10)


def test_same_seed_same_tokens_alone_or_in_a_batch(tiny_model: Any) -> None:
    model, tok = tiny_model

    def sampling(seed: int) -> GenerationParameters:
        return GenerationParameters(do_sample=True, seed=seed, temperature=0.9, top_k=50, top_p=0.95, max_new_tokens=8)

    target = EngineRequest(0, tok.encode(PROMPTS[1]), sampling(1234))
    alone = run(PackedHFEngine(model, tok), [target], joins=[0])[0]
    neighbours = [
        EngineRequest(1, tok.encode(PROMPTS[2]), sampling(7)),
        EngineRequest(2, tok.encode(PROMPTS[0]), GenerationParameters(max_new_tokens=12)),
    ]
    batched = run(PackedHFEngine(model, tok, max_prefill_tokens=16), [*neighbours, target], joins=[0, 1, 2])[0]
    assert [o.token_id for o in batched] == [o.token_id for o in alone]


def test_log_probs_and_repetition_penalty_match_generate(tiny_model: Any) -> None:
    model, tok = tiny_model
    ids = tok.encode(PROMPTS[1])
    got = run(PackedHFEngine(model, tok), [EngineRequest(0, ids, GenerationParameters(max_new_tokens=4))], [0])[0]
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=4, do_sample=False, return_dict_in_generate=True, output_logits=True
        )
    for o, logits in zip(got, out.logits, strict=True):
        expected = torch.log_softmax(logits[0].float(), dim=-1)[o.token_id].item()
        assert math.isfinite(o.log_prob or math.nan) and o.log_prob == pytest.approx(expected, abs=1e-4)
    params = GenerationParameters(max_new_tokens=8, repetition_penalty=1.5)
    short = tok.encode(PROMPTS[0])
    penalised = run(PackedHFEngine(model, tok), [EngineRequest(0, short, params)], [0])[0]
    assert [o.token_id for o in penalised] == reference(model, short, 8, repetition_penalty=1.5)


def test_prompt_log_probs_and_top_tokens_equal_the_padded_path(tiny_model: Any) -> None:
    model, tok = tiny_model
    requests = [
        EngineRequest(i, tok.encode(p), GenerationParameters(max_new_tokens=3, decoder_input_details=True,
                                                             top_n_tokens=2))
        for i, p in enumerate(PROMPTS[:3])
    ]
    packed = run(PackedHFEngine(model, tok, max_prefill_tokens=7), requests, [0, 0, 1])
    padded = run(HFEngine(model, tok, max_prefill_tokens=7), requests, [0, 0, 1])
    for req in requests:
        a, b = packed[req.request_id], padded[req.request_id]
        assert [o.token_id for o in a] == [o.token_id for o in b]
        lps_a, lps_b = list(a[0].prompt_logprobs or []), list(b[0].prompt_logprobs or [])
        assert len(lps_a) == len(req.prompt_ids) and lps_a[0] is None
        assert lps_a[1:] == pytest.approx(lps_b[1:], abs=1e-4)
        assert all(o.prompt_logprobs is None for o in a[1:])
        for x, y in zip(a, b, strict=True):
            assert [t for t, _ in x.top_tokens or []] == [t for t, _ in y.top_tokens or []]


def test_row_reaching_context_length_gets_an_error_alone(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = PackedHFEngine(model, tok, max_model_len=32)
    full = EngineRequest(0, [5] * 30, GenerationParameters(max_new_tokens=10))
    short = EngineRequest(1, tok.encode("hi"), GenerationParameters(max_new_tokens=5))
    got = run(engine, [full, short], joins=[0, 0])
    assert [o.error is None for o in got[0]] == [True, True, False]  # 30 + 2 tokens = 32 = context
    assert "context length" in (got[0][-1].error or "")
    assert [o.token_id for o in got[1]] == reference(model, list(short.prompt_ids), 5)


def test_prefill_failure_fails_only_the_new_requests(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_model
    engine = PackedHFEngine(model, tok)
    first = EngineRequest(0, tok.encode(PROMPTS[0]), GenerationParameters(max_new_tokens=4))
    engine.add_request(first)
    tokens = [engine.step()[0].token_id]
    real = engine._packed_forward

    def fail_prefill(plan: Any) -> Any:
        if plan.chunks:
            raise RuntimeError("bad prompt")
        return real(plan)

    monkeypatch.setattr(engine, "_packed_forward", fail_prefill)
    engine.add_request(EngineRequest(1, tok.encode(PROMPTS[1]), GenerationParameters()))
    outs = {o.request_id: o for o in engine.step()}
    assert "bad prompt" in (outs[1].error or "")
    tokens.append(outs[0].token_id)
    monkeypatch.setattr(engine, "_packed_forward", real)
    while len(tokens) < 4:
        tokens.append(engine.step()[0].token_id)
    assert tokens == reference(model, list(first.prompt_ids), 4)
    assert engine.running_ids == (0,) and engine.kv_shape[0] == 1


def test_step_failure_drops_running_rows(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = tiny_model
    engine = PackedHFEngine(model, tok)
    engine.add_request(EngineRequest(0, tok.encode("hi"), GenerationParameters()))
    engine.step()

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("forward exploded")

    monkeypatch.setattr(engine, "_packed_forward", boom)
    with pytest.raises(RuntimeError, match="exploded"):
        engine.step()
    assert not engine.has_unfinished() and engine.kv_shape == (0, 0)


def test_generate_on_the_same_model_is_untouched(tiny_model: Any) -> None:
    model, tok = tiny_model
    before = model.config._attn_implementation
    ids = tok.encode(PROMPTS[4])
    run(PackedHFEngine(model, tok), [EngineRequest(0, ids, GenerationParameters(max_new_tokens=2))], [0])
    assert model.config._attn_implementation == before
    assert len(reference(model, ids, 3)) == 3


def test_from_config_selects_the_step(tiny_dir: Path) -> None:
    padded = HFEngine.from_config(ServingConfig.from_properties({"model_id": str(tiny_dir)}))
    assert type(padded) is HFEngine  # the default
    packed = HFEngine.from_config(ServingConfig.from_properties({"model_id": str(tiny_dir), "hf_step": "packed"}))
    assert type(packed) is PackedHFEngine
    with pytest.raises(ConfigError, match="hf_step"):
        HFEngine.from_config(ServingConfig.from_properties({"model_id": str(tiny_dir), "hf_step": "ragged"}))


@pytest.mark.slow
def test_real_model_greedy_mixed_batch_equals_generate(real_model: Any) -> None:
    model, tok = real_model
    engine = PackedHFEngine(model, tok, max_prefill_tokens=24)
    requests = greedy_requests(tok, [5, 6, 4, 5, 3])[:4]
    got = run(engine, requests, joins=[0, 1, 1, 3])
    for req in requests:
        assert [o.token_id for o in got[req.request_id]] == reference(
            model, list(req.prompt_ids), req.params.max_new_tokens
        )


def test_slot_kv_grows_without_losing_or_moving_rows() -> None:
    from djl_handlers.engines.hf_paged_kv import SlotKV

    kv = SlotKV(layers=2, max_len=4096)
    a, b = kv.acquire(), kv.acquire()
    like = torch.zeros(1, 3, 1, 4)
    kv.reserve(5, like)
    cap = kv.capacity
    k = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4)
    kv.write(1, kv.flat_index(torch.tensor([a, b]), torch.tensor([0, 4])), k, -k)
    kv.reserve(cap + 1, like)  # more columns
    extra = [kv.acquire() for _ in range(10)]  # more slots (doubling)
    assert kv.capacity > cap and kv.n_slots >= 12 and len(set(extra)) == 10
    assert torch.equal(kv.keys[1][a, :, 0], k[0]) and torch.equal(kv.values[1][b, :, 4], -k[1])
    assert torch.count_nonzero(kv.keys[0]) == 0  # new cells are zero (finite), other layers untouched
    kv.release(b)
    assert kv.acquire() == b  # the lowest free slot is reused
    for slot in [a, b, *extra]:
        kv.release(slot)
    assert kv.keys == [] and kv.n_slots == 0


def test_greedy_equality_survives_every_reallocation(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from djl_handlers.engines import hf_paged_kv

    monkeypatch.setattr(hf_paged_kv, "GROW", 1)  # a new slab nearly every step
    monkeypatch.setattr(hf_paged_kv, "SLOT_GROW", 1)
    model, tok = tiny_model
    engine = PackedHFEngine(model, tok, max_prefill_tokens=9)
    requests = greedy_requests(tok, [7, 5, 6, 4, 9])
    got = run(engine, requests, joins=[0, 1, 1, 4, 4])
    for req in requests:
        want = reference(model, list(req.prompt_ids), req.params.max_new_tokens)
        assert [o.token_id for o in got[req.request_id]] == want


def test_handler_with_hf_step_packed_equals_generate(tiny_dir: Path, tiny_model: Any) -> None:
    """The whole pipeline (service, scheduler, detokenizer, jsonlines) on option.hf_step=packed."""
    import json

    from djl_handlers.service import InferenceService
    from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

    model, tok = tiny_model
    service = InferenceService("huggingface")
    driver = RollingBatchDriver(service.handle)
    driver.init({"model_id": str(tiny_dir), "rolling_batch": "auto", "dtype": "fp32", "hf_step": "packed",
                 "max_prefill_tokens": "8"})
    assert type(service.engine) is PackedHFEngine
    submitted = []
    for prompt in PROMPTS[:3]:  # each joins one step after the previous
        body = {"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": 5, "min_new_tokens": 5}}
        submitted.append((prompt, driver.submit(json_request(body))))
        driver.step()
    while driver.active:
        driver.step()
    for prompt, req in submitted:
        lines = [json.loads(x) for x in req.text.splitlines() if x.strip()]
        want = tok.decode(reference(model, tok.encode(prompt), 5), skip_special_tokens=True)
        assert lines[-1]["generated_text"] == want
