"""The collector policy of the server's processes (djl_handlers/heap.py), each case in a fresh
interpreter: ``gc.freeze`` and thresholds are process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import gc, json, logging
logging.basicConfig(level=logging.INFO)
from djl_handlers.heap import GEN0_THRESHOLD, settle
before = gc.get_threshold()[0]
done = settle("test")
print(json.dumps({"done": done, "frozen": gc.get_freeze_count(), "gen0": gc.get_threshold()[0],
                  "before": before, "limit": GEN0_THRESHOLD, "enabled": gc.isenabled()}))
"""


def _settle(mode: str | None) -> tuple[dict[str, object], str]:
    env = {key: value for key, value in os.environ.items() if key != "DJL_HANDLERS_GC"}
    env["PYTHONPATH"] = str(ROOT)
    if mode is not None:
        env["DJL_HANDLERS_GC"] = mode
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize("mode", [None, "tuned", " Tuned "])
def test_settle_freezes_the_heap_and_raises_gen0(mode: str | None) -> None:
    out, log = _settle(mode)
    assert out["done"] is True and out["enabled"] is True  # the collector stays on
    assert isinstance(out["frozen"], int) and out["frozen"] > 1000  # the interpreter's own heap at least
    assert out["gen0"] == out["limit"] and out["before"] != out["limit"]
    assert "test: heap settled" in log and "objects frozen" in log


def test_default_keeps_cpythons_policy() -> None:
    out, log = _settle("default")
    assert out["done"] is False
    assert out["frozen"] == 0 and out["gen0"] == out["before"]
    assert "settled" not in log


def test_an_unknown_mode_warns_and_settles() -> None:
    out, log = _settle("off")
    assert out["done"] is True and out["frozen"] > 0
    assert "DJL_HANDLERS_GC='off'" in log and "neither 'tuned' nor 'default'" in log


DJL_WORKER = """
import gc, json, sys
sys.argv[0] = ARGV0
from djl_handlers.engines.fake import FakeEngine
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import RollingBatchDriver
service = InferenceService("huggingface", engine_factory=lambda config: FakeEngine())
RollingBatchDriver(service.handle).init({"rolling_batch": "auto"})
print(json.dumps({"frozen": gc.get_freeze_count(), "gen0": gc.get_threshold()[0]}))
"""


@pytest.mark.parametrize("argv0", ["/opt/djl/python/djl_python_engine.py", "/usr/bin/pytest", ""])
def test_the_handler_settles_only_inside_djls_worker(argv0: str) -> None:
    env = {key: value for key, value in os.environ.items() if key != "DJL_HANDLERS_GC"}
    env["PYTHONPATH"] = str(ROOT)
    code = DJL_WORKER.replace("ARGV0", repr(argv0))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if argv0.endswith("djl_python_engine.py"):
        assert out["frozen"] > 1000 and out["gen0"] == 10_000
    else:  # a user's process (tests, notebooks, djl-handlers generate) keeps its collector as it was
        assert out["frozen"] == 0 and out["gen0"] == 700
