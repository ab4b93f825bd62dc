"""Run a model directory on DJL's real Java code, offline, on 127.0.0.1.

Two layouts of ``tests/djl_serving/lib`` (filled by ``tests/djl_serving/fetch.sh``) are supported:

* ``serving``: the whole DJL Serving (``ai.djl.serving:serving``), started as
  ``ai.djl.serving.ModelServer -m NAME=file:///abs/dir`` with a generated ``config.properties``;
* ``engine``: only DJL's Python engine (``ai.djl.python:python`` + ``ai.djl:api``) under
  ``tests/djl_serving/PyEngineFront.java``, a thin HTTP front (Maven Central does not serve
  ``ai.djl.serving:*`` on this project's machines; see ``docs/djl-serving.md``).

Either way the Python worker is DJL's own ``djl_python_engine.py`` extracted from the jar, the
init call and the batching/rolling-batch drivers are DJL's Java code, and the server never
reaches the network: ``DJL_OFFLINE``/``OPT_OUT_TRACKING``/``-Dai.djl.offline=true`` are always
set, ``HF_MODEL_ID`` is dropped and model directories that would make DJL look up a hub are
refused. Usage::

    with DjlServer("tests/djl_serving/models/echo") as server:
        httpx.post(server.url + "/invocations", json={"inputs": "hi"})

or ``python -m djl_handlers.djl_server MODEL_DIR [--port P]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Optional

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LIB = REPO_ROOT / "tests" / "djl_serving" / "lib"
FRONT_SOURCE = REPO_ROOT / "tests" / "djl_serving" / "PyEngineFront.java"
_DROPPED_ENV = ("HF_MODEL_ID", "OPTION_MODEL_ID", "JAVA_TOOL_OPTIONS", "SERVING_OPTS")


class DjlServerError(RuntimeError):
    """The DJL server could not be located, started or reached."""


def find_lib(lib_dir: Optional[os.PathLike[str] | str] = None) -> Path:
    """Return the jar folder: ``lib_dir``, else ``$DJL_SERVING_LIB``, else the test folder."""
    path = Path(lib_dir or os.environ.get("DJL_SERVING_LIB") or DEFAULT_LIB).resolve()
    if not any(path.glob("python-*.jar")):
        raise DjlServerError(f"no DJL jars in {path}: run tests/djl_serving/fetch.sh")
    return path


def lib_kind(lib: Path) -> str:
    """``"serving"`` when the full DJL Serving jar is present, else ``"engine"``."""
    return "serving" if any(lib.glob("serving-*.jar")) else "engine"


def djl_version(lib: Path) -> str:
    """The version of the ``ai.djl.python:python`` jar in ``lib``."""
    jar = sorted(lib.glob("python-*.jar"))[0]
    return jar.stem[len("python-") :]


def check_model_dir(model_dir: Path) -> None:
    """Refuse model directories that would make DJL contact a model hub."""
    if not (model_dir / "serving.properties").is_file():
        raise DjlServerError(f"{model_dir} has no serving.properties")
    for name in ("config.json", "params.json"):
        if (model_dir / name).exists():
            raise DjlServerError(f"{model_dir / name}: DJL would treat it as an LMI model; refused")
    for line in (model_dir / "serving.properties").read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "option.model_id" and not Path(value.strip()).is_absolute():
            raise DjlServerError(f"option.model_id={value.strip()!r} is not a local absolute path")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_command(
    lib: Path, model_dir: Path, name: str, port: int, run_dir: Path, java: str = "java"
) -> list[str]:
    """The java command line for ``lib``'s layout (see the module docstring)."""
    cmd = [
        java,
        "-Xmx512m",
        "-Dai.djl.offline=true",
        "-Dskip_oom_check=true",
        f"-Djava.io.tmpdir={run_dir / 't'}",
        "-Dorg.slf4j.simpleLogger.showDateTime=true",
        "-cp",
        f"{lib}/*",
    ]
    if lib_kind(lib) == "serving":
        return cmd + ["ai.djl.serving.ModelServer", "-m", f"{name}={model_dir.as_uri()}"]
    return cmd + [str(FRONT_SOURCE), "--model-dir", str(model_dir), "--name", name, "--port", str(port)]


