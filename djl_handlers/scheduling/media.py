"""A vision-language prompt's token ids and media: its images loaded within the operator's limits
(:mod:`djl_handlers.media`), then the engine's processor expanding each image placeholder
(``engine.encode_media``), kept on the request (``request.encoded``): async mode and sync rolling
mode prepare them off the event loop and the step thread (:func:`prepare_media`), the scheduler then
uses them as they are. Truncation never cuts an image's tokens: a request whose
``parameters.truncate`` is shorter than its prompt with images is a 400."""

from __future__ import annotations

from typing import Any

from djl_handlers.engines.base import Engine, check_prompt_length
from djl_handlers.errors import InvalidParameter, InvalidRequest
from djl_handlers.media.records import MediaInputs
from djl_handlers.request.records import Request

__all__ = ["prepare_media", "preload_images", "takes_images", "tokenize_media"]


def tokenize_media(engine: Engine, request: Request) -> tuple[list[int], MediaInputs]:
    """``(prompt ids, media)`` of a request with image parts (``request.media``)."""
    if not takes_images(engine):
        first = request.media[0].part
        raise InvalidRequest(f"{first}: this model takes text only; remove the image parts", field=first)
    if request.encoded is None:
        prepare_media(engine, request)
    assert request.encoded is not None
    ids, media = request.encoded
    truncate = request.params.truncate
    if truncate is not None and len(ids) > truncate:
        raise InvalidParameter(f"parameters.truncate ({truncate}) would cut this prompt of {len(ids)} tokens, "
                               "which holds images: raise it or leave it unset", field="truncate")
    check_prompt_length(len(ids), engine.max_model_len)
    return list(ids), media


def takes_images(engine: Engine) -> bool:
    """Whether ``engine`` serves a vision-language model (it has media limits and a processor step)."""
    return getattr(engine, "media_options", None) is not None and callable(getattr(engine, "encode_media", None))


def prepare_media(engine: Engine, request: Request) -> None:
    """Load ``request``'s images and run the model's processor (``request.encoded`` set); a refusal
    raises its 400. Blocking: call it off the step thread where the step loop must go on."""
    from djl_handlers.media.images import load_images

    options: Any = getattr(engine, "media_options", None)
    encode: Any = getattr(engine, "encode_media", None)
    ids, media = encode(request.prompt, load_images(request.media, options), request.add_special_tokens)
    request.encoded = (list(ids), media)


async def preload_images(engine: Engine, request: Request) -> None:
    """Load ``request``'s images and run the model's processor on a worker thread (a remote fetch
    waits up to ``option.media_fetch_timeout``, the processor costs milliseconds per image: neither on
    the event loop nor the engine's step thread); a refusal raises its 400. Nothing to do for a request
    without images or an engine that takes none."""
    if not request.media or not takes_images(engine):
        return
    import asyncio

    await asyncio.to_thread(prepare_media, engine, request)
