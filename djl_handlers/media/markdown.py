"""TGI's inline images: a prompt (``inputs``) with markdown image links, ``![](url)``, as TGI reads
them for a vision-language model. Each link becomes the model's image placeholder text where it
stood and an :class:`~djl_handlers.media.records.ImageRef` named ``inputs.images[k]``; a text-only
model keeps the text as it is (TGI's rule)."""

from __future__ import annotations

import re

from djl_handlers.media.records import ImageRef

__all__ = ["inline_images"]

_LINK = re.compile(r"!\[[^\]\n]*\]\(([^)\s]+)\)")


def inline_images(text: str, placeholder: str) -> tuple[str, tuple[ImageRef, ...]]:
    """``(text with each image link replaced by placeholder, the links' references)``."""
    refs: list[ImageRef] = []

    def swap(match: re.Match[str]) -> str:
        refs.append(ImageRef(url=match.group(1), part=f"inputs.images[{len(refs)}]"))
        return placeholder

    out = _LINK.sub(swap, text) if "![" in text else text
    return out, tuple(refs)
