"""The answer bodies of the pooling kinds per API dialect (pure functions, no ML library):

* ``lmi``: DJL's shapes: one vector (a list of floats) for one text, a list of vectors for a list;
  a cross-encoder's label scores (``[s]`` per pair, a list of them for a list);
* ``embeddings``: OpenAI's ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
  "model", "usage": {"prompt_tokens", "total_tokens"}}``; ``encoding_format=base64`` sends each vector
  as base64 of little-endian float32, as OpenAI does;
* ``rerank``: vLLM's (Cohere and Jina clients read it) ``{"id", "model", "usage": {"total_tokens"},
  "results": [{"index", "document": {"text"}, "relevance_score"}]}``, best first, ``top_n`` kept;
* ``score``: vLLM's ``{"id", "object": "list", "created", "model", "data": [{"index", "object":
  "score", "score"}], "usage"}``.

Errors: DJL's ``Output.error`` body for ``lmi``, OpenAI's ``{"error": {...}}`` for the others.
"""

from __future__ import annotations

import base64
import struct
import time
from typing import Any

from djl_handlers.dialects.openai.response import openai_error_object
from djl_handlers.errors import DjlHandlersError, error_body, message_of, status_of
from djl_handlers.pooling.records import PoolingRequest, PoolingResult

__all__ = ["error_answer", "success_answer"]


def _base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _score(labels: list[float]) -> float:
    """One relevance score: the only label's, else the last label's (a two-class model's 'relevant')."""
    return labels[-1]


def success_answer(request: PoolingRequest, result: PoolingResult, model: str) -> dict[str, Any] | list[Any]:
    """The JSON body for ``request`` answered by ``result``; ``model`` is the served model's name."""
    name = request.model or model
    tokens = result.prompt_tokens
    suffix = request.request_id or f"{time.time_ns():x}"
    if request.dialect == "embeddings":
        data: list[dict[str, Any]] = [{"object": "embedding", "index": i,
                 "embedding": _base64(v) if request.encoding_format == "base64" else v}
                for i, v in enumerate(result.vectors)]
        return {"object": "list", "data": data, "model": name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    if request.dialect == "rerank":
        ranked = sorted(range(len(result.scores)), key=lambda i: -_score(result.scores[i]))
        results = []
        for index in ranked[:request.top_n] if request.top_n else ranked:
            entry: dict[str, Any] = {"index": index, "relevance_score": _score(result.scores[index])}
            if request.return_documents:
                entry["document"] = {"text": request.pairs[index][1]}
            results.append(entry)
        return {"id": f"rerank-{suffix}", "model": name, "usage": {"total_tokens": tokens}, "results": results}
    if request.dialect == "score":
        scored: list[dict[str, Any]] = [{"index": i, "object": "score", "score": _score(s)}
                                        for i, s in enumerate(result.scores)]
        return {"id": f"score-{suffix}", "object": "list", "created": int(time.time()), "model": name,
                "data": scored, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    rows: list[Any] = result.vectors if not request.pairs else result.scores
    return rows[0] if request.single else rows


def error_answer(dialect: str, exc: BaseException) -> dict[str, Any]:
    """The JSON error body for a failed request of ``dialect``."""
    if dialect in ("embeddings", "rerank", "score"):
        field = exc.field if isinstance(exc, DjlHandlersError) else None
        return openai_error_object(status_of(exc), message_of(exc), field)
    return error_body(exc)
