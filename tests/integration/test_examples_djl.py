"""Every CPU recipe of ``serving.properties.examples/`` served by DJL Serving's real ModelServer.

Each example directory is copied unchanged to a temporary folder and started with
``DjlServer`` (tests/djl_serving/djl_server.py); the requests are the ones the examples' README
and comments document, and the answers must have the LMI shape the example promises (rolling
batch: one JSON object or token lines; dynamic batch: a list; TGI: list-wrapped JSON and SSE;
custom model.py: its own shape). One ModelServer at a time, each stopped before the next.
``vllm`` runs only where ``.venv-vllm`` exists (its interpreter becomes the worker's Python);
``lmi-dist`` and ``trtllm`` need a GPU container layout (/opt/ml/model) and are not run here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest
from conftest_models import embedded_dir  # noqa: F401
from djl_server_fixture import DjlServer, djl_skip_reason

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "serving.properties.examples"
VLLM_PYTHON = Path(os.environ.get("DJL_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python")))
PROMPT = {"inputs": "Deep learning is", "parameters": {"max_new_tokens": 16}}

pytestmark = [pytest.mark.djl, pytest.mark.slow]


def _post(server: DjlServer, body: Any, path: str = "/invocations") -> httpx.Response:
    resp = httpx.post(server.url + path, json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp


def _lines(resp: httpx.Response) -> list[Any]:
    return [json.loads(line) for line in resp.text.splitlines() if line.strip()]


def _rolling(server: DjlServer) -> None:
    body = _post(server, PROMPT).json()
    assert set(body) == {"generated_text"} and body["generated_text"].strip()
    details = _post(server, {**PROMPT, "parameters": {"max_new_tokens": 4, "details": True}}).json()
    assert details["details"]["finish_reason"] == "length" and details["details"]["generated_tokens"] == 4
    stream = _post(server, {**PROMPT, "stream": True})
    assert stream.headers["content-type"].startswith("application/jsonlines")
    lines = _lines(stream)
    assert all("token" in line for line in lines) and len(lines) == 16
    assert lines[-1]["generated_text"] == "".join(line["token"]["text"] for line in lines)


def _dynamic(server: DjlServer) -> None:
    body = _post(server, {"inputs": ["Deep learning is", "The capital of France is"],
                          "parameters": {"max_new_tokens": 8}}).json()
    assert [sorted(item) for item in body] == [["generated_text"], ["generated_text"]]
    single = _post(server, PROMPT).json()
    assert isinstance(single, list) and len(single) == 1 and single[0]["generated_text"].strip()


def _dynamic_streaming(server: DjlServer) -> None:
    resp = _post(server, {"inputs": ["Deep learning is", "Hello"], "parameters": {"max_new_tokens": 6}})
    assert resp.headers["content-type"].startswith("application/jsonlines")
    lines = _lines(resp)
    assert len(lines) == 6 and all(len(line["outputs"]) == 2 for line in lines)


def _custom(server: DjlServer) -> None:
    body = _post(server, {"question": "What is the capital of France?"}).json()
    assert set(body) == {"answer", "tokens"}
    assert "Paris" in body["answer"] and 0 < body["tokens"] <= 24
    lmi = _post(server, {"inputs": "Deep learning is", "parameters": {"max_new_tokens": 4}}).json()
    assert set(lmi) == {"answer", "tokens"} and lmi["tokens"] == 4


def _openai_tgi(server: DjlServer) -> None:
    body = _post(server, PROMPT).json()
    assert isinstance(body, list) and set(body[0]) == {"generated_text"}
    stream = _post(server, {**PROMPT, "stream": True})
    assert stream.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[5:]) for line in stream.text.splitlines() if line.startswith("data:")]
    assert events and all("token" in e for e in events) and events[-1]["generated_text"]
    chat = _post(server, {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}).json()
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] <= 8
    completion = _post(server, {"prompt": "Deep learning is", "max_tokens": 5}).json()
    assert completion["object"] == "text_completion" and completion["choices"][0]["text"]


def _vllm(server: DjlServer) -> None:
    _rolling(server)


EMBED_TEXTS = ["A man is eating food.", "Deep learning is", "The weather in the mountains changes quickly"]


def _embedding(server: DjlServer) -> None:
    """MiniLM's vectors through DJL's front end equal sentence-transformers' encode()."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from djl_handlers.model.embedder import embedder_dir

    many = np.asarray(_post(server, {"inputs": EMBED_TEXTS}).json())
    one = np.asarray(_post(server, {"inputs": EMBED_TEXTS[0]}).json())
    want = SentenceTransformer(str(embedder_dir()), device="cpu").encode(EMBED_TEXTS, normalize_embeddings=True)
    assert many.shape == (3, 384) and one.shape == (384,)
    assert float(((many * want).sum(1)).min()) >= 0.99999 and float(one @ want[0]) >= 0.99999
    bad = httpx.post(server.url + "/invocations", json={"inputs": []}, timeout=60)
    assert bad.status_code == 400 and "inputs" in bad.text


