"""The HF engine through ``djl-handlers serve`` against ``vllm serve`` on other architectures than the
embedded model: random-weight Qwen2-, Phi- and ~1 B Llama-shaped models
(:mod:`djl_handlers.model.architectures`; speed does not depend on the weights' values), fp32 and bf16.

Per model and dtype both servers are started and stay up: ``djl-handlers serve`` with the HF engine
(defaults, ``max_rolling_batch_size`` = the concurrency) and vLLM's own OpenAI server (``vllm serve``'s
code, from ``.venv-vllm``, with its defaults: ``--max-num-seqs`` = the concurrency). vLLM's own benchmark
client (:mod:`benchmarks.vllm_client`: ``vllm.benchmarks.serve``, random dataset, fixed input and output
lengths, ``ignore_eos``, greedy, streamed ``/v1/completions``) warms each server once, then ``--rounds``
rounds send the same prompts to each server in turn (the order alternating; a new seed per round, so no
prefix cache sees a prompt twice). Reported per round: output tok/s, TTFT p50/p99, ITL p50, the
ratio ours / vLLM; medians over rounds; each server's peak memory (PSS summed over its process tree:
front end, worker or engine core) sampled every half second; the machine's steal per run.

    python -m benchmarks.architectures [--models qwen2-bench,phi-bench,llama-1b] [--dtype fp32,bf16]
        [--rounds 3] [--prompts 16] [--concurrency 16] [--input-len 128] [--output-len 64] [--quick]
        [--variant NAME:key=value;...]   # one more HF server with other serving.properties options

``llama-1b`` runs in bf16 only unless ``--llama-fp32`` (fp32 takes twice as long on 2 cores).
``embedded`` is the embedded model (SmolLM2-135M, real weights). ``--one-at-a-time`` starts one server,
warms it and runs every round on it, then stops it before the next starts (rounds not alternated): for a
model two servers cannot hold in memory together. Each server's KV bytes per cached token are reported
too: ours from ``/metrics``, vLLM's from the KV cache size in tokens it logs at start beside the bytes
it was given. ``--rounds 0`` runs the warm-up alone (its figures under ``warmup``): for the peak memory
at a concurrency without timing rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    ROOT,
    context,
    host_cpu,
    host_delta,
    median,
    print_table,
    result_path,
    rnd,
    stolen,
    stop_process,
)
from benchmarks.common import write_report as save_report
from benchmarks.served_engines import VLLM_VENV, _descendants

MODELS = ("qwen2-bench", "phi-bench", "llama-1b")
EMBEDDED = "embedded"  # the embedded model (SmolLM2-135M), not a random shape
LOGS = RESULTS / "architectures-logs"  # each server's log, kept (git-ignored like every result)
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
SERVERS = ("hf", "vllm")
BASELINE = "vllm"
# Seconds the front end waits for a step's reply before it restarts the worker (DJL's default: 120). One
# 2,048-token prefill step of the ~1 B model in fp32 took longer on 2 shared cores at a load average of
# 6; vLLM has no such limit, so ours is raised rather than the run lost.
PREDICT_TIMEOUT_S = 900


@dataclass(frozen=True)
class Workload:
    """What vLLM's client sends in one run."""

    prompts: int = 16
    concurrency: int = 16
    input_len: int = 128
    output_len: int = 64


@dataclass
class MemoryWatch:
    """Peak PSS of a process tree while it runs. PSS means walking every page table of the tree
    (``smaps_rollup``: ~60 ms for a 3 GB server here, holding the target's memory-map lock), which
    taken every half second cost the watched server 7-14 % of its tokens per second; so the cheap
    resident size (``statm``) is read every ``every`` seconds and PSS is measured only when that
    reaches a new high by ``RISE`` (and once more at :meth:`reset`): the peak is the true one within
    about that share."""

    RISE = 1.02

    pid: int
    every: float = 0.5
    peak: int = 0
    walks: int = 0
    _rss_high: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            rss = tree_rss(self.pid)
            if rss > self._rss_high * self.RISE:
                self._rss_high = rss
                self.walks += 1
                self.peak = max(self.peak, tree_pss(self.pid))

    def reset(self) -> int:
        """The peak so far (one more sample first); the next peak starts from now."""
        peak, self.peak, self._rss_high = max(self.peak, tree_pss(self.pid)), 0, 0
        return peak

    def stop(self) -> None:
        self._stop.set()


