"""``option.cpu_threads``: the HF engine's torch thread count follows the cores its steps get
(engines/hf/cpu/threads.py). The governor runs on injected clocks; the engine tests load the tiny model."""

from __future__ import annotations

from typing import Any

import pytest

from djl_handlers.engines.hf.cpu.threads import ThreadGovernor, run_queue_seconds


class _Clocks:
    """A wall clock, a run-queue clock and a CPU clock a test advances: each step takes ``step_s`` wall
    seconds, during which the threads wait ``waiting`` seconds per second for a CPU and the process
    gets ``cores(threads)`` CPU seconds per second (default: one core whatever the count, as with one
    busy neighbour on 2 cores)."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.queued = 0.0
        self.cpu = 0.0
        self.set_calls: list[int] = []

    def governor(self, most: int, **kwargs: Any) -> ThreadGovernor:
        return ThreadGovernor(most, set_threads=self.set_calls.append, clock=lambda: self.wall,
                              waited=lambda: self.queued, cpu=lambda: self.cpu, **kwargs)

    def steps(self, governor: ThreadGovernor, waiting: float, seconds: float, step_s: float = 0.125,
              idle_s: float = 0.0, cores: Any = lambda threads: 1.0) -> None:
        for _ in range(round(seconds / step_s)):
            started = governor.start()
            self.wall += step_s
            self.queued += step_s * waiting
            self.cpu += step_s * cores(governor.threads)
            governor.finish(started)
            self.wall += idle_s  # between steps: not counted


FREE, BUSY = 0.007, 0.66  # measured: 2 threads on free cores, and with a busy process on one of 2


def test_threads_that_do_not_wait_are_kept() -> None:
    clocks = _Clocks()
    governor = clocks.governor(2)
    clocks.steps(governor, waiting=FREE, seconds=30)
    assert governor.threads == 2 and clocks.set_calls == [] and governor.changes == 0


def test_a_busy_neighbour_halves_the_threads_after_two_windows() -> None:
    clocks = _Clocks()
    governor = clocks.governor(2, window_s=1.0)
    clocks.steps(governor, waiting=BUSY, seconds=0.875)
    assert governor.threads == 2  # not judged before a full window
    clocks.steps(governor, waiting=BUSY, seconds=0.25)
    assert governor.threads == 2  # one window: could be a burst
    clocks.steps(governor, waiting=BUSY, seconds=1.0)
    assert governor.threads == 1 and clocks.set_calls == [1]


def test_a_burst_of_one_window_or_a_front_end_beside_the_steps_keeps_the_threads() -> None:
    clocks = _Clocks()
    governor = clocks.governor(2, window_s=1.0)
    for _ in range(5):  # a bad window now and then, never two in a row
        clocks.steps(governor, waiting=BUSY, seconds=1.0)
        clocks.steps(governor, waiting=FREE, seconds=1.0)
    clocks.steps(governor, waiting=0.25, seconds=10)  # measured serving a burst with the clients on the box
    assert governor.threads == 2 and clocks.set_calls == []


def test_time_between_steps_does_not_count() -> None:
    clocks = _Clocks()
    governor = clocks.governor(2, window_s=1.0)
    # 0.2 s of waiting per second of steps, spread over long idle gaps: still 0.2, under the limit
    clocks.steps(governor, waiting=0.2, seconds=3, idle_s=1.0)
    assert governor.threads == 2 and clocks.set_calls == []


def test_a_probe_that_does_not_wait_keeps_the_threads() -> None:
    clocks = _Clocks()
    governor = clocks.governor(2, window_s=1.0, probe_s=8.0)
    clocks.steps(governor, waiting=BUSY, seconds=2.0)
    assert governor.threads == 1
    clocks.steps(governor, waiting=FREE, seconds=7.0)  # no probe before 8 s
    assert clocks.set_calls == [1]
    clocks.steps(governor, waiting=FREE, seconds=1.125)
    assert governor.threads == 2 and clocks.set_calls == [1, 2]  # probing
    clocks.steps(governor, waiting=FREE, seconds=30)  # the neighbour has gone
    assert governor.threads == 2 and clocks.set_calls == [1, 2]


def test_failed_probes_go_back_and_wait_longer_each_time() -> None:
    clocks = _Clocks()
    governor = clocks.governor(2, window_s=1.0, probe_s=8.0, max_probe_s=32.0)
    clocks.steps(governor, waiting=BUSY, seconds=2.0)
    probes: list[float] = []
    for _ in range(1000):  # 100 s more of a neighbour that never leaves
        before = len(clocks.set_calls)
        clocks.steps(governor, waiting=BUSY if governor.threads > 1 else FREE, seconds=0.125)
        if len(clocks.set_calls) > before and clocks.set_calls[-1] == 2:
            probes.append(clocks.wall)
    assert governor.threads == 1
    assert set(clocks.set_calls) == {1, 2}
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert len(probes) >= 3
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]  # back-off
    assert max(gaps) <= 32.0 + 2.5  # capped at max_probe_s (plus the probe's own window)


def _crowd(threads: int) -> float:
    """A crowd of runnable threads on 2 cores: each of ours gets a quarter of a core."""
    return 0.25 * threads


def test_in_a_crowd_the_threads_that_get_more_cpu_are_kept() -> None:
    clocks = _Clocks()
    governor = clocks.governor(2, window_s=1.0, probe_s=8.0, max_probe_s=32.0)
    at_one = 0.0
    for _ in range(1600):  # 200 s of a crowd: every count waits, 2 threads get twice the CPU of 1
        clocks.steps(governor, waiting=1.0, seconds=0.125, cores=_crowd)
        at_one += 0.125 if governor.threads == 1 else 0.0
    assert governor.threads == 2
    assert clocks.set_calls[:2] == [1, 2]  # halved, then back after one window that got half the CPU
    assert at_one <= 0.05 * 200  # one window at 1 thread per hold-off, the hold-offs growing to 32 s
    assert len(clocks.set_calls) <= 2 * (1 + 200 // 8)


def test_a_probe_in_a_crowd_is_kept_although_it_waits() -> None:
    clocks = _Clocks()
    governor = clocks.governor(2, window_s=1.0, probe_s=8.0)
    clocks.steps(governor, waiting=BUSY, seconds=2.0)  # one busy neighbour: 2 threads get no more CPU
    clocks.steps(governor, waiting=FREE, seconds=1.0)
    assert governor.threads == 1 and clocks.set_calls == [1]
    clocks.steps(governor, waiting=1.0, seconds=10.0, cores=_crowd)  # then a crowd: the probe gets 2x
    assert governor.threads == 2 and clocks.set_calls == [1, 2]
    clocks.steps(governor, waiting=1.0, seconds=5.0, cores=_crowd)
    assert governor.threads == 2  # held: no halving during the hold-off


def test_threads_that_wait_but_get_more_cpu_than_half_of_them_could_are_kept() -> None:
    clocks = _Clocks()
    governor = clocks.governor(2, window_s=1.0)
    # a front end, a client and a neighbour now and then: 2 threads wait, yet get 1.6 cores
    clocks.steps(governor, waiting=0.9, seconds=60, cores=lambda threads: 0.8 * threads)
    assert governor.threads == 2 and clocks.set_calls == []
    clocks.steps(governor, waiting=0.9, seconds=2.0, cores=lambda threads: 1.2)  # now no more than 1 could use
    assert governor.threads == 1 and clocks.set_calls == [1]


def test_never_more_than_it_started_with_and_halving_stops_at_one() -> None:
    clocks = _Clocks()
    governor = clocks.governor(8, window_s=1.0, probe_s=2.0)
    clocks.steps(governor, waiting=3.0, seconds=6.5)
    assert clocks.set_calls[:3] == [4, 2, 1]  # halved every two windows
    assert max(clocks.set_calls) <= 8 and all(t >= 1 for t in clocks.set_calls)
    clocks.steps(governor, waiting=FREE, seconds=60)
    assert governor.threads == 8 and max(clocks.set_calls) == 8


def test_one_thread_is_left_alone_and_no_schedstat_means_no_change() -> None:
    clocks = _Clocks()
    governor = clocks.governor(1)
    clocks.steps(governor, waiting=BUSY, seconds=20)
    assert governor.threads == 1 and clocks.set_calls == []
    with pytest.raises(ValueError, match="most=0"):
        ThreadGovernor(0)
    blind = ThreadGovernor(2, set_threads=clocks.set_calls.append, clock=lambda: clocks.wall, waited=lambda: None)
    clocks.steps(blind, waiting=BUSY, seconds=20)
    assert blind.threads == 2 and clocks.set_calls == []


def test_the_run_queue_clock_reads_this_process() -> None:
    first = run_queue_seconds()
    assert first is not None and first >= 0.0  # Linux reports it; the governor is idle where it does not
    sum(range(100_000))
    second = run_queue_seconds()
    assert second is not None and second >= first


@pytest.mark.parametrize(("given", "expected"), [
    ({}, {"GOMP_SPINCOUNT": "20000"}),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "PASSIVE"}),
    ({"OMP_WAIT_POLICY": "active"}, {"OMP_WAIT_POLICY": "active"}),
    ({"GOMP_SPINCOUNT": "0"}, {"GOMP_SPINCOUNT": "0"}),
])
def test_the_worker_spins_briefly_unless_the_user_chose(given: dict[str, str], expected: dict[str, str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from djl_handlers.openmp import openmp_defaults
    from djl_handlers.server.worker_process import WorkerProcess, WorkerSpec

    env = dict(given)
    openmp_defaults(env)
    assert env == expected
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    worker_env = WorkerProcess(WorkerSpec("/nowhere", "djl_handlers.huggingface", {}, env=given))._env()
    assert {k: worker_env[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in worker_env} == expected


# -- the engine option ---------------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from djl_handlers.config.models import ServingConfig  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import ConfigError  # noqa: E402

pytest_plugins = ["conftest_models"]


@pytest.fixture
def two_threads() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _engine(tiny_dir: Any, **options: str) -> HFEngine:
    config = ServingConfig.from_properties({"model_id": str(tiny_dir), "rolling_batch": "auto", **options},
                                           engine="huggingface")
    return HFEngine.from_config(config)


def test_the_hf_engine_adapts_its_threads_by_default_on_the_cpu(tiny_dir: Any, two_threads: None) -> None:
    engine = _engine(tiny_dir)
    assert isinstance(engine.threads, ThreadGovernor) and engine.threads.most == 2
    assert _engine(tiny_dir, cpu_threads="FIXED").threads is None


def test_one_thread_needs_no_governor(tiny_dir: Any) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert _engine(tiny_dir).threads is None
    finally:
        torch.set_num_threads(before)


def test_an_unknown_cpu_threads_value_is_named(tiny_dir: Any) -> None:
    with pytest.raises(ConfigError, match="option.cpu_threads='sometimes'") as info:
        _engine(tiny_dir, cpu_threads="sometimes")
    assert info.value.field == "option.cpu_threads"


def test_steps_feed_the_governor(tiny_dir: Any, two_threads: None) -> None:
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.params.generation import GenerationParameters

    engine = _engine(tiny_dir)
    calls: list[int] = []
    ticks = iter(range(1000))  # every read 1 s later: as much waiting for a CPU as stepping
    engine.threads = ThreadGovernor(2, window_s=0.5, set_threads=calls.append, clock=lambda: float(next(ticks)),
                                    waited=lambda: float(next(ticks)))
    engine.add_request(EngineRequest(1, [1, 2, 3], GenerationParameters(max_new_tokens=3)))
    engine.step()
    assert calls == [] and engine.threads.threads == 2  # one window above the limit: not yet
    engine.step()
    assert calls == [1] and engine.threads.threads == 1
