"""The DeepSpeed entry point with the REAL ``deepspeed`` on the embedded SmolLM2 (fp32, CPU).

Driven like DJL drives it (``RollingBatchDriver``: one handler call per step, requests joining at
different steps). Checks that the model really is wrapped by ``deepspeed.init_inference``, that
greedy text equals the HF engine's and ``model.generate()``'s, that the seed's DeepSpeed
parameters (``typical_p``, ``truncate``) are accepted and change the output, and that 2-rank
tensor parallelism (AutoTP over gloo, no MPI: two processes with ``RANK``/``WORLD_SIZE``) gives
rank 0 the same greedy text. Skipped when deepspeed is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir, real_model  # noqa: F401
from deepspeed_tp_worker import REQUESTS

from djl_handlers.config.properties import read_serving_properties, split_properties
from djl_handlers.io import Input
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed (pip install deepspeed, or djl_handlers[deepspeed])",
    ),
]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "serving.properties.examples" / "deepspeed"
WORKER = Path(__file__).with_name("deepspeed_tp_worker.py")
# (payload, step at which it joins): greedy requests of different lengths joining a running batch.
Script = Sequence[tuple[dict[str, Any], int]]
GREEDY: Script = [({"inputs": p, "parameters": {"max_new_tokens": n, "details": True}}, j) for p, n, j in REQUESTS]


def run_script(handle: Callable[[Any], Any], script: Script) -> list[dict[str, Any]]:
    """Submit each payload at its step through DJL's rolling-batch loop; the parsed json bodies."""
    driver = RollingBatchDriver(handle)
    submitted = []
    for step in range(max(join for _, join in script) + 1):
        submitted += [driver.submit(json_request(p)) for p, join in script if join == step]
        if driver.active:
            driver.step()
    driver.run()
    for req in submitted:
        assert req.code is None, req.error
    return [json.loads(req.text) for req in submitted]


def _service(engine: str, options: dict[str, str]) -> InferenceService:
    service = InferenceService(engine)
    assert service.handle(Input.from_parts(options, ())) is None
    return service


@pytest.fixture(scope="module")
def ds_service(embedded_dir: Path) -> InferenceService:  # noqa: F811
    """The shipped DeepSpeed example's options (minus the embedded-model switch), real deepspeed."""
    _, options = split_properties(read_serving_properties(EXAMPLE))
    options["model_id"] = str(embedded_dir)
    return _service("deepspeed", options)


@pytest.fixture(scope="module")
def hf_service(embedded_dir: Path) -> InferenceService:  # noqa: F811
    return _service("huggingface", {"model_id": str(embedded_dir), "rolling_batch": "auto", "dtype": "fp32"})


@pytest.fixture(scope="module")
def hf_greedy(hf_service: InferenceService) -> list[dict[str, Any]]:
    """The HF engine's bodies for ``GREEDY`` (the reference the DeepSpeed runs must match)."""
    return run_script(hf_service.handle, GREEDY)


@pytest.fixture(scope="module")
def generate(real_model: tuple[Any, Any]) -> Callable[..., list[int]]:  # noqa: F811
    """``model.generate()`` of one prompt (text or token ids) alone; returns the new token ids."""
    import torch

    model, tok = real_model

    def run(prompt: str | list[int], n: int, **kwargs: Any) -> list[int]:
        ids = tok.encode(prompt) if isinstance(prompt, str) else prompt
        with torch.inference_mode():
            kwargs.setdefault("do_sample", False)
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, **kwargs)
        return [int(t) for t in out[0, len(ids) :]]

    return run


def _ids(body: dict[str, Any]) -> list[int]:
    return [t["id"][0] for t in body["details"]["tokens"]]


def test_model_is_wrapped_by_real_deepspeed(ds_service: InferenceService) -> None:
    import deepspeed
    from deepspeed.inference.engine import InferenceEngine

    engine = ds_service.engine
    assert engine.name == "deepspeed"
    assert isinstance(engine.ds_engine, InferenceEngine)
    assert engine.model is engine.ds_engine.module
    assert engine.ds_engine._config.replace_with_kernel_inject is False
    assert engine.ds_engine._config.max_out_tokens == 1024  # option.max_tokens from the example
    assert deepspeed.__version__


def test_greedy_mixed_joins_equal_hf_engine_and_generate(
    ds_service: InferenceService, hf_greedy: list[dict[str, Any]], generate: Callable[..., list[int]]
) -> None:
    ds = run_script(ds_service.handle, GREEDY)
    hf = hf_greedy
    for (payload, _), d, h in zip(GREEDY, ds, hf, strict=True):
        n = payload["parameters"]["max_new_tokens"]
        assert _ids(d) == _ids(h) == generate(payload["inputs"], n)[: len(_ids(d))]
        assert d["generated_text"] == h["generated_text"]
        assert d["details"]["finish_reason"] == h["details"]["finish_reason"]
        pairs = zip(d["details"]["tokens"], h["details"]["tokens"], strict=True)
        assert all(abs(a["log_prob"] - b["log_prob"]) < 1e-3 for a, b in pairs)


