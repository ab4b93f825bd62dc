"""The vision benchmark's requests and load generator: generated images as ``data:`` URLs inside
OpenAI chat requests, and a small streaming client that sends a burst of them at once.

Images: 336x336 JPEG (quality 90), a coarse random colour grid blurred into smooth patches with a
little noise on top, drawn from a seed (distinct per request and per run, so no prefix cache ever
sees one twice). Text prompts are cut from :data:`benchmarks.workload.TEXT` behind a tag.

The client (asyncio streams, one connection per request, ``Connection: close``) posts every request
of a burst together and reads the server-sent events: TTFT is the time to the first event that
carries a choice (vLLM's role-only event comes with the first token, ours with the first token's
text), the completion tokens are the final usage event's, the text is the deltas joined. Its cost
per event is one ``json.loads``: on a 2-core box the load generator shares the CPU with the servers.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChatReply", "Burst", "chat_body", "image_jpeg", "image_message", "run_burst", "text_message"]

SIZE = 336
QUESTION = "What is in the picture?"


def image_jpeg(seed: int, size: int = SIZE) -> bytes:
    """A ``size`` x ``size`` JPEG drawn from ``seed``: smooth colour patches plus some noise."""
    import numpy as np
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(seed)
    grid = Image.fromarray((rng.random((8, 8, 3)) * 255).astype("uint8")).resize((size, size), Image.Resampling.BICUBIC)
    smooth = np.asarray(grid.filter(ImageFilter.GaussianBlur(6)), dtype=np.float32)
    noisy = np.clip(smooth + rng.normal(0, 12, smooth.shape), 0, 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(noisy).save(out, format="JPEG", quality=90)
    return out.getvalue()


def image_message(jpeg: bytes, text: str = QUESTION) -> dict[str, Any]:
    """A user turn with one image (as a ``data:`` URL) and a question."""
    url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                        {"type": "text", "text": text}]}


def text_message(text: str) -> dict[str, Any]:
    """A user turn with text only."""
    return {"role": "user", "content": text}


def chat_body(model: str, message: dict[str, Any], new_tokens: int) -> bytes:
    """A streamed greedy chat request that generates exactly ``new_tokens`` (``ignore_eos``)."""
    return json.dumps({"model": model, "messages": [message], "max_tokens": new_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()


@dataclass
class ChatReply:
    """One streamed reply."""

    status: int = 0
    ttft: float | None = None
    latency: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    text: str = ""
    error: str = ""


@dataclass
class Burst:
    """A burst's replies in request order and its wall time (first send to last byte)."""

    replies: list[ChatReply] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(r.completion_tokens for r in self.replies)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.replies if r.status != 200 or r.error)


async def _body_chunks(reader: asyncio.StreamReader, chunked: bool, length: int | None) -> Any:
    """The response body as it arrives, by its framing."""
    if chunked:
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                return
            yield (await reader.readexactly(size + 2))[:-2]
    elif length is not None:
        yield await reader.readexactly(length)
    else:
        while data := await reader.read(65536):
            yield data


def _event(reply: ChatReply, event: bytes, began: float, parts: list[str]) -> None:
    if not event.startswith(b"data: ") or event == b"data: [DONE]":
        return
    data = json.loads(event[6:])
    choices = data.get("choices") or []
    if choices and reply.ttft is None:
        reply.ttft = time.perf_counter() - began
    for choice in choices:
        parts.append((choice.get("delta") or {}).get("content") or "")
    usage = data.get("usage")
    if usage:
        reply.completion_tokens = int(usage.get("completion_tokens") or 0)
        reply.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    if "error" in data:
        reply.error = json.dumps(data["error"])[:300]


async def _one(host: str, port: int, body: bytes, began: float) -> ChatReply:
    reply = ChatReply()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                      ).encode("latin-1") + body)
        reply.status = int((await reader.readline()).split()[1])
        chunked, length = False, None
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name.strip().lower() == "content-length":
                length = int(value)
        buffer, parts = b"", list[str]()
        async for data in _body_chunks(reader, chunked, length):
            buffer += data
            *events, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
            for event in events:
                _event(reply, event.strip(), began, parts)
        if buffer.strip():
            _event(reply, buffer.strip(), began, parts)
        reply.text = "".join(parts)
        if reply.status != 200 and not reply.error:
            reply.error = buffer[:300].decode(errors="replace")
    except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
        reply.error = f"{type(exc).__name__}: {exc}"
    finally:
        writer.close()
    reply.latency = time.perf_counter() - began
    return reply


async def _burst(url: str, bodies: list[bytes], timeout: float) -> Burst:
    host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
    began = time.perf_counter()
    replies = await asyncio.wait_for(asyncio.gather(*(_one(host, int(port), b, began) for b in bodies)), timeout)
    return Burst(list(replies), time.perf_counter() - began)


def run_burst(url: str, bodies: list[bytes], timeout: float = 600) -> Burst:
    """Post every body at once to ``url``'s ``/v1/chat/completions``; each reply's timings from the
    burst's start."""
    return asyncio.run(_burst(url, bodies, timeout))
