"""``python -m benchmarks.robustness``: how djl_handlers copes with bad input, faults and load.

In-process (always): every case of the bad-input corpus (``tests/robustness/corpus.py``) through
``InferenceService`` on the fake engine, in rolling- and dynamic-batch mode, each between two good
neighbours, plus the whole corpus at once in big rolling batches; every fault scenario of
``tests/robustness/faults.py``. Prints ``cases tried / passed``, ``faults injected / survived`` and
``requests sent / lost`` (a request is lost when it does not get its correct outcome: the exact text
for a good one, its own explicit 4xx for a bad one).

Over HTTP (unless ``--no-http``, and only when ``djl_handlers.server`` is importable): starts
``djl-handlers serve tests/robustness/models/fake_lmi --port 0`` on 127.0.0.1 and sends the corpus
(interleaved with good requests), malformed HTTP (raw sockets: garbage request lines, bad
Content-Length, 30 MiB declared and >20 MiB streamed bodies, a ``handler`` header...), then runs
``--clients`` concurrent streaming clients for ``--duration`` seconds checking every byte, and
reports the server's RSS (server + worker) before and after.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "tests" / "robustness" / "models" / "fake_lmi"
MIB = 1024 * 1024
_LISTENING = re.compile(r"djl-handlers: serving (\S+) at (http://\S+)")

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from djl_handlers.engines.fake import REPLY  # noqa: E402
from tests.robustness.corpus import CORPUS, DYNAMIC, ROLLING, Case  # noqa: E402
from tests.robustness.faults import scenarios  # noqa: E402
from tests.robustness.harness import (  # noqa: E402
    GOOD_JSON,
    dynamic_outcome,
    lost_in_rolling,
    run_rolling,
)


@dataclass
class Tally:
    """Counts of one section."""

    tried: int = 0
    passed: int = 0
    known_bug_failures: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    xpassed: list[str] = field(default_factory=list)
    sent: int = 0
    lost: int = 0
    lost_to_known_bugs: int = 0

    def record(self, name: str, problems: Sequence[str], bug: Optional[str], sent: int, lost: int) -> None:
        """Add one run."""
        self.tried += 1
        self.sent += sent
        self.lost += lost
        if not problems:
            self.passed += 1
            if bug:
                self.xpassed.append(name)
        elif bug:
            self.known_bug_failures.append(name)
            self.lost_to_known_bugs += lost
        else:
            self.unexpected.append(f"{name}: {problems[0]}"[:240])


# ------------------------------------------------------------------------------------------------
# in-process


def run_inprocess() -> tuple[Tally, Tally, Tally]:
    """(per-case runs, whole-corpus batches, fault scenarios)."""
    cases = Tally()
    for case in CORPUS:
        if ROLLING in case.modes:
            [outcome] = run_rolling([case], case.engine)
            cases.record(f"{case.name} [rolling]", outcome.problems, case.bug_in(ROLLING), 3,
                         lost_in_rolling(case, outcome))
        if DYNAMIC in case.modes:
            dyn = dynamic_outcome(case)
            cases.record(f"{case.name} [dynamic]", dyn.problems, case.bug_in(DYNAMIC), 3, dyn.lost)
    batches = Tally()
    for engine in ("huggingface", "vllm"):
        chosen = [c for c in CORPUS if ROLLING in c.modes and c.engine == engine and not c.bug_in(ROLLING)]
        for start in range(0, len(chosen), 300):
            chunk = chosen[start:start + 300]
            for case, outcome in zip(chunk, run_rolling(chunk, engine), strict=True):
                batches.record(f"{case.name} [batch]", outcome.problems, None, 3, lost_in_rolling(case, outcome))
    faults = Tally()
    for scenario in scenarios():
        problems = scenario.run()
        faults.record(scenario.name, problems, scenario.known_bug, scenario.faults, scenario.faults if problems else 0)
    return cases, batches, faults


# ------------------------------------------------------------------------------------------------
# the local server


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants, in MiB (Linux /proc)."""
    total = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, AttributeError):
            continue
    return total / 1024


