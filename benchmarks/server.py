"""Server: requests/s and latency of concurrent streaming clients through ``djl-handlers serve`` and
through DJL Serving 0.34's real ``ai.djl.serving.ModelServer`` (``DjlServer`` from
``tests/djl_serving/djl_server.py``; jars from ``tests/djl_serving/fetch.sh``), against ``handle()``
called in process with the same number of requests kept in flight.

Two model directories: the fake engine (``tests/robustness/models/fake_lmi``, no step delay: the
front end is all there is) and the embedded SmolLM2 fp32 with a short prompt and few new tokens.
Clients are asyncio tasks on 127.0.0.1 (``benchmarks/http_client.py``; ``client="httpx"`` for the
old httpx generator), each sending one streaming request after another for a fixed time; TTFT is
measured to the first body byte. Bounded: ``duration`` s of submissions, then at most 60 s to drain.
All fronts are started first, then every client count is run ``repeat`` times, the fronts alternated
in order each round, so that the shared box's load drifts over all of them alike. Each row reports
the generator's own CPU seconds and the server's (front end + worker: our process and its child, or
DJL's JVM and its Python worker) CPU seconds.
``baseline=REV`` adds ``djl-handlers serve`` from git revision REV (``git archive``) as a front.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, STEAL_LIMIT, host_cpu, host_delta, median, pct, rnd, steal_share, stop_process

DJL_SERVING = ROOT / "tests" / "djl_serving"
if str(DJL_SERVING) not in sys.path:  # djl_server.py is a test/developer tool, not part of the package
    sys.path.insert(0, str(DJL_SERVING))
from djl_server import free_port  # noqa: E402

FAKE_DIR = ROOT / "tests" / "robustness" / "models" / "fake_lmi"
PROMPT = "Deep learning is a branch of machine learning that trains neural networks with"


@dataclass
class Load:
    """Latencies of one load level."""

    front: str
    clients: int
    elapsed: float = 0.0
    ttft: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: int = 0
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None
    runs: list[float] = field(default_factory=list)  # req/s of each repeat
    ttft_p99_runs: list[float] = field(default_factory=list)  # TTFT p99 (s) of each repeat
    steal_runs: list[float] = field(default_factory=list)  # share of the machine stolen in each repeat

    def add(self, other: Load) -> None:
        """Merge another run of the same front and client count."""
        self.elapsed += other.elapsed
        self.ttft += other.ttft
        self.latency += other.latency
        self.tokens += other.tokens
        self.errors += other.errors
        self.client_cpu_s += other.client_cpu_s
        if other.server_cpu_s is not None:
            self.server_cpu_s = (self.server_cpu_s or 0.0) + other.server_cpu_s
        self.runs += other.runs
        self.ttft_p99_runs += other.ttft_p99_runs
        self.steal_runs += other.steal_runs

    def row(self) -> dict[str, Any]:
        """Summary: req/s (over all repeats, and each), tok/s, TTFT and latency percentiles (ms), CPU s."""
        done = len(self.latency)
        return {"front": self.front, "clients": self.clients, "requests": done, "errors": self.errors,
                "req_s": rnd(done / self.elapsed, 1) if self.elapsed else None,
                "req_s_runs": [rnd(r, 1) for r in self.runs],
                "client_cpu_s": rnd(self.client_cpu_s, 2),
                "server_cpu_s": rnd(self.server_cpu_s, 2) if self.server_cpu_s is not None else None,
                "req_per_server_cpu_s": rnd(done / self.server_cpu_s, 1) if self.server_cpu_s else None,
                "tok_s": rnd(self.tokens / self.elapsed, 1) if self.elapsed else None,
                "ttft_p50_ms": rnd(1000 * (pct(self.ttft, 0.5) or 0), 2),
                "ttft_p99_ms": rnd(1000 * (pct(self.ttft, 0.99) or 0), 2),
                "ttft_p99_ms_runs": [rnd(1000 * t, 1) for t in self.ttft_p99_runs],
                "steal_share_runs": [rnd(x, 3) for x in self.steal_runs],
                "latency_p50_ms": rnd(1000 * (pct(self.latency, 0.5) or 0), 1),
                "latency_p99_ms": rnd(1000 * (pct(self.latency, 0.99) or 0), 1)}


def body(new_tokens: int) -> bytes:
    """The streaming request every client sends."""
    return json.dumps({"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": new_tokens}}).encode()


async def _client(url: str, load: Load, payload: bytes, stop_at: float) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            first, data = None, b""
            try:
                async with client.stream("POST", "/invocations", content=payload,
                                         headers={"Content-Type": "application/json"}) as resp:
                    async for chunk in resp.aiter_raw():
                        if first is None and chunk:
                            first = time.perf_counter() - t
                        data += chunk
                ok = resp.status_code == 200 and data.endswith(b"\n")
            except Exception:  # noqa: BLE001 - counted
                ok = False
            if not ok or first is None:
                load.errors += 1
                continue
            load.ttft.append(first)
            load.latency.append(time.perf_counter() - t)
            load.tokens += data.count(b"\n")


# base URL -> pid of our server process, for its CPU time (the worker is its child)
_SERVER_PIDS: dict[str, int] = {}


def process_cpu_s(pid: int) -> float | None:
    """user + system CPU seconds of ``pid`` and its direct children (Linux /proc), else None."""
    def one(p: str) -> float:
        with open(f"/proc/{p}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
        return one(str(pid)) + sum(one(c) for c in children)
    except (OSError, ValueError, IndexError):
        return None


def http_load(url: str, front: str, clients: int, duration: float, new_tokens: int,
              client: str = "raw") -> Load:
    """``clients`` concurrent streaming clients for ``duration`` s (``client``: raw or httpx)."""
    from benchmarks.http_client import stream_client

    load = Load(front, clients)
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    pid = _SERVER_PIDS.get(url)

    async def main() -> None:
        t0 = time.perf_counter()
        payload, stop_at = body(new_tokens), t0 + duration
        tasks = [_client(url, load, payload, stop_at) if client == "httpx" else
                 stream_client(host, int(port), "/invocations", payload, stop_at, load) for _ in range(clients)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=duration + 60)
        load.elapsed = time.perf_counter() - t0

    cpu0, server0, host0 = time.process_time(), process_cpu_s(pid) if pid else None, host_cpu()
    asyncio.run(main())
    load.client_cpu_s = time.process_time() - cpu0
    load.steal_runs = [steal_share(host_delta(host0, host_cpu()))]
    server1 = process_cpu_s(pid) if pid else None
    if server0 is not None and server1 is not None:
        load.server_cpu_s = server1 - server0
    load.runs = [len(load.latency) / load.elapsed] if load.elapsed else []
    load.ttft_p99_runs = [pct(load.ttft, 0.99) or 0.0] if load.ttft else []
    return load


def round_ratios(rows: list[dict[str, Any]], ours: str = "djl-handlers serve",
                 theirs: str = "DJL Serving ModelServer") -> dict[int, dict[str, Any]]:
    """Per client count, ours over theirs in each round (the fronts alternate within a round, seconds
    apart): requests/s and TTFT p99 (below 1 is better for TTFT), each round's ratio and the median."""
    out: dict[int, dict[str, Any]] = {}
    by_key = {(r["front"], r.get("clients")): r for r in rows}
    for (front, clients), mine in by_key.items():
        other = by_key.get((theirs, clients))
        if front != ours or other is None:
            continue
        req = [a / b for a, b in zip(mine["req_s_runs"], other["req_s_runs"], strict=False) if b]
        ttft = [a / b for a, b in zip(mine["ttft_p99_ms_runs"], other["ttft_p99_ms_runs"], strict=False) if b]
        entry: dict[str, Any] = {"req_s_per_round": [rnd(x) for x in req], "req_s_median": rnd(median(req)),
                                 "ttft_p99_per_round": [rnd(x) for x in ttft], "ttft_p99_median": rnd(median(ttft))}
        out[int(clients or 0)] = entry
        steal = [max(a, b) for a, b in zip(mine.get("steal_share_runs") or [], other.get("steal_share_runs") or [],
                                           strict=False)]
        if steal:  # beside the plain figures: the rounds where neither front lost the machine to steal
            clean = [i for i, x in enumerate(steal) if x <= STEAL_LIMIT]
            entry["unstolen"] = {
                "rounds": len(clean),
                "req_s_median": rnd(median([req[i] for i in clean if i < len(req)])),
                "ttft_p99_median": rnd(median([ttft[i] for i in clean if i < len(ttft)]))}
    return out


