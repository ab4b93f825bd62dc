"""The documented custom pre/post-processing example (serving.properties.examples/custom-model-py)
answers through `djl-handlers generate` with its own request and response shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = "import sys; from djl_handlers.cli import main; sys.exit(main())"


@pytest.mark.slow
def test_custom_model_py_example_answers_in_its_own_shape() -> None:
    example = ROOT / "serving.properties.examples" / "custom-model-py"
    question = json.dumps({"question": "What is the capital of France?"})
    run = subprocess.run(
        [sys.executable, "-c", CLI, "generate", str(example), question],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    body = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(body) == {"answer", "tokens"}
    assert "Paris" in body["answer"] and 0 < body["tokens"] <= 24
