"""Images on the vLLM adapters (sync and async mode): vision-language models served by vLLM.

A model folder whose ``config.json`` describes a vision-language model (``hf.loader.is_vision_model``)
gets vLLM's ``limit_mm_per_prompt={"image": N}`` from ``option.limit_mm_per_prompt`` (``config.media``)
and the adapter takes image requests (its ``media_options`` and ``encode_media``):

- ``encode_media`` gives the prompt ids vLLM prefills, each image placeholder expanded to its image
  tokens, so usage counts them: the model's own processor (``AutoProcessor``, local files only) on
  the rendered prompt and the images, the same processing vLLM runs on a text prompt with images
  (a request whose count differs from vLLM's is logged). vLLM processes the pixels itself: the media
  carry the images and no tensors.
- vLLM gets the prompt text with ``multi_modal_data={"image": [PIL images]}``, tokenized as the
  processor tokenized it (``add_special_tokens``), and ``multi_modal_uuids`` from the images' pixel
  digests, so vLLM's caches (processed images, encoder outputs, prefix blocks) key an image by its
  pixels. vLLM expands the placeholders of a text prompt itself; a token prompt whose placeholders
  are already expanded would be expanded again.
- Beam search (async mode) runs over vLLM's rendered input (``Renderer.render_cmpl_async``), the
  way vLLM's own server passes a multimodal prompt to its beam-search loop.

transformers and vLLM are imported inside the functions.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from djl_handlers.engines.base import EngineRequest
from djl_handlers.errors import ConfigError, InvalidRequest
from djl_handlers.media.processing import placeholder_counts, run_processor
from djl_handlers.media.records import LoadedImage, MediaInputs

__all__ = ["VllmImages", "VllmMediaInputs", "attach_images", "check_prompt_count", "encode_with", "has_images",
           "image_prompt", "media_kwargs", "rendered_prompt", "tokenization_kwargs"]

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class VllmMediaInputs(MediaInputs):
    """``MediaInputs`` that also say how the prompt text was tokenized, so vLLM tokenizes it the same way
    (``add_special_tokens``; None: the tokenizer's default)."""

    add_special_tokens: Optional[bool] = None


def media_kwargs(config: Any, model: str) -> dict[str, Any]:
    """``limit_mm_per_prompt`` for vLLM when ``model`` is a vision-language model folder, else nothing."""
    from djl_handlers.engines.hf.loader import is_vision_model

    media = getattr(config, "media", None)
    if media is None or not is_vision_model(model):
        return {}
    return {"limit_mm_per_prompt": {"image": int(media.limit_images)}}


class VllmImages:
    """A vision-language model's processor beside a vLLM engine (see the module docstring)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.image_token_id = _image_token_id(processor)

    @classmethod
    def load(cls, config: Any, model: str) -> Optional[VllmImages]:
        """The processor of a vision-language model folder; None for any other model."""
        if not media_kwargs(config, model):
            return None
        from transformers import AutoProcessor

        try:
            processor = AutoProcessor.from_pretrained(model, local_files_only=True,
                                                      trust_remote_code=bool(getattr(config, "trust_remote_code",
                                                                                     False)))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the processor of vision-language model {model!r}: {exc}",
                              field="option.model_id") from exc
        if getattr(processor, "tokenizer", None) is None or not callable(processor):
            raise ConfigError(f"{model!r} has no processor that takes text and images", field="option.model_id")
        return cls(processor)

    def encode(self, prompt: str, images: Sequence[LoadedImage],
               add_special_tokens: Optional[bool] = None) -> tuple[list[int], MediaInputs]:
        """The prompt's token ids with every image's tokens, and its media; a 400 naming ``messages``
        when the processor cannot take the prompt with these images."""
        ids, _ = run_processor(self.processor, prompt, images, self.image_token_id, add_special_tokens)
        counts = placeholder_counts(ids, self.image_token_id, len(images))
        return ids, VllmMediaInputs(images=tuple(images), placeholder_counts=counts,
                                    add_special_tokens=add_special_tokens)


def has_images(request: EngineRequest) -> bool:
    """Whether ``request`` carries images."""
    return request.media is not None and bool(request.media.images)


def image_prompt(request: EngineRequest) -> dict[str, Any]:
    """vLLM's text prompt with images: the text (vLLM expands its placeholders), the PIL images in
    prompt order and their pixel digests as ``multi_modal_uuids``."""
    assert request.media is not None
    images = request.media.images
    return {"prompt": request.prompt,
            "multi_modal_data": {"image": [image.image for image in images]},
            "multi_modal_uuids": {"image": [image.digest.hex() for image in images]}}


def tokenization_kwargs(request: EngineRequest) -> dict[str, Any]:
    """``tokenization_kwargs`` for a request with images: tokenized as ``encode_media`` tokenized it."""
    media = request.media
    special = getattr(media, "add_special_tokens", None)
    return {} if special is None else {"tokenization_kwargs": {"add_special_tokens": bool(special)}}


async def rendered_prompt(engine: Any, request: EngineRequest) -> Any:
    """vLLM's rendered input for a request with images (its ``AsyncLLM``'s renderer): what its
    beam-search loop takes."""
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    renderer = engine.renderer
    params = renderer.default_cmpl_tok_params
    special = tokenization_kwargs(request).get("tokenization_kwargs")
    if special:
        params = params.with_kwargs(**special)
    (rendered,) = await renderer.render_cmpl_async([parse_model_prompt(engine.model_config, image_prompt(request))],
                                                    params)
    return rendered


def check_prompt_count(request_id: int, expected: int, output: Any) -> None:
    """Log when vLLM prefills another number of prompt tokens than ``encode_media`` counted (the
    usage of that request is then off by the difference)."""
    got = getattr(output, "prompt_token_ids", None)
    if got is not None and len(got) != expected:
        LOG.warning("request %s: vLLM prefills %d prompt tokens where the model's processor counted %d "
                    "(the usage counts the latter)", request_id, len(got), expected)


def _image_token_id(processor: Any) -> Optional[int]:
    token = getattr(processor, "image_token_id", None)
    if isinstance(token, int):
        return token
    name = getattr(processor, "image_token", None)
    if isinstance(name, str):
        found = processor.tokenizer.convert_tokens_to_ids(name)
        return int(found) if isinstance(found, int) else None
    return None


def attach_images(adapter: Any, config: Any, images: Optional[VllmImages]) -> None:
    """Give ``adapter`` (either vLLM adapter) a vision-language model's ``images`` (from
    ``VllmImages.load``, None for other models) and the operator's media limits
    (``adapter.media_options``, which make the service take image parts)."""
    if images is not None:
        adapter.images = images
        adapter.media_options = config.media


def encode_with(images: Optional[VllmImages], prompt: str, pictures: Sequence[LoadedImage],
                add_special_tokens: Optional[bool]) -> tuple[list[int], MediaInputs]:
    """``encode_media`` of an adapter whose processor is ``images`` (None: a text-only model, a 400)."""
    if images is None:
        raise InvalidRequest("this model takes text only; remove the image parts", field="messages")
    return images.encode(prompt, pictures, add_special_tokens)
