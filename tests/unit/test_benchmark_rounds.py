"""The benchmarks' round arithmetic (benchmarks/served_engines.py, benchmarks/server.py): ratios are taken
between runs of the same round, and the prompts of a round never repeat another round's."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.common import host_cpu, median, steal_share
from benchmarks.served_engines import (
    Contender,
    _descendants,
    _round_ratios,
    cpu_seconds,
    major_faults,
    parse_variant,
    tagged,
    variant_env,
    write_model_dir,
)
from benchmarks.server import round_ratios
from benchmarks.workload import Job


def test_median_of_odd_even_and_empty() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median([]) is None


def test_ratios_pair_runs_of_the_same_round() -> None:
    runs = {"huggingface": [{"tok_s": 100.0}, {"tok_s": 200.0}, {"tok_s": 150.0}],
            "vllm": [{"tok_s": 50.0}, {"tok_s": 200.0}, {"tok_s": 100.0}]}
    got = _round_ratios(runs, "huggingface", "vllm")
    assert got["per_round"] == [2.0, 1.0, 1.5]
    assert (got["median"], got["min"], got["max"]) == (1.5, 1.0, 2.0)
    assert _round_ratios({"a": [{"tok_s": 1.0}], "b": [{"tok_s": 0.0}]}, "a", "b") == {}
    assert "unstolen" not in got  # runs without host CPU figures (older reports)


def test_rounds_with_steal_are_reported_apart() -> None:
    def run(tok_s: float, steal: float) -> dict[str, object]:
        return {"tok_s": tok_s, "host_cpu_s": {"busy": 30.0, "idle": 10.0 - steal, "steal": steal}}

    runs = {"huggingface": [run(120.0, 0.1), run(60.0, 12.0), run(130.0, 0.0)],
            "vllm": [run(100.0, 0.0), run(100.0, 0.1), run(100.0, 4.0)]}
    got = _round_ratios(runs, "huggingface", "vllm")
    assert got["per_round"] == [1.2, 0.6, 1.3] and got["median"] == 1.2  # the plain figures keep every round
    # round 2: huggingface lost 30 % to steal; round 3: vllm lost 10 %; only round 1 is clean
    assert got["unstolen"] == {"rounds": 1, "median": 1.2, "min": 1.2}
    assert steal_share(run(1.0, 0.4)["host_cpu_s"]) == pytest.approx(0.01)  # type: ignore[arg-type]
    assert steal_share(None) == 0.0


def test_variants_are_hf_servers_with_options() -> None:
    assert parse_variant("p512:max_prefill_tokens=512") == Contender("p512", "huggingface",
                                                                     (("max_prefill_tokens", "512"),))
    both = parse_variant("x:option.max_prefill_tokens=1024; cpu_threads=fixed")
    assert both.options == (("max_prefill_tokens", "1024"), ("cpu_threads", "fixed"))
    for bad in ("p512", ":a=1", "p:a", "p:"):
        with pytest.raises(ValueError, match="expected NAME:key=value"):
            parse_variant(bad)


def test_variant_env_keys_go_to_the_environment_not_the_properties(tmp_path: Path) -> None:
    variant = parse_variant("gcdefault:env.DJL_HANDLERS_GC=default;max_prefill_tokens=512")
    assert variant_env(variant.options) == {"DJL_HANDLERS_GC": "default"}
    folder = write_model_dir(tmp_path, variant.engine, "bf16", "/m", variant.name, variant.options)
    props = (folder / "serving.properties").read_text()
    assert "option.max_prefill_tokens=512" in props and "DJL_HANDLERS_GC" not in props
    assert variant_env(parse_variant("p:max_prefill_tokens=512").options) == {}


def test_rounds_share_no_prompt_prefix() -> None:
    jobs = [Job("Deep learning is", 4, 8, 0.0), Job("Deep learning is", 4, 9, 0.0)]
    one, two = tagged(jobs, "round 1"), tagged(jobs, "round 2")
    assert [j.max_new_tokens for j in one] == [8, 9]
    for a, b, job in zip(one, two, jobs, strict=True):
        assert a.prompt != b.prompt and a.prompt.endswith(job.prompt) and b.prompt.endswith(job.prompt)
    assert one[0].prompt.startswith("(round 1) ") and two[0].prompt.startswith("(round 2) ")


def test_front_end_ratios_per_client_count() -> None:
    rows = [{"front": "djl-handlers serve", "clients": 64, "req_s_runs": [300.0, 200.0],
             "ttft_p99_ms_runs": [40.0, 60.0]},
            {"front": "DJL Serving ModelServer", "clients": 64, "req_s_runs": [200.0, 200.0],
             "ttft_p99_ms_runs": [20.0, 60.0]},
            {"front": "djl-handlers serve", "clients": 1, "req_s_runs": [10.0], "ttft_p99_ms_runs": [1.0]}]
    got = round_ratios(rows)
    assert list(got) == [64]  # no DJL row at 1 client: nothing to compare
    assert got[64]["req_s_per_round"] == [1.5, 1.0] and got[64]["req_s_median"] == 1.25
    assert got[64]["ttft_p99_per_round"] == [2.0, 1.0] and got[64]["ttft_p99_median"] == 1.5
    assert "unstolen" not in got[64]  # rows without steal figures (older reports)


def test_front_end_rounds_with_steal_are_reported_apart() -> None:
    rows = [{"front": "djl-handlers serve", "clients": 8, "req_s_runs": [300.0, 100.0, 240.0],
             "ttft_p99_ms_runs": [10.0, 50.0, 12.0], "steal_share_runs": [0.0, 0.2, 0.01]},
            {"front": "DJL Serving ModelServer", "clients": 8, "req_s_runs": [200.0, 200.0, 200.0],
             "ttft_p99_ms_runs": [20.0, 20.0, 20.0], "steal_share_runs": [0.0, 0.0, 0.05]}]
    got = round_ratios(rows)[8]
    assert got["req_s_per_round"] == [1.5, 0.5, 1.2] and got["req_s_median"] == 1.2  # every round
    # round 2: ours lost 20 % of the machine; round 3: DJL's run lost 5 %; round 1 is the clean one
    assert got["unstolen"] == {"rounds": 1, "req_s_median": 1.5, "ttft_p99_median": 0.5}


def test_process_tree_counters_include_grandchildren() -> None:
    busy = "import time; t = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(5)"
    child = subprocess.Popen(["bash", "-c", f"python3 -c '{busy}' & wait"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and cpu_seconds(child.pid)[1] < 0.25:
            time.sleep(0.1)
        tree = _descendants(child.pid)
        assert len(tree) == 1  # bash -> python: the grandchild of this test
        assert child.pid in _descendants(os.getpid())
        assert cpu_seconds(child.pid)[1] >= 0.25  # the grandchild's busy loop counts as "below"
        assert major_faults(child.pid) >= 0 and major_faults(-1) == 0
        assert cpu_seconds(-1) == (0.0, 0.0)
    finally:
        child.kill()
        child.wait()


def test_host_cpu_counts_this_process_busy_time() -> None:
    before = host_cpu()
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    after = host_cpu()
    assert set(before) == {"busy", "idle", "steal"}
    assert after["busy"] - before["busy"] >= 0.2  # at least most of this loop's CPU time (ticks are coarse)
    assert after["steal"] >= before["steal"] and after["idle"] >= before["idle"]
