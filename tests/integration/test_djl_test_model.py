"""DJL's own in-process test tool (``djl_python.test_model.TestHandler``) drives our entry points.

This is how DJL users test a handler without the Java server: no init call, every call carries the
serving properties plus ``batch_size=len(inputs)``, and ``inference_rolling_batch`` emulates Java's
rolling loop by decoding each binary record. The tool runs from DJL 0.34's own jar (extracted by
``tests/djl_serving/fetch.sh``) in a subprocess, exactly as a user would run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
DJL_PYTHON = ROOT / "tests" / "djl_serving" / "lib" / "python"

pytestmark = pytest.mark.skipif(not (DJL_PYTHON / "djl_python" / "test_model.py").is_file(),
                                reason="DJL's djl_python not extracted: run tests/djl_serving/fetch.sh")

SCRIPT = r"""
import json, sys
from djl_python.test_model import TestHandler
import djl_handlers.huggingface as entry
spec = json.loads(sys.argv[1])
handler = TestHandler(entry)
if spec["kind"] == "rolling":
    result = handler.inference_rolling_batch(spec["inputs"], serving_properties=spec["props"])
    print(json.dumps({str(k): v for k, v in result.items()}))
else:
    from djl_python.test_model import extract_output_as_input
    out = handler.inference_batch(spec["inputs"], serving_properties=spec["props"])
    batch = extract_output_as_input(out).get_content().values
    print(json.dumps([bytes(v).decode() for v in batch]))
"""

PROMPTS = [
    {"inputs": "The winner of oscar this year is", "parameters": {"max_new_tokens": 6}},
    {"inputs": "A little redhood is", "parameters": {"max_new_tokens": 3}},
]


def _run(spec: dict[str, object], env: dict[str, str] | None = None) -> object:
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(DJL_PYTHON), str(ROOT)]),
                    HF_HUB_OFFLINE="1", **(env or {}))
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(spec)], capture_output=True, text=True,
                          env=full_env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _greedy(model_dir: Path, prompt: str, n: int) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=n, do_sample=False)
    return str(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))


def test_inference_rolling_batch_with_two_concurrent_requests(tiny_dir: Path) -> None:  # noqa: F811
    props = {"engine": "Python", "rolling_batch": "auto", "model_id": str(tiny_dir), "dtype": "fp32"}
    result = _run({"kind": "rolling", "inputs": PROMPTS, "props": props})
    assert isinstance(result, dict) and len(result) == 2
    for index, prompt in enumerate(PROMPTS):
        body = json.loads(result[str(index)])
        params = prompt["parameters"]
        assert isinstance(params, dict)
        assert body["generated_text"] == _greedy(tiny_dir, str(prompt["inputs"]), int(params["max_new_tokens"]))


def test_inference_rolling_batch_from_env_with_tgi_compat(tiny_dir: Path) -> None:  # noqa: F811
    env = {"HF_MODEL_ID": str(tiny_dir), "OPTION_ROLLING_BATCH": "auto", "OPTION_TGI_COMPAT": "true"}
    result = _run({"kind": "rolling", "inputs": PROMPTS, "props": None}, env)
    assert isinstance(result, dict) and len(result) == 2
    for text in result.values():
        body = json.loads(text)
        assert isinstance(body, list) and "generated_text" in body[0]


def test_inference_batch_in_dynamic_mode(tiny_dir: Path) -> None:  # noqa: F811
    props = {"engine": "Python", "rolling_batch": "disable", "model_id": str(tiny_dir), "dtype": "fp32"}
    bodies = _run({"kind": "dynamic", "inputs": PROMPTS, "props": props})
    assert isinstance(bodies, list) and len(bodies) == 2
    for body, prompt in zip(bodies, PROMPTS, strict=True):
        params = prompt["parameters"]
        assert isinstance(params, dict)
        parsed = json.loads(body)
        text = parsed[0]["generated_text"] if isinstance(parsed, list) else parsed["generated_text"]
        assert text == _greedy(tiny_dir, str(prompt["inputs"]), int(params["max_new_tokens"]))
