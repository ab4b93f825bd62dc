"""The transformers engine of the pooling kinds: an encoder or decoder's pooled hidden states
(embeddings) or a sequence classifier's scores (a cross-encoder), in length-sorted batches.

Loading: ``AutoModel`` for an embedder (a decoder folder loads without its language-model head),
``AutoModelForSequenceClassification`` for a reranker; fp32 unless ``option.dtype`` says otherwise.
A sentence-transformers folder sets the defaults as sentence-transformers itself reads them: the
pooling of ``1_Pooling/config.json`` and ``max_seq_length`` of ``sentence_bert_config.json``.

Batching: the texts of every request in a call are sorted by length and cut into batches of at most
``option.pooling_batch_tokens`` padded tokens, so a short text never pads to a long one's length
beyond its own batch.

On the CPU: torch's threads follow ``option.cpu_threads`` (``adaptive``, the default: fewer while
other processes hold the cores, as in the generation engine); the linear layers run on prepacked
weights (``option.cpu_linear``: oneDNN's or MKL's layout); and a BERT-family embedder runs without
padding (:mod:`~djl_handlers.pooling.packed`: the texts end to end, attention per text) in forwards of
at most :data:`PACKED_TOKENS` tokens (fewer when ``option.pooling_batch_tokens`` says so), once a
check at load found it pooling what the padded forward pools. torch and transformers are imported
inside functions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from djl_handlers.config.kinds import EMBEDDING, normalize_pooling
from djl_handlers.engines.hf.loader import resolve_device, resolve_model_id, set_torch_threads
from djl_handlers.errors import ConfigError
from djl_handlers.pooling.packed import PackedEncoder, agrees, check, pool_packed
from djl_handlers.pooling.pool import l2_normalize, pool

if TYPE_CHECKING:
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.hf.cpu.threads import ThreadGovernor

__all__ = ["Encoded", "HfPoolingEngine"]

LOG = logging.getLogger(__name__)
Encoded = dict[str, list[int]]  # input_ids (and token_type_ids) of one text or pair
_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: Tokens per packed forward: the activations of 2048 tokens stay closer to the caches than 16384
#: (measured on MiniLM, 2-core AVX-512 CPU: 1024-4096 tokens equally fast, 512 slower, 16384 1.2x slower).
PACKED_TOKENS = 2048


def _st_pooling(folder: Path) -> Optional[str]:
    """The pooling mode a sentence-transformers folder's ``1_Pooling/config.json`` turns on."""
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        path = next(m["path"] for m in modules if str(m.get("type", "")).endswith(".Pooling"))
        config = json.loads((folder / path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, StopIteration, KeyError, TypeError):
        return None
    for key in ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                "pooling_mode_lasttoken", "pooling_mode_mean_tokens"):
        if config.get(key):
            return normalize_pooling(key[len("pooling_mode_"):], f"{path}/config.json")
    return None


