"""schemathesis against ``djl-handlers serve``, driven by the server's own ``/openapi.json``
(:mod:`tests.robustness.schema_fuzz`): the real pipeline on the fake engine (quick), and, marked
slow, the embedded SmolLM2 on the HF engine. Bounded: a few derandomised cases per operation and
mode, a time budget, a timeout per request. Set ``DJL_SCHEMA_FUZZ_EXAMPLES`` for a longer run."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_server_harness import ROOT, ServerProcess
from tests.robustness.schema_fuzz import error_message, fuzz

FAKE = ROOT / "tests" / "robustness" / "models" / "fake_lmi"
EXAMPLES = int(os.environ.get("DJL_SCHEMA_FUZZ_EXAMPLES", "12"))


def _model(tmp: Path, source: Path, extra: str) -> Path:
    target = tmp / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    with open(target / "serving.properties", "a", encoding="utf-8") as handle:
        handle.write("\n" + extra + "\n")
    return target


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("schema-fuzz")
    model = _model(tmp, FAKE, "option.fake_step_delay=0\noption.max_new_tokens_limit=512")
    proc = ServerProcess(model, tmp / "server.log")
    yield proc
    proc.stop()


def test_error_shapes_are_read_per_dialect() -> None:
    assert error_message("/v1/completions", {"error": {"message": "m", "type": "t"}}) == "m"
    assert error_message("/v1/completions", {"error": "m", "code": 400}) is None
    assert error_message("/generate", {"error": "m", "error_type": "validation"}) == "m"
    assert error_message("/generate", {"code": 400, "message": "m"}) is None
    assert error_message("/generate", {"code": 413, "type": "PayloadTooLargeException", "message": "m"}) == "m"
    assert error_message("/v1/models", ["not", "an", "error"]) is None
    assert error_message("/invocations", {"code": 400, "message": "invalid request", "error": "e"}) == "e"


def test_schema_fuzz_on_the_fake_engine(fake_server: ServerProcess) -> None:
    report = fuzz(fake_server.url, examples=EXAMPLES, budget_s=600, request_timeout_s=60)
    assert report.cases > 200
    assert sum(n for status, n in report.statuses.items() if status < 300) > 20  # not only refusals
    assert not report.findings, "\n".join(report.findings)


@pytest.mark.slow
def test_schema_fuzz_on_the_embedded_model(tmp_path: Path) -> None:
    model = _model(tmp_path, ROOT / "serving.properties.examples" / "hf-rolling-batch",
                   "option.max_new_tokens_limit=8")  # each case generates a few tokens at most
    proc = ServerProcess(model, tmp_path / "server.log")
    try:
        report = fuzz(proc.url, examples=max(2, EXAMPLES // 4), budget_s=900, request_timeout_s=120)
    finally:
        proc.stop()
    assert report.cases > 50
    assert not report.findings, "\n".join(report.findings)
