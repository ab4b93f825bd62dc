"""vLLM's sampling set and log-probabilities on the HF engine, end to end through the service on the
tiny random model: each request of one rolling batch gets what it asked for, a bad value is a 400
naming its field while its neighbours finish, and a request that asks for nothing is unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model, tiny_dir

PROMPT = "The capital of France is a city that"
OTHER = "One two three four five"


@pytest.fixture(scope="module")
def driver_factory(tiny_dir: Any) -> Any:
    from djl_handlers.service import InferenceService
    from djl_handlers.testing.java_loop import RollingBatchDriver

    service = InferenceService("huggingface")
    options = {"model_id": str(tiny_dir), "rolling_batch": "auto", "dtype": "fp32"}
    driver = RollingBatchDriver(service.handle)
    assert driver.init(options) is None
    return lambda: RollingBatchDriver(service.handle)


class ReferencePenalties:
    """Per-row, token by token: OpenAI's frequency/presence penalties over generated tokens."""

    def __init__(self, width: int, frequency: float, presence: float) -> None:
        self.width, self.frequency, self.presence = width, frequency, presence

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        out = scores.clone()
        for row in range(out.shape[0]):
            generated = input_ids[row, self.width :].tolist()
            for token in set(generated):
                out[row, token] -= self.frequency * generated.count(token) + self.presence
        return out


def greedy(model: Any, ids: list[int], n: int, processor: Any = None) -> list[int]:
    from transformers import LogitsProcessorList

    extra = {"logits_processor": LogitsProcessorList([processor])} if processor is not None else {}
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, **extra)
    return out[0, len(ids) :].tolist()


def ids_of(body: dict[str, Any]) -> list[int]:
    return [t["id"][0] if isinstance(t["id"], list) else t["id"] for t in body["details"]["tokens"]]


def test_a_mixed_batch_gets_each_request_what_it_asked_and_bad_values_are_400s(
    driver_factory: Any, tiny_model: Any
) -> None:
    from djl_handlers.testing.java_loop import json_request

    model, tok = tiny_model
    n = 8
    base = {"max_new_tokens": n, "min_new_tokens": n, "details": True}
    driver = driver_factory()
    submit = driver.submit
    plain = submit(json_request({"inputs": PROMPT, "parameters": base}))
    penalised = submit(json_request({"inputs": PROMPT, "parameters": {
        **base, "frequency_penalty": 1.5, "presence_penalty": 0.5}}))
    bad_min_p = submit(json_request({"inputs": PROMPT, "parameters": {**base, "min_p": 2}}))
    top = submit(json_request({"inputs": OTHER, "parameters": {**base, "logprobs": 3, "prompt_logprobs": 1}}))
    bad_logprobs = submit(json_request({"inputs": PROMPT, "parameters": {**base, "logprobs": 50}}))
    sampled = submit(json_request({"inputs": OTHER, "parameters": {
        **base, "do_sample": True, "seed": 7, "min_p": 0.3, "temperature": 1.5}}))
    driver.run()

    for bad, field in ((bad_min_p, "min_p"), (bad_logprobs, "logprobs")):
        assert bad.code == 400 and field in (bad.error or ""), bad.error
    ids = tok.encode(PROMPT)
    assert ids_of(json.loads(plain.text)) == greedy(model, ids, n)  # asks for nothing: unchanged
    want = greedy(model, ids, n, ReferencePenalties(len(ids), 1.5, 0.5))
    assert ids_of(json.loads(penalised.text)) == want
    details = json.loads(top.text)["details"]
    assert [len(t) for t in details["top_tokens"]] == [3] * n
    assert [t[0]["id"] for t in details["top_tokens"]] == [t["id"] for t in details["tokens"]]  # greedy
    assert len(details["prefill"]) == len(tok.encode(OTHER)) and details["prefill"][0]["log_prob"] is None
    assert all(t["log_prob"] <= 0 for t in details["prefill"][1:])
    assert json.loads(sampled.text)["details"]["generated_tokens"] == n


def test_a_bad_word_is_never_generated(driver_factory: Any, tiny_model: Any) -> None:
    from djl_handlers.testing.java_loop import json_request

    model, tok = tiny_model
    ids = tok.encode(PROMPT)
    first = greedy(model, ids, 6)
    # a generated token that is a bad word on its own (vLLM's tokenization of its text gives it back)
    pick = next(i for i, t in enumerate(first) if (t,) in _bad_ids(tok.decode([t]), tok))
    word = tok.decode([first[pick]])
    driver = driver_factory()
    req = driver.submit(json_request({"inputs": PROMPT, "parameters": {
        "max_new_tokens": 6, "min_length": 6, "details": True, "bad_sequences": [word]}}))
    driver.run()
    got = ids_of(json.loads(req.text))
    assert len(got) == 6 and first[pick] not in got
    assert got[:pick] == first[:pick] and got[pick] != first[pick]


def _bad_ids(word: str, tok: Any) -> tuple[tuple[int, ...], ...]:
    from djl_handlers.engines.hf.penalties import bad_word_ids

    return bad_word_ids([word], tok)