def build_env(
    run_dir: Path, port: int, python: str, extra: Optional[Mapping[str, str]] = None
) -> dict[str, str]:
    """The server's environment: offline switches, private caches, our interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    address = f"http://127.0.0.1:{port}"
    pythonpath = [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(
        DJL_OFFLINE="true",
        OPT_OUT_TRACKING="true",
        DJL_CACHE_DIR=str(run_dir / "cache"),
        ENGINE_CACHE_DIR=str(run_dir / "cache"),
        MODEL_SERVER_HOME=str(run_dir),
        PYTHON_EXECUTABLE=python,
        PYTHONPATH=os.pathsep.join(pythonpath),
        PYTHONDONTWRITEBYTECODE="1",
        SERVING_INFERENCE_ADDRESS=address,
        SERVING_MANAGEMENT_ADDRESS=address,
    )
    env.update(extra or {})
    env["DJL_OFFLINE"] = env["OPT_OUT_TRACKING"] = "true"  # not overridable
    return env


class DjlServer:
    """One DJL server process group serving one model directory; a context manager."""

    def __init__(
        self,
        model_dir: os.PathLike[str] | str,
        *,
        port: Optional[int] = None,
        name: Optional[str] = None,
        python: Optional[str] = None,
        lib_dir: Optional[os.PathLike[str] | str] = None,
        env: Optional[Mapping[str, str]] = None,
        startup_timeout: float = 240.0,
    ) -> None:
        self.model_dir = Path(model_dir).resolve()
        self.name = name or self.model_dir.name
        self.port = port or free_port()
        self.python = python or sys.executable
        self.lib = find_lib(lib_dir)
        self.kind = lib_kind(self.lib)
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.startup_seconds: Optional[float] = None
        self.run_dir: Optional[Path] = None
        self.log_path: Optional[Path] = None
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._log: Optional[IO[bytes]] = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8080``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> DjlServer:
        """Start the JVM in its own session and wait until ``/ping`` answers 200."""
        check_model_dir(self.model_dir)
        if shutil.which("java") is None:
            raise DjlServerError("java is not on PATH")
        self.run_dir = Path(tempfile.mkdtemp(prefix="djl", dir="/tmp"))
        for sub in ("t", "cache", "conf"):
            (self.run_dir / sub).mkdir()
        address = f"http://127.0.0.1:{self.port}"
        (self.run_dir / "conf" / "config.properties").write_text(
            f"inference_address={address}\nmanagement_address={address}\n",
            encoding="utf-8",
        )
        self.log_path = self.run_dir / "server.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        cmd = build_command(self.lib, self.model_dir, self.name, self.port, self.run_dir)
        begin = time.monotonic()
        self._proc = subprocess.Popen(
            cmd,
            cwd=self.run_dir,
            env=build_env(self.run_dir, self.port, self.python, self.extra_env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_ready(begin)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - begin
        return self

    def _wait_ready(self, begin: float) -> None:
        assert self._proc is not None
        while time.monotonic() - begin < self.startup_timeout:
            code = self._proc.poll()
            if code is not None:
                raise DjlServerError(f"DJL server exited with {code} during start-up:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/ping", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise DjlServerError(f"DJL server not ready after {self.startup_timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        """The last ``lines`` lines of the server log (JVM and Python worker)."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join([line for line in text if "Extracting /" not in line][-lines:])

    def alive(self) -> bool:
        """True while the JVM runs."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 15.0, keep_run_dir: bool = False) -> None:
        """SIGTERM the whole process group (JVM and Python worker), SIGKILL after ``timeout``."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill_group(proc, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.run_dir is not None and not keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None
            self.log_path = None

    def __enter__(self) -> DjlServer:
        return self.start()

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop()


def _kill_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    pgid = proc.pid  # start_new_session: the JVM leads its own group
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid):
                return
            time.sleep(0.1)
    proc.wait(timeout=5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m djl_handlers.djl_server MODEL_DIR [--port P]``: serve until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m djl_handlers.djl_server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("model_dir")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--name", default=None, help="model name (default: the folder name)")
    parser.add_argument("--lib", default=None, help="jar folder (default: tests/djl_serving/lib)")
    parser.add_argument("--python", default=None, help="worker interpreter (default: this one)")
    args = parser.parse_args(argv)
    try:
        server = DjlServer(
            args.model_dir, port=args.port, name=args.name, python=args.python, lib_dir=args.lib
        )
        server.start()
    except DjlServerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(
        f"DJL ({server.kind}, {djl_version(server.lib)}) serving {server.name} at {server.url} "
        f"(started in {server.startup_seconds:.1f} s; log {server.log_path})",
        flush=True,
    )
    try:
        while server.alive():
            time.sleep(1.0)
        print(f"DJL server exited:\n{server.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
