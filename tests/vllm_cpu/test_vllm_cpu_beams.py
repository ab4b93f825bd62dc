"""REAL vLLM on the CPU: beam search (``num_beams``, OpenAI ``use_beam_search``) in both modes.

Skipped unless vLLM's CPU build is installed (see conftest.py). One async-mode and one sync-mode
service share the file. Without ``early_stopping`` the reference is vLLM's loop itself, called on the
same ``AsyncLLM`` (what vLLM's OpenAI server answers for ``use_beam_search``): async mode returns its
sequences, best first (OpenAI choices; LMI's best beam with LMI's finish reason, an eos-ended beam
showing its eos token), and sync mode, which runs the same rule itself across its steps, returns
the same. With ``early_stopping`` both modes run our loop with transformers' rule: the answers equal
``generate(num_beams=..., length_penalty=..., early_stopping=...)`` of the same fp32 model.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture

from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncModeClient
from djl_handlers.testing.java_loop import DriverRequest, RollingBatchDriver, json_request

PROMPT = "The capital of France is"
N = 6
OPTIONS = {"dtype": "fp32", "max_model_len": "512", "max_rolling_batch_size": "8", "enforce_eager": "true",
           "gpu_memory_utilization": "0.3"}


def _model_dir(embedded: Path) -> str:
    return os.environ.get("DJL_HANDLERS_VLLM_MODEL") or str(embedded)


def _shutdown(service: InferenceService) -> None:
    engine = getattr(service.engine, "engine", None)
    for obj in (getattr(engine, "engine_core", None), engine):
        if callable(getattr(obj, "shutdown", None)):
            obj.shutdown()
            return


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def client(embedded_dir: Path, loop: asyncio.AbstractEventLoop) -> Iterator[tuple[AsyncModeClient, Any]]:  # noqa: F811
    service = InferenceService("vllm")
    client = AsyncModeClient(service.handle)
    init = client.init({"model_id": _model_dir(embedded_dir), "rolling_batch": "disable", "async_mode": "true",
                        **OPTIONS})
    assert loop.run_until_complete(init) is None
    yield client, service
    _shutdown(service)


def _vllm_loop(service: Any, loop: asyncio.AbstractEventLoop, ids: list[int], width: int) -> list[list[int]]:
    """vLLM's own beam search on the same engine: each returned beam's tokens (best first)."""
    from vllm.sampling_params import BeamSearchParams

    from djl_handlers.engines.external.vllm_beams import searcher

    async def main() -> list[list[int]]:
        params = BeamSearchParams(beam_width=width, max_tokens=N, temperature=0.0)
        prompt = {"type": "token", "prompt_token_ids": ids}
        outs = [o async for o in searcher(service.engine.engine).beam_search(prompt, "reference", params)]
        return [list(c.token_ids) for c in outs[-1].outputs]

    return loop.run_until_complete(main())


def test_openai_use_beam_search_returns_vllms_beams(client: tuple[AsyncModeClient, Any],
                                                   loop: asyncio.AbstractEventLoop) -> None:
    handler, service = client
    tok = service.engine.tokenizer
    ids = tok.encode(PROMPT)
    answer = loop.run_until_complete(handler.request(
        {"prompt": PROMPT, "max_tokens": N, "use_beam_search": True, "n": 3}))
    assert answer.code in (None, 200), answer.text
    choices = sorted(json.loads(answer.text)["choices"], key=lambda c: c["index"])
    want = _vllm_loop(service, loop, ids, 3)
    assert [c["text"] for c in choices] == [tok.decode(t, skip_special_tokens=True) for t in want]
    assert len({c["text"] for c in choices}) == 3


def test_lmi_num_beams_best_is_vllms_best(client: tuple[AsyncModeClient, Any],
                                          loop: asyncio.AbstractEventLoop) -> None:
    handler, service = client
    tok = service.engine.tokenizer
    ids = tok.encode(PROMPT)
    answer = loop.run_until_complete(handler.request(
        {"inputs": PROMPT, "parameters": {"num_beams": 2, "max_new_tokens": N, "details": True}}))
    details = json.loads(answer.text)["details"]
    got = [t["id"][0] if isinstance(t["id"], list) else t["id"] for t in details["tokens"]]
    best = _vllm_loop(service, loop, ids, 2)[0]
    if details["finish_reason"] == "eos_token":  # vLLM leaves the eos out of the tokens; LMI shows it
        assert got[:-1] == best and got[-1] == tok.eos_token_id
    else:
        assert got == best and details["finish_reason"] == "length" and len(got) == N


@pytest.fixture(scope="module")
def sync_driver(embedded_dir: Path) -> Iterator[tuple[RollingBatchDriver, Any]]:  # noqa: F811
    service = InferenceService("vllm")
    driver = RollingBatchDriver(service.handle)
    assert driver.init({"model_id": _model_dir(embedded_dir), "rolling_batch": "vllm", **OPTIONS}) is None
    yield driver, service
    _shutdown(service)


def _sequences(body: dict[str, Any]) -> list[list[int]]:
    """Every returned sequence's token ids, best first (LMI ``details`` and ``best_of_sequences``)."""
    details = body["details"]
    seqs = [details, *details.get("best_of_sequences", [])]
    return [[t["id"][0] if isinstance(t["id"], list) else t["id"] for t in seq["tokens"]] for seq in seqs]


