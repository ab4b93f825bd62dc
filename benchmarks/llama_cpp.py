"""The HF engine through ``djl-handlers serve`` against llama.cpp's ``llama-server`` on the embedded model
(SmolLM2-135M-Instruct), at three precision classes:

- ``fp32``: ours in fp32 against llama-server on an F32 GGUF of the same weights;
- ``fp32-kv16``: the same, ours with ``option.kv_cache_dtype=float16``: the KV cache llama-server keeps
  by default (F16) under the same fp32 weights;
- ``fp32-async``: the same, ours in async mode (``option.async_mode=true``: the worker steps its own
  batch; without it the server sends every step, as DJL's rolling batch does);
- ``bf16``: ours with ``option.dtype=bf16`` against llama-server on a BF16 GGUF (the 16-bit class; where
  oneDNN's bf16 is missing or measured slower than fp32, ours computes over the bf16 weights in fp32);
- ``int8``: ours with ``option.quantize=dynamic_int8`` against llama-server on a Q8_0 GGUF.

``scripts/setup_llama_cpp.sh`` builds llama-server from the llama-cpp-python sdist's vendored llama.cpp
(``-DGGML_NATIVE=ON``: for this CPU; with ``LLAMA_CPP_ISA=avx2`` a second build for x86-64-v3) and
converts the embedded model's fp32 folder to GGUF files (F32, BF16 and Q8_0) with the vendored
``convert_hf_to_gguf.py``; this module finds them under ``$LLAMA_CPP_HOME`` (default
``~/.cache/djl_handlers/llama.cpp``).

Per precision class the two servers are up together (never more than two at once): ours with the HF
engine (``max_rolling_batch_size`` = the concurrency) and llama-server with ``--parallel`` = the
concurrency, a context of input + output + a margin per slot, continuous batching, ``--threads`` and
``--threads-batch`` from ``--llama-threads`` (default 2) on 127.0.0.1, its other settings llama.cpp's
defaults (an F16 KV cache, flash attention ``auto``). On a 2-core machine that other jobs load, 2
threads are llama.cpp's worst setting: its threads meet at an OpenMP barrier after every node of the
graph, so one thread descheduled stalls the other (8 requests: 5.3 tok/s with 2 threads, 49.6 with 1);
run both. Our worker sets ``GOMP_SPINCOUNT=20000`` (spin a few hundred µs, then sleep) unless the
environment chose; llama-server inherits the environment, so ``GOMP_SPINCOUNT=20000 python -m
benchmarks.llama_cpp`` gives both servers the same OpenMP waiting.

vLLM's own benchmark client (:mod:`benchmarks.vllm_client`: random dataset, fixed
lengths, ``ignore_eos``, greedy, streamed ``/v1/completions``) warms each server once, then ``--rounds``
rounds send the same prompts to both (order alternating; a new seed per round). Reported per round:
output tok/s, TTFT p50/p99, ITL p50, ratios ours / llama-server and their medians, peak PSS; per run the
tokens each request generated and the streamed chunks, checked against the lengths asked for (a run
where a count differs is flagged, not hidden). Ours: the ``usage`` the client reads. llama-server
honours ``ignore_eos`` and ``max_tokens``, but the client cannot read its ``usage`` (see
:func:`llama_counts`), so its tokens and its tok/s come from its own log (the client's figures kept
beside them as ``tok_s_client``).

``--isa avx2`` runs both sides at the AVX2 level on a CPU that has AVX-512: ours with
:data:`~benchmarks.common.LOWER_ISA` (oneDNN, ATen and our C kernels capped), llama-server from its AVX2
build. It stands in for an AVX2-only CPU's code paths, not for that CPU's clock, caches or memory.

    python -m benchmarks.llama_cpp [--precision fp32,int8] [--rounds 3] [--prompts 32] [--concurrency 32]
        [--input-len 256] [--output-len 128] [--llama-threads 2] [--out llama-cpp] [--quick] [--beside fp32-kv16]
        [--isa native|avx2]

Raw results: ``benchmarks/results/<out>.json``, vLLM's JSON of every run under ``llama-cpp-runs/``,
llama-server's logs under ``llama-cpp-logs/`` (ours under ``architectures-logs/``).
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.architectures import MemoryWatch, Workload, serve_hf, server_process
from benchmarks.architectures import _env as server_env
from benchmarks.architectures import _free_port as free_port
from benchmarks.architectures import run_client as client_run
from benchmarks.common import (
    LOWER_ISA,
    RESULTS,
    ROOT,
    context,
    median,
    print_table,
    rnd,
    stolen,
)
from benchmarks.common import write_report as save_report
from benchmarks.served_engines import VLLM_VENV

LOGS = RESULTS / "llama-cpp-logs"
RUNS = RESULTS / "llama-cpp-runs"  # vLLM's result JSON of every run, per-request lists included
HOME = Path(os.environ.get("LLAMA_CPP_HOME", Path.home() / ".cache" / "djl_handlers" / "llama.cpp"))
GGUF_NAME = "smollm2-135m-instruct-{type}.gguf"  # what scripts/setup_llama_cpp.sh writes
OURS, LLAMA, BESIDE = "ours", "llama", "beside"  # BESIDE: ours with another precision's options, same rounds
GOAL = 1.3  # the project's goal: ours >= 1.3x llama-server's output tok/s at the same precision class
SLOT_MARGIN = 128  # tokens per slot beyond input + output: a decoded random prompt may re-tokenise longer


@dataclass(frozen=True)
class Precision:
    """One precision class: our serving.properties options against one GGUF type."""

    name: str
    gguf_type: str
    options: tuple[tuple[str, str], ...] = ()
    dtype: str = "fp32"  # our option.dtype


PRECISIONS = {"fp32": Precision("fp32", "f32"),
              "fp32-kv16": Precision("fp32-kv16", "f32", (("kv_cache_dtype", "float16"),)),
              "fp32-async": Precision("fp32-async", "f32", (("rolling_batch", "disable"), ("async_mode", "true"))),
              "bf16": Precision("bf16", "bf16", dtype="bf16"),
              "int8": Precision("int8", "q8_0", (("quantize", "dynamic_int8"),))}


ISAS = ("native", "avx2")  # llama-server's builds: build-<version> (for this CPU) and build-<version>-avx2


def find_llama(home: Path = HOME, isa: str = "native") -> tuple[Path, Path]:
    """(llama-server, the folder of its GGUF files) under ``home``: the newest build for ``isa`` there."""
    servers = sorted((p for p in home.glob("build-*/bin/llama-server")
                      if p.parent.parent.name.endswith("-avx2") == (isa == "avx2")), key=lambda p: p.stat().st_mtime)
    if not servers:
        setup = "LLAMA_CPP_ISA=avx2 scripts/setup_llama_cpp.sh" if isa == "avx2" else "scripts/setup_llama_cpp.sh"
        raise SystemExit(f"no {isa} llama-server under {home}: run {setup}")
    server = servers[-1]
    version = server.parent.parent.name.removeprefix("build-").removesuffix("-avx2")
    return server, home / f"gguf-{version}"


def slot_context(work: Workload) -> int:
    """Tokens of context per llama-server slot: prompt + output + :data:`SLOT_MARGIN`, rounded up to 64."""
    need = work.input_len + work.output_len + SLOT_MARGIN
    return -(-need // 64) * 64


def llama_command(server: Path, gguf: Path, port: int, work: Workload, threads: int = 2) -> list[str]:
    """llama-server's command line: one slot per concurrent request (each with :func:`slot_context`
    tokens: ``-c`` is shared out between the slots), continuous batching, ``threads`` for prefill and
    decode, 127.0.0.1 only, no web UI; the rest llama.cpp's defaults."""
    return [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(work.concurrency), "-c", str(work.concurrency * slot_context(work)),
            "--cont-batching", "--threads", str(threads), "--threads-batch", str(threads),
            "--seed", "0", "--no-webui"]


