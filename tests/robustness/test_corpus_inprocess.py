"""Every corpus case through ``InferenceService`` in-process, between two good neighbours.

Rolling batch (DJL's Java loop emulated by ``RollingBatchDriver``) and dynamic batch. A bad case
must get its own 4xx with a JSON-able message naming the problem; a good one its exact text; the
neighbours always their exact text; nothing may escape the handler or stay in the engine.
Cases with a ``known_bug`` are strict xfails (they pass once the bug is fixed, then fail as XPASS).
"""

from __future__ import annotations

import json

import pytest

from djl_handlers.io import Input
from tests.robustness.corpus import CORPUS, DYNAMIC, ROLLING, Case
from tests.robustness.harness import make_service, run_dynamic, run_rolling

CHUNK = 300  # cases per batch: 900 requests, below Input.get_batches' limit of 1000


def _params(mode: str) -> list[object]:
    params: list[object] = []
    for case in CORPUS:
        if mode not in case.modes:
            continue
        bug = case.bug_in(mode)
        marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


def test_corpus_is_big_and_mixed() -> None:
    assert len(CORPUS) >= 200
    assert sum(c.origin == "generated" for c in CORPUS) >= 100
    assert sum(c.origin == "hand" for c in CORPUS) >= 100
    assert sum(c.ok for c in CORPUS) >= 20


@pytest.mark.parametrize("case", _params(ROLLING))
def test_rolling_case(case: Case) -> None:
    [outcome] = run_rolling([case], case.engine)
    assert outcome.problems == []


@pytest.mark.parametrize("case", _params(DYNAMIC))
def test_dynamic_case(case: Case) -> None:
    assert run_dynamic(case) == []


@pytest.mark.parametrize("engine", ["huggingface", "vllm"])
def test_whole_corpus_in_one_rolling_batch(engine: str) -> None:
    """Many cases at once (up to 900 requests in flight per batch): nobody disturbs anybody."""
    cases = [c for c in CORPUS if ROLLING in c.modes and c.engine == engine and not c.bug_in(ROLLING)]
    failures: dict[str, list[str]] = {}
    for start in range(0, len(cases), CHUNK):
        chunk = cases[start:start + CHUNK]
        outcomes = run_rolling(chunk, engine)
        failures.update({c.name: o.problems for c, o in zip(chunk, outcomes, strict=True) if o.problems})
    assert failures == {}


@pytest.mark.parametrize("case", [c for c in CORPUS if c.name.startswith("header-") and c.ok and DYNAMIC in c.modes],
                         ids=lambda c: c.name)
def test_dynamic_batch_of_one_as_djl_frames_it(case: Case) -> None:
    """DJL sends a dynamic batch of one request unprefixed (no ``batch_NNN.`` keys), the client's
    headers beside the front end's properties: a ``batch_size`` header must not split the frame."""
    service, _ = make_service(case.engine, {"rolling_batch": "disable"})
    frame = Input.from_parts({**case.properties(), "handler": "handle"}, [("data", case.body)])
    out = service.handle(frame)
    assert out.code == 200, (out.code, out.message)
    assert json.loads(bytes(out.content.value_at(0))) == [{"generated_text": case.expect_text}]
