"""Run a model directory on DJL Serving's real front end (0.34 or 0.36), offline, on 127.0.0.1.

``tests/djl_serving/fetch.sh`` fills one git-ignored folder per release (:data:`LIB_DIRS`:
``lib/`` for 0.34, ``lib-0.36.0/`` for 0.36) with ``ai.djl.serving.ModelServer`` (from Maven
Central, or built from DJL Serving's source) and DJL's Python engine (its own jar in 0.34; built
into the front end's jar in 0.36). :class:`DjlServer` (``version="0.34"`` by default, or
``"0.36"``) starts ``ModelServer -m NAME=file:///abs/dir`` with its own ``MODEL_SERVER_HOME``
(``conf/config.properties``: inference and management address on 127.0.0.1), its own
``java.io.tmpdir`` (the Python worker's Unix socket is ``${java.io.tmpdir}/djl_sock.<port>``, a
fixed name per port) and its own fresh DJL cache (PyEnv extracts ``djl_python`` once per cache
folder and never again, so a shared one would mix releases). The Python worker is DJL's own
``djl_python_engine.py`` from the jar, run by ``python`` (default: this interpreter, so the worker
imports ``djl_handlers`` from this checkout); ``DJL_HANDLERS_DJL_RULES`` names the release to it.

It never reaches the network: ``DJL_OFFLINE``/``OPT_OUT_TRACKING``/``-Dai.djl.offline=true`` are
always set, inherited ``HF_MODEL_ID``/``OPTION_*``/``SERVING_*`` variables are dropped, and a
``option.model_id`` (serving.properties, ``OPTION_MODEL_ID`` or ``HF_MODEL_ID``) must be an
existing local folder, since DJL's ``LmiUtils`` asks the Hugging Face hub for a ``config.json``
of anything else. A test/developer tool, not part of the installed package. Usage::

    import sys; sys.path.insert(0, "tests/djl_serving")
    from djl_server import DjlServer
    with DjlServer("path/to/model_dir", version="0.36", env={"OPTION_ROLLING_BATCH": "scheduler"}) as server:
        httpx.post(server.url + "/invocations", json={"inputs": "hi"})

or ``python tests/djl_serving/djl_server.py MODEL_DIR [--port P] [--version 0.36]`` (``make serve-djl``).
"""

from __future__ import annotations

import argparse
import os
import re
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

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
DEFAULT_VERSION = "0.34"
# release (major.minor) -> the folder fetch.sh builds it into, and the full version it builds
LIB_DIRS = {"0.34": HERE / "lib", "0.36": HERE / "lib-0.36.0"}
RELEASES = {"0.34": "0.34.0", "0.36": "0.36.0"}
DEFAULT_LIB = LIB_DIRS[DEFAULT_VERSION]
MAIN_CLASS = "ai.djl.serving.ModelServer"
_WORKER_LINE = re.compile(r"PyProcess W-\S+-(?:stdout|stderr): (.*)$")
_SETTING_LINE = re.compile(r"^ {4}(\S+): (.*)$")
# Always on, whatever the caller's environment says: no start-up call to DJL's metadata address.
OFFLINE_ENV = {"DJL_OFFLINE": "true", "OPT_OUT_TRACKING": "true"}
_DROPPED_PREFIXES = ("OPTION_", "SERVING_", "ARGS_")
_DROPPED_ENV = ("HF_MODEL_ID", "JAVA_TOOL_OPTIONS", "JAVA_OPTS", "MODEL_LOADING_TIMEOUT", "TENSOR_PARALLEL_DEGREE")


class DjlServerError(RuntimeError):
    """The DJL server could not be located, started or reached."""


def release(version: str) -> str:
    """``0.34``/``0.34.0`` → ``0.34``; an unknown release is an error."""
    short = ".".join(str(version).split(".")[:2])
    if short not in LIB_DIRS:
        raise DjlServerError(f"DJL Serving {version!r} is not built here: choose one of {sorted(LIB_DIRS)}")
    return short


def find_lib(lib_dir: Optional[os.PathLike[str] | str] = None, version: str = DEFAULT_VERSION) -> Path:
    """Return the jar folder: ``lib_dir``, else (0.34 only) ``$DJL_SERVING_LIB``, else the release's folder.

    A folder is usable when it holds the front end (``serving-*.jar``) and DJL's Python engine
    extracted to ``python/djl_python_engine.py`` (fetch.sh does both).
    """
    short = release(version)
    env_lib = os.environ.get("DJL_SERVING_LIB") if short == DEFAULT_VERSION else None
    path = Path(lib_dir or env_lib or LIB_DIRS[short]).resolve()
    if not any(path.glob("serving-*.jar")) or not (path / "python" / "djl_python_engine.py").is_file():
        raise DjlServerError(f"no DJL Serving {RELEASES[short]} jars in {path}: run tests/djl_serving/fetch.sh")
    return path


