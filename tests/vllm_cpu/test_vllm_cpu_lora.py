"""REAL vLLM on the CPU with LoRA: different adapters in one batch through our adapter (skipped
unless vLLM's CPU build is installed, see conftest.py).

Two random-but-fixed PEFT adapters are made for the embedded SmolLM2 (``tests/lora_adapters.py``,
needs peft in that venv), registered through ``VllmEngine.load_adapter`` (vLLM's ``add_lora``), and
three requests (adapter a, base, adapter b) run in the same vLLM batch; each must equal
transformers' greedy ``generate()`` of that prompt alone with the adapter merged. vLLM computes in
its own kernels, so this compares tokens of the first ``CHECKED`` steps only (fp32).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture
from lora_adapters import MLP, make_adapter, merged_generate

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.params.generation import GenerationParameters

PROMPTS = ("The capital of France is", "Deep learning is", "Once upon a time")
ROWS: tuple[Optional[str], ...] = ("a", None, "b")
# vLLM's CPU LoRA kernels sum in another order than a merged fp32 model: a near-tie may flip after
# several tokens (seen at token 10 with these adapters), so the first 8 steps are compared.
CHECKED = 8
OPTIONS = {"rolling_batch": "vllm", "dtype": "fp32", "max_model_len": "1024", "max_rolling_batch_size": "8",
           "enforce_eager": "true", "gpu_memory_utilization": "0.3", "enable_lora": "true", "max_loras": "2",
           "max_lora_rank": "8"}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path) -> dict[str, Any]:  # noqa: F811
    pytest.importorskip("peft")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.environ.get("DJL_HANDLERS_VLLM_MODEL") or str(embedded_dir)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    root = tmp_path_factory.mktemp("vllm-lora")
    folders = {"a": make_adapter(model, root / "a", seed=21, rank=8, std=0.02),
               "b": make_adapter(model, root / "b", seed=22, rank=4, targets=MLP, std=0.02)}
    want = [merged_generate(model, tok, p, CHECKED, folders[a] if a else None)
            for p, a in zip(PROMPTS, ROWS, strict=True)]
    return {"path": path, "folders": folders, "want": want}


@pytest.fixture(scope="module")
def engine(adapters: dict[str, Any]) -> Iterator[Any]:
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.registry import load_engine_class

    config = ServingConfig.from_properties({"model_id": adapters["path"], **OPTIONS}, engine="vllm")
    eng = load_engine_class(config.serving_engine).from_config(config)
    yield eng
    for obj in (getattr(eng.engine, "engine_core", None), eng.engine):
        if callable(getattr(obj, "shutdown", None)):
            obj.shutdown()
            break


def test_mixed_adapters_in_one_vllm_batch(engine: Any, adapters: dict[str, Any]) -> None:
    from djl_handlers.lora.registry import AdapterSpec

    for name, folder in adapters["folders"].items():
        engine.load_adapter(AdapterSpec(name, str(folder)))
    params = GenerationParameters.from_dict({"max_new_tokens": CHECKED}, engine="vllm")
    for rid, (prompt, name) in enumerate(zip(PROMPTS, ROWS, strict=True), start=1):
        engine.add_request(EngineRequest(rid, engine.tokenizer.encode(prompt), params, prompt, name))
    per: dict[int, list[StepOutput]] = {rid: [] for rid in range(1, len(PROMPTS) + 1)}
    deadline = time.monotonic() + 300
    while not all(outs and (outs[-1].finish_reason or outs[-1].error) for outs in per.values()):
        assert time.monotonic() < deadline
        for out in engine.step():
            per.setdefault(out.request_id, []).append(out)
    for rid, want in zip(per, adapters["want"], strict=True):
        assert [o.token_id for o in per[rid]][:CHECKED] == want[:CHECKED], (rid, ROWS[rid - 1])