REPACK_OFF = "--no-repack"


def crashed_on_load(error: BaseException) -> bool:
    """True when a server's start ended in a signal (``server_process``: "server exited with -11")."""
    return re.search(r"exited with -\d+", str(error)) is not None


@contextlib.contextmanager
def serve_llama(server: Path, gguf: Path, work: Workload, threads: int = 2,
                flags: list[str] | None = None) -> Iterator[tuple[str, int, Path]]:
    """llama-server on ``gguf``; yields (url, pid, log) once ``/health`` answers 200 (the model loaded).

    Where it dies from a signal while loading and the environment did not choose its weight repacking
    (``LLAMA_ARG_REPACK``), it starts once more with ``--no-repack``: on an Intel Xeon with AMX its
    default repacking of a Q8_0 file crashed (docs/benchmarks.md). ``flags`` collects what was added,
    for the report."""
    extra: list[str] = []
    while True:
        port = free_port()
        stack = contextlib.ExitStack()
        try:
            served = stack.enter_context(server_process(llama_command(server, gguf, port, work, threads) + extra,
                                                        port, "/health", LOGS / f"llama-{gguf.stem}-t{threads}.log",
                                                        server_env(), ROOT))
        except RuntimeError as exc:
            if extra or not crashed_on_load(exc) or "LLAMA_ARG_REPACK" in os.environ:
                raise
            print(f"llama-server crashed loading {gguf.name} ({exc}); starting it again with {REPACK_OFF}",
                  file=sys.stderr, flush=True)
            extra = [REPACK_OFF]
            continue
        with stack:
            if flags is not None:
                flags.extend(extra)
            yield served
        return


