"""A tiny random-initialised Llama with the SmolLM2 tokenizer, for fast plumbing tests.

Two layers, hidden size 64, fixed seed: the same weights on every machine and every call, and a
forward that costs a fraction of a millisecond per token. Its text is gibberish; use it for
mechanics (batching, padding, release, sampling), not for text quality. The tokenizer files and
chat template are copied from the converted embedded model (converted first if needed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

MARKER = "djl_handlers_tiny.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def tiny_model_dir(
    path: str | Path,
    *,
    seed: int = 0,
    max_position_embeddings: int = 512,
    source: str | Path | None = None,
) -> Path:
    """Build (or reuse) the tiny model folder at ``path`` and return it.

    Args:
        path: the folder to write; reused when it already holds a tiny model built with the same
            ``seed`` and ``max_position_embeddings``.
        seed: torch seed for the random initialisation.
        max_position_embeddings: the model's context length (small values make "prompt too long"
            tests cheap).
        source: folder with the tokenizer files (default: the converted embedded model).
    """
    out = Path(path)
    settings = {"seed": seed, "max_position_embeddings": max_position_embeddings, "version": 1}
    if _marker(out) == settings:
        return out
    if source is None:
        from djl_handlers.model.embedded import embedded_model_dir

        source = embedded_model_dir()
    out.mkdir(parents=True, exist_ok=True)
    _build_model(out, seed, max_position_embeddings)
    for name in TOKENIZER_FILES:
        src = Path(source) / name
        if src.is_file():
            shutil.copyfile(src, out / name)
    (out / MARKER).write_text(json.dumps(settings) + "\n", encoding="utf-8")
    return out


def _marker(out: Path) -> dict[str, int] | None:
    try:
        data = json.loads((out / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _build_model(out: Path, seed: int, max_position_embeddings: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        initializer_range=0.1,  # peakier logits than the default 0.02: fewer near-ties in argmax
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model.save_pretrained(str(out), safe_serialization=True)
