"""The HF engine's prefill budget when ``option.max_prefill_tokens`` is unset: 2048 padded tokens per
step on a CPU, 8192 on a GPU of the H100/H200 class (engines/hf/prefill_budget.py); a set value wins."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from djl_handlers.config.hf import DEFAULT_PREFILL_TOKENS  # noqa: E402
from djl_handlers.config.models import ServingConfig  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.engines.hf.prefill_budget import LARGE_GPU_PREFILL_TOKENS, default_prefill_tokens  # noqa: E402

pytest_plugins = ["conftest_models"]


@pytest.mark.parametrize(("gib", "want"), [(141, LARGE_GPU_PREFILL_TOKENS), (80, LARGE_GPU_PREFILL_TOKENS),
                                           (40, DEFAULT_PREFILL_TOKENS), (24, DEFAULT_PREFILL_TOKENS)])
def test_a_large_gpu_prefills_more_per_step(monkeypatch: pytest.MonkeyPatch, gib: int, want: int) -> None:
    seen: list[Any] = []

    def properties(device: Any) -> Any:
        seen.append(device)
        return SimpleNamespace(total_memory=gib * 2**30)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    assert default_prefill_tokens(torch.device("cuda", 0)) == want
    assert seen == [torch.device("cuda", 0)]  # the model's own device is asked


def test_the_cpu_keeps_its_measured_budget() -> None:
    assert default_prefill_tokens(torch.device("cpu")) == DEFAULT_PREFILL_TOKENS == 2048


def _engine(tiny_dir: Path, **options: str) -> HFEngine:
    props = {"model_id": str(tiny_dir), "rolling_batch": "scheduler", **options}
    return HFEngine.from_config(ServingConfig.from_properties(props, engine="huggingface"))


def test_the_engine_takes_the_devices_default_unless_the_option_is_set(tiny_dir: Path) -> None:
    assert _engine(tiny_dir).max_prefill_tokens == DEFAULT_PREFILL_TOKENS
    assert _engine(tiny_dir, max_prefill_tokens="300").max_prefill_tokens == 300
