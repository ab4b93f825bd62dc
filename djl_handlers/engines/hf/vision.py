"""Vision-language models on the HF engine: the model's own processor turns a rendered chat prompt
and its images into token ids (each image's placeholder expanded to its image tokens) and the
tensors the vision encoder reads; the prefill forward then takes input embeddings in which the image
tokens' rows are the encoder's features, exactly as the model's own forward places them.

The vision encoder runs once per request, at the first prefill chunk that reaches an image token
(the features are kept on the row until its prompt is prefilled), in one call for the step's requests
whose encoder inputs have the same shape; decoding is text only, so image
rows decode in the shared continuous batch beside text-only rows. Positions stay one-dimensional
(LLaVA-style and Idefics3/SmolVLM-style models); a model whose language model needs multimodal
rotary positions (Qwen2-VL's ``mrope``) is refused at load with the reason.

Nothing here runs at import time; torch and transformers are imported by the engine's loader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from djl_handlers.errors import ConfigError
from djl_handlers.media.processing import placeholder_counts, run_processor
from djl_handlers.media.records import LoadedImage, MediaInputs

__all__ = ["RowImages", "VisionSupport"]

# processor outputs that are not the vision encoder's inputs
_TEXT_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})


@dataclass
class RowImages:
    """One prefilling row's image features: ``features`` [image tokens, hidden] in prompt order,
    computed at the row's first prefill chunk that needs them."""

    media: MediaInputs
    tokens: int  # the prompt's image tokens (its features' rows)
    features: torch.Tensor | None = None
    used: int = 0  # image tokens of the prompt already placed (chunked prefill, a cached prefix)

    def shape_key(self) -> tuple[tuple[str, tuple[int, ...], torch.dtype], ...]:
        """Rows whose encoder inputs agree in everything but their first dimension encode together."""
        return tuple((k, tuple(v.shape[1:]), v.dtype) for k, v in sorted(self.media.tensors.items()))


class VisionSupport:
    """A loaded vision-language model's processor and the engine's image steps (module docstring)."""

    def __init__(self, model: Any, processor: Any) -> None:
        config = model.config
        token = getattr(config, "image_token_id", None)
        if token is None:
            token = getattr(config, "image_token_index", None)
        if token is None:
            raise ConfigError(f"{type(model).__name__}: its config names no image token (image_token_id)",
                              field="option.model_id")
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        rope = getattr(text, "rope_scaling", None) or getattr(text, "rope_parameters", None) or {}
        if isinstance(rope, dict) and ("mrope_section" in rope or rope.get("rope_type") == "mrope"):
            raise ConfigError(f"{type(model).__name__} uses multimodal rotary positions (mrope), which the HF "
                              "engine's continuous batching does not place; serve it with option.entryPoint="
                              "djl_handlers.vllm", field="option.model_id")
        self.model = model
        self.processor = processor
        self.image_token_id = int(token)
        self.image_token = str(getattr(processor, "image_token", None) or processor.tokenizer.convert_ids_to_tokens(
            self.image_token_id))
        self.model_type = str(getattr(config, "model_type", ""))

    def encode(self, prompt: str, images: Sequence[LoadedImage],
               add_special_tokens: bool | None = None) -> tuple[list[int], MediaInputs]:
        """The prompt's token ids with every image's tokens, and the media for the engine (the encoder's
        inputs among them); a 400 naming ``messages`` when the processor refuses them."""
        ids, out = run_processor(self.processor, prompt, images, self.image_token_id, add_special_tokens,
                                 return_tensors="pt")
        tensors = {k: v for k, v in out.items() if k not in _TEXT_KEYS and isinstance(v, torch.Tensor)}
        counts = placeholder_counts(ids, self.image_token_id, len(images))
        return ids, MediaInputs(images=tuple(images), tensors=tensors, placeholder_counts=counts)

    def encode_rows(self, rows: Sequence[RowImages], dtype: torch.dtype, device: torch.device) -> None:
        """Run the vision encoder for ``rows`` (their ``features`` set): rows whose inputs have the same
        shape but for the first dimension (LLaVA's images, Idefics3's prompts of as many tiles) in one
        call, the others alone."""
        groups: dict[Any, list[RowImages]] = {}
        for row in rows:
            groups.setdefault(row.shape_key(), []).append(row)
        for group in groups.values():
            tensors = {k: torch.cat([r.media.tensors[k] for r in group]) for k in group[0].media.tensors}
            flat = self._features(tensors, dtype, device)
            if flat.shape[0] != sum(r.tokens for r in group):
                raise ValueError(f"the images gave {flat.shape[0]} features for {sum(r.tokens for r in group)} "
                                 "image tokens")
            for row, part in zip(group, flat.split([r.tokens for r in group]), strict=True):
                row.features = part

    def _features(self, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The vision encoder's features for these inputs' images, [image tokens, hidden], in order."""
        inputs = {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) for k, v in tensors.items()}
        out = self.model.get_image_features(**inputs, return_dict=True)
        pooled = getattr(out, "pooler_output", None)
        if pooled is None:
            pooled = out[0] if isinstance(out, (tuple, list)) else out
        parts = list(pooled) if isinstance(pooled, (tuple, list)) else [pooled]
        hidden = int(parts[0].shape[-1])
        return torch.cat([p.reshape(-1, hidden) for p in parts], dim=0).to(dtype)

    def embed(self, ids: torch.Tensor, rows: Sequence[tuple[int, RowImages, int, int]]) -> torch.Tensor:
        """Input embeddings of ``ids`` [B, T] with image features placed at the image tokens of the
        ``rows`` that have images: ``(batch row, its images, first column of its chunk, chunk length)``
        (the chunk's image tokens take the next unused features of that row)."""
        embeds = self.model.get_input_embeddings()(ids)
        places = [(b, images, start, (ids[b, start : start + length] == self.image_token_id).nonzero().flatten())
                  for b, images, start, length in rows]
        self.encode_rows([images for _, images, _, where in places if where.numel() and images.features is None],
                         embeds.dtype, embeds.device)
        for b, images, start, where in places:
            if where.numel() == 0 or images.features is None:
                continue
            take = images.features[images.used : images.used + int(where.numel())]
            if take.shape[0] != where.numel():
                raise ValueError(f"the prompt has more image tokens than its images' features "
                                 f"({images.features.shape[0]})")
            embeds[b, start + where] = take.to(embeds.dtype)
            images.used += int(where.numel())
        return embeds

