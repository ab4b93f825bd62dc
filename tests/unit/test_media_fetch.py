"""fetch_bytes: data: URLs, allow-listed http(s) on 127.0.0.1 only, file: URLs under the allowed directory.

Every refusal is a 400 whose field is the image's request part."""

from __future__ import annotations

import base64
import io
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.config.media import MediaOptions
from djl_handlers.errors import InvalidRequest
from djl_handlers.media.fetch import fetch_bytes
from djl_handlers.media.images import decode_image, load_images
from djl_handlers.media.records import ImageRef
from djl_handlers.media.remote import host_allowed, is_public_address

PART = "messages[0].content[1].image_url"


def png_bytes(size: tuple[int, int] = (16, 12)) -> bytes:
    from PIL import Image

    image = Image.new("RGB", size)
    image.putdata([(x * 13 % 256, y * 29 % 256, (x + y) % 256) for y in range(size[1]) for x in range(size[0])])
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


PNG = png_bytes()


def data_url(data: bytes = PNG, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def fetch(url: str, options: MediaOptions | None = None) -> bytes:
    return fetch_bytes(ImageRef(url=url, part=PART), options or MediaOptions())


def refusal(url: str, options: MediaOptions | None = None) -> str:
    with pytest.raises(InvalidRequest) as info:
        fetch(url, options)
    assert info.value.status == 400
    assert info.value.field == PART
    assert info.value.message.startswith(PART + ": ")
    return info.value.message


# data: URLs

def test_data_url_base64() -> None:
    assert fetch(data_url()) == PNG
    assert fetch(data_url(media_type="image/png;charset=x")) == PNG
    wrapped = base64.encodebytes(PNG).decode()  # 76-character lines
    assert fetch("data:image/png;base64," + wrapped) == PNG
    assert fetch(data_url().rstrip("=")) == PNG  # padding left off


def test_data_url_percent_encoded() -> None:
    assert fetch("data:image/png," + urllib.parse.quote_from_bytes(PNG)) == PNG
    assert fetch("data:," + urllib.parse.quote_from_bytes(PNG)) == PNG


@pytest.mark.parametrize("url, words", [
    ("data:image/png;base64,iVBOR*w0KGgo=", "base64 data is invalid"),
    ("data:image/png;base64,iVBORw0KG", "base64 data is invalid"),
    ("data:image/png;base64", "needs a comma"),
    ("data:text/html;base64,PGI+", "is not an image"),
])
def test_data_url_refusals(url: str, words: str) -> None:
    assert words in refusal(url)


def test_data_url_over_the_byte_cap() -> None:
    options = MediaOptions(max_image_bytes=len(PNG) - 1)
    assert "option.max_image_bytes" in refusal(data_url(), options)
    assert fetch(data_url(), replace(options, max_image_bytes=len(PNG))) == PNG
    assert "option.max_image_bytes" in refusal("data:image/png," + urllib.parse.quote_from_bytes(PNG), options)


def test_huge_base64_is_refused_before_it_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    import djl_handlers.media.fetch as fetch_module

    def no_decoding(*_: Any, **__: Any) -> bytes:
        raise AssertionError("decoded")

    monkeypatch.setattr(fetch_module, "b64decode", no_decoding)
    message = refusal("data:image/png;base64," + "A" * 4_000_000, MediaOptions(max_image_bytes=1_000_000))
    assert "at least 2999998 bytes" in message


@pytest.mark.parametrize("url, words", [
    ("ftp://example.com/a.png", "scheme 'ftp'"),
    ("example.com/a.png", "no scheme"),
    ("javascript:alert(1)", "scheme 'javascript'"),
])
def test_other_schemes_are_refused(url: str, words: str) -> None:
    assert words in refusal(url)


# http(s): URLs

class _Handler(BaseHTTPRequestHandler):
    release: threading.Event

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        route = self.path.split("?", 1)[0]
        if route == "/img.png":
            self._answer(200, PNG)
        elif route == "/slow":
            self.release.wait(10)
            self._answer(200, PNG)
        elif route == "/drip":  # headers at once, then a byte every 0.1 s
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):
                if self.release.wait(0.1):
                    return
                self.wfile.write(b"x")
                self.wfile.flush()
        elif route == "/huge-length":
            self.send_response(200)
            self.send_header("Content-Length", str(10**12))
            self.end_headers()
            self.wfile.write(b"x" * 1000)
        elif route == "/endless":  # no Content-Length: bytes until the client leaves
            self.send_response(200)
            self.end_headers()
            try:
                while not self.release.is_set():
                    self.wfile.write(b"x" * 65536)
            except OSError:
                return
        elif route == "/short":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PNG) + 100))
            self.end_headers()
            self.wfile.write(PNG)
        elif route == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/img.png")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._answer(404, b"not found")

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve(tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """``127.0.0.1:port`` of a local image server, ended (and its slow answers released) afterwards."""
    release = threading.Event()
    handler = type("Handler", (_Handler,), {"release": release})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture()
def server() -> Iterator[str]:
    yield from serve()


@pytest.fixture()
def tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An HTTPS image server whose self-signed certificate names images.example.com only; the
    client trusts it (and only it)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=images.example.com",
                    "-addext", "subjectAltName=DNS:images.example.com"], check=True, capture_output=True, timeout=60)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    trusting = ssl.create_default_context

    def create_default_context(*_: Any, **__: Any) -> ssl.SSLContext:
        return trusting(cafile=str(cert))

    monkeypatch.setattr(ssl, "create_default_context", create_default_context)
    yield from serve(context)


