"""One DJL ``Input`` item → a ``PoolingRequest``, in the API dialect the local server's route named
(``extensions.API_PROPERTY``: ``embeddings``, ``rerank``, ``score``), else DJL's own schemas:

* text embedding (DJL's ``TextEmbeddingServingTranslator``): ``{"inputs": "text"}`` → one vector,
  ``{"inputs": ["a", "b"]}`` or a bare JSON list of strings → a list of vectors, a ``text/plain``
  body → one vector; ``parameters`` may set ``normalize`` and ``truncate``;
* cross-encoder (DJL's ``CrossEncoderServingTranslator``): ``{"query": q, "texts": [...]}`` or a
  list of ``{"text", "text_pair"}`` (or ``{"key", "value"}``) objects → a list of score lists; one
  such object → one score list.

Every problem is an ``InvalidRequest`` whose ``field`` names the offending field (``inputs[2]``...).
"""

from __future__ import annotations

from typing import Any, Optional

from djl_handlers.config.kinds import EMBEDDING
from djl_handlers.dialects.dispatch import POOLING_APIS
from djl_handlers.errors import InvalidRequest
from djl_handlers.extensions import API_PROPERTY, REQUEST_ID_PROPERTY
from djl_handlers.pooling.records import PoolingRequest, TextInput
from djl_handlers.request.parser import decode_body

__all__ = ["parse_pooling"]


def parse_pooling(item: Any, kind: str, max_inputs: int) -> PoolingRequest:
    """Parse one item for a model of ``kind`` (``embedding`` or ``rerank``); raises ``InvalidRequest``."""
    api = (item.get_property(API_PROPERTY) or "").strip().lower()
    if api and api not in POOLING_APIS:
        what = "an embedding" if kind == EMBEDDING else "a reranking"
        raise InvalidRequest(f"this model is {what} model: the {api!r} API is not served; use /invocations, "
                             "/v1/embeddings, /v1/rerank or /v1/score", field="route")
    body = decode_body(item)
    request_id = str(item.get_property(REQUEST_ID_PROPERTY) or "")
    if api == "embeddings":
        if kind != EMBEDDING:
            raise InvalidRequest("this model is a reranker (a cross-encoder): /v1/embeddings is not served; use "
                                 "/v1/rerank or /v1/score", field="route")
        request = _openai_embeddings(_object(body), max_inputs)
    elif api == "rerank":
        request = _rerank(_object(body), max_inputs)
    elif api == "score":
        request = _score(_object(body), max_inputs)
    elif kind == EMBEDDING:
        request = _lmi_embedding(body, max_inputs)
    else:
        request = _cross_encoder(body, max_inputs)
    return _with_id(request, request_id)


def _with_id(request: PoolingRequest, request_id: str) -> PoolingRequest:
    from dataclasses import replace

    return replace(request, request_id=request_id)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest(f"request body must be a JSON object, got {type(body).__name__}", field="body")
    return body


