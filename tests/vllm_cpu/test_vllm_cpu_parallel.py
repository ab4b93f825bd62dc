"""REAL vLLM on the CPU with several ranks: tensor and pipeline parallelism through vLLM's own
``mp`` executor, started by ``djl_handlers.vllm`` with no extra environment.

The embedded SmolLM2-135M has 9 attention heads and 3 KV heads: it splits by 3 (not by 2, which is
refused before vLLM loads anything, naming the degrees that work). A random-weight Llama built from a
config at a fixed seed (4 heads, 2 KV heads of width 64: vLLM's CPU attention has no kernel for the
tiny test model's width 16) splits by 2. The two cores of a small machine hold
three ranks: the handler binds each rank's threads to a core list (vLLM's own binding needs one NUMA
node per rank), without ``VLLM_CPU_OMP_THREADS_BIND`` from the user.

The reference is transformers' greedy ``generate()`` in fp32, which one vLLM rank equals
(``test_vllm_cpu.py``); several ranks must give the same texts and token ids. Checked through
``djl-handlers serve`` in sync (rolling batch) and async mode, and in process with the handler
driven like DJL's Java loop. One vLLM engine at a time; each is shut down before the next starts.
Pipeline parallelism and Ray, which vLLM's CPU build cannot run, are refused at start-up with our
error, before vLLM loads anything (``test_vllm_cpu_ray.py`` holds the Ray cluster recipe).
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture
from engine_runs import greedy_texts
from integration.test_server_harness import ServerProcess

from djl_handlers.errors import ConfigError

pytestmark = pytest.mark.slow

PROMPTS = ("The capital of France is", "Deep learning is", "Once upon a time")
NEW_TOKENS = 16
OPTIONS = {
    "dtype": "fp32",
    "max_model_len": "512",
    "max_rolling_batch_size": "4",
    "enforce_eager": "true",
    "gpu_memory_utilization": "0.3",  # vLLM's CPU build wants this share of the RAM free
}
START_S = 900  # three ranks sharing two busy cores start in about two minutes


def greedy(path: Path | str) -> dict[str, tuple[list[int], str]]:
    """prompt → (new token ids, text) of transformers' ``generate(do_sample=False)`` in fp32."""
    return greedy_texts(path, PROMPTS, NEW_TOKENS)


@pytest.fixture(scope="module")
def embedded_greedy(embedded_dir: Path) -> dict[str, tuple[list[int], str]]:  # noqa: F811
    return greedy(embedded_dir)


@pytest.fixture(scope="module")
def split_by_2_dir(tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path) -> Path:  # noqa: F811
    """A random Llama (2 layers, 4 heads and 2 KV heads of width 64, seed 0) with SmolLM2's tokenizer."""
    import shutil

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from djl_handlers.model.tiny import TOKENIZER_FILES

    out = tmp_path_factory.mktemp("split-by-2")
    config = LlamaConfig(vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, initializer_range=0.1, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model.save_pretrained(str(out))
    for name in TOKENIZER_FILES:
        if (embedded_dir / name).is_file():
            shutil.copyfile(embedded_dir / name, out / name)
    return out


def _serve(folder: Path, model: Path, **options: str) -> ServerProcess:
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ  # the handler chooses the binding
    lines = ["engine=Python", "option.entryPoint=djl_handlers.vllm", f"option.model_id={model}",
             f"option.model_loading_timeout={START_S}",
             *(f"option.{k}={v}" for k, v in {**OPTIONS, **options}.items())]
    (folder / "serving.properties").write_text("\n".join(lines) + "\n")
    return ServerProcess(folder, folder / "server.log", start_timeout=START_S)


def _ask(server: ServerProcess) -> list[dict[str, Any]]:
    """The prompts, concurrently, as LMI JSON with details."""
    def post(prompt: str) -> dict[str, Any]:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            body = {"inputs": prompt, "parameters": {"max_new_tokens": NEW_TOKENS, "details": True}}
            response = client.post("/invocations", json=body)
            assert response.status_code == 200, response.text
            return dict(response.json())

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(post, PROMPTS))


def _assert_greedy(answers: list[dict[str, Any]], want: dict[str, tuple[list[int], str]]) -> None:
    for prompt, body in zip(PROMPTS, answers, strict=True):
        ids, text = want[prompt]
        assert body["generated_text"] == text, prompt
        assert [t["id"][0] for t in body["details"]["tokens"]] == ids, prompt


def _rank_cores(log: str) -> dict[int, str]:
    """local rank → core ids, from vLLM's own thread-binding report in the server log."""
    return {int(rank): cores for rank, cores in re.findall(r"local_rank=(\d+), core ids=(\[[\d, ]*\])", log)}


