"""Every recipe under ``serving.properties.examples/`` loads, validates and names a real handler.

For each example directory: ``serving.properties`` parses with DJL's precedence rules
(``load_model_properties``), the entry point resolves (``resolve_entry_point``) to one of our
handler modules, and a ``ServingConfig`` builds for that handler's engine. The engine-specific
recipes also pin the typed values their options must produce, so a misspelt key (which
``ServingConfig`` would keep in ``raw`` without complaint) fails here. Fast: no ML library.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.config.models import ServingConfig
from djl_handlers.config.properties import HANDLER_MODULES, load_model_properties, resolve_entry_point

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "serving.properties.examples"
EXAMPLE_DIRS = sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
EMBEDDED_NAME = "smollm2-135m-instruct"
POOLING_NAMES = ("all-minilm-l6-v2", "random-bert-cross-encoder-seed0")  # the embedding and reranker recipes

# The recipes this suite promises to keep (others may be added; these must not disappear).
REQUIRED = {
    "hf-rolling-batch", "hf-dynamic-batch", "hf-dynamic-batch-streaming", "custom-model-py",
    "deepspeed", "vllm", "lmi-dist", "trtllm", "openai-tgi", "hf-embedding", "hf-reranker",
}


def _engine_of(entry_point: str) -> str:
    """The handler engine a module entry point builds (``djl_handlers.vllm`` → ``vllm``)."""
    assert entry_point in HANDLER_MODULES, entry_point
    return entry_point.rsplit(".", 1)[1]


def _load(example: Path) -> tuple[str, ServingConfig]:
    """Entry point and validated config of one example directory, ignoring the environment."""
    props = load_model_properties(example, env={})
    entry = resolve_entry_point(example, props, env={})
    config = ServingConfig.from_properties(props.options, props.server, engine=_engine_of(entry))
    return entry, config


def test_every_required_recipe_exists() -> None:
    assert REQUIRED <= {p.name for p in EXAMPLE_DIRS}


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_example_parses_and_builds_a_config(example: Path) -> None:
    assert (example / "serving.properties").is_file(), f"{example.name} has no serving.properties"
    props = load_model_properties(example, env={})
    assert props.engine == "Python", "our handlers run under DJL's Python engine"
    entry, config = _load(example)
    assert entry == props.options["entryPoint"], "every recipe names its entry point explicitly"
    assert config.entry_point == entry
    # Where the weights come from: the embedded model or an explicit model_id, never both unset.
    embedded = props.options.get("embedded_model")
    assert embedded in (EMBEDDED_NAME, *POOLING_NAMES) or config.model_id, f"{example.name}: no model named"
    # The engine's rolling-batch mode resolves to something concrete.
    assert config.resolved_rolling_batch() in ("scheduler", "disable", "deepspeed", "vllm", "lmi-dist", "trtllm")


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_file_wins_over_environment(example: Path) -> None:
    """An ``OPTION_ENTRYPOINT`` in the container's env (as docker/Dockerfile sets) never overrides the file."""
    env = {"OPTION_ENTRYPOINT": "djl_handlers.tensorrt_llm", "OPTION_ROLLING_BATCH": "trtllm"}
    props = load_model_properties(example, env=env)
    assert resolve_entry_point(example, props, env=env) == _load(example)[0]


def _check_deepspeed(entry: str, c: ServingConfig) -> None:
    assert entry == "djl_handlers.deepspeed"
    assert (c.engine, c.serving_engine, c.resolved_rolling_batch()) == ("deepspeed", "deepspeed", "deepspeed")
    assert (c.deepspeed.max_tokens, c.deepspeed.enable_cuda_graph, c.max_rolling_batch_size) == (1024, False, 16)


def _check_vllm(entry: str, c: ServingConfig) -> None:
    assert entry == "djl_handlers.vllm"
    assert (c.serving_engine, c.params_engine, c.dtype) == ("vllm", "vllm", "fp16")
    assert c.vllm.max_model_len == 2048 and c.vllm.max_rolling_batch_prefill_tokens == 4096
    assert c.vllm.gpu_memory_utilization == pytest.approx(0.9) and c.vllm.enforce_eager is False


def _check_lmi_dist(entry: str, c: ServingConfig) -> None:
    assert entry == "djl_handlers.vllm"
    # LMI-Dist's parameter set, served by vLLM (the design's "say which engine serves it").
    assert (c.params_engine, c.serving_engine) == ("lmi-dist", "vllm")
    assert c.model_id == "/opt/ml/model" and c.max_rolling_batch_size == 64
    assert c.tensor_parallel_degree in (1, -1), "'max': all GPUs (-1), or 1 when the device is the CPU"


def _check_trtllm(entry: str, c: ServingConfig) -> None:
    assert entry == "djl_handlers.tensorrt_llm"
    assert (c.engine, c.serving_engine, c.resolved_rolling_batch()) == ("tensorrt_llm", "tensorrt_llm", "trtllm")
    assert c.trtllm.max_num_tokens == 8192 and c.trtllm.enable_kv_cache_reuse is True
    assert c.trtllm.kv_cache_free_gpu_mem_fraction == pytest.approx(0.9)
    assert c.trtllm.batch_scheduler_policy == "max_utilization"


def _check_openai_tgi(entry: str, c: ServingConfig) -> None:
    assert entry == "djl_handlers.huggingface"
    assert c.tgi_compat is True and c.is_rolling and c.output_formatter is None


def _check_dynamic(entry: str, c: ServingConfig) -> None:
    assert entry == "djl_handlers.huggingface"
    assert not c.is_rolling and c.enable_streaming == "true"


def _check_dynamic_batching(entry: str, c: ServingConfig) -> None:
    assert entry == "djl_handlers.huggingface"
    assert not c.is_rolling and c.batch_size == 4 and c.max_batch_delay_ms == 100


def _check_embedding(entry: str, c: ServingConfig) -> None:
    assert entry == "djl_handlers.huggingface" and c.pooling.task == "text_embedding"
    assert not c.is_rolling and c.batch_size == 16 and c.pooling.normalize is True


def _check_reranker(entry: str, c: ServingConfig) -> None:
    assert entry == "djl_handlers.huggingface" and c.pooling.task == "rerank"
    assert not c.is_rolling and c.batch_size == 16


EXPECTED: dict[str, Callable[[str, ServingConfig], Any]] = {
    "hf-embedding": _check_embedding,
    "hf-reranker": _check_reranker,
    "hf-dynamic-batch": _check_dynamic_batching,
    "deepspeed": _check_deepspeed,
    "vllm": _check_vllm,
    "lmi-dist": _check_lmi_dist,
    "trtllm": _check_trtllm,
    "openai-tgi": _check_openai_tgi,
    "hf-dynamic-batch-streaming": _check_dynamic,
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_engine_specific_options_take_effect(name: str) -> None:
    entry, config = _load(EXAMPLES / name)
    EXPECTED[name](entry, config)


def test_custom_model_py_sits_next_to_its_properties() -> None:
    example = EXAMPLES / "custom-model-py"
    source = (example / "model.py").read_text(encoding="utf-8")
    compile(source, str(example / "model.py"), "exec")
    assert "@input_formatter" in source and "@output_formatter" in source


def test_readme_lists_every_recipe() -> None:
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in EXAMPLE_DIRS if f"({p.name}/)" not in readme]
    assert not missing, f"serving.properties.examples/README.md does not link {missing}"
