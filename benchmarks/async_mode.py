"""Async mode against sync rolling mode, on ``djl-handlers serve`` and on DJL Serving's real ``ModelServer``.

Each front end serves each model directory twice: in sync rolling mode (``option.rolling_batch=scheduler``:
the front end calls ``handle()`` once per step with every request in flight) and in DJL's async mode
(``option.rolling_batch=disable`` + ``option.async_mode=true``: each request goes to the worker alone,
the handler runs its own engine loop). Fronts: ``djl-handlers serve`` and DJL's ModelServer of each
``--djl-version`` (0.34, 0.36; ``tests/djl_serving/fetch.sh`` builds them). Two parts:

- ``fake``: the fake engine without step delay (the front end and the worker's loop are all there is),
  ``benchmarks/server.py``'s closed-loop streaming clients at 1/8/32/64 concurrent clients for a fixed
  time each: requests/s, TTFT p50/p99, and the CPU milliseconds per request of the front end (our
  server process or DJL's JVM) and of the Python worker (its child);
- ``embedded``: the HF engine on the embedded SmolLM2 in bf16, the mixed workload of
  ``benchmarks/workload.py`` (32 requests, prompts 16-454 tokens, 12-123 new tokens, seed 0, greedy)
  sent at once by 32 streaming clients, each round's prompts opened by a round tag: output tokens/s,
  TTFT p50/p99, and how many requests got the same token ids (hence the same text) as through
  ``djl-handlers serve`` in sync mode in the same round.

All fronts of a part are started together and warmed up; then every round runs each front once, the
order reversed from one round to the next. A ratio is taken within a round (runs seconds apart) and
its median over rounds is reported, with the median over the rounds in which neither run lost more
than 2 % of the machine to hypervisor steal beside it. Ratios: async over sync on each front; DJL's
front end over ours in async mode (and in sync mode, for context). Each run also records the CPU
seconds other jobs used meanwhile and the cores the measured server got: on a shared box a server
with more runnable threads (a JVM) wins more CPU time than one with fewer, so requests or tokens per
server CPU-second are reported beside the rates. Bounded: each load has a time limit, a workload at
most ``WORKLOAD_TIMEOUT_S``; a front that fails to start or a run that fails is recorded (its error;
DJL's carries its log tail and worker errors) and the others go on. Server logs are kept under
``benchmarks/results/async-logs/``.

    python -m benchmarks async [--quick] [--server-model fake|embedded|both] [--repeat N]
                               [--djl-version 0.34 --djl-version 0.36] [--no-djl]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import server
from benchmarks.common import ROOT, STEAL_LIMIT, host_cpu, host_delta, median, pct, result_path, rnd, steal_share
from benchmarks.served_engines import WARM_JOBS, _workload, cpu_seconds, tagged
from benchmarks.workload import Job

OURS = "djl-handlers serve"
MODE_OPTIONS = {"sync": ("option.rolling_batch=scheduler",),
                "async": ("option.rolling_batch=disable", "option.async_mode=true")}
FAKE_NEW_TOKENS = 16
WORKLOAD_TIMEOUT_S = 300.0
# the figures of each part's summary rows (medians over rounds)
# (server_cores: the front end's and its worker's CPU seconds per second of the run, of the 2 cores;
# *_per_server_cpu_s: requests or tokens per CPU second of the front end and its worker, which other
# jobs competing for the cores change less than the rate itself)
FAKE_KEYS = ("req_s", "ttft_p50_ms", "ttft_p99_ms", "latency_p50_ms", "req_per_server_cpu_s", "front_cpu_ms_per_req",
             "worker_cpu_ms_per_req", "server_cores", "steal", "others_cpu_s")
HF_KEYS = ("tok_s", "ttft_p50_ms", "ttft_p99_ms", "tok_per_server_cpu_s", "front_cpu_s", "worker_cpu_s", "server_cores",
           "steal", "others_cpu_s")
FAKE_RATIOS = ("req_s", "ttft_p50_ms", "ttft_p99_ms", "req_per_server_cpu_s")
HF_RATIOS = ("tok_s", "ttft_p50_ms", "ttft_p99_ms", "tok_per_server_cpu_s")
# the two kinds of comparison
ASYNC_OVER_SYNC = "async over sync"
DJL_OVER_OURS = "DJL over ours"


@dataclass(frozen=True)
class Front:
    """One server of the rounds: ``server`` is ``ours`` or a DJL release (``0.34``), ``mode`` sync or async."""

    server: str
    mode: str

    @property
    def name(self) -> str:
        """``djl-handlers serve async``, ``DJL 0.34 sync``."""
        return f"{OURS if self.server == 'ours' else 'DJL ' + self.server} {self.mode}"

    @property
    def slug(self) -> str:
        """The name as a file name."""
        return re.sub(r"[^a-z0-9.]+", "-", self.name.lower())


def fronts_for(djl_versions: Sequence[str]) -> list[Front]:
    """Ours, then each DJL release, each sync then async (the pairs of a front sit side by side)."""
    return [Front(s, m) for s in ("ours", *djl_versions) for m in ("sync", "async")]


def with_mode(properties: str, mode: str) -> str:
    """``serving.properties`` text with its rolling-batch and async-mode keys replaced by ``mode``'s."""
    keep = [line for line in properties.splitlines()
            if line.split("=", 1)[0].strip() not in ("option.rolling_batch", "option.async_mode")]
    return "\n".join([*keep, *MODE_OPTIONS[mode]]) + "\n"