def _unknown(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidRequest(f"unknown request field(s) {unknown}; allowed: {list(allowed)}", field=unknown[0])


def _bool(value: Any, name: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false, got {value!r}", field=name)
    return value


def _count(size: int, name: str, max_inputs: int) -> None:
    if size == 0:
        raise InvalidRequest(f"{name} must not be empty", field=name)
    if size > max_inputs:
        raise InvalidRequest(f"{name} holds {size} items; at most {max_inputs} per request "
                             "(option.max_inputs_per_request)", field=name)


def _strings(value: Any, name: str, max_inputs: int) -> list[str]:
    if not isinstance(value, list):
        raise InvalidRequest(f"{name} must be a string or a list of strings, got {type(value).__name__}", field=name)
    _count(len(value), name, max_inputs)
    for index, text in enumerate(value):
        if not isinstance(text, str):
            raise InvalidRequest(f"{name}[{index}] must be a string, got {type(text).__name__}",
                                 field=f"{name}[{index}]")
    return list(value)


def _lmi_embedding(body: Any, max_inputs: int) -> PoolingRequest:
    if isinstance(body, list):  # DJL's older schema: a bare JSON array of strings
        return PoolingRequest("lmi", texts=list(_strings(body, "inputs", max_inputs)))
    body = _object(body)
    _unknown(body, ("inputs", "parameters", "truncate", "normalize"))
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidRequest("parameters must be a JSON object", field="parameters")
    _unknown({f"parameters.{k}": v for k, v in params.items()}, ("parameters.truncate", "parameters.normalize"))
    truncate = _bool(params.get("truncate", body.get("truncate")), "truncate", True)
    normalize = params.get("normalize", body.get("normalize"))
    normalize = None if normalize is None else _bool(normalize, "normalize", True)
    inputs = body.get("inputs")
    if inputs is None:
        raise InvalidRequest("request body must have 'inputs': a string or a list of strings", field="inputs")
    if isinstance(inputs, str):
        return PoolingRequest("lmi", texts=[inputs], single=True, truncate=truncate, normalize=normalize)
    texts: list[TextInput] = list(_strings(inputs, "inputs", max_inputs))
    return PoolingRequest("lmi", texts=texts, truncate=truncate, normalize=normalize)


def _pair(obj: Any, name: str) -> tuple[str, str]:
    if isinstance(obj, dict):
        for first, second in (("text", "text_pair"), ("key", "value")):
            if isinstance(obj.get(first), str) and isinstance(obj.get(second), str):
                return obj[first], obj[second]
    raise InvalidRequest(f"{name} must be an object with string 'text' and 'text_pair' (or 'key' and 'value')",
                         field=name)


def _cross_encoder(body: Any, max_inputs: int) -> PoolingRequest:
    if isinstance(body, list):
        _count(len(body), "inputs", max_inputs)
        return PoolingRequest("lmi", pairs=[_pair(obj, f"inputs[{i}]") for i, obj in enumerate(body)])
    body = _object(body)
    if "query" in body:
        _unknown(body, ("query", "texts", "truncate"))
        query = _query(body.get("query"))
        texts = _strings(body.get("texts"), "texts", max_inputs)
        return PoolingRequest("lmi", pairs=[(query, t) for t in texts],
                              truncate=_bool(body.get("truncate"), "truncate", True))
    return PoolingRequest("lmi", pairs=[_pair(body, "body")], single=True)


def _query(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"query must be a string, got {type(value).__name__}", field="query")
    return value


def _token_ids(value: list[Any], name: str) -> Optional[list[int]]:
    """``value`` as token ids when it is a non-empty list of non-negative integers."""
    if value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        if any(t < 0 for t in value):
            raise InvalidRequest(f"{name} holds a negative token id", field=name)
        return list(value)
    return None


def _openai_input(value: Any, max_inputs: int) -> list[TextInput]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InvalidRequest("input must be a string, a list of strings, a list of token ids or a list of such "
                             f"lists, got {type(value).__name__}", field="input")
    _count(len(value), "input", max_inputs)
    ids = _token_ids(value, "input")
    if ids is not None:
        return [ids]
    texts: list[TextInput] = []
    for index, entry in enumerate(value):
        name = f"input[{index}]"
        if isinstance(entry, str):
            texts.append(entry)
        elif isinstance(entry, list) and (found := _token_ids(entry, name)) is not None:
            texts.append(found)
        else:
            raise InvalidRequest(f"{name} must be a string or a non-empty list of token ids", field=name)
    return texts


def _openai_embeddings(body: dict[str, Any], max_inputs: int) -> PoolingRequest:
    _unknown(body, ("input", "model", "encoding_format", "dimensions", "user", "truncate", "normalize"))
    if "input" not in body:
        raise InvalidRequest("request body must have 'input'", field="input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequest(f"encoding_format must be 'float' or 'base64', got {encoding!r}", field="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1):
        raise InvalidRequest(f"dimensions must be a positive integer, got {dimensions!r}", field="dimensions")
    normalize = body.get("normalize")
    return PoolingRequest(
        "embeddings", texts=_openai_input(body.get("input"), max_inputs), encoding_format=encoding,
        dimensions=dimensions, model=_model(body), truncate=_bool(body.get("truncate"), "truncate", True),
        normalize=None if normalize is None else _bool(normalize, "normalize", True),
    )


def _model(body: dict[str, Any]) -> Optional[str]:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("model must be a string", field="model")
    return model


def _document(value: Any, name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return str(value["text"])
    raise InvalidRequest(f"{name} must be a string or an object with a string 'text'", field=name)


def _rerank(body: dict[str, Any], max_inputs: int) -> PoolingRequest:
    _unknown(body, ("model", "query", "documents", "top_n", "return_documents", "truncate", "max_chunks_per_doc",
                    "rank_fields", "user"))
    query = _query(body.get("query"))
    documents = body.get("documents")
    if not isinstance(documents, list):
        raise InvalidRequest("documents must be a list of strings (or of objects with 'text')", field="documents")
    _count(len(documents), "documents", max_inputs)
    texts = [_document(d, f"documents[{i}]") for i, d in enumerate(documents)]
    top_n = body.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1):
        raise InvalidRequest(f"top_n must be a positive integer, got {top_n!r}", field="top_n")
    return PoolingRequest("rerank", pairs=[(query, t) for t in texts], top_n=top_n, model=_model(body),
                          return_documents=_bool(body.get("return_documents"), "return_documents", True),
                          truncate=_bool(body.get("truncate"), "truncate", True))


def _side(value: Any, name: str, max_inputs: int) -> list[str]:
    return [value] if isinstance(value, str) else _strings(value, name, max_inputs)


def _score(body: dict[str, Any], max_inputs: int) -> PoolingRequest:
    _unknown(body, ("model", "text_1", "text_2", "truncate", "user"))
    for name in ("text_1", "text_2"):
        if name not in body:
            raise InvalidRequest(f"request body must have '{name}'", field=name)
    first = _side(body["text_1"], "text_1", max_inputs)
    second = _side(body["text_2"], "text_2", max_inputs)
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise InvalidRequest(f"text_1 holds {len(first)} texts and text_2 {len(second)}: give one text_1 or as "
                             "many as text_2", field="text_2")
    _count(len(second), "text_2", max_inputs)
    return PoolingRequest("score", pairs=list(zip(first, second, strict=True)), model=_model(body),
                          truncate=_bool(body.get("truncate"), "truncate", True))
