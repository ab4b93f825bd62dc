"""OpenAI chat message content: a string, or a list of parts.

``text`` parts are joined into one string when a message has no image (what every chat template
reads). ``image_url`` parts (``{"type": "image_url", "image_url": {"url": ..., "detail": ...}}``; the
bare-string ``image_url`` vLLM also takes) are allowed in user messages: the message's content then
stays a list, each image becoming ``{"type": "image"}`` (the item vision-language chat templates
render as the model's image placeholder) and its URL an :class:`~djl_handlers.media.records.ImageRef`
named by the part it came from (``messages[1].content[2].image_url``), which every refusal of that
image names. Other part types (audio, video, precomputed embeddings) are refused with a 400 naming the
part: this server takes text and images.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional, Union

from djl_handlers.errors import InvalidRequest
from djl_handlers.media.records import ImageRef

__all__ = ["DETAILS", "Content", "read_content"]

DETAILS = ("auto", "low", "high")
Content = Union[str, list[dict[str, Any]], None]


def read_content(content: Any, i: int, role: str, images: list[ImageRef],
                 text_check: Callable[[str, str], Any]) -> Content:
    """Message ``i``'s content as the chat template gets it; its images' references are appended to
    ``images`` in order."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"messages[{i}].content must be a string or a list of content parts", field="messages")
    parts: list[dict[str, Any]] = []
    refs: list[ImageRef] = []
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequest(f"{where}.text must be a string", field=where)
            parts.append({"type": "text", "text": text_check(text, "messages")})
        elif kind == "image_url":
            refs.append(_image_ref(part.get("image_url"), f"{where}.image_url"))
            parts.append({"type": "image"})
        elif isinstance(kind, str):
            raise InvalidRequest(f"{where} has type {kind!r}; this server takes 'text' and 'image_url' parts",
                                 field=where)
        else:
            raise InvalidRequest(f"{where} must be an object with a 'type' ('text' or 'image_url')", field=where)
    if not refs:
        return "".join(p["text"] for p in parts)
    if role != "user":
        raise InvalidRequest(f"{refs[0].part}: images are taken in user messages only (this one is {role!r})",
                             field=refs[0].part)
    images.extend(refs)
    return parts


def _image_ref(value: Any, where: str) -> ImageRef:
    detail: Optional[str] = None
    if isinstance(value, dict):
        url, detail = value.get("url"), value.get("detail")
        if detail is not None and detail not in DETAILS:
            raise InvalidRequest(f"{where}.detail must be one of {', '.join(DETAILS)}, got {detail!r}",
                                 field=f"{where}.detail")
    else:
        url = value
    if not isinstance(url, str) or not url.strip():
        raise InvalidRequest(f"{where}.url must be a non-empty string (a data:, http(s): or file: URL)", field=where)
    return ImageRef(url=url.strip(), part=where, detail=detail)