def token_check(result: dict[str, Any], work: Workload) -> dict[str, Any]:
    """What one run's per-request lists (vLLM's ``--save-detailed``) say about its lengths: the range of
    prompt and output tokens each server counted (its ``usage``), of streamed chunks per request (one
    more than its inter-token gaps), and whether every request got exactly the output asked for."""
    outputs = [int(n) for n in result.get("output_lens") or []]
    inputs = [int(n) for n in result.get("input_lens") or []]
    chunks = [len(gaps) + 1 for gaps in result.get("itls") or []]

    def span(values: Sequence[int]) -> list[int] | None:
        return [min(values), max(values)] if values else None

    return {"output_tokens": span(outputs), "prompt_tokens": span(inputs), "chunks": span(chunks),
            "exact_output": bool(outputs) and len(outputs) == work.prompts
            and all(n == work.output_len for n in outputs)}


TIMING = re.compile(r"task (\d+) \|\s+(prompt eval|eval) time =.*/\s*(\d+) tokens")


def llama_counts(log_text: str) -> list[tuple[int, int]]:
    """(prompt tokens evaluated, tokens generated) per finished request, from llama-server's own
    ``print_timing`` log lines, in the order the requests finished. vLLM's client cannot read
    llama-server's counts: on ``/v1/completions`` llama-server puts ``usage`` into the last chunk beside
    a non-empty ``choices``, which the client reads as text only, so it counts the output by
    re-tokenising the text (a character split over two tokens comes back as one: 30 for 32)."""
    prompt: dict[int, int] = {}
    found: list[tuple[int, int]] = []
    for task, kind, n in TIMING.findall(log_text):
        if kind == "prompt eval":
            prompt[int(task)] = int(n)
        elif int(task) in prompt:
            found.append((prompt.pop(int(task)), int(n)))
    return found


