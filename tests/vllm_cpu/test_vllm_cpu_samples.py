"""REAL vLLM on the CPU: several samples of one prompt (``n``, ``best_of``) through ``djl-handlers
serve``, in sync mode (``LLMEngine``, rolling batch) and async mode (``AsyncLLM``).

vLLM decodes the samples itself (``SamplingParams.n``; its V1 engine has no ``best_of``, so
``best_of`` samples are decoded as its ``n`` and the scheduler keeps the best); the adapter reports
each ``CompletionOutput.index`` under the sample's own id, and the formatters the HF engine uses
write them: LMI's ``details.best_of_sequences``, TGI's ``best_of_sequences``, OpenAI's ``choices``
(chat and completions, streamed by ``index`` too) with ``usage`` counting every sample. A seeded
request gives the same samples every time; greedy ``n`` > 1 is refused as on the HF engine. One
vLLM engine at a time (the server of one mode is stopped before the other starts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture
from integration.test_server_harness import ServerProcess

pytestmark = pytest.mark.slow

OPTIONS = {
    "dtype": "fp32",
    "max_model_len": "512",
    "max_rolling_batch_size": "8",
    "enforce_eager": "true",
    "gpu_memory_utilization": "0.3",  # vLLM's CPU build wants this share of the RAM free
}
MODES = {"rolling": {"rolling_batch": "vllm"}, "async": {"rolling_batch": "disable", "async_mode": "true"}}
SAMPLED = {"do_sample": True, "temperature": 1.2, "seed": 7}
PROMPT = "Deep learning is"
CHAT = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module", params=list(MODES))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           embedded_dir: Path) -> Iterator[ServerProcess]:  # noqa: F811
    folder = tmp_path_factory.mktemp(f"vllm-samples-{request.param}")
    options = {**OPTIONS, **MODES[request.param]}
    lines = ["engine=Python", "option.entryPoint=djl_handlers.vllm", f"option.model_id={embedded_dir}",
             "option.model_loading_timeout=900", *(f"option.{k}={v}" for k, v in options.items())]
    (folder / "serving.properties").write_text("\n".join(lines) + "\n")
    proc = ServerProcess(folder, folder / "server.log", start_timeout=900)
    try:
        yield proc
    finally:
        proc.stop()


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=300) as client:
        return client.post(path, json=body)


def _ok(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    response = _post(server, path, body)
    assert response.status_code == 200, response.text
    return response


def _lmi(n: int | None = None, best_of: int | None = None, **extra: Any) -> dict[str, Any]:
    counts = {k: v for k, v in (("n", n), ("best_of", best_of)) if v is not None}
    return {"inputs": PROMPT, "parameters": {"max_new_tokens": 10, "details": True, **SAMPLED, **counts, **extra}}


def _sequences(body: dict[str, Any]) -> list[tuple[str, list[int], float]]:
    """(text, token ids, cumulative log-prob) of every sequence of an LMI answer, in its order."""
    seqs = [body, *body["details"].get("best_of_sequences", [])]
    out = []
    for seq in seqs:
        tokens = seq["tokens"] if "tokens" in seq else seq["details"]["tokens"]
        out.append((seq["generated_text"], [t["id"][0] for t in tokens], sum(t["log_prob"] for t in tokens)))
    return out


def _sse(response: httpx.Response) -> list[dict[str, Any]]:
    events = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    assert events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


def test_lmi_n_returns_every_sample_seeded_and_reproducible(server: ServerProcess) -> None:
    with ThreadPoolExecutor(3) as pool:  # concurrently, beside a one-sample request
        first, again, single = pool.map(lambda b: _ok(server, "/invocations", b).json(),
                                        [_lmi(n=3), _lmi(n=3), _lmi()])
    seqs = _sequences(first)
    assert len(seqs) == 3 and len(first["details"]["best_of_sequences"]) == 2
    assert all(len(ids) == 10 for _, ids, _ in seqs)  # no eos in 10 tokens at this temperature and seed
    assert len({tuple(ids) for _, ids, _ in seqs}) > 1  # samples, not copies
    assert _sequences(again) == seqs  # the seed fixes every sample
    assert _sequences(single)[0][:2] in [s[:2] for s in seqs]  # sample 0 draws with the seed itself
    assert seqs[0][2] >= max(lp for _, _, lp in seqs[1:])  # the best first
    assert first["details"]["generated_tokens"] == 10


def test_lmi_best_of_keeps_the_most_likely_of_the_samples(server: ServerProcess) -> None:
    every = _sequences(_ok(server, "/invocations", _lmi(n=3)).json())
    best = _ok(server, "/invocations", _lmi(n=1, best_of=3)).json()
    assert "best_of_sequences" not in best["details"]
    assert _sequences(best)[0][:2] == max(every, key=lambda s: s[2])[:2]
    all_three = _sequences(_ok(server, "/invocations", _lmi(best_of=3)).json())  # LMI best_of without n: all
    assert sorted(s[:2] for s in all_three) == sorted(s[:2] for s in every)


def test_greedy_samples_are_refused_as_on_the_hf_engine(server: ServerProcess) -> None:
    lmi = _post(server, "/invocations", {"inputs": PROMPT, "parameters": {"n": 2, "max_new_tokens": 4}})
    assert lmi.status_code == 400 and "parameters.n must be 1 when decoding greedily" in lmi.text
    chat = _post(server, "/v1/chat/completions", {"messages": CHAT, "n": 2, "temperature": 0, "max_tokens": 4})
    assert chat.status_code == 400 and "n must be 1 when using greedy sampling" in chat.text
    tgi = _post(server, "/generate", {"inputs": PROMPT, "parameters": {"best_of": 2, "max_new_tokens": 4}})
    assert tgi.status_code == 422 and "you must use sampling when `best_of` is > 1" in tgi.text


def test_tgi_best_of_sequences(server: ServerProcess) -> None:
    body = {"inputs": PROMPT, "parameters": {"best_of": 3, "do_sample": True, "temperature": 1.2, "seed": 7,
                                             "max_new_tokens": 10, "details": True}}
    answer = _ok(server, "/generate", body).json()[0]  # TGI's shape here: the object in a one-element list
    others = answer["details"]["best_of_sequences"]
    assert len(others) == 2 and all(o["generated_tokens"] == len(o["tokens"]) for o in others)
    # each sample reports the seed vLLM drew it with: seed + its index
    assert sorted([answer["details"]["seed"], *(o["seed"] for o in others)]) == [7, 8, 9]
    lmi = _sequences(_ok(server, "/invocations", _lmi(n=3)).json())
    assert answer["generated_text"] == lmi[0][0]  # the same samples (seed), the same best


def test_openai_chat_n_choices_and_usage(server: ServerProcess) -> None:
    body = {"messages": CHAT, "n": 3, "temperature": 1.2, "seed": 11, "max_tokens": 8, "logprobs": True}
    answer = _ok(server, "/v1/chat/completions", body).json()
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    counted = sum(len(c["logprobs"]["content"]) for c in choices)
    assert answer["usage"]["completion_tokens"] == counted > 3
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"] + counted
    stream = _ok(server, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    texts: dict[int, str] = {}
    chunks = _sse(stream)
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + (choice["delta"].get("content") or "")
    assert texts == {c["index"]: c["message"]["content"] for c in choices}
    assert chunks[-1]["usage"]["completion_tokens"] == counted


def test_openai_completions_n_best_of_and_stream(server: ServerProcess) -> None:
    body = {"prompt": PROMPT, "n": 3, "temperature": 1.2, "seed": 5, "max_tokens": 8, "logprobs": 1}
    answer = _ok(server, "/v1/completions", body).json()
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2] and len({c["text"] for c in choices}) > 1
    counted = sum(len(c["logprobs"]["tokens"]) for c in choices)
    assert answer["usage"]["completion_tokens"] == counted
    stream = _ok(server, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    texts: dict[int, str] = {}
    chunks = _sse(stream)
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {c["index"]: c["text"] for c in choices}
    assert chunks[-1]["usage"]["completion_tokens"] == counted
    best = _ok(server, "/v1/completions", {**body, "n": 2, "best_of": 3}).json()
    logprob = {c["text"]: sum(c["logprobs"]["token_logprobs"]) for c in choices}
    assert [c["text"] for c in best["choices"]] == sorted(logprob, key=lambda t: -logprob[t])[:2]
    assert best["usage"]["completion_tokens"] == counted  # every decoded sample is billed