def test_async_mode_request_answers_as_the_rolling_batch(
    embedded_dir: Path, ds_service: InferenceService  # noqa: F811
) -> None:
    """DJL's async mode through the DeepSpeed entry point: the engine-loop thread steps the
    DeepSpeed engine; two concurrent requests get the rolling batch's bytes."""
    import asyncio

    from djl_handlers.testing.async_loop import AsyncModeClient

    _, options = split_properties(read_serving_properties(EXAMPLE))
    options.update(model_id=str(embedded_dir), rolling_batch="disable")
    payloads = [GREEDY[0][0], {"inputs": GREEDY[1][0]["inputs"], "stream": True, "parameters": {"max_new_tokens": 6}}]

    async def main() -> list[Any]:
        service = InferenceService("deepspeed")
        client = AsyncModeClient(service.handle)
        assert await client.init(options) is None
        try:
            assert service.async_mode is not None and service.async_mode.driver is not None
            assert service.engine is not None and service.engine.name == "deepspeed"
            return list(await asyncio.gather(*(client.request(p) for p in payloads)))
        finally:
            service.async_mode.close()  # type: ignore[union-attr]

    answers = asyncio.run(main())
    driver = RollingBatchDriver(ds_service.handle)
    reqs = [driver.submit(json_request(p)) for p in payloads]
    driver.run()
    assert [(a.code, a.text) for a in answers] == [(200, r.text) for r in reqs]


def test_typical_p_is_applied(
    ds_service: InferenceService, hf_service: InferenceService, generate: Callable[..., list[int]]
) -> None:
    prompt, n = "My favourite food is", 4
    # A tiny typical mass keeps one token per step (the most "typical", not the most likely),
    # so sampling becomes deterministic whatever the seed and must match transformers' warper.
    typical = {"do_sample": True, "typical_p": 1e-4, "max_new_tokens": n, "details": True}
    bodies = run_script(
        ds_service.handle,
        [({"inputs": prompt, "parameters": {**typical, "seed": s}}, 0) for s in (1, 2)],
    )
    expected = generate(prompt, n, do_sample=True, typical_p=1e-4, top_k=0, top_p=1.0, temperature=1.0)
    assert _ids(bodies[0]) == _ids(bodies[1]) == expected
    assert expected != generate(prompt, n)  # not greedy: typical_p changed the output
    sampled = [
        ({"inputs": prompt, "parameters": {"do_sample": True, "typical_p": 0.9, "seed": 7, "max_new_tokens": 6}}, 0)
    ]
    assert run_script(ds_service.handle, sampled) == run_script(hf_service.handle, sampled)


def test_truncate_keeps_the_last_prompt_tokens(
    ds_service: InferenceService,
    real_model: tuple[Any, Any],  # noqa: F811
    generate: Callable[..., list[int]],
) -> None:
    prompt, keep, n = "The capital of Germany is Berlin. The capital of Italy is", 4, 4
    ids = real_model[1].encode(prompt)
    assert len(ids) > keep
    full, cut = run_script(
        ds_service.handle,
        [
            ({"inputs": prompt, "parameters": {"max_new_tokens": n, "details": True}}, 0),
            ({"inputs": prompt, "parameters": {"max_new_tokens": n, "details": True, "truncate": keep}}, 1),
        ],
    )
    assert _ids(cut) == generate(ids[-keep:], n)[: len(_ids(cut))]
    assert _ids(full) == generate(ids, n)[: len(_ids(full))]
    assert _ids(cut) != _ids(full)


def test_seed_parameters_accepted(ds_service: InferenceService) -> None:
    params = {
        "do_sample": True,
        "seed": 42,
        "temperature": 0.8,
        "repetition_penalty": 1.1,
        "top_k": 40,
        "top_p": 0.95,
        "max_new_tokens": 5,
        "details": True,
        "return_full_text": False,
        "stop_sequences": ["\n\n"],
        "typical_p": 0.95,
        "truncate": 16,
    }
    payload = {"inputs": "What is Deep Learning?", "parameters": params}
    first, again = run_script(ds_service.handle, [(payload, 0), (payload, 1)])
    assert list(first) == ["generated_text", "details"]
    assert first["details"]["finish_reason"] in ("length", "eos_token", "stop_sequence")
    assert 1 <= first["details"]["generated_tokens"] <= 5
    # Same seed, same sample, whatever joined when (log-probs agree to float noise across batch shapes).
    assert first["generated_text"] == again["generated_text"] and _ids(first) == _ids(again)
    pairs = zip(first["details"]["tokens"], again["details"]["tokens"], strict=True)
    assert all(abs(a["log_prob"] - b["log_prob"]) < 1e-3 for a, b in pairs)