def _as_lmi(best: list[int], eos: int, limit: int) -> list[int]:
    """vLLM's beam tokens as an LMI answer shows them: an eos-ended beam with its eos."""
    return best if len(best) == limit else [*best, eos]


def test_sync_mode_runs_vllms_rule_beside_other_requests(sync_driver: tuple[RollingBatchDriver, Any],
                                                         client: tuple[AsyncModeClient, Any],
                                                         loop: asyncio.AbstractEventLoop) -> None:
    """A request without early_stopping: sync mode == async mode == vLLM's own loop, every sequence;
    bad widths are 400s naming num_beams while a neighbour succeeds."""
    driver, sync_service = sync_driver
    handler, service = client
    body = {"inputs": PROMPT, "parameters": {"num_beams": 3, "n": 3, "max_new_tokens": N, "details": True}}
    beams = driver.submit(json_request(body))
    plain = driver.submit(json_request({"inputs": "Hello", "parameters": {"max_new_tokens": 3}}))
    zero = driver.submit(json_request({"inputs": PROMPT, "parameters": {"num_beams": 0}}))
    wide = driver.submit(json_request({"inputs": PROMPT, "parameters": {"num_beams": 11}}))
    driver.run()
    for bad in (zero, wide):
        assert bad.code == 400 and "num_beams" in (bad.error or ""), bad.error
    assert json.loads(plain.text)["generated_text"]
    sync_seqs = _sequences(json.loads(beams.text))
    answer = loop.run_until_complete(handler.request(body))
    assert _sequences(json.loads(answer.text)) == sync_seqs
    tok = service.engine.tokenizer
    want = _vllm_loop(service, loop, tok.encode(PROMPT), 3)
    assert sync_seqs == [_as_lmi(w, tok.eos_token_id, N) for w in want]
    assert sync_service.engine._beams._searches == {}


@pytest.fixture(scope="module")
def hf_model(embedded_dir: Path) -> Any:  # noqa: F811
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(min(2, torch.get_num_threads()))
    return AutoModelForCausalLM.from_pretrained(_model_dir(embedded_dir), dtype=torch.float32).eval()


def _generate(model: Any, ids: list[int], eos: int, count: int, max_new: int, **beam: Any) -> list[list[int]]:
    """transformers' beam search alone: the ``count`` best sequences' new tokens, each to its eos."""
    import torch

    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                             pad_token_id=eos, num_return_sequences=count, **beam)
    rows = [row[len(ids):] for row in out.tolist()]
    return [row[: row.index(eos) + 1] if eos in row else row for row in rows]


EARLY_CASES = [  # (prompt, num_beams, length_penalty, early_stopping, max_new_tokens)
    ("The capital of France is", 2, 1.0, True, 8),
    ("<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n", 3, 0.5, "never", 10),
    ("Deep learning is", 3, 2.0, False, 6),
]


@pytest.mark.parametrize(("prompt", "beams", "length_penalty", "early_stopping", "max_new"), EARLY_CASES)
def test_early_stopping_equals_transformers_generate_in_both_modes(
    sync_driver: tuple[RollingBatchDriver, Any], client: tuple[AsyncModeClient, Any],
    loop: asyncio.AbstractEventLoop, hf_model: Any, prompt: str, beams: int, length_penalty: float,
    early_stopping: bool | str, max_new: int,
) -> None:
    driver, sync_service = sync_driver
    handler, _ = client
    tok = sync_service.engine.tokenizer
    body = {"inputs": prompt, "parameters": {
        "num_beams": beams, "n": 2, "length_penalty": length_penalty, "early_stopping": early_stopping,
        "max_new_tokens": max_new, "details": True}}
    want = _generate(hf_model, tok.encode(prompt), tok.eos_token_id, 2, max_new, num_beams=beams,
                     length_penalty=length_penalty, early_stopping=early_stopping)
    sync_answer: DriverRequest = driver.submit(json_request(body))
    driver.run()
    assert sync_answer.code in (None, 200), sync_answer.error
    assert _sequences(json.loads(sync_answer.text)) == want
    answer = loop.run_until_complete(handler.request(body))
    assert answer.code in (None, 200), answer.text
    assert _sequences(json.loads(answer.text)) == want