def inprocess_load(handle: Any, clients: int, duration: float, new_tokens: int) -> Load:
    """The same closed loop through ``handle()`` and DJL's Java loop emulation, no HTTP."""
    from djl_handlers.testing.java_loop import DriverRequest, RollingBatchDriver

    driver = RollingBatchDriver(handle)
    load = Load("in-process handle()", clients)
    started: dict[int, tuple[DriverRequest, float]] = {}
    first: set[int] = set()
    payload = body(new_tokens)
    t0 = time.perf_counter()
    stop_at = t0 + duration
    while True:
        now = time.perf_counter()
        while now < stop_at and len(driver.active) < clients:
            req = driver.submit(DriverRequest(payload, {"Content-Type": "application/json"}))
            started[id(req)] = (req, now)
        if not driver.active:
            break
        driver.step()
        t = time.perf_counter()
        for key, (req, begin) in list(started.items()):
            if req.chunks and key not in first:
                first.add(key)
                load.ttft.append(t - begin)
            if req.done:
                del started[key]
                first.discard(key)
                load.latency.append(t - begin)
                load.tokens += req.text.count("\n")
                load.errors += req.code is not None
    load.elapsed = time.perf_counter() - t0
    return load


def model_dirs(tmp: Path, which: str) -> dict[str, tuple[Path, int]]:
    """Model directories (and max_new_tokens) for ``fake`` and/or ``embedded``."""
    dirs: dict[str, tuple[Path, int]] = {}
    if which in ("fake", "both"):
        fake = tmp / "fake_lmi"
        shutil.copytree(FAKE_DIR, fake)
        # no step delay; scheduler, not auto, so that DJL's ModelServer runs its rolling-batch loop too
        props = (fake / "serving.properties").read_text().replace("option.fake_step_delay=0.002", "")
        props = props.replace("option.rolling_batch=auto", "option.rolling_batch=scheduler")
        (fake / "serving.properties").write_text(props + "\nminWorkers=1\nmaxWorkers=1\n")
        dirs["fake engine (front-end overhead)"] = (fake, 16)
    if which in ("embedded", "both"):
        from djl_handlers.model.embedded import embedded_model_dir

        emb = tmp / "smollm2"
        emb.mkdir()
        # scheduler, not auto: DJL's LmiConfigRecommender turns auto into disable (dynamic batch) for a
        # local HF folder, which would compare rolling batch with dynamic batch.
        (emb / "serving.properties").write_text(
            "engine=Python\noption.entryPoint=djl_handlers.huggingface\n"
            f"option.model_id={embedded_model_dir()}\noption.rolling_batch=scheduler\n"
            "option.max_rolling_batch_size=64\noption.dtype=fp32\noption.predict_timeout=120\n"
            "job_queue_size=1000\nminWorkers=1\nmaxWorkers=1\nload_on_devices=cpu\n")
        dirs["SmolLM2-135M fp32, 8 new tokens"] = (emb, 8)
    return dirs


