"""The worker process over its unix socket, driven frame by frame like DJL's Java side does."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_server_harness import MODELS, ROOT, cli_env

from djl_handlers.io import Output, wire
from djl_handlers.worker.loader import HandlerService, load_entry_point, map_result


class Worker:
    """``python -m djl_handlers.worker`` connected through its socket."""

    def __init__(self, model_dir: Path, sock: Path, entry_point: str = "model.py") -> None:
        self.sock_path = sock
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "djl_handlers.worker", "--sock-type", "unix", "--sock-name", str(sock),
             "--model-dir", str(model_dir), "--entry-point", entry_point, "--device-id", "3"],
            stdout=subprocess.PIPE, text=True, env=cli_env(), cwd=str(ROOT))
        assert self.proc.stdout is not None
        self.first_line = self.proc.stdout.readline()
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.connect(str(sock))
        self.reader = self.conn.makefile("rb")

    def call(self, properties: dict[str, str], content: list[tuple[str | None, bytes]]) -> wire.OutputFrame:
        self.conn.sendall(wire.encode_input_frame(properties, content))
        return wire.read_output_frame(self.reader)  # type: ignore[arg-type]

    def close(self) -> int:
        self.conn.shutdown(socket.SHUT_RDWR)
        self.conn.close()
        self.reader.close()
        return self.proc.wait(timeout=30)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    started = Worker(MODELS / "fake_dynamic", tmp_path / "djl_sock.19000")
    yield started
    if started.proc.poll() is None:
        started.proc.kill()
        started.proc.wait()


def test_handshake_line_pid_file_and_clean_exit(worker: Worker) -> None:
    assert worker.first_line == "Python engine started.\n"
    assert Path(f"{worker.sock_path}.pid").read_text() == str(worker.proc.pid)
    assert worker.close() == 0
    assert not worker.sock_path.exists()


def test_init_call_returns_204_and_requests_get_device_id(worker: Worker) -> None:
    init = worker.call({"handler": "handle", "fake_flag": "x"}, [])
    assert (init.code, init.message) == (204, "No content")
    reply = worker.call({"handler": "handle", "content-type": "application/json"}, [("data", b'{"a": 1}')])
    assert reply.code == 200
    body = json.loads(reply.content[0][1])  # type: ignore[index]
    assert body["properties"]["device_id"] == "3"
    assert body["properties"]["model_dir"] == str(MODELS / "fake_dynamic")
    assert body["cwd"] == str(MODELS / "fake_dynamic")
    assert body["init"]["fake_flag"] == "x"


def test_exceptions_map_to_424_and_507(worker: Worker) -> None:
    worker.call({"handler": "handle"}, [])
    failed = worker.call({"handler": "handle", "x-fake-action": "raise"}, [("data", b"{}")])
    assert failed.code == 424
    assert json.loads(failed.content[0][1])["error"] == "fake handler failure"  # type: ignore[index]
    oom = worker.call({"handler": "handle", "x-fake-action": "oom"}, [("data", b"{}")])
    assert (oom.code, oom.message) == (507, "fake out of memory")


def test_unknown_handler_function_is_an_error_reply(worker: Worker) -> None:
    reply = worker.call({"handler": "no_such_function"}, [("data", b"{}")])
    assert reply.code == 424
    assert "no_such_function" in json.loads(reply.content[0][1])["error"]  # type: ignore[index]


def test_batch_frame_is_split_by_the_handler(worker: Worker) -> None:
    worker.call({"handler": "handle"}, [])
    reply = worker.call(
        {"handler": "handle", "batch_size": "2", "batch_000.x-want-type": "text/a", "batch_001.x-want-type": "text/b"},
        [("batch_000.data", b"zero"), ("batch_001.data", b"one")])
    assert reply.code == 200
    assert [key for key, _ in reply.content] == ["batch_0.data", "batch_1.data"]  # type: ignore[union-attr]
    assert reply.properties["batch_1_Content-Type"] == "text/b"
    assert json.loads(reply.content[1][1])["content"]["data"] == "one"  # type: ignore[index]


def test_entry_point_forms(tmp_path: Path) -> None:
    (tmp_path / "handler_mod_abc.py").write_text("def handle(inputs):\n    return 'not an output'\n")
    by_file = load_entry_point("handler_mod_abc.py", tmp_path)
    assert callable(by_file.handle)
    by_path = load_entry_point(str(tmp_path / "handler_mod_abc.py"), tmp_path)
    assert by_path.__name__ == "model"
    assert load_entry_point("json", tmp_path) is json
    with pytest.raises(FileNotFoundError):
        load_entry_point("missing.py", tmp_path)


def test_non_output_result_and_load_failure_become_errors(tmp_path: Path) -> None:
    error = map_result("text")
    assert error.code == 424
    assert isinstance(map_result(Output()), Output)
    service = HandlerService("does_not_exist_module_xyz", tmp_path)
    from djl_handlers.io import Input

    reply = service.invoke(Input.from_parts({"handler": "handle"}))
    assert reply.code == 424
    assert b"does_not_exist_module_xyz" in bytes(reply.content.value_at(0))
