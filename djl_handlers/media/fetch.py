"""The bytes of one image reference: ``data:`` URLs, allow-listed ``http(s):`` URLs (:mod:`.remote`)
and ``file:`` URLs under the operator's local directory; any other scheme is refused.

Every refusal is an ``InvalidRequest`` (400) whose ``field`` is the reference's request part, saying
what to do instead. ``option.max_image_bytes`` bounds each image before it is decoded: a base64
payload is measured before decoding, a file by its size before reading.
"""

from __future__ import annotations

import binascii
import os
import stat
import urllib.parse
from base64 import b64decode

from djl_handlers.config.media import MediaOptions
from djl_handlers.errors import InvalidRequest
from djl_handlers.media.records import ImageRef
from djl_handlers.media.remote import fetch_remote, too_large

__all__ = ["fetch_bytes"]

_WHITESPACE = " \t\r\n\f\v"


def fetch_bytes(ref: ImageRef, options: MediaOptions) -> bytes:
    """The undecoded bytes ``ref.url`` names, within ``options``; an ``InvalidRequest`` naming
    ``ref.part`` otherwise."""
    url = ref.url.strip()
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return _data_url(url, ref.part, options.max_image_bytes)
    if scheme in ("http", "https"):
        return fetch_remote(url, ref.part, options)
    if scheme == "file":
        return _file_url(url, ref.part, options)
    shown = f"scheme {scheme!r}" if scheme else "no scheme"
    raise InvalidRequest(f"{ref.part}: the image URL has {shown}; send a data: URL "
                         "(data:image/png;base64,...) or an http(s): URL", field=ref.part)


def _data_url(url: str, part: str, limit: int) -> bytes:
    head, comma, payload = url[len("data:"):].partition(",")
    if not comma:
        raise InvalidRequest(f"{part}: a data: URL needs a comma before its data "
                             "(data:image/png;base64,...)", field=part)
    params = [word.strip().lower() for word in head.split(";")]
    media_type = params[0]
    if media_type and not media_type.startswith("image/") and media_type != "application/octet-stream":
        raise InvalidRequest(f"{part}: a data: URL of type {media_type!r} is not an image; "
                             "send image/png, image/jpeg, image/gif or image/webp", field=part)
    if "base64" in params[1:]:
        return _base64(payload, part, limit)
    if len(payload) // 3 > limit:  # each byte takes at most three characters (%XX)
        raise too_large(part, f"at least {len(payload) // 3}", limit)
    data = urllib.parse.unquote_to_bytes(payload)
    if len(data) > limit:
        raise too_large(part, len(data), limit)
    return data


def _base64(payload: str, part: str, limit: int) -> bytes:
    if any(char in payload for char in _WHITESPACE):
        payload = "".join(payload.split())
    if "%" in payload:  # a URL-encoded payload (%2B for +, %3D for =)
        payload = urllib.parse.unquote(payload)
    least = len(payload) // 4 * 3 - 2  # the decoded size, up to two padding bytes
    if least > limit:
        raise too_large(part, f"at least {least}", limit)
    payload += "=" * (-len(payload) % 4)
    try:
        data = b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{part}: the data: URL's base64 data is invalid; encode the image bytes with "
                             "standard base64 (RFC 4648)", field=part) from None
    if len(data) > limit:
        raise too_large(part, len(data), limit)
    return data


def _file_url(url: str, part: str, options: MediaOptions) -> bytes:
    root = options.allowed_local_media_path
    if root is None:
        raise InvalidRequest(f"{part}: file: image URLs are off; send a data: URL, or the server's operator "
                             "can allow a directory with option.allowed_local_media_path", field=part)
    parsed = urllib.parse.urlsplit(url)
    if parsed.netloc not in ("", "localhost") or parsed.query or parsed.fragment:
        raise InvalidRequest(f"{part}: a file: URL must be file:///absolute/path with no host, query or "
                             "fragment", field=part)
    path = os.path.realpath(urllib.parse.unquote(parsed.path))
    if os.path.commonpath([path, root]) != root:
        raise InvalidRequest(f"{part}: the file is outside the directory the server allows images from "
                             "(option.allowed_local_media_path)", field=part)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block the worker
    except (FileNotFoundError, NotADirectoryError):
        raise InvalidRequest(f"{part}: no image file at that path in the allowed directory", field=part) from None
    except OSError as exc:
        raise InvalidRequest(f"{part}: the image file cannot be read ({exc.strerror})", field=part) from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise InvalidRequest(f"{part}: the path is not a regular file", field=part)
        if status.st_size > options.max_image_bytes:
            raise too_large(part, status.st_size, options.max_image_bytes)
        data = _read_up_to(fd, options.max_image_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > options.max_image_bytes:
        raise too_large(part, len(data), options.max_image_bytes)
    return data


def _read_up_to(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0 and (chunk := os.read(fd, min(size, 1 << 20))):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
