"""The rolling step's worker exchange on the event loop (server/loop_exchange.py), over a real
socket pair: replies split across writes, a worker that hangs, one that closes, garbage."""

from __future__ import annotations

import asyncio
import io
import random
import socket
import threading
import time
from typing import Any

import pytest
from socket_worker import SocketWorker

from djl_handlers.io import wire
from djl_handlers.server.loop_exchange import start_call
from djl_handlers.server.worker_process import WorkerDied

_Worker = SocketWorker


def _peer(other: socket.socket, answer: Any) -> threading.Thread:
    """Read one request frame on ``other``, then run ``answer(other, properties, content)``."""
    def run() -> None:
        stream = other.makefile("rb")
        properties, content = wire.read_input_frame(stream)
        answer(other, properties, content)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _call(worker: _Worker, properties: dict[str, str], content: list[tuple[str | None, bytes]]) -> Any:
    async def main() -> Any:
        return await start_call(asyncio.get_running_loop(), worker, properties, content)  # type: ignore[arg-type]

    return asyncio.run(main())


def test_reply_written_in_pieces_is_assembled_and_the_request_arrives_whole() -> None:
    ours, other = socket.socketpair()
    ours.settimeout(5.0)
    big = bytes(range(256)) * 4096  # 1 MiB: more than a socket buffer, so the send waits for writability
    reply = wire.encode_output_frame(200, "OK", {"batch_0_Content-Type": "text/plain"},
                                     [(None, b"record-0"), (None, b"record-1")])
    seen: dict[str, Any] = {}

    def answer(sock: socket.socket, properties: dict[str, str], content: list[Any]) -> None:
        seen["properties"], seen["content"] = properties, content
        for piece in (reply[:3], reply[3:11], reply[11:]):
            sock.sendall(piece)
            time.sleep(0.02)

    thread = _peer(other, answer)
    frame = _call(_Worker(ours), {"batch_size": "2"}, [("batch_0.data", big), ("batch_1.data", b"")])
    thread.join(5)
    assert seen["properties"] == {"batch_size": "2"}
    assert seen["content"][0] == ("batch_0.data", big)
    assert (frame.code, frame.message, frame.properties) == (200, "OK", {"batch_0_Content-Type": "text/plain"})
    assert frame.content == [(None, b"record-0"), (None, b"record-1")]


def test_big_reply_over_many_reads() -> None:
    ours, other = socket.socketpair()
    ours.settimeout(5.0)
    records = [(None, bytes([i]) * 300_000) for i in range(8)]  # 2.4 MB: many socket buffers
    reply = wire.encode_output_frame(200, "OK", {}, records)
    thread = _peer(other, lambda sock, *_: sock.sendall(reply))
    frame = _call(_Worker(ours), {}, [])
    thread.join(5)
    assert frame.content == records


def test_streamed_reply_is_read_to_its_end() -> None:
    ours, other = socket.socketpair()
    ours.settimeout(5.0)
    parts = [wire.encode_stream_header(200, "OK", {}), wire.encode_stream_chunk(b"a", True),
             wire.encode_stream_chunk(b"b", False)]
    thread = _peer(other, lambda sock, *_: sock.sendall(b"".join(parts)))
    frame = _call(_Worker(ours), {}, [])
    thread.join(5)
    assert frame.content is None and list(frame.chunks) == [(b"a", True), (b"b", False)]


def test_worker_that_does_not_answer_in_time_is_killed() -> None:
    ours, other = socket.socketpair()
    ours.settimeout(5.0)
    worker = _Worker(ours, timeout=0.2)
    thread = _peer(other, lambda *_: None)  # reads the request, never answers
    with pytest.raises(WorkerDied, match="did not answer within"):
        _call(worker, {}, [])
    thread.join(5)
    assert worker.killed
    other.close()


def test_worker_that_closes_mid_reply_or_sends_garbage_dies() -> None:
    reply = wire.encode_output_frame(200, "OK", {}, [(None, b"x")])
    for answer, expected in (
        (lambda sock, *_: (sock.sendall(reply[:5]), sock.close()), "EOFError"),
        (lambda sock, *_: sock.sendall(reply + b"\x00"), "unexpected bytes"),
        (lambda sock, *_: sock.sendall(b"\x00\xc8\xff\xff\xff\xfe"), "corrupt frame"),
    ):
        ours, other = socket.socketpair()
        ours.settimeout(5.0)
        worker = _Worker(ours)
        thread = _peer(other, answer)
        with pytest.raises(WorkerDied, match=expected):
            _call(worker, {}, [])
        thread.join(5)
        assert worker.killed
        other.close()


