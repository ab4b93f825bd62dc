"""``/v1/completions`` as evaluation clients use it, on the HF handler with the tiny model (fp32):
``logprobs: N`` (N entries per position, checked against a direct forward of the model), ``echo``
with the prompt's log-probs (``max_tokens`` 0 and 1), prompts as token ids and as lists (one choice
per prompt, in order; ``n`` > 1 numbered prompt × n + sample; streamed by index), chat
``top_logprobs``, and bad values refused with a 400 naming the field while their neighbours in
the same batch succeed — in the rolling batch and in DJL's async mode."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest_models import embedded_dir, tiny_dir, tiny_model  # noqa: F401

from djl_handlers.io import Input
from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncModeClient
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

PROMPTS = ["The capital of France is", "One, two, three,"]


@pytest.fixture(scope="module")
def service(tiny_dir: Path) -> InferenceService:  # noqa: F811
    service = InferenceService("huggingface")
    init = {"model_id": str(tiny_dir), "dtype": "fp32", "rolling_batch": "auto", "max_rolling_batch_size": "8"}
    assert service.handle(Input.from_parts(init, ())) is None
    return service


def run(service: InferenceService, bodies: list[dict[str, Any]]) -> list[Any]:
    """Every body in one rolling batch; each answer as (status or None, parsed body or SSE events)."""
    driver = RollingBatchDriver(service.handle)
    requests = [driver.submit(json_request(body)) for body in bodies]
    driver.run()
    answers: list[tuple[Any, Any]] = []
    for r in requests:
        if r.code is not None:
            answers.append((r.code, r.error))
        elif r.text.startswith("data: "):
            answers.append((None, [json.loads(e[6:]) for e in r.text.strip().split("\n\n") if e != "data: [DONE]"]))
        else:
            answers.append((None, json.loads(r.text)))
    return answers


def ok(service: InferenceService, body: dict[str, Any]) -> Any:
    [(code, answer)] = run(service, [body])
    assert code is None, answer
    return answer


def direct(model: Any, ids: list[int]) -> torch.Tensor:
    """log_softmax of the model's logits at every position of ``ids`` (fp32)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def completion(prompt: Any, **fields: Any) -> dict[str, Any]:
    return {"prompt": prompt, "temperature": 0, "max_tokens": 4, **fields}


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_lists_the_prompts_log_probs_and_top_n(service: InferenceService, tiny_model: Any,  # noqa: F811
                                                    max_tokens: int) -> None:
    model, tokenizer = tiny_model
    ids = tokenizer.encode(PROMPTS[0])
    body = ok(service, completion(ids, echo=True, logprobs=3, max_tokens=max_tokens))
    [choice] = body["choices"]
    lp = choice["logprobs"]
    shown = len(ids) + max_tokens
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == shown
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert choice["text"].startswith(tokenizer.decode(ids))
    if max_tokens == 0:
        assert choice["text"] == tokenizer.decode(ids)
    assert lp["text_offset"][0] == 0
    assert all(b - a == len(t) for a, b, t in zip(lp["text_offset"], lp["text_offset"][1:], lp["tokens"], strict=False))
    expected = direct(model, ids)
    for j in range(1, len(ids)):
        assert lp["token_logprobs"][j] == pytest.approx(float(expected[j - 1, ids[j]]), abs=1e-4)
        best = torch.topk(expected[j - 1], 3).values.tolist()
        top = lp["top_logprobs"][j]
        assert len(top) in (3, 4)  # the top 3, and the prompt's own token when it is not among them
        assert sorted(top.values(), reverse=True)[:3] == pytest.approx(best, abs=1e-4)
        assert max(top.values()) == pytest.approx(best[0], abs=1e-4)
    assert body["usage"]["prompt_tokens"] == len(ids)


def test_logprobs_n_gives_n_entries_per_generated_token(service: InferenceService) -> None:
    for n in (0, 1, 2, 5):
        [choice] = ok(service, completion(PROMPTS[0], logprobs=n))["choices"]
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == 4 and "".join(lp["tokens"]) == choice["text"]
        for chosen, top in zip(lp["token_logprobs"], lp["top_logprobs"], strict=True):
            assert len(top) == max(n, 1)  # greedy: the chosen token is the most likely one
            assert max(top.values()) == pytest.approx(chosen)


def test_prompt_lists_are_one_choice_per_prompt(service: InferenceService, tiny_model: Any) -> None:  # noqa: F811
    _, tokenizer = tiny_model
    alone = [ok(service, completion(p))["choices"][0]["text"] for p in PROMPTS]
    usage_alone = [ok(service, completion(p))["usage"] for p in PROMPTS]
    for prompt in (PROMPTS, [tokenizer.encode(p) for p in PROMPTS]):
        body = ok(service, completion(prompt))
        assert [c["index"] for c in body["choices"]] == [0, 1]
        assert [c["text"] for c in body["choices"]] == alone
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert body["usage"][key] == sum(u[key] for u in usage_alone)
    events = ok(service, completion(PROMPTS, stream=True))
    streamed = {0: "", 1: ""}
    for event in events:
        for choice in event["choices"]:
            streamed[choice["index"]] += choice["text"]
    assert [streamed[0], streamed[1]] == alone


