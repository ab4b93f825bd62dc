"""The model kind a model directory serves, chosen once at load: generation, embedding or reranking.

``option.task`` names it with DJL's, SageMaker's and vLLM's words (case-insensitive, ``-`` and ``_``
alike): ``text_generation`` (and ``text2text_generation``, ``chat``, ``generate``, and for
vision-language models ``image_text_to_text``, ``visual_question_answering``) for generation;
``text_embedding``, ``feature_extraction``, ``sentence_similarity``, ``embedding``/``embed`` for
embeddings; ``text_classification``, ``cross_encoder``, ``rerank``/``reranking``, ``score`` for a
cross-encoder's relevance scores. Unset, the model's ``config.json`` decides: a
``*ForSequenceClassification`` architecture is a reranker, a sentence-transformers folder
(``modules.json``) or an encoder without a language-model head (``BertModel``...) an embedder, anything
else generation. A task we do not serve is a ``ConfigError`` that names it: never a silent fallback to
generation. The options of the pooling kinds (``PoolingOptions``) have their one typed home here.

No ML library is imported; nothing runs at import time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from djl_handlers.config.reader import Reader
from djl_handlers.errors import ConfigError

__all__ = ["EMBEDDING", "GENERATION", "POOLING_MODES", "RERANK", "PoolingOptions", "check_kind_engine", "detect_kind",
           "kind_of_task", "read_pooling"]

GENERATION = "generation"
EMBEDDING = "embedding"
RERANK = "rerank"

_TASKS: dict[str, str] = {
    "text_generation": GENERATION, "text2text_generation": GENERATION, "chat": GENERATION, "generate": GENERATION,
    "image_text_to_text": GENERATION, "visual_question_answering": GENERATION,
    "text_embedding": EMBEDDING, "feature_extraction": EMBEDDING, "sentence_similarity": EMBEDDING,
    "embedding": EMBEDDING, "embed": EMBEDDING,
    "text_classification": RERANK, "cross_encoder": RERANK, "rerank": RERANK, "reranking": RERANK,
    "score": RERANK,
}
# DJL's pooling names (TextEmbeddingTranslator, sentence-transformers' ``1_Pooling/config.json`` keys)
POOLING_MODES: tuple[str, ...] = ("mean", "cls", "max", "mean_sqrt_len", "lasttoken")
_POOLING_ALIASES = {"mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max",
                    "mean_sqrt_len_tokens": "mean_sqrt_len", "last": "lasttoken", "last_token": "lasttoken"}
_ENCODER_SUFFIXES = ("Model",)  # BertModel, XLMRobertaModel: an encoder without a head


def kind_of_task(task: str | None) -> str | None:
    """The kind ``option.task`` names (None when unset); a ``ConfigError`` naming any other task."""
    if task is None or not task.strip():
        return None
    word = task.strip().lower().replace("-", "_")
    if word not in _TASKS:
        allowed = ", ".join(sorted(_TASKS))
        raise ConfigError(f"option.task={task!r} is not served by djl_handlers; allowed: {allowed}",
                          field="option.task")
    return _TASKS[word]


def _config_kind(folder: Path) -> str:
    """The kind a local model folder's files say (generation when they say nothing)."""
    try:
        archs = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        archs = []
    names = [str(a) for a in archs]
    if any(a.endswith("ForSequenceClassification") for a in names):
        return RERANK
    if (folder / "modules.json").is_file():
        return EMBEDDING
    if names and all(a.endswith(_ENCODER_SUFFIXES) and "LMHead" not in a for a in names):
        return EMBEDDING
    return GENERATION


def detect_kind(task: str | None, model_id: str | None) -> str:
    """``option.task`` when set, else what the local model folder ``model_id`` says."""
    named = kind_of_task(task)
    if named is not None:
        return named
    if model_id and Path(model_id).expanduser().is_dir():
        return _config_kind(Path(model_id).expanduser())
    return GENERATION


def check_kind_engine(kind: str, engine: str, task: str | None) -> None:
    """Embedders are served by the HF engine and vLLM's pooling runner, rerankers by the HF engine: a
    ``ConfigError`` naming the task for any other serving engine (TensorRT-LLM, DeepSpeed)."""
    served = {EMBEDDING: ("huggingface", "vllm"), RERANK: ("huggingface",)}.get(kind)
    if served is not None and engine not in served:
        entry = " or ".join(f"djl_handlers.{name}" for name in served)
        raise ConfigError(f"option.task={task or kind!r} ({kind}) is served by option.entryPoint={entry}; the "
                          f"{engine} engine serves text generation only here", field="option.task")


@dataclass(frozen=True)
class PoolingOptions:
    """Options of the embedding and reranking kinds. ``pooling`` None: the sentence-transformers
    folder's ``1_Pooling/config.json``, else ``lasttoken`` for a decoder and ``mean`` for an encoder."""

    task: str | None = None
    pooling: str | None = None
    normalize: bool = True
    max_inputs: int = 2048  # texts (or pairs) one request may carry: OpenAI's limit for /v1/embeddings
    batch_tokens: int = 16384  # padded tokens per forward: bounds a batch's padding and activations


def normalize_pooling(value: str, label: str = "option.pooling") -> str:
    """A pooling name (DJL's or sentence-transformers' spelling) → one of ``POOLING_MODES``."""
    word = value.strip().lower()
    word = _POOLING_ALIASES.get(word, word)
    if word not in POOLING_MODES:
        raise ConfigError(f"{label}={value!r} is invalid; allowed: {', '.join(POOLING_MODES)}", field=label)
    return word


def read_pooling(r: Reader) -> PoolingOptions:
    """The pooling kinds' options from serving.properties (every engine reads ``task``)."""
    pooling = r.text("pooling")
    return PoolingOptions(
        task=r.text("task"),
        pooling=normalize_pooling(pooling) if pooling else None,
        normalize=r.boolean("normalize", True),
        max_inputs=r.integer("max_inputs_per_request", 2048, 1) or 2048,
        batch_tokens=r.integer("pooling_batch_tokens", 16384, 1) or 16384,
    )
