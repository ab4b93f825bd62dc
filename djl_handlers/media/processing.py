"""A vision-language model's processor on a rendered prompt and its images, as every engine runs it:
the token ids with each image placeholder expanded (what usage counts), the processor's other outputs,
and how many image tokens each image took where the prompt tells. The processor is duck-typed
(transformers' ``AutoProcessor``); nothing here imports an ML library."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from djl_handlers.errors import InvalidRequest
from djl_handlers.media.records import LoadedImage

__all__ = ["placeholder_counts", "run_processor"]


def run_processor(processor: Any, prompt: str, images: Sequence[LoadedImage], image_token_id: Optional[int],
                  add_special_tokens: Optional[bool] = None, **extra: Any) -> tuple[list[int], Any]:
    """``(token ids, the processor's outputs)`` for ``prompt`` and ``images`` (``extra``: more
    keyword arguments, e.g. ``return_tensors``). A 400 naming ``messages`` when the processor refuses
    them or the prompt holds no image placeholder for its images."""
    kwargs = dict(extra)
    if add_special_tokens is not None:
        kwargs["add_special_tokens"] = add_special_tokens
    pictures = [image.image for image in images]
    try:
        out = processor(text=[prompt], images=[pictures], **kwargs)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise InvalidRequest(f"the model's processor cannot take this prompt and its {len(pictures)} "
                             f"image(s): {exc}", field="messages") from None
    first = out["input_ids"][0]
    ids = [int(i) for i in (first.tolist() if hasattr(first, "tolist") else first)]
    if pictures and image_token_id is not None and image_token_id not in ids:
        raise InvalidRequest("the prompt holds no image placeholder for its images (the chat template "
                             "did not render them)", field="messages")
    return ids, out


def placeholder_counts(ids: Sequence[int], token: Optional[int], images: int) -> tuple[int, ...]:
    """Image tokens per image: all of them for one image, one run each where every image is one run
    of image tokens (LLaVA-style prompts); empty where the prompt does not tell (Idefics3's tiles)."""
    if token is None or not images:
        return ()
    runs: list[int] = []
    previous = None
    for i in ids:
        if i == token:
            if previous == token:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = i
    if images == 1:
        return (sum(runs),)
    return tuple(runs) if len(runs) == images else ()
