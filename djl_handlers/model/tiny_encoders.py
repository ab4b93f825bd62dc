"""Tiny random-weight BERT models for the pooling kinds, built at a fixed seed with the tokenizer of
the embedded embedder (all-MiniLM-L6-v2): the same weights on every machine and every call.

* ``random_cross_encoder_dir``: ``BertForSequenceClassification`` with one label, a stand-in
  reranker whose scores are meaningless but exactly reproducible (the reranker example serves it
  under the name ``random-bert-cross-encoder-seed0``);
* ``random_embedder_dir``: ``BertModel`` as a sentence-transformers folder whose
  ``1_Pooling/config.json`` turns on ``pooling`` (no ``Normalize`` module).

Both are for mechanics and equality tests, not for quality. torch/transformers are imported inside.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from djl_handlers.model.embedder import MODEL_DIR_NAME, embedder_dir, pooling_model_target

__all__ = ["CROSS_ENCODER_NAME", "pooling_model_dir", "random_cross_encoder_dir", "random_embedder_dir"]

CROSS_ENCODER_NAME = "random-bert-cross-encoder-seed0"
MARKER = "djl_handlers_tiny.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_SHAPE: dict[str, Any] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
          "max_position_embeddings": 128}
_ST_POOLING = {"mean": "mean_tokens", "cls": "cls_token", "max": "max_tokens", "mean_sqrt_len": "mean_sqrt_len_tokens",
               "lasttoken": "lasttoken"}


def _current(out: Path, settings: dict[str, object]) -> bool:
    try:
        return bool(json.loads((out / MARKER).read_text(encoding="utf-8")) == settings)
    except (OSError, ValueError):
        return False


def _build(out: Path, settings: dict[str, object], classifier: bool, seed: int) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    source = embedder_dir()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config: Any = BertConfig(vocab_size=30522, **_SHAPE)
    config.num_labels = 1
    model = BertForSequenceClassification(config) if classifier else BertModel(config)
    model.eval().save_pretrained(str(out), safe_serialization=True)
    for name in _TOKENIZER_FILES:
        shutil.copy(source / name, out / name)
    (out / MARKER).write_text(json.dumps(settings), encoding="utf-8")


def random_cross_encoder_dir(path: str | Path, *, seed: int = 0) -> Path:
    """Build (or reuse) the random cross-encoder folder at ``path``."""
    out = Path(path)
    settings: dict[str, object] = {"kind": "cross-encoder", "seed": seed, "version": 1}
    if not _current(out, settings):
        _build(out, settings, classifier=True, seed=seed)
    return out


def random_embedder_dir(path: str | Path, *, pooling: str = "mean", seed: int = 0, max_seq_length: int = 64) -> Path:
    """Build (or reuse) a random sentence-transformers embedder folder at ``path``."""
    out = Path(path)
    settings: dict[str, object] = {"kind": "embedder", "seed": seed, "pooling": pooling,
                                   "max_seq_length": max_seq_length, "version": 1}
    if _current(out, settings):
        return out
    _build(out, settings, classifier=False, seed=seed)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (out / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (out / "1_Pooling").mkdir(exist_ok=True)
    flags = {f"pooling_mode_{mode}": mode == _ST_POOLING[pooling] for mode in _ST_POOLING.values()}
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": _SHAPE["hidden_size"],
                                                               **flags}), encoding="utf-8")
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}), encoding="utf-8")
    return out


def pooling_model_dir(name: str) -> Path:
    """The folder of the embedded pooling model ``name`` (``embedder.POOLING_MODELS``), unpacked (the
    embedder) or built (the random cross-encoder) first if needed."""
    if name == MODEL_DIR_NAME:
        return embedder_dir()
    return random_cross_encoder_dir(pooling_model_target(name))