def tree_rss(pid: int) -> int:
    """Bytes resident in ``pid`` and its descendants (``/proc/<pid>/statm``: kernel counters, no page
    walk; shared pages count once per process); 0 for processes that cannot be read."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for p in [pid, *_descendants(pid)]:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * page
    return total


def tree_pss(pid: int) -> int:
    """Bytes of proportional set size (shared pages split between the processes sharing them) of
    ``pid`` and its descendants; 0 for processes that cannot be read."""
    total = 0
    for p in [pid, *_descendants(pid)]:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
    return total


def _free_port() -> int:
    from benchmarks.server import free_port

    return free_port()


def _wait(url: str, path: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; log: {log}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + path, timeout=2) as resp:
                if resp.status == 200:
                    return
        time.sleep(0.5)
    raise RuntimeError(f"server did not answer {path} in {timeout:.0f} s; log: {log}")


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2", "VLLM_CPU_KVCACHE_SPACE": "2",
            "TOKENIZERS_PARALLELISM": "false"}


def parse_variant(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``NAME:key=value;key=value`` -> one more HF server with those ``serving.properties`` options."""
    name, _, rest = text.partition(":")
    pairs = [item.split("=", 1) for item in rest.split(";") if item.strip()]
    if not name or name in SERVERS or not pairs or any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"--variant {text!r}: expected NAME:key=value;key=value (NAME not hf or vllm)")
    return name, tuple((k.strip().removeprefix("option."), v.strip()) for k, v in pairs)


