"""The server's heap under load: requests leave no reference cycles behind, and both processes
settle their start-up heap (djl_handlers/heap.py).

The first test runs the real front end in this process (uvicorn on a thread, the fake rolling worker
as its subprocess, real HTTP) with the garbage collector off: an object of a finished request that is
still tracked is held by a cycle (or leaked), and would have cost a collection.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import uvicorn
from test_server_harness import ServerProcess, copy_model, wait_until

from djl_handlers.server.app import create_app
from djl_handlers.server.runtime import ModelRuntime
from djl_handlers.server.settings import load_settings

PER_REQUEST_TYPES = ("ResponseSink", "RequestTrace", "FrontEndSlot", "WorkerRequest", "RequestResponseCycle")


def _body(prompt: str, tokens: int, **params: object) -> bytes:
    return json.dumps({"inputs": prompt, "parameters": {"max_new_tokens": tokens, **params}}).encode()


def _live(names: tuple[str, ...]) -> dict[str, int]:
    counts = dict.fromkeys(names, 0)
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in counts:
            counts[name] += 1
    return counts


@contextlib.contextmanager
def in_process(model: Path) -> Iterator[tuple[str, ModelRuntime]]:
    """``model`` served by the real front end on a thread of this process; yields (url, runtime)."""
    runtime = ModelRuntime(load_settings(model))
    runtime.start_worker()
    server = uvicorn.Server(uvicorn.Config(create_app(runtime), host="127.0.0.1", port=0, lifespan="on",
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "the in-process server to start")
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        yield f"http://{host}:{port}", runtime
    finally:
        server.should_exit = True
        thread.join(30)
        runtime.worker.stop()


def _no_cycles_after(url: str, runtime: ModelRuntime, requests: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    """Run ``requests`` with the collector off; no per-request object may outlive them."""
    with httpx.Client(base_url=url, timeout=30) as client:  # warm up: lazily built objects are not per request
        assert client.post("/invocations", content=_body("warm", 2)).status_code == 200
    gc.collect()
    gc.disable()
    try:
        before = _live(PER_REQUEST_TYPES)

        async def load() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                await requests(client)

        asyncio.run(load())
        wait_until(lambda: not runtime.outstanding and runtime.in_flight == 0, "the server to go idle")
        time.sleep(0.2)  # the cancelled slots' last records
        after = _live(PER_REQUEST_TYPES)
    finally:
        gc.enable()
    grown = {name: after[name] - before[name] for name in PER_REQUEST_TYPES if after[name] > before[name]}
    assert not grown, f"objects of finished requests still tracked (held by reference cycles): {grown}"


def test_rolling_requests_leave_no_reference_cycles(tmp_path: Path) -> None:
    model = copy_model(tmp_path, "fake_rolling", "option.fake_delay=0.002\noption.max_rolling_batch_size=8\n"
                                                 "job_queue_size=100")

    async def requests(client: httpx.AsyncClient) -> None:
        async def streamed(i: int) -> int:
            async with client.stream("POST", "/invocations", content=_body(f"s{i}", 4)) as response:
                assert len([line async for line in response.aiter_lines() if line]) == 4
                return response.status_code

        async def cancelled(i: int) -> int:  # the client goes away after the first token
            async with client.stream("POST", "/invocations", content=_body(f"c{i}", 500)) as response:
                async for _line in response.aiter_lines():
                    break
                return response.status_code

        async def failed(i: int) -> int:
            return (await client.post("/invocations", content=_body(f"f{i}", 3, fail_at=0))).status_code

        async def rejected(i: int) -> int:  # answered by the front end itself (a request cannot pick the handler)
            return (await client.post("/invocations", content=_body(f"r{i}", 1),
                                      headers={"handler": "other"})).status_code

        kinds = (streamed, cancelled, failed, rejected)
        codes = await asyncio.gather(*(kinds[i % 4](i) for i in range(48)))
        assert codes.count(400) == 12 and codes.count(200) == 24  # 200 streams: 12 whole, 12 cancelled
        assert codes.count(424) == 12  # the record error before any data sets the status

    with in_process(model) as (url, runtime):
        _no_cycles_after(url, runtime, requests)


def test_dynamic_batch_requests_leave_no_reference_cycles(tmp_path: Path) -> None:
    model = copy_model(tmp_path, "fake_dynamic", "max_batch_delay=5\njob_queue_size=100")

    async def requests(client: httpx.AsyncClient) -> None:
        async def one(i: int) -> int:
            headers = {"x-fake-action": "raise"} if i % 8 == 7 else {}
            return (await client.post("/invocations", json={"i": i}, headers=headers)).status_code

        codes = await asyncio.gather(*(one(i) for i in range(32)))
        assert codes.count(200) + codes.count(424) == 32 and codes.count(424) >= 4  # a raise fails its batch

    with in_process(model) as (url, runtime):
        _no_cycles_after(url, runtime, requests)


def test_both_processes_settle_their_heap(tmp_path: Path) -> None:
    server = ServerProcess(copy_model(tmp_path, "fake_rolling"), tmp_path / "server.log")
    try:
        with server.client() as client:
            assert client.post("/invocations", content=_body("x", 2)).status_code == 200
        wait_until(lambda: "worker: heap settled" in server.log_path.read_text(), "the worker's settle line")
        log = server.log_path.read_text()
        assert "front end: heap settled" in log
    finally:
        server.stop()


def test_default_mode_settles_nothing(tmp_path: Path) -> None:
    server = ServerProcess(copy_model(tmp_path, "fake_rolling"), tmp_path / "server.log",
                           env={"DJL_HANDLERS_GC": "default"})
    try:
        with server.client() as client:
            assert client.post("/invocations", content=_body("x", 2)).status_code == 200
        assert "heap settled" not in server.log_path.read_text()
    finally:
        server.stop()
