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


pytest_plugins = ["conftest_models"]  # fixture: tiny_dir


def test_model_py_without_entry_point_falls_back_to_the_hf_handler(tmp_path: Path, tiny_dir: Path) -> None:
    """DJL 0.34: a model.py without ``handle`` and no option.entryPoint runs the recommended handler
    (huggingface, because option.model_id is set) with model.py's formatters."""
    model = tmp_path / "formatters-only"
    model.mkdir()
    source = ROOT / "serving.properties.examples" / "custom-model-py" / "model.py"
    (model / "model.py").write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    (model / "serving.properties").write_text(
        f"engine=Python\noption.model_id={tiny_dir}\noption.rolling_batch=scheduler\noption.dtype=fp32\n",
        encoding="utf-8")
    assert _generate(model) == 3


def test_model_py_formatters_in_async_mode(tmp_path: Path, tiny_dir: Path) -> None:
    """DJL's async mode: the same model.py (formatters only, falling back to the HF handler) answers
    in its own shape through ``djl-handlers generate``, which then drives the handler as DJL's async
    engine does."""
    model = tmp_path / "formatters-only-async"
    model.mkdir()
    source = ROOT / "serving.properties.examples" / "custom-model-py" / "model.py"
    (model / "model.py").write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    (model / "serving.properties").write_text(
        f"engine=Python\noption.model_id={tiny_dir}\noption.async_mode=true\noption.dtype=fp32\n", encoding="utf-8")
    assert _generate(model) == 3


def _generate(model: Path) -> int:
    """``djl-handlers generate`` with a question: the answer's token count (its shape checked)."""
    question = json.dumps({"question": "Hi?", "parameters": {"max_new_tokens": 3}})
    run = subprocess.run(
        [sys.executable, "-c", CLI, "generate", str(model), question],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    body = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(body) == {"answer", "tokens"}
    return int(body["tokens"])