@contextlib.contextmanager
def server_process(command: list[str], port: int, health: str, log: Path, env: dict[str, str],
                   cwd: Path) -> Iterator[tuple[str, int, Path]]:
    """``command`` (a server listening on 127.0.0.1:``port``) with its output in ``log``; yields
    (url, pid, log) once ``health`` answers 200, and stops the process on the way out."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, env=env, cwd=str(cwd), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url, health, proc, log)
        yield url, proc.pid, log
    finally:
        stop_process(proc, 60)


@contextlib.contextmanager
def serve_hf(model_dir: Path, dtype: str, work: Workload, root: Path, name: str = "hf",
             options: tuple[tuple[str, str], ...] = ()) -> Iterator[tuple[str, int, Path]]:
    """``djl-handlers serve`` on ``model_dir`` with the HF engine (plus ``options``); yields (url, pid, log)."""
    folder = root / f"{name}-{model_dir.name}-{dtype}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "serving.properties").write_text("\n".join([
        "engine=Python", "option.entryPoint=djl_handlers.huggingface", f"option.model_id={model_dir}",
        f"option.dtype={dtype}", "option.rolling_batch=scheduler",
        f"option.max_rolling_batch_size={work.concurrency}", "option.max_model_len=2048",
        f"option.predict_timeout={PREDICT_TIMEOUT_S}", *(f"option.{key}={value}" for key, value in options)]) + "\n")
    port = _free_port()
    code = "import sys; from djl_handlers.cli import main; sys.exit(main())"
    with server_process([sys.executable, "-c", code, "serve", str(folder), "--host", "127.0.0.1", "--port", str(port)],
                        port, "/ping", LOGS / f"{folder.name}.log", {**_env(), "PYTHONPATH": str(ROOT)},
                        ROOT) as served:
        yield served


@contextlib.contextmanager
def serve_vllm(model_dir: Path, dtype: str, work: Workload, root: Path) -> Iterator[tuple[str, int, Path]]:
    """vLLM's OpenAI server (what ``vllm serve`` runs) on ``model_dir`` with its defaults; yields (url, pid, log)."""
    port = _free_port()
    with server_process([str(VLLM_VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                         "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
                         "--dtype", DTYPES[dtype], "--max-num-seqs", str(work.concurrency),
                         "--max-model-len", "2048", "--seed", "0"],
                        port, "/health", LOGS / f"vllm-{model_dir.name}-{dtype}.log", _env(), root) as served:
        yield served


def run_client(url: str, model_dir: Path, seed: int, work: Workload, out: Path,
               detailed: bool = False) -> dict[str, Any]:
    """vLLM's benchmark client against ``url`` once; its result JSON plus the machine's CPU meanwhile
    (``detailed``: the JSON keeps the per-request lists too)."""
    host0 = host_cpu()
    began = time.perf_counter()
    done = subprocess.run([str(VLLM_VENV / "bin" / "python"), "-m", "benchmarks.vllm_client", "--base-url", url,
                           "--model", str(model_dir), "--tokenizer", str(model_dir), "--seed", str(seed),
                           "--num-prompts", str(work.prompts), "--input-len", str(work.input_len),
                           "--output-len", str(work.output_len), "--max-concurrency", str(work.concurrency),
                           "--result", str(out), *(["--save-detailed"] if detailed else [])],
                          cwd=str(ROOT), env=_env(), capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"vLLM's client failed against {url}: {done.stderr[-2000:]}")
    result = json.loads(out.read_text())
    return {"tok_s": rnd(result["output_throughput"], 1), "completed": result["completed"],
            "failed": result.get("failed", 0), "output_tokens": result["total_output_tokens"],
            "ttft_p50_s": rnd(result["median_ttft_ms"] / 1000), "ttft_p99_s": rnd(result["p99_ttft_ms"] / 1000),
            "itl_p50_ms": rnd(result["median_itl_ms"], 1), "itl_p99_ms": rnd(result["p99_itl_ms"], 1),
            "duration_s": rnd(result["duration"], 2),
            "client_wall_s": rnd(time.perf_counter() - began, 1), "host_cpu_s": host_delta(host0, host_cpu()),
            "load_avg_1m": rnd(os.getloadavg()[0], 2)}


def _ratios(runs: dict[str, list[dict[str, Any]]], key: str, name: str = "hf") -> list[float | None]:
    """``name`` over vLLM per round; None for a round where either run failed a request."""
    return [rnd(a[key] / b[key], 3) if b[key] and not (a["failed"] or b["failed"]) else None
            for a, b in zip(runs[name], runs[BASELINE], strict=True)]


def _median(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return rnd(median(found), 3) if found else None


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per-round ratios (ours / vLLM) and their medians; the rounds neither run was stolen in beside.
    A variant (another HF server) gets its own ratios to vLLM."""
    tok = _ratios(runs, "tok_s")
    ttft = _ratios(runs, "ttft_p50_s")
    clean = [r for r, a, b in zip(tok, runs["hf"], runs[BASELINE], strict=True)
             if r is not None and not stolen(a.get("host_cpu_s"), b.get("host_cpu_s"))]
    out: dict[str, Any] = {
        "tok_s_ratio_per_round": tok, "tok_s_ratio_median": _median(tok),
        "ttft_p50_ratio_per_round": ttft, "ttft_p50_ratio_median": _median(ttft),
        "tok_s_ratio_unstolen": {"rounds": len(clean), "median": _median(list(clean))},
        "failed_requests": {name: sum(r["failed"] for r in rs) for name, rs in runs.items()},
        "medians": {name: {key: _median([r[key] for r in rs if not r["failed"]]) for key in
                           ("tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_ms")} for name, rs in runs.items()}}
    for name in runs:
        if name not in SERVERS:
            ratios = _ratios(runs, "tok_s", name)
            out[f"{name}_tok_s_ratio_per_round"] = ratios
            out[f"{name}_tok_s_ratio_median"] = _median(ratios)
    return out


def _patch_lines(log: Path) -> dict[str, str]:
    """The HF server's CPU patch report, read from its log (one line per patch at load)."""
    found: dict[str, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        if "CPU patch " in line:
            name, _, text = line.split("CPU patch ", 1)[1].partition(": ")
            found[name] = text
    return found


def vllm_kv_bytes_per_token(log: Path) -> int | None:
    """Bytes per cached token of ``vllm serve``: the GiB it set aside for its KV cache over the tokens
    that cache holds, both from its start-up log (the tokens are whole blocks, so this is at most one
    block's share above the exact figure); None when either line is missing."""
    text = log.read_text(errors="replace")
    space = re.search(r"set \(([\d.]+)/[\d.]+\) GiB for KV cache", text)
    tokens = re.search(r"KV cache size: ([\d,]+) tokens", text)
    if not (space and tokens):
        return None
    return round(float(space.group(1)) * 2**30 / int(tokens.group(1).replace(",", "")))


def hf_kv_bytes_per_token(url: str) -> int | None:
    """Bytes per cached token of our engine, read from the server's ``/metrics`` (set once a request has
    been served); None when it is not there."""
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("djl_handlers_kv_cache_bytes_per_token"):
                    return int(float(line.rsplit(" ", 1)[1]))
    return None


def _model_dir(name: str) -> Path:
    if name == EMBEDDED:
        from djl_handlers.model.embedded import embedded_model_dir

        return embedded_model_dir()
    from djl_handlers.model.architectures import build_model_dir

    return build_model_dir(None, name, dtype="bfloat16")


def _kv_bytes(server: str, url: str, log: Path) -> int | None:
    return vllm_kv_bytes_per_token(log) if server == BASELINE else hf_kv_bytes_per_token(url)


def run_pair(name: str, dtype: str, work: Workload, rounds: int, root: Path,
             variants: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()) -> dict[str, Any]:
    """Both servers (and any HF ``variants``) on one model and dtype: warm-up, then ``rounds`` rounds,
    the order rotating."""
    model_dir = _model_dir(name)
    names = [*SERVERS, *(v for v, _ in variants)]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in names}
    peaks: dict[str, int] = {}
    kv: dict[str, int | None] = {}
    warm: dict[str, dict[str, Any]] = {}  # the warm-up run of each server (the only one with --rounds 0)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        servers = {"hf": stack.enter_context(serve_hf(model_dir, dtype, work, root)),
                   "vllm": stack.enter_context(serve_vllm(model_dir, dtype, work, root))}
        for variant, options in variants:
            servers[variant] = stack.enter_context(serve_hf(model_dir, dtype, work, root, variant, options))
        hf = servers["hf"]
        watches = {s: MemoryWatch(pid) for s, (_, pid, _) in servers.items()}
        start_s = rnd(time.perf_counter() - started, 1)
        try:
            for s, (url, _, _) in servers.items():  # every shape once: kernels built, caches grown
                warm[s] = run_client(url, model_dir, 1000, work, root / f"{s}-warm.json")
            for r in range(rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for s in order:
                    run = run_client(servers[s][0], model_dir, r + 1, work, root / f"{s}-{r}.json")
                    run.update(round=r, server=s, peak_pss_mib=rnd(watches[s].reset() / 2**20, 0))
                    runs[s].append(run)
                    print(name, dtype, json.dumps(run), flush=True)
            kv = {s: _kv_bytes(s, url, log) for s, (url, _, log) in servers.items()}
        finally:
            for s, w in watches.items():
                peaks[s] = max([w.reset(), *(int((r["peak_pss_mib"] or 0) * 2**20) for r in runs[s])])
                w.stop()
        patches = _patch_lines(hf[2])
    return {"model": name, "dtype": dtype, "start_s": start_s, "runs": runs, **summary(runs),
            "peak_pss_mib": {s: rnd(p / 2**20, 0) for s, p in peaks.items()}, "kv_bytes_per_token": kv,
            "warmup": warm, "cpu_patches": patches}


def run_one_at_a_time(name: str, dtype: str, work: Workload, rounds: int, root: Path) -> dict[str, Any]:
    """Each server alone on one model and dtype: start, warm-up, ``rounds`` rounds, stop; then the next.
    Round ``r`` of each gets the same seed, so the per-round ratios compare the same prompts."""
    model_dir = _model_dir(name)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SERVERS}
    peaks: dict[str, int] = {}
    kv: dict[str, int | None] = {}
    warm: dict[str, dict[str, Any]] = {}  # the warm-up run of each server (the only one with --rounds 0)
    start_s: dict[str, float | None] = {}
    patches: dict[str, str] = {}
    for s in SERVERS:
        began = time.perf_counter()
        serve = serve_vllm if s == BASELINE else serve_hf
        with serve(model_dir, dtype, work, root) as (url, pid, log):
            start_s[s] = rnd(time.perf_counter() - began, 1)
            watch = MemoryWatch(pid)
            try:
                warm[s] = run_client(url, model_dir, 1000, work, root / f"{s}-warm.json")
                for r in range(rounds):
                    run = run_client(url, model_dir, r + 1, work, root / f"{s}-{r}.json")
                    run.update(round=r, server=s, peak_pss_mib=rnd(watch.reset() / 2**20, 0))
                    runs[s].append(run)
                    print(name, dtype, json.dumps(run), flush=True)
                kv[s] = _kv_bytes(s, url, log)
            finally:
                peaks[s] = max([watch.reset(), *(int((r["peak_pss_mib"] or 0) * 2**20) for r in runs[s])])
                watch.stop()
            if s != BASELINE:
                patches = _patch_lines(log)
    return {"model": name, "dtype": dtype, "one_at_a_time": True, "start_s": start_s, "runs": runs,
            **summary(runs), "peak_pss_mib": {s: rnd(p / 2**20, 0) for s, p in peaks.items()},
            "kv_bytes_per_token": kv, "warmup": warm, "cpu_patches": patches}


def run_benchmark(models: tuple[str, ...], dtypes: tuple[str, ...], work: Workload, rounds: int,
                  llama_fp32: bool = False, variants: tuple[str, ...] = (),
                  progress: Callable[[dict[str, Any]], None] | None = None,
                  one_at_a_time: bool = False) -> dict[str, Any]:
    """Every model in every dtype (``llama-1b`` in fp32 only with ``llama_fp32``)."""
    if not (VLLM_VENV / "bin" / "python").exists():
        raise SystemExit(f"{VLLM_VENV} does not exist: scripts/setup_vllm_cpu.sh creates it")
    extra = tuple(parse_variant(v) for v in variants)
    if one_at_a_time and extra:
        raise SystemExit("--one-at-a-time runs no --variant")
    report: dict[str, Any] = {"workload": work.__dict__, "rounds": rounds, "pairs": [],
                              "variants": {name: dict(options) for name, options in extra}, "logs": str(LOGS)}
    LOGS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="architectures-") as tmp:
        for name in models:
            for dtype in dtypes:
                if name == "llama-1b" and dtype == "fp32" and not llama_fp32:
                    continue
                pair = (run_one_at_a_time(name, dtype, work, rounds, Path(tmp)) if one_at_a_time
                        else run_pair(name, dtype, work, rounds, Path(tmp), extra))
                report["pairs"].append(pair)
                if progress is not None:
                    progress(report)
    return report


