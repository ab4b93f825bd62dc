"""Plain records of the images a request carries (no ML library imported here).

``ImageRef`` is what the request parser reads: the URL of one image part and the request field it
came from (``messages[1].content[2].image_url``), which every refusal of that image names.
``LoadedImage`` is the decoded image (an RGB ``PIL.Image``) with the digest of its pixels: the
prefix cache keys an image by it, so the same pixels reuse cached blocks and different ones never do.
``MediaInputs`` is what an engine gets beside the prompt ids: the images in prompt order and, for the
HF engine, the processor's tensors (``pixel_values`` and the like) that its vision encoder reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["ImageRef", "LoadedImage", "MediaInputs"]


@dataclass(frozen=True)
class ImageRef:
    """One image part of a request: ``url`` (``data:``, ``http(s):`` or ``file:``), ``part`` (the
    request field it came from, named by a 400) and OpenAI's ``detail`` hint (accepted, not used)."""

    url: str
    part: str
    detail: Optional[str] = None


@dataclass(frozen=True)
class LoadedImage:
    """A decoded RGB image (``PIL.Image.Image``) and the SHA-256 ``digest`` of its mode, size and
    pixels; ``part`` as in its ``ImageRef``."""

    image: Any
    digest: bytes
    part: str


@dataclass(frozen=True)
class MediaInputs:
    """A multimodal prompt's media, in prompt order: the ``images``, and the processor's tensors
    for the engine's vision encoder (``tensors``: name -> tensor; empty for engines that process
    images themselves, such as vLLM). ``placeholder_counts``: the prompt tokens each image took."""

    images: tuple[LoadedImage, ...] = ()
    tensors: dict[str, Any] = field(default_factory=dict)
    placeholder_counts: tuple[int, ...] = ()

    @property
    def digests(self) -> tuple[bytes, ...]:
        return tuple(image.digest for image in self.images)