def with_server_counts(run: dict[str, Any], counts: Sequence[tuple[int, int]], work: Workload) -> dict[str, Any]:
    """A llama-server run with its own token counts: ``tok_s`` becomes the tokens it generated over the
    run's duration (the client's figure kept as ``tok_s_client``), ``tokens`` its counts and whether
    every request generated exactly ``output_len``."""
    generated = [g for _, g in counts]
    prompts = [p for p, _ in counts]
    run = {**run, "tok_s_client": run["tok_s"], "tokens_client": run["tokens"]}
    if generated and run.get("duration_s"):
        run["tok_s"] = rnd(sum(generated) / run["duration_s"], 1)
    run["tokens"] = {"output_tokens": [min(generated), max(generated)] if generated else None,
                     "prompt_tokens_evaluated": [min(prompts), max(prompts)] if prompts else None,
                     "requests": len(counts), "chunks": run["tokens"].get("chunks"),
                     "exact_output": len(counts) == work.prompts and all(g == work.output_len for g in generated)}
    return run


def run_client(url: str, model_dir: Path, seed: int, work: Workload, out: Path) -> dict[str, Any]:
    """vLLM's benchmark client against ``url`` once (per-request lists kept); the figures of the run
    with every request's token counts checked (:func:`token_check`)."""
    run = client_run(url, model_dir, seed, work, out, detailed=True)
    run["tokens"] = token_check(json.loads(out.read_text()), work)
    return run


def ratios(ours: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]], key: str) -> list[float | None]:
    """``key`` of ours over the baseline's, round by round; None where either run failed a request."""
    return [rnd(a[key] / b[key], 3) if b[key] and not (a["failed"] or b["failed"]) else None
            for a, b in zip(ours, base, strict=True)]


