"""option.limit_mm_per_prompt, allowed_media_domains, allowed_local_media_path and the image bounds."""

from __future__ import annotations

import os

import pytest

from djl_handlers.config.media import (
    DEFAULT_FETCH_TIMEOUT,
    DEFAULT_IMAGE_LIMIT,
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    MediaOptions,
    normalize_host,
    read_media_options,
)
from djl_handlers.config.reader import Reader
from djl_handlers.errors import ConfigError


def read(**options: str) -> MediaOptions:
    return read_media_options(Reader(options, {}))


def refused(key: str, **options: str) -> str:
    with pytest.raises(ConfigError) as info:
        read(**options)
    assert info.value.field == f"option.{key}"
    return info.value.message


def test_defaults_refuse_every_url_but_data() -> None:
    options = read()
    assert options == MediaOptions()
    assert (options.limit_images, options.allowed_media_domains, options.allowed_local_media_path) == \
        (DEFAULT_IMAGE_LIMIT, (), None)
    assert (options.fetch_timeout, options.max_image_bytes, options.max_image_pixels) == \
        (DEFAULT_FETCH_TIMEOUT, DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS)


@pytest.mark.parametrize("text, limit", [
    ('{"image": 2}', 2),
    (' {"image": 0} ', 0),
    ('{"image": {"count": 3}}', 3),
    ('{"image": {"count": 5, "width": 512, "height": 512}}', 5),
    ("{}", DEFAULT_IMAGE_LIMIT),
])
def test_limit_mm_per_prompt_reads_vllms_forms(text: str, limit: int) -> None:
    assert read(limit_mm_per_prompt=text).limit_images == limit


@pytest.mark.parametrize("text, words", [
    ('{"image": 2, "video": 1}', "'video' is not served"),
    ('{"audio": 1}', "'audio' is not served"),
    ('{"image": -1}', "image=-1"),
    ('{"image": 1.5}', "image=1.5"),
    ('{"image": "2"}', "image='2'"),
    ('{"image": true}', "image=True"),
    ('{"image": {"count": -2}}', "image=-2"),
    ('{"image": {"width": 512}}', "is invalid"),
    ('{"image": {"count": 2, "frames": 3}}', "is invalid"),
    ("[2]", "is invalid"),
    ("2", "is invalid"),
    ("{image: 2}", "not valid JSON"),
])
def test_limit_mm_per_prompt_refuses(text: str, words: str) -> None:
    assert words in refused("limit_mm_per_prompt", limit_mm_per_prompt=text)


@pytest.mark.parametrize("text, hosts", [
    ("images.example.com", ("images.example.com",)),
    ("Images.Example.COM., cdn.example.org ,", ("images.example.com", "cdn.example.org")),
    ('["127.0.0.1", "[::1]", "A.example"]', ("127.0.0.1", "::1", "a.example")),
    (".example.com,example.com", ("example.com",)),
    ("0:0::1", ("::1",)),
])
def test_allowed_media_domains_are_normalized(text: str, hosts: tuple[str, ...]) -> None:
    assert read(allowed_media_domains=text).allowed_media_domains == hosts


@pytest.mark.parametrize("text", [
    "http://images.example.com", "example.com/images", "example.com:8080", "exa mple.com", '["a.com", 3]',
    '["a.com"', '{"host": "a.com"}', "-bad.example.com",
])
def test_allowed_media_domains_refuses_what_is_not_a_host(text: str) -> None:
    refused("allowed_media_domains", allowed_media_domains=text)


def test_normalize_host() -> None:
    assert normalize_host("[2001:DB8::1]") == "2001:db8::1"
    assert normalize_host("Host.Example.") == "host.example"
    assert normalize_host("") is None
    assert normalize_host("a..b") is None


def test_allowed_local_media_path_must_be_an_existing_absolute_directory(tmp_path: os.PathLike[str]) -> None:
    root = os.fspath(tmp_path)
    os.mkdir(os.path.join(root, "real"))
    os.symlink(os.path.join(root, "real"), os.path.join(root, "link"))
    assert read(allowed_local_media_path=os.path.join(root, "link")).allowed_local_media_path == \
        os.path.realpath(os.path.join(root, "real"))
    open(os.path.join(root, "file.png"), "wb").close()
    for bad in ("relative/dir", os.path.join(root, "missing"), os.path.join(root, "file.png")):
        assert "absolute path" in refused("allowed_local_media_path", allowed_local_media_path=bad)


@pytest.mark.parametrize("key, value", [
    ("media_fetch_timeout", "0"), ("media_fetch_timeout", "-1"), ("media_fetch_timeout", "nan"),
    ("media_fetch_timeout", "inf"), ("media_fetch_timeout", "soon"),
    ("max_image_bytes", "0"), ("max_image_bytes", "1.5"), ("max_image_bytes", "-3"),
    ("max_image_pixels", "0"), ("max_image_pixels", "big"),
])
def test_bounds_refuse_what_is_not_positive(key: str, value: str) -> None:
    assert repr(value) in refused(key, **{key: value})


def test_bounds_are_read() -> None:
    options = read(media_fetch_timeout="0.25", max_image_bytes="1024", max_image_pixels="640000")
    assert (options.fetch_timeout, options.max_image_bytes, options.max_image_pixels) == (0.25, 1024, 640000)
