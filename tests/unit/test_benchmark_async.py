"""The async-mode benchmark's pure parts (benchmarks/async_mode.py): mode properties, which fronts are
compared, round-paired ratios with steal kept apart, the goals, and reading DJL's mode from its log."""

from __future__ import annotations

from benchmarks.async_mode import (
    Front,
    comparisons,
    djl_mode,
    fronts_for,
    goals,
    identical,
    machine,
    paired_ratios,
    ratio_block,
    round_order,
    with_mode,
)


def test_with_mode_replaces_the_rolling_batch_and_async_keys() -> None:
    props = "engine=Python\noption.rolling_batch=auto\noption.async_mode=false\noption.max_rolling_batch_size=8\n"
    sync = with_mode(props, "sync").splitlines()
    assert sync == ["engine=Python", "option.max_rolling_batch_size=8", "option.rolling_batch=scheduler"]
    async_ = with_mode(props, "async").splitlines()
    assert "option.rolling_batch=disable" in async_ and "option.async_mode=true" in async_
    assert not any(line.endswith(("=auto", "=false")) for line in async_)


def test_fronts_pair_each_server_sync_then_async() -> None:
    fronts = fronts_for(["0.34"])
    assert [f.name for f in fronts] == ["djl-handlers serve sync", "djl-handlers serve async",
                                        "DJL 0.34 sync", "DJL 0.34 async"]
    assert Front("0.36", "async").slug == "djl-0.36-async"


def test_comparisons_only_between_fronts_that_ran() -> None:
    names = ["djl-handlers serve sync", "djl-handlers serve async", "DJL 0.34 async"]  # DJL 0.34 sync failed
    got = comparisons(names, ["0.34"])
    assert ("async over sync", "djl-handlers serve async", "djl-handlers serve sync") in got
    assert ("DJL over ours", "DJL 0.34 async", "djl-handlers serve async") in got
    assert all("DJL 0.34 sync" not in pair for pair in got)


def test_paired_ratios_per_round_with_steal_and_failures_apart() -> None:
    mine = [{"req_s": 120.0, "steal": 0.0}, {"req_s": 60.0, "steal": 0.3}, {"failed": "timeout"},
            {"req_s": 90.0, "steal": 0.01}]
    base = [{"req_s": 100.0, "steal": 0.0}, {"req_s": 100.0, "steal": 0.0}, {"req_s": 100.0, "steal": 0.0},
            {"req_s": 100.0, "steal": 0.0}]
    got = paired_ratios(mine, base, ["req_s"])["req_s"]
    assert got["per_round"] == [1.2, 0.6, 0.9]  # the failed round is left out
    assert got["median"] == 0.9
    assert (got["unstolen_rounds"], got["unstolen_median"]) == (2, 1.05)  # round 2 lost 30 % to steal


def test_goals_async_at_least_sync_and_djl_near_ours() -> None:
    def run(tok_s: float, ttft: float) -> dict[str, float]:
        return {"tok_s": tok_s, "ttft_p50_ms": ttft, "ttft_p99_ms": ttft, "steal": 0.0}

    runs = {"djl-handlers serve sync": [run(100, 1000)], "djl-handlers serve async": [run(110, 900)],
            "DJL 0.34 sync": [run(90, 1200)], "DJL 0.34 async": [run(106, 1000)]}
    ratios = ratio_block(runs, ["0.34"], ["tok_s", "ttft_p50_ms", "ttft_p99_ms"])
    met = goals(ratios, "tok_s")
    assert met["djl-handlers serve async / djl-handlers serve sync"]["met"] is True
    assert met["DJL 0.34 async / DJL 0.34 sync"]["met"] is True
    # 106/110 = 0.96 tok/s is enough, but TTFT 1000/900 = 1.11x is not
    assert ratios["DJL 0.34 async / djl-handlers serve async"]["tok_s"]["median"] == 0.96
    assert met["DJL 0.34 async / djl-handlers serve async"]["met"] is False
    assert "DJL 0.34 sync / djl-handlers serve sync" not in met  # context only, no goal


def test_djl_mode_from_its_log() -> None:
    settings = "x INFO ModelInfo Apply per model settings:\n    option.rolling_batch: disable\n"
    assert djl_mode(settings + "    option.async_mode: true\n") == "async"
    assert djl_mode("INFO PyProcess Creating new python process in async mode") == "async"
    assert djl_mode(settings.replace("disable", "scheduler")) == "rolling batch scheduler"


def test_identical_counts_requests_and_round_order_alternates() -> None:
    assert identical([[1, 2], [3], [4, 5]], [[1, 2], [3, 9], [4, 5]]) == 2
    assert round_order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert round_order(["a", "b", "c"], 1) == ["c", "b", "a"]


def test_machine_share_of_others() -> None:
    host = {"busy": 14.0, "idle": 5.0, "steal": 1.0}
    assert machine(host, 10.0) == {"steal": 0.05, "others_cpu_s": 4.0}
    assert machine({}, 1.0) == {"steal": 0.0, "others_cpu_s": None}