def _reranker(server: DjlServer) -> None:
    scores = _post(server, {"query": "what do people eat?", "texts": EMBED_TEXTS}).json()
    assert len(scores) == 3 and all(len(s) == 1 and 0 < s[0] < 1 for s in scores)
    pair = _post(server, {"text": "what do people eat?", "text_pair": EMBED_TEXTS[0]}).json()
    assert abs(pair[0] - scores[0][0]) < 1e-5


Check = Callable[[DjlServer], None]
EXAMPLE_CHECKS: dict[str, Check] = {
    "hf-rolling-batch": _rolling,
    "hf-dynamic-batch": _dynamic,
    "hf-dynamic-batch-streaming": _dynamic_streaming,
    "custom-model-py": _custom,
    "openai-tgi": _openai_tgi,
    "deepspeed": _rolling,
    "hf-lora": _rolling,  # no adapter registered: the base model answers (adapters: test_djl_lora.py)
    "vllm": _vllm,
    "hf-embedding": _embedding,
    "hf-reranker": _reranker,
}


def _skip_reason(name: str) -> Optional[str]:
    if name == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (djl_handlers[deepspeed])"
    if name == "vllm" and not VLLM_PYTHON.is_file():
        return f"no vLLM interpreter at {VLLM_PYTHON} (make setup-vllm, or set DJL_VLLM_PYTHON)"
    return None


@pytest.fixture(scope="module")
def djl_ready(embedded_dir: Path) -> Iterator[None]:  # noqa: F811 - the embedded model must be converted
    reason = djl_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    yield


@pytest.mark.parametrize("name", list(EXAMPLE_CHECKS))
def test_example_on_djl(djl_ready: None, tmp_path: Path, name: str) -> None:
    """Each example as written; vLLM's runs with ``enforce_eager=true`` added (its compiled graph is
    ``test_vllm_example_compiled_on_djl``, a ``full`` test: 4 minutes of inductor on 2 cores)."""
    _serve_example(tmp_path, name, eager=True)


@pytest.mark.full
def test_vllm_example_compiled_on_djl(djl_ready: None, tmp_path: Path) -> None:
    """The vLLM example unchanged (``enforce_eager=false``): vLLM compiles the model at start."""
    _serve_example(tmp_path, "vllm", eager=False)