LOCAL = MediaOptions(allowed_media_domains=("127.0.0.1",), fetch_timeout=2.0)


def test_remote_urls_are_off_without_an_allow_list(server: str) -> None:
    assert "option.allowed_media_domains" in refusal(f"http://{server}/img.png")


def test_a_host_not_listed_is_refused(server: str) -> None:
    options = MediaOptions(allowed_media_domains=("images.example.com", "10.0.0.1"))
    assert "'127.0.0.1' is not one the server fetches" in refusal(f"http://{server}/img.png", options)
    assert "not one" in refusal("https://example.com/a.png", options)  # the parent of a listed name
    assert "not one" in refusal("https://evilimages.example.com/a.png", options)


def test_the_local_server_gives_the_same_image_as_a_data_url(server: str) -> None:
    fetched = fetch(f"http://{server}/img.png?size=small#frag", LOCAL)
    assert fetched == PNG
    options = MediaOptions()
    assert decode_image(fetched, PART, options).digest == decode_image(fetch(data_url()), PART, options).digest


def test_load_images_fetches_remote_ones_in_parallel_and_keeps_the_order(server: str) -> None:
    other = png_bytes((5, 7))
    refs = [ImageRef(f"http://{server}/img.png", "a"), ImageRef(data_url(other), "b"),
            ImageRef(f"http://{server}/img.png?again", "c")]
    loaded = load_images(refs, LOCAL)
    assert [item.part for item in loaded] == ["a", "b", "c"]
    assert [item.image.size for item in loaded] == [(16, 12), (5, 7), (16, 12)]
    assert loaded[0].digest == loaded[2].digest != loaded[1].digest
    with pytest.raises(InvalidRequest) as info:
        load_images([refs[0], ImageRef(f"http://{server}/missing", "d"), ImageRef(f"http://{server}/redirect", "e")],
                    LOCAL)
    assert info.value.field == "d"


