"""The OpenAPI description of the embedding and reranking routes (``/v1/embeddings``, ``/v1/rerank``
and its aliases, ``/v1/score`` and ``/score``), as :mod:`djl_handlers.pooling.parse` reads the bodies
and :mod:`djl_handlers.pooling.respond` writes the answers. A model of another kind answers them 400."""

from __future__ import annotations

from typing import Any

__all__ = ["pooling_paths"]

_JSON = "application/json"
_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
_STRINGS = {"type": "array", "minItems": 1, "items": _STR}
_OPT_STR = {"anyOf": [_STR, {"type": "null"}]}
_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "properties": {"message": _STR, "type": _STR, "param": _OPT_STR, "code": _INT}}}}


def _object(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": required, "additionalProperties": False, "properties": properties}


def _operation(summary: str, body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {_JSON: {"schema": body}}},
        "responses": {"200": {"description": "the answer", "content": {_JSON: {"schema": answer}}},
                      "default": {"description": "an error (400 names the field in param)",
                                  "content": {_JSON: {"schema": _ERROR}}}},
    }}


def _embeddings() -> dict[str, Any]:
    body = _object(["input"], {
        "input": {"anyOf": [_STR, _STRINGS, _IDS, {"type": "array", "minItems": 1, "items": {"anyOf": [_STR, _IDS]}}]},
        "model": _OPT_STR, "encoding_format": {"enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "minimum": 1}, "user": _OPT_STR, "truncate": _BOOL, "normalize": _BOOL})
    item = {"type": "object", "properties": {"object": {"const": "embedding"}, "index": _INT,
                                             "embedding": {"anyOf": [{"type": "array", "items": _NUM}, _STR]}}}
    usage = {"type": "object", "properties": {"prompt_tokens": _INT, "total_tokens": _INT}}
    answer = {"type": "object", "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": item},
                                               "model": _STR, "usage": usage}}
    return _operation("OpenAI embeddings (an embedding model)", body, answer)


def _rerank() -> dict[str, Any]:
    document = {"anyOf": [_STR, _object(["text"], {"text": _STR})]}
    body = _object(["query", "documents"], {
        "query": _STR, "documents": {"type": "array", "minItems": 1, "items": document}, "model": _OPT_STR,
        "top_n": {"type": "integer", "minimum": 1}, "return_documents": _BOOL, "truncate": _BOOL,
        "max_chunks_per_doc": {}, "rank_fields": {}, "user": _OPT_STR})
    result = {"type": "object", "properties": {"index": _INT, "relevance_score": _NUM,
                                               "document": {"type": "object", "properties": {"text": _STR}}}}
    answer = {"type": "object", "properties": {"id": _STR, "model": _STR, "results": {"type": "array", "items": result},
                                               "usage": {"type": "object", "properties": {"total_tokens": _INT}}}}
    return _operation("Rerank documents by a query (vLLM, Cohere and Jina clients)", body, answer)


def _score() -> dict[str, Any]:
    side = {"anyOf": [_STR, _STRINGS]}
    body = _object(["text_1", "text_2"], {"text_1": side, "text_2": side, "model": _OPT_STR, "truncate": _BOOL,
                                          "user": _OPT_STR})
    item = {"type": "object", "properties": {"index": _INT, "object": {"const": "score"}, "score": _NUM}}
    answer = {"type": "object", "properties": {"id": _STR, "object": {"const": "list"}, "created": _INT,
                                               "model": _STR, "data": {"type": "array", "items": item},
                                               "usage": {"type": "object"}}}
    return _operation("Score text pairs (vLLM)", body, answer)


def pooling_paths() -> dict[str, Any]:
    """The path items of the embedding and reranking routes."""
    rerank, score = _rerank(), _score()
    return {"/v1/embeddings": _embeddings(), "/v1/rerank": rerank, "/v2/rerank": rerank, "/rerank": rerank,
            "/v1/score": score, "/score": score}