@contextmanager
def local_server(model_dir: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``djl-handlers serve model_dir --port 0`` on 127.0.0.1; yields (base URL, process)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    code = "import sys; from djl_handlers.cli import main; sys.exit(main())"
    log = open(os.devnull, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", str(model_dir), "--host", "127.0.0.1",
                             "--port", "0", "--grace", "5"], stdout=subprocess.PIPE, stderr=log, text=True,
                            env=env, cwd=str(ROOT))
    try:
        url = _wait_listening(proc)
        yield url, proc
    finally:
        from benchmarks.common import stop_process

        stop_process(proc, 20)
        log.close()


def _wait_listening(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    found: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = _LISTENING.search(line)
            if match and not found:
                found.append(match.group(2))

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not found:
        if proc.poll() is not None:
            raise RuntimeError(f"djl-handlers serve exited with {proc.returncode}")
        time.sleep(0.1)
    if not found:
        raise RuntimeError("djl-handlers serve did not start within 120 s")
    return found[0]


def _headers(case: Case) -> dict[str, str]:
    headers = dict(case.headers)
    if case.content_type is not None:
        headers["Content-Type"] = case.content_type
    if case.api is not None:
        headers["X-Djl-Handlers-Api"] = case.api
    return headers


def judge_http(case: Case, status: int, body: bytes, content_type: str) -> list[str]:
    """Problems with one HTTP answer to a corpus case."""
    expected = case.expected_http_status
    if status != expected:
        return [f"expected HTTP {expected}, got {status}: {body[:120]!r}"]
    if expected >= 400:
        try:
            parsed = json.loads(body)
            error = parsed.get("error") or parsed["message"]  # handler errors / front-end errors
        except (ValueError, KeyError, TypeError, AttributeError):
            return [f"error body is not JSON with 'error' or 'message': {body[:120]!r}"]
        missing = [m for m in case.mentions if m.lower() not in str(error).lower()]
        return [f"error {error!r} does not mention {missing}"[:240]] if missing else []
    if case.expect_text is None:
        return [] if body else ["empty body"]
    text = body.decode("utf-8", errors="replace")
    try:
        last = json.loads(text.splitlines()[-1]) if "jsonlines" in content_type else json.loads(text)
    except (ValueError, IndexError):
        return [f"body is not JSON: {text[:80]!r}"]
    got = last.get("generated_text") if isinstance(last, dict) else None
    return [] if got == case.expect_text else [f"expected {case.expect_text[:30]!r}, got {str(got)[:30]!r}"]


def _good_after(client: Any) -> bool:
    try:
        good = client.post("/invocations", content=json.dumps(GOOD_JSON).encode(),
                           headers={"Content-Type": "application/json"})
        return bool(good.status_code == 200 and json.loads(good.content) == {"generated_text": REPLY[:5]})
    except Exception:  # noqa: BLE001
        return False


def _send_case(client: Any, case: Case) -> list[str]:
    try:
        response = client.post("/invocations", content=case.body, headers=_headers(case))
    except Exception as exc:  # noqa: BLE001 - a transport failure is a lost request
        return [f"transport error {exc!r}"]
    return judge_http(case, response.status_code, response.content, response.headers.get("content-type", ""))


def _stream_text(client: Any, n: int) -> bool:
    body = json.dumps({"inputs": "bystander", "stream": True, "parameters": {"max_new_tokens": n}}).encode()
    try:
        with client.stream("POST", "/invocations", content=body,
                           headers={"Content-Type": "application/json"}) as response:
            lines = [line for line in response.iter_lines() if line]
            return response.status_code == 200 and _check_stream(lines, n)
    except Exception:  # noqa: BLE001
        return False


def run_http_corpus(client: Any, workers: int = 8) -> Tally:
    """Every HTTP-able corpus case, each followed by a good request on the same connection, 8 at a
    time; cases with a known bug run afterwards one by one, each while a bystander streams."""
    tally = Tally()
    lock = threading.Lock()
    chosen = [c for c in CORPUS if c.http and ROLLING in c.modes and c.engine == "huggingface"]

    def one(case: Case) -> None:
        problems = _send_case(client, case)
        good_ok = _good_after(client)
        with lock:
            lost = int(bool(problems)) + int(not good_ok)
            if not good_ok:
                problems = [*problems, "the good request after it failed"]
            tally.record(case.name, problems, case.bug_in("http"), 2, lost)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, [c for c in chosen if not c.bug_in("http")]))
        for case in [c for c in chosen if c.bug_in("http")]:
            bystander = pool.submit(_stream_text, client, 200)
            time.sleep(0.05)  # let the bystander join the rolling batch first
            problems = _send_case(client, case)
            ok = bystander.result()
            if not ok:
                problems = [*problems, "a bystander streaming at the same time failed"]
            tally.record(case.name, problems, case.bug_in("http"), 2, int(bool(problems)) + int(not ok))
    return tally