def _wait_ping(url: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/ping", timeout=2) as resp:
                if resp.status == 200:
                    return
        time.sleep(0.3)
    raise RuntimeError("server did not answer /ping")


def server_pid(url: str) -> int | None:
    """The pid of the server (our front end, or DJL's JVM) started here at ``url``, while it runs."""
    return _SERVER_PIDS.get(url)


@contextlib.contextmanager
def ours(model_dir: Path, root: Path = ROOT, log: Path | None = None) -> Iterator[str]:
    """``djl-handlers serve model_dir`` (the package under ``root``) on 127.0.0.1; yields its base URL.
    ``log``: where its output (front end and worker) goes; by default nowhere."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    code = "import sys; from djl_handlers.cli import main; sys.exit(main())"
    with open(log or os.devnull, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code, "serve", str(model_dir), "--host", "127.0.0.1",
                                 "--port", str(port)], env=env, cwd=str(root), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    _SERVER_PIDS[url] = proc.pid
    try:
        _wait_ping(url, proc)
        yield url
    finally:
        _SERVER_PIDS.pop(url, None)
        stop_process(proc, 30)


@contextlib.contextmanager
def ours_at(rev: str, model_dir: Path) -> Iterator[str]:
    """``djl-handlers serve`` from git revision ``rev`` of this checkout (exported with ``git archive``)."""
    with tempfile.TemporaryDirectory(prefix="bench-baseline") as tmp:
        archive = subprocess.run(["git", "archive", rev], cwd=str(ROOT), check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        with ours(model_dir, Path(tmp)) as url:
            yield url


@contextlib.contextmanager
def djl(model_dir: Path, version: str = "0.34", log: Path | None = None) -> Iterator[str]:
    """DJL Serving's real ModelServer ``version`` (JVM + DJL's Python worker); yields its base URL.
    ``log``: where its log (JVM and worker) is copied when it stops, or when it fails to start."""
    from djl_server import DjlServer

    server = DjlServer(model_dir, version=version)
    try:
        server.start()
        proc = getattr(server, "_proc", None)  # the JVM; DJL's Python worker is its child
        if proc is not None:
            _SERVER_PIDS[server.url] = proc.pid
        yield server.url
    finally:
        _SERVER_PIDS.pop(server.url, None)
        server.stop(keep_run_dir=True)
        if log is not None and server.log_path is not None and server.log_path.exists():
            shutil.copyfile(server.log_path, log)
        if server.run_dir is not None:
            shutil.rmtree(server.run_dir, ignore_errors=True)


def in_process_handle(model_dir: Path) -> Any:
    """The model directory's handler, loaded in this process, after its init call."""
    from djl_handlers.server.settings import load_settings
    from djl_handlers.testing.java_loop import RollingBatchDriver

    settings = load_settings(model_dir)
    entry = str(settings.entry_point or "")
    if entry.endswith(".py"):
        spec = importlib.util.spec_from_file_location("bench_model", model_dir / entry)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        handle = module.handle
    else:
        from djl_handlers.service import InferenceService

        handle = InferenceService("huggingface").handle
    RollingBatchDriver(handle).init(settings.init_properties())
    return handle


