"""Local server with the fake rolling-batch model: streaming, isolation, errors, queue, cancellation."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from test_server_harness import ServerProcess, copy_model, module_server, serve  # noqa: F401
from test_server_harness import wait_until as _wait

rolling = module_server("fake_rolling")


def _body(prompt: str, tokens: int, **params: object) -> bytes:
    return json.dumps({"inputs": prompt, "parameters": {"max_new_tokens": tokens, **params}}).encode()


def _stream(server: ServerProcess, prompt: str, tokens: int, **params: object) -> tuple[int, str, list[str]]:
    with server.client() as client, client.stream("POST", "/invocations", content=_body(prompt, tokens, **params),
                                                  headers={"content-type": "application/json"}) as response:
        lines = [line for line in response.iter_lines() if line]
        return response.status_code, response.headers.get("content-type", ""), lines


def test_eight_concurrent_clients_stream_in_order_without_cross_talk(rolling: ServerProcess) -> None:
    prompts = [f"client-{index}" for index in range(8)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: _stream(rolling, prompts[i], 3 + i), range(8)))
    for index, (status, content_type, lines) in enumerate(results):
        assert status == 200
        assert content_type == "application/jsonlines"
        tokens = [json.loads(line) for line in lines]
        assert [t["prompt"] for t in tokens] == [prompts[index]] * (3 + index)
        assert [t["token"] for t in tokens] == list(range(3 + index))
        seeds = {t["seed"] for t in tokens}
        assert len(seeds) == 1 and next(iter(seeds)).isdigit()  # the seed of the first step, kept


def test_chunks_arrive_as_separate_http_chunks(rolling: ServerProcess) -> None:
    with rolling.client() as client, client.stream("POST", "/invocations", content=_body("c", 3)) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        chunks = [chunk for chunk in response.iter_raw() if chunk]
    assert b"".join(chunks).count(b"\n") == 3


def test_per_request_content_type(rolling: ServerProcess) -> None:
    status, content_type, _ = _stream(rolling, "ct", 2, content_type="text/x-custom")
    assert status == 200
    assert content_type == "text/x-custom"


def test_record_error_before_data_sets_status_and_body(rolling: ServerProcess) -> None:
    with rolling.client() as client:
        response = client.post("/invocations", content=_body("bad", 3, fail_at=0))
    assert response.status_code == 424
    assert response.content == b'{"error":"fake failure at token 0","code":424}'  # DJL's bytes
    assert response.headers["content-type"] == "application/jsonlines"  # the request's own type


def test_record_error_after_data_is_the_final_chunk(rolling: ServerProcess) -> None:
    status, _, lines = _stream(rolling, "late", 5, fail_at=2)
    assert status == 200
    assert [json.loads(line)["token"] for line in lines[:2]] == [0, 1]
    assert json.loads(lines[-1]) == {"code": 424, "error": "fake failure at token 2"}
    assert len(lines) == 3


def test_failed_request_does_not_disturb_neighbours(rolling: ServerProcess) -> None:
    with ThreadPoolExecutor(3) as pool:
        good = pool.submit(_stream, rolling, "good", 6)
        bad = pool.submit(_stream, rolling, "bad", 6, fail_at=1)
        other = pool.submit(_stream, rolling, "other", 4)
    assert [json.loads(line)["token"] for line in good.result()[2]] == list(range(6))
    assert json.loads(bad.result()[2][-1])["code"] == 424
    assert [json.loads(line)["prompt"] for line in other.result()[2]] == ["other"] * 4


def _metric(server: ServerProcess, name: str) -> float:
    with server.client() as client:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith(f"djl_handlers_{name}{{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(name)


def _paused_model(tmp_path: Path) -> tuple[Path, Path, Path]:
    pause, log = tmp_path / "pause", tmp_path / "cancelled.log"
    model = copy_model(tmp_path, "fake_rolling", f"option.max_rolling_batch_size=1\njob_queue_size=1\n"
                                                 f"option.pause_file={pause}\noption.cancel_log={log}\n"
                                                 "option.fake_delay=0.01")
    pause.write_text("")
    return model, pause, log


def test_full_queue_answers_503(tmp_path: Path, serve: object) -> None:  # noqa: F811
    model, pause, _ = _paused_model(tmp_path)
    server: ServerProcess = serve(model)  # type: ignore[operator]
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_stream, server, "first", 3)
        _wait(lambda: _metric(server, "in_flight") == 1, "the first request to hold the slot")
        second = pool.submit(_stream, server, "second", 2)
        _wait(lambda: _metric(server, "queue_depth") == 1, "the second request to wait")
        with server.client() as client:
            rejected = client.post("/invocations", content=_body("third", 1))
        assert rejected.status_code == 503
        assert rejected.json()["code"] == 503
        pause.unlink()
        assert len(first.result()[2]) == 3
        assert len(second.result()[2]) == 2


def test_client_disconnect_frees_the_slot(tmp_path: Path, serve: object) -> None:  # noqa: F811
    model, _pause, log = _paused_model(tmp_path)
    server: ServerProcess = serve(model)  # type: ignore[operator]
    with server.client() as client, client.stream("POST", "/invocations", content=_body("gone", 1000)) as response:
        first = next(response.iter_lines())
        assert json.loads(first)["token"] == 0
    # The stream is paused forever after its first token; only a cancellation frees the one slot.
    _wait(lambda: log.exists() and "gone" in log.read_text(), "the handler to see the cancel property")
    status, _, lines = _stream(server, "next", 1)  # finishes on its first token despite the pause file
    assert status == 200
    assert json.loads(lines[0])["prompt"] == "next"
    assert _metric(server, "cancelled_total") == 1


def test_rolling_batch_on_the_real_protocol_only_sends_body_on_first_step(rolling: ServerProcess) -> None:
    # The fake parses only new slots; a second request joining mid-stream must not reset the first.
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(_stream, rolling, "a", 20)
        time.sleep(0.01)
        b = pool.submit(_stream, rolling, "b", 5)
    assert [json.loads(line)["token"] for line in a.result()[2]] == list(range(20))
    assert [json.loads(line)["token"] for line in b.result()[2]] == list(range(5))
