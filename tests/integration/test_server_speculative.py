"""``djl-handlers serve`` with ``option.speculative_config`` (prompt lookup) on the HF engine (tiny
random Llama, fp32, greedy): sync rolling batch and async mode answer byte for byte as the same
server without speculation, streamed one line per token, stop sequences and max_new_tokens cut where
they did; ``/metrics`` counts the drafts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401
from test_server_harness import ServerProcess
from test_server_observability import scrape, total

pytestmark = pytest.mark.slow

PROPS = """engine=Python
option.entryPoint=djl_handlers.huggingface
option.model_id={model}
option.dtype=fp32
option.max_rolling_batch_size=8
"""
NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
MODES = {"sync": "option.rolling_batch=scheduler", "async": "option.async_mode=true"}
PROMPTS = ["one two three one two three one two", "The cat sat on the mat. The cat sat on the", "Hello there"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[dict[str, ServerProcess]]:  # noqa: F811
    root = tmp_path_factory.mktemp("speculative-servers")
    started: dict[str, ServerProcess] = {}
    try:
        for mode, line in MODES.items():
            for spec in (False, True) if mode == "sync" else (True,):  # async without it: test_server_async
                name = f"{mode}-{'spec' if spec else 'plain'}"
                folder = root / name
                folder.mkdir()
                extra = line + (f"\noption.speculative_config={NGRAM}" if spec else "")
                (folder / "serving.properties").write_text(PROPS.format(model=tiny_dir) + extra + "\n")
                started[name] = ServerProcess(folder, root / f"{name}.log")
        yield started
    finally:
        for server in started.values():
            server.stop()


def _post(server: ServerProcess, body: dict[str, Any]) -> tuple[int, str]:
    with server.client() as client:
        response = client.post("/invocations", json=body, timeout=120)
    return response.status_code, response.text


def _bodies() -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = []
    for prompt in PROMPTS:
        bodies.append({"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": 16, "details": True}})
        bodies.append({"inputs": prompt, "parameters": {"max_new_tokens": 13, "details": True}})
    return bodies


def test_same_bytes_with_and_without_speculation(servers: dict[str, ServerProcess]) -> None:
    bodies = _bodies()
    reference = [_post(servers["sync-plain"], body) for body in bodies]
    assert all(status == 200 for status, _ in reference)
    streamed = reference[0][1].splitlines()
    assert len(streamed) == 16 and all("token" in json.loads(line) for line in streamed)  # a line per token
    for name in ("sync-spec", "async-spec"):
        with ThreadPoolExecutor(len(bodies)) as pool:  # concurrent: rows of different acceptance in one batch
            got = list(pool.map(lambda b, n=name: _post(servers[n], b), bodies))
        assert got == reference, name
    samples = scrape(servers["sync-spec"])
    assert total(samples, "spec_decode_num_drafts_total") > 0
    assert total(samples, "spec_decode_num_accepted_tokens_total") > 0
    assert total(samples, "spec_decode_tokens_per_step") > 1.0
    assert 0 < total(samples, "spec_decode_acceptance_rate") <= 1
    assert "djl_handlers_spec_decode_num_declined_steps_total" in samples  # the rule's plain steps are counted
    assert total(scrape(servers["sync-plain"]), "spec_decode_num_drafts_total") == 0


def test_stop_sequence_cuts_where_it_did(servers: dict[str, ServerProcess]) -> None:
    """A stop string from the middle of the plain answer: the speculating servers stop at the same byte."""
    body: dict[str, Any] = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 24}}
    status, text = _post(servers["sync-plain"], body)
    answer = json.loads(text)["generated_text"]
    assert status == 200 and len(answer) > 12
    stop = answer[len(answer) // 2 : len(answer) // 2 + 4]
    body = {"inputs": PROMPTS[0], "stream": True, "parameters": {"max_new_tokens": 24, "stop_sequences": [stop],
                                                                 "details": True}}
    reference = _post(servers["sync-plain"], body)
    assert '"stop_sequence"' in reference[1]
    for name in ("sync-spec", "async-spec"):
        assert _post(servers[name], body) == reference, name