def lib_origin(lib: Path) -> str:
    """Where the front end came from, as fetch.sh recorded it (``source 0.34.0``, ``maven-central ...``)."""
    stamp = lib / ".complete"
    lines = stamp.read_text(encoding="utf-8").splitlines() if stamp.is_file() else []
    return lines[1] if len(lines) > 1 else "unknown"


def read_properties(model_dir: Path) -> dict[str, str]:
    """``serving.properties`` as a dict (``key=value`` lines; empty when the file is absent)."""
    path = model_dir / "serving.properties"
    if not path.is_file():
        return {}
    props: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith(("#", "!")):
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    return props


def check_model_dir(model_dir: Path, env: Mapping[str, str]) -> None:
    """Refuse a model directory that would make DJL contact a model hub (or has nothing to serve)."""
    if not model_dir.is_dir():
        raise DjlServerError(f"{model_dir} is not a directory")
    props = read_properties(model_dir)
    if not props and not any(k.startswith("OPTION_") for k in env) and not (model_dir / "config.json").is_file():
        raise DjlServerError(f"{model_dir} has no serving.properties, no config.json and no OPTION_* variables")
    # serving.properties wins over OPTION_MODEL_ID (DJL's ModelInfo uses putIfAbsent); HF_MODEL_ID too.
    sources = {
        "option.model_id": props.get("option.model_id"),
        "OPTION_MODEL_ID": env.get("OPTION_MODEL_ID"),
        "HF_MODEL_ID": env.get("HF_MODEL_ID"),
    }
    for source, value in sources.items():
        if value and not (Path(value).is_absolute() and Path(value).is_dir()):
            raise DjlServerError(f"{source}={value!r} is not an existing absolute local folder; DJL would ask a hub")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_command(lib: Path, model_dir: Path, name: str, run_dir: Path, java: str = "java") -> list[str]:
    """The java command line: ``ModelServer -m NAME=file:///abs/dir`` with the offline switches."""
    return [
        java,
        "-Xmx1g",
        "-Dai.djl.offline=true",
        f"-Djava.io.tmpdir={run_dir / 'tmp'}",
        f"-Dlog4j.configurationFile={run_dir / 'conf' / 'log4j2.xml'}",
        "-Dlog4j2.disable.jmx=true",
        "-cp",
        f"{lib}/*",
        MAIN_CLASS,
        "-m",
        f"{name}={model_dir.as_uri()}",
    ]


def write_config(run_dir: Path, port: int) -> Path:
    """``MODEL_SERVER_HOME/conf/config.properties``: inference and management on 127.0.0.1:``port``."""
    address = f"http://127.0.0.1:{port}"
    path = run_dir / "conf" / "config.properties"
    path.write_text(
        f"inference_address={address}\nmanagement_address={address}\n",
        encoding="utf-8",
    )
    return path


LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration>
  <Appenders>
    <Console name="console" target="SYSTEM_OUT">
      <PatternLayout pattern="%d{HH:mm:ss.SSS} %-5level %c{1} %msg%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="info"><AppenderRef ref="console"/></Root>
    <Logger name="ACCESS_LOG" level="off"/>
    <Logger name="server_metric" level="off"/>
    <Logger name="model_metric" level="off"/>
  </Loggers>