# raw HTTP: (name, request bytes or a callable that sends, acceptable status codes; None = closed is fine)
def _raw_cases(host: str) -> list[tuple[str, bytes, tuple[int, ...]]]:
    body = b'{"inputs": "x"}'
    post = b"POST /invocations HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
    return [
        ("garbage-request-line", b"GARBAGE\r\n\r\n", (400,)),
        ("header-without-colon", post + b"NoColonHere\r\n\r\n", (400,)),
        ("header-100KiB", post + b"X-Big: " + b"a" * 100_000 + b"\r\nContent-Length: 0\r\n\r\n", (400, 431)),
        ("content-length-negative", post + b"Content-Length: -1\r\n\r\n" + body, (400,)),
        ("content-length-text", post + b"Content-Length: abc\r\n\r\n" + body, (400,)),
        ("content-length-twice", post + b"Content-Length: 15\r\nContent-Length: 16\r\n\r\n" + body, (400,)),
        ("bad-chunk-size", post + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n", (400,)),
        ("declared-30MiB", post + b"Content-Type: application/json\r\nContent-Length: " + str(30 * MIB).encode()
         + b"\r\n\r\n" + body, (413,)),
        ("handler-header", post + b"handler: evil\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n"
         + body, (400,)),
        ("http-0.9-style", b"POST /invocations\r\n\r\n", (400,)),
        ("non-ascii-header-name", post + "X-Ünïcode: 1\r\n".encode("latin-1") + b"Content-Length: 15\r\n\r\n"
         + body, (400,)),
        ("unknown-route", b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", (404,)),
        ("get-invocations", b"GET /invocations HTTP/1.1\r\nHost: x\r\n\r\n", (405,)),
    ]


def _raw_status(host: str, port: int, payload: bytes, timeout: float = 10.0) -> Optional[int]:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            sock.sendall(payload)
        except OSError:
            pass  # the server may answer and close before it read everything
        data = b""
        try:
            while b"\r\n" not in data:
                piece = sock.recv(4096)
                if not piece:
                    break
                data += piece
        except OSError:
            pass
    match = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    return int(match.group(1)) if match else None


def _chunked_upload(host: str, port: int, size: int) -> Optional[int]:
    """POST a body of ``size`` bytes with chunked encoding (no Content-Length to refuse early)."""
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"a" * MIB
        sent = 0
        try:
            while sent < size:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # refused mid-way: read the answer
        data = b""
        try:
            while b"\r\n" not in data:
                piece = sock.recv(4096)
                if not piece:
                    break
                data += piece
        except OSError:
            pass
    match = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    return int(match.group(1)) if match else None


def run_raw_http(url: str, client: Any) -> Tally:
    """Malformed HTTP on raw sockets; after each, the server must still answer /ping and a request."""
    host, port = url.split("//")[1].split(":")
    tally = Tally()
    cases: list[tuple[str, Any, tuple[int, ...]]] = [
        (name, lambda payload=payload: _raw_status(host, int(port), payload), ok)
        for name, payload, ok in _raw_cases(host)]
    cases.append(("chunked-21MiB-body", lambda: _chunked_upload(host, int(port), 21 * MIB), (413,)))
    cases.append(("truncated-body-then-close",
                  lambda: _raw_status(host, int(port), b"POST /invocations HTTP/1.1\r\nHost: x\r\n"
                                      b"Content-Length: 100\r\n\r\n{\"inputs\"", timeout=2.0), (0,)))
    for name, send, ok in cases:
        try:
            status = send()
        except Exception as exc:  # noqa: BLE001
            status, problems = None, [f"{exc!r}"]
        else:
            problems = [] if (status in ok or (0 in ok and status is None)) else [f"expected {ok}, got {status}"]
        alive = client.get("/ping").status_code == 200
        good = client.post("/invocations", content=json.dumps(GOOD_JSON).encode(),
                           headers={"Content-Type": "application/json"})
        if not alive or good.status_code != 200:
            problems.append("the server did not answer normally afterwards")
        tally.record(name, problems, None, 1, int(bool(problems)))
    return tally


@dataclass
class LoadResult:
    """Outcome of the concurrent streaming run."""

    sent: int = 0
    ok: int = 0
    garbled: int = 0
    lost: int = 0
    abandoned: int = 0
    samples: list[str] = field(default_factory=list)


def _check_stream(lines: list[str], n: int) -> bool:
    try:
        parsed = [json.loads(line) for line in lines]
    except ValueError:
        return False
    tokens = "".join(p["token"]["text"] for p in parsed if "token" in p)
    expected = (REPLY * (n // len(REPLY) + 1))[:n]
    return len(parsed) == n and tokens == expected and parsed[-1].get("generated_text") == expected


def run_load(url: str, clients: int, duration: float, seed: int = 0) -> LoadResult:
    """``clients`` threads stream requests for ``duration`` s; every answer is checked byte for byte.
    One request in 16 is abandoned after its first line (the client disconnects)."""
    import httpx

    result = LoadResult()
    lock = threading.Lock()
    stop_at = time.monotonic() + duration

    def client_loop(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        with httpx.Client(base_url=url, timeout=60) as client:
            while time.monotonic() < stop_at:
                n = rng.randint(4, 48)
                abandon = rng.random() < 1 / 16
                body = json.dumps({"inputs": f"client {index}", "stream": True,
                                   "parameters": {"max_new_tokens": n}}).encode()
                verdict, sample = "ok", ""
                try:
                    with client.stream("POST", "/invocations", content=body,
                                       headers={"Content-Type": "application/json"}) as response:
                        if abandon:
                            next(response.iter_lines(), None)
                            verdict = "abandoned"
                        else:
                            lines = [line for line in response.iter_lines() if line]
                            if response.status_code != 200 or not _check_stream(lines, n):
                                verdict, sample = "garbled", f"{response.status_code} {lines[-1:]!r}"[:200]
                except Exception as exc:  # noqa: BLE001 - a transport failure is a lost request
                    verdict, sample = "lost", repr(exc)[:200]
                with lock:
                    result.sent += 1
                    setattr(result, verdict, getattr(result, verdict) + 1)
                    if sample and len(result.samples) < 5:
                        result.samples.append(sample)

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return result


def run_http(clients: int, duration: float) -> dict[str, Any]:
    """The whole HTTP section; raises when the server cannot start."""
    import httpx

    with local_server(MODEL_DIR) as (url, proc), httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(20):  # warm up before the first RSS reading
            client.post("/invocations", content=json.dumps(GOOD_JSON).encode(),
                        headers={"Content-Type": "application/json"})
        rss_before = rss_mib(proc.pid)
        corpus = run_http_corpus(client)
        raw = run_raw_http(url, client)
        load = run_load(url, clients, duration)
        after = client.post("/invocations", content=json.dumps(GOOD_JSON).encode(),
                            headers={"Content-Type": "application/json"})
        rss_after = rss_mib(proc.pid)
        return {"url": url, "corpus": corpus, "raw": raw, "load": load, "rss": (rss_before, rss_after),
                "after_ok": after.status_code == 200}


# ------------------------------------------------------------------------------------------------
# report


def _line(label: str, text: str) -> None:
    print(f"  {label:<34} {text}")


def _tally(label: str, tally: Tally, unit: str = "cases") -> None:
    extra = f"({len(tally.known_bug_failures)} known bugs, {len(tally.unexpected)} unexpected"
    extra += f", {len(tally.xpassed)} known bugs now passing)" if tally.xpassed else ")"
    _line(f"{unit} tried / passed:", f"{tally.tried} / {tally.passed}   {extra}")


def _details(tally: Tally) -> None:
    for name in tally.unexpected[:20]:
        print(f"      UNEXPECTED {name}")
    for name in tally.xpassed:
        print(f"      NOW PASSING (drop its known_bug) {name}")


def main(argv: Optional[list[str]] = None) -> int:
    """Run everything and print the figures; exit 1 when something failed that is not a known bug."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.robustness")
    parser.add_argument("--no-http", action="store_true", help="in-process part only")
    parser.add_argument("--clients", type=int, default=64, help="concurrent streaming clients")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of streaming load")
    args = parser.parse_args(argv)

    logging.disable(logging.CRITICAL)  # the injected faults log tracebacks by design
    start = time.monotonic()
    cases, batches, faults = run_inprocess()
    modes = Counter(m for c in CORPUS for m in c.modes)
    print(f"in-process (InferenceService + fake engine; corpus of {len(CORPUS)} cases: "
          f"{modes[ROLLING]} rolling, {modes[DYNAMIC]} dynamic runs)")
    _tally("cases", cases)
    _details(cases)
    _line("faults injected / survived:", f"{faults.sent} / {faults.sent - faults.lost}   ({faults.tried} scenarios, "
          f"{len(faults.known_bug_failures)} failing on a known bug)")
    _details(faults)
    sent, lost = cases.sent + batches.sent, cases.lost + batches.lost
    _line("requests sent / lost:", f"{sent} / {lost}   ({cases.lost_to_known_bugs} to known bugs; {batches.sent} "
          f"of them in whole-corpus rolling batches of up to 900)")
    _details(batches)
    print(f"  ({time.monotonic() - start:.1f} s)")
    failed = bool(cases.unexpected or batches.unexpected or faults.unexpected or batches.lost)

    if args.no_http:
        return int(failed)
    try:
        import djl_handlers.cli  # noqa: F401
        import djl_handlers.server.app  # noqa: F401
    except ImportError as exc:
        print(f"http: skipped ({exc})")
        return int(failed)
    start = time.monotonic()
    try:
        http = run_http(args.clients, args.duration)
    except (RuntimeError, OSError) as exc:
        print(f"http: skipped, the server did not start ({exc})")
        return int(failed)
    corpus, raw, load = http["corpus"], http["raw"], http["load"]
    print(f"http (djl-handlers serve {MODEL_DIR.relative_to(ROOT)} at {http['url']})")
    _tally("cases", corpus)
    _details(corpus)
    _tally("malformed-HTTP", raw, unit="raw cases")
    _details(raw)
    _line("requests sent / lost (corpus):", f"{corpus.sent + raw.sent} / {corpus.lost + raw.lost}   "
          f"({corpus.lost_to_known_bugs} of them to known bugs)")
    _line(f"streaming, {args.clients} clients x {args.duration:.0f} s:",
          f"sent {load.sent}, ok {load.ok}, abandoned {load.abandoned}, lost {load.lost}, garbled {load.garbled}")
    for sample in load.samples:
        print(f"      {sample}")
    before, after = http["rss"]
    _line("RSS server+worker before / after:", f"{before:.0f} MiB / {after:.0f} MiB")
    _line("healthy afterwards:", str(http["after_ok"]))
    print(f"  ({time.monotonic() - start:.1f} s)")
    failed = failed or bool(corpus.unexpected or raw.unexpected or load.lost or load.garbled or not http["after_ok"])
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