def fake_dir(root: Path, mode: str) -> Path:
    """The fake engine's model directory, no step delay, one worker, in ``mode``."""
    folder = root / f"fake-{mode}"
    shutil.copytree(server.FAKE_DIR, folder)
    path = folder / "serving.properties"
    props = path.read_text().replace("option.fake_step_delay=0.002", "") + "minWorkers=1\nmaxWorkers=1\n"
    path.write_text(with_mode(props, mode))
    return folder


def hf_dir(root: Path, mode: str, model: str) -> Path:
    """The embedded model in bf16, 32 rows, one worker, in ``mode``."""
    folder = root / f"hf-{mode}"
    folder.mkdir()
    props = ("engine=Python\noption.entryPoint=djl_handlers.huggingface\n"
             f"option.model_id={model}\noption.dtype=bf16\noption.max_rolling_batch_size=32\n"
             "option.max_model_len=2048\noption.predict_timeout=240\njob_queue_size=1000\n"
             "minWorkers=1\nmaxWorkers=1\nload_on_devices=cpu\n")
    (folder / "serving.properties").write_text(with_mode(props, mode))
    return folder


def ours_mode(model_dir: Path) -> str:
    """The mode ``djl-handlers check`` resolves for ``model_dir`` (what our server runs)."""
    code = "import sys; from djl_handlers.cli import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", code, "check", str(model_dir)], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=120)
    with contextlib.suppress(ValueError):
        return str(json.loads(done.stdout).get("mode"))
    return f"unknown (check exited {done.returncode})"


def djl_mode(log: str) -> str:
    """The mode DJL's worker runs in, from its log: ``async`` when DJL created the Python process in
    async mode or its model settings say ``option.async_mode: true``, else ``rolling batch <name>``."""
    settings = dict(re.findall(r"^ {4}(option\.\w+): (.*)$", log, flags=re.M))
    if "python process in async mode" in log or settings.get("option.async_mode", "").lower() == "true":
        return "async"
    return f"rolling batch {settings.get('option.rolling_batch', '?')}"


@contextlib.contextmanager
def started(front: Front, model_dir: Path, log: Path) -> Iterator[str]:
    """The front serving ``model_dir``, its output going to ``log``; yields its base URL."""
    if front.server == "ours":
        with server.ours(model_dir, log=log) as url:
            yield url
    else:
        with server.djl(model_dir, version=front.server, log=log) as url:
            yield url


def start_all(stack: contextlib.ExitStack, fronts: Sequence[Front], dirs: dict[str, Path],
              logs: Path, part: str) -> tuple[dict[str, str], dict[str, Any]]:
    """Start every front on its mode's directory; returns the URLs of those that started and, for each
    front, what failed (its error) or nothing."""
    urls: dict[str, str] = {}
    failed: dict[str, Any] = {}
    for front in fronts:
        try:
            urls[front.name] = stack.enter_context(started(front, dirs[front.mode], logs / f"{part}-{front.slug}.log"))
        except Exception as exc:  # noqa: BLE001 - recorded; the others go on
            failed[front.name] = repr(exc)[-2000:]
            print(f"{front.name} on {part}: failed to start: {exc!r}"[:2000], flush=True)
    return urls, failed


def round_order(names: Sequence[str], round_: int) -> list[str]:
    """The fronts in order in even rounds, reversed in odd ones."""
    return list(names) if round_ % 2 == 0 else list(reversed(names))


def machine(host: dict[str, float], own_cpu_s: float) -> dict[str, Any]:
    """The machine during a run, from a :func:`~benchmarks.common.host_delta`: the share stolen by the
    hypervisor, and the busy CPU seconds of everything but the measured server and this load generator
    (other jobs on the box, the idle servers)."""
    return {"steal": rnd(steal_share(host), 3),
            "others_cpu_s": rnd(max(0.0, host.get("busy", 0.0) - own_cpu_s), 2) if host else None}


