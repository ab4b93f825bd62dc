"""OpenAI, TGI and dynamic-batch paths through the service on the fake engine."""

from __future__ import annotations

import json
from typing import Any

import pytest

from djl_handlers.engines.fake import REPLY, FakeEngine
from djl_handlers.io import Input
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request


class ChatTokenizer(FakeEngine().tokenizer.__class__):  # type: ignore[misc]
    chat_template = "fake"

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool, add_generation_prompt: bool) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def driver_for(engine: FakeEngine, **options: str) -> RollingBatchDriver:
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    driver = RollingBatchDriver(service.handle)
    driver.init({"rolling_batch": "auto", **options})
    return driver


def chat_engine() -> FakeEngine:
    engine = FakeEngine()
    engine.tokenizer = ChatTokenizer()
    return engine


def test_chat_completion_by_body_shape() -> None:
    driver = driver_for(chat_engine())
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0, "model": "m"}
    req = driver.submit(json_request(body))
    driver.run()
    out = json.loads(req.text)
    assert out["object"] == "chat.completion"
    assert out["model"] == "m"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": REPLY[:5]}
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 5
    assert out["usage"]["prompt_tokens"] == len("<user>hi<assistant>")


def test_chat_stream_ends_with_done() -> None:
    driver = driver_for(chat_engine())
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = driver.submit(json_request(body))
    driver.run()
    events = [e for e in req.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == REPLY[:3]
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    assert req.headers["Content-Type"] == "text/event-stream"


def test_chat_without_template_is_a_clear_400() -> None:
    driver = driver_for(FakeEngine())
    req = driver.submit(json_request({"messages": [{"role": "user", "content": "hi"}]}))
    driver.run()
    assert req.code == 400 and "chat template" in (req.error or "")


def test_openai_rejects_greedy_n_and_unknown_fields() -> None:
    driver = driver_for(chat_engine())
    a = driver.submit(json_request({"messages": [{"role": "user", "content": "x"}], "n": 2, "temperature": 0}))
    b = driver.submit(json_request({"prompt": "x", "tools": []}))
    driver.run()
    assert a.code == 400 and "n must be 1" in (a.error or "")
    assert b.code == 400 and "tools" in (b.error or "")


def test_completion_echo_returns_prompt_and_text() -> None:
    driver = driver_for(FakeEngine())
    req = driver.submit(json_request({"prompt": "Say:", "max_tokens": 4, "temperature": 0, "echo": True}))
    driver.run()
    out = json.loads(req.text)
    assert out["object"] == "text_completion"
    assert out["choices"][0]["text"] == "Say:" + REPLY[:4]


def test_tgi_route_shapes() -> None:
    driver = driver_for(FakeEngine())
    body = {"inputs": "x", "parameters": {"max_new_tokens": 3, "details": True, "stop": ["zz"]}}
    req = driver.submit(json_request(body, **{"X-Djl-Handlers-Api": "tgi"}))
    driver.run()
    out = json.loads(req.text)
    assert isinstance(out, list) and out[0]["generated_text"] == REPLY[:3]
    assert out[0]["details"]["tokens"][0].keys() >= {"id", "text", "logprob", "special"}


def test_tgi_watermark_rejected() -> None:
    driver = driver_for(FakeEngine())
    body = {"inputs": "x", "parameters": {"watermark": True}}
    req = driver.submit(json_request(body, **{"X-Djl-Handlers-Api": "tgi"}))
    driver.run()
    assert req.code == 400 and "watermark" in (req.error or "")


def test_tgi_temperature_zero_is_422_as_tgi() -> None:
    driver = driver_for(FakeEngine())
    body = {"inputs": "x", "parameters": {"do_sample": True, "temperature": 0}}
    req = driver.submit(json_request(body, **{"X-Djl-Handlers-Api": "tgi"}))
    lmi = driver.submit(json_request(body))  # the LMI schema: temperature 0 is greedy
    driver.run()
    assert req.code == 422 and req.error == "`temperature` must be strictly positive"
    assert lmi.code is None and json.loads(lmi.text)["generated_text"] == REPLY[:30]


@pytest.mark.parametrize(
    ("params", "server_seed", "expected"),
    [
        ({}, 99, None),  # greedy: the front end's seed is not used
        ({"seed": 5}, 99, 5),  # greedy keeps the client's value (asks nothing)
        ({"do_sample": True, "seed": 5}, 99, 5),
        ({"do_sample": True}, 99, 99),
        ({"do_sample": True, "temperature": 0}, 99, None),
    ],
)
def test_resolve_seed(params: dict[str, Any], server_seed: int, expected: Any) -> None:
    from djl_handlers.params.generation import GenerationParameters
    from djl_handlers.request.parser import resolve_seed

    assert resolve_seed(GenerationParameters.from_dict(params), server_seed) == expected


def test_request_seed_is_resolved_once() -> None:
    from djl_handlers.dialects.dispatch import parse_request
    from djl_handlers.request.parser import ParserSettings

    def parse(params: dict[str, Any]) -> Any:
        body = json.dumps({"inputs": "a", "parameters": params}).encode()
        return parse_request(Input.from_parts({}, [("data", body), ("seed", b"-3")]), ParserSettings())

    greedy = parse({})
    assert greedy.seed is None and greedy.params.seed is None
    sampled = parse({"do_sample": True})
    assert sampled.seed == sampled.params.seed == (-3) % (1 << 32)
    random_seed = parse_request(
        Input.from_parts({}, [("data", b'{"inputs": "a", "parameters": {"do_sample": true}}')]), ParserSettings()
    )
    assert random_seed.seed is not None and random_seed.seed == random_seed.params.seed


def _dynamic_input(bodies: list[Any]) -> Input:
    props = {"batch_size": str(len(bodies))}
    content = []
    for i, body in enumerate(bodies):
        props[f"batch_{i:03d}.Content-Type"] = "application/json"
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        content.append((f"batch_{i:03d}.data", raw))
    return Input.from_parts(props, content)


def test_dynamic_batch_groups_different_parameters_and_isolates_errors() -> None:
    engine = FakeEngine()
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    service.handle(Input.from_parts({"rolling_batch": "disable"}, ()))
    out = service.handle(_dynamic_input([
        {"inputs": ["a", "b"], "parameters": {"max_new_tokens": 2}},
        {"inputs": "c", "parameters": {"max_new_tokens": 4, "stop_sequences": ["quick"]}},
        b"{broken",
    ]))
    results = [json.loads(bytes(out.content.value_at(i))) for i in range(3)]
    assert results[0] == [{"generated_text": REPLY[:2]}, {"generated_text": REPLY[:2]}]
    assert results[1] == [{"generated_text": REPLY[:4]}]
    assert results[2]["code"] == 400 and "JSON" in results[2]["error"]
    assert out.get_property("Content-Type") == "application/json"


def test_dynamic_streaming_outputs_lines() -> None:
    engine = FakeEngine()
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    service.handle(Input.from_parts({"rolling_batch": "disable", "enable_streaming": "true"}, ()))
    out = service.handle(_dynamic_input([{"inputs": "a", "parameters": {"max_new_tokens": 3}}]))
    chunks = list(out.stream_content)
    assert chunks == [[c] for c in REPLY[:3]]
    assert out.get_property("Content-Type") == "application/jsonlines"


def test_bedrock_compat_3p_and_3p_stream() -> None:
    driver = driver_for(FakeEngine(), bedrock_compat="true")
    body = {"prompt": "Hi ", "max_gen_len": 4, "temperature": 0}
    plain = driver.submit(json_request(body))
    stream = driver.submit(json_request(body, **{"X-Amzn-SageMaker-Forwarded-Api": "InvokeEndpointWithResponseStream"}))
    bad = driver.submit(json_request({"prompt": "x", "max_gen_len": "4"}))
    driver.run()
    out = json.loads(plain.text)
    assert out["body"]["generation"] == "Hi " + REPLY[:4]
    assert out["body"]["generation_token_count"] == 4 and out["body"]["stop_reason"] == "length"
    lines = [json.loads(x) for x in stream.text.splitlines()]
    assert "".join(line["body"]["generation"] for line in lines) == REPLY[:4]
    assert lines[-1]["body"]["stop_reason"] == "length"
    assert bad.code == 400 and "max_gen_len" in (bad.error or "")