# async mode with three ranks is a `full` test here: the default run proves it through DJL's front end
# (tests/integration/test_djl_vllm_parallel.py, 0.36), each start costing one to two minutes.
@pytest.mark.parametrize("mode", ["rolling", pytest.param("async", marks=pytest.mark.full)])
def test_tensor_parallel_3_on_the_embedded_model_through_serve(
        mode: str, tmp_path: Path, embedded_dir: Path,  # noqa: F811
        embedded_greedy: dict[str, tuple[list[int], str]]) -> None:
    extra = {"rolling_batch": "vllm"} if mode == "rolling" else {"rolling_batch": "disable", "async_mode": "true"}
    server = _serve(tmp_path, embedded_dir, tensor_parallel_degree="3", **extra)
    try:
        answers = _ask(server)
    finally:
        server.stop()
    _assert_greedy(answers, embedded_greedy)
    log = server.log_path.read_text()
    cores = _rank_cores(log)
    assert sorted(cores) == [0, 1, 2], log[-4000:]  # vLLM started and bound three ranks
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 3:  # more ranks than cores: each rank one core, shared round-robin
        assert [cores[r] for r in range(3)] == [f"[{usable[r % len(usable)]}]" for r in range(3)]
    assert "VLLM_CPU_OMP_THREADS_BIND=" in log  # chosen by the handler, said in its log


def _driven(model: Path, **options: str) -> tuple[dict[str, tuple[list[int], str]], Any]:
    """The prompts through ``djl_handlers.vllm.handle`` driven like DJL's rolling-batch loop; the engine
    is shut down before returning. Returns (prompt → (token ids, text), the engine's parallel config)."""
    import djl_handlers.vllm as handler
    from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

    driver = RollingBatchDriver(handler.handle)
    assert driver.init({"model_id": str(model), "rolling_batch": "vllm", **OPTIONS, **options}) is None
    service = handler._service._service
    try:
        reqs = [driver.submit(json_request({"inputs": p, "parameters": {"max_new_tokens": NEW_TOKENS,
                                                                           "details": True}})) for p in PROMPTS]
        driver.run()
        out = {}
        for prompt, req in zip(PROMPTS, reqs, strict=True):
            body = json.loads(req.text)
            out[prompt] = ([t["id"][0] for t in body["details"]["tokens"]], body["generated_text"])
        engine = service.engine.engine
        return out, engine.vllm_config.parallel_config
    finally:
        engine = service.engine.engine
        engine.engine_core.shutdown()
        handler._service._service = None


def test_tensor_parallel_2_on_a_random_model_whose_heads_divide_by_2(split_by_2_dir: Path) -> None:
    want = greedy(split_by_2_dir)
    got, parallel = _driven(split_by_2_dir, tensor_parallel_degree="2", max_model_len="256")
    assert (parallel.tensor_parallel_size, parallel.pipeline_parallel_size) == (2, 1)
    assert got == want


def _init_error(model: Path, **options: str) -> ConfigError:
    """The error ``djl_handlers.vllm``'s init call fails with (before vLLM loads anything)."""
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.registry import load_engine_class

    config = ServingConfig.from_properties({"model_id": str(model), "rolling_batch": "vllm", **OPTIONS, **options},
                                           engine="vllm")
    with pytest.raises(ConfigError) as info:
        load_engine_class(config.serving_engine).from_config(config)
    return info.value


def test_a_degree_the_model_cannot_split_is_refused_with_the_degrees_that_work(embedded_dir: Path) -> None:  # noqa: F811
    error = _init_error(embedded_dir, tensor_parallel_degree="2")
    assert error.field == "option.tensor_parallel_degree"
    assert "9 attention heads and 3 KV heads" in str(error) and str(error).endswith("degrees that work: 1, 3")


def test_ray_on_vllms_cpu_build_is_our_clear_error(split_by_2_dir: Path) -> None:
    pytest.importorskip("ray")
    error = _init_error(split_by_2_dir, tensor_parallel_degree="2", distributed_executor_backend="ray")
    assert error.field == "option.distributed_executor_backend"
    assert "cannot run over Ray" in str(error) and "current platform cpu does not support ray" in str(error)


def test_pipeline_parallel_on_vllms_cpu_engine_is_our_clear_error(embedded_dir: Path) -> None:  # noqa: F811
    """vLLM's CPU engine starts two pipeline stages, then its first step fails in the later stage's model
    runner (``assert self.intermediate_tensors is not None``) and the engine dies: refused up front."""
    error = _init_error(embedded_dir, pipeline_parallel_degree="2")
    assert error.field == "option.pipeline_parallel_degree"
    assert "CPU engine starts the pipeline stages but fails on the first step" in str(error)