def fake_resolver(monkeypatch: pytest.MonkeyPatch, *addresses: str) -> list[str]:
    asked: list[str] = []

    def getaddrinfo(host: str, port: int, *_: Any, **__: Any) -> list[tuple[Any, ...]]:
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in addresses]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def test_a_name_resolving_to_loopback_is_refused_unless_that_address_is_listed(
        server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = fake_resolver(monkeypatch, "127.0.0.1")
    port = server.split(":")[1]
    url = f"http://images.example.com:{port}/img.png"
    options = MediaOptions(allowed_media_domains=("example.com",), fetch_timeout=2.0)
    assert "non-public address (127.0.0.1)" in refusal(url, options)
    assert asked == ["images.example.com"]
    assert fetch(url, replace(options, allowed_media_domains=("example.com", "127.0.0.1"))) == PNG
    assert fetch(url, replace(options, allowed_media_domains=("images.example.com",))) == PNG  # the host itself


def test_https_checks_the_certificate_against_the_urls_host(tls_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_resolver(monkeypatch, "127.0.0.1")  # every name is the local server
    port = tls_server.split(":")[1]
    options = MediaOptions(allowed_media_domains=("images.example.com", "other.example.com"), fetch_timeout=5.0)
    assert fetch(f"https://images.example.com:{port}/img.png", options) == PNG
    message = refusal(f"https://other.example.com:{port}/img.png", options)  # not the certificate's name
    assert "could not fetch" in message and "certificate" in message.lower()


def test_any_non_public_address_refuses_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_resolver(monkeypatch, "93.184.215.14", "10.1.2.3")
    options = MediaOptions(allowed_media_domains=("example.com",))
    assert "non-public address (10.1.2.3)" in refusal("https://cdn.example.com/a.png", options)


@pytest.mark.parametrize("address, public", [
    ("93.184.215.14", True), ("2606:4700::1111", True), ("127.0.0.1", False), ("10.0.0.1", False),
    ("172.16.5.4", False), ("192.168.1.1", False), ("169.254.169.254", False), ("0.0.0.0", False),
    ("224.0.0.1", False), ("100.64.0.1", False), ("240.0.0.1", False), ("::1", False), ("fe80::1%eth0", False),
    ("fc00::1", False), ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False), ("::", False), ("ff02::1", False),
])
def test_is_public_address(address: str, public: bool) -> None:
    assert is_public_address(address) is public


def test_host_allowed() -> None:
    domains = ("example.com", "10.0.0.1")
    assert host_allowed("example.com", domains) == (True, True)
    assert host_allowed("a.b.example.com", domains) == (True, False)
    assert host_allowed("badexample.com", domains) == (False, False)
    assert host_allowed("10.0.0.1", domains) == (True, True)
    assert host_allowed("1.10.0.0.1", domains) == (False, False)


def test_a_slow_server_is_cut_at_the_timeout(server: str) -> None:
    options = replace(LOCAL, fetch_timeout=0.5)
    for route in ("/slow", "/drip"):  # no answer at all; an answer that never ends
        start = time.monotonic()
        message = refusal(f"http://{server}{route}", options)
        assert time.monotonic() - start < 1.5
        assert "could not fetch" in message and "option.media_fetch_timeout" in message


def test_too_many_bytes_are_refused(server: str) -> None:
    options = replace(LOCAL, max_image_bytes=100_000)
    assert f"{10**12} bytes" in refusal(f"http://{server}/huge-length", options)
    start = time.monotonic()
    assert "more than 100000 bytes" in refusal(f"http://{server}/endless", options)
    assert time.monotonic() - start < 1.5


def test_a_short_body_is_refused(server: str) -> None:
    assert "could not fetch" in refusal(f"http://{server}/short", LOCAL)


def test_redirects_are_not_followed(server: str) -> None:
    assert "redirects are not followed" in refusal(f"http://{server}/redirect", LOCAL)


def test_an_error_status_is_refused(server: str) -> None:
    assert "answered 404" in refusal(f"http://{server}/missing.png", LOCAL)


def test_a_closed_port_is_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert "could not fetch" in refusal(f"http://127.0.0.1:{port}/img.png", LOCAL)


@pytest.mark.parametrize("url, words", [
    ("http://user:secret@127.0.0.1/img.png", "credentials"),
    ("http://127.0.0.1:99999/img.png", "malformed"),
    ("http:///img.png", "no valid host"),
])
def test_malformed_remote_urls(url: str, words: str) -> None:
    assert words in refusal(url, LOCAL)


# file: URLs

@pytest.fixture()
def media_dir(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.png").write_bytes(PNG)
    (tmp_path / "secret.png").write_bytes(PNG)
    (root / "escape.png").symlink_to(tmp_path / "secret.png")
    (root / "inside.png").symlink_to(root / "sub" / "a.png")
    return root


def test_file_urls_are_off_by_default(media_dir: Path) -> None:
    assert "option.allowed_local_media_path" in refusal((media_dir / "sub" / "a.png").as_uri())


def test_file_urls_inside_the_allowed_directory(media_dir: Path) -> None:
    options = MediaOptions(allowed_local_media_path=os.path.realpath(media_dir))
    assert fetch((media_dir / "sub" / "a.png").as_uri(), options) == PNG
    assert fetch((media_dir / "inside.png").as_uri(), options) == PNG
    assert fetch("file://localhost" + urllib.parse.quote(str(media_dir / "sub" / "a.png")), options) == PNG
    outside = "outside the directory"
    assert outside in refusal((media_dir.parent / "secret.png").as_uri(), options)
    assert outside in refusal((media_dir / "escape.png").as_uri(), options)  # a symlink leaving it
    assert outside in refusal((media_dir / "sub" / ".." / ".." / "secret.png").as_uri(), options)
    assert outside in refusal(media_dir.as_uri() + "-sibling/a.png", options)
    assert "no image file" in refusal((media_dir / "missing.png").as_uri(), options)
    assert "not a regular file" in refusal((media_dir / "sub").as_uri(), options)
    assert "no host" in refusal("file://otherhost" + str(media_dir / "sub" / "a.png"), options)
    assert "option.max_image_bytes" in refusal((media_dir / "sub" / "a.png").as_uri(),
                                               replace(options, max_image_bytes=len(PNG) - 1))


def test_a_fifo_does_not_block(media_dir: Path) -> None:
    os.mkfifo(media_dir / "pipe.png")
    options = MediaOptions(allowed_local_media_path=os.path.realpath(media_dir))
    assert "not a regular file" in refusal((media_dir / "pipe.png").as_uri(), options)
