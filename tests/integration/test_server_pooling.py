"""Embeddings and reranking through ``djl-handlers serve`` over real HTTP: the recipes
``serving.properties.examples/hf-embedding`` (the embedded all-MiniLM-L6-v2) and ``hf-reranker``
(the random cross-encoder, seed 0).

MiniLM's vectors through ``/invocations`` and ``/v1/embeddings`` (also with the ``openai`` client's
``embeddings.create``, which asks for base64) equal sentence-transformers' ``encode()``; reranker
scores on ``/v1/rerank`` and ``/v1/score`` equal ``CrossEncoder.predict``; a bad request among
concurrent ones gets its own 400 naming the field while the others succeed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from test_server_harness import ServerProcess

pytest_plugins = ["pooling_models"]

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["A man is eating food.", "A man is riding a horse.", "Pasta with tomato sauce",
         "The weather in the mountains changes quickly in the afternoon"]


def _start(tmp_path_factory: pytest.TempPathFactory, name: str) -> ServerProcess:
    root = tmp_path_factory.mktemp(name)
    model = shutil.copytree(ROOT / "serving.properties.examples" / name, root / name)
    return ServerProcess(model, root / "server.log")


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory, cross_encoder_dir: Path) -> Iterator[ServerProcess]:
    server = _start(tmp_path_factory, "hf-reranker")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Iterator[ServerProcess]:
    server = _start(tmp_path_factory, "hf-embedding")
    yield server
    server.stop()


def _predict(folder: Path, pairs: list[tuple[str, str]]) -> Any:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(folder), device="cpu").predict(pairs)


def test_rerank_and_score_equal_cross_encoder_predict(reranker: ServerProcess, cross_encoder_dir: Path) -> None:
    query = "what do people eat?"
    want = _predict(cross_encoder_dir, [(query, t) for t in TEXTS])
    with reranker.client() as client:
        ranked = client.post("/v1/rerank", json={"query": query, "documents": TEXTS, "top_n": 3}).json()
        scored = client.post("/v1/score", json={"text_1": query, "text_2": TEXTS}).json()
        lmi = client.post("/invocations", json={"query": query, "texts": TEXTS}).json()
        wrong = client.post("/v1/embeddings", json={"input": "x"})
    order = list(np.argsort(-want))[:3]
    assert [r["index"] for r in ranked["results"]] == order
    assert all(abs(r["relevance_score"] - want[r["index"]]) < 1e-4 for r in ranked["results"])
    assert ranked["results"][0]["document"]["text"] == TEXTS[order[0]] and ranked["usage"]["total_tokens"] > 0
    assert np.abs(np.asarray([d["score"] for d in scored["data"]]) - want).max() < 1e-4
    assert np.abs(np.asarray(lmi)[:, 0] - want).max() < 1e-4
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "route"


def test_concurrent_requests_a_bad_one_fails_alone(reranker: ServerProcess) -> None:
    bodies: list[Any] = [{"query": "q", "documents": TEXTS[:2]} for _ in range(6)]
    bodies[3] = {"query": "q", "documents": ["fine", 42]}
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda b: httpx.post(reranker.url + "/v1/rerank", json=b, timeout=120), bodies))
    for index, reply in enumerate(replies):
        if index == 3:
            assert reply.status_code == 400 and reply.json()["error"]["param"] == "documents[1]"
        else:
            assert reply.status_code == 200 and len(reply.json()["results"]) == 2


def test_openapi_and_metrics_cover_the_pooling_routes(reranker: ServerProcess) -> None:
    with reranker.client() as client:
        paths = client.get("/openapi.json").json()["paths"]
        client.post("/v1/rerank", json={"query": "q", "documents": TEXTS})
        metrics = client.get("/metrics").text
    assert {"/v1/embeddings", "/v1/rerank", "/v1/score"} <= set(paths)
    assert "djl_handlers_pooling_requests_total" in metrics and "djl_handlers_pooling_inputs_total" in metrics


@pytest.mark.slow
def test_minilm_vectors_on_every_route_equal_encode(embedder: ServerProcess, minilm_dir: Path) -> None:
    import base64

    from openai import OpenAI
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_dir), device="cpu")
    want = st.encode(TEXTS, normalize_embeddings=True)
    client = OpenAI(base_url=embedder.url + "/v1", api_key="none")
    created = client.embeddings.create(model="all-minilm-l6-v2", input=TEXTS)  # the client asks for base64
    got = np.asarray([d.embedding for d in created.data])
    ids = st.tokenizer(TEXTS)["input_ids"]
    assert created.usage.prompt_tokens == sum(len(i) for i in ids)
    with embedder.client() as http:
        floats = http.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "float"}).json()
        by_ids = http.post("/v1/embeddings", json={"input": ids[:2], "encoding_format": "base64"}).json()
        lmi = http.post("/invocations", json={"inputs": TEXTS}).json()
        full = http.post("/v1/embeddings", json={"input": "x", "dimensions": 384})
        short = http.post("/v1/embeddings", json={"input": "x", "dimensions": 128})
        long = http.post("/v1/embeddings", json={"input": ["ok", "word " * 400], "truncate": False})
    packed = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in by_ids["data"]]
    for vectors in (got, np.asarray([d["embedding"] for d in floats["data"]]), np.asarray(lmi),
                    np.asarray(packed)):
        assert float((vectors * want[:len(vectors)]).sum(1).min()) >= 0.99999
    assert full.status_code == 200 and len(full.json()["data"][0]["embedding"]) == 384
    assert short.status_code == 400 and short.json()["error"]["param"] == "dimensions"
    assert long.status_code == 400 and long.json()["error"]["param"] == "input[1]"


def test_async_mode_server_answers_and_isolates_a_bad_request(tmp_path: Path, cross_encoder_dir: Path) -> None:
    """DJL 0.35+'s async mode (each request awaited alone; the handler gathers concurrent ones)."""
    model = shutil.copytree(ROOT / "serving.properties.examples" / "hf-reranker", tmp_path / "hf-reranker")
    props = model / "serving.properties"
    props.write_text(props.read_text(encoding="utf-8").replace("batch_size=16", "batch_size=1")
                     + "option.async_mode=true\noption.rolling_batch=disable\n", encoding="utf-8")
    server = ServerProcess(model, tmp_path / "server.log")
    try:
        bodies: list[Any] = [{"query": "q", "documents": TEXTS}] * 4 + [{"query": "q", "documents": []}]
        with ThreadPoolExecutor(5) as pool:
            replies = list(pool.map(lambda b: httpx.post(server.url + "/v1/rerank", json=b, timeout=120), bodies))
        with server.client() as client:
            mode = client.get("/models/hf-reranker").json()[0]["mode"]
            lmi = client.post("/invocations", json={"query": "q", "texts": TEXTS}).json()
    finally:
        server.stop()
    assert mode == "async" and [r.status_code for r in replies] == [200] * 4 + [400]
    assert replies[4].json()["error"]["param"] == "documents"
    want = _predict(cross_encoder_dir, [("q", t) for t in TEXTS])
    assert np.abs(np.asarray(lmi)[:, 0] - want).max() < 1e-4