def median_of(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not None; None when there are none."""
    found = [v for v in values if v is not None]
    return rnd(median(found), 3) if found else None


def summary(runs: dict[str, list[dict[str, Any]]], goal: float = GOAL) -> dict[str, Any]:
    """Per-round ratios ours / llama-server (tok/s: higher is ours faster; TTFT p50: lower is ours
    faster), their medians, the rounds without steal, whether the tok/s median meets ``goal``, each
    server's medians, and whether every run returned exactly the asked-for output tokens."""
    tok = ratios(runs[OURS], runs[LLAMA], "tok_s")
    ttft = ratios(runs[OURS], runs[LLAMA], "ttft_p50_s")
    clean = [r for r, a, b in zip(tok, runs[OURS], runs[LLAMA], strict=True)
             if r is not None and not stolen(a.get("host_cpu_s"), b.get("host_cpu_s"))]
    tok_median = median_of(tok)
    return {
        "tok_s_ratio_per_round": tok, "tok_s_ratio_median": tok_median,
        "ttft_p50_ratio_per_round": ttft, "ttft_p50_ratio_median": median_of(ttft),
        "tok_s_ratio_unstolen": {"rounds": len(clean), "median": median_of(clean)},
        "goal": goal, "goal_met": None if tok_median is None else tok_median >= goal,
        "failed_requests": {name: sum(r["failed"] for r in rs) for name, rs in runs.items()},
        "exact_output_tokens": {name: all(r["tokens"]["exact_output"] for r in rs) for name, rs in runs.items()},
        "medians": {name: {key: median_of([r[key] for r in rs if not r["failed"]])
                           for key in ("tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_ms")}
                    for name, rs in runs.items()}}


def log_size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def read_from(log: Path, offset: int) -> str:
    """The log's text after ``offset`` bytes."""
    with open(log, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def llama_settings(log: Path) -> list[str]:
    """The lines of llama-server's start-up log that say how it runs (system info, KV cache, flash
    attention, slots, threads)."""
    keys = ("system_info", "flash_attn", "llama_kv_cache", "n_ctx", "n_slots", "n_threads", "type_k", "CPU_REPACK",
            "build:")
    return [line.strip() for line in log.read_text(errors="replace").splitlines()
            if any(k in line for k in keys)][:40]


def run_precision(precision: Precision, work: Workload, rounds: int, root: Path, server: Path, gguf_dir: Path,
                  model_dir: Path, runs_dir: Path, llama_threads: int = 2,
                  beside: Precision | None = None) -> dict[str, Any]:
    """Ours and llama-server at one precision class: both up, one warm-up run each, then ``rounds``
    rounds, the order alternating. ``beside``: a third server, ours with that precision's options, in the
    same rounds (the order rotating), so two of our settings meet the same llama-server side by side."""
    gguf = gguf_dir / GGUF_NAME.format(type=precision.gguf_type)
    if not gguf.exists():
        raise SystemExit(f"{gguf} is missing: run scripts/setup_llama_cpp.sh")
    names = [OURS, LLAMA] + ([BESIDE] if beside is not None else [])
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    warm: dict[str, dict[str, Any]] = {}
    peaks: dict[str, float | None] = {}
    llama_flags: list[str] = []  # what serve_llama had to add (--no-repack after a crash)
    with contextlib.ExitStack() as stack:
        servers = {OURS: stack.enter_context(serve_hf(model_dir, precision.dtype, work, root,
                                                      f"ours-{precision.name}", precision.options)),
                   LLAMA: stack.enter_context(serve_llama(server, gguf, work, llama_threads, llama_flags))}
        if beside is not None:
            servers[BESIDE] = stack.enter_context(serve_hf(model_dir, beside.dtype, work, root,
                                                           f"ours-{beside.name}", beside.options))
        watches = {s: MemoryWatch(pid) for s, (_, pid, _) in servers.items()}
        try:
            for s, (url, _, _) in servers.items():  # every shape once: kernels built, caches grown
                warm[s] = run_client(url, model_dir, 1000, work, runs_dir / f"{precision.name}-{s}-warm.json")
            for r in range(rounds):
                order = names[r % len(names):] + names[: r % len(names)] if beside is not None else (
                    [OURS, LLAMA] if r % 2 == 0 else [LLAMA, OURS])
                for s in order:
                    seen = log_size(servers[s][2])
                    run = run_client(servers[s][0], model_dir, r + 1, work, runs_dir / f"{precision.name}-{s}-{r}.json")
                    if s == LLAMA:
                        run = with_server_counts(run, llama_counts(read_from(servers[s][2], seen)), work)
                    run.update(round=r, server=s, peak_pss_mib=rnd(watches[s].reset() / 2**20, 0))
                    runs[s].append(run)
                    print(precision.name, json.dumps(run), flush=True)
        finally:
            for s, w in watches.items():
                peaks[s] = rnd(w.reset() / 2**20, 0)
                w.stop()
        settings = llama_settings(servers[LLAMA][2])
    report = {"precision": precision.name, "ours_dtype": precision.dtype, "ours_options": dict(precision.options),
              "gguf": gguf.name, "llama_threads": llama_threads, "llama_flags": llama_flags,
              "gguf_mib": rnd(gguf.stat().st_size / 2**20, 1), "runs": runs,
              **summary({OURS: runs[OURS], LLAMA: runs[LLAMA]}), "warmup": warm,
              "peak_pss_mib_last": peaks, "llama_settings": settings}
    if beside is not None:
        report["beside"] = {"precision": beside.name, "options": dict(beside.options),
                            **summary({OURS: runs[BESIDE], LLAMA: runs[LLAMA]}),
                            "ours_over_beside_tok_s": ratios(runs[OURS], runs[BESIDE], "tok_s")}
    return report


def llama_version(server: Path) -> str:
    done = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=60)
    return " ".join((done.stdout + done.stderr).split())[:300]


def run_benchmark(precisions: Sequence[str], work: Workload, rounds: int, llama_threads: int = 2,
                  runs_dir: Path = RUNS, beside: str | None = None, isa: str = "native") -> dict[str, Any]:
    """Every precision class in turn (two servers up at a time); ``isa="avx2"``: both at the AVX2 level
    (ours with :data:`~benchmarks.common.LOWER_ISA` in its environment, llama-server's AVX2 build)."""
    if not (VLLM_VENV / "bin" / "python").exists():
        raise SystemExit(f"{VLLM_VENV} does not exist: scripts/setup_vllm_cpu.sh creates it (vLLM's client)")
    from djl_handlers.model.embedded import embedded_model_dir

    server, gguf_dir = find_llama(isa=isa)
    if isa == "avx2":
        os.environ.update(LOWER_ISA)  # our servers' environment (server_env copies it); ggml reads none of it
    model_dir = embedded_model_dir()
    LOGS.mkdir(parents=True, exist_ok=True)
    runs_dir.mkdir(parents=True, exist_ok=True)
    (RESULTS / "architectures-logs").mkdir(parents=True, exist_ok=True)  # where serve_hf keeps our server's log
    report: dict[str, Any] = {"workload": work.__dict__, "rounds": rounds, "isa": isa, "llama_server": str(server),
                              "llama_version": llama_version(server), "model_dir": str(model_dir), "pairs": []}
    with tempfile.TemporaryDirectory(prefix="llama-cpp-") as tmp:
        for name in precisions:
            report["pairs"].append(run_precision(PRECISIONS[name], work, rounds, Path(tmp), server, gguf_dir,
                                                 model_dir, runs_dir, llama_threads,
                                                 PRECISIONS[beside] if beside else None))
    return report


def table_row(name: str, pair: dict[str, Any]) -> dict[str, Any]:
    """One line of the printed table: a precision's (or its ``beside`` server's) summary against llama-server."""
    ours, llama = pair["medians"][OURS], pair["medians"][LLAMA]
    exact = pair["exact_output_tokens"]
    return {"precision": name, "ours tok/s": ours["tok_s"], "llama tok/s": llama["tok_s"],
            "tok/s ours/llama": pair["tok_s_ratio_median"], "rounds": pair["tok_s_ratio_per_round"],
            "goal met": pair["goal_met"], "TTFT p50 s": f'{ours["ttft_p50_s"]} / {llama["ttft_p50_s"]}',
            "TTFT p50 ours/llama": pair["ttft_p50_ratio_median"], "exact tokens": f"{exact[OURS]} / {exact[LLAMA]}"}


def print_report(report: dict[str, Any]) -> None:
    rows = []
    for p in report["pairs"]:
        rows.append(table_row(p["precision"], p))
        if "beside" in p:
            rows.append(table_row(f'{p["beside"]["precision"]} (beside {p["precision"]})', p["beside"]))
    print_table(rows, list(rows[0]) if rows else [], "djl-handlers serve (HF engine) vs llama.cpp llama-server")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llama_cpp", description=__doc__.split("\n")[0])
    parser.add_argument("--precision", default="fp32,int8", help=f"of {', '.join(PRECISIONS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--llama-threads", type=int, default=2, help="llama-server's --threads/--threads-batch")
    parser.add_argument("--out", default="llama-cpp", help="the report's name under benchmarks/results")
    parser.add_argument("--quick", action="store_true", help="8 prompts of 64+32 tokens, 8 concurrent, 1 round")
    parser.add_argument("--beside", default=None,
                        help="a precision whose options a third server (ours) runs in the same rounds, e.g. fp32-kv16")
    parser.add_argument("--isa", choices=ISAS, default="native",
                        help="avx2: both servers at the AVX2 level on a CPU that has more (see the module's text)")
    args = parser.parse_args(argv)
    work = Workload(args.prompts, args.concurrency, args.input_len, args.output_len)
    rounds = args.rounds
    if args.quick:
        work, rounds = Workload(8, 8, 64, 32), 1
    precisions = [p for p in args.precision.split(",") if p]
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        parser.error(f"--precision: unknown {unknown}; of {', '.join(PRECISIONS)}")
    if args.beside is not None and args.beside not in PRECISIONS:
        parser.error(f"--beside: unknown {args.beside!r}; of {', '.join(PRECISIONS)}")
    started = context()
    report = run_benchmark(precisions, work, rounds, args.llama_threads,
                           RUNS / f"{args.out}{'-quick' if args.quick else ''}", args.beside, args.isa)
    print_report(report)
    save_report(args.out, report, args.quick, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
