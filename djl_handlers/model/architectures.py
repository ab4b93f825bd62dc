"""Random-weight causal LMs of several architectures, built from a config at a fixed seed, with the
SmolLM2 tokenizer: the shapes the HF engine is tested and benchmarked on besides the embedded model.

Each :class:`Shape` names a transformers architecture and its sizes. ``build_model_dir(path, name)``
writes a model folder (config, safetensors weights, generation config, tokenizer files) that
``AutoModelForCausalLM`` and vLLM load like any checkpoint. The weights are random (seeded): the
text is gibberish, but the speed of a forward does not depend on the weights' values, only on the
shapes and the dtype, so these folders measure what a real checkpoint of the same shape would.
Tests use the small shapes; benchmarks the ``-bench`` and ``-1b`` ones.

Families:

- ``llama``: RMSNorm, SiLU-gated MLP, rotary embedding, grouped KV heads (SmolLM2, Llama 3, Mistral);
- ``qwen2``: Llama's layout with biases on the query/key/value projections and another head layout
  (few KV heads, Qwen2.5's ratios);
- ``phi``: LayerNorm, GELU MLP (``fc1``/``fc2``, biases everywhere), attention and MLP in parallel
  from one norm, rotary over half of each head (Phi-1.5/2).

Nothing is downloaded; the tokenizer files are copied from the converted embedded model.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SHAPES", "Shape", "build_model_dir", "model_cache_dir"]

MARKER = "djl_handlers_random.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
VOCAB = 49152  # the SmolLM2 tokenizer's
BOS, EOS = 1, 2
VERSION = 1  # bump when the way a folder is built changes


@dataclass(frozen=True)
class Shape:
    """One architecture and size: the transformers config class and its keyword arguments."""

    name: str
    family: str  # llama | qwen2 | phi
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    max_position: int = 2048
    tie_embeddings: bool = True
    init_range: float = 0.02
    extra: dict[str, Any] = field(default_factory=dict)

    def config(self) -> Any:
        """The transformers config of this shape (vocabulary and special ids of the SmolLM2 tokenizer)."""
        common: dict[str, Any] = {
            "vocab_size": VOCAB, "hidden_size": self.hidden, "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "max_position_embeddings": self.max_position,
            "tie_word_embeddings": self.tie_embeddings, "initializer_range": self.init_range,
            "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": EOS, **self.extra,
        }
        if self.family == "llama":
            from transformers import LlamaConfig

            return LlamaConfig(**common)
        if self.family == "qwen2":
            from transformers import Qwen2Config

            return Qwen2Config(**common)
        if self.family == "phi":
            from transformers import PhiConfig

            return PhiConfig(**common)
        raise ValueError(f"unknown family {self.family!r}")


# Small shapes for tests: a forward costs well under a millisecond per token; a larger init range
# gives peakier logits (fewer near-ties in argmax) than the default. Benchmark shapes keep the
# ratios of a real model of the family (Qwen2.5-0.5B, Phi-1.5 halved, Llama 3.2-1B).
SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("llama-tiny", "llama", 64, 128, 2, 4, 2, 512, init_range=0.1),
    Shape("qwen2-tiny", "qwen2", 64, 160, 2, 8, 2, 512, init_range=0.1),
    Shape("phi-tiny", "phi", 64, 256, 2, 4, 4, 512, tie_embeddings=False, init_range=0.1,
          extra={"partial_rotary_factor": 0.5}),
    Shape("qwen2-bench", "qwen2", 896, 4864, 24, 14, 2),  # Qwen2.5-0.5B's layers: ~0.4 B with this vocabulary
    Shape("phi-bench", "phi", 1024, 4096, 24, 16, 16, tie_embeddings=False,
          extra={"partial_rotary_factor": 0.5}),  # Phi-1.5's layout at half its width: ~0.4 B
    Shape("llama-1b", "llama", 2048, 8192, 16, 32, 8, extra={"rope_theta": 500000.0}),  # Llama 3.2-1B's layers: ~1.1 B
    # The embedded SmolLM2-135M's config (its converted config.json) with random weights: the GPU
    # check's model where the embedded model's weights cannot be carried. Its greedy top-2 logit gaps
    # (relative to the logits' spread) are as wide as the real model's, so fp32 ties are as rare.
    Shape("smollm2-135m", "llama", 576, 1536, 30, 9, 3, 8192,
          extra={"rope_theta": 100000.0, "rms_norm_eps": 1e-5}),
)}


def model_cache_dir(name: str) -> Path:
    """Where :func:`build_model_dir` keeps shape ``name`` by default (beside the embedded model)."""
    from djl_handlers.model.embedded import cache_root

    return cache_root() / f"random-{name}"


def build_model_dir(path: str | Path | None, name: str, *, seed: int = 0, dtype: str = "float32",
                    source: str | Path | None = None) -> Path:
    """Build (or reuse) the random model ``name`` of :data:`SHAPES` at ``path`` and return the folder.

    Args:
        path: the folder to write (None: :func:`model_cache_dir`); reused when it already holds the
            same shape, seed and dtype.
        name: a key of :data:`SHAPES`.
        seed: torch seed for the random initialisation (the same weights on every machine).
        dtype: the stored weights' dtype (``float32`` or ``bfloat16``); a server loads either in any dtype.
        source: folder with the tokenizer files (default: the converted embedded model).
    """
    shape = SHAPES[name]
    out = Path(path) if path is not None else model_cache_dir(name)
    settings = {"shape": asdict(shape), "seed": seed, "dtype": dtype, "version": VERSION}
    if _marker(out) == settings:
        return out
    if source is None:
        from djl_handlers.model.embedded import embedded_model_dir

        source = embedded_model_dir()
    out.mkdir(parents=True, exist_ok=True)
    _write_model(out, shape, seed, dtype)
    for file in TOKENIZER_FILES:
        src = Path(source) / file
        if src.is_file():
            shutil.copyfile(src, out / file)
    (out / MARKER).write_text(json.dumps(settings, sort_keys=True) + "\n", encoding="utf-8")
    return out


def _marker(out: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((out / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_model(out: Path, shape: Shape, seed: int, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(shape.config(), dtype=torch.float32).eval()
    model = model.to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS)
    model.save_pretrained(str(out), safe_serialization=True)
