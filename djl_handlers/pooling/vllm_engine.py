"""The vLLM engine of the embedding kind: vLLM's pooling runner (``LLM(runner="pooling")``), fed the
token ids the service tokenized, answering pooled vectors that the service normalises (vLLM's own
activation is turned off, so ``option.normalize`` means the same on both engines).

vLLM pools by ``CLS``, ``LAST`` or ``MEAN`` only: ``option.pooling`` ``max`` or ``mean_sqrt_len`` is a
``ConfigError`` at load; unset, vLLM reads the sentence-transformers folder as it does for ``LLM.embed``.
Rerankers are not served here (a ``ConfigError`` at load names ``option.task``). The same engine serves
sync and async mode (the service runs one call at a time in a worker thread). vllm is imported inside.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from djl_handlers.config.kinds import EMBEDDING
from djl_handlers.errors import ConfigError
from djl_handlers.pooling.hf_engine import Encoded, HfPoolingEngine

if TYPE_CHECKING:
    from djl_handlers.config.models import ServingConfig

__all__ = ["VllmPoolingEngine"]

LOG = logging.getLogger(__name__)
_VLLM_POOLING = {"cls": "CLS", "lasttoken": "LAST", "mean": "MEAN"}


class VllmPoolingEngine(HfPoolingEngine):
    """Embeds with vLLM's pooling runner; tokenization and truncation are the HF engine's."""

    name = "vllm-pooling"

    def __init__(self, llm: Any, tokenizer: Any, *, max_length: int, hidden_size: int, matryoshka: Any) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.kind = EMBEDDING
        self.pooling = "vllm"
        self.max_length = max_length
        self.batch_tokens = 0
        self.device = "vllm"
        self.hidden_size = hidden_size
        self.num_labels = 1
        self.matryoshka = matryoshka
        self.pad_id = 0

    @classmethod
    def from_config(cls, config: ServingConfig, kind: str) -> VllmPoolingEngine:
        """Start vLLM's pooling runner for ``config``'s model (``ConfigError`` for what it cannot serve)."""
        if kind != EMBEDDING:
            raise ConfigError(f"option.task={config.pooling.task or kind!r}: djl_handlers.vllm serves embedding "
                              "models only here; serve a reranker with djl_handlers.huggingface", field="option.task")
        pooling = config.pooling.pooling
        if pooling is not None and pooling not in _VLLM_POOLING:
            raise ConfigError(f"option.pooling={pooling!r} is not one vLLM's pooling runner has; allowed on "
                              f"djl_handlers.vllm: {', '.join(_VLLM_POOLING)}", field="option.pooling")
        from vllm import LLM

        from djl_handlers.engines.external.vllm_config import engine_args_kwargs

        kwargs = engine_args_kwargs(config)
        pooler: dict[str, Any] = {"use_activation": False}  # the service normalises (option.normalize)
        if pooling is not None:
            pooler["pooling_type"] = _VLLM_POOLING[pooling]
        llm = LLM(runner="pooling", pooler_config=pooler, **kwargs)
        model_config = llm.llm_engine.model_config
        hf_config = model_config.hf_config
        matryoshka = getattr(hf_config, "matryoshka_dimensions", None) or bool(getattr(hf_config, "is_matryoshka",
                                                                                       False))
        LOG.info("embedding model %s on vLLM's pooling runner: max length %d tokens", kwargs["model"],
                 model_config.max_model_len)
        return cls(llm, llm.get_tokenizer(), max_length=int(model_config.max_model_len),
                   hidden_size=int(getattr(hf_config, "hidden_size", 0) or 0), matryoshka=matryoshka)

    def run(self, items: Sequence[Encoded]) -> tuple[Any, list[int]]:
        """Pooled vectors for ``items`` (vLLM schedules its own batches); one batch of all for the metrics."""
        import torch
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(item["input_ids"])) for item in items]
        outputs = self.llm.embed(prompts, use_tqdm=False)
        rows = [torch.as_tensor(out.outputs.embedding, dtype=torch.float32) for out in outputs]
        return torch.stack(rows), [len(items)]
