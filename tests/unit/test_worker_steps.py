"""The worker-driven rolling batch (protocol/worker_steps.py, worker/stepping.py, server/worker_channel.py):
the delta frames, matching replies by id, and the whole exchange over a real socket pair with the
worker's own ``serve_connection`` running the real rolling handler on the fake engine."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import pytest
from socket_worker import SocketWorker

from djl_handlers.engines.fake import REPLY, FakeEngine
from djl_handlers.io import wire
from djl_handlers.io.compat import input_from_frame
from djl_handlers.protocol.messages import BatchFailure, WorkerRequest
from djl_handlers.protocol.rolling import FrontEndSlot
from djl_handlers.protocol.worker_steps import PAUSED, SLOTS, Delta, apply_reply, delta_frame, read_delta
from djl_handlers.server.worker_channel import StepChannel
from djl_handlers.service import InferenceService
from djl_handlers.worker.process import serve_connection
from djl_handlers.worker.stepping import FrameReader


def _request(tokens: int, stream: bool = True) -> WorkerRequest:
    body = {"inputs": "hi", "parameters": {"max_new_tokens": tokens}, "stream": stream}
    return WorkerRequest({"Content-Type": "application/json"}, [("data", json.dumps(body).encode())])


# -- frames ---------------------------------------------------------------------------------------

def test_delta_frames_round_trip() -> None:
    delta = Delta("handle", [("7", _request(3)), ("8", WorkerRequest({"a": "1"}, [("data", b"")]))], ["2", "5"], True)
    properties, content = delta_frame(delta)
    back = read_delta(*wire_roundtrip(properties, content))
    assert back.handler == "handle" and back.cancel == ["2", "5"] and back.pause
    assert [slot_id for slot_id, _ in back.new] == ["7", "8"]
    assert back.new[0][1].properties == {"Content-Type": "application/json"}
    assert back.new[0][1].data() == _request(3).data() and back.new[1][1].data() == b""
    assert read_delta(*delta_frame(Delta("h"))) == Delta("h")


def wire_roundtrip(properties: dict[str, str], content: list[tuple[str | None, bytes]]) -> Any:
    parsed = wire.read_input_frame(__import__("io").BytesIO(wire.encode_input_frame(properties, content)))
    return parsed


def test_a_new_request_without_its_body_is_refused() -> None:
    with pytest.raises(ValueError, match="no body for new request 3"):
        read_delta({"djlh_new": "3"}, [])


def _record(data: str, last: bool) -> bytes:
    return wire.binary_encode({"data": data, "last": "true" if last else "false"})


def test_replies_are_matched_by_id_and_finished_requests_leave() -> None:
    view = {str(i): FrontEndSlot(request=_request(1), owner=i) for i in (1, 2, 3)}
    frame = wire.OutputFrame(200, "OK", {SLOTS: "3,1", "batch_0_X-A": "b"},
                             [(None, _record("c", True)), (None, _record("a", False))])
    results = apply_reply(frame, view)
    assert [(slot.owner, record.data, record.last) for slot, record, _ in results] == [(3, "c", True), (1, "a", False)]
    assert results[0][2] == {"X-A": "b"} and list(view) == ["1", "2"]


def test_a_failed_step_fails_exactly_the_requests_it_held() -> None:
    view = {str(i): FrontEndSlot(request=_request(1), owner=i) for i in (1, 2, 3)}
    with pytest.raises(BatchFailure, match="Batch output size mismatch") as info:
        apply_reply(wire.OutputFrame(200, "OK", {SLOTS: "1,2"}, [(None, _record("a", False))]), view)
    assert [slot.owner for slot in info.value.slots] == [1, 2] and list(view) == ["3"]
    with pytest.raises(BatchFailure, match="Batch inference failed: boom") as info:
        apply_reply(wire.OutputFrame(500, "boom", {SLOTS: "3"}, []), view)
    assert info.value.code == 500 and not view


def test_a_reply_naming_an_unknown_request_is_a_protocol_error() -> None:
    with pytest.raises(ValueError, match="does not hold"):
        apply_reply(wire.OutputFrame(200, "OK", {SLOTS: "9"}, [(None, _record("a", True))]), {})


def test_the_frame_reader_waits_only_when_asked() -> None:
    ours, other = socket.socketpair()
    reader = FrameReader(ours)
    assert reader.next(block=False) is None
    one = wire.encode_input_frame({"a": "1"}, [("data", b"x" * 5000)])
    two = wire.encode_input_frame({"b": "2"}, [])
    other.sendall(one[:7])
    assert reader.next(block=False) is None  # half a frame
    other.sendall(one[7:] + two)
    assert reader.next(block=False) == ({"a": "1"}, [("data", b"x" * 5000)])
    assert reader.next(block=False) == ({"b": "2"}, [])
    other.sendall(two[:3])
    other.close()
    with pytest.raises(ValueError, match="end of stream inside a frame"):
        reader.next(block=True)
    ours.close()


# -- the whole exchange ---------------------------------------------------------------------------

class _Service:
    """The worker's ``HandlerService`` slice: the real rolling handler on the fake engine."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.service = InferenceService("huggingface", engine_factory=lambda config: FakeEngine())
        assert self.service.handle(input_from_frame({"rolling_batch": "auto"}, [])) is None

    def invoke(self, inputs: Any) -> Any:
        time.sleep(self.delay)  # a step that takes time, so that deltas cross steps on the wire
        return self.service.handle(inputs)