</Configuration>
"""


def write_log_config(run_dir: Path) -> Path:
    """A plain-text console log (no ANSI colours, no per-request metric lines) for ``log_tail``."""
    path = run_dir / "conf" / "log4j2.xml"
    path.write_text(LOG4J2_XML, encoding="utf-8")
    return path


def build_env(
    run_dir: Path, port: int, python: str, extra: Optional[Mapping[str, str]] = None,
    version: str = DEFAULT_VERSION,
) -> dict[str, str]:
    """The server's environment: offline switches, private caches, our interpreter, the DJL rule set
    of ``version`` for our handler, ``extra`` on top."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _DROPPED_ENV and not k.startswith(_DROPPED_PREFIXES)
    }
    address = f"http://127.0.0.1:{port}"
    pythonpath = [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(
        DJL_CACHE_DIR=str(run_dir / "cache"),
        ENGINE_CACHE_DIR=str(run_dir / "cache"),
        MODEL_SERVER_HOME=str(run_dir),
        PYTHON_EXECUTABLE=python,  # PyEnv's default for option.pythonExecutable
        PYTHONPATH=os.pathsep.join(pythonpath),
        PYTHONDONTWRITEBYTECODE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        SERVING_INFERENCE_ADDRESS=address,
        SERVING_MANAGEMENT_ADDRESS=address,
        DJL_HANDLERS_DJL_RULES=release(version),
    )
    env.update(extra or {})
    env.update(OFFLINE_ENV)  # not overridable
    return env


class DjlServer:
    """One ModelServer (JVM + DJL's Python worker, one process group) serving one model directory."""

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
        version: str = DEFAULT_VERSION,
    ) -> None:
        self.version = release(version)
        self.model_dir = Path(model_dir).resolve()
        self.name = name or self.model_dir.name
        self.port = port or free_port()
        self.python = python or sys.executable
        self.lib = find_lib(lib_dir, self.version)
        self.origin = lib_origin(self.lib)
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
        check_model_dir(self.model_dir, self.extra_env)
        if shutil.which("java") is None:
            raise DjlServerError("java is not on PATH")
        self.run_dir = Path(tempfile.mkdtemp(prefix="djl", dir="/tmp"))
        for sub in ("tmp", "cache", "conf"):
            (self.run_dir / sub).mkdir()
        write_config(self.run_dir, self.port)
        write_log_config(self.run_dir)
        self.log_path = self.run_dir / "server.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        cmd = build_command(self.lib, self.model_dir, self.name, self.run_dir)
        begin = time.monotonic()
        self._proc = subprocess.Popen(
            cmd,
            cwd=self.run_dir,
            env=build_env(self.run_dir, self.port, self.python, self.extra_env, self.version),
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
                raise DjlServerError(
                    f"DJL server exited with {code} during start-up:\n{self.log_tail()}\n"
                    f"Python worker errors:\n{self.worker_errors()}"
                )
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

    def worker_errors(self, lines: int = 20) -> str:
        """The Python worker's error lines (DJL logs them long before its own Java stack trace)."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        found: list[str] = []
        in_traceback = False
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            match = _WORKER_LINE.search(line)
            if match is None:
                continue
            payload = match.group(1)
            if payload.startswith("Traceback"):
                in_traceback = True
            elif in_traceback and not payload.startswith(" "):
                found.append(payload)  # the exception line that ends a traceback
                in_traceback = False
            elif payload.startswith("ERROR::"):
                found.append(payload)
        return "\n".join(found[-lines:]) or "(none)"

    def model_settings(self) -> dict[str, str]:
        """The model's properties as DJL's front end logged them after its rewrites (``ModelInfo``'s
        "Apply per model settings" block: ``option.rolling_batch``, ``option.async_mode``, ...)."""
        if self.log_path is None or not self.log_path.exists():
            return {}
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        start = next((i for i, line in enumerate(lines) if "Apply per model settings:" in line), None)
        settings: dict[str, str] = {}
        for line in lines[start + 1:] if start is not None else []:
            match = _SETTING_LINE.match(line)
            if match is None:
                break
            settings[match.group(1)] = match.group(2)
        return settings

    def async_replies(self) -> int:
        """How many requests DJL's async mode has finished: its ``AsyncRequestManager`` logs
        ``Request [id] completed`` when the worker's last record for a request arrives. A client that
        timed out although this count went up met DJL's lost-reply race (docs/djl-serving.md)."""
        return sum(1 for line in self._log_lines() if "AsyncRequestManager Request [" in line and "] completed" in line)

    def worker_answers(self) -> int:
        """Requests the worker provably answered, as DJL's log shows them: async mode's finished
        requests (:meth:`async_replies`) and the refusals our handlers log (``RequestId=[...] rejected``,
        in every mode). A client that timed out although this count went up met DJL's lost-reply race."""
        return sum(1 for line in self._log_lines()
                   if ("AsyncRequestManager Request [" in line and "] completed" in line)
                   or ("RequestId=[" in line and "] rejected: " in line))

    def _log_lines(self) -> list[str]:
        if self.log_path is None or not self.log_path.exists():
            return []
        return self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()

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
    """``python tests/djl_serving/djl_server.py MODEL_DIR [--port P]``: serve until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python tests/djl_serving/djl_server.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("model_dir")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--name", default=None, help="model name (default: the folder name)")
    parser.add_argument("--version", default=DEFAULT_VERSION, choices=sorted(LIB_DIRS),
                        help=f"DJL Serving release (default {DEFAULT_VERSION})")
    parser.add_argument("--lib", default=None, help="jar folder (default: the release's folder)")
    parser.add_argument("--python", default=None, help="worker interpreter (default: this one)")
    args = parser.parse_args(argv)
    try:
        server = DjlServer(
            args.model_dir, port=args.port, name=args.name, python=args.python, lib_dir=args.lib,
            version=args.version,
        )
        server.start()
    except DjlServerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(
        f"DJL Serving ModelServer ({server.origin}) serving {server.name} at {server.url} "
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
