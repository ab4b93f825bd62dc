"""benchmarks/llama_cpp.py: llama-server's command line, the per-request token check, the per-round
ratios ours / llama-server with their medians and the goal, and finding the build."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest

from benchmarks.architectures import Workload
from benchmarks.llama_cpp import (
    LLAMA,
    OURS,
    PRECISIONS,
    REPACK_OFF,
    crashed_on_load,
    find_llama,
    llama_command,
    llama_counts,
    serve_llama,
    slot_context,
    summary,
    table_row,
    token_check,
    with_server_counts,
)
from benchmarks.vllm_client import vllm_arguments

WORK = Workload(prompts=32, concurrency=32, input_len=256, output_len=128)


def _run(tok_s: float, ttft: float, exact: bool = True, failed: int = 0, steal: float = 0.0) -> dict[str, Any]:
    return {"tok_s": tok_s, "ttft_p50_s": ttft, "ttft_p99_s": 2 * ttft, "itl_p50_ms": 10.0, "failed": failed,
            "tokens": {"exact_output": exact}, "host_cpu_s": {"busy": 20.0, "idle": 0.0, "steal": steal}}


def test_llama_server_gets_a_slot_per_client_with_room_for_prompt_and_output() -> None:
    line = llama_command(Path("/b/llama-server"), Path("/g/m-f32.gguf"), 8123, WORK)
    pairs = dict(zip(line, line[1:], strict=False))
    assert line[0] == "/b/llama-server" and pairs["-m"] == "/g/m-f32.gguf"
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123"
    assert pairs["--parallel"] == "32" and pairs["--threads"] == "2" and pairs["--threads-batch"] == "2"
    assert "--cont-batching" in line
    per_slot = int(pairs["-c"]) // 32
    assert per_slot == slot_context(WORK) >= 256 + 128 and per_slot % 64 == 0
    assert slot_context(Workload(8, 8, 64, 32)) == 256  # 64 + 32 + 128 margin = 224, rounded up to 64


def test_token_check_reads_the_per_request_lists() -> None:
    result = {"output_lens": [128] * 32, "input_lens": [256] * 31 + [257], "itls": [[0.1] * 127] * 32}
    assert token_check(result, WORK) == {"output_tokens": [128, 128], "prompt_tokens": [256, 257],
                                         "chunks": [128, 128], "exact_output": True}
    short = {**result, "output_lens": [128] * 31 + [40]}  # one request stopped at an EOS
    assert token_check(short, WORK)["exact_output"] is False
    assert token_check({**result, "output_lens": [128] * 8}, WORK)["exact_output"] is False  # requests missing
    assert token_check({}, WORK) == {"output_tokens": None, "prompt_tokens": None, "chunks": None,
                                     "exact_output": False}


def test_summary_takes_ratios_within_each_round_their_median_and_the_goal() -> None:
    runs = {OURS: [_run(130, 1.0), _run(90, 2.0), _run(150, 1.0)],
            LLAMA: [_run(100, 2.0), _run(100, 1.0), _run(50, 4.0, steal=5.0)]}
    got = summary(runs)
    assert got["tok_s_ratio_per_round"] == [1.3, 0.9, 3.0] and got["tok_s_ratio_median"] == 1.3
    assert got["goal_met"] is True
    assert got["ttft_p50_ratio_per_round"] == [0.5, 2.0, 0.25] and got["ttft_p50_ratio_median"] == 0.5
    assert got["tok_s_ratio_unstolen"] == {"rounds": 2, "median": 1.1}  # the stolen third round left out
    assert got["medians"][OURS]["tok_s"] == 130 and got["medians"][LLAMA]["ttft_p99_s"] == 4.0
    assert got["exact_output_tokens"] == {OURS: True, LLAMA: True}


def test_a_missed_goal_a_failed_round_and_wrong_lengths_are_reported() -> None:
    runs = {OURS: [_run(120, 1.0), _run(90, 1.0)], LLAMA: [_run(100, 1.0, exact=False), _run(0.0, 0.0, failed=32)]}
    got = summary(runs)
    assert got["tok_s_ratio_per_round"] == [1.2, None] and got["tok_s_ratio_median"] == 1.2
    assert got["goal_met"] is False
    assert got["failed_requests"] == {OURS: 0, LLAMA: 32}
    assert got["exact_output_tokens"] == {OURS: True, LLAMA: False}
    assert got["medians"][LLAMA]["tok_s"] == 100  # the failed run is not a speed
    assert summary({OURS: [], LLAMA: []})["goal_met"] is None


def test_a_table_row_gives_the_pairs_medians_and_ratios() -> None:
    got = summary({OURS: [_run(130, 1.0), _run(140, 1.0)], LLAMA: [_run(100, 2.0), _run(100, 2.0)]})
    row = table_row("fp32-kv16 (beside fp32)", got)
    assert row["precision"] == "fp32-kv16 (beside fp32)" and row["tok/s ours/llama"] == 1.35
    assert row["ours tok/s"] == 135 and row["llama tok/s"] == 100 and row["goal met"] is True
    assert row["TTFT p50 s"] == "1.0 / 2.0" and row["exact tokens"] == "True / True"


def test_int8_is_dynamic_int8_against_q8_0() -> None:
    assert PRECISIONS["fp32"].gguf_type == "f32" and PRECISIONS["fp32"].options == ()
    assert PRECISIONS["int8"].gguf_type == "q8_0" and dict(PRECISIONS["int8"].options) == {"quantize": "dynamic_int8"}


def test_bf16_is_our_bf16_dtype_against_the_bf16_gguf() -> None:
    from djl_handlers.config.models import ServingConfig

    bf16 = PRECISIONS["bf16"]
    assert bf16.gguf_type == "bf16" and bf16.dtype == "bf16" and bf16.options == ()
    assert {p.dtype for name, p in PRECISIONS.items() if name != "bf16"} == {"fp32"}
    props = {"rolling_batch": "scheduler", "dtype": bf16.dtype}
    assert ServingConfig.from_properties(props, engine="huggingface").dtype in ("bf16", "bfloat16")


def test_fp32_kv16_is_our_16_bit_kv_cache_against_the_f32_gguf() -> None:
    from djl_handlers.config.models import ServingConfig

    kv16 = PRECISIONS["fp32-kv16"]
    assert kv16.gguf_type == "f32" and dict(kv16.options) == {"kv_cache_dtype": "float16"}
    props = {"rolling_batch": "scheduler", **dict(kv16.options)}  # a value the server's options take
    assert ServingConfig.from_properties(props, engine="huggingface").hf.kv_cache_dtype == "float16"


def test_find_llama_takes_the_newest_build_and_its_gguf_folder(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="setup_llama_cpp.sh"):
        find_llama(tmp_path)
    for version in ("0.3.1", "0.3.36"):
        binary = tmp_path / f"build-{version}" / "bin" / "llama-server"
        binary.parent.mkdir(parents=True)
        binary.write_text("")
    os.utime(tmp_path / "build-0.3.1" / "bin" / "llama-server", (1, 1))
    assert find_llama(tmp_path) == (tmp_path / "build-0.3.36" / "bin" / "llama-server", tmp_path / "gguf-0.3.36")


def test_find_llama_keeps_the_avx2_build_apart(tmp_path: Path) -> None:
    native = tmp_path / "build-0.3.36" / "bin" / "llama-server"
    native.parent.mkdir(parents=True)
    native.write_text("")
    with pytest.raises(SystemExit, match="LLAMA_CPP_ISA=avx2"):
        find_llama(tmp_path, "avx2")
    avx2 = tmp_path / "build-0.3.36-avx2" / "bin" / "llama-server"
    avx2.parent.mkdir(parents=True)
    avx2.write_text("")  # the newer file: still not the native one
    assert find_llama(tmp_path) == (native, tmp_path / "gguf-0.3.36")
    assert find_llama(tmp_path, "avx2") == (avx2, tmp_path / "gguf-0.3.36")  # the same GGUF files


def test_the_client_keeps_per_request_lists_only_when_asked(tmp_path: Path) -> None:
    args = argparse.Namespace(base_url="http://127.0.0.1:1", model="m", tokenizer="t", seed=3, num_prompts=32,
                              input_len=256, output_len=128, max_concurrency=32, result=str(tmp_path / "r.json"))
    assert "--save-detailed" not in vllm_arguments(args)
    args.save_detailed = True
    line = vllm_arguments(args)
    assert "--save-detailed" in line and "--ignore-eos" in line


LOG = """0.28.953.586 I slot print_timing: id  7 | task 0 | prompt eval time =     295.60 ms /    64 tokens (  4.62 ms)
0.28.954.347 I slot print_timing: id  7 | task 0 |        eval time =    3763.03 ms /    32 tokens (121.39 ms)
0.28.954.456 I slot print_timing: id  7 | task 0 |       total time =    4058.63 ms /    96 tokens
0.29.000.001 I slot print_timing: id  3 | task 12 | prompt eval time =     100.00 ms /    63 tokens (  1.59 ms)
0.29.000.002 I slot print_timing: id  3 | task 12 |        eval time =    3000.00 ms /    30 tokens (100.00 ms)
"""


def test_llama_servers_own_counts_are_read_from_its_log() -> None:
    assert llama_counts(LOG) == [(64, 32), (63, 30)]
    assert llama_counts("no timing here\n") == []


def test_a_llama_run_is_counted_with_the_servers_own_tokens() -> None:
    work = Workload(prompts=2, concurrency=2, input_len=64, output_len=32)
    run = {"tok_s": 62.0, "duration_s": 2.0, "tokens": {"output_tokens": [30, 32], "chunks": [32, 33],
                                                        "exact_output": False}}
    got = with_server_counts(run, [(64, 32), (64, 32)], work)
    assert got["tok_s"] == 32.0 and got["tok_s_client"] == 62.0  # 64 generated tokens over 2 s
    assert got["tokens"]["exact_output"] is True and got["tokens"]["output_tokens"] == [32, 32]
    assert got["tokens_client"]["output_tokens"] == [30, 32]
    assert with_server_counts(run, llama_counts(LOG), work)["tokens"]["exact_output"] is False  # one stopped at 30
    assert with_server_counts(run, [(64, 32)], work)["tokens"]["exact_output"] is False  # a request missing


# A stand-in for llama-server's start only (the harness's retry is under test, not llama.cpp): it dies
# from SIGSEGV while "loading" unless started with --no-repack, as llama-server did on an AMX Xeon.
CRASHING_SERVER = """#!{python}
import http.server, os, signal, sys
if "--no-repack" not in sys.argv:
    os.kill(os.getpid(), signal.SIGSEGV)
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def _crashing_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import sys

    monkeypatch.setattr("benchmarks.llama_cpp.LOGS", tmp_path)
    script = tmp_path / "llama-server"
    script.write_text(CRASHING_SERVER.format(python=sys.executable))
    script.chmod(0o755)
    return script


def test_a_start_that_ends_in_a_signal_is_a_crash() -> None:
    assert crashed_on_load(RuntimeError("server exited with -11; log: x.log"))
    assert not crashed_on_load(RuntimeError("server exited with 1; log: x.log"))
    assert not crashed_on_load(RuntimeError("server did not answer /health in 900 s; log: x.log"))


def test_llama_server_crashing_on_load_is_started_again_without_repacking(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _crashing_server(tmp_path, monkeypatch)
    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    flags: list[str] = []
    with serve_llama(script, tmp_path / "m-q8_0.gguf", WORK, flags=flags) as (url, pid, _):
        assert url.startswith("http://127.0.0.1:") and pid > 0
    assert flags == [REPACK_OFF]


def test_a_repacking_the_environment_chose_is_not_overridden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _crashing_server(tmp_path, monkeypatch)
    monkeypatch.setenv("LLAMA_ARG_REPACK", "true")
    with pytest.raises(RuntimeError, match="exited with -"), serve_llama(script, tmp_path / "m-q8_0.gguf", WORK):
        pass