def _serve_example(tmp_path: Path, name: str, eager: bool) -> None:
    reason = _skip_reason(name)
    if reason:
        pytest.skip(reason)
    model_dir = shutil.copytree(EXAMPLES / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    python = str(VLLM_PYTHON) if name == "vllm" else None
    if name == "vllm":  # vLLM's CPU build wants this share of the machine's RAM free (a GPU figure in the example)
        props = model_dir / "serving.properties"
        text = props.read_text(encoding="utf-8").replace(
            "option.gpu_memory_utilization=0.9", "option.gpu_memory_utilization=0.3")
        if eager:
            assert "option.enforce_eager=false" in text
            text = text.replace("option.enforce_eager=false", "option.enforce_eager=true")
        # on 2 loaded CPU cores the compiling init call once outlasted DJL's default 240 s
        # model_loading_timeout (the eager one takes about a minute)
        props.write_text(text + "option.model_loading_timeout=900\n", encoding="utf-8")
    with DjlServer(model_dir, python=python, startup_timeout=960 if name == "vllm" else 300) as server:
        try:
            EXAMPLE_CHECKS[name](server)
        except BaseException:
            print(server.log_tail(80))
            raise


def test_every_cpu_example_is_checked() -> None:
    """A new example directory must be added here (or listed as GPU-only)."""
    gpu_only = {"lmi-dist", "trtllm"}
    names = {p.name for p in EXAMPLES.iterdir() if (p / "serving.properties").is_file()}
    assert names == set(EXAMPLE_CHECKS) | gpu_only


def _async_checks(server: DjlServer) -> None:
    """What async mode must keep: the rolling checks, concurrent requests, a 400 beside a good one."""
    _rolling(server)
    from concurrent.futures import ThreadPoolExecutor

    bodies = [{"inputs": f"Request {i} says", "parameters": {"max_new_tokens": 6}} for i in range(4)]
    bodies[2] = {"inputs": "bad", "parameters": {"max_new_tokens": -1}}
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda b: httpx.post(server.url + "/invocations", json=b, timeout=300), bodies))
    for index, reply in enumerate(replies):
        if index == 2:
            assert reply.status_code == 400 and "max_new_tokens" in reply.text
        else:
            assert reply.status_code == 200 and reply.json()["generated_text"]


@pytest.mark.parametrize("name", ["deepspeed"])
def test_example_in_async_mode_on_djl(djl_ready: None, tmp_path: Path, name: str) -> None:
    """The same examples with ``option.async_mode=true`` (and ``rolling_batch=disable``, as DJL 0.36
    writes it): DJL's PythonAsyncEngine awaits our handler per request. vLLM's async mode behind DJL
    (``AsyncLLM``, DJL 0.36 with ``SERVING_FEATURES=vllm``) is test_djl_vllm_parallel.py's, which
    starts vLLM once for it; a second vLLM start here cost minutes of the suite."""
    reason = _skip_reason(name)
    if reason:
        pytest.skip(reason)
    model_dir = shutil.copytree(EXAMPLES / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    props = model_dir / "serving.properties"
    text = "\n".join(line for line in props.read_text(encoding="utf-8").splitlines()
                     if not line.startswith("option.rolling_batch="))
    text = text.replace("option.gpu_memory_utilization=0.9", "option.gpu_memory_utilization=0.3")
    props.write_text(text + "\noption.rolling_batch=disable\noption.async_mode=true\n"
                     + ("option.model_loading_timeout=900\n" if name == "vllm" else ""), encoding="utf-8")
    python = str(VLLM_PYTHON) if name == "vllm" else None
    with DjlServer(model_dir, python=python, startup_timeout=960 if name == "vllm" else 300) as server:
        try:
            _async_checks(server)
        except BaseException:
            print(server.log_tail(80))
            raise


def test_embedding_example_on_djl_036(djl_ready: None, tmp_path: Path) -> None:
    """The embedding recipe on DJL Serving 0.36's front end (its newest release) too."""
    from djl_server_fixture import djl_skip_reason as skip_reason

    reason = skip_reason("0.36")
    if reason:
        pytest.skip(reason)
    model_dir = shutil.copytree(EXAMPLES / "hf-embedding", tmp_path / "hf-embedding")
    with DjlServer(model_dir, version="0.36", startup_timeout=300) as server:
        try:
            _embedding(server)
        except BaseException:
            print(server.log_tail(80))
            raise
