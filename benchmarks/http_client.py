"""A minimal HTTP/1.1 keep-alive client on asyncio streams, the server benchmark's default load generator.

Why not httpx: on this 2-core box the generator shares the CPU with the server it measures, and
httpx's per-chunk cost is high enough to become the bottleneck; at 64 clients it stalled (both the
server and the client mostly idle, ~10 requests/s) where this client drove the same server at
160-220 requests/s with a quarter of the client CPU. ``--client httpx`` keeps the old generator.

One connection per client, one request at a time; the response is read by its framing
(``Content-Length`` or chunked), so the time to the first body chunk is the time to first token.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Sample", "stream_client"]


class Sample(Protocol):
    """Where a client records its results (``benchmarks.server.Load``)."""

    ttft: list[float]
    latency: list[float]
    tokens: int
    errors: int


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, bool, int | None]:
    """``(status, chunked, content_length)``."""
    status = int((await reader.readline()).split()[1])
    chunked, length = False, None
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            return status, chunked, length
        name, _, value = line.decode("latin-1").partition(":")
        name = name.strip().lower()
        if name == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
        elif name == "content-length":
            length = int(value)


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes,
               sample: Sample) -> None:
    began = time.perf_counter()
    writer.write(request)
    status, chunked, length = await _read_head(reader)
    first: float | None = None
    data = bytearray()
    if chunked:
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                break
            data += (await reader.readexactly(size + 2))[:-2]
            if first is None:
                first = time.perf_counter() - began
    else:
        data += await reader.readexactly(length or 0)
        first = time.perf_counter() - began
    if status != 200 or first is None or not data.endswith(b"\n"):
        sample.errors += 1
        return
    sample.ttft.append(first)
    sample.latency.append(time.perf_counter() - began)
    sample.tokens += data.count(b"\n")


async def stream_client(host: str, port: int, path: str, payload: bytes, stop_at: float, sample: Sample) -> None:
    """POST ``payload`` to ``path`` one request after another until ``stop_at`` (perf_counter)."""
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\n\r\n").encode("latin-1") + payload
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop_at:
            try:
                await _one(reader, writer, request, sample)
            except (OSError, ValueError, IndexError, asyncio.IncompleteReadError):
                sample.errors += 1
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
    finally:
        writer.close()