def test_no_connection_is_worker_died() -> None:
    worker = _Worker(socket.socket())
    worker.sock = None
    with pytest.raises(WorkerDied, match="not running"):
        _call(worker, {}, [])


def test_parse_output_frame_says_incomplete_until_the_last_byte() -> None:
    reply = wire.encode_output_frame(424, "failed", {"k": "v"}, [("key", b"value")])
    for cut in range(len(reply)):
        assert wire.parse_output_frame(reply[:cut]) is None
    frame, size = wire.parse_output_frame(reply + b"next") or (None, 0)
    assert size == len(reply) and frame is not None
    assert frame.content == wire.read_output_frame(io.BytesIO(reply)).content == [("key", b"value")]


def test_parse_output_frame_agrees_with_the_stream_reader_on_mutated_frames() -> None:
    rng = random.Random(15)
    bases = [
        wire.encode_output_frame(200, "OK", {"batch_0_x": "1", "k": ""}, [(None, b"a"), ("batch_1", b"")]),
        wire.encode_output_frame(424, "", {}, []),
        wire.encode_stream_header(200, "OK", {"p": "q"}) + wire.encode_stream_chunk(b"ab", True)
        + wire.encode_stream_chunk(b"", False),
    ]
    outcomes = set()
    for _ in range(4000):
        data = bytearray(rng.choice(bases))
        for _ in range(rng.randint(0, 3)):
            data[rng.randrange(len(data))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        data = data[: rng.randint(0, len(data))] if rng.random() < 0.3 else data
        raw = bytes(data)
        try:
            frame = wire.read_output_frame(io.BytesIO(raw))
            chunks = list(frame.chunks) if frame.chunks is not None else None
            expected: Any = (frame.code, frame.message, frame.properties, frame.content, chunks)
        except EOFError:
            expected = "incomplete"
        except ValueError as exc:
            expected = "incomplete" if str(exc).startswith("truncated") else "corrupt"
        try:
            parsed = wire.parse_output_frame(raw)
            if parsed is None:
                got: Any = "incomplete"
            else:
                frame, _size = parsed
                chunks = list(frame.chunks) if frame.chunks is not None else None
                got = (frame.code, frame.message, frame.properties, frame.content, chunks)
        except ValueError:
            got = "corrupt"
        assert got == expected, raw
        outcomes.add(expected if isinstance(expected, str) else "frame")
    assert outcomes == {"incomplete", "corrupt", "frame"}


def test_buffered_input_frame_parse_agrees_with_the_field_by_field_reader() -> None:
    rng = random.Random(16)
    bases = [
        wire.encode_input_frame({"batch_size": "2", "batch_0_seed": "7", "k": ""},
                                [("batch_0.data", b'{"inputs": "x"}'), (None, b"")]),
        wire.encode_input_frame({}, []),
    ]
    outcomes = set()
    for _ in range(4000):
        data = bytearray(rng.choice(bases) * rng.choice((1, 2)))  # two frames back to back too
        for _ in range(rng.randint(0, 3)):
            data[rng.randrange(len(data))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        data = data[: rng.randint(0, len(data))] if rng.random() < 0.3 else data
        raw = bytes(data)
        results: list[Any] = []
        for stream in (io.BytesIO(raw), io.BufferedReader(io.BytesIO(raw), buffer_size=rng.choice((16, 8192)))):
            try:
                first = wire.read_input_frame(stream)
                results.append((first, stream.read()))  # what follows the frame stays unread
            except EOFError:
                results.append("eof")
            except ValueError as exc:
                results.append("truncated" if str(exc).startswith("truncated") else str(exc))
        assert results[0] == results[1], raw
        outcomes.add(results[0] if isinstance(results[0], str) and results[0] in ("eof", "truncated") else
                     "corrupt" if isinstance(results[0], str) else "frame")
    assert outcomes == {"eof", "truncated", "corrupt", "frame"}