def test_n_samples_of_several_prompts_are_numbered_prompt_times_n(service: InferenceService) -> None:
    body = ok(service, completion(PROMPTS, n=2, temperature=1.0, seed=3))
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    for p, prompt in enumerate(PROMPTS):
        alone = ok(service, completion(prompt, n=2, temperature=1.0, seed=3))["choices"]
        assert [c["text"] for c in body["choices"][2 * p: 2 * p + 2]] == [c["text"] for c in alone]
    streamed = ["", "", "", ""]
    for event in ok(service, completion(PROMPTS, n=2, temperature=1.0, seed=3, stream=True)):
        for choice in event["choices"]:
            streamed[choice["index"]] += choice["text"]
    assert streamed == [c["text"] for c in body["choices"]]


def test_streamed_echo_of_several_prompts_equals_the_whole_answer(service: InferenceService) -> None:
    body = completion(PROMPTS, echo=True, logprobs=2, max_tokens=3)
    whole = ok(service, body)["choices"]
    joined: dict[int, dict[str, list[Any]]] = {0: {}, 1: {}}
    for event in ok(service, {**body, "stream": True}):
        for choice in event["choices"]:
            for key, values in choice["logprobs"].items():
                joined[choice["index"]].setdefault(key, []).extend(values)
    assert [joined[0], joined[1]] == [c["logprobs"] for c in whole]


def test_chat_top_logprobs(service: InferenceService) -> None:
    request = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 3,
               "logprobs": True, "top_logprobs": 4}
    body = ok(service, request)
    streamed = [entry for event in ok(service, {**request, "stream": True}) for choice in event["choices"]
                if choice["logprobs"] for entry in choice["logprobs"]["content"]]
    assert streamed == body["choices"][0]["logprobs"]["content"]
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    for entry in content:
        assert len(entry["top_logprobs"]) == 4
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"])
        values = [t["logprob"] for t in entry["top_logprobs"]]
        assert values == sorted(values, reverse=True)


@pytest.mark.parametrize(("bad", "field"), [
    ({"logprobs": 21}, "logprobs"),
    ({"echo": "yes"}, "echo"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [[1, 2], "a"]}, "prompt"),
    ({"prompt": [[1, -2]]}, "prompt"),
    ({"prompt": [10 ** 9]}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"),
])
def test_bad_values_are_400_naming_the_field_beside_good_requests(service: InferenceService, bad: dict[str, Any],
                                                                  field: str) -> None:
    good = completion(PROMPTS, echo=True, logprobs=1, max_tokens=1)
    answers = run(service, [good, {**completion(PROMPTS[0]), **bad}, good])
    assert answers[1][0] == 400 and field in answers[1][1], answers[1]
    for code, body in (answers[0], answers[2]):
        assert code is None and len(body["choices"]) == 2


def test_async_mode_answers_a_prompt_list_as_the_rolling_batch(tiny_dir: Path, service: InferenceService) -> None:  # noqa: F811
    body = completion(PROMPTS, echo=True, logprobs=2, max_tokens=2)

    async def main() -> Any:
        client = AsyncModeClient(InferenceService("huggingface").handle)
        await client.init({"model_id": str(tiny_dir), "dtype": "fp32", "async_mode": "true"})
        return (await client.request(body)).json()

    answer = asyncio.run(main())
    expected = ok(service, body)
    assert [c["text"] for c in answer["choices"]] == [c["text"] for c in expected["choices"]]
    tokens = [c["logprobs"]["tokens"] for c in answer["choices"]]
    assert tokens == [c["logprobs"]["tokens"] for c in expected["choices"]]


def test_dynamic_batching_refuses_what_only_the_rolling_batch_answers(tiny_dir: Path,  # noqa: F811
                                                                      tiny_model: Any) -> None:  # noqa: F811
    from djl_handlers.testing.java_loop import dynamic_batch

    _, tokenizer = tiny_model
    service = InferenceService("huggingface")
    init = {"model_id": str(tiny_dir), "dtype": "fp32", "rolling_batch": "disable", "batch_size": "4"}
    assert service.handle(Input.from_parts(init, ())) is None
    answers = dynamic_batch(service.handle, [completion(PROMPTS), completion(PROMPTS[0], echo=True, logprobs=1),
                                             completion(tokenizer.encode(PROMPTS[0]), echo=True)])
    assert "prompt" in json.dumps(answers[0]) and "rolling batch" in json.dumps(answers[0])
    assert "echo" in json.dumps(answers[1]) and "rolling batch" in json.dumps(answers[1])
    assert answers[2]["choices"][0]["text"].startswith(PROMPTS[0])  # one token-id prompt, echoed as text
