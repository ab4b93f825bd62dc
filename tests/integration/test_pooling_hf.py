"""Embeddings and reranking on the Hugging Face entry point, driven as DJL drives a handler.

References: sentence-transformers' ``SentenceTransformer.encode`` for every pooling mode (random BERT
folders, seed 0) and the embedded all-MiniLM-L6-v2, ``CrossEncoder.predict`` for the random
cross-encoder. Also: a bad request gets its own 400 naming the field while its neighbours in the
same dynamic batch succeed; rolling-batch and async modes answer the same vectors; entry points
that do not serve a pooling task fail at load naming it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from djl_handlers.errors import ConfigError
from djl_handlers.io import Input
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import RollingBatchDriver, dynamic_batch, json_request

pytest_plugins = ["pooling_models", "conftest_models"]

TEXTS = ["A man is eating food.", "hello", "The weather in the mountains changes quickly in the afternoon " * 3,
         "Pasta with tomato sauce"]
LONG = "word " * 400


def _service(options: dict[str, str]) -> InferenceService:
    service = InferenceService("huggingface")
    assert service.handle(Input.from_parts(options, ())) is None
    return service


def _cosines(got: Any, want: Any) -> list[float]:
    a, b = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return list((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


@pytest.fixture(scope="module")
def st_encode() -> Callable[[Path, list[str], bool], Any]:
    from sentence_transformers import SentenceTransformer

    models: dict[Path, Any] = {}

    def encode(folder: Path, texts: list[str], normalize: bool) -> Any:
        if folder not in models:
            models[folder] = SentenceTransformer(str(folder), device="cpu")
        return models[folder].encode(texts, normalize_embeddings=normalize, convert_to_numpy=True)

    return encode


@pytest.mark.parametrize("pooling", ["mean", "cls", "max", "mean_sqrt_len", "lasttoken"])
@pytest.mark.parametrize("normalize", [True, False])
def test_every_pooling_mode_equals_sentence_transformers(random_embedder: Callable[[str], Path], st_encode: Any,
                                                         pooling: str, normalize: bool) -> None:
    folder = random_embedder(pooling)
    service = _service({"model_id": str(folder), "task": "text_embedding", "normalize": str(normalize).lower()})
    [vectors] = dynamic_batch(service.handle, [{"inputs": TEXTS}])
    want = st_encode(folder, TEXTS, normalize)
    assert np.allclose(np.asarray(vectors), want, atol=1e-5), pooling
    assert min(_cosines(vectors, want)) >= 0.99999


def test_cross_encoder_scores_equal_cross_encoder_predict(cross_encoder_dir: Path) -> None:
    from sentence_transformers import CrossEncoder

    service = _service({"model_id": str(cross_encoder_dir)})  # the folder's architecture: a reranker
    query, docs = "what do people eat?", TEXTS
    got = dynamic_batch(service.handle, [{"query": query, "texts": docs}, {"text": query, "text_pair": docs[0]},
                                         [{"text": query, "text_pair": d} for d in docs[:2]]])
    want = CrossEncoder(str(cross_encoder_dir), device="cpu").predict([(query, d) for d in docs])
    assert np.abs(np.asarray(got[0])[:, 0] - want).max() < 1e-4
    assert abs(got[1][0] - want[0]) < 1e-4 and len(got[1]) == 1  # one pair: one score list
    assert np.abs(np.asarray(got[2])[:, 0] - want[:2]).max() < 1e-4


def test_bad_inputs_fail_alone_naming_the_field(random_embedder: Callable[[str], Path]) -> None:
    service = _service({"model_id": str(random_embedder("mean")), "task": "text-embedding",
                        "max_inputs_per_request": "3"})
    bodies: list[Any] = [{"inputs": ["ok"]}, {"inputs": []}, {"inputs": ["a", 7]}, {"inputs": ["a", "b", "c", "d"]},
                         {"inputs": ["short", LONG], "parameters": {"truncate": False}}, {"inputs": "fine"}]
    out = dynamic_batch(service.handle, bodies)
    assert len(out[0]) == 1 and len(out[5]) == 32  # a list answers a list; one text answers one vector
    fields = [o.get("field") for o in out[1:5]]
    assert fields == ["inputs", "inputs[1]", "inputs", "inputs[1]"]
    assert all(o["code"] == 400 for o in out[1:5])
    assert "too long" in out[4]["error"] and "512" not in out[4]["error"]  # the folder's max_seq_length (64)


def test_truncation_cuts_to_the_model_length_as_sentence_transformers(random_embedder: Callable[[str], Path],
                                                                      st_encode: Any) -> None:
    folder = random_embedder("mean")
    service = _service({"model_id": str(folder), "task": "text_embedding"})
    [vectors] = dynamic_batch(service.handle, [{"inputs": [LONG, "short"]}])
    assert min(_cosines(vectors, st_encode(folder, [LONG, "short"], True))) >= 0.99999


def test_rolling_batch_and_async_modes_answer_the_same_vectors(random_embedder: Callable[[str], Path]) -> None:
    folder = str(random_embedder("mean"))
    [want] = dynamic_batch(_service({"model_id": folder, "task": "text_embedding"}).handle, [{"inputs": TEXTS}])
    rolling = InferenceService("huggingface")
    driver = RollingBatchDriver(rolling.handle)
    driver.init({"model_id": folder, "task": "text_embedding", "rolling_batch": "scheduler"})
    requests = [driver.submit(json_request({"inputs": TEXTS})), driver.submit(json_request({"inputs": []}))]
    driver.run()
    assert driver.steps == 1  # nothing is left for a second step
    assert np.allclose(json.loads(requests[0].text), want, atol=1e-6)
    assert requests[1].code == 400
    service = InferenceService("huggingface")  # DJL's async engine awaits every call, the init call too
    init = Input.from_parts({"model_id": folder, "task": "text_embedding", "async_mode": "true"}, ())
    assert asyncio.run(service.handle(init)) is None
    item = Input.from_parts({"Content-Type": "application/json", "request_tracking_id": "r1"},
                            [("data", json.dumps({"inputs": TEXTS}).encode())])
    reply = asyncio.run(service.handle(item))
    from djl_handlers.io import wire

    record = wire.binary_decode(bytes(reply.content.value_at(0)))
    assert np.allclose(json.loads(record["data"]), want, atol=1e-6)
    cancel = Input.from_parts({"request_tracking_id": "cancel-1", "djl_handlers_cancel": "r1"}, [])
    assert asyncio.run(service.handle(cancel)) is None  # nothing in flight to abort: no reply record


def test_async_mode_gathers_concurrent_requests(random_embedder: Callable[[str], Path]) -> None:
    """Requests awaited while a forward runs share the next one; a bad one fails alone."""
    from djl_handlers.io import wire

    folder = str(random_embedder("mean"))
    [want] = dynamic_batch(_service({"model_id": folder, "task": "text_embedding"}).handle, [{"inputs": TEXTS}])

    async def run() -> tuple[list[Any], list[int]]:
        service = InferenceService("huggingface")
        await service.handle(Input.from_parts({"model_id": folder, "task": "text_embedding", "async_mode": "true"},
                                              ()))
        assert service.pooling is not None
        engine, calls = service.pooling.engine, []
        run_batches = engine.run

        def counted(items: Any) -> Any:
            calls.append(len(items))
            return run_batches(items)

        engine.run = counted  # type: ignore[method-assign]
        bodies: list[Any] = [{"inputs": TEXTS}] * 5 + [{"inputs": []}]
        items = [Input.from_parts({"Content-Type": "application/json", "request_tracking_id": f"r{i}"},
                                  [("data", json.dumps(b).encode())]) for i, b in enumerate(bodies)]
        replies = await asyncio.gather(*(service.handle(item) for item in items))
        return [wire.binary_decode(bytes(r.content.value_at(0))) for r in replies], calls

    records, calls = asyncio.run(run())
    for record in records[:5]:
        assert np.allclose(json.loads(record["data"]), want, atol=1e-6)
    assert int(records[5]["code"]) == 400
    assert sum(calls) == 5 * len(TEXTS) and len(calls) < 5  # the first request alone, the rest together


def test_a_decoder_embeds_with_last_token_pooling(tiny_dir: Path) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    service = _service({"model_id": str(tiny_dir), "task": "embedding", "dtype": "fp32"})
    [vectors] = dynamic_batch(service.handle, [{"inputs": TEXTS[:2]}])
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    model = AutoModel.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()
    for text, got in zip(TEXTS[:2], vectors, strict=True):
        with torch.inference_mode():
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, -1]
        want = torch.nn.functional.normalize(hidden, dim=0).numpy()
        assert np.allclose(got, want, atol=1e-5)


def test_dimensions_cut_a_matryoshka_model_and_refuse_others(random_embedder: Callable[[str], Path],
                                                              tmp_path: Path) -> None:
    import shutil

    from djl_handlers.extensions import API_PROPERTY

    folder = Path(shutil.copytree(random_embedder("mean"), tmp_path / "matryoshka"))
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [16, 32]}), encoding="utf-8")

    def ask(model: Path, dimensions: int) -> Any:
        service = _service({"model_id": str(model), "task": "text_embedding"})
        item = Input.from_parts({"Content-Type": "application/json", API_PROPERTY: "embeddings"},
                                [("data", json.dumps({"input": TEXTS[:2], "dimensions": dimensions}).encode())])
        out = service.handle(item)
        return out.code, json.loads(bytes(out.content.value_at(0)))

    code, full = ask(folder, 32)
    assert code == 200
    code, cut = ask(folder, 16)
    assert code == 200 and [len(d["embedding"]) for d in cut["data"]] == [16, 16]
    for short, whole in zip(cut["data"], full["data"], strict=True):  # Matryoshka: cut, then unit length
        want = np.asarray(whole["embedding"][:16])
        assert np.allclose(short["embedding"], want / np.linalg.norm(want), atol=1e-6)
    code, refused = ask(folder, 8)
    assert code == 400 and refused["error"]["param"] == "dimensions"
    code, plain = ask(random_embedder("mean"), 16)
    assert code == 400 and "Matryoshka" in plain["error"]["message"]


@pytest.mark.parametrize("entry", ["tensorrt_llm", "deepspeed"])
def test_other_entry_points_refuse_a_pooling_task_at_load(tmp_path: Path, entry: str) -> None:
    service = InferenceService(entry)
    with pytest.raises(ConfigError) as caught:
        service.handle(Input.from_parts({"model_id": str(tmp_path), "task": "text_embedding",
                                         "rolling_batch": "auto"}, ()))
    assert caught.value.field == "option.task" and "djl_handlers.huggingface" in caught.value.message


def test_unknown_task_fails_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        InferenceService("huggingface").handle(Input.from_parts({"model_id": str(tmp_path),
                                                                 "task": "summarization"}, ()))
    assert "summarization" in caught.value.message


@pytest.mark.slow
def test_minilm_vectors_equal_sentence_transformers(minilm_dir: Path, st_encode: Any) -> None:
    """The silent bug this kind fixes: a sentence-transformers folder with option.task=text_embedding
    answered generated text; it answers MiniLM's vectors, equal to sentence-transformers'."""
    service = _service({"model_id": str(minilm_dir), "task": "text_embedding"})
    one, many = dynamic_batch(service.handle, [{"inputs": TEXTS[0]}, {"inputs": TEXTS + [LONG]}])
    want = st_encode(minilm_dir, TEXTS + [LONG], True)
    assert min(_cosines([one], want[:1])) >= 0.99999
    assert min(_cosines(many, want)) >= 0.99999