def _worker(sock: socket.socket, timeout: float = 5.0) -> SocketWorker:
    return SocketWorker(sock, timeout, close_on_kill=False)  # the test closes its end itself


def _worker_thread(conn: socket.socket, delay: float = 0.0) -> threading.Thread:
    thread = threading.Thread(target=serve_connection, args=(conn, _Service(delay), {}), daemon=True)
    thread.start()
    return thread


_ACKS: dict[StepChannel, int] = {}


async def _collect(channel: StepChannel, view: dict[str, FrontEndSlot], event: asyncio.Event,
                   texts: dict[str, str], others: list[wire.OutputFrame], until: Any) -> None:
    """Apply step replies (their records' text to ``texts``; other frames to ``others``) until ``until()``."""
    deadline = time.monotonic() + 10
    while True:
        event.clear()
        taken = 0
        while channel.frames:
            frame = channel.frames.popleft()
            if SLOTS not in frame.properties:
                others.append(frame)
                continue
            ids = frame.properties[SLOTS].split(",")
            for slot_id, (_, record, _) in zip(ids, apply_reply(frame, view), strict=True):
                texts[slot_id] = texts.get(slot_id, "") + record.data
            taken += 1
        if taken:  # the worker runs at most WINDOW steps ahead of these acknowledgements
            _ACKS[channel] = _ACKS.get(channel, 0) + taken
            channel.send(delta_frame(Delta("handle", ack=_ACKS[channel])))
        if until():
            return
        assert time.monotonic() < deadline, "timed out"
        await asyncio.wait_for(event.wait(), 5)


def test_the_worker_steps_on_its_own_and_takes_deltas_between_steps() -> None:
    ours, other = socket.socketpair()
    ours.settimeout(5.0)
    thread = _worker_thread(other, delay=0.002)

    async def main() -> tuple[dict[str, str], list[wire.OutputFrame], bool]:
        event = asyncio.Event()
        channel = StepChannel(asyncio.get_running_loop(), _worker(ours), event.set)  # type: ignore[arg-type]
        view: dict[str, FrontEndSlot] = {}
        texts: dict[str, str] = {}
        others: list[wire.OutputFrame] = []
        view["1"], view["2"] = FrontEndSlot(request=_request(12)), FrontEndSlot(request=_request(30))
        channel.send(delta_frame(Delta("handle", [("1", _request(12)), ("2", _request(30))])))
        channel.expect(True)
        await _collect(channel, view, event, texts, others, lambda: "1" not in view)  # one delta, 12 steps
        view["3"] = FrontEndSlot(request=_request(5))  # joins while 2 is running
        channel.send(delta_frame(Delta("handle", [("3", _request(5))])))
        await _collect(channel, view, event, texts, others, lambda: "3" not in view)
        channel.send(delta_frame(Delta("handle", pause=True)))  # an answer, then no step until the next delta
        await _collect(channel, view, event, texts, others, lambda: any(PAUSED in f.properties for f in others))
        before = texts.get("2", "")
        await asyncio.sleep(0.2)
        silent = not channel.frames and "2" in view and texts.get("2", "") == before
        channel.send(delta_frame(Delta("handle", cancel=["2"])))  # resumes; 2 ends at its next step
        await _collect(channel, view, event, texts, others, lambda: not view)
        channel.expect(False)
        channel.close()
        return texts, others, silent

    texts, others, silent = asyncio.run(main())
    ours.close()
    thread.join(5)
    assert not thread.is_alive()  # the worker saw the end of the stream
    lines = {k: [json.loads(x) for x in v.splitlines() if x] for k, v in texts.items()}
    assert "".join(x["token"]["text"] for x in lines["1"] if "token" in x) == REPLY[:12]
    assert "".join(x["token"]["text"] for x in lines["3"] if "token" in x) == REPLY[:5]
    assert silent and len(others) == 1
    assert len(lines["2"]) < 30  # cancelled before its 30 tokens