def _st_max_length(folder: Path) -> Optional[int]:
    try:
        value = json.loads((folder / "sentence_bert_config.json").read_text(encoding="utf-8")).get("max_seq_length")
    except (OSError, ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


class HfPoolingEngine:
    """Embeds texts or scores pairs with one transformers model (see the module docstring)."""

    name = "huggingface-pooling"

    def __init__(self, model: Any, tokenizer: Any, kind: str, *, pooling: str, max_length: int,
                 batch_tokens: int, device: str) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.kind = kind
        self.pooling = pooling
        self.max_length = max_length
        self.batch_tokens = batch_tokens
        self.device = device
        config = model.config
        self.hidden_size = int(getattr(config, "hidden_size", 0) or 0)
        self.num_labels = int(getattr(config, "num_labels", 1) or 1)
        self.matryoshka: list[int] | bool = (getattr(config, "matryoshka_dimensions", None)
                                             or bool(getattr(config, "is_matryoshka", False)))
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.packed: Optional[PackedEncoder] = None  # set by speed_up_cpu: the padding-free forward
        self.threads: Optional[ThreadGovernor] = None  # option.cpu_threads=adaptive on the CPU

    @property
    def max_model_len(self) -> int:
        """The most tokens one text (or pair) may have; longer ones are truncated or refused."""
        return self.max_length

    @classmethod
    def from_config(cls, config: ServingConfig, kind: str) -> HfPoolingEngine:
        """Load the model ``config`` names for ``kind`` (``ConfigError`` naming the model on failure)."""
        import torch
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

        set_torch_threads(config.hf.torch_threads)
        model_id = resolve_model_id(config.model_id or "")
        common = {"trust_remote_code": config.trust_remote_code, "revision": config.revision,
                  "local_files_only": True}
        dtype = getattr(torch, _DTYPES.get(config.dtype, "float32"))
        loader = AutoModel if kind == EMBEDDING else AutoModelForSequenceClassification
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_id, **common)
            model = loader.from_pretrained(model_id, dtype=dtype, **common)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load {kind} model {model_id!r}: {exc}", field="option.model_id") from exc
        device = resolve_device(config.device)
        model.to(device).eval()
        folder = Path(model_id)
        archs = [str(a) for a in (getattr(model.config, "architectures", None) or [])]
        decoder = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
        pooling = config.pooling.pooling or _st_pooling(folder) or ("lasttoken" if decoder else "mean")
        limits = [n for n in (config.max_model_len, _st_max_length(folder),
                              getattr(model.config, "max_position_embeddings", None),
                              getattr(tokenizer, "model_max_length", None)) if isinstance(n, int) and 0 < n < 10**6]
        max_length = limits[0] if config.max_model_len or _st_max_length(folder) else min(limits or [512])
        LOG.info("%s model %s: pooling=%s, max length %d tokens, %s on %s", kind, model_id, pooling, max_length,
                 dtype, device)
        engine = cls(model, tokenizer, kind, pooling=pooling, max_length=max_length,
                     batch_tokens=config.pooling.batch_tokens, device=device)
        if device == "cpu":
            engine.speed_up_cpu(config.hf.cpu_linear)
            if config.hf.cpu_threads == "adaptive" and torch.get_num_threads() > 1:
                from djl_handlers.engines.hf.cpu.threads import ThreadGovernor

                engine.threads = ThreadGovernor(torch.get_num_threads())
        return engine

    def speed_up_cpu(self, cpu_linear: str) -> None:
        """On the CPU: prepacked linear layers unless ``cpu_linear`` (``option.cpu_linear``) is
        ``torch`` (fp32 GEMMs where :func:`~djl_handlers.engines.hf.cpu.isa.fp32_library` says); the
        packed forward for an embedder
        whose layout :func:`~djl_handlers.pooling.packed.check` accepts and whose pooled vectors it
        reproduces (:func:`~djl_handlers.pooling.packed.agrees`). Each choice is logged."""
        if cpu_linear != "torch":
            from djl_handlers.engines.hf.cpu import isa, linear

            count = linear.prepack_linears(self.model, isa.fp32_library(cpu_linear))
            LOG.info("pooling model: %d nn.Linear layers on prepacked weights (%s)", count,
                     linear.describe_libraries(self.model))
        if self.kind != EMBEDDING:
            return
        why = check(self.model)
        if why is None:
            candidate = PackedEncoder(self.model)
            if agrees(candidate, self.model, self.tokenizer, self.pooling):
                self.packed = candidate
            else:
                why = "its pooled vectors differ from the padded forward's on the check texts"
        LOG.info("pooling model: %s", "texts packed without padding, attention per text" if why is None
                 else f"padded batches ({why})")

    # -- tokens ------------------------------------------------------------------------------
    def encode_text(self, text: str | list[int], truncate: bool) -> Encoded:
        """One text (or token ids, taken as they are) → its ids; over-long raises ``ValueError``."""
        if isinstance(text, list):
            ids = list(text)
        else:
            ids = self.tokenizer(text, truncation=False)["input_ids"]
        if len(ids) > self.max_length:
            if not truncate:
                raise ValueError(f"{len(ids)} tokens, over the model's {self.max_length}")
            if isinstance(text, list):
                ids = ids[:self.max_length]
            else:
                ids = self.tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"]
        return {"input_ids": ids}

    def encode_pair(self, first: str, second: str, truncate: bool) -> Encoded:
        """One (query, document) pair → its ids and token types; over-long raises ``ValueError``."""
        if not truncate:
            full = self.tokenizer(first, second, truncation=False)
            if len(full["input_ids"]) > self.max_length:
                raise ValueError(f"{len(full['input_ids'])} tokens, over the model's {self.max_length}")
        encoded = self.tokenizer(first, second, truncation=True, max_length=self.max_length)
        return {k: list(v) for k, v in encoded.items() if k in ("input_ids", "token_type_ids")}

    # -- forward -----------------------------------------------------------------------------
    def _batches(self, items: Sequence[Encoded]) -> list[list[int]]:
        """Indices sorted by length, cut so each batch pads to at most ``batch_tokens`` tokens."""
        order = sorted(range(len(items)), key=lambda i: len(items[i]["input_ids"]), reverse=True)
        batches: list[list[int]] = []
        for index in order:
            if batches:
                longest = len(items[batches[-1][0]]["input_ids"])
                if longest * (len(batches[-1]) + 1) <= self.batch_tokens:
                    batches[-1].append(index)
                    continue
            batches.append([index])
        return batches

    def _tensors(self, items: list[Encoded]) -> dict[str, Any]:
        import torch

        width = max(len(item["input_ids"]) for item in items)
        out: dict[str, Any] = {}
        for key in items[0]:
            pad = self.pad_id if key == "input_ids" else 0
            rows = [item[key] + [pad] * (width - len(item[key])) for item in items]
            out[key] = torch.tensor(rows, dtype=torch.long, device=self.device)
        lengths = [len(item["input_ids"]) for item in items]
        out["attention_mask"] = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], dtype=torch.long,
                                             device=self.device)
        return out

    def run(self, items: Sequence[Encoded]) -> tuple[Any, list[int]]:
        """Embeddings (pooled, not normalised) or scores for ``items``, in their order; and the
        batch sizes used (for the metrics)."""
        import torch

        if self.packed is not None:
            return self._run_packed(self.packed, items)
        results: list[Any] = [None] * len(items)
        sizes: list[int] = []
        with torch.inference_mode():
            for batch in self._batches(items):
                tensors = self._tensors([items[i] for i in batch])
                started = self.threads.start() if self.threads is not None else 0.0
                if self.kind == EMBEDDING:
                    out = self.model(**tensors)
                    rows = pool(out.last_hidden_state, tensors["attention_mask"], self.pooling)
                else:
                    rows = self._activate(self.model(**tensors).logits)
                if self.threads is not None:
                    self.threads.finish(started)
                for position, index in enumerate(batch):
                    results[index] = rows[position].float()
                sizes.append(len(batch))
        return (torch.stack(results) if results else torch.empty(0)), sizes

    def _run_packed(self, packed: PackedEncoder, items: Sequence[Encoded]) -> tuple[Any, list[int]]:
        """:meth:`run` on the packed forward: ``items`` in their order, in chunks of at most
        ``min(PACKED_TOKENS, batch_tokens)`` tokens (a longer text alone)."""
        import torch

        budget = min(PACKED_TOKENS, self.batch_tokens)
        chunks: list[list[Encoded]] = []
        tokens = 0
        for item in items:
            if not chunks or tokens + len(item["input_ids"]) > budget:
                chunks.append([])
                tokens = 0
            chunks[-1].append(item)
            tokens += len(item["input_ids"])
        rows = []
        with torch.inference_mode():
            for chunk in chunks:
                started = self.threads.start() if self.threads is not None else 0.0
                hidden, lengths = packed.hidden(chunk)
                rows.append(pool_packed(hidden, lengths, self.pooling).float())
                if self.threads is not None:
                    self.threads.finish(started)
        return (torch.cat(rows) if rows else torch.empty(0)), [len(chunk) for chunk in chunks]

    def _activate(self, logits: Any) -> Any:
        """DJL's and sentence-transformers' default: a sigmoid for one label; raw logits otherwise."""
        return logits.sigmoid() if self.num_labels == 1 else logits

    @staticmethod
    def normalize(vectors: Any) -> Any:
        """Rows at unit length."""
        return l2_normalize(vectors)