def test_structured_output_on_deepspeed(ds_service: InferenceService) -> None:
    """guided_json / guided_regex / guided_choice on the DeepSpeed engine (the HF engine's xgrammar
    path over the wrapped model), next to a free greedy request that must equal the HF engine's."""
    import re

    schema = {"type": "object", "required": ["ok", "n"],
              "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}}
    json_params = {"max_new_tokens": 30, "guided_json": schema, "details": True}
    script: Script = [
        ({"inputs": "Answer in JSON:", "parameters": json_params}, 0),
        ({"inputs": "Phone:", "parameters": {"max_new_tokens": 20, "guided_regex": "[0-9]{3}-[0-9]{4}"}}, 0),
        ({"inputs": "Yes or no?", "parameters": {"max_new_tokens": 8, "guided_choice": ["yes", "no"]}}, 1),
        (GREEDY[0][0], 1),  # bodies come back in submission order: joins ascending
    ]
    value, phone, choice, free = run_script(ds_service.handle, script)
    parsed = json.loads(value["generated_text"])
    assert isinstance(parsed["ok"], bool) and 0 <= parsed["n"] <= 9
    assert value["details"]["finish_reason"] == "eos_token"
    assert re.fullmatch("[0-9]{3}-[0-9]{4}", phone["generated_text"])
    assert choice["generated_text"] in ("yes", "no")
    alone = run_script(ds_service.handle, [(GREEDY[0][0], 0)])[0]
    assert free["generated_text"] == alone["generated_text"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tensor_parallel_two_ranks_on_cpu(
    tmp_path: Path,
    embedded_dir: Path,  # noqa: F811
    hf_greedy: list[dict[str, Any]],
) -> None:
    """Two processes with RANK/WORLD_SIZE (what DJL's MPI launch provides), gloo all-reduce.

    ``TORCH_EXTENSIONS_DIR`` points at an empty folder that must stay empty: the adapter keeps
    DeepSpeed from JIT-building its shared-memory all-reduce (which segfaults on CPU).
    """
    world, port, out = 2, _free_port(), tmp_path / "rank.json"
    extensions = tmp_path / "torch_extensions"
    extensions.mkdir()
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)}
    base.update(
        WORLD_SIZE=str(world),
        LOCAL_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCH_EXTENSIONS_DIR=str(extensions),
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")]),
    )
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(embedded_dir), str(out)],
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=300)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    elapsed = time.perf_counter() - start
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, f"rank exited {proc.returncode}:\n{log[-3000:]}"
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    expected = [b["generated_text"] for b in hf_greedy]
    assert ranks[0]["texts"] == expected
    assert ranks[1]["texts"] == expected
    # AutoTP really sharded the model: each rank holds part of the attention heads.
    q_rows = [r["shards"]["q_proj"][0] for r in ranks]
    assert sum(q_rows) == 576 and max(q_rows) < 576
    assert all(r["shm_vector_kernel_level"] == 0 for r in ranks)
    assert list(extensions.iterdir()) == []  # the shm all-reduce op was not built
    print(f"tp=2: {elapsed:.1f} s wall, rank 0 load {ranks[0]['load_s']} s, run {ranks[0]['run_s']} s")


@pytest.mark.parametrize("engine", ["deepspeed", "huggingface"])
def test_stop_string_is_removed_on_both_engines(request: pytest.FixtureRequest, engine: str) -> None:
    """docs/parameters.md: the matched stop string is not in the text (json and streamed tokens);
    include_stop_str_in_output keeps it."""
    service = request.getfixturevalue("ds_service" if engine == "deepspeed" else "hf_service")
    prompt = "Deep learning is"
    (plain,) = run_script(service.handle, [({"inputs": prompt, "parameters": {"max_new_tokens": 16}}, 0)])
    reference = plain["generated_text"]
    stop = " " + reference.split()[3]
    expected = reference[: reference.index(stop)]
    params = {"max_new_tokens": 16, "stop_sequences": [stop], "details": True}
    (cut,) = run_script(service.handle, [({"inputs": prompt, "parameters": params}, 0)])
    assert (cut["generated_text"], cut["details"]["finish_reason"]) == (expected, "stop_sequence")
    assert "".join(t["text"] for t in cut["details"]["tokens"]) == expected
    kept = {**params, "include_stop_str_in_output": True}
    (whole,) = run_script(service.handle, [({"inputs": prompt, "parameters": kept}, 0)])
    assert whole["generated_text"] == expected + stop
    driver = RollingBatchDriver(service.handle)
    streamed = driver.submit(json_request({"inputs": prompt, "stream": True, "parameters": params}))
    driver.run()
    lines = [json.loads(line) for line in streamed.text.splitlines()]
    assert "".join(line["token"]["text"] for line in lines) == expected
    assert lines[-1]["generated_text"] == expected
