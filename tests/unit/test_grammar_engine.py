"""Constrained decoding in the HF engine (xgrammar), on the tiny random Llama: constrained and
unconstrained rows in one continuous batch, grammar completion ends the row, bad constraints are
a 400, the dynamic-batch path constrains too."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")

from djl_handlers.engines.base import EngineRequest, StepOutput  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import InvalidParameter, status_of  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytest_plugins = ["conftest_models"]

BOOL_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "enum": [1, 22]}},
    "required": ["ok", "n"],
}
CASES: list[dict[str, Any]] = [
    {},
    {"guided_regex": "[a-c]{2,4}-[0-9]"},
    {},
    {"guided_choice": ["alpha", "beta gamma", "delta"]},
    {"guided_json": BOOL_SCHEMA},
    {"do_sample": True, "seed": 3, "guided_choice": ["yes", "no"]},
]
PROMPTS = ["Hello there", "Code:", "The capital of France is a city that", "Pick one:", "JSON:", "Answer:"]


def run(engine: HFEngine, requests: list[EngineRequest]) -> dict[int, list[StepOutput]]:
    """Add everything at once, step until done; release a row on eos/finish/limit like the scheduler."""
    got: dict[int, list[StepOutput]] = {r.request_id: [] for r in requests}
    limits = {r.request_id: r.params.max_new_tokens for r in requests}
    for req in requests:
        engine.add_request(req)
    for _ in range(400):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            got[out.request_id].append(out)
            ended = out.error is not None or out.finish_reason is not None or out.token_id in engine.eos_token_ids
            if ended or len(got[out.request_id]) >= limits[out.request_id]:
                engine.release(out.request_id)
    assert not engine.has_unfinished()
    return got


def make(tok: Any, i: int, extra: dict[str, Any], n: int = 24) -> EngineRequest:
    params = GenerationParameters.from_dict({"max_new_tokens": n, **extra})
    return EngineRequest(i, tok.encode(PROMPTS[i]), params)


def text(tok: Any, engine: HFEngine, outs: list[StepOutput]) -> str:
    return str(tok.decode([o.token_id for o in outs if o.token_id not in engine.eos_token_ids]))


def test_constrained_and_free_rows_in_one_batch(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok, max_batch_size=8)
    got = run(engine, [make(tok, i, extra) for i, extra in enumerate(CASES)])
    assert all(o.error is None for outs in got.values() for o in outs)
    assert re.fullmatch("[a-c]{2,4}-[0-9]", text(tok, engine, got[1]))
    assert text(tok, engine, got[3]) in ("alpha", "beta gamma", "delta")
    assert text(tok, engine, got[5]) in ("yes", "no")
    value = json.loads(text(tok, engine, got[4]))
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and value["n"] in (1, 22)
    for i in (1, 3, 4, 5):  # a complete grammar ends the row with eos (finish_reason eos_token)
        assert got[i][-1].token_id in engine.eos_token_ids
        assert all(o.log_prob is not None and o.log_prob <= 0 for o in got[i])
    # the free greedy rows are exactly what they are without any constrained neighbour
    alone = run(HFEngine(model, tok, max_batch_size=8), [make(tok, 0, {}), make(tok, 2, {})])
    for i in (0, 2):
        assert [o.token_id for o in got[i]] == [o.token_id for o in alone[i]]
        assert [o.log_prob for o in got[i]] == pytest.approx([o.log_prob for o in alone[i]], abs=1e-5)


def test_log_prob_of_a_constrained_token_is_the_models(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    req = make(tok, 1, {"guided_regex": "[a-c]{2,4}-[0-9]"})
    first = run(engine, [req])[1][0]
    with torch.inference_mode():
        logits = model(torch.tensor([list(req.prompt_ids)])).logits[0, -1].float()
    assert first.log_prob == pytest.approx(float(torch.log_softmax(logits, -1)[first.token_id]), abs=1e-4)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"guided_regex": "[a-"}, "guided_regex is not a valid regular expression: .*Unclosed"),
        ({"guided_grammar": "root ::= foo"}, 'guided_grammar is not a valid EBNF grammar: .*"foo" is not defined'),
        ({"guided_json": {"$ref": "#/defs/x"}}, "guided_json is not a valid JSON schema"),
    ],
)
def test_bad_constraint_is_rejected_when_added(tiny_model: Any, extra: dict[str, Any], message: str) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    with pytest.raises(InvalidParameter, match=message) as info:
        engine.add_request(make(tok, 0, extra))
    assert status_of(info.value) == 400
    assert not engine.has_unfinished()


def test_same_schema_compiles_once(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    run(engine, [make(tok, 4, {"guided_json": BOOL_SCHEMA}, 30), make(tok, 3, {"guided_json": dict(BOOL_SCHEMA)}, 30)])
    backend = engine.grammar_backend()
    assert len(backend._cache) == 1


def test_dynamic_batch_path_is_constrained(tiny_model: Any) -> None:
    model, tok = tiny_model
    engine = HFEngine(model, tok)
    reqs = [make(tok, 1, {"guided_regex": "[a-c]{2,4}-[0-9]"}), make(tok, 3, {"guided_choice": ["alpha", "delta"]}),
            make(tok, 0, {})]
    results = engine.generate_static(reqs)
    assert re.fullmatch("[a-c]{2,4}-[0-9]", text(tok, engine, results[0]))
    assert text(tok, engine, results[1]) in ("alpha", "delta")
    assert results[0][-1].finish_reason == "eos_token"
    free = engine.generate_static([make(tok, 0, {})])[0]
    assert [o.token_id for o in results[2]] == [o.token_id for o in free]
