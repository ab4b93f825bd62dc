"""Local server lifecycle: start-up failure, worker death and restart, SIGTERM draining, streaming."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from test_server_harness import MODELS, ROOT, ServerProcess, cli_command, cli_env, copy_model, serve  # noqa: F401
from test_server_harness import wait_until as _wait


def _rolling_body(prompt: str, tokens: int) -> bytes:
    return json.dumps({"inputs": prompt, "parameters": {"max_new_tokens": tokens}}).encode()


def _paused(tmp_path: Path) -> tuple[Path, Path]:
    pause = tmp_path / "pause"
    pause.write_text("")
    model = copy_model(tmp_path, "fake_rolling", f"option.pause_file={pause}\noption.fake_delay=0.01")
    return model, pause


def test_init_failure_stops_start_up_with_the_message() -> None:
    result = subprocess.run(cli_command("serve", str(MODELS / "fake_failing"), "--port", "0"),
                            capture_output=True, text=True, env=cli_env(), cwd=str(ROOT), timeout=120)
    assert result.returncode == 1
    assert "fake init failure: option.model_id is missing" in result.stderr
    assert "serving" not in result.stdout


def test_worker_killed_mid_call_fails_only_that_request_and_restarts(tmp_path: Path, serve: object) -> None:  # noqa: F811
    server: ServerProcess = serve(copy_model(tmp_path, "fake_dynamic", "batch_size=1"))  # type: ignore[operator]
    old_pid = server.worker_pid()
    with ThreadPoolExecutor(1) as pool, server.client() as client:
        pending = pool.submit(client.post, "/invocations", content=b"{}", headers={"x-fake-action": "sleep"})
        _wait(lambda: "djl_handlers_in_flight{model=\"fake_dynamic\"} 1" in client.get("/metrics").text,
              "the request to reach the worker")
        os.kill(old_pid, signal.SIGKILL)
        failed = pending.result()
    assert failed.status_code == 500
    assert failed.json()["type"] == "WorkerDiedException"
    server.wait_healthy()
    with server.client() as client:
        again = client.post("/invocations", content=b"{}")
        assert again.status_code == 200
        assert json.loads(again.content)["pid"] != old_pid
        assert 'djl_handlers_worker_restarts_total{model="fake_dynamic"} 1' in client.get("/metrics").text


def test_worker_killed_mid_stream_ends_the_stream_with_an_error(tmp_path: Path, serve: object) -> None:  # noqa: F811
    model, pause = _paused(tmp_path)
    server: ServerProcess = serve(model)  # type: ignore[operator]
    pid = server.worker_pid()
    with server.client() as client, client.stream("POST", "/invocations",
                                                  content=_rolling_body("doomed", 50)) as response:
        lines = response.iter_lines()
        assert json.loads(next(lines))["token"] == 0
        os.kill(pid, signal.SIGKILL)
        rest = [line for line in lines if line]
    assert json.loads(rest[-1])["code"] == 500
    assert "died" in json.loads(rest[-1])["error"]
    server.wait_healthy()
    pause.unlink()
    with server.client() as client:
        response = client.post("/invocations", content=_rolling_body("after", 2))
    assert response.status_code == 200
    assert [json.loads(line)["prompt"] for line in response.text.splitlines()] == ["after", "after"]


def test_sigterm_drains_in_flight_requests_and_exits_zero(tmp_path: Path, serve: object) -> None:  # noqa: F811
    model, pause = _paused(tmp_path)
    server: ServerProcess = serve(model)  # type: ignore[operator]
    with server.client() as client, client.stream("POST", "/invocations",
                                                  content=_rolling_body("draining", 4)) as response:
        lines = response.iter_lines()
        assert json.loads(next(lines))["token"] == 0
        server.proc.send_signal(signal.SIGTERM)
        with server.client() as other:
            _wait(lambda: other.post("/invocations", content=_rolling_body("late", 1)).status_code == 503,
                  "new requests to be refused")
            assert other.get("/ping").status_code == 503
        pause.unlink()
        rest = [json.loads(line)["token"] for line in lines if line]
    assert rest == [1, 2, 3]
    assert server.proc.wait(timeout=30) == 0


def test_sigterm_fails_what_outlives_the_grace_period(tmp_path: Path, serve: object) -> None:  # noqa: F811
    model, _pause = _paused(tmp_path)
    server: ServerProcess = serve(model, grace=0.5)  # type: ignore[operator]
    with server.client() as client, client.stream("POST", "/invocations",
                                                  content=_rolling_body("stuck", 50)) as response:
        lines = response.iter_lines()
        assert json.loads(next(lines))["token"] == 0
        server.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line]
    assert json.loads(rest[-1])["code"] == 503
    assert server.proc.wait(timeout=30) == 0


def test_streaming_output_is_chunked_with_its_content_type(serve: object) -> None:  # noqa: F811
    server: ServerProcess = serve(MODELS / "fake_streaming")  # type: ignore[operator]
    with server.client() as client:
        body = json.dumps({"inputs": "one two three"}).encode()
        with client.stream("POST", "/invocations", content=body) as response:
            assert response.headers["content-type"] == "application/jsonlines"
            assert response.headers.get("transfer-encoding") == "chunked"
            lines = [json.loads(line) for line in response.iter_lines() if line]
        assert lines == [{"outputs": "one"}, {"outputs": "two"}, {"outputs": "three"}]
        failing = json.dumps({"inputs": "a b c", "parameters": {"fail_after": 1}}).encode()
        text = client.post("/invocations", content=failing).text
    assert text.startswith('{"outputs":"a"}') or text.startswith('{"outputs": "a"}')
    assert text.endswith("fake stream failure")
