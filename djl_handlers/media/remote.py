"""Fetching an image over ``http(s):`` from the hosts the operator allows, and nowhere else.

* The URL's host must be in ``option.allowed_media_domains``: listed exactly, or a subdomain of a
  listed name (``example.com`` allows ``cdn.example.com``; a listed IP allows that address only).
* The host is resolved once; when any of its addresses is loopback, private, link-local, reserved,
  multicast, unspecified or otherwise not public, it is refused unless the host itself (name or IP)
  is listed exactly, or that address is: the operator chose it. The connection goes to a checked address, never to a
  second resolution, so a name cannot resolve to another address between the check and the
  connection (DNS rebinding). HTTPS verifies the certificate against the URL's host name.
* Redirects are not followed (a 3xx is refused): the next URL would need the same checks, and a
  client can send the final URL itself. Proxy settings of the environment are not used.
* ``option.media_fetch_timeout`` bounds connecting and the whole response together (one deadline);
  the body is read in pieces and refused as soon as it passes ``option.max_image_bytes`` (at once
  when its Content-Length says so). Name resolution itself is bounded by the system's resolver.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

from djl_handlers.config.media import MediaOptions, normalize_host
from djl_handlers.errors import InvalidRequest

__all__ = ["fetch_remote", "host_allowed", "is_public_address", "too_large"]

_CHUNK = 64 * 1024
_Addresses = list[tuple[int, tuple[object, ...]]]  # (family, socket address), checked


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str
    port: int
    netloc: str
    path: str


def fetch_remote(url: str, part: str, options: MediaOptions) -> bytes:
    """The body of a GET of ``url`` within ``options``; an ``InvalidRequest`` naming ``part`` otherwise."""
    if not options.allowed_media_domains:
        raise InvalidRequest(f"{part}: remote image URLs are off; send the image as a data: URL, or the server's "
                             "operator can allow hosts with option.allowed_media_domains", field=part)
    target = _target(url, part)
    allowed, exact = host_allowed(target.host, options.allowed_media_domains)
    if not allowed:
        raise InvalidRequest(f"{part}: host {target.host!r} is not one the server fetches images from "
                             "(option.allowed_media_domains); send the image as a data: URL", field=part)
    deadline = time.monotonic() + options.fetch_timeout
    addresses = _resolve(target, part, () if exact else options.allowed_media_domains)
    try:
        return _get(target, addresses, deadline, part, options.max_image_bytes)
    except (OSError, http.client.HTTPException) as exc:
        late = time.monotonic() >= deadline or isinstance(exc, TimeoutError)
        reason = f"no complete answer within {options.fetch_timeout:g} s (option.media_fetch_timeout)" if late \
            else (str(exc) or type(exc).__name__)
        raise InvalidRequest(f"{part}: could not fetch the image from {target.host!r}: {reason}; check the URL "
                             "or send the image as a data: URL", field=part) from None


def too_large(part: str, size: int | str, limit: int) -> InvalidRequest:
    """The refusal of an image over ``option.max_image_bytes``."""
    return InvalidRequest(f"{part}: the image is {size} bytes, over the server's limit of {limit} bytes "
                          "(option.max_image_bytes); send a smaller image", field=part)


def host_allowed(host: str, domains: tuple[str, ...]) -> tuple[bool, bool]:
    """``(allowed, listed exactly)`` for a normalized ``host`` against the normalized ``domains``."""
    if host in domains:
        return True, True
    if _is_ip(host):
        return False, False
    return any(host.endswith("." + name) for name in domains if not _is_ip(name)), False


def is_public_address(text: str) -> bool:
    """Whether the address ``text`` (a resolved socket address) is a public unicast one."""
    address = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not (address.is_loopback or address.is_private or address.is_link_local
                                      or address.is_reserved or address.is_multicast or address.is_unspecified)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _target(url: str, part: str) -> _Target:
    try:
        parsed = urllib.parse.urlsplit(url)
        port = parsed.port
    except ValueError as exc:
        raise InvalidRequest(f"{part}: the image URL is malformed ({exc})", field=part) from None
    host = normalize_host(parsed.hostname or "")
    if host is None:
        raise InvalidRequest(f"{part}: the image URL has no valid host", field=part)
    if parsed.username is not None or parsed.password is not None:
        raise InvalidRequest(f"{part}: image URLs with credentials (user@host) are not fetched", field=part)
    scheme = parsed.scheme.lower()
    path = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
    return _Target(scheme, host, port or (443 if scheme == "https" else 80), parsed.netloc, path)


def _resolve(target: _Target, part: str, checked: tuple[str, ...]) -> _Addresses:
    """The host's addresses; unless its host was listed exactly (``checked`` empty), each must be
    public or listed itself."""
    try:
        found = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise InvalidRequest(f"{part}: could not resolve host {target.host!r} ({exc}); check the URL",
                             field=part) from None
    addresses: _Addresses = [(family, tuple(sockaddr)) for family, _, _, _, sockaddr in found
                 if family in (socket.AF_INET, socket.AF_INET6)]
    if not addresses:
        raise InvalidRequest(f"{part}: host {target.host!r} has no IP address; check the URL", field=part)
    for _, sockaddr in addresses:
        address = str(sockaddr[0]).split("%", 1)[0]
        if checked and not is_public_address(address) and normalize_host(address) not in checked:
            raise InvalidRequest(f"{part}: host {target.host!r} resolves to a non-public address ({address}); such "
                                 "a host is fetched only when it or that address is listed in "
                                 "option.allowed_media_domains", field=part)
    return addresses


def _connect(target: _Target, addresses: _Addresses, deadline: float) -> socket.socket:
    error: OSError = TimeoutError("connect timed out")
    for family, sockaddr in addresses:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(remaining)
            sock.connect(sockaddr)
            if target.scheme == "https":
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                return ssl.create_default_context().wrap_socket(sock, server_hostname=target.host)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error


def _get(target: _Target, addresses: _Addresses, deadline: float, part: str, limit: int) -> bytes:
    sock = _connect(target, addresses, deadline)
    expired = threading.Event()

    def cut() -> None:  # the deadline passed: end every read now, however slowly the server sends
        expired.set()
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass

    watchdog = threading.Timer(max(deadline - time.monotonic(), 0.0), cut)
    watchdog.daemon = True
    watchdog.start()
    conn = http.client.HTTPConnection(target.host, target.port)
    conn.sock = sock
    try:
        conn.request("GET", target.path, headers={"Host": target.netloc, "Accept": "image/*",
                                                  "User-Agent": "djl-handlers"})
        response = conn.getresponse()
        _check_status(response, part, limit)
        body = _read_body(response, part, limit)
        if expired.is_set():
            raise TimeoutError("deadline passed")
        return body
    finally:
        watchdog.cancel()
        conn.close()


def _check_status(response: http.client.HTTPResponse, part: str, limit: int) -> None:
    if 300 <= response.status < 400:
        raise InvalidRequest(f"{part}: the image URL answered {response.status} (a redirect); redirects are not "
                             "followed: send the final URL", field=part)
    if response.status != 200:
        raise InvalidRequest(f"{part}: the image URL answered {response.status} {response.reason[:80]!r}; check "
                             "the URL", field=part)
    if response.length is not None and response.length > limit:
        raise too_large(part, response.length, limit)


def _read_body(response: http.client.HTTPResponse, part: str, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while chunk := response.read(_CHUNK):
        total += len(chunk)
        if total > limit:
            raise too_large(part, f"more than {limit}", limit)
        chunks.append(chunk)
    if response.length:  # the connection ended before Content-Length bytes came
        raise http.client.IncompleteRead(b"", response.length)
    return b"".join(chunks)