def run_benchmark(quick: bool, djl: bool = True, model: str = "both", baseline: str | None = None,
                  repeat: int | None = None, client: str = "raw") -> dict[str, Any]:
    """Every model dir x front x client count; returns rows and the added TTFT at 1 client."""
    levels, duration = ((1, 8), 3.0) if quick else ((1, 8, 32, 64), 10.0)
    repeat = repeat or (1 if quick else 2)
    fronts: dict[str, Any] = {"djl-handlers serve": ours}
    if djl:
        fronts["DJL Serving ModelServer"] = globals()["djl"]
    if baseline:
        fronts[f"djl-handlers serve @{baseline}"] = lambda model_dir: ours_at(baseline, model_dir)
    report: dict[str, Any] = {"duration_s": duration, "repeat": repeat, "client": client,
                              "targets": {}, "added_ttft_ms": {}}
    with tempfile.TemporaryDirectory(prefix="bench-server") as tmp:
        for name, (model_dir, new_tokens) in model_dirs(Path(tmp), "fake" if quick else model).items():
            handle = in_process_handle(model_dir)
            rows = [inprocess_load(handle, c, duration, new_tokens).row() for c in levels]
            del handle
            rows += _interleaved(fronts, model_dir, levels, duration, new_tokens, repeat, client)
            report["targets"][name] = {"max_new_tokens": new_tokens, "rows": rows, "ours_over_djl": round_ratios(rows)}
            base = next(r for r in rows if r["front"].startswith("in-process") and r["clients"] == 1)
            report["added_ttft_ms"][name] = {
                r["front"]: rnd(r["ttft_p50_ms"] - base["ttft_p50_ms"], 2)
                for r in rows if r["clients"] == 1 and not r["front"].startswith("in-process")}
    return report


def _interleaved(fronts: dict[str, Any], model_dir: Path, levels: tuple[int, ...], duration: float,
                 new_tokens: int, repeat: int, client: str) -> list[dict[str, Any]]:
    """Start every front, then per client count run each front ``repeat`` times, alternating the order."""
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        for front, start in fronts.items():
            try:
                urls[front] = stack.enter_context(start(model_dir))
                http_load(urls[front], front, 1, 1.0, new_tokens, client)  # warm-up
            except Exception as exc:  # noqa: BLE001 - report, go on with the others
                print(f"{front} on {model_dir.name}: {exc}", flush=True)
                rows.append({"front": front, "clients": 0, "errors": repr(exc)[:200]})
        for clients in levels:
            merged = {front: Load(front, clients) for front in urls}
            for round_ in range(repeat):
                order = list(urls) if round_ % 2 == 0 else list(reversed(urls))
                for front in order:
                    merged[front].add(http_load(urls[front], front, clients, duration, new_tokens, client))
            for load in merged.values():
                row = load.row()
                row["load_avg_1m"] = rnd(os.getloadavg()[0], 2)
                rows.append(row)
    return sorted(rows, key=lambda r: (list(fronts).index(r["front"]), r["clients"]))


def plot(report: dict[str, Any], plt: Any) -> Any:
    """Requests/s by client count, one panel per model dir."""
    names = list(report["targets"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        rows = [r for r in report["targets"][name]["rows"] if r.get("req_s")]
        for front in dict.fromkeys(r["front"] for r in rows):
            pts = [r for r in rows if r["front"] == front]
            ax.plot([r["clients"] for r in pts], [r["req_s"] for r in pts], "o-", label=front)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streaming clients")
        ax.set_ylabel("requests/s")
        ax.set_title(name, fontsize=8)
        ax.legend(fontsize=7)
    return fig
