"""The padding-free encoder forward (``pooling/packed.py``) against the model's own padded forward, and
the pooling engine's use of it on the CPU: every pooling mode, token types, the chunking by tokens, the
layouts it refuses and the fall-back when its vectors differ at load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from djl_handlers.config.kinds import EMBEDDING
from djl_handlers.pooling import packed
from djl_handlers.pooling.hf_engine import HfPoolingEngine
from djl_handlers.pooling.pool import pool

pytest_plugins = ["pooling_models"]

TEXTS = ["hello", "A man is eating food in the park while the sun sets behind the hills.", "two words",
         "The weather in the mountains changes quickly in the afternoon."]


def _load(folder: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(folder))


def _padded(model: Any, encoded: dict[str, Any], mode: str) -> Any:
    import torch

    with torch.inference_mode():
        hidden = model(**encoded).last_hidden_state
    return pool(hidden, encoded["attention_mask"], mode)


@pytest.mark.parametrize("mode", ["mean", "cls", "max", "mean_sqrt_len", "lasttoken"])
def test_packed_forward_pools_what_the_padded_forward_pools(random_embedder: Callable[[str], Path],
                                                            mode: str) -> None:
    import torch

    model, tokenizer = _load(random_embedder("mean"))
    assert packed.check(model) is None
    pairs = tokenizer(TEXTS[:2], TEXTS[2:], padding=True, return_tensors="pt")  # token types 0 and 1
    for encoded in (tokenizer(TEXTS, padding=True, return_tensors="pt"), pairs):
        items = [{k: [int(t) for t, m in zip(encoded[k][i], encoded["attention_mask"][i], strict=True) if m]
                  for k in ("input_ids", "token_type_ids")} for i in range(len(encoded["input_ids"]))]
        with torch.inference_mode():
            hidden, lengths = packed.PackedEncoder(model).hidden(items)
            got = packed.pool_packed(hidden, lengths, mode)
        assert lengths == encoded["attention_mask"].sum(1).tolist()
        assert hidden.shape[0] == sum(lengths)  # no padding token was run
        torch.testing.assert_close(got, _padded(model, dict(encoded), mode), atol=2e-5, rtol=1e-4)


def test_engine_runs_packed_chunks_on_the_cpu_in_the_callers_order(random_embedder: Callable[[str], Path]) -> None:
    import torch

    model, tokenizer = _load(random_embedder("mean"))
    engine = HfPoolingEngine(model, tokenizer, EMBEDDING, pooling="mean", max_length=64, batch_tokens=30, device="cpu")
    items = [engine.encode_text(text, True) for text in TEXTS]
    lengths = [len(item["input_ids"]) for item in items]
    padded, _ = engine.run(items)
    engine.speed_up_cpu("onednn")
    assert engine.packed is not None
    got, sizes = engine.run(items)
    torch.testing.assert_close(got, padded, atol=2e-5, rtol=1e-4)
    assert sum(sizes) == len(items)
    start = 0
    for size in sizes:  # each chunk holds at most batch_tokens tokens, or one longer text
        assert size == 1 or sum(lengths[start:start + size]) <= 30
        start += size
    assert len(sizes) > 1  # 30 tokens cannot hold all four texts


def test_check_names_the_layouts_it_does_not_run() -> None:
    def model(**config: Any) -> Any:
        return SimpleNamespace(config=SimpleNamespace(**config), training=False)

    assert "llama" in str(packed.check(model(model_type="llama")))
    assert "decoder" in str(packed.check(model(model_type="bert", is_decoder=True)))
    assert "relative_key" in str(packed.check(model(model_type="bert", position_embedding_type="relative_key")))
    assert "encoder.layer" in str(packed.check(model(model_type="bert")))


def test_a_packed_forward_that_differs_at_load_is_not_used(random_embedder: Callable[[str], Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = _load(random_embedder("mean"))
    real = packed.PackedEncoder.hidden

    def shifted(self: packed.PackedEncoder, items: Any) -> Any:
        hidden, lengths = real(self, items)
        return hidden + 0.1 * hidden.flip(0), lengths

    monkeypatch.setattr(packed.PackedEncoder, "hidden", shifted)
    engine = HfPoolingEngine(model, tokenizer, EMBEDDING, pooling="mean", max_length=64, batch_tokens=64, device="cpu")
    engine.speed_up_cpu("torch")
    assert engine.packed is None
