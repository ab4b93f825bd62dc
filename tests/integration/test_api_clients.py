"""OpenAI and TGI compatibility, proven with the real client libraries against ``djl-handlers serve``
serving the embedded SmolLM2 (greedy, fp32), plus plain SSE parsing with httpx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_server_harness import ROOT, ServerProcess

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("api-clients") / "server.log"
    proc = ServerProcess(ROOT / "serving.properties.examples" / "hf-rolling-batch", Path(log))
    yield proc
    proc.stop()


def test_openai_chat_completion(server: ServerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    res = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=12, temperature=0)
    choice = res.choices[0]
    assert "Paris" in (choice.message.content or "")
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert res.usage is not None and res.usage.completion_tokens <= 12
    assert res.usage.total_tokens == res.usage.prompt_tokens + res.usage.completion_tokens
    assert res.model == "smollm2"


def test_openai_chat_stream_matches_non_stream(server: ServerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    full = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens  # type: ignore[union-attr]


def test_openai_completions_and_logprobs(server: ServerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    res = client.completions.create(model="m", prompt="The capital of France is", max_tokens=5, temperature=0,
                                    logprobs=1)
    choice = res.choices[0]
    assert choice.text
    assert choice.logprobs is not None and all(lp <= 0 for lp in choice.logprobs.token_logprobs or [])


def test_openai_error_is_a_clean_400(server: ServerProcess) -> None:
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(BadRequestError) as info:
        client.chat.completions.create(model="m", messages=QUESTION, n=2, temperature=0)  # greedy: one answer
    assert "n must be 1 when using greedy sampling" in str(info.value)


@pytest.fixture
def hub_online_for_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub refuses every URL in offline mode, even 127.0.0.1; our server is local."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.mark.usefixtures("hub_online_for_loopback")
def test_tgi_client_text_generation(server: ServerProcess) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=server.url)
    out = client.text_generation("The capital of France is", max_new_tokens=6, details=True)
    assert out.details is not None
    assert out.details.generated_tokens == len(out.details.tokens) <= 6
    assert out.details.finish_reason in ("length", "eos_token", "stop_sequence")
    assert "".join(t.text for t in out.details.tokens) == out.generated_text
    with httpx.Client(base_url=server.url, timeout=60) as http:
        body = {"inputs": "The capital of France is", "parameters": {"max_new_tokens": 6}}
        lmi = http.post("/invocations", json=body)
    assert lmi.json()["generated_text"] == out.generated_text


@pytest.mark.usefixtures("hub_online_for_loopback")
def test_tgi_client_stream_with_details(server: ServerProcess) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=server.url)
    plain = client.text_generation("Deep learning is", max_new_tokens=6)
    events = list(client.text_generation("Deep learning is", max_new_tokens=6, details=True, stream=True))
    assert "".join(e.token.text for e in events) == plain
    assert events[-1].generated_text == plain
    assert events[-1].details is not None and events[-1].details.generated_tokens == len(events)


@pytest.mark.usefixtures("hub_online_for_loopback")
def test_tgi_client_prefill_and_top_tokens(server: ServerProcess) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=server.url)
    prompt = "The capital of France is"
    out = client.text_generation(prompt, max_new_tokens=4, details=True, decoder_input_details=True, top_n_tokens=2)
    details = out.details
    assert details is not None and details.top_tokens is not None
    assert "".join(t.text for t in details.prefill) == prompt
    assert details.prefill[0].logprob is None
    assert all(t.logprob is not None and t.logprob <= 0 for t in details.prefill[1:])
    assert len(details.top_tokens) == details.generated_tokens == len(details.tokens)
    for token, top in zip(details.tokens, details.top_tokens, strict=True):
        # huggingface_hub leaves the inner lists of top_tokens as plain dicts
        first, second = (t if isinstance(t, dict) else vars(t) for t in top)
        assert first["id"] == token.id and first["logprob"] == token.logprob  # greedy: the chosen token
        assert second["logprob"] <= first["logprob"]
    events = list(client.text_generation(prompt, max_new_tokens=4, top_n_tokens=2, details=True, stream=True))
    assert [e.token.id for e in events] == [t.id for t in details.tokens]
    assert all(e.top_tokens is not None and len(e.top_tokens) == 2 for e in events)


def test_generate_stream_plain_sse(server: ServerProcess) -> None:
    body = {"inputs": "Deep learning is", "parameters": {"max_new_tokens": 4}}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/generate_stream", json=body) as res:
            assert res.headers["content-type"].startswith("text/event-stream")
            raw = "".join(res.iter_text())
    events = [json.loads(block.split(":", 1)[1]) for block in raw.split("\n\n") if block.strip()]
    assert len(events) == 4
    assert events[-1]["generated_text"] == "".join(e["token"]["text"] for e in events)
    assert all(e["token"]["logprob"] <= 0 for e in events)
