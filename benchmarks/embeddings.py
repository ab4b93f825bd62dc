"""Served embeddings against sentence-transformers' own ``encode()``, on the embedded all-MiniLM-L6-v2.

``djl-handlers serve serving.properties.examples/hf-embedding`` (dynamic batching, 16 requests within
10 ms, texts sorted by length) answers ``--clients`` concurrent clients; each request carries 1-16 texts
of 16-256 tokens (a fixed seed picks them, the same texts every run), sent to ``/v1/embeddings``. The
reference embeds the same texts in this process with ``SentenceTransformer.encode`` at its default batch
size (32). Reported per round: texts per second of each, the ratio served / ``encode()``, the served
requests' latency p50/p99; medians over rounds (the two alternate, the server staying up). Both use
every core they are given; on a shared machine compare ratios, not absolute figures.

With ``--vllm`` (``.venv-vllm`` present) vLLM's OpenAI server (what ``vllm serve --runner pooling``
runs) serves the same folder too, started with its defaults, and gets the same requests in the same
rounds: the ratio served / vLLM is reported beside the other.

    python -m benchmarks.embeddings [--clients 64] [--requests 256] [--rounds 3] [--vllm [--vllm-dtype auto]] [--quick]
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
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length


def _workload(requests: int, seed: int, tokenizer: Any) -> list[list[str]]:
    """``requests`` lists of 1-16 texts of 16-256 words built from the tokenizer's plain words, each cut
    (whole words) to the model's ``MAX_TOKENS`` with its special tokens: vLLM refuses a longer text."""
    rng = random.Random(seed)
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 2][:5000]
    words.sort()
    out = []
    for _ in range(requests):
        texts = []
        for _ in range(rng.randint(1, 16)):
            length = rng.randint(16, 256)
            text = " ".join(rng.choice(words) for _ in range(length))[: length * 8]
            while len(tokenizer(text)["input_ids"]) > MAX_TOKENS:  # both servers refuse or cut longer texts
                text = text.rsplit(" ", 1)[0]
            texts.append(text)
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


def _start_vllm(folder: Path, log: Path, dtype: str = "float32") -> tuple[subprocess.Popen[bytes], str]:
    """vLLM's OpenAI server in pooling mode on ``folder`` in ``dtype`` (its ``auto`` runs a pooling
    model in fp16 on an x86 CPU); returns (process, host:port)."""
    import os
    import urllib.request

    from benchmarks.server import free_port

    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2", "VLLM_CPU_KVCACHE_SPACE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
                             "--runner", "pooling", "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port),
                             "--enforce-eager"], env=env, cwd=str(ROOT), stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM's server exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                if reply.status == 200:
                    return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"vLLM's server did not start; see {log}")


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
    parser.add_argument("--vllm", action="store_true", help="also vLLM's OpenAI server in pooling mode")
    parser.add_argument("--vllm-dtype", default="float32",
                        help="vLLM's --dtype (default float32, as the served recipe; auto: vLLM's own choice)")
    parser.add_argument("--quick", action="store_true", help="32 requests, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds = 32, 1
    from sentence_transformers import SentenceTransformer

    from djl_handlers.model.embedder import embedder_dir

    started = context()
    model = SentenceTransformer(str(embedder_dir()), device="cpu")
    logs = Path(tempfile.mkdtemp(prefix="bench-embed-log-"))
    servers: dict[str, tuple[Any, str]] = {"served": _start_server(logs / "server.log")}
    rows = []
    try:
        if args.vllm:
            servers["vllm"] = _start_vllm(embedder_dir(), logs / "vllm.log", args.vllm_dtype)
        for _, url in servers.values():
            _served(url, _workload(8, 99, model.tokenizer), 8)  # warm-up
        for index in range(args.rounds):
            rows.append(_round(index, args, model, {name: url for name, (_, url) in servers.items()}))
    finally:
        for proc, _ in servers.values():
            stop_process(proc)
    print_table(rows, list(rows[0]), f"MiniLM embeddings, {args.clients} clients")
    summary: dict[str, Any] = {"ratio_median": median([r["ratio"] for r in rows]), "rounds": rows,
                               "clients": args.clients, "vllm_dtype": args.vllm_dtype if args.vllm else None}
    if args.vllm:
        summary["ratio_vllm_median"] = median([r["ratio_vllm"] for r in rows])
    print(json.dumps({k: v for k, v in summary.items() if k.startswith("ratio")}))
    write_report("embeddings", summary, args.quick, started)
    return 0


def _round(index: int, args: argparse.Namespace, model: Any, urls: dict[str, str]) -> dict[str, Any]:
    """One round: every contender on the same requests, the order rotating with the round."""
    batches = _workload(args.requests, index, model.tokenizer)
    names = [*urls, "encode"]
    names = names[index % len(names):] + names[:index % len(names)]
    results = {name: _encode(model, batches) if name == "encode" else _served(urls[name], batches, args.clients)
               for name in names}
    served, reference = results["served"], results["encode"]
    row = {"round": index, "texts": sum(len(b) for b in batches),
           "served_texts_per_s": rnd(served["texts_per_s"], 1), "encode_texts_per_s": rnd(reference["texts_per_s"], 1),
           "ratio": rnd(served["texts_per_s"] / reference["texts_per_s"]),
           "p50_s": rnd(served["p50_s"]), "p99_s": rnd(served["p99_s"])}
    if "vllm" in results:
        row.update(vllm_texts_per_s=rnd(results["vllm"]["texts_per_s"], 1),
                   ratio_vllm=rnd(served["texts_per_s"] / results["vllm"]["texts_per_s"]),
                   vllm_p50_s=rnd(results["vllm"]["p50_s"]))
    return row


if __name__ == "__main__":
    sys.exit(main())
