"""vLLM with three tensor-parallel ranks behind DJL Serving's real front end (ModelServer).

The embedded SmolLM2-135M (9 heads, 3 KV heads) is served with ``option.tensor_parallel_degree=3``
by ``djl_handlers.vllm`` in DJL's own Python worker, run by the ``.venv-vllm`` interpreter:

- DJL 0.36 with ``SERVING_FEATURES=vllm`` (an LMI vLLM image) and no ``option.rolling_batch``: the
  front end rewrites ``auto`` to ``disable`` + ``option.async_mode=true`` (vLLM's ``AsyncLLM``);
- DJL 0.34 with ``option.rolling_batch=vllm``: the sync rolling batch (vLLM's ``LLMEngine``).

On a machine without a GPU, DJL's Java side passes the degree through untouched: with no GPU it
neither counts devices for ``load_on_devices`` nor starts MPI (``mpi_mode`` is only for TensorRT-LLM),
so the handler receives ``tensor_parallel_degree=3`` and vLLM's ``mp`` executor starts the ranks.
The greedy texts and token ids must equal transformers' ``generate()`` in fp32, which one vLLM rank
equals (``tests/vllm_cpu``). One ModelServer (and one vLLM engine) at a time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture
from djl_server_fixture import DjlServer, djl_skip_reason
from engine_runs import greedy_texts

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("DJL_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python")))
PROMPTS = ("The capital of France is", "Deep learning is", "Once upon a time")
NEW_TOKENS = 16
OPTIONS = {
    "tensor_parallel_degree": "3",
    "dtype": "fp32",
    "max_model_len": "512",
    "max_rolling_batch_size": "4",
    "enforce_eager": "true",
    "gpu_memory_utilization": "0.3",  # vLLM's CPU build wants this share of the RAM free
    "model_loading_timeout": "900",  # three ranks sharing two busy cores start in one to three minutes
}
# DJL release -> the serving.properties lines beyond OPTIONS and the environment a user's image has
SETUPS = {
    "0.36": ({}, {"SERVING_FEATURES": "vllm"}),
    "0.34": ({"rolling_batch": "vllm"}, {}),
}
# vLLM's CPU build: a 1 GiB KV cache, 2 OpenMP threads (as tests/vllm_cpu/conftest.py sets)
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"}

pytestmark = [pytest.mark.djl, pytest.mark.slow]


@pytest.fixture(scope="module")
def greedy(embedded_dir: Path) -> dict[str, tuple[list[int], str]]:  # noqa: F811
    """prompt -> (new token ids, text) of transformers' ``generate(do_sample=False)`` in fp32."""
    return greedy_texts(embedded_dir, PROMPTS, NEW_TOKENS)


# 0.34's sync rolling batch with three ranks is a `full` test: the default run proves three ranks
# through DJL (0.36, async) and the sync rolling batch with three ranks through `djl-handlers serve`
# (tests/vllm_cpu/test_vllm_cpu_parallel.py), each start costing one to two minutes here.
@pytest.fixture(params=[pytest.param(v, marks=pytest.mark.full) if v == "0.34" else v for v in SETUPS])
def server(request: pytest.FixtureRequest, tmp_path: Path, embedded_dir: Path) -> Iterator[DjlServer]:  # noqa: F811
    version = request.param
    reason = djl_skip_reason(version) or (None if VLLM_PYTHON.is_file() else
                                          f"no vLLM interpreter at {VLLM_PYTHON} (make setup-vllm)")
    if reason:
        pytest.skip(reason)
    extra, env = SETUPS[version]
    lines = ["engine=Python", "option.entryPoint=djl_handlers.vllm", f"option.model_id={embedded_dir}",
             *(f"option.{k}={v}" for k, v in {**OPTIONS, **extra}.items())]
    (tmp_path / "serving.properties").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with DjlServer(tmp_path, python=str(VLLM_PYTHON), version=version, env={**VLLM_ENV, **env},
                   startup_timeout=960) as djl:
        yield djl


def _ask(server: DjlServer) -> list[dict[str, Any]]:
    """The prompts, concurrently, as LMI JSON with details."""
    def post(prompt: str) -> dict[str, Any]:
        body = {"inputs": prompt, "parameters": {"max_new_tokens": NEW_TOKENS, "details": True}}
        response = httpx.post(server.url + "/invocations", json=body, timeout=300)
        assert response.status_code == 200, response.text
        return dict(response.json())

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(post, PROMPTS))


def test_tensor_parallel_3_on_djl_front_end(server: DjlServer, greedy: dict[str, tuple[list[int], str]]) -> None:
    try:
        answers = _ask(server)
        stream = httpx.post(server.url + "/invocations", timeout=300, json={
            "inputs": PROMPTS[1], "stream": True, "parameters": {"max_new_tokens": NEW_TOKENS}})
    except BaseException:
        print(server.log_tail(80))
        raise
    for prompt, body in zip(PROMPTS, answers, strict=True):
        ids, text = greedy[prompt]
        assert body["generated_text"] == text, prompt
        assert [t["id"][0] for t in body["details"]["tokens"]] == ids, prompt
    lines = [line for line in stream.text.splitlines() if line.strip()]
    assert stream.status_code == 200 and len(lines) == NEW_TOKENS
    assert '"generated_text"' in lines[-1] and greedy[PROMPTS[1]][1].split()[0] in stream.text
    settings = server.model_settings()  # what DJL's front end resolved before the handler saw it
    assert settings["option.tensor_parallel_degree"] == "3"
    if server.version == "0.36":
        assert (settings["option.rolling_batch"], settings["option.async_mode"]) == ("disable", "true")
    else:
        assert settings["option.rolling_batch"] == "vllm"
    assert server.log_path is not None
    log = server.log_path.read_text(encoding="utf-8", errors="replace")
    ranks = set(re.findall(r"local_rank=(\d+), core ids=", log))  # vLLM bound the threads of three ranks
    assert ranks == {"0", "1", "2"}, server.log_tail(80)