def fake_run(url: str, name: str, clients: int, duration: float) -> dict[str, Any]:
    """One closed-loop load through a running front: server.py's row plus the machine's share (steal,
    others' CPU) and the CPU milliseconds per request of the front end and of its worker."""
    pid = server.server_pid(url)
    before, host0, client0 = cpu_seconds(pid) if pid else (0.0, 0.0), host_cpu(), time.process_time()
    try:
        load = server.http_load(url, name, clients, duration, FAKE_NEW_TOKENS)
    except Exception as exc:  # noqa: BLE001 - a hung or failed front is a result
        return {"front": name, "clients": clients, "failed": repr(exc)[:300]}
    after, host, client = cpu_seconds(pid) if pid else (0.0, 0.0), host_delta(host0, host_cpu()), time.process_time()
    row = load.row()
    done = row["requests"] or 0
    front_s, worker_s = after[0] - before[0], after[1] - before[1]
    row.update(machine(host, front_s + worker_s + client - client0))
    row["server_cores"] = rnd((front_s + worker_s) / load.elapsed, 2) if load.elapsed else None
    row["front_cpu_ms_per_req"] = rnd(1000 * front_s / done, 3) if done else None
    row["worker_cpu_ms_per_req"] = rnd(1000 * worker_s / done, 3) if done else None
    return row


def hf_run(url: str, name: str, jobs: list[Job], timeout: float = WORKLOAD_TIMEOUT_S) -> dict[str, Any]:
    """The workload once through a running front, all requests at once, at most ``timeout`` s."""
    async def bounded() -> tuple[float, list[dict[str, Any]]]:
        return await asyncio.wait_for(_workload(url, jobs), timeout)

    pid = server.server_pid(url)
    cpu0, host0, client0 = cpu_seconds(pid) if pid else (0.0, 0.0), host_cpu(), time.process_time()
    try:
        wall, results = asyncio.run(bounded())
    except Exception as exc:  # noqa: BLE001 - a hung or failed front is a result
        return {"front": name, "failed": repr(exc)[:300]}
    cpu1, host, client = cpu_seconds(pid) if pid else (0.0, 0.0), host_delta(host0, host_cpu()), time.process_time()
    tokens = sum(len(r["ids"]) for r in results)
    ttft = [r["times"][0] for r in results if r["times"]]
    front_s, worker_s = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    return {"front": name, "wall_s": rnd(wall), "tokens": tokens, "tok_s": rnd(tokens / wall, 1),
            "ttft_p50_ms": rnd(1000 * (pct(ttft, 0.5) or 0), 1), "ttft_p99_ms": rnd(1000 * (pct(ttft, 0.99) or 0), 1),
            "errors": sum(len(r["errors"]) + (r.get("status") != 200) for r in results),
            "front_cpu_s": rnd(front_s), "worker_cpu_s": rnd(worker_s),
            "server_cores": rnd((front_s + worker_s) / wall),
            "tok_per_server_cpu_s": rnd(tokens / (front_s + worker_s), 1) if front_s + worker_s > 0 else None,
            **machine(host, front_s + worker_s + client - client0), "token_ids": [r["ids"] for r in results]}


def paired_ratios(mine: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]],
                  keys: Sequence[str]) -> dict[str, Any]:
    """Per key, ``mine`` over ``base`` in each round (runs of the same index), their median, and the
    median over the rounds where neither run's ``steal`` exceeded :data:`STEAL_LIMIT`. A failed run
    (``failed``) or a missing value leaves its round out."""
    out: dict[str, Any] = {}
    for key in keys:
        per: list[tuple[float, bool]] = []
        for a, b in zip(mine, base, strict=False):
            if "failed" in a or "failed" in b or not a.get(key) or not b.get(key):
                continue
            clean = max(a.get("steal") or 0.0, b.get("steal") or 0.0) <= STEAL_LIMIT
            per.append((a[key] / b[key], clean))
        unstolen = [x for x, ok in per if ok]
        out[key] = {"per_round": [rnd(x) for x, _ in per], "median": rnd(median([x for x, _ in per])),
                    "unstolen_rounds": len(unstolen), "unstolen_median": rnd(median(unstolen))}
    return out


