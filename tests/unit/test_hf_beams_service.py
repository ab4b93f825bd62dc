"""Beam search on the HF engine end to end through the service (tiny random model, rolling batch): the
text is transformers' ``generate(num_beams=...)``'s in every output format, streamed ones included
(settled tokens, the best beam on the last line); bad values are 400s naming the field while the
neighbours of the same batch finish."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model, tiny_dir

PROMPT = "The capital of France is a city that"
N = 12


def driver_for(tiny_dir: Any, **options: str) -> Any:
    from djl_handlers.service import InferenceService
    from djl_handlers.testing.java_loop import RollingBatchDriver

    service = InferenceService("huggingface")
    driver = RollingBatchDriver(service.handle)
    assert driver.init({"model_id": str(tiny_dir), "rolling_batch": "auto", "dtype": "fp32", **options}) is None
    return lambda: RollingBatchDriver(service.handle)


@pytest.fixture(scope="module")
def lmi(tiny_dir: Any) -> Any:
    return driver_for(tiny_dir)


def beam_texts(tiny_model: Any, prompt: str, count: int = 1, **beam: Any) -> list[str]:
    """transformers' beam search of ``prompt`` alone: the ``count`` best texts (special tokens skipped)."""
    model, tok = tiny_model
    ids = tok.encode(prompt)
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=N, do_sample=False, num_return_sequences=count,
                             pad_token_id=0, **beam)
    return [tok.decode(row[len(ids):], skip_special_tokens=True) for row in out.tolist()]


def test_lmi_beams_beside_neighbours_and_bad_values(lmi: Any, tiny_model: Any) -> None:
    from djl_handlers.testing.java_loop import json_request

    driver = lmi()
    beams = driver.submit(json_request({"inputs": PROMPT, "parameters": {
        "num_beams": 3, "length_penalty": 0.5, "early_stopping": True, "max_new_tokens": N, "details": True}}))
    plain = driver.submit(json_request({"inputs": "Hello", "parameters": {"max_new_tokens": 6}}))
    zero = driver.submit(json_request({"inputs": PROMPT, "parameters": {"num_beams": 0}}))
    sampled = driver.submit(json_request({"inputs": PROMPT, "parameters": {"num_beams": 2, "do_sample": True}}))
    never = driver.submit(json_request({"inputs": PROMPT, "parameters": {"num_beams": 2, "early_stopping": "no"}}))
    driver.run()
    for bad, field in ((zero, "num_beams"), (sampled, "do_sample"), (never, "early_stopping")):
        assert bad.code == 400 and field in (bad.error or ""), bad.error
    body = json.loads(beams.text)
    assert body["generated_text"] == beam_texts(tiny_model, PROMPT, num_beams=3, length_penalty=0.5,
                                                early_stopping=True)[0]
    assert body["details"]["generated_tokens"] == len(body["details"]["tokens"])
    assert json.loads(plain.text)["generated_text"]


def test_lmi_n_best_beams_in_best_of_sequences(lmi: Any, tiny_model: Any) -> None:
    from djl_handlers.testing.java_loop import json_request

    driver = lmi()
    req = driver.submit(json_request({"inputs": PROMPT, "parameters": {
        "num_beams": 4, "n": 2, "max_new_tokens": N, "details": True}}))
    driver.run()
    body = json.loads(req.text)
    want = beam_texts(tiny_model, PROMPT, 2, num_beams=4)
    others = [s["generated_text"] for s in body["details"]["best_of_sequences"]]
    assert [body["generated_text"], *others] == want


def test_lmi_stream_sends_settled_tokens_and_ends_with_the_best(lmi: Any, tiny_model: Any) -> None:
    from djl_handlers.testing.java_loop import json_request

    driver = lmi()
    req = driver.submit(json_request({"inputs": PROMPT, "stream": True, "parameters": {
        "num_beams": 4, "max_new_tokens": N}}))
    driver.run()
    lines = [json.loads(line) for line in req.text.splitlines() if line]
    want = beam_texts(tiny_model, PROMPT, num_beams=4)[0]
    assert "".join(line["token"]["text"] for line in lines) == want
    assert lines[-1]["generated_text"] == want


def test_tgi_stream_ends_with_the_best_beam(lmi: Any, tiny_model: Any) -> None:
    from djl_handlers.testing.java_loop import json_request

    driver = lmi()
    req = driver.submit(json_request({"inputs": PROMPT, "stream": True, "parameters": {
        "num_beams": 2, "max_new_tokens": N}}, **{"X-Djl-Handlers-Api": "tgi"}))
    driver.run()
    events = [json.loads(e[len("data:"):]) for e in req.text.split("\n\n") if e.startswith("data:")]
    want = beam_texts(tiny_model, PROMPT, num_beams=2)[0]
    assert "".join(e["token"]["text"] for e in events) == want
    assert events[-1]["generated_text"] == want


def test_sse_output_formatter_streams_the_best_beam(tiny_dir: Any, tiny_model: Any) -> None:
    from djl_handlers.testing.java_loop import json_request

    driver = driver_for(tiny_dir, output_formatter="sse")()
    req = driver.submit(json_request({"inputs": PROMPT, "parameters": {"num_beams": 3, "max_new_tokens": N}}))
    driver.run()
    events = [json.loads(e[len("data:"):]) for e in req.text.split("\n\n") if e.startswith("data:")]
    want = beam_texts(tiny_model, PROMPT, num_beams=3)[0]
    assert "".join(e["token"]["text"] for e in events) == want
    assert events[-1]["generated_text"] == want


def test_openai_use_beam_search_n_choices_streamed_and_not(lmi: Any, tiny_model: Any) -> None:
    from djl_handlers.testing.java_loop import json_request

    body = {"prompt": PROMPT, "max_tokens": N, "use_beam_search": True, "n": 3}
    want = beam_texts(tiny_model, PROMPT, 3, num_beams=3)
    driver = lmi()
    whole = driver.submit(json_request(body))
    streamed = driver.submit(json_request({**body, "stream": True}))
    driver.run()
    out = json.loads(whole.text)
    assert [c["text"] for c in sorted(out["choices"], key=lambda c: c["index"])] == want
    texts = ["", "", ""]
    for event in streamed.text.split("\n\n"):
        if event.startswith("data: {"):
            for choice in json.loads(event[len("data: "):])["choices"]:
                texts[choice["index"]] += choice["text"]
    assert texts == want
    assert streamed.text.rstrip().endswith("data: [DONE]")
