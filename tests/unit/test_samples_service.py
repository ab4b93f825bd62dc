"""Several samples per request (``n``/``best_of``) through the service on the fake engine: LMI,
OpenAI and TGI responses, the refusals, early release of finished samples, async mode."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from djl_handlers.engines.fake import REPLY, FakeEngine
from djl_handlers.io import Input
from djl_handlers.params.samples import sample_seed
from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncModeClient
from djl_handlers.testing.java_loop import DriverRequest, RollingBatchDriver, dynamic_batch, json_request

TGI = {"X-Djl-Handlers-Api": "tgi"}


class ChatTokenizer(FakeEngine().tokenizer.__class__):  # type: ignore[misc]
    chat_template = "fake {{ tools }}"

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool, **options: Any) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def driver_for(engine: FakeEngine, **options: str) -> RollingBatchDriver:
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    driver = RollingBatchDriver(service.handle)
    driver.init({"rolling_batch": "auto", **options})
    return driver


def answer(payload: dict[str, Any], properties: dict[str, str] | None = None) -> DriverRequest:
    engine = FakeEngine()
    engine.tokenizer = ChatTokenizer()
    driver = driver_for(engine)
    req = driver.submit(json_request(payload, **(properties or {})))
    driver.run()
    return req


def sample_text(seed: int, index: int, length: int) -> str:
    """What the fake engine answers for sample ``index`` of a request seeded ``seed`` (its rule:
    a rotation of the reply chosen by the sample's seed)."""
    shift = random.Random(sample_seed(seed, index)).randrange(len(REPLY))
    return (REPLY[shift:] + REPLY[:shift])[:length]


def cumulative(tokens: list[dict[str, Any]], key: str = "log_prob") -> float:
    return sum(t[key] for t in tokens)


def test_lmi_n_returns_the_best_and_the_others_in_best_of_sequences() -> None:
    payload = {"inputs": "hi", "parameters": {"do_sample": True, "seed": 7, "n": 3, "max_new_tokens": 9,
                                              "stop_sequences": ["o"]}}
    req = answer(payload)
    body = json.loads(req.text)
    others = body["details"]["best_of_sequences"]  # details although parameters.details is not set
    assert len(others) == 2
    texts = [body["generated_text"], *(s["generated_text"] for s in others)]
    expected = [sample_text(7, i, 9).split("o")[0] for i in range(3)]
    assert sorted(texts) == sorted(expected)
    best = cumulative(body["details"]["tokens"])
    assert all(best >= cumulative(s["tokens"]) for s in others)
    assert others[0].keys() == {"finish_reason", "generated_tokens", "tokens", "generated_text"}
    assert answer(payload).text == req.text  # a seeded request gives the same set every time


def test_lmi_best_of_keeps_the_best_n() -> None:
    base = {"do_sample": True, "seed": 11, "max_new_tokens": 12, "stop_sequences": ["o"], "details": True}
    every = json.loads(answer({"inputs": "x", "parameters": {**base, "best_of": 4}}).text)
    assert len(every["details"]["best_of_sequences"]) == 3  # best_of without n: all four come back
    one = json.loads(answer({"inputs": "x", "parameters": {**base, "best_of": 4, "n": 1}}).text)
    assert "best_of_sequences" not in one["details"]
    assert one["generated_text"] == every["generated_text"]
    candidates = [every["details"], *every["details"]["best_of_sequences"]]
    assert cumulative(one["details"]["tokens"]) == max(cumulative(c["tokens"]) for c in candidates)


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"inputs": "x", "stream": True, "parameters": {"do_sample": True, "n": 2}}, "jsonlines"),
        ({"inputs": "x", "parameters": {"n": 2}}, "greedily"),
        ({"inputs": "x", "parameters": {"do_sample": True, "temperature": 0, "best_of": 2}}, "greedily"),
        ({"inputs": "x", "parameters": {"do_sample": True, "best_of": 2, "n": 3}}, ">= n"),
    ],
)
def test_refusals_are_400_naming_the_field(payload: dict[str, Any], words: str) -> None:
    req = answer(payload)
    assert req.code == 400 and words in (req.error or "")
    assert "best_of" in (req.error or "") or "n" in (req.error or "")


def test_openai_chat_n_choices_and_usage() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "n": 3, "seed": 3}
    out = json.loads(answer(body).text)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in out["choices"]] == [sample_text(3, i, 6) for i in range(3)]
    assert out["usage"]["completion_tokens"] == 18