def test_a_worker_that_stops_answering_is_killed_and_named() -> None:
    ours, other = socket.socketpair()
    ours.settimeout(5.0)
    worker = _worker(ours, timeout=0.2)

    async def main() -> str | None:
        event = asyncio.Event()
        channel = StepChannel(asyncio.get_running_loop(), worker, event.set)  # type: ignore[arg-type]
        channel.send(delta_frame(Delta("handle", [("1", _request(3))])))
        channel.expect(True)
        await asyncio.wait_for(event.wait(), 5)
        return channel.failure

    assert asyncio.run(main()) == "the worker did not answer within 0 s"
    assert worker.killed
    ours.close()
    other.close()


@pytest.mark.parametrize(("answer", "expected"), [
    (b"", "EOFError: end of stream"),
    (b"\x00\xc8\xff\xff\xff\xfe", "corrupt frame"),
])
def test_a_worker_that_dies_or_sends_garbage_is_a_failure(answer: bytes, expected: str) -> None:
    ours, other = socket.socketpair()
    ours.settimeout(5.0)
    worker = _worker(ours)

    async def main() -> str | None:
        event = asyncio.Event()
        channel = StepChannel(asyncio.get_running_loop(), worker, event.set)  # type: ignore[arg-type]
        if answer:
            other.sendall(answer)
        else:
            other.close()
        await asyncio.wait_for(event.wait(), 5)
        return channel.failure

    failure = asyncio.run(main())
    assert failure is not None and expected in failure and worker.killed
    ours.close()
    other.close()


def test_the_worker_runs_at_most_window_steps_ahead_of_the_acknowledgements() -> None:
    from djl_handlers.protocol.worker_steps import WINDOW

    ours, other = socket.socketpair()
    ours.settimeout(5.0)
    thread = _worker_thread(other)

    async def main() -> tuple[int, int]:
        event = asyncio.Event()
        channel = StepChannel(asyncio.get_running_loop(), _worker(ours), event.set)  # type: ignore[arg-type]
        channel.send(delta_frame(Delta("handle", [("1", _request(100))])))
        await asyncio.sleep(0.3)  # nothing acknowledged: the worker stops after WINDOW replies
        first = len(channel.frames)
        channel.send(delta_frame(Delta("handle", ack=1)))  # one more step allowed
        await asyncio.sleep(0.3)
        second = len(channel.frames)
        channel.close()
        return first, second

    first, second = asyncio.run(main())
    ours.close()
    thread.join(5)
    assert (first, second) == (WINDOW, WINDOW + 1)


def test_acknowledgements_alone_do_not_end_a_pause() -> None:
    from djl_handlers.worker.stepping import Stepper

    sent: list[bytes] = []
    stepper = Stepper(lambda p, c: None, lambda o: b"", sent.append, window=2)
    stepper.take(*delta_frame(Delta("handle", [("1", _request(3))])))
    assert stepper.running
    stepper.steps_sent = 2
    assert not stepper.running  # two replies unacknowledged
    stepper.take(*delta_frame(Delta("handle", ack=1)))
    assert stepper.running and stepper.acked == 1
    stepper.take(*delta_frame(Delta("handle", pause=True)))
    assert not stepper.running and len(sent) == 1  # the pause is answered at once
    stepper.take(*delta_frame(Delta("handle", ack=2)))
    assert not stepper.running and stepper.paused
    stepper.take(*delta_frame(Delta("handle", resume=True)))
    assert stepper.running
    stepper.take(*delta_frame(Delta("handle", ack=0)))
    assert stepper.acked == 2  # never goes back
