"""benchmarks/architectures.py and benchmarks/vllm_client.py: the arithmetic of the rounds (per-round
ratios ours / vLLM, medians, steal), the CPU patch lines read back from a server log, the memory of a
process tree, and the client's command line (fixed lengths, ignore_eos, greedy)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import pytest

import benchmarks.architectures as architectures
from benchmarks.architectures import MemoryWatch, _patch_lines, summary, tree_pss, tree_rss
from benchmarks.vllm_client import vllm_arguments


def _run(tok_s: float, ttft: float, steal: float = 0.0, failed: int = 0) -> dict[str, Any]:
    return {"tok_s": tok_s, "ttft_p50_s": ttft, "ttft_p99_s": 2 * ttft, "itl_p50_ms": 10.0, "failed": failed,
            "host_cpu_s": {"busy": 20.0, "idle": 0.0, "steal": steal}}


def test_summary_takes_ratios_within_each_round_and_their_median() -> None:
    runs = {"hf": [_run(120, 1.0), _run(90, 2.0), _run(100, 1.0)],
            "vllm": [_run(100, 2.0), _run(100, 1.0), _run(50, 4.0, steal=5.0)]}
    got = summary(runs)
    assert got["tok_s_ratio_per_round"] == [1.2, 0.9, 2.0]
    assert got["tok_s_ratio_median"] == 1.2
    assert got["ttft_p50_ratio_per_round"] == [0.5, 2.0, 0.25] and got["ttft_p50_ratio_median"] == 0.5
    assert got["tok_s_ratio_unstolen"] == {"rounds": 2, "median": 1.05}  # the stolen third round left out
    assert got["medians"]["hf"]["tok_s"] == 100 and got["medians"]["vllm"]["ttft_p99_s"] == 4.0


def test_patch_lines_are_read_back_from_the_server_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("2026-12-05 INFO djl_handlers.engines.hf.cpu.patches: CPU patch cpu_norm: fell back: no RMSNorm "
                   "module (the model normalises with LayerNorm)\nother line\n"
                   "x CPU patch cpu_linear: applied: 3 nn.Linear layers on prepacked oneDNN weights\n")
    assert _patch_lines(log) == {"cpu_norm": "fell back: no RMSNorm module (the model normalises with LayerNorm)",
                                 "cpu_linear": "applied: 3 nn.Linear layers on prepacked oneDNN weights"}


def test_tree_pss_counts_this_process() -> None:
    assert tree_pss(os.getpid()) > 10 * 2**20
    assert tree_pss(2**22 + 12345) == 0  # no such process
    assert tree_rss(os.getpid()) >= tree_pss(os.getpid()) // 2 > 0  # shared pages count whole in RSS
    assert tree_rss(2**22 + 12345) == 0


def test_the_watch_walks_page_tables_only_when_the_resident_size_reaches_a_new_high(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = iter([100, 101, 150, 150, 149, 200] + [200] * 1000)  # resident bytes, one per sample
    walks: list[int] = []
    monkeypatch.setattr(architectures, "tree_rss", lambda pid: next(sizes))
    monkeypatch.setattr(architectures, "tree_pss", lambda pid: walks.append(pid) or 10 * len(walks))
    watch = MemoryWatch(4321, every=0.001)
    deadline = time.monotonic() + 10
    while watch.walks < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    watch.stop()
    assert watch.walks == 3  # at 100, 150 and 200: not at 101 (under 2 % more) nor at 150 again
    assert watch.reset() == 40  # one more walk at reset, the largest PSS seen


def test_the_client_asks_for_fixed_lengths_greedy_and_ignore_eos(tmp_path: Path) -> None:
    args = argparse.Namespace(base_url="http://127.0.0.1:1", model="m", tokenizer="t", seed=3, num_prompts=16,
                              input_len=128, output_len=64, max_concurrency=8, result=str(tmp_path / "r.json"))
    line = vllm_arguments(args)
    pairs = dict(zip(line[::1], line[1:], strict=False))
    assert pairs["--random-input-len"] == "128" and pairs["--random-output-len"] == "64"
    assert pairs["--random-range-ratio"] == "0" and pairs["--temperature"] == "0" and "--ignore-eos" in line
    assert pairs["--max-concurrency"] == "8" and pairs["--seed"] == "3" and pairs["--dataset-name"] == "random"
    assert pairs["--result-dir"] == str(tmp_path) and pairs["--result-filename"] == "r.json"


def test_a_variant_is_an_hf_server_with_options_and_gets_its_own_ratios() -> None:
    import pytest

    from benchmarks.architectures import parse_variant

    assert parse_variant("fixed:option.cpu_threads=fixed; max_prefill_tokens=512") == (
        "fixed", (("cpu_threads", "fixed"), ("max_prefill_tokens", "512")))
    for bad in ("fixed", "hf:cpu_threads=fixed", ":a=b", "x:novalue"):
        with pytest.raises(ValueError, match="--variant"):
            parse_variant(bad)
    runs = {"hf": [_run(100, 1.0)], "vllm": [_run(80, 1.0)], "fixed": [_run(120, 1.0)]}
    got = summary(runs)
    assert got["tok_s_ratio_per_round"] == [1.25] and got["fixed_tok_s_ratio_per_round"] == [1.5]


def test_a_round_with_failed_requests_has_no_ratio_and_is_counted() -> None:
    runs = {"hf": [_run(100, 1.0), _run(90, 1.0)], "vllm": [_run(80, 1.0), _run(0.0, 0.0, failed=16)]}
    got = summary(runs)
    assert got["tok_s_ratio_per_round"] == [1.25, None] and got["tok_s_ratio_median"] == 1.25
    assert got["failed_requests"] == {"hf": 0, "vllm": 16}
    assert got["medians"]["vllm"]["tok_s"] == 80  # the failed run is not a speed


def test_kv_bytes_per_token_of_vllm_is_read_from_its_start_up_log(tmp_path: Path) -> None:
    from benchmarks.architectures import vllm_kv_bytes_per_token

    log = tmp_path / "vllm.log"
    log.write_text("(Worker pid=1) INFO [cpu_worker.py:260] Explicitly set (2.0/23.54) GiB for KV cache on node 0.\n"
                   "(EngineCore pid=2) INFO [kv_cache_utils.py:2327] CPU KV cache size: 65,536 tokens, Maximum "
                   "concurrency for 2,048 tokens per request: 32.00x\n")
    assert vllm_kv_bytes_per_token(log) == 2 * 2**30 // 65536
    log.write_text("CPU KV cache size: 65,536 tokens\n")  # the bytes line missing: no figure
    assert vllm_kv_bytes_per_token(log) is None


def test_kv_bytes_per_token_of_ours_is_read_from_metrics() -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from benchmarks.architectures import hf_kv_bytes_per_token

    body = (b'# TYPE djl_handlers_kv_cache_bytes_per_token gauge\n'
            b'djl_handlers_kv_cache_bytes_per_token{model="m"} 46080.0\n')

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert hf_kv_bytes_per_token(f"http://127.0.0.1:{server.server_port}") == 46080
        body = b"djl_handlers_worker_up 1.0\n"
        assert hf_kv_bytes_per_token(f"http://127.0.0.1:{server.server_port}") is None
    finally:
        server.shutdown()
        server.server_close()


def test_no_rounds_gives_no_ratios_and_no_medians() -> None:  # --rounds 0: the warm-up alone, for memory
    got = summary({"hf": [], "vllm": []})
    assert got["tok_s_ratio_per_round"] == [] and got["tok_s_ratio_median"] is None
    assert got["medians"]["hf"]["tok_s"] is None and got["failed_requests"] == {"hf": 0, "vllm": 0}