def test_openai_chat_stream_sends_each_choice_by_index() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "n": 2, "seed": 4, "stream": True,
            "stream_options": {"include_usage": True}, "stop": ["o"]}
    req = answer(body)
    events = [e for e in req.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    texts: dict[int, str] = {0: "", 1: ""}
    finishes: dict[int, list[str]] = {0: [], 1: []}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["delta"].get("content", "")
            if choice["finish_reason"] is not None:
                finishes[choice["index"]].append(choice["finish_reason"])
    assert [texts[0], texts[1]] == [sample_text(4, i, 5).split("o")[0] for i in range(2)]
    assert all(len(f) == 1 for f in finishes.values())  # each choice ends once
    generated = sum(len(sample_text(4, i, 5).split("o")[0]) + ("o" in sample_text(4, i, 5)) for i in range(2))
    assert chunks[-1]["usage"]["completion_tokens"] == generated


def test_openai_tools_stream_with_n_is_a_400_but_not_streamed_is_fine() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 2, "tools": [tool]}
    streamed = answer({**body, "stream": True})
    assert streamed.code == 400 and "chat_tools_sse" in (streamed.error or "")
    out = json.loads(answer(body).text)
    assert [c["index"] for c in out["choices"]] == [0, 1]


def test_openai_completion_best_of() -> None:
    body = {"prompt": "x", "max_tokens": 8, "best_of": 3, "n": 2, "seed": 5, "stop": ["e"], "logprobs": 1}
    out = json.loads(answer(body).text)
    assert [c["index"] for c in out["choices"]] == [0, 1]
    scores = [sum(c["logprobs"]["token_logprobs"]) for c in out["choices"]]
    assert scores == sorted(scores, reverse=True)
    lengths = [len(s.split("e")[0]) + ("e" in s) for s in (sample_text(5, i, 8) for i in range(3))]
    assert out["usage"]["completion_tokens"] == sum(lengths)  # every decoded sample counts
    stream = answer({**body, "stream": True})
    assert stream.code == 400 and "best_of" in (stream.error or "")
    greedy = answer({"prompt": "x", "n": 2, "temperature": 0})
    assert greedy.code == 400 and "n must be 1 when using greedy sampling" in (greedy.error or "")


def test_tgi_best_of_sequences_with_seeds() -> None:
    body = {"inputs": "x", "parameters": {"best_of": 2, "do_sample": True, "seed": 9, "details": True,
                                          "max_new_tokens": 4}}
    out = json.loads(answer(body, TGI).text)[0]
    seqs = out["details"]["best_of_sequences"]
    assert len(seqs) == 1 and list(seqs[0])[:2] == ["generated_text", "finish_reason"]
    assert {out["details"]["seed"], seqs[0]["seed"]} == {9, sample_seed(9, 1)}
    streamed = answer({**body, "stream": True}, TGI)
    assert streamed.code == 422 and streamed.error == "`best_of` != 1 is not supported when streaming tokens"
    greedy = answer({"inputs": "x", "parameters": {"best_of": 2}}, TGI)
    assert greedy.code == 422 and greedy.error == "you must use sampling when `best_of` is > 1"


def test_a_finished_sample_leaves_the_engine_before_the_others() -> None:
    engine = FakeEngine()
    driver = driver_for(engine)
    # seed 0: sample 1's rotation reaches the stop string "q" earlier than sample 0's
    stops = [sample_text(0, i, 40).find("q") for i in range(2)]
    assert min(stops) >= 0 and stops[0] != stops[1]
    req = driver.submit(json_request({"inputs": "x", "parameters": {"do_sample": True, "seed": 0, "n": 2,
                                                                     "max_new_tokens": 40, "stop": ["q"]}}))
    first = min(stops) + 1
    for _ in range(first):
        driver.step()
    assert len(engine.released) == 1 and not req.done
    driver.run()
    assert req.done and len(engine.released) == 2


def test_cancel_releases_every_sample() -> None:
    engine = FakeEngine()
    driver = driver_for(engine)
    req = driver.submit(json_request({"inputs": "x", "parameters": {"do_sample": True, "n": 3, "max_new_tokens": 40}}))
    driver.step()
    req.cancel = True
    driver.run()
    assert sorted(engine.released) == sorted(set(engine.released)) and len(engine.released) == 3
    assert not engine.has_unfinished()


def test_dynamic_batch_refuses_samples() -> None:
    engine = FakeEngine()
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    assert service.handle(Input.from_parts({"rolling_batch": "disable"}, [])) is None
    bodies = dynamic_batch(service.handle, [{"inputs": "x", "parameters": {"do_sample": True, "n": 2}}])
    assert bodies[0]["code"] == 400 and bodies[0]["field"] == "n"


def test_async_mode_answers_as_the_rolling_batch() -> None:
    payload = {"inputs": "hi", "parameters": {"do_sample": True, "seed": 21, "n": 2, "max_new_tokens": 6}}

    async def main() -> Any:
        engine = FakeEngine()
        service = InferenceService("huggingface", engine_factory=lambda config: engine)
        client = AsyncModeClient(service.handle)
        assert await client.init({"rolling_batch": "disable"}) is None
        try:
            return await client.request(payload)
        finally:
            assert service.async_mode is not None
            service.async_mode.close()

    got = asyncio.run(main())
    assert got.code == 200 and got.text == answer(payload).text