def comparisons(names: Sequence[str], djl_versions: Sequence[str]) -> list[tuple[str, str, str]]:
    """``(kind, mine, base)`` for every pair whose two fronts are both in ``names``: async over sync on
    each front, DJL over ours in async mode and in sync mode."""
    pairs: list[tuple[str, str, str]] = []
    for where in [OURS, *(f"DJL {v}" for v in djl_versions)]:
        pairs.append((ASYNC_OVER_SYNC, f"{where} async", f"{where} sync"))
    for v in djl_versions:
        for mode in ("async", "sync"):
            pairs.append((DJL_OVER_OURS, f"DJL {v} {mode}", f"{OURS} {mode}"))
    return [p for p in pairs if p[1] in names and p[2] in names]


def ratio_block(runs: dict[str, list[dict[str, Any]]], djl_versions: Sequence[str],
                keys: Sequence[str]) -> dict[str, Any]:
    """Every comparison's :func:`paired_ratios`, keyed ``"mine / base"``."""
    return {f"{mine} / {base}": {"kind": kind, **paired_ratios(runs[mine], runs[base], keys)}
            for kind, mine, base in comparisons(list(runs), djl_versions)}


def goals(ratios: dict[str, Any], throughput: str) -> dict[str, Any]:
    """Whether each comparison meets its goal, on the plain medians: async >= sync in ``throughput``;
    DJL async >= 0.95x ours async in ``throughput`` with TTFT p50 <= 1.1x ours."""
    out: dict[str, Any] = {}
    for pair, block in ratios.items():
        thr = block[throughput]["median"]
        if block["kind"] == ASYNC_OVER_SYNC:
            out[pair] = {"goal": f"{throughput} >= 1.0", "met": thr is not None and thr >= 1.0}
        elif pair.split(" / ")[0].endswith("async"):
            ttft = block["ttft_p50_ms"]["median"]
            out[pair] = {"goal": f"{throughput} >= 0.95 and ttft_p50 <= 1.1",
                         "met": thr is not None and ttft is not None and thr >= 0.95 and ttft <= 1.1}
    return out