def print_report(report: dict[str, Any]) -> None:
    rows = [{"model": p["model"], "dtype": p["dtype"], "ours tok/s": p["medians"]["hf"]["tok_s"],
             "vLLM tok/s": p["medians"]["vllm"]["tok_s"], "tok/s ratio": p["tok_s_ratio_median"],
             "rounds": p["tok_s_ratio_per_round"], "TTFT p50 ours/vLLM": p["ttft_p50_ratio_median"],
             "TTFT p50 s": f'{p["medians"]["hf"]["ttft_p50_s"]} / {p["medians"]["vllm"]["ttft_p50_s"]}',
             "TTFT p99 s": f'{p["medians"]["hf"]["ttft_p99_s"]} / {p["medians"]["vllm"]["ttft_p99_s"]}',
             "peak MiB": f'{p["peak_pss_mib"]["hf"]} / {p["peak_pss_mib"]["vllm"]}',
             "KV B/token": " / ".join(str(p.get("kv_bytes_per_token", {}).get(s)) for s in SERVERS),
             **{f"{v} / vLLM": p.get(f"{v}_tok_s_ratio_median") for v in report.get("variants", {})}}
            for p in report["pairs"]]
    print_table(rows, list(rows[0]) if rows else [], "HF engine (djl-handlers serve) vs vllm serve")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.architectures", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}, {EMBEDDED}")
    parser.add_argument("--dtype", default="fp32,bf16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--llama-fp32", action="store_true", help="also run llama-1b in fp32")
    parser.add_argument("--variant", action="append", metavar="NAME:key=value;...",
                        help="one more HF server with these serving.properties options")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="one server up at a time (every round on it, then the next): less memory")
    parser.add_argument("--out", default="architectures", help="the report's name under benchmarks/results")
    parser.add_argument("--quick", action="store_true", help="qwen2-bench in bf16, 8 prompts of 32+16 tokens, 1 round")
    args = parser.parse_args(argv)
    work = Workload(args.prompts, args.concurrency, args.input_len, args.output_len)
    models, dtypes, rounds = tuple(args.models.split(",")), tuple(args.dtype.split(",")), args.rounds
    if args.quick:
        work, models, dtypes, rounds = Workload(8, 8, 32, 16), ("qwen2-bench",), ("bf16",), 1
    started = context()
    def progress(partial: dict[str, Any]) -> None:  # a report after every pair: a late failure loses nothing
        result_path(f"{args.out}-partial", args.quick).write_text(json.dumps(partial, indent=1) + "\n")

    report = run_benchmark(models, dtypes, work, rounds, args.llama_fp32, tuple(args.variant or ()), progress,
                           args.one_at_a_time)
    print_report(report)
    save_report(args.out, report, args.quick, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
