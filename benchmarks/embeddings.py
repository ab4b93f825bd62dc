"""Served embeddings against sentence-transformers' own ``encode()``, on the embedded all-MiniLM-L6-v2.

``djl-handlers serve serving.properties.examples/hf-embedding`` (dynamic batching, 16 requests within
10 ms, texts sorted by length) answers ``--clients`` concurrent clients; each request carries 1-16 texts
of 16-256 tokens (a fixed seed picks them, the same texts every run), sent to ``/v1/embeddings``. The
reference embeds the same texts in this process with ``SentenceTransformer.encode`` at its default batch
size (32). Reported per round: texts per second of each, the ratio served / ``encode()``, the served
requests' latency p50/p99; medians over rounds (the two alternate, the server staying up). Both use
every core they are given; on a shared machine compare ratios, not absolute figures.

    python -m benchmarks.embeddings [--clients 64] [--requests 256] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, context, median, pct, print_table, rnd, stop_process, write_report

EXAMPLE = ROOT / "serving.properties.examples" / "hf-embedding"


def _workload(requests: int, seed: int, tokenizer: Any) -> list[list[str]]:
    """``requests`` lists of 1-16 texts of 16-256 tokens, built from the tokenizer's plain words."""
    rng = random.Random(seed)
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 2][:5000]
    words.sort()
    out = []
    for _ in range(requests):
        texts = []
        for _ in range(rng.randint(1, 16)):
            length = rng.randint(16, 256)
            texts.append(" ".join(rng.choice(words) for _ in range(length))[: length * 8])
        out.append(texts)
    return out


def _start_server(log: Path) -> tuple[subprocess.Popen[str], str]:
    folder = Path(tempfile.mkdtemp(prefix="bench-embed-")) / "hf-embedding"
    shutil.copytree(EXAMPLE, folder)
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from djl_handlers.cli import main; sys.exit(main())",
                             "serve", str(folder), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=str(ROOT))
    assert proc.stdout is not None
    for line in proc.stdout:
        if "serving" in line and "http://" in line:
            return proc, line.split("http://", 1)[1].split()[0].rstrip("/")
    raise RuntimeError(f"the server did not start; see {log}")


def _served(url: str, batches: list[list[str]], clients: int) -> dict[str, Any]:
    import httpx

    latencies: list[float] = []

    def send(texts: list[str]) -> None:
        start = time.perf_counter()
        reply = httpx.post(f"http://{url}/v1/embeddings", json={"input": texts, "encoding_format": "base64"},
                           timeout=600)
        reply.raise_for_status()
        latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(send, batches))
    elapsed = time.perf_counter() - start
    texts = sum(len(b) for b in batches)
    return {"texts_per_s": texts / elapsed, "p50_s": pct(latencies, 0.5), "p99_s": pct(latencies, 0.99)}


def _encode(model: Any, batches: list[list[str]]) -> dict[str, Any]:
    texts = [t for b in batches for t in b]
    start = time.perf_counter()
    model.encode(texts, normalize_embeddings=True)
    return {"texts_per_s": len(texts) / (time.perf_counter() - start)}


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print the table, write ``benchmarks/results/embeddings.json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="32 requests, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds = 32, 1
    from sentence_transformers import SentenceTransformer

    from djl_handlers.model.embedder import embedder_dir

    started = context()
    model = SentenceTransformer(str(embedder_dir()), device="cpu")
    log = Path(tempfile.mkdtemp(prefix="bench-embed-log-")) / "server.log"
    proc, url = _start_server(log)
    rows = []
    try:
        _served(url, _workload(8, 99, model.tokenizer), 8)  # warm-up
        for index in range(args.rounds):
            batches = _workload(args.requests, index, model.tokenizer)
            first, second = (_served, _encode) if index % 2 == 0 else (_encode, _served)
            results = {fn.__name__: fn(url, batches, args.clients) if fn is _served else fn(model, batches)
                       for fn in (first, second)}
            served, reference = results["_served"], results["_encode"]
            rows.append({"round": index, "texts": sum(len(b) for b in batches),
                         "served_texts_per_s": rnd(served["texts_per_s"], 1),
                         "encode_texts_per_s": rnd(reference["texts_per_s"], 1),
                         "ratio": rnd(served["texts_per_s"] / reference["texts_per_s"]),
                         "p50_s": rnd(served["p50_s"]), "p99_s": rnd(served["p99_s"])})
    finally:
        stop_process(proc)
    print_table(rows, list(rows[0]), f"MiniLM embeddings, {args.clients} clients")
    summary = {"ratio_median": median([r["ratio"] for r in rows]), "rounds": rows, "clients": args.clients}
    print(json.dumps({"ratio_median": summary["ratio_median"]}))
    write_report("embeddings", summary, args.quick, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
