"""The pooling kinds without a model: the task → kind choice at load, each dialect's parse (shapes,
limits, the field a 400 names) and each dialect's answer shape."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.config.kinds import EMBEDDING, GENERATION, RERANK, detect_kind, kind_of_task
from djl_handlers.config.models import ServingConfig
from djl_handlers.errors import ConfigError, InvalidRequest
from djl_handlers.extensions import API_PROPERTY
from djl_handlers.io import Input
from djl_handlers.pooling.parse import parse_pooling
from djl_handlers.pooling.records import PoolingRequest, PoolingResult
from djl_handlers.pooling.respond import error_answer, success_answer


def _item(body: Any, api: str | None = None, content_type: str = "application/json") -> Input:
    props = {"Content-Type": content_type}
    if api:
        props[API_PROPERTY] = api
    data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
    return Input.from_parts(props, [("data", data)])


@pytest.mark.parametrize(("task", "kind"), [
    ("text_embedding", EMBEDDING), ("text-embedding", EMBEDDING), ("feature-extraction", EMBEDDING),
    ("Text_Classification", RERANK), ("rerank", RERANK), ("score", RERANK), ("text-generation", GENERATION),
    (None, None), ("", None),
])
def test_task_names_their_kind(task: str | None, kind: str | None) -> None:
    assert kind_of_task(task) == kind


def test_a_task_we_do_not_serve_fails_at_load_naming_it() -> None:
    with pytest.raises(ConfigError) as caught:
        kind_of_task("image-segmentation")
    assert "image-segmentation" in caught.value.message and caught.value.field == "option.task"


def _folder(tmp_path: Path, archs: list[str], modules: bool = False) -> str:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": archs}), encoding="utf-8")
    if modules:
        (tmp_path / "modules.json").write_text("[]", encoding="utf-8")
    return str(tmp_path)


@pytest.mark.parametrize(("archs", "modules", "kind"), [
    (["BertModel"], False, EMBEDDING), (["LlamaForCausalLM"], True, EMBEDDING),
    (["BertForSequenceClassification"], False, RERANK), (["LlamaForCausalLM"], False, GENERATION),
])
def test_without_a_task_the_model_folder_decides(tmp_path: Path, archs: list[str], modules: bool, kind: str) -> None:
    assert detect_kind(None, _folder(tmp_path, archs, modules)) == kind


def test_task_wins_over_the_folder(tmp_path: Path) -> None:
    assert detect_kind("text_embedding", _folder(tmp_path, ["LlamaForCausalLM"])) == EMBEDDING


def test_pooling_options_read_and_checked() -> None:
    config = ServingConfig.from_properties({"task": "text_embedding", "pooling": "cls_token", "normalize": "false",
                                            "max_inputs_per_request": "8"})
    assert (config.pooling.pooling, config.pooling.normalize, config.pooling.max_inputs) == ("cls", False, 8)
    with pytest.raises(ConfigError) as caught:
        ServingConfig.from_properties({"pooling": "median"})
    assert caught.value.field == "option.pooling"


def test_lmi_embedding_shapes() -> None:
    one = parse_pooling(_item({"inputs": "a"}), EMBEDDING, 10)
    assert (one.texts, one.single, one.dialect) == (["a"], True, "lmi")
    many = parse_pooling(_item({"inputs": ["a", "b"], "parameters": {"truncate": False}}), EMBEDDING, 10)
    assert (many.texts, many.single, many.truncate) == (["a", "b"], False, False)
    bare = parse_pooling(_item(["x", "y"]), EMBEDDING, 10)
    assert bare.texts == ["x", "y"] and not bare.single
    text = parse_pooling(_item(b"plain text", content_type="text/plain"), EMBEDDING, 10)
    assert (text.texts, text.single) == (["plain text"], True)


@pytest.mark.parametrize(("body", "api", "field"), [
    ({"inputs": []}, None, "inputs"),
    ({"inputs": ["a", 3]}, None, "inputs[1]"),
    ({"inputs": ["a"] * 11}, None, "inputs"),
    ({"inputs": "a", "colour": 1}, None, "colour"),
    ({"input": []}, "embeddings", "input"),
    ({"input": ["a", {"x": 1}]}, "embeddings", "input[1]"),
    ({"input": "a", "encoding_format": "hex"}, "embeddings", "encoding_format"),
    ({"input": "a", "dimensions": 0}, "embeddings", "dimensions"),
    ({"query": "q", "documents": ["a", 5]}, "rerank", "documents[1]"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "rerank", "top_n"),
    ({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "score", "text_2"),
])
def test_bad_input_names_the_field(body: Any, api: str | None, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_pooling(_item(body, api), EMBEDDING, 10)
    assert caught.value.field == field and caught.value.status == 400


def test_openai_inputs_strings_and_token_ids() -> None:
    assert parse_pooling(_item({"input": [1, 2, 3]}, "embeddings"), EMBEDDING, 10).texts == [[1, 2, 3]]
    mixed = parse_pooling(_item({"input": ["a", [4, 5]], "encoding_format": "base64"}, "embeddings"), EMBEDDING, 10)
    assert mixed.texts == ["a", [4, 5]] and mixed.encoding_format == "base64"


def test_cross_encoder_shapes() -> None:
    query = parse_pooling(_item({"query": "q", "texts": ["a", "b"]}), RERANK, 10)
    assert query.pairs == [("q", "a"), ("q", "b")] and not query.single
    pair = parse_pooling(_item({"text": "t", "text_pair": "p"}), RERANK, 10)
    assert pair.pairs == [("t", "p")] and pair.single
    listed = parse_pooling(_item([{"text": "t", "text_pair": "p"}, {"key": "k", "value": "v"}]), RERANK, 10)
    assert listed.pairs == [("t", "p"), ("k", "v")]
    score = parse_pooling(_item({"text_1": "q", "text_2": ["a", "b"]}, "score"), RERANK, 10)
    assert score.pairs == [("q", "a"), ("q", "b")]


def test_embeddings_route_on_a_reranker_is_a_400() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_pooling(_item({"input": "a"}, "embeddings"), RERANK, 10)
    assert caught.value.field == "route"


def test_answer_shapes() -> None:
    vectors = PoolingResult(vectors=[[0.5, -1.0]], prompt_tokens=3)
    assert success_answer(PoolingRequest("lmi", texts=["a"], single=True), vectors, "m") == [0.5, -1.0]
    assert success_answer(PoolingRequest("lmi", texts=["a"]), vectors, "m") == [[0.5, -1.0]]
    openai = success_answer(PoolingRequest("embeddings", texts=["a"], encoding_format="base64"), vectors, "m")
    assert isinstance(openai, dict) and openai["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    packed = base64.b64decode(openai["data"][0]["embedding"])
    assert list(struct.unpack("<2f", packed)) == [0.5, -1.0]
    scores = PoolingResult(scores=[[0.1], [0.9], [0.5]], prompt_tokens=9)
    pairs = [("q", "a"), ("q", "b"), ("q", "c")]
    ranked = success_answer(PoolingRequest("rerank", pairs=pairs, top_n=2), scores, "m")
    assert isinstance(ranked, dict)
    assert [(r["index"], r["document"]["text"]) for r in ranked["results"]] == [(1, "b"), (2, "c")]
    scored = success_answer(PoolingRequest("score", pairs=pairs), scores, "m")
    assert isinstance(scored, dict) and [d["score"] for d in scored["data"]] == [0.1, 0.9, 0.5]


def test_errors_in_each_dialect() -> None:
    exc = InvalidRequest("bad", field="input[1]")
    assert error_answer("embeddings", exc)["error"]["param"] == "input[1]"
    assert error_answer("lmi", exc)["field"] == "input[1]"


def test_check_names_the_kind_and_refuses_an_engine_that_does_not_serve_it(tmp_path: Path) -> None:
    from djl_handlers.config.preflight import preflight

    folder = _folder(tmp_path, ["BertForSequenceClassification"])
    assert preflight("djl_handlers.huggingface", folder, {"model_id": folder}, {}).model_kind == RERANK
    with pytest.raises(ConfigError) as caught:
        preflight("djl_handlers.vllm", folder, {"model_id": folder, "task": "rerank", "rolling_batch": "vllm"}, {})
    assert caught.value.field == "option.task" and "rerank" in caught.value.message
    with pytest.raises(ConfigError):
        preflight("djl_handlers.tensorrt_llm", folder, {"model_id": folder, "task": "text_embedding"}, {})
    embedder = preflight("djl_handlers.vllm", folder, {"model_id": folder, "task": "text_embedding",
                                                       "rolling_batch": "vllm"}, {})
    assert embedder.model_kind == EMBEDDING


def test_a_generator_refuses_the_pooling_routes_naming_the_route() -> None:
    from djl_handlers.dialects.dispatch import parse_request
    from djl_handlers.request.parser import ParserSettings

    with pytest.raises(InvalidRequest) as caught:
        parse_request(_item({"input": "a"}, "embeddings"), ParserSettings(engine="huggingface"))
    assert caught.value.field == "route" and "embedding" in caught.value.message
