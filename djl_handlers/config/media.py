"""Media options: how many images a prompt may carry and where they may come from.

``option.limit_mm_per_prompt`` (vLLM's JSON, ``{"image": 2}`` or ``{"image": {"count": 2}}``) caps
the images per prompt; other modalities are refused at load (images only are served).
Remote fetching is off unless ``option.allowed_media_domains`` lists hosts (comma-separated or a
JSON list): a listed name allows that host and its subdomains, a listed IP that address only. A
host that resolves to a loopback, private, link-local or other non-public address is fetched only
when the host itself (name or IP) or that address is listed. ``file:`` URLs only under
``option.allowed_local_media_path`` (an existing absolute directory). ``option.media_fetch_timeout``
(seconds), ``option.max_image_bytes`` (before decoding) and ``option.max_image_pixels`` (width x
height, checked from the header before decoding) bound each image.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass

from djl_handlers.config.reader import Reader
from djl_handlers.errors import ConfigError

__all__ = ["DEFAULT_IMAGE_LIMIT", "DEFAULT_MAX_IMAGE_BYTES", "DEFAULT_MAX_IMAGE_PIXELS", "MediaOptions",
           "normalize_host", "read_media_options"]

DEFAULT_IMAGE_LIMIT = 8
DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_IMAGE_PIXELS = 25_000_000
DEFAULT_FETCH_TIMEOUT = 5.0
MAX_FETCH_TIMEOUT = 3600.0

_LIMIT_FORM = 'a JSON object such as {"image": 2} or {"image": {"count": 2}}'
_LIMIT_FIELDS = frozenset({"count", "width", "height"})  # vLLM's; width and height only size its profiling
_DOMAINS_FORM = 'host names or IP addresses, comma-separated or a JSON list such as ["images.example.com"]'
_HOST = re.compile(r"(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*")


@dataclass(frozen=True)
class MediaOptions:
    """The operator's media limits (see module docstring); the defaults refuse every remote and
    local URL, so only ``data:`` URLs load."""

    limit_images: int = DEFAULT_IMAGE_LIMIT
    allowed_media_domains: tuple[str, ...] = ()
    allowed_local_media_path: str | None = None
    fetch_timeout: float = DEFAULT_FETCH_TIMEOUT
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS


def read_media_options(r: Reader) -> MediaOptions:
    """The media options of the properties ``r`` reads; a ``ConfigError`` naming the key otherwise."""
    pixels = r.integer("max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS, minimum=1)
    size = r.integer("max_image_bytes", DEFAULT_MAX_IMAGE_BYTES, minimum=1)
    assert pixels is not None and size is not None
    return MediaOptions(
        limit_images=_image_limit(r),
        allowed_media_domains=_domains(r),
        allowed_local_media_path=_local_path(r),
        fetch_timeout=r.number("media_fetch_timeout", DEFAULT_FETCH_TIMEOUT, 0.0, MAX_FETCH_TIMEOUT),
        max_image_bytes=size,
        max_image_pixels=pixels,
    )


def _image_limit(r: Reader) -> int:
    found = r.get("limit_mm_per_prompt")
    if found is None:
        return DEFAULT_IMAGE_LIMIT
    label, text = found
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{label} is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}",
                          field=label) from exc
    if not isinstance(value, dict):
        raise r.fail(label, text, _LIMIT_FORM)
    others = sorted(str(name) for name in value if name != "image")
    if others:
        raise ConfigError(f"{label}: modality {others[0]!r} is not served (images only); allowed: {_LIMIT_FORM}",
                          field=label)
    count = value.get("image", DEFAULT_IMAGE_LIMIT)
    if isinstance(count, dict):
        unknown = sorted(str(name) for name in count if name not in _LIMIT_FIELDS)
        if unknown or "count" not in count:
            raise r.fail(label, text, _LIMIT_FORM)
        count = count["count"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigError(f"{label}: image={count!r} is invalid; allowed: an integer >= 0", field=label)
    return count


def _domains(r: Reader) -> tuple[str, ...]:
    found = r.get("allowed_media_domains")
    if found is None:
        return ()
    label, text = found
    names: object = text.split(",")
    if text.startswith("["):
        try:
            names = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{label} is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}",
                              field=label) from exc
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise r.fail(label, text, _DOMAINS_FORM)
    hosts: list[str] = []
    for name in names:
        if not name.strip():
            continue
        host = normalize_host(name.strip().lstrip("."))
        if host is None:
            raise ConfigError(f"{label}: {name.strip()!r} is not a host name or IP address; allowed: {_DOMAINS_FORM}",
                              field=label)
        if host not in hosts:
            hosts.append(host)
    return tuple(hosts)


def normalize_host(name: str) -> str | None:
    """``name`` as hosts are compared: lower case, no trailing dot, an IP in its canonical form (IPv6
    without brackets); None when it is neither a host name nor an IP literal."""
    name = name.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    name = name[:-1] if name.endswith(".") else name
    return name if _HOST.fullmatch(name) else None


def _local_path(r: Reader) -> str | None:
    found = r.get("allowed_local_media_path")
    if found is None:
        return None
    label, text = found
    if not os.path.isabs(text) or not os.path.isdir(text):
        raise r.fail(label, text, "an existing directory given by its absolute path")
    return os.path.realpath(text)
