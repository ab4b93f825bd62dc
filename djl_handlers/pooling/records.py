"""The request and result records of the pooling kinds (embeddings, reranking); no ML library.

A ``PoolingRequest`` is what one client request asks: texts to embed (strings or token ids) or
pairs to score, in which API dialect it asked (the answer's shape), and that dialect's options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

__all__ = ["DIALECTS", "PoolingRequest", "PoolingResult", "TextInput"]

TextInput = Union[str, list[int]]  # a text, or token ids (OpenAI's /v1/embeddings accepts both)

# lmi: DJL's schemas (text embedding, cross-encoder); embeddings: OpenAI /v1/embeddings;
# rerank: /v1/rerank (vLLM, Cohere, Jina); score: vLLM's /v1/score
DIALECTS: tuple[str, ...] = ("lmi", "embeddings", "rerank", "score")


@dataclass(frozen=True)
class PoolingRequest:
    """One request. ``texts`` for embeddings; ``pairs`` (query, document) for scores. ``single``: the
    LMI body held one text (or one pair), so the answer is one vector (one score list), not a list."""

    dialect: str
    texts: list[TextInput] = field(default_factory=list)
    pairs: list[tuple[str, str]] = field(default_factory=list)
    single: bool = False
    truncate: bool = True
    normalize: Optional[bool] = None  # None: the model's option.normalize
    dimensions: Optional[int] = None
    encoding_format: str = "float"
    model: Optional[str] = None
    top_n: Optional[int] = None
    return_documents: bool = True
    request_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """How many texts (or pairs) the request carries."""
        return len(self.pairs) if self.pairs else len(self.texts)


@dataclass(frozen=True)
class PoolingResult:
    """The engine's answer to one request: ``vectors`` (embeddings) or ``scores`` (one list of label
    scores per pair, as DJL's cross-encoder returns them), and the prompt tokens it read."""

    vectors: list[list[float]] = field(default_factory=list)
    scores: list[list[float]] = field(default_factory=list)
    prompt_tokens: int = 0