def summary_rows(runs: dict[str, list[dict[str, Any]]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per front, the median over its rounds of each of ``keys`` and the runs that failed."""
    rows = []
    for name, rs in runs.items():
        ok = [r for r in rs if "failed" not in r]
        row: dict[str, Any] = {"front": name, "rounds": len(ok), "failed": len(rs) - len(ok)}
        for key in keys:
            values = [r[key] for r in ok if r.get(key) is not None]
            row[key] = rnd(median(values), 3)
        rows.append(row)
    return rows


def fake_part(fronts: list[Front], root: Path, logs: Path, levels: Sequence[int], duration: float,
              repeat: int, djl_versions: Sequence[str]) -> dict[str, Any]:
    """The fake engine at each client count, ``repeat`` alternated rounds per count."""
    dirs = {mode: fake_dir(root, mode) for mode in MODE_OPTIONS}
    out: dict[str, Any] = {"new_tokens": FAKE_NEW_TOKENS, "duration_s": duration, "repeat": repeat, "levels": {}}
    with contextlib.ExitStack() as stack:
        urls, out["start_failures"] = start_all(stack, fronts, dirs, logs, "fake")
        for name, url in urls.items():
            fake_run(url, name, 4, 1.0)  # warm-up
        for clients in levels:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
            for r in range(repeat):
                for name in round_order(list(urls), r):
                    run = fake_run(urls[name], name, clients, duration)
                    run["round"] = r
                    runs[name].append(run)
                    print("async fake", json.dumps(run), flush=True)
            ratios = ratio_block(runs, djl_versions, FAKE_RATIOS)
            out["levels"][str(clients)] = {"rows": summary_rows(runs, FAKE_KEYS), "runs": runs, "ratios": ratios,
                                           "goals": goals(ratios, "req_s")}
    out["modes"] = _modes(fronts, dirs, logs, "fake", urls)
    return out


def identical(ids: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> int:
    """How many requests generated exactly the reference's token ids."""
    return sum(list(a) == list(b) for a, b in zip(ids, reference, strict=True))


def hf_part(fronts: list[Front], root: Path, logs: Path, jobs: list[Job], repeat: int, model: str,
            djl_versions: Sequence[str]) -> dict[str, Any]:
    """The mixed workload through every front, ``repeat`` alternated rounds, after a warm-up."""
    dirs = {mode: hf_dir(root, mode, model) for mode in MODE_OPTIONS}
    out: dict[str, Any] = {"n": len(jobs), "prompt_tokens": sum(j.prompt_tokens for j in jobs),
                           "new_tokens_max": sum(j.max_new_tokens for j in jobs), "repeat": repeat}
    with contextlib.ExitStack() as stack:
        urls, out["start_failures"] = start_all(stack, fronts, dirs, logs, "hf")
        for name, url in urls.items():  # every shape once: kernels built, caches grown
            hf_run(url, name, WARM_JOBS)
            print("async hf warm-up", name, json.dumps(
                {k: v for k, v in hf_run(url, name, tagged(jobs, "warm-up")).items() if k != "token_ids"}), flush=True)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
        for r in range(repeat):
            round_jobs = tagged(jobs, f"round {r + 1}")
            for name in round_order(list(urls), r):
                run = hf_run(urls[name], name, round_jobs)
                run["round"] = r
                runs[name].append(run)
                print("async hf", json.dumps({k: v for k, v in run.items() if k != "token_ids"}), flush=True)
    ref = runs.get(f"{OURS} sync") or []
    for rs in runs.values():
        for r, run in enumerate(rs):
            if "token_ids" in run and r < len(ref) and "token_ids" in ref[r]:
                run["identical_to_ours_sync"] = f"{identical(run['token_ids'], ref[r]['token_ids'])}/{len(jobs)}"
    ratios = ratio_block(runs, djl_versions, HF_RATIOS)
    rows = summary_rows(runs, HF_KEYS)
    for row in rows:
        row["identical_to_ours_sync"] = [run.get("identical_to_ours_sync") for run in runs[row["front"]]]
    for rs in runs.values():
        for run in rs:
            run.pop("token_ids", None)
    out.update(rows=rows, runs=runs, ratios=ratios, goals=goals(ratios, "tok_s"),
               modes=_modes(fronts, dirs, logs, "hf", urls))
    return out


def _modes(fronts: list[Front], dirs: dict[str, Path], logs: Path, part: str, urls: dict[str, str]) -> dict[str, str]:
    """The mode each started front ran in: ours as ``djl-handlers check`` resolves it, DJL's from its log."""
    found = {}
    for front in fronts:
        if front.name not in urls:
            continue
        log = logs / f"{part}-{front.slug}.log"
        if front.server == "ours":
            found[front.name] = ours_mode(dirs[front.mode])
        else:
            found[front.name] = djl_mode(log.read_text(errors="replace")) if log.exists() else "unknown (no log)"
    return found


def run_benchmark(quick: bool, which: str = "both", repeat: int | None = None,
                  djl_versions: Sequence[str] = ("0.34", "0.36")) -> dict[str, Any]:
    """Both parts (or ``which``) over ours and the DJL releases; ``quick``: 1 round, 1 and 8 clients for
    3 s, 8 requests of the workload."""
    from transformers import AutoTokenizer

    from benchmarks.workload import mixed_workload
    from djl_handlers.model.embedded import embedded_model_dir

    fronts = fronts_for(djl_versions)
    logs = result_path("async-logs", quick, suffix="")
    logs.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"fronts": [f.name for f in fronts], "djl_versions": list(djl_versions)}
    with tempfile.TemporaryDirectory(prefix="bench-async") as tmp:
        if which in ("fake", "both"):
            levels, duration = ((1, 8), 3.0) if quick else ((1, 8, 32, 64), 8.0)
            report["fake"] = fake_part(fronts, Path(tmp), logs, levels, duration, repeat or (1 if quick else 2),
                                       djl_versions)
        if which in ("embedded", "both"):
            model = str(embedded_model_dir())
            jobs = mixed_workload(AutoTokenizer.from_pretrained(model), n=8 if quick else 32)
            report["embedded"] = hf_part(fronts, Path(tmp), logs, jobs, repeat or (1 if quick else 3), model,
                                         djl_versions)
    return report


def print_report(report: dict[str, Any]) -> None:
    """Each part's summary table and its ratios (medians over rounds), with the goals met or not."""
    from benchmarks.common import print_table

    blocks = [(f"fake engine, {c} clients", FAKE_KEYS, b) for c, b in report.get("fake", {}).get("levels", {}).items()]
    if "embedded" in report:
        hf = report["embedded"]
        blocks.append((f"SmolLM2 bf16, {hf['n']} mixed requests", (*HF_KEYS, "identical_to_ours_sync"), hf))
    for title, keys, block in blocks:
        print_table(block["rows"], ["front", "rounds", "failed", *keys], f"async vs sync: {title}")
        for pair, ratios in block["ratios"].items():
            met = {True: "goal met", False: "GOAL NOT MET", None: ""}[block["goals"].get(pair, {}).get("met")]
            print(f"  {pair}:", {k: v["median"] for k, v in ratios.items() if isinstance(v, dict)}, met)
